"""``--max-artifact-mb``: flag, environment and config file, and its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.node import ConfigError
from corral.node._config import DEFAULT_MAX_ARTIFACT_MB, resolve_node_config
from corral.node.artifacts._artifacts import ArtifactLimits


def test_max_artifact_mb_comes_from_flag_env_or_file_with_a_default(tmp_path: Path) -> None:
    def resolve(flags: dict[str, object], env: dict[str, str], file: dict[str, object]) -> int:
        return resolve_node_config(flags, env, file, cwd=tmp_path).max_artifact_mb

    assert resolve({}, {}, {}) == DEFAULT_MAX_ARTIFACT_MB == 1024
    assert resolve({}, {}, {"max-artifact-mb": 64}) == 64
    assert resolve({}, {"CORRAL_MAX_ARTIFACT_MB": "32"}, {"max-artifact-mb": 64}) == 32
    assert resolve({"max-artifact-mb": "8"}, {"CORRAL_MAX_ARTIFACT_MB": "32"}, {}) == 8


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "lots"])
def test_a_bad_max_artifact_mb_is_refused_naming_it(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="--max-artifact-mb"):
        resolve_node_config({"max-artifact-mb": bad}, {}, {}, cwd=tmp_path)


def test_the_limit_in_mib_becomes_the_unpacked_byte_bound() -> None:
    limits = ArtifactLimits.from_mb(3)
    assert limits.max_unpacked_bytes == 3 * 1024 * 1024
    assert limits.budget(10) == (
        3 * 1024 * 1024,
        "too large",
        f"more than the {3 * 1024 * 1024} bytes --max-artifact-mb allows",
    )
    ratio_bound, rule, _ = ArtifactLimits().budget(1024 * 1024)
    assert (ratio_bound, rule) == (200 * 1024 * 1024, "decompression bomb")
