"""The etcd backend (in progress)."""

from __future__ import annotations

from collections.abc import Sequence

from corral.registry._base import Registry


class EtcdRegistry(Registry):  # replaced by the real backend
    def __init__(self, endpoints: Sequence[str], *, prefix: str = "") -> None:
        raise NotImplementedError("the etcd backend lands in a later commit")
