"""Settings shared by the whole suite."""

from __future__ import annotations

import os

from hypothesis import settings

# Two shared cores make per-example timings meaningless, so no deadlines anywhere.
settings.register_profile("dev", deadline=None)
# In CI the examples are derived from each test, not drawn at random: a run is
# reproducible, and a failure there is one a developer can replay exactly.
# Local runs keep exploring new examples.
settings.register_profile("ci", deadline=None, derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
