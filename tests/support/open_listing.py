"""A fresh process's open and first get+ack of a queue, counting the names every directory
listing returned to it, per directory (by base name): what the tests of an O(head) open
measure (test_open_cost.py, test_backlog.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .procs import REPO

# Run with `python -c`: os.listdir and os.scandir are wrapped before dirmq is imported.
_COUNT_LISTED = """
import collections, json, os, sys
counted = collections.Counter()
real_listdir, real_scandir = os.listdir, os.scandir
def listdir(path="."):
    names = real_listdir(path)
    counted[os.path.basename(os.fspath(path))] += len(names)
    return names
class Scan:
    def __init__(self, path):
        self._it = real_scandir(path)
        self._name = os.path.basename(os.fspath(path))
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._it.close()
    def __iter__(self):
        return self
    def __next__(self):
        entry = next(self._it)
        counted[self._name] += 1
        return entry
    def close(self):
        self._it.close()
os.listdir = listdir
os.scandir = lambda path=".": Scan(path)
import dirmq
with dirmq.Store(sys.argv[1]) as store:
    queue = store.queue(sys.argv[2])
    message = queue.get_one()
    assert message is not None
    queue.ack(message.receipt)
print(json.dumps(counted))
"""


def listed_by_a_first_get(root: str | Path, queue: str) -> dict[str, int]:
    """The names each directory's listings returned to a new process's open, get and ack of
    `queue` (by the directory's base name)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    child = subprocess.run(
        [sys.executable, "-c", _COUNT_LISTED, str(root), queue],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    listed: dict[str, int] = json.loads(child.stdout)
    return listed
