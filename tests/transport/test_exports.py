import corral.transport


def test_all_is_sorted_and_complete() -> None:
    names = corral.transport.__all__
    # ruff (RUF022) orders constants first, then the rest in ASCII order.
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))
    for name in names:
        assert hasattr(corral.transport, name)
    assert {
        "message",
        "Envelope",
        "MemoryNetwork",
        "encode_envelope",
        "CodecLimits",
        "WebSocketTransport",
        "open_websocket_transport",
        "PeerLost",
        "PeerLostHandler",
        "PeerLossListeners",
        "FrameHandler",
    } <= set(names)
