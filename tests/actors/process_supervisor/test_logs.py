from __future__ import annotations

from pathlib import Path

from corral.actors.process_supervisor._logs import RotatingLog


def test_rotates_at_the_size_limit_and_keeps_the_backups(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "logs" / "stdout.log", max_bytes=10, backups=2)
    for chunk in (b"aaaaaaaa", b"bbbbbbbb", b"cccccccc", b"dddddddd"):
        log.write(chunk)
    log.close()
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["stdout.log", "stdout.log.1", "stdout.log.2"]
    assert (tmp_path / "logs" / "stdout.log").read_bytes() == b"dddddddd"
    assert (tmp_path / "logs" / "stdout.log.1").read_bytes() == b"cccccccc"
    assert (tmp_path / "logs" / "stdout.log.2").read_bytes() == b"bbbbbbbb"


def test_reopening_appends(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    for word in (b"one ", b"two"):
        log = RotatingLog(path, max_bytes=100)
        log.write(word)
        log.close()
    assert path.read_bytes() == b"one two"
