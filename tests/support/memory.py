"""A process's memory, read from /proc: what a test bounding a server's memory measures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def status_field(pid: int, name: str) -> int:
    """A /proc/PID/status memory field (VmRSS, VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no {name} in /proc/{pid}/status")


@dataclass
class Growth:
    """Set when the block measured ends."""

    mib: int = 0


@contextmanager
def peak_growth(pid: int) -> Iterator[Growth]:
    """How far the process's peak RSS (VmHWM) rose over the block, in MiB. The peak is first
    brought back to the current RSS (Linux >= 4.0): a peak from before the block, a warm-up's
    say, would hide the block's own."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    before = status_field(pid, "VmHWM")
    growth = Growth()
    yield growth
    growth.mib = status_field(pid, "VmHWM") - before
