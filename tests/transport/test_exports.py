import corral.transport


def test_all_is_sorted_and_complete() -> None:
    names = corral.transport.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(corral.transport, name)
    assert {"message", "Envelope", "MemoryNetwork", "encode_envelope", "CodecLimits"} <= set(names)
