"""Taking over a pub/sub subscription whose presence file is stale: exactly one of several
processes attaching at once gets it, and a dead (even zombie) owner does not keep it busy."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dirmq.errors import SubscriptionBusy
from dirmq.pubsub import PubSub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.store import Store
from dirmq.store.processes import HOST_TAG, parse_token

NAME = "billing"
ROUNDS = 60
BARRIER_TIMEOUT_S = 120  # generous: the machine is shared


def _plant_stale_presence(root: Path) -> None:
    """A presence file of a session on another host, last refreshed an hour ago."""
    present = Path(PubSubPaths.under(str(root)).present) / NAME
    present.write_text("elsewhere 1 0123456789abcdef")
    an_hour_ago = time.time() - 3600
    os.utime(present, (an_hour_ago, an_hour_ago))


def _racer(root: str, channel: str, rounds: int, barrier: Any, results: Any) -> None:
    """One attacher: each round, attach at the barrier, hold until the other has tried, then
    let go (close detaches: its presence file goes)."""
    with Store(root) as store:
        hub = PubSub(store)
        for _ in range(rounds):
            barrier.wait(BARRIER_TIMEOUT_S)  # the stale file is in place
            try:
                sub = hub.subscribe(NAME, channels=[channel])
            except SubscriptionBusy:
                sub = None
            barrier.wait(BARRIER_TIMEOUT_S)  # both have tried
            results.put((channel, sub is not None))
            if sub is not None:
                sub.close()
            barrier.wait(BARRIER_TIMEOUT_S)  # the round is over


def test_two_processes_taking_over_a_stale_presence_one_wins(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with Store(root) as store:
        PubSub(store)  # lays out @pubsub
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(3)
    results = spawn.Queue()
    racers = [
        spawn.Process(target=_racer, args=(str(root), channel, ROUNDS, barrier, results))
        for channel in ("left", "right")
    ]
    for racer in racers:
        racer.start()
    subscription_file = Path(PubSubPaths.under(str(root)).subscription_file(NAME))
    try:
        for round_ in range(ROUNDS):
            _plant_stale_presence(root)
            barrier.wait(BARRIER_TIMEOUT_S)
            barrier.wait(BARRIER_TIMEOUT_S)
            outcome = dict(results.get(timeout=BARRIER_TIMEOUT_S) for _ in racers)
            winners = [channel for channel, won in outcome.items() if won]
            assert len(winners) == 1, f"round {round_}: {outcome}"
            # The loser wrote nothing: the subscription's filter is the winner's.
            record = json.loads(subscription_file.read_text())
            assert record["filter"]["channels"] == winners, f"round {round_}: {record}"
            barrier.wait(BARRIER_TIMEOUT_S)
    except BaseException:
        # Only on failure: aborting while the racers leave the last barrier would break it
        # for them too.
        barrier.abort()
        raise
    finally:
        for racer in racers:
            racer.join(30)
            if racer.is_alive():
                racer.kill()
                racer.join()
    assert [racer.exitcode for racer in racers] == [0, 0]


ATTACH_AND_EXIT = """
import os, sys
from dirmq.pubsub import PubSub
from dirmq.store import Store
store = Store(sys.argv[1])
PubSub(store).subscribe(sys.argv[2])
print("attached", flush=True)
os._exit(0)  # no detach: the presence file stays, as after a crash
"""


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 1 :].split()[0]


def test_a_zombie_owner_is_taken_over(tmp_path: Path) -> None:
    root = tmp_path / "root"
    owner = subprocess.Popen(
        [sys.executable, "-c", ATTACH_AND_EXIT, str(root), NAME], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == "attached\n"
        deadline = time.monotonic() + 60
        while _state(owner.pid) != "Z":  # exited, and not reaped: we have not waited for it
            assert time.monotonic() < deadline, "the owner did not exit"
            time.sleep(0.05)
        present = Path(PubSubPaths.under(str(root)).present) / NAME
        session = parse_token(present.read_text().split()[0])
        assert session is not None and (session.host, session.pid) == (HOST_TAG, owner.pid)
        with Store(root) as store:
            hub = PubSub(store)  # presence timeout 10 s: the file is not stale by age
            with hub.subscribe(NAME) as sub:
                assert parse_token(present.read_text().split()[0]) != session
                assert sub.name == NAME
    finally:
        owner.stdout.close() if owner.stdout else None
        owner.wait()
