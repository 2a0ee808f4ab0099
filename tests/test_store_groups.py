"""Message groups in the store: one get may lease several consecutive messages of a group
(`max_per_group`), and the group stays held back from every other get, in this process or
another, until none of them is in flight; returned messages keep the group's order."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq import OutgoingMessage
from dirmq.errors import InvalidArgument

from .support.procs import REPO


@pytest.fixture(params=["inotify", "poll"])
def groups_store(request: pytest.FixtureRequest, root: Path) -> Iterator[dirmq.Store]:
    if request.param == "poll":  # as on NFS: other stores' changes are seen by listing
        store = dirmq.Store(root, watch_mode="poll", poll_interval_s=0.05)
    else:
        store = dirmq.Store(root)
    with store:
        yield store


def _fill(q: dirmq.Queue, groups: str) -> dict[str, str]:
    """Publish one message per letter (its group), bodies g0, g1, h0...; body -> id."""
    ids: dict[str, str] = {}
    seen: dict[str, int] = {}
    for group in groups:
        n = seen.get(group, 0)
        seen[group] = n + 1
        body = f"{group}{n}"
        ids[body] = q.put_many([OutgoingMessage(body.encode(), group=group)])[0]
    return ids


def _bodies(messages: list[dirmq.Message]) -> list[str]:
    return [m.body.decode() for m in messages]


def _get_elsewhere(root: Path, queue: str) -> list[str]:
    """Bodies a get(10, max_per_group=None) leases in another process (visibility 60 s)."""
    script = (
        "import sys, dirmq\n"
        "q = dirmq.Store(sys.argv[1]).queue(sys.argv[2])\n"
        "print(' '.join(m.body.decode() for m in q.get(10, visibility_s=60, max_per_group=None)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(root), queue],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


def test_one_get_leases_consecutive_messages_of_a_group(groups_store: dirmq.Store) -> None:
    q = groups_store.create_queue("g")
    _fill(q, "gghgxh")
    x_free = q.put(b"u0")
    got = q.get(10, max_per_group=None)
    # FIFO order across groups, each group in its own order.
    assert _bodies(got) == ["g0", "g1", "h0", "g2", "x0", "h1", "u0"]
    assert got[-1].id == x_free
    assert [m.group for m in got[:3]] == ["g", "g", "h"]
    assert q.stats().in_flight == 7


def test_max_per_group_limits_the_run(groups_store: dirmq.Store) -> None:
    q = groups_store.create_queue("limit")
    _fill(q, "ggghh")
    assert _bodies(q.get(10)) == ["g0", "h0"], "the default is one per group"
    q2 = groups_store.create_queue("limit2")
    _fill(q2, "ggghh")
    assert _bodies(q2.get(10, max_per_group=2)) == ["g0", "g1", "h0", "h1"]
    assert _bodies(q2.get(10, max_per_group=2)) == [], "g2 waits for g0 and g1"
    with pytest.raises(InvalidArgument):
        q.get(1, max_per_group=0)


def test_the_group_is_held_back_until_all_of_the_run_is_acked(
    groups_store: dirmq.Store, root: Path
) -> None:
    q = groups_store.create_queue("held")
    _fill(q, "ggg")
    first = q.get(2, max_per_group=None)
    assert _bodies(first) == ["g0", "g1"]
    assert q.get(10, max_per_group=None) == [], "same process, another get"
    with dirmq.Store(root) as other:  # another index of the same queue
        assert other.queue("held").get(10, max_per_group=None) == []
    assert _get_elsewhere(root, "held") == [], "another process"
    q.ack(first[0].receipt or "")
    assert q.get(10, max_per_group=None) == [], "g1 is still in flight"
    assert _get_elsewhere(root, "held") == []
    q.ack(first[1].receipt or "")
    assert _get_elsewhere(root, "held") == ["g2"]


def test_a_run_leased_in_another_process_holds_the_group_here(
    groups_store: dirmq.Store, root: Path
) -> None:
    q = groups_store.create_queue("remote")
    _fill(q, "gghg")
    q.get(10, visibility_s=0.0)  # build this process's index first: it must follow the other
    deadline = time.monotonic() + 5
    while q.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.05)  # the zero-length leases fall back to ready on the next look
    assert _get_elsewhere(root, "remote") == ["g0", "g1", "h0", "g2"]
    assert q.get(10, max_per_group=None) == []
    assert q.stats().in_flight == 4


def test_expired_run_returns_in_order(groups_store: dirmq.Store) -> None:
    q = groups_store.create_queue("expire")
    ids = _fill(q, "ggg")
    first = q.get(10, visibility_s=0.3, max_per_group=None)
    assert _bodies(first) == ["g0", "g1", "g2"]
    q.ack(first[1].receipt or "")  # g1 is done; g0 and g2 are not
    again = q.get(10, wait_s=5, max_per_group=None)
    assert _bodies(again) == ["g0", "g2"]
    assert [m.id for m in again] == [ids["g0"], ids["g2"]]
    assert [m.receive_count for m in again] == [2, 2]


def test_a_returned_message_waits_for_the_rest_of_its_run(groups_store: dirmq.Store) -> None:
    """One message of a run expires while the others were extended: it is ready again, but
    the group stays held while any of them is in flight, then starts again at it."""
    q = groups_store.create_queue("partial")
    _fill(q, "gggh")
    first = q.get(10, visibility_s=0.3, max_per_group=None)
    assert _bodies(first) == ["g0", "g1", "g2", "h0"]
    q.extend(first[1].receipt or "", 60)
    q.extend(first[2].receipt or "", 60)
    time.sleep(0.4)
    again = q.get(10, max_per_group=None)
    assert _bodies(again) == ["h0"], "g0 is ready, but g1 and g2 are still in flight"
    assert q.stats().in_flight == 3
    q.nack(first[2].receipt or "")
    assert q.get(10, max_per_group=None) == [], "g1 is still in flight"
    q.nack(first[1].receipt or "")
    assert _bodies(q.get(10, max_per_group=None)) == ["g0", "g1", "g2"]


def test_nack_of_the_first_keeps_it_first(groups_store: dirmq.Store) -> None:
    q = groups_store.create_queue("nack")
    _fill(q, "ggg")
    first = q.get(10, max_per_group=None)
    q.nack(first[0].receipt or "")
    assert q.get(10, max_per_group=None) == [], "g1 and g2 are in flight"
    q.ack(first[1].receipt or "")
    q.nack(first[2].receipt or "")
    again = q.get(10, max_per_group=None)
    assert _bodies(again) == ["g0", "g2"]
    assert [m.receive_count for m in again] == [2, 2]


def test_a_delayed_nack_keeps_the_group_held_and_the_message_first(
    groups_store: dirmq.Store,
) -> None:
    """A group message given back with a delay waits in flight (as SQS's
    ChangeMessageVisibility does): the group's later messages are not delivered before it."""
    q = groups_store.create_queue("nack-delay")
    _fill(q, "ggh")
    (g0, h0) = q.get(10, visibility_s=30)
    q.nack(g0.receipt or "", delay_s=0.4)
    assert _bodies(q.get(10)) == [], "g1 must not overtake g0; h0 is in flight"
    assert q.stats().delayed == 0
    time.sleep(0.6)
    again = q.get(10, max_per_group=None)
    assert _bodies(again)[:2] == ["g0", "g1"]
    assert again[0].receive_count == 2
    q.ack(h0.receipt or "")


def test_an_ungrouped_delayed_nack_waits_as_a_delayed_message(groups_store: dirmq.Store) -> None:
    q = groups_store.create_queue("nack-delay-plain")
    q.put(b"a")
    q.put(b"b")
    (a,) = q.get(1)
    q.nack(a.receipt or "", delay_s=30)
    assert q.stats().delayed == 1
    assert _bodies(q.get(10)) == ["b"]


def test_a_lost_claim_closes_the_group_to_that_get(root: Path) -> None:
    """An index that has not yet seen another process lease a group's head must not lease
    the head's successor: the rename of the head fails, and the group is closed to that get."""
    with (
        dirmq.Store(root, watch_mode="poll", poll_interval_s=60) as slow,
        dirmq.Store(root) as fast,
    ):
        q = slow.create_queue("race")
        _fill(q, "gg")
        q.stats()  # index built: it holds g0 and g1 as ready and will not look again for 60 s
        taken = fast.queue("race").get(1)
        assert _bodies(taken) == ["g0"]
        assert q.get(10, max_per_group=None) == []


def test_peers_mode_keeps_each_run_in_order(groups_store: dirmq.Store) -> None:
    """With `peers`, a get picks among the oldest ready messages at random, but of a group only
    its oldest is a candidate: runs stay in order."""
    q = groups_store.create_queue("peers", dirmq.QueueConfig(peers=4))
    _fill(q, "ggghhgxh")
    got = _bodies(q.get(10, max_per_group=None))
    assert sorted(got) == ["g0", "g1", "g2", "g3", "h0", "h1", "h2", "x0"]
    for group in "ghx":
        run = [b for b in got if b[0] == group]
        assert run == sorted(run)
    assert q.get(10, max_per_group=None) == []
