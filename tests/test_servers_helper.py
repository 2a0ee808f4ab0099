"""The test helpers `start_server` and `spawn`: a server that exits before listening leaves
nothing open, nor does a worker a test left running."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

import dirmq

from .support.procs import reap_spawned, spawn
from .support.servers import start_server


def test_a_server_that_never_listens_leaves_no_pipe_open(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="before listening"):
            start_server(tmp_path / "root", "--listen", "127.0.0.1:99999")
        gc.collect()  # an unclosed pipe warns when it is collected
    unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == [], [str(w.message) for w in unclosed]


def test_a_worker_left_running_is_reaped_and_its_pipes_closed(tmp_path: Path) -> None:
    """What the conftest does after every test, for one that failed before its `kill`."""
    with dirmq.Store(tmp_path / "root") as store:
        store.create_queue("q")
    left = spawn("hold-on-go", tmp_path / "root", "q", 1, 1.0, stdin=True)
    assert left.stdout is not None and left.stdin is not None
    assert left.stdout.readline() == "ready\n"  # running, waiting for a line
    left.stdin.write("unsent")  # buffered: closing it must not fail on the dead process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reap_spawned()
        gc.collect()
    assert left.returncode is not None and left.stdout.closed and left.stdin.closed
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
