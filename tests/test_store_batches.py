"""A get's leases and a chunk of acks are applied in one pass each (`QueueFiles.claim_many`,
`leasing.ack_each`): every receipt still gets its own outcome, a lease that moved since the
index looked is found again, and a batch mixing the usual case with the others (groups, corrupt
files, messages returned before) keeps FIFO order and delivers each message once."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dirmq
from dirmq.store import layout
from dirmq.store.message import OutgoingMessage
from dirmq.store.timedset import plain_timed as _plain_timed
from dirmq.store.view import QueueView

from .support.faultfs import FaultyFS


def test_ack_many_gives_each_receipt_its_own_outcome(store: dirmq.Store) -> None:
    q = store.create_queue("outcomes")
    q.put_many([b"%d" % i for i in range(6)])
    got = q.get(6)
    receipts = [m.receipt or "" for m in got]
    lease_name = next(iter(Path(q.path, layout.LEASED).iterdir())).name
    stale = f"{got[2].id}.{got[2].receive_count + 1}"  # a lease that never was
    bad = ["nonsense", got[3].id, lease_name]
    zero = f"{got[3].id}.01"  # the receipt "<id>.1" spelled with a zero: as valid as it
    failures = q.ack_each([receipts[0], receipts[1], stale, *bad, zero, receipts[4], receipts[5]])
    assert set(failures) == {stale, *bad}
    assert isinstance(failures[stale], dirmq.StaleReceipt)
    for receipt in bad:
        assert isinstance(failures[receipt], dirmq.InvalidArgument), receipt
    assert q.stats().in_flight == 1
    assert q.peek(got[2].id).state == "leased"
    # What failed is still leased and can be acknowledged with its real receipt.
    assert q.ack_each([receipts[2]]) == {}
    with pytest.raises(dirmq.StaleReceipt):
        q.ack(receipts[0])  # acknowledged once already


def test_an_ack_whose_lease_moved_since_the_index_looked_is_found_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process extends a lease (a rename) after this process's index looked: the batch's
    rename of the old name finds nothing, and the receipt, still valid, is acknowledged under
    the lease's new name."""
    with dirmq.Store(root) as mine, dirmq.Store(root) as theirs:
        q = mine.create_queue("moved")
        q.put_many([b"a", b"b", b"c"])
        got = q.get(3)
        q.stats()  # the index is current
        real_synced = QueueView.synced
        calls = 0

        def behind_once(view: QueueView) -> object:
            nonlocal calls
            calls += 1
            if calls == 1 and view.index is not None:
                return view.index  # the extend's events not taken in yet
            return real_synced(view)

        theirs.queue("moved").extend(got[1].receipt or "", 600)
        monkeypatch.setattr(QueueView, "synced", behind_once)
        assert q.ack_each([m.receipt or "" for m in got]) == {}
        monkeypatch.setattr(QueueView, "synced", real_synced)
        assert calls >= 2  # looked again, up to date
        assert q.stats().total == 0
        assert list(Path(q.path, layout.LEASED).iterdir()) == []


def test_a_get_mixing_plain_heads_with_groups_and_returned_messages_keeps_fifo(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("mixed")
    q.put(b"p0")
    q.put_many([OutgoingMessage(b"g0", group="g"), OutgoingMessage(b"g1", group="g")])
    q.put(b"p1")
    returned = q.get(1)[0]  # p0, given back: "<id>.1" in @ready, still first
    q.nack(returned.receipt or "")
    got = q.get(10)
    assert [m.body for m in got] == [b"p0", b"g0", b"p1"]  # one of group g per get
    assert [m.receive_count for m in got] == [2, 1, 1]
    assert q.ack_each([m.receipt or "" for m in got]) == {}
    (last,) = q.get(10)
    assert last.body == b"g1"


def test_a_corrupt_file_in_a_batch_is_set_aside_and_the_rest_delivered(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("damaged")
    ids = q.put_many([b"m%d" % i for i in range(5)])
    Path(q.path, layout.READY, ids[2]).write_bytes(b"not a message file")
    got = q.get(5)
    assert [m.body for m in got] == [b"m0", b"m1", b"m3", b"m4"]
    (corrupt,) = Path(q.path, layout.CORRUPT).iterdir()
    assert corrupt.name.startswith(ids[2])
    assert q.ack_each([m.receipt or "" for m in got]) == {}
    assert q.stats().total == 0


_PIECES = [
    *(".", "1", "0", "42", "9" * 13, "9" * 25, "~abcdefabcdef", "~", "x", "\u0661", "-"),
    *("+0123456789ab", "+0123456789aB", "+", "+0123"),  # a holder token, and what is none
]


@given(st.lists(st.sampled_from(_PIECES), max_size=6))
def test_the_index_reads_a_plain_timed_name_as_parse_entry_does(tail: list[str]) -> None:
    """The index's shortcut for other processes' lease names (one match, no `Entry`) either
    declines a name, which `parse_entry` then reads, or reads the same time from it."""
    name = "1795710758441202-bc1b0fc75066" + "".join(tail)
    entry = layout.parse_entry(name)
    at_ms = _plain_timed(name)
    if at_ms is not None:
        assert entry is not None and entry.group is None and entry.at_ms == at_ms
    # A lease name in no group (`<id>.<count>.<at_ms>`: two dots) is never declined; a delayed
    # name (`<id>.<at_ms>`) is not a lease's and is left to `parse_entry`.
    lease_form = name.count(".") == 2
    usual = entry is not None and entry.group is None and entry.at_ms is not None
    if usual and lease_form and name.isascii():
        assert entry is not None and at_ms == entry.at_ms


def test_a_batch_of_acks_with_no_pool_directory_to_be_had_unlinks(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recycling is an optimisation: when this process's pool directory cannot be made (a full
    disk), the batch's files are unlinked and every ack succeeds, as a single ack's would."""
    with dirmq.Store(root) as store:
        q = store.create_queue("nopool")
        q.put_many([b"a", b"b", b"c"])
        got = q.get(3)
        assert list(Path(q.path, layout.FREE).iterdir()) == []  # no pool directory yet
        fs = FaultyFS(monkeypatch, root)
        fs.fail("mkdir", errno.ENOSPC)
        assert q.ack_many(m.receipt or "" for m in got) == {}
        fs.clear()
        assert fs.raised["mkdir"] >= 1
        assert q.stats().total == 0
        assert list(Path(q.path, layout.LEASED).iterdir()) == []
        assert sum(len(files) for _d, _s, files in os.walk(Path(q.path, layout.FREE))) == 0


def test_a_lease_name_given_twice_is_acknowledged_once(store: dirmq.Store) -> None:
    q = store.create_queue("twice")
    q.put_many([b"a", b"b"])
    leases = [lease for lease, _message in q.claim_named(q.ready_names())]
    assert q.ack_leases([leases[0], leases[0], leases[1]]) == []
    assert q.stats().total == 0


def test_a_timed_name_in_ready_is_leased_like_any_returned_message(store: dirmq.Store) -> None:
    """Not a name dirmq makes in @ready, but one the index takes from an event: leased with
    the count its name gives, as `claim` always did, not a failed get."""
    q = store.create_queue("odd")
    ids = q.put_many([b"a", b"b"])
    q.stats()  # indexed: the rename below arrives as an event
    ready = Path(q.path, layout.READY)
    (ready / ids[0]).rename(ready / f"{ids[0]}.3.1700000000000")
    got = q.get(5)
    assert [(m.body, m.receive_count) for m in got] == [(b"a", 4), (b"b", 1)]
    assert q.ack_each([m.receipt or "" for m in got]) == {}
