import corral.supervision


def test_all_is_sorted_and_complete() -> None:
    names = corral.supervision.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(corral.supervision, name)
    assert {"Actor", "ActorRef", "ChildSpec", "SupervisorSpec", "open_actor_system"} <= set(names)
