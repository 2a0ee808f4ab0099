"""Result rows and targets, the printed table, the JSON file, and what a run measured on."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import REPO


@dataclass(slots=True)
class Report:
    widths: tuple[int, int, int] = (30, 34, 16)  # of the live rows' bench, subject and result
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def row(self, bench: str, subject: str, result: str, note: str = "") -> None:
        self.rows.append((bench, subject, result, note))
        w = self.widths
        print(f"  {bench:<{w[0]}} {subject:<{w[1]}} {result:>{w[2]}}  {note}", flush=True)

    def target(self, name: str, value: float, goal: str, met: bool, detail: str) -> None:
        self.targets.append(
            {"name": name, "value": round(value, 3), "goal": goal, "met": met, "detail": detail}
        )


def filesystem_of(path: str) -> str:
    """Filesystem type, mount point and device of `path`; for ext4, whether it has a journal."""
    best, kind, device = "", "?", "?"
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mount, fstype = parts[1], parts[2]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, kind, device = mount, fstype, parts[0]
    text = f"{kind} on {best} ({device})"
    if kind == "ext4":
        name = os.path.basename(os.path.realpath(device))
        try:
            journals = os.listdir("/proc/fs/jbd2")
        except OSError:
            journals = []
        # jbd2 lists one entry per journaled filesystem, named after the block device.
        journaled = any(j.split("-")[0] == name for j in journals)
        text += ", with a journal" if journaled else ", no journal"
    return text


def source_revision() -> str:
    """The commit the servers ran, and whether src/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "src"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} + uncommitted changes in src/" if dirty else head


def print_summary(report: Report, heading: str) -> None:
    """The rows as a table under `heading` (what the values are), then the targets met or not."""
    widths = [max(len(r[i]) for r in report.rows) for i in range(3)] if report.rows else [0] * 3
    print(f"\n== results ({heading}) ==")
    for bench, subject, result, note in report.rows:
        print(f"{bench:<{widths[0]}}  {subject:<{widths[1]}}  {result:>{widths[2]}}  {note}")
    print("\n== targets ==")
    for t in report.targets:
        verdict = "MET " if t["met"] else "MISS"
        print(f"{verdict}  {t['name']:<44} {t['value']:>12,.2f}  (goal {t['goal']}; {t['detail']})")


def write_results(report: Report, out: dict[str, Any], path: str, heading: str) -> None:
    """The end of a run: its targets into `out`, the summary printed under `heading`, and `out`
    written as JSON to `path` (its directory made)."""
    out["targets"] = report.targets
    print_summary(report, heading)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {target} ({out.get('seconds', '?')} s)")


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_basics() -> dict[str, Any]:
    """What every result file says of its run: the source measured, when, and on what."""
    return {
        "source": source_revision(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "dirmq": version_of("dirmq"),
    }
