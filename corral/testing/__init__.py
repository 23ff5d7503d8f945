"""Testing corral in-process: the Cluster harness and registry test doubles."""

from corral.testing._registry import CountingRegistry, GateMode, RegistryGate

__all__ = ["CountingRegistry", "GateMode", "RegistryGate"]
