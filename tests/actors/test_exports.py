import corral.actors


def test_all_is_sorted_and_every_name_resolves() -> None:
    names = corral.actors.__all__
    # ruff (RUF022) orders constants first, then the rest in ASCII order.
    assert names == sorted(names, key=lambda name: (not name.isupper(), name))
    for name in names:
        assert hasattr(corral.actors, name), name
    assert {"Coordinator", "Reconciler", "PortAllocator", "ProcessSupervisor", "plan"} <= set(names)
