"""`dirmq.store.fsck`: every kind of damage is reported, repaired, and no good message is lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dirmq import InvalidArgument, QueueConfig, Store
from dirmq.store import OutgoingMessage, Queue, codec, fsck_messages, layout
from dirmq.store.fsck import FsckReport, Kind, fsck
from dirmq.store.ids import new_id
from dirmq.store.processes import ProcessIdentity, current

from .support.procs import dead_pid

HOUR_AGO = time.time() - 7200
pytestmark = pytest.mark.usefixtures("private_umask")  # see conftest.py


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Iterator[Store]:
    with Store(root) as s:
        yield s


def ready_file(queue_dir: Path, message_id: str) -> Path:
    return queue_dir / layout.READY / message_id


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under `root` with its content (files) or target (symlinks)."""
    tree: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                tree[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                tree[rel] = "dir"
            else:
                tree[rel] = path.read_bytes()
    return tree


def delay_bucket(queue_dir: Path, due_ms: float) -> Path:
    """The bucket of @delayed a delay due at `due_ms` goes in (made): @delayed/<minute>."""
    bucket = queue_dir / layout.DELAYED / str(int(due_ms) // 60_000)
    bucket.mkdir(exist_ok=True)
    return bucket


def kinds(report: FsckReport) -> list[Kind]:
    return sorted(p.kind for p in report.problems)


def test_healthy_root_is_clean(store: Store, root: Path) -> None:
    queue = store.create_queue("shop/orders", QueueConfig(capacity=10))
    store.create_queue("shop")
    for i in range(5):
        queue.put(f"m{i}".encode())
    queue.get_one(visibility_s=60)
    queue.put(b"later", delay_s=60)
    report = fsck(root, repair=False)
    assert report.ok
    assert report.problems == ()
    assert report.queues_checked == 2
    assert report.messages_checked == 6


def test_expired_leases_and_due_delays_are_counted_not_reported(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    queue.put(b"leased")
    assert queue.get_one(visibility_s=0) is not None
    queue.put(b"delayed", delay_s=0.001)
    time.sleep(0.01)
    report = fsck(root, repair=False)
    assert report.ok and report.problems == ()
    assert (report.expired_leases, report.due_delayed) == (1, 1)


def test_every_kind_of_damage_is_found_repaired_and_nothing_good_is_lost(
    store: Store, root: Path
) -> None:
    queue = store.create_queue("q", QueueConfig(capacity=100))
    q2 = store.create_queue("q2", QueueConfig(visibility_timeout_s=5))
    qdir = Path(queue.path)
    untouched = [queue.put(f"good {i}".encode()) for i in range(3)]
    truncated, flipped, timed_ready, bare_leased, bare_delayed, timed_dead, duplicated = (
        queue.put(f"message {i}".encode() * 10, {"X-N": str(i)}) for i in range(7)
    )
    q2_message = q2.put(b"survives a broken config")

    # Corrupt files: one cut short, one with a byte of its body flipped.
    path = ready_file(qdir, truncated)
    path.write_bytes(path.read_bytes()[:30])
    path = ready_file(qdir, flipped)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    # Names that do not fit their directory, and one that is no message name at all.
    (qdir / layout.READY / "garbage.txt").write_bytes(b"not a message")
    os.rename(ready_file(qdir, timed_ready), qdir / layout.READY / f"{timed_ready}.1.12345")
    os.rename(ready_file(qdir, bare_leased), qdir / layout.LEASED / f"{bare_leased}.2")
    os.rename(ready_file(qdir, bare_delayed), delay_bucket(qdir, time.time() * 1000) / bare_delayed)
    os.rename(ready_file(qdir, timed_dead), qdir / layout.DEAD / f"{timed_dead}.3.999")
    # One id in two states: a copy (another inode) in @leased under a live lease.
    future_ms = int(time.time() * 1000) + 600_000
    lease = qdir / layout.LEASED / layout.timed_name(duplicated, 1, future_ms)
    shutil.copyfile(ready_file(qdir, duplicated), lease)
    # An orphaned temp file of a writer that died, and one of a live writer (ours).
    writer = ProcessIdentity(layout.HOST_TAG, current().pid_ns, dead_pid(), 0)
    orphan = qdir / layout.TMP / f"{new_id()}.{writer.token()}.tmp"
    orphan.write_bytes(b"half written")
    live_tmp = qdir / layout.TMP / layout.tmp_name(new_id())
    live_tmp.write_bytes(b"being written")
    # A capacity slot held for a message that no longer exists, for long.
    leaked = qdir / layout.SLOTS / "100"  # beyond the capacity: never taken by a put
    os.symlink(new_id(), leaked)
    os.utime(leaked, (HOUR_AGO, HOUR_AGO), follow_symlinks=False)
    # A stray file (a notice), a missing state directory and a broken configuration.
    (qdir / "notes.txt").write_text("operator notes")
    q2dir = Path(q2.path)
    os.rmdir(q2dir / layout.DELAYED)
    (q2dir / layout.CONFIG_FILE).write_text('{"visibility_timeout_s": ')
    store.close()

    before = snapshot(root)
    progress: list[int] = []
    report = fsck(root, repair=False, progress=progress.append)
    assert snapshot(root) == before, "fsck without repair must not change anything"
    assert not report.ok
    assert sum(progress) > 0
    assert kinds(report) == sorted(
        [Kind.CORRUPT] * 2
        + [Kind.BAD_NAME] * 5
        + [Kind.DUPLICATE, Kind.ORPHAN_TMP, Kind.LEAKED_SLOT, Kind.STRAY]
        + [Kind.MISSING_DIR, Kind.BAD_CONFIG]
    )
    assert not any(p.repaired for p in report.problems)
    assert report.tmp_in_progress == 1
    by_kind = {p.kind: p for p in report.problems}
    assert by_kind[Kind.BAD_CONFIG].queue == "q2"
    assert by_kind[Kind.LEAKED_SLOT].path == str(leaked)
    assert by_kind[Kind.ORPHAN_TMP].path == str(orphan)

    repaired = fsck(root, repair=True)
    assert repaired.ok
    # Besides, the capacity slots of the two quarantined messages are released.
    assert kinds(repaired) == sorted([*kinds(report), Kind.LEAKED_SLOT, Kind.LEAKED_SLOT])
    assert all(p.repaired for p in repaired.problems if not p.notice)
    [stray] = [p for p in repaired.problems if p.notice]
    assert stray.kind is Kind.STRAY and not stray.repaired

    (qdir / "notes.txt").unlink()
    again = fsck(root, repair=False)
    assert again.ok and again.problems == (), again.problems

    # What was repaired, and how.
    assert sorted(p.name for p in (qdir / layout.CORRUPT).iterdir()) == sorted(
        ["garbage.txt", truncated, flipped]
    )
    assert not orphan.exists() and live_tmp.exists() and not leaked.is_symlink()
    assert (q2dir / layout.DELAYED).is_dir()
    assert json.loads((q2dir / layout.CONFIG_FILE).read_text()) == json.loads(QueueConfig().dumps())
    [aside] = [p for p in q2dir.iterdir() if p.name.startswith(f"{layout.CONFIG_FILE}.bad-")]
    assert aside.read_text() == '{"visibility_timeout_s": '
    names = {d: os.listdir(qdir / d) for d in (layout.READY, layout.LEASED, layout.DELAYED)}
    assert f"{timed_ready}.1" in names[layout.READY]
    [renamed] = [n for n in names[layout.LEASED] if n.startswith(bare_leased)]
    assert layout.parse_entry(renamed) == layout.Entry(bare_leased, 2, int(renamed.split(".")[2]))
    [bucket] = names[layout.DELAYED]  # its canonical name, in the bucket of its due minute
    [renamed] = os.listdir(qdir / layout.DELAYED / bucket)
    assert renamed.startswith(f"{bare_delayed}.0.")
    assert bucket == str(int(renamed.split(".")[2]) // 60_000)
    assert os.listdir(qdir / layout.DEAD) == [f"{timed_dead}.3"]
    copies = [n for d in layout.STATE_DIRS for n in os.listdir(qdir / d) if duplicated in n]
    assert copies == [lease.name], "the leased copy is the one kept"

    # No good message was lost, and the queues work.
    with Store(root) as after:
        queue = after.queue("q")
        for message_id in [*untouched, timed_ready, bare_leased, bare_delayed, duplicated]:
            message = queue.peek(message_id)
            assert message.body.startswith((b"good", b"message"))
        assert queue.peek(timed_dead).state == "dead"
        assert after.queue("q2").peek(q2_message).body == b"survives a broken config"
        new = queue.put(b"after repair")
        queue.sweep()  # delivers the due delayed message and the expired bare lease
        got = {m.id: m for m in queue.get(20)}
        assert set(got) == {*untouched, timed_ready, bare_leased, bare_delayed, new}
        for message in got.values():
            queue.ack(message.receipt or "")
        assert after.queue("q2").get_one() is not None


def test_hard_linked_duplicate_is_a_duplicate(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    message_id = queue.put(b"twice")
    qdir = Path(queue.path)
    os.link(ready_file(qdir, message_id), qdir / layout.DEAD / layout.dead_name(message_id, 1))
    store.close()
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.DUPLICATE] and report.ok
    assert os.listdir(qdir / layout.DEAD) == []
    assert os.listdir(qdir / layout.READY) == [message_id]


def test_duplicates_keep_the_most_advanced_copy(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    message_id = queue.put(b"many copies")
    qdir = Path(queue.path)
    source = ready_file(qdir, message_id)
    shutil.copyfile(source, delay_bucket(qdir, 1) / layout.timed_name(message_id, 0, 1))
    shutil.copyfile(source, qdir / layout.DEAD / layout.dead_name(message_id, 4))
    shutil.copyfile(source, qdir / layout.READY / layout.ready_name(message_id, 2))
    store.close()
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.DUPLICATE] and report.ok
    remaining = [p.name for d in layout.STATE_DIRS for p in (qdir / d).rglob("*") if p.is_file()]
    assert remaining == [layout.ready_name(message_id, 2)], "ready beats delayed and dead"


def test_corrupt_copy_never_wins_over_a_good_one(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    message_id = queue.put(b"good copy")
    qdir = Path(queue.path)
    lease = qdir / layout.LEASED / layout.timed_name(message_id, 1, 1)
    lease.write_bytes(codec.encode(b"good copy", {})[:-2])
    store.close()
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.CORRUPT] and report.ok
    assert os.listdir(qdir / layout.READY) == [message_id]


def test_root_marker_missing_or_broken_is_rewritten(store: Store, root: Path) -> None:
    store.create_queue("q")
    marker = root / layout.ROOT_MARKER
    marker.unlink()
    report = fsck(root, repair=False)
    assert kinds(report) == [Kind.ROOT_MARKER] and not report.ok
    assert fsck(root, repair=True).ok
    # The access the root directory's mode says (0700: private), as the lost marker did.
    assert json.loads(marker.read_text()) == {"format": 5, "access": "private"}
    marker.write_text("[1, 2")
    assert kinds(fsck(root, repair=True)) == [Kind.ROOT_MARKER]
    assert json.loads(marker.read_text()) == {"format": 5, "access": "private"}
    assert fsck(root, repair=False).problems == ()


def test_unknown_root_format_is_checked_but_never_repaired(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    os.rmdir(Path(queue.path) / layout.DELAYED)
    (root / layout.ROOT_MARKER).write_text('{"format": 99}')
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.MISSING_DIR, Kind.ROOT_MARKER] and not report.ok
    assert not any(p.repaired for p in report.problems)
    assert json.loads((root / layout.ROOT_MARKER).read_text()) == {"format": 99}
    assert not (Path(queue.path) / layout.DELAYED).exists()


def test_config_that_is_not_utf8_is_replaced(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    (Path(queue.path) / layout.CONFIG_FILE).write_bytes(b"\xff\xfe")
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.BAD_CONFIG] and report.ok


def test_duplicate_with_a_badly_named_copy_keeps_the_well_named_one(
    store: Store, root: Path
) -> None:
    queue = store.create_queue("q")
    message_id = queue.put(b"x")
    qdir = Path(queue.path)
    os.rename(ready_file(qdir, message_id), qdir / layout.READY / f"{message_id}.1")
    shutil.copyfile(
        qdir / layout.READY / f"{message_id}.1", qdir / layout.READY / f"{message_id}.1.5"
    )
    store.close()
    report = fsck(root, repair=True)
    assert sorted(p.kind for p in report.repaired) == [Kind.DUPLICATE]
    assert os.listdir(qdir / layout.READY) == [f"{message_id}.1"]
    assert fsck(root, repair=False).problems == ()


def test_messages_moving_during_the_scan_are_not_damage(
    store: Store, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A nack between two listings shows one file twice; a due delay can hide from both."""
    queue = store.create_queue("q", QueueConfig(capacity=10))
    nacked = queue.put(b"nacked")
    lease = queue.get_one(visibility_s=600)
    assert lease is not None
    hidden = queue.put(b"hidden", delay_s=600)
    qdir = Path(queue.path)
    for slot in (qdir / layout.SLOTS).iterdir():
        os.utime(slot, (HOUR_AGO, HOUR_AGO), follow_symlinks=False)
    [leased_name] = os.listdir(qdir / layout.LEASED)
    [delayed_name] = [
        f"{bucket}/{name}"
        for bucket in os.listdir(qdir / layout.DELAYED)
        for name in os.listdir(qdir / layout.DELAYED / bucket)
    ]
    store.close()
    real = fsck_messages.scandir
    moved: set[str] = set()

    def racing_scandir(path: str) -> Iterator[os.DirEntry[str]]:
        yield from real(path)
        state = os.path.basename(path)
        if state == layout.LEASED and state not in moved:  # nack, once leased is listed
            moved.add(state)
            os.rename(qdir / layout.LEASED / leased_name, qdir / layout.READY / f"{nacked}.1")
        if state == layout.READY and state not in moved:  # due, once ready is listed
            moved.add(state)
            os.rename(qdir / layout.DELAYED / delayed_name, ready_file(qdir, hidden))

    monkeypatch.setattr(fsck_messages, "scandir", racing_scandir)
    report = fsck(root, repair=True)
    assert moved == {layout.LEASED, layout.READY}
    assert report.problems == ()
    assert len(os.listdir(qdir / layout.SLOTS)) == 2


def test_a_directory_that_is_no_root_is_not_stamped(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    report = fsck(tmp_path, repair=True)
    assert not report.ok
    assert not (tmp_path / layout.ROOT_MARKER).exists()


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        fsck(tmp_path / "absent", repair=False)


def test_interrupted_create_delete_and_trash(store: Store, root: Path) -> None:
    store.create_queue("kept")
    for directory in layout.STATE_DIRS:  # a create that crashed before writing its config
        (root / "half" / directory).mkdir(parents=True)
    (root / "orphaned" / layout.READY).mkdir(parents=True)  # messages left without config
    (root / "orphaned" / layout.READY / new_id()).write_bytes(codec.encode(b"x", {}))
    (root / layout.ROOT_TRASH / "abc" / "nested").mkdir(parents=True)  # a delete that crashed
    (root / layout.ROOT_TRASH / "abc" / "nested" / "f").write_bytes(b"x")
    report = fsck(root, repair=True)
    assert kinds(report) == sorted([Kind.UNCONFIGURED, Kind.UNCONFIGURED, Kind.TRASH])
    assert not report.ok  # the directory holding messages is left for a human
    [left] = report.unrepaired
    assert left.queue == "orphaned" and "dirmq create orphaned" in left.detail
    assert os.listdir(root / "half") == []
    assert os.listdir(root / layout.ROOT_TRASH) == []
    store.create_queue("orphaned")  # adopts the files, as the report says
    assert fsck(root, repair=False).problems == ()


def test_old_config_temp_files_are_orphans(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    leftover = Path(queue.path) / f"{layout.CONFIG_FILE}.{'0' * 32}.tmp"
    leftover.write_bytes(b"{}")
    assert fsck(root, repair=False).problems == ()  # young: a write may be in progress
    os.utime(leftover, (HOUR_AGO, HOUR_AGO))
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.ORPHAN_TMP] and report.ok
    assert not leftover.exists()


def test_slots_of_quarantined_messages_are_released(store: Store, root: Path) -> None:
    queue = store.create_queue("q", QueueConfig(capacity=1))
    message_id = queue.put(b"soon damaged")
    path = ready_file(Path(queue.path), message_id)
    path.write_bytes(path.read_bytes()[:-1])
    store.close()
    report = fsck(root, repair=False)
    assert kinds(report) == [Kind.CORRUPT], "its slot is still held while the file is there"
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.CORRUPT, Kind.LEAKED_SLOT] and report.ok
    with Store(root) as after:
        after.queue("q").put(b"fits again", timeout_s=0)


def test_missing_dead_letter_queue_is_a_notice(store: Store, root: Path) -> None:
    # Named while it existed, deleted since (naming a missing one is refused).
    store.create_queue("nowhere")
    store.create_queue("q", QueueConfig(dead_letter_queue="nowhere", max_receives=2))
    store.delete_queue("nowhere")
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.MISSING_DLQ] and report.ok


# -- intact messages under names the store cannot use (issue 15): re-homed, never quarantined --

FAR_MS = 10**15  # what `visibility=1e12` made of a deadline before the store had bounds


def plant_misnamed(queue_dir: Path, queue: Queue) -> dict[str, tuple[str, bytes]]:
    """Messages renamed the ways the unbounded store (and careless hands) named them. Returns
    {planted name: (message id, body)} by state directory/name."""
    now_ms = int(time.time() * 1000)
    planted: dict[str, tuple[str, bytes]] = {}

    def plant(body: bytes, directory: str, name_of: Callable[[str], str], **kw: Any) -> str:
        message_id = queue.put(body, **kw)
        name = name_of(message_id)
        os.rename(ready_file(queue_dir, message_id), queue_dir / directory / name)
        planted[f"{directory}/{name}"] = (message_id, body)
        return message_id

    plant(b"leased for 1e12 s", layout.LEASED, lambda i: f"{i}.1.{now_ms + FAR_MS}")
    bucket = f"{layout.DELAYED}/{delay_bucket(queue_dir, now_ms).name}"  # this minute's
    plant(b"delayed 1e12 s", bucket, lambda i: f"{i}.0.{now_ms + FAR_MS}")
    plant(b"leased 1e300 s", layout.LEASED, lambda i: f"{i}.2.{'9' * 40}")
    plant(b"15 digits, centuries", layout.LEASED, lambda i: f"{i}.1.{10**15 - 1}")
    plant(b"junk after the id", layout.READY, lambda i: f"{i}.junk")
    plant(b"dead with junk", layout.DEAD, lambda i: f"{i}.3xyz")
    plant(b"renamed by hand", layout.READY, lambda i: "renamed-by-hand.msg")
    plant(b"delay kept", bucket, lambda i: f"{i}.0.{now_ms + 600_000}.bak")
    group = layout.group_tag("g1")
    queue_put_grouped = OutgoingMessage(b"grouped", group="g1")
    [message_id] = queue.put_many([queue_put_grouped])
    name = f"{message_id}~{group}.orig"
    os.rename(queue_dir / layout.READY / f"{message_id}~{group}", queue_dir / layout.READY / name)
    planted[f"{layout.READY}/{name}"] = (message_id, b"grouped")
    # Written before files carried Dirmq-Id: the id in the name is all there is.
    legacy_id = new_id()
    legacy = f"{legacy_id}.1.{now_ms + FAR_MS}"
    (queue_dir / layout.LEASED / legacy).write_bytes(codec.encode(b"legacy", {}))
    planted[f"{layout.LEASED}/{legacy}"] = (legacy_id, b"legacy")
    return planted


def test_intact_messages_under_unusable_names_are_rehomed_not_quarantined(
    store: Store, root: Path
) -> None:
    queue = store.create_queue("q", QueueConfig(capacity=50))
    qdir = Path(queue.path)
    planted = plant_misnamed(qdir, queue)
    # A damaged file under a bad name is still quarantined: the file decides, not the name.
    damaged_id = queue.put(b"damaged" * 10)
    data = bytearray(ready_file(qdir, damaged_id).read_bytes())
    data[-1] ^= 0x01
    ready_file(qdir, damaged_id).unlink()
    (qdir / layout.READY / f"{damaged_id}.x").write_bytes(bytes(data))
    store.close()

    before = snapshot(root)
    report = fsck(root, repair=False)
    assert snapshot(root) == before
    assert kinds(report) == sorted([Kind.MISNAMED] * len(planted) + [Kind.BAD_NAME])
    assert not report.ok
    misnamed = {os.path.relpath(p.path, qdir) for p in report.problems if p.kind is Kind.MISNAMED}
    assert misnamed == set(planted)

    repaired = fsck(root, repair=True)
    assert repaired.ok, repaired.problems
    assert kinds(repaired) == kinds(report)  # no leaked slot: every message kept its own
    assert all("re-homed to @" in p.detail for p in repaired.problems if p.kind is Kind.MISNAMED)
    assert os.listdir(qdir / layout.CORRUPT) == [f"{damaged_id}.x"]
    again = fsck(root, repair=False)
    assert again.ok and again.problems == (), again.problems
    assert again.messages_checked == len(planted)

    with Store(root) as after:
        queue = after.queue("q")
        for message_id, body in planted.values():
            assert queue.peek(message_id).body == body
        by_body = {body: message_id for message_id, body in planted.values()}
        assert queue.peek(by_body[b"dead with junk"]).state == "dead"
        assert queue.peek(by_body[b"delay kept"]).state == "delayed"
        assert queue.peek(by_body[b"grouped"]).headers == {}
        got = {m.body: m for m in queue.get(50, visibility_s=60, max_per_group=None)}
        deliverable = {b for b in by_body if b not in (b"dead with junk", b"delay kept")}
        assert set(got) == deliverable
        assert got[b"leased 1e300 s"].receive_count == 3  # the count survived its name
        for message in got.values():
            queue.ack(message.receipt or "")
        assert queue.stats().delayed == 1


def test_cli_fsck_reports_and_rehomes_a_misnamed_message(store: Store, root: Path) -> None:
    queue = store.create_queue("q")
    message_id = queue.put(b"one")
    lease = f"{message_id}.1.{int(time.time() * 1000) + FAR_MS}"
    os.rename(ready_file(Path(queue.path), message_id), Path(queue.path) / layout.LEASED / lease)
    store.close()
    command = [sys.executable, "-m", "dirmq", "fsck", "--root", str(root)]
    checked = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 8
    assert f"PROBLEM   misnamed        q/@leased/{lease}: " in checked.stdout
    fixed = subprocess.run(
        [*command, "--repair"], capture_output=True, text=True, timeout=60, check=False
    )
    assert fixed.returncode == 0, fixed.stdout
    assert f"re-homed to @ready/{message_id}.1" in fixed.stdout
    with Store(root) as after:
        message = after.queue("q").get_one()
        assert message is not None and message.body == b"one"


def test_a_config_stored_before_bounds_keeps_its_other_settings(store: Store, root: Path) -> None:
    """A @queue.json written by the unbounded store: only the settings out of bounds are reset,
    so the dead-letter settings and the SQS attributes (metadata) survive the repair."""
    store.create_queue("dlq")
    config = QueueConfig(max_receives=3, dead_letter_queue="dlq", metadata={"sqs": {"a": 1}})
    queue = store.create_queue("q", config)
    path = Path(queue.path) / layout.CONFIG_FILE
    stored = json.loads(path.read_text())
    stored.update(visibility_timeout_s=1e13, retention_s=1e300, dedup_window_s=2.26e307)
    path.write_text(json.dumps(stored))
    store.close()
    report = fsck(root, repair=True)
    assert kinds(report) == [Kind.BAD_CONFIG] and report.ok
    assert "reset dedup_window_s, retention_s, visibility_timeout_s to default" in (
        report.problems[0].detail
    )
    with Store(root) as after:
        assert after.queue("q").config == config


def test_a_message_an_older_fsck_quarantined_for_its_name_comes_back(
    store: Store, root: Path
) -> None:
    """The procedure operations.md gives: move it back from @corrupt, run fsck --repair."""
    queue = store.create_queue("q")
    message_id = queue.put(b"was quarantined")
    name = f"{message_id}.1.{int(time.time() * 1000) + FAR_MS}"
    qdir = Path(queue.path)
    os.rename(ready_file(qdir, message_id), qdir / layout.CORRUPT / name)
    store.close()
    os.rename(qdir / layout.CORRUPT / name, qdir / layout.LEASED / name)
    assert fsck(root, repair=True).ok
    with Store(root) as after:
        message = after.queue("q").get_one()
        assert message is not None and message.id == message_id
        assert message.body == b"was quarantined"
