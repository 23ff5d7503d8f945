import corral.actors
import corral.actors.coordinator
import corral.actors.port_allocator
import corral.actors.process_supervisor
import corral.actors.reconciler


def test_the_actors_are_reached_from_their_own_packages() -> None:
    # ``corral.actors`` only groups the actor packages: each actor, its messages and its
    # errors are exported by the package that holds it, and imported from there.
    assert corral.actors.__all__ == []
    assert "Coordinator" in corral.actors.coordinator.__all__
    assert "Reconciler" in corral.actors.reconciler.__all__
    assert "PortAllocator" in corral.actors.port_allocator.__all__
    assert "ProcessSupervisor" in corral.actors.process_supervisor.__all__
