"""Recurring schedules run by many processes at once (issue 36): three `dirmq serve` and two
library processes (`dirmq schedule run`) on one root, two schedules ticking every second for
about 30 s. One server is SIGKILLed (and another started in its place), then every runner is
stopped (SIGSTOP) long enough to miss ticks and continued. Every tick is published exactly once
or accounted for by the schedule's `missed` policy: `skip` publishes nothing for the ticks
missed in a row (its skip record says how many), `once` publishes one message for them, stamped
with the latest (`X-Schedule-Missed: n`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dirmq.schedules import Schedules, schedule
from dirmq.schedules.check import check_schedules
from dirmq.schedules.records import ScheduleFiles, read_record
from dirmq.store import Store

from .support.servers import REPO, ServerProcess, start_server
from .support.waiting import wait_until
from .test_schedules import ms

PAUSE_S = 10.0  # all runners stopped: twice the 5 s after which a tick counts as missed


def library_runner(root: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dirmq", "schedule", "run", "--root", str(root)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert "running schedules" in proc.stderr.readline()  # its runner has started
    return proc


def published(root: Path, queue: str) -> list[tuple[int, int]]:
    """(tick ms, ticks it stands for) of every message in `queue`."""
    with Store(root) as store:
        return [
            (ms(m.headers["X-Schedule-Tick"]), int(m.headers.get("X-Schedule-Missed", "1")))
            for m in store.queue(queue).browse()
        ]


def skipped(root: Path, name: str) -> list[tuple[int, int]]:
    """(tick ms, ticks missed) of every skip record of schedule `name`."""
    found = []
    for tick, records in ScheduleFiles(str(root)).ticks(name).items():
        first = read_record(records.claims.get(0))
        if first.get("kind") == "skip":
            missed = first.get("missed")
            assert isinstance(missed, int)
            found.append((tick, missed))
    return found


def accounted(entries: list[tuple[int, int]]) -> list[int]:
    """Every tick the entries stand for: each one's own and the n - 1 seconds before it."""
    return [tick - k * 1000 for tick, n in entries for k in range(n)]


def test_each_tick_once_across_a_kill_and_a_pause_of_every_runner(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with Store(root, create=True) as store:
        store.create_queue("skip")
        store.create_queue("once")
    servers: list[ServerProcess] = [start_server(root) for _ in range(3)]
    libraries = [library_runner(root) for _ in range(2)]
    try:
        with Store(root) as store:
            schedules = Schedules(store)
            schedules.put(schedule("beat-skip", "skip", every_s=1, missed="skip"))
            schedules.put(schedule("beat-once", "once", every_s=1, missed="once"))
        wait_until(lambda: len(published(root, "once")) >= 5, 30, "five ticks")
        servers[0].stop(signal.SIGKILL)  # whatever it had claimed, another runner takes over
        servers.append(start_server(root))
        count = len(published(root, "once"))
        wait_until(lambda: len(published(root, "once")) >= count + 7, 30, "seven more ticks")
        pids = [s.proc.pid for s in servers[1:]] + [p.pid for p in libraries]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(PAUSE_S)  # the passing of time is what is tested: no runner can see it
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        count = len(published(root, "once"))
        wait_until(lambda: len(published(root, "once")) >= count + 10, 30, "ticks after the pause")
    finally:
        for proc in libraries:
            proc.terminate()
            proc.communicate(timeout=30)
        codes = [s.stop() for s in servers[1:]]
    assert [p.returncode for p in libraries] == [0, 0]
    assert codes == [0] * len(codes)

    for name, queue in (("beat-skip", "skip"), ("beat-once", "once")):
        messages = published(root, queue)
        skips = skipped(root, name)
        ticks = [tick for tick, _ in messages]
        assert len(ticks) == len(set(ticks)), f"{name}: a tick published twice"
        stands_for = accounted(messages + skips)
        assert len(stands_for) == len(set(stands_for)), f"{name}: a tick accounted twice"
        first, last = min(stands_for), max(stands_for)
        assert sorted(stands_for) == list(range(first, last + 1, 1000)), f"{name}: a tick lost"
        assert last - first >= 25_000  # about 30 s
        if name == "beat-skip":
            assert [n for _, n in messages] == [1] * len(messages)  # no message for missed ones
            assert any(n >= 3 for _, n in skips), skips  # the pause: several ticks skipped
        else:
            assert skips == []
            assert [n for _, n in messages if n > 1] != []  # one message for the missed run
            assert max(n for _, n in messages) >= 3
    report = check_schedules(str(root))
    assert report is not None and report.ok, report
