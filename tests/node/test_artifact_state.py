"""``corral state`` says the disk artifacts and revisions use, and fetches that failed."""

from __future__ import annotations

from corral.node.cli._format import state_summary


def test_the_state_shows_artifact_disk_use_and_failed_fetches() -> None:
    state = {
        "node_id": "n1",
        "artifacts": {
            "artifacts": 2,
            "artifact_bytes": 10 * 1024 * 1024,
            "revision_bytes": 3 * 1024 * 1024,
            "revisions": {"web": ["a" * 64, "b" * 64]},
            "fetching": ["c" * 64],
            "failed": {"d" * 64: "tried 2: n2 (HTTP 403); n3 (ConnectError: refused)"},
        },
    }
    text = state_summary(state, now=0.0)
    assert (
        "artifacts   2 cop(ies) using 10.0 MiB, 2 unpacked revision(s) using 3.0 MiB, fetching 1"
    ) in text
    assert f"cannot fetch {'d' * 12}: tried 2: n2 (HTTP 403); n3 (ConnectError: refused)" in text


def test_an_unknown_artifact_state_says_why() -> None:
    text = state_summary({"node_id": "n1", "artifacts": {"error": "no reply"}}, now=0.0)
    assert "artifacts   unknown: no reply" in text
