"""A frozen etcd is reported as a slow registry, not a missing node: a real node on a
private etcd (started here, never the shared CORRAL_TEST_ETCD), SIGSTOPped by pid
while ``corral ps`` and ``corral deploy`` run, SIGCONTed after (marked slow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.node.cli._local_cluster import LocalCluster, LocalNode
from corral.node.server._deadline import REGISTRY_DEADLINE
from corral.testing import SECURE_PREFIX, SecureEtcd, run_secure_etcd

from .conftest import make_app_dir

pytestmark = [pytest.mark.slow, pytest.mark.etcd]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    """A private etcd for this test alone (it gets frozen)."""
    directory = tmp_path / "etcd"
    directory.mkdir()
    with run_secure_etcd(directory, token_ttl=60) as private:
        yield private


@pytest.fixture
def node(tmp_path: Path, etcd: SecureEtcd) -> Iterator[LocalNode]:
    url = f"{etcd.url}/?prefix={SECURE_PREFIX}{uuid.uuid4().hex}/"
    with LocalCluster(tmp_path / "cluster", registry_url=url) as cluster:
        solo = cluster.add_node(
            f"frozen-{uuid.uuid4().hex[:6]}",
            extra_args=[
                "--registry-ca", etcd.ca_file,
                "--registry-cert", etcd.cert_file,
                "--registry-key", etcd.key_file,
                "--registry-user", etcd.user,
            ],
        )  # fmt: skip
        cluster.extra_env["CORRAL_REGISTRY_PASSWORD"] = etcd.password
        cluster.start(solo)
        cluster.wait_ready(solo)
        yield solo


def corral(node: LocalNode, *argv: str, cwd: Path) -> tuple[int, str, float]:
    """Run the command line against ``node``: (status, stderr, seconds taken)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "corral", *argv, "--api", node.api_url, "--token", node.token()],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    return done.returncode, done.stderr, time.monotonic() - started


def test_a_frozen_registry_is_named_and_the_node_is_not_called_missing(
    tmp_path: Path, etcd: SecureEtcd, node: LocalNode
) -> None:
    app = make_app_dir(tmp_path / "app")
    assert corral(node, "ps", cwd=tmp_path)[0] == 0
    os.kill(etcd.pid, signal.SIGSTOP)
    try:
        ps_status, ps_err, ps_took = corral(node, "ps", cwd=tmp_path)
        deploy_status, deploy_err, deploy_took = corral(
            node, "deploy", str(app), "--name", "shop", cwd=tmp_path
        )
    finally:
        os.kill(etcd.pid, signal.SIGCONT)
    print(f"with etcd stopped: ps answered in {ps_took:.1f} s, deploy in {deploy_took:.1f} s")
    for status, err, took in (
        (ps_status, ps_err, ps_took),
        (deploy_status, deploy_err, deploy_took),
    ):
        assert status == 1, err
        assert "cannot reach" not in err
        assert f"the registry {etcd.url}/?prefix={SECURE_PREFIX}" in err
        assert f"did not answer a read within {REGISTRY_DEADLINE:g} s" in err
        assert "This node is up" in err
        assert took < 25  # the node answered: not the command line's own 30 s timeout
    assert "changed nothing" in deploy_err
    # Once etcd answers again, so does the node, and the deploy goes through.
    deadline = time.monotonic() + 30
    while corral(node, "ps", cwd=tmp_path)[0] != 0:
        assert time.monotonic() < deadline, "the node did not answer again after SIGCONT"
        time.sleep(0.5)
    status, err, _ = corral(node, "deploy", str(app), "--name", "shop", cwd=tmp_path)
    assert status == 0, err
