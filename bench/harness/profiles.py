"""py-spy's collapsed stacks (`--format raw`) summarized as shares per function."""

from __future__ import annotations

import collections
import os
from typing import Any


def summarize_profile(path: str, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output."""
    self_count: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            total += count
            frames = [_frame_name(frame) for frame in stack.split(";")]
            frames = [frame for frame in frames if frame]
            if not frames:
                continue
            self_count[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count

    def share(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return (
            [(k, round(100 * v / total, 1)) for k, v in counter.most_common(top)] if total else []
        )

    return {"samples": total, "self_pct": share(self_count), "inclusive_pct": share(inclusive)}


def _frame_name(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`; process and thread frames dropped."""
    name, _, where = frame.partition(" (")
    if not where:
        return ""
    file_part = where.rstrip(")").rsplit(":", 1)[0]
    if not file_part.endswith((".py", ".pyx", ".so")) and "/" not in file_part:
        return ""  # "process 123:..." or "thread (0x...)" pseudo frames
    return f"{name} ({os.path.basename(file_part)})"
