"""The store's hold (`dirmq.store.holds`): a lease on NFS-safe operations only. One holder at a
time, a live one reported, a released, dead or lapsed one taken over, a superseded or removed
one told so. (Its users: test_spark_holder.py, test_sqs_move_task_holds.py.)"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from dirmq.store import holds
from dirmq.store.filemodes import PRIVATE, Access
from dirmq.store.holds import Busy, Hold, Lost
from dirmq.store.processes import ProcessIdentity, current, host_tag

from .support.procs import dead_pid

PREFIX = "runner."
ACCESS = Access.named(PRIVATE)


def _take(directory: Path, timeout_s: float = 30.0) -> Hold | Busy | None:
    return holds.take(str(directory), PREFIX, timeout_s, access=ACCESS)


def _plant(directory: Path, generation: int, host: str, pid: int, age_s: float) -> None:
    """A record as another process would have written it, last renewed `age_s` ago."""
    path = holds.record_path(str(directory), PREFIX, generation)
    directory.mkdir(parents=True, exist_ok=True)
    process = ProcessIdentity(host_tag(host), current().pid_ns, pid, 0).token()
    record = {"process": process, "host": host, "pid": pid, "token": "theirs", "timeout_s": 30.0}
    Path(path).write_text(json.dumps(record))
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def test_one_holder_at_a_time_and_release(tmp_path: Path) -> None:
    directory = tmp_path / "holds"  # made by the first take
    hold = _take(directory)
    assert isinstance(hold, Hold) and hold.lost is None and hold.renew()
    busy = _take(directory)
    assert isinstance(busy, Busy)
    assert (busy.record.pid, busy.path) == (os.getpid(), hold.path)
    assert busy.record.is_alive(time.time())
    hold.release()
    assert hold.lost is Lost.RELEASED and not hold.renew()
    again = _take(directory)
    assert isinstance(again, Hold) and again.generation == hold.generation + 1
    assert os.listdir(directory) == [os.path.basename(again.path)]  # older ones removed


def test_other_names_in_the_directory_are_not_generations(tmp_path: Path) -> None:
    (tmp_path / "task.json").write_text("{}")
    (tmp_path / f"{PREFIX}12").write_text("{}")  # not 20 digits
    (tmp_path / f"{PREFIX}{'0' * 19}7.{'a' * 32}.tmp").write_text("{}")  # a write's temp
    hold = _take(tmp_path)
    assert isinstance(hold, Hold) and hold.generation == 1


def test_a_lapsed_holder_is_taken_over_and_learns_it(tmp_path: Path) -> None:
    hold = _take(tmp_path, timeout_s=0.3)
    assert isinstance(hold, Hold)
    assert isinstance(_take(tmp_path), Busy)
    time.sleep(0.4)  # alive, but not renewed within its timeout (a stalled process)
    successor = _take(tmp_path)
    assert isinstance(successor, Hold)
    assert not hold.renew() and hold.lost is Lost.SUPERSEDED
    hold.release()  # changes nothing for the successor
    assert successor.renew()


def test_a_holder_elsewhere_is_judged_by_its_heartbeat_only(tmp_path: Path) -> None:
    _plant(tmp_path, 3, "elsewhere", 1, age_s=5.0)
    busy = _take(tmp_path)
    assert isinstance(busy, Busy) and "host elsewhere" in busy.record.describe(time.time())
    _plant(tmp_path, 4, "elsewhere", 1, age_s=31.0)  # past its 30 s
    assert isinstance(_take(tmp_path), Hold)


def test_a_holder_on_this_host_whose_process_is_gone_is_taken_over_at_once(
    tmp_path: Path,
) -> None:
    _plant(tmp_path, 2, socket.gethostname(), dead_pid(), age_s=0.0)
    hold = _take(tmp_path)
    assert isinstance(hold, Hold) and hold.generation == 3


def test_a_damaged_record_counts_as_released(tmp_path: Path) -> None:
    Path(holds.record_path(str(tmp_path), PREFIX, 5)).write_text("{not json")
    assert isinstance(_take(tmp_path), Hold)


def test_a_removed_hold_is_lost(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    hold = _take(directory)
    assert isinstance(hold, Hold)
    shutil.rmtree(directory)
    assert not hold.renew() and hold.lost is Lost.REMOVED


_TAKER = """
import sys, time
from dirmq.store import holds
from dirmq.store.filemodes import Access
directory, at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, at - time.time()))
taken = holds.take(directory, "runner.", 30.0, access=Access.named("private"))
print(type(taken).__name__, flush=True)
sys.stdin.readline()  # hold it until every taker has answered
"""


def test_of_processes_taking_at_once_exactly_one_holds(tmp_path: Path) -> None:
    _plant(tmp_path, 1, "elsewhere", 1, age_s=100.0)  # a lapsed holder, for all at once
    at = time.time() + 1.5
    takers = [
        subprocess.Popen(
            [sys.executable, "-c", _TAKER, str(tmp_path), str(at)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    answers = []
    for taker in takers:
        assert taker.stdout is not None
        answers.append(taker.stdout.readline().strip())
    for taker in takers:
        taker.communicate("go\n", timeout=30)
    assert sorted(answers) == ["Busy"] * 5 + ["Hold"]
