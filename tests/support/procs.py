"""Start worker processes (tests/support/workers.py) as real OS processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def spawn(
    *args: object, module: str = "tests.support.workers", stdin: bool = False
) -> subprocess.Popen[str]:
    """`python -m module *args` with the checkout importable (the roles live in `module`);
    `stdin`: with a pipe to its standard input (closed by `kill` or `communicate`)."""
    # This checkout's src first: otherwise an editable install of another checkout would run.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL a worker and reap it; returns whatever it printed that was not read yet."""
    proc.kill()
    out, _ = proc.communicate(timeout=30)
    return out


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (free, until the kernel reuses it)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
