"""A pytest plugin: a ready in-process cluster as a fixture.

Enable it in your ``conftest.py``::

    pytest_plugins = ["corral.testing.pytest_plugin"]

then, with pytest-trio (``trio_mode = true``)::

    async def test_placement(corral_cluster, autojump_clock):
        holder = await corral_cluster.wait_for_coordinator()
        ...

Override ``corral_cluster_options`` (a fixture returning keyword arguments for
:func:`corral.testing.open_cluster`) to change the node count, TTL, policy...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral.testing._cluster import Cluster, open_cluster

__all__ = ["corral_cluster", "corral_cluster_options"]


@pytest.fixture
def corral_cluster_options() -> dict[str, Any]:
    """Keyword arguments for ``open_cluster`` (default: three nodes, 45 s TTL)."""
    return {"nodes": 3}


@pytest.fixture
async def corral_cluster(corral_cluster_options: dict[str, Any]) -> AsyncIterator[Cluster]:
    """A running in-process cluster on the memory registry; stopped after the test."""
    async with open_cluster(**corral_cluster_options) as cluster:
        yield cluster
