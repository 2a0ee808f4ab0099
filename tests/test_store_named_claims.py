"""Planned claims: one coordinator lists the oldest ready messages (`ready_names`) and hands
disjoint slices to cooperating consumers, which lease exactly their names (`claim_named`) and
acknowledge by lease name (`ack_leases`). Each consumer here is its own Store, as each Spark
task is its own process."""

from __future__ import annotations

import errno
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq import OutgoingMessage, QueueConfig
from dirmq.errors import InvalidArgument, QueueFull, QueueNotFound, StorageError

from .support.faultfs import FaultyFS


def test_ready_names_are_the_oldest_ready_messages_in_order(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        ids = queue.put_many([b"m%d" % i for i in range(6)])
        queue.put(b"later", delay_s=60)
        [leased] = queue.get(1)
        assert leased.id == ids[0]
        assert queue.ready_names() == ids[1:]
        assert queue.ready_names(2) == ids[1:3]
        queue.nack(leased.receipt or "")  # given back: first again, named with its count
        assert queue.ready_names(1) == [f"{ids[0]}.1"]


def test_ready_names_stop_before_a_message_group(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        first = queue.put(b"plain")
        queue.put_many([OutgoingMessage(b"g", group="g")])
        queue.put(b"after the group")
        assert queue.ready_names() == [first]


def test_ready_names_promote_expired_leases_and_due_delays(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        delayed = queue.put(b"soon", delay_s=0.05)
        queue.put(b"expires")
        [message] = queue.get(1, visibility_s=0.05)
        time.sleep(0.15)
        assert queue.ready_names(promote=False) == []
        assert sorted(queue.ready_names()) == sorted([delayed, f"{message.id}.1"])


def test_claim_named_leases_exactly_the_names_still_there(root: Path) -> None:
    with dirmq.Store(root) as planner, dirmq.Store(root) as a, dirmq.Store(root) as b:
        ids = planner.create_queue("q").put_many([b"m%d" % i for i in range(10)])
        names = planner.queue("q").ready_names()
        # Another consumer takes one of a's names before a gets to it.
        [taken] = b.queue("q").claim_named([names[2]], visibility_s=60)
        got = a.queue("q").claim_named(names[:5], visibility_s=60)
        assert [m.id for _, m in got] == [ids[0], ids[1], ids[3], ids[4]]
        assert all(m.receive_count == 1 and m.state == "leased" for _, m in got)
        assert taken[1].id == ids[2]
        stats = planner.queue("q").stats()
        assert (stats.ready, stats.in_flight) == (5, 5)
        # Leases taken by name are ordinary leases: receipts work, and they expire.
        a.queue("q").nack(got[0][1].receipt or "")
        assert planner.queue("q").stats().ready == 6
        [short] = a.queue("q").claim_named(planner.queue("q").ready_names(1), visibility_s=0.05)
        time.sleep(0.1)
        assert planner.queue("q").get(1)[0].id == short[1].id


def test_claim_named_refuses_names_that_are_not_plain_ready_ones(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        queue.put_many([OutgoingMessage(b"g", group="g")])
        [group_name] = [n for n in (root / "q" / "@ready").iterdir()]
        for bad in (group_name.name, "not-a-name", "0000000000000001-000000000000.1.5"):
            with pytest.raises(InvalidArgument):
                queue.claim_named([bad])


def test_claim_named_drops_what_is_past_retention(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q", QueueConfig(retention_s=0.05))
        queue.put(b"old")
        names = queue.ready_names()
        time.sleep(0.1)
        assert queue.claim_named(names) == []
        assert queue.stats().total == 0


def test_ack_leases_acknowledges_by_name_and_reports_what_moved(root: Path) -> None:
    with dirmq.Store(root) as planner, dirmq.Store(root) as worker, dirmq.Store(root) as acker:
        planner.create_queue("q").put_many([b"m%d" % i for i in range(4)])
        got = worker.queue("q").claim_named(planner.queue("q").ready_names(), visibility_s=60)
        leases = [lease for lease, _ in got]
        worker.queue("q").extend(got[1][1].receipt or "", 120)  # renames that lease
        # A third process, which never opened its index, acknowledges.
        assert acker.queue("q").ack_leases(leases) == [leases[1]]
        assert planner.queue("q").stats().in_flight == 1
        assert acker.queue("q").ack_many([got[1][1].receipt or ""]) == {}
        assert planner.queue("q").stats().total == 0
        with pytest.raises(InvalidArgument):
            acker.queue("q").ack_leases(["nonsense"])


def test_ack_leases_frees_capacity_tokens(root: Path) -> None:
    with dirmq.Store(root) as planner, dirmq.Store(root) as worker:
        queue = planner.create_queue("q", QueueConfig(capacity=2))
        queue.put_many([b"a", b"b"])
        with pytest.raises(QueueFull):
            queue.put(b"c", timeout_s=0)
        got = worker.queue("q").claim_named(queue.ready_names())
        with dirmq.Store(root) as fresh:  # no index: the tokens are found on disk
            assert fresh.queue("q").ack_leases([lease for lease, _ in got]) == []
        assert len(queue.put_many([b"c", b"d"], timeout_s=1)) == 2


def test_promotion_from_listings_dead_letters_and_frees_the_token(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q", QueueConfig(capacity=1, max_receives=1))
        queue.put(b"poison")
        queue.claim_named(queue.ready_names(), visibility_s=0.05)
        time.sleep(0.1)
        assert queue.ready_names() == []  # expired on its last receive: dead-lettered
        assert queue.stats().dead == 1
        queue.put(b"next", timeout_s=0)  # its capacity token was freed


def test_ack_leases_from_several_threads(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q", QueueConfig(capacity=400))
        queue.put_many([b"m%d" % i for i in range(400)])
        leases = [lease for lease, _ in queue.claim_named(queue.ready_names())]
        with ThreadPoolExecutor(4) as pool:
            missing = list(pool.map(queue.ack_leases, [leases[i::4] for i in range(4)]))
        assert missing == [[], [], [], []]
        assert queue.stats().total == 0
        assert len(queue.put_many([b"n%d" % i for i in range(400)], timeout_s=0)) == 400


@pytest.mark.parametrize("claim", ["claim_named", "lease_named"])
def test_claiming_names_on_a_deleted_queue_is_an_error(root: Path, claim: str) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        queue.put(b"x")
        names = queue.ready_names()
        store.delete_queue("q")
        with pytest.raises(QueueNotFound):
            getattr(queue, claim)(names)


def test_a_message_larger_than_one_read_is_read_whole(root: Path) -> None:
    body = bytes(range(256)) * 1024  # 256 KiB: several reads
    with dirmq.Store(root) as store:
        queue = store.create_queue("q", QueueConfig(max_message_bytes=1 << 20))
        queue.put(body)
        [(_, message)] = queue.claim_named(queue.ready_names())
        assert message.body == body


def test_lease_named_leases_without_reading_and_read_leases_reads_in_order(root: Path) -> None:
    with dirmq.Store(root) as planner, dirmq.Store(root) as worker, dirmq.Store(root) as other:
        ids = planner.create_queue("q").put_many([b"m%d" % i for i in range(6)])
        leases = worker.queue("q").lease_named(planner.queue("q").ready_names(), visibility_s=60)
        assert len(leases) == 6
        assert other.queue("q").get(10, wait_s=0) == []  # leased already, though unread
        first = list(worker.queue("q").read_leases(leases[:4]))
        rest = list(worker.queue("q").read_leases(leases[4:]))
        assert [m.id for m in first + rest] == ids
        assert [m.body for m in first] == [b"m0", b"m1", b"m2", b"m3"]
        assert all(m.state == "leased" and m.receive_count == 1 for m in first + rest)
        assert other.queue("q").ack_many([m.receipt or "" for m in first + rest]) == {}
        assert planner.queue("q").stats().total == 0


def test_read_leases_follows_a_moved_lease_and_skips_what_is_gone(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        ids = queue.put_many([b"extended", b"acked", b"damaged", b"fine"])
        leases = queue.lease_named(queue.ready_names(), visibility_s=60)
        queue.extend(f"{ids[0]}.1", 300)  # a heartbeat renamed the lease file
        queue.delete(ids[1])  # acknowledged by id, MQ style, by someone else
        (Path(queue.path) / "@leased" / leases[2]).write_bytes(b"\x00garbage")
        got = list(queue.read_leases(leases))
        assert [m.body for m in got] == [b"fine", b"extended"]  # the moved one comes last
        assert got[1].receipt == f"{ids[0]}.1"
        assert len(list((Path(queue.path) / "@corrupt").iterdir())) == 1
        with pytest.raises(InvalidArgument):
            list(queue.read_leases([ids[3]]))  # a ready name, not a lease name


def test_moved_leases_are_found_on_a_polling_store_whose_index_lags(root: Path) -> None:
    # An executor on a network filesystem polls: its index can be a poll interval behind the
    # heartbeats that rename its leases. Reading must not depend on it.
    with (
        dirmq.Store(root) as driver,
        dirmq.Store(root, watch_mode="poll", poll_interval_s=60) as executor,
    ):
        ids = driver.create_queue("q").put_many([b"m0", b"m1", b"m2"])
        queue = executor.queue("q")
        leases = queue.lease_named(queue.ready_names(), visibility_s=120)
        receipts = [f"{i}.1" for i in ids]
        driver.queue("q").extend(receipts[0], 300)  # a new deadline: a new name
        assert [m.body for m in queue.read_leases(leases[:1])] == [b"m0"]
        driver.queue("q").extend(receipts[1], 300)  # after the executor's index was built
        got = list(queue.read_leases(leases[1:]))
        assert [m.body for m in got] == [b"m2", b"m1"]  # moved ones come after their chunk
        assert got[1].receipt == receipts[1]
        assert sorted(m.id for m in queue.read_ids(set(ids))) == ids


def test_read_leases_reads_one_file_at_a_time(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dirmq.store import files

    reads: list[str] = []
    real = files.read_message

    def counted(path: str, message_id: str, body_file_over: int | None = None) -> Any:
        reads.append(message_id)
        return real(path, message_id, body_file_over)

    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        queue.put_many([b"m%d" % i for i in range(50)])
        leases = queue.lease_named(queue.ready_names())
        monkeypatch.setattr(files, "read_message", counted)
        messages = queue.read_leases(leases)
        next(messages)
        assert len(reads) == 1  # the caller holds what it took, no more
        assert len(list(messages)) == 49


@pytest.mark.parametrize("readable", [0, 2])
def test_a_claim_that_cannot_read_hands_back_what_it_did_not_return(
    root: Path, monkeypatch: pytest.MonkeyPatch, readable: int
) -> None:
    """A read that fails after the renames: the messages read before it are returned (as a
    get's are), the rest go back to @ready in their FIFO place at once, not when their leases
    expire; with none read, the claim raises StorageError and holds nothing."""
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        ids = queue.put_many([b"m%d" % i for i in range(5)])
        names = queue.ready_names()
        fs = FaultyFS(monkeypatch, root)
        fs.fail("read", errno.EIO, after=readable, times=1)
        if readable:
            got = queue.claim_named(names, visibility_s=600)
            assert [m.id for _, m in got] == ids[:readable]
        else:
            with pytest.raises(StorageError):
                queue.claim_named(names, visibility_s=600)
        assert fs.raised["read"] == 1
        assert queue.ready_names() == ids[readable:]  # back under their names: FIFO kept
        assert queue.stats().in_flight == readable
        assert [m.body for m in queue.get(5, max_per_group=None)] == [
            b"m%d" % i for i in range(readable, 5)
        ]
