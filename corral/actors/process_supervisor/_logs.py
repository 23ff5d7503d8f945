"""Size-rotated log files for an app's stdout and stderr."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import BinaryIO


class RotatingLog:
    """An append-only file that rotates at ``max_bytes``: ``x.log`` -> ``x.log.1`` ->
    ... -> ``x.log.<backups>`` (the oldest is dropped).

    Writes are synchronous and flushed at once, so the file shows what the process
    wrote even if the node dies; they are small chunks from a pipe.
    """

    def __init__(self, path: Path, *, max_bytes: int = 10 * 1024 * 1024, backups: int = 5) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("RotatingLog needs max_bytes > 0 and backups >= 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO | None = None
        self._size = 0

    def _open(self) -> BinaryIO:
        if self._file is None:
            self._file = open(self.path, "ab")  # kept open across writes
            self._size = self._file.tell()
        return self._file

    def write(self, data: bytes | bytearray) -> None:
        """Append ``data``, rotating first when it would pass ``max_bytes``."""
        if not data:
            return
        file = self._open()
        if self._size > 0 and self._size + len(data) > self.max_bytes:
            self.rotate()
            file = self._open()
        file.write(data)
        file.flush()
        self._size += len(data)

    def rotate(self) -> None:
        """Shift ``x.log`` to ``x.log.1`` (and so on) and start an empty ``x.log``."""
        self.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
            return
        oldest = self._numbered(self.backups)
        oldest.unlink(missing_ok=True)
        for n in range(self.backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                self._numbered(n).replace(self._numbered(n + 1))
        with contextlib.suppress(FileNotFoundError):
            self.path.replace(self._numbered(1))

    def _numbered(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{n}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._size = 0
