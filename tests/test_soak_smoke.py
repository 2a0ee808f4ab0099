"""`make soak` itself, run with 2 kills so that it cannot rot: the counts it reports are real
(something was published, delivered, acknowledged; a full-disk cycle ran) and all clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support.soak import run_soak


@pytest.mark.slow
def test_soak_with_two_kills_loses_nothing(tmp_path: Path) -> None:
    result = run_soak(2, tmp_path, seed=1, cycle_s=(0.5, 1.0))
    assert result.published > 0 and result.acked > 0 and result.deliveries > 0, result
    if result.filesystem != "dir":
        assert result.full_disk_cycles == 1 and result.publish_refused_full > 0, result
    assert (result.missing, result.returned, result.corrupt) == (0, 0, 0), result
    assert result.fsck_ok, result
