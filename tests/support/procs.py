"""Start worker processes (tests/support/workers.py) as real OS processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# What `spawn` started during the current test, for `reap_spawned` after it.
_spawned: list[subprocess.Popen[str]] = []


def spawn(
    *args: object, module: str = "tests.support.workers", stdin: bool = False
) -> subprocess.Popen[str]:
    """`python -m module *args` with the checkout importable (the roles live in `module`);
    `stdin`: with a pipe to its standard input (closed by `kill` or `communicate`)."""
    # This checkout's src first: otherwise an editable install of another checkout would run.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    _spawned.append(proc)
    return proc


def reap_spawned() -> None:
    """SIGKILL and reap the workers the test that just ended left running, and close the pipes
    it left open: a test that fails between a spawn and its `kill` or `communicate` must not
    leave a worker behind, nor a pipe whose ResourceWarning a later test would be charged with
    when the collector gets to it (conftest calls this after each test)."""
    while _spawned:
        proc = _spawned.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):  # stdin: what was unwritten is moot now
                    pipe.close()


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
