"""The shared-filesystem mode (docs/FORMAT.md, "Filesystems"), forced on a local disk with
`Store(shared=True)`: what it does differently (nothing recycled through @free, named temps
beside their final names, retirements that trust only their own rename, a claimed file re-read
before it is called corrupt, one count per id seen under two names) and that the queue contract
holds in it. The same mode on a real GlusterFS volume is tests/test_gluster.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import StaleReceipt
from dirmq.store import codec, layout
from dirmq.store.census import queue_depth
from dirmq.store.filesystems import is_shared
from dirmq.store.fsck import fsck
from dirmq.store.processes import ProcessIdentity, current

from .support.procs import dead_pid


def _files(queue_dir: Path, state: str) -> list[str]:
    found: list[str] = []
    for dirpath, _dirs, names in os.walk(queue_dir / state):
        found += [os.path.join(dirpath, n) for n in names]
    return found


@pytest.mark.parametrize("shared", [False, True])
def test_put_get_ack_in_both_modes(root: Path, shared: bool) -> None:
    """The contract is the same; in the shared mode nothing is kept in @free or @tmp."""
    with dirmq.Store(root, shared=shared) as store:
        assert store.context.shared is shared
        queue = store.create_queue("q")
        ids = [queue.put(f"m{i}".encode()) for i in range(50)]
        ids += queue.put_many([dirmq.OutgoingMessage(f"b{i}".encode()) for i in range(50)])
        got = []
        while batch := queue.get(7):
            got += batch
            for message in batch:
                queue.ack(message.receipt)
        assert [m.id for m in got] == ids
        assert queue.stats().total == 0
        dirmq.store.ownpool.wait_reaped(5.0)
        if shared:
            assert _files(root / "q", layout.FREE) == []  # nothing recycled
            # Every retirement unlinked; what is left are the claim tokens of the last 10 s.
            assert all(n.endswith(".claim") for n in _files(root / "q", layout.TMP))
        else:
            assert _files(root / "q", layout.FREE) != []  # today's pool, untouched
        assert fsck(root, repair=False).ok


def test_local_disk_is_not_shared(root: Path) -> None:
    """Auto-detection leaves a local disk's fast paths alone."""
    with dirmq.Store(root) as store:
        assert not is_shared(str(root))
        assert store.context.shared is False


def test_shared_mode_writes_each_put_beside_its_final_name(root: Path) -> None:
    """No O_TMPFILE in the shared mode (FUSE and NFS have none), and no @tmp: a put's file is
    written as `.<final name>.<host>-<pid>` in @ready itself (on GlusterFS the publishing rename
    then stays on one brick). While it is written, no listing counts or delivers it. Seen by
    holding a put inside its write."""
    from dirmq.store import fsio

    seen: list[tuple[str, list[str], int, list[str]]] = []
    original = fsio.write_new_file

    def spying(path: str, data: bytes, access: object) -> int:
        fd = original(path, data, access)  # type: ignore[arg-type]
        directory = os.path.dirname(path)
        assert not os.listdir(root / "q" / layout.TMP)
        other = dirmq.Store(root, shared=True).queue("q")  # another process's view
        got = [m.id for m in other.get(5, visibility_s=60)]
        seen.append((os.path.basename(directory), os.listdir(directory), other.stats().ready, got))
        return fd

    with dirmq.Store(root, shared=True) as store:
        queue = store.create_queue("q")
        fsio.write_new_file = spying  # type: ignore[assignment]
        try:
            message_id = queue.put(b"x")
        finally:
            fsio.write_new_file = original
        assert [m.id for m in queue.get(5)] == [message_id]
    assert seen == [(layout.READY, [layout.temp_beside(message_id)], 0, [])]
    assert layout.parse_temp_beside(layout.temp_beside(message_id))[0] == message_id  # type: ignore[index]


def _plant_temp(queue_dir: Path, state: str, final: str, pid: int, age_s: float = 0) -> Path:
    writer = ProcessIdentity(layout.HOST_TAG, current().pid_ns, pid, 0)
    path = queue_dir / state / f".{final}.{writer.token('-')}"
    path.write_bytes(b"half a mess")
    path.chmod(0o600)  # the root's private access (store/filemodes.py)
    if age_s:
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_temps_beside_of_dead_or_old_writers_are_removed_and_live_ones_kept(root: Path) -> None:
    """Opening a queue, `sweep` and `fsck` treat a temp beside its final name as they treat one
    in @tmp: a dead writer's (or one older than an hour, of a writer they cannot see) is
    removed; a live writer's is left alone and never quarantined, rehomed or delivered."""
    with dirmq.Store(root, shared=True) as store:
        store.create_queue("q")
    queue_dir = root / "q"
    final = "1700000000000000-0123456789ab"
    dead = _plant_temp(queue_dir, layout.READY, final, dead_pid())
    old = _plant_temp(queue_dir, layout.DELAYED, f"{final}.0.1700000000000", 1, age_s=7200)
    live = _plant_temp(queue_dir, layout.READY, "1700000000000001-0123456789ab", os.getpid())
    report = fsck(root, repair=False)
    assert sorted((p.kind, p.path) for p in report.problems) == sorted(
        [("orphan-tmp", str(dead)), ("orphan-tmp", str(old))]
    )
    with dirmq.Store(root, shared=True) as store:
        queue = store.queue("q")
        assert queue.get(5) == []
        assert not dead.exists() and not old.exists()
        assert queue.sweep().orphans_removed == 2  # removed on open, reported by the next sweep
        assert live.exists() and queue.stats().ready == 0
    repaired = fsck(root, repair=True)
    assert not repaired.problems and live.exists()
    assert not os.listdir(queue_dir / layout.CORRUPT)


def test_a_local_mode_sweep_leaves_dot_names_in_ready_alone(root: Path) -> None:
    """Only the shared mode writes beside final names; a local-mode sweep does not list @ready
    for them (the cost of a deep queue's listing), and no listing takes them for messages."""
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        planted = _plant_temp(root / "q", layout.READY, "1700000000000000-0123456789ab", 1)
        assert queue.sweep().orphans_removed == 0
        assert planted.exists() and queue.get(1) == [] and queue.stats().ready == 0


def test_ack_of_a_lease_moved_away_is_stale_and_keeps_the_message(root: Path) -> None:
    """A retirement counts only on its own rename: a lease another host moved (here: put back
    into @ready by hand, as an expiry elsewhere would) is not acknowledged, and stays."""
    with dirmq.Store(root, shared=True) as store:
        queue = store.create_queue("q")
        message_id = queue.put(b"keep me")
        message = queue.get_one()
        assert message is not None
        [lease] = os.listdir(root / "q" / layout.LEASED)
        os.rename(root / "q" / layout.LEASED / lease, root / "q" / layout.READY / message_id)
        with pytest.raises(StaleReceipt):
            queue.ack(message.receipt)
        time.sleep(0.01)  # a lease name of another millisecond (the count is 1 again)
        again = queue.get_one()
        assert again is not None and again.id == message_id and again.body == b"keep me"
        queue.ack(again.receipt)
        assert all(n.endswith(".claim") for n in _files(root / "q", layout.TMP))


def test_one_file_under_two_names_counts_once(root: Path) -> None:
    """A listing may show a file another host is renaming under both names (GlusterFS):
    stats and the census count its id once, and a get claims it at most once."""
    with dirmq.Store(root, shared=True) as store:
        queue = store.create_queue("q", dirmq.QueueConfig(visibility_timeout_s=60))
        message_id = queue.put(b"one")
        lease = layout.timed_name(message_id, 1, int(time.time() * 1000) + 60_000, None)
        # Both names at once, as such a listing shows them (here: a second link).
        os.link(root / "q" / layout.READY / message_id, root / "q" / layout.LEASED / lease)
        depth = queue_depth(root, "q", shared=True)
        assert (depth.ready, depth.in_flight) == (0, 1)
    with dirmq.Store(root, shared=True, watch_mode="poll") as store:
        stats = store.queue("q").stats()
        assert (stats.ready, stats.in_flight) == (0, 1)


def test_a_claimed_file_is_reread_before_it_is_called_corrupt(root: Path) -> None:
    """In the shared mode a claimed file that does not decode is read again for a while (a
    client cache may serve old bytes for about a second): one that turns intact meanwhile is
    delivered; one that stays damaged is still quarantined."""
    with dirmq.Store(root, shared=True) as store:
        queue = store.create_queue("q")
        good = codec.encode(b"late bytes", {}, message_id=(message_id := queue.put(b"x")))
        path = root / "q" / layout.READY / message_id
        fd = os.open(path, os.O_WRONLY)  # the inode, whatever name it has by then
        os.ftruncate(fd, 0)  # reads as damaged now

        def heal() -> None:
            time.sleep(0.5)
            os.pwrite(fd, good, 0)
            os.close(fd)

        healer = threading.Thread(target=heal)
        healer.start()
        message = queue.get_one()
        healer.join()
        assert message is not None and message.body == b"late bytes"
        assert queue.corrupt_quarantined == 0
        queue.ack(message.receipt)

        bad_id = queue.put(b"y")
        with open(root / "q" / layout.READY / bad_id, "r+b") as f:
            f.truncate(3)
        started = time.monotonic()
        assert queue.get_one() is None
        assert time.monotonic() - started >= 1.5
        assert queue.corrupt_quarantined == 1


@pytest.mark.parametrize("shared", [False, True])
def test_a_claim_onto_a_name_that_is_already_the_same_file_is_not_won(
    root: Path, shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another host's stale client does on GlusterFS, played on a local disk: the lease
    name this claim picks (same id, count and millisecond as another host's claim) is
    already the message file, while @ready still names it for us. rename(2) onto the same file
    succeeds doing nothing, so a plain claim "wins" a message another host holds; the shared
    mode's claim loses it: the other host's claim holds the lease name's token
    (`@tmp/<lease>.claim`, O_EXCL)."""
    from dirmq.store import leasing

    fixed_ms = int(time.time() * 1000)
    monkeypatch.setattr(leasing, "now_ns", lambda: fixed_ms * 1_000_000)  # a get's clock
    # Polled once a minute: the index (built by stats) still has it ready, as a stale
    # listing would.
    with dirmq.Store(root, shared=shared, watch_mode="poll", poll_interval_s=60) as store:
        queue = store.create_queue("q", dirmq.QueueConfig(visibility_timeout_s=60))
        message_id = queue.put(b"held elsewhere")
        assert queue.stats().ready == 1
        # The very name this get picks, its holder's token included (two processes' tokens
        # differ, so only a get naming no holder could meet another's name in practice).
        holders = store.context.holders
        token = None if holders is None else holders.token(None)
        lease = layout.timed_name(message_id, 1, fixed_ms + 60_000, None, token)
        os.link(root / "q" / layout.READY / message_id, root / "q" / layout.LEASED / lease)
        if shared:
            (root / "q" / layout.TMP / f"{lease}.claim").touch()
        got = queue.get_one()
        if shared:
            assert got is None
            assert os.path.exists(root / "q" / layout.LEASED / lease)  # the other's lease
        else:
            assert got is not None and got.id == message_id  # the hazard the mode removes


def test_claim_tokens_are_kept_a_while_then_unlinked(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's token (`@tmp/<lease>.claim`) outlives the claim by `HOLD_S`, so a get that
    began in the same millisecond on another host meets it; later claims unlink the old ones.
    A get older than half of that claims nothing more (its lease names could meet no token)."""
    from dirmq.store import claimtokens

    monkeypatch.setattr(claimtokens, "HOLD_S", 0.2)
    with dirmq.Store(root, shared=True) as store:
        queue = store.create_queue("q")
        first, second = queue.put(b"1"), queue.put(b"2")
        message = queue.get_one()
        assert message is not None and message.id == first
        [lease] = os.listdir(root / "q" / layout.LEASED)
        assert os.listdir(root / "q" / layout.TMP) == [f"{lease}.claim"]
        time.sleep(0.3)
        message = queue.get_one()
        assert message is not None and message.id == second
        [token] = os.listdir(root / "q" / layout.TMP)  # the first one's is gone
        assert token.startswith(second)
        tokens = store.queue("q")._view.files.tokens
        assert tokens is not None
        assert tokens.fresh(1000, 1000 + 100) and not tokens.fresh(1000, 1000 + 101)


def test_a_polling_get_that_lost_every_claim_lists_again(root: Path) -> None:
    """Other hosts' consumers took what this process's last listing showed: its get lists
    again at once and finds what was published since, rather than waiting for the next poll
    (a minute here)."""
    with (
        dirmq.Store(root, shared=True, watch_mode="poll", poll_interval_s=60) as here,
        dirmq.Store(root, shared=True, watch_mode="poll", poll_interval_s=60) as there,
    ):
        mine = here.create_queue("q")
        theirs = there.queue("q")
        mine.put_many([dirmq.OutgoingMessage(b"1"), dirmq.OutgoingMessage(b"2")])
        assert mine.stats().ready == 2  # this process's index: both
        assert len(theirs.get(2)) == 2  # taken elsewhere
        newest = theirs.put(b"3")
        got = mine.get_one()
        assert got is not None and got.id == newest
