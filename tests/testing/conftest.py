"""The harness's own pytest plugin, as a user's conftest would enable it."""

from corral.testing.pytest_plugin import corral_cluster, corral_cluster_options

__all__ = ["corral_cluster", "corral_cluster_options"]
