"""Where an app's local state lives under the node's data directory.

``<data-dir>/apps/<name>/`` is the app's working directory: it survives stops and
is removed only once the app is deleted from the registry and nothing of it runs.

::

    <data-dir>/apps/<name>/
        ports.json              the app's port pair (PortAllocator)
        process.json            pid file of the running process (ProcessSupervisor)
        logs/stdout.log[.N]     rotating output of the process
        logs/stderr.log[.N]
        revisions/<digest>/     unpacked artifacts (the node's materializer); the cwd
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class AppPaths:
    """The paths of one app's local state.

    ``AppPaths.of(data_dir, "hello").root == data_dir / "apps" / "hello"``.
    """

    root: Path

    @classmethod
    def of(cls, data_dir: Path, app: str) -> AppPaths:
        return cls(Path(data_dir, "apps", app))  # one parse, not three (once per start)

    @staticmethod
    def apps_root(data_dir: Path) -> Path:
        """The directory holding every app's working directory."""
        return Path(data_dir) / "apps"

    @property
    def app(self) -> str:
        return self.root.name

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def pid_file(self) -> Path:
        return self.root / "process.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def stdout_log(self) -> Path:
        return self.logs / "stdout.log"

    @property
    def stderr_log(self) -> Path:
        return self.logs / "stderr.log"

    @property
    def revisions(self) -> Path:
        return self.root / "revisions"

    def revision_dir(self, revision: str) -> Path:
        return self.revisions / revision
