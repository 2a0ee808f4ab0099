"""The VSQS 0.3 drop-in (`dirmq.compat.vsqs`) across real processes, and `import_vsqs`.

Peers are real OS processes (`python -c`) driving the compat API over a line-based JSON pipe; the
test process is the third participant. Waits are on replies, never sleep-polls: a fixed wait only
appears where the point is that nothing happens (a publish still blocked).
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq.compat import vsqs_import
from dirmq.compat.vsqs import QueueException, QueueFullException, QueueManager
from dirmq.compat.vsqs_import import ImportReport, import_vsqs, vsqs_message_id
from dirmq.errors import ConfigError, InvalidArgument, InvalidName, MessageTooLarge, QueueFull
from dirmq.store.ids import id_time_us, is_id

SRC = str(Path(dirmq.__file__).resolve().parent.parent)

# Bodies travel as latin-1 text so any byte survives JSON.
_PEER = r"""
import json, sys, time
from dirmq.compat.vsqs import QueueManager

manager = QueueManager(sys.argv[1])
queues = {}

def queue(name):
    if name not in queues:
        queues[name] = manager.get_queue(name)
    return queues[name]

def run(op, name, *args):
    if op == "open":
        queues[name] = manager.get_queue(name, args[0])
        return queues[name].capacity
    if op == "publish":
        return queue(name).publish(args[0].encode("latin-1"), *args[1:])
    if op == "receive":
        m_id, data = queue(name).receive(*args)
        return [m_id, None if data is None else data.decode("latin-1")]
    return getattr(queue(name), op)(*args)

print(json.dumps({"value": "ready", "elapsed_s": 0}), flush=True)
while line := sys.stdin.readline():
    request = json.loads(line)
    started = time.monotonic()
    try:
        reply = {"value": run(*request)}
    except Exception as exc:
        reply = {"error": type(exc).__name__, "cause": type(exc.__cause__).__name__}
    reply["elapsed_s"] = time.monotonic() - started
    print(json.dumps(reply), flush=True)
manager.close()
"""


@dataclass(frozen=True, slots=True)
class Reply:
    value: Any
    error: str | None
    cause: str | None
    elapsed_s: float  # measured inside the peer, around the call


class Peer:
    """A separate process using `dirmq.compat.vsqs` on `root`; one request at a time."""

    def __init__(self, root: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PEER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        assert self.reply().value == "ready"

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._replies.put(json.loads(line))

    def send(self, op: str, name: str, *args: object) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps([op, name, *args]) + "\n")
        self._proc.stdin.flush()

    def reply(self, timeout_s: float = 10.0) -> Reply:
        try:
            raw = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"peer gave no reply within {timeout_s} s") from None
        return Reply(raw.get("value"), raw.get("error"), raw.get("cause"), raw["elapsed_s"])

    def assert_silent(self, wait_s: float) -> None:
        """Nothing comes back for `wait_s`: the pending request is still blocked."""
        try:
            raw = self._replies.get(timeout=wait_s)
        except queue.Empty:
            return
        raise AssertionError(f"expected the peer to stay blocked, it replied {raw}")

    def call(self, op: str, name: str, *args: object) -> Any:
        self.send(op, name, *args)
        reply = self.reply()
        assert reply.error is None, f"{op} failed in the peer: {reply.error} from {reply.cause}"
        return reply.value

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=10)  # it ends at EOF; closing its pipe under it would race
        assert self._proc.stdout is not None
        self._proc.stdout.close()


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vsqs") / "root"


@pytest.fixture(scope="module")
def peers(shared_root: Path) -> Iterator[tuple[Peer, Peer]]:
    """Two long-lived peer processes (spawning them per test would dominate the run time)."""
    QueueManager(shared_root).close()  # create the root once, before two processes race to
    a, b = Peer(shared_root), Peer(shared_root)
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def manager(shared_root: Path) -> Iterator[QueueManager]:
    with QueueManager(shared_root) as m:
        yield m


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    """A queue name of this test's own, so tests sharing the peers never meet."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)


# -- across processes ----------------------------------------------------------------------------
def test_publish_receive_and_delete_in_three_processes(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, b = peers
    q = manager.get_queue(qname)
    ids = [a.call("publish", qname, f"m{n}") for n in range(3)]
    assert all(is_id(i) for i in ids) and ids == sorted(ids)
    assert q.size() == 3

    assert b.call("receive", qname, 30, 5) == [ids[0], "m0"]
    assert b.call("delete", qname, ids[0]) is True
    assert b.call("receive", qname, 0.3, 5) == [ids[1], "m1"]
    # This process never received ids[1]: vsqs 0.3 silently did nothing here.
    assert q.delete(ids[1]) is True
    assert q.delete(ids[1]) is False
    assert a.call("size", qname) == 1

    assert q.receive(visibility_timeout=30, timeout=5) == (ids[2], b"m2")
    assert q.delete(ids[2]) is True
    # Had the delete not happened, ids[1]'s 0.3 s lease would have brought it back by now.
    b.send("receive", qname, 30, 0.8)
    reply = b.reply()
    assert reply.value == [None, None]
    assert reply.elapsed_s >= 0.7
    assert a.call("size", qname) == 0


def test_an_expired_lease_keeps_its_fifo_place(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, b = peers
    q = manager.get_queue(qname)
    ids = [a.call("publish", qname, f"m{n}") for n in range(3)]
    leased_at = time.monotonic()
    assert b.call("receive", qname, 0.3, 5) == [ids[0], "m0"]  # never deleted
    # No event marks a lease running out while younger messages are ready, so wait past its
    # deadline once. vsqs 0.3 would now requeue m0 and hand out m1 in the same pass.
    time.sleep(max(0.0, leased_at + 0.4 - time.monotonic()))
    assert q.receive(visibility_timeout=30, timeout=0) == (ids[0], b"m0")
    assert a.call("receive", qname, 30, 0) == [ids[1], "m1"]
    assert q.receive(visibility_timeout=30, timeout=0) == (ids[2], b"m2")
    assert q.size() == 3  # all in flight, none deleted


def test_a_fractional_visibility_timeout_redelivers_again_and_again(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, b = peers
    q = manager.get_queue(qname)
    m_id = q.publish(b"hot potato")
    for holder in (a, b, a):
        assert holder.call("receive", qname, 0.3, 5) == [m_id, "hot potato"]
    assert q.receive(visibility_timeout=0.3, timeout=5) == (m_id, b"hot potato")
    assert q.size() == 1


def test_an_expired_lease_wakes_a_blocked_receive_in_another_process(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, b = peers
    q = manager.get_queue(qname)
    m_id = q.publish(b"payload")
    assert a.call("receive", qname, 0.5, 5) == [m_id, "payload"]
    b.send("receive", qname, 30, 10)  # blocks: the only message is leased by a
    reply = b.reply()
    assert reply.value == [m_id, "payload"]
    # Woken by the lease's expiry (~0.5 s), not by its own 10 s timeout.
    assert 0.2 <= reply.elapsed_s < 2.0


def test_a_receive_without_timeout_wakes_on_a_publish_elsewhere(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, _b = peers
    q = manager.get_queue(qname)
    a.send("receive", qname, 30, None)
    a.assert_silent(0.2)
    m_id = q.publish(b"wake up")
    published_at = time.monotonic()
    assert a.reply().value == [m_id, "wake up"]
    assert time.monotonic() - published_at < 1.0


def test_capacity_blocks_times_out_and_a_delete_elsewhere_makes_room(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, b = peers
    q = manager.get_queue(qname, capacity=2)
    assert q.capacity == 2
    # Capacity belongs to the queue: a handle opened without one is bound by it too.
    assert a.call("open", qname, None) == 2
    first = a.call("publish", qname, "m0")
    a.call("publish", qname, "m1")

    a.send("publish", qname, "m2", 0.3)
    full = a.reply()
    assert (full.error, full.cause) == ("QueueFullException", "QueueFull")
    assert 0.25 <= full.elapsed_s < 1.5

    a.send("publish", qname, "m3", None)  # no timeout: waits for room
    a.assert_silent(0.3)
    assert b.call("receive", qname, 30, 5) == [first, "m0"]
    assert b.call("delete", qname, first) is True
    released_at = time.monotonic()
    reply = a.reply()
    assert reply.error is None and is_id(reply.value)
    assert time.monotonic() - released_at < 1.0
    assert q.size() == 2


def test_size_counts_ready_in_flight_and_delayed(
    peers: tuple[Peer, Peer], manager: QueueManager, qname: str
) -> None:
    a, _b = peers
    q = manager.get_queue(qname)
    taken = q.publish(b"taken")
    q.publish(b"ready")
    q.queue.put(b"later", delay_s=60)  # a dirmq-only feature, counted as vsqs counts everything
    assert a.call("receive", qname, 30, 0) == [taken, "taken"]
    assert a.call("size", qname) == 3
    assert q.size() == 3
    assert q.delete(taken) is True
    assert a.call("size", qname) == 2


# -- in one process --------------------------------------------------------------------------------
def test_receive_times_out_with_none_none(manager: QueueManager, qname: str) -> None:
    q = manager.get_queue(qname)
    assert q.receive(timeout=0) == (None, None)
    started = time.monotonic()
    assert q.receive(timeout=0.2) == (None, None)
    assert 0.18 <= time.monotonic() - started < 1.5
    assert q.receive(timeout=-1) == (None, None)  # vsqs: a past deadline, not an error


def test_publish_timeout_zero_at_capacity_raises_at_once(manager: QueueManager, qname: str) -> None:
    q = manager.get_queue(qname, capacity=1)
    q.publish(b"one")
    started = time.monotonic()
    with pytest.raises(QueueFullException) as info:
        q.publish(b"two", timeout=0)
    assert time.monotonic() - started < 0.5
    assert isinstance(info.value, QueueException)
    assert isinstance(info.value.__cause__, QueueFull)


def test_get_queue_stores_capacity_and_applies_it_at_once(
    manager: QueueManager, qname: str
) -> None:
    assert manager.get_queue(qname, capacity=3).capacity == 3
    assert manager.get_queue(qname).capacity == 3  # None leaves the stored setting alone
    assert manager.store.queue(qname).config.capacity == 3
    q = manager.get_queue(qname, capacity=1)
    assert manager.store.queue(qname).config.capacity == 1
    q.publish(b"only")
    # Immediately after the change, in the same process: the new capacity already binds.
    with pytest.raises(QueueFullException):
        q.publish(b"too many", timeout=0)
    q.capacity = None  # vsqs code could assign the attribute; here it changes the setting
    assert manager.store.queue(qname).config.capacity is None
    q.publish(b"room again", timeout=0)


def test_bad_arguments(manager: QueueManager, qname: str) -> None:
    with pytest.raises(QueueException) as info:
        manager.get_queue("@reserved")
    assert isinstance(info.value.__cause__, InvalidName)
    with pytest.raises(QueueException) as info:
        manager.get_queue(qname, capacity=0)
    assert isinstance(info.value.__cause__, ConfigError)
    q = manager.get_queue(qname)
    with pytest.raises(TypeError):
        q.publish("text")  # type: ignore[arg-type]
    with pytest.raises(QueueException) as info:
        q.receive(visibility_timeout=-1, timeout=0)
    assert isinstance(info.value.__cause__, InvalidArgument)
    assert q.delete("1415776871123") is False  # a vsqs id: no such message here
    assert q.delete(dirmq.store.ids.new_id()) is False


def test_ids_sort_in_publish_order_and_bodies_are_bytes(manager: QueueManager, qname: str) -> None:
    q = manager.get_queue(qname)
    bodies: list[bytes | bytearray] = [bytes([n]) * n for n in range(1, 6)]
    bodies += [b"", bytearray(b"ba")]
    ids = [q.publish(body) for body in bodies]
    assert ids == sorted(ids)
    got = [q.receive(timeout=0) for _ in bodies]
    assert got == [(i, bytes(b)) for i, b in zip(ids, bodies, strict=True)]


# -- import ----------------------------------------------------------------------------------------
T0 = 1_700_000_000_000_000


def _fake_vsqs_dir(path: Path) -> list[tuple[int, bytes]]:
    """A vsqs 0.3 queue directory as a crash left it, created out of order; returns the
    messages an import must yield, oldest first."""
    path.mkdir(parents=True)
    files = {  # created in this (non-chronological) order
        f"{T0 + 30}": b"third",
        f"{T0 + 10}": b"first",
        f"{T0 + 50}": b"fifth\x00\xff binary",
        f"{T0 + 20}.{T0 + 99_000_000}": b"second, in flight",
        f"{T0 + 40}.{T0 + 300_000}.0": b"fourth, stranded by a float visibility timeout",
        f"{T0 + 60}.new": b"sixth, never finished",
        "README": b"not a message",
        ".hidden": b"not a message either",
    }
    for name, data in files.items():
        (path / name).write_bytes(data)
    (path / "subdir").mkdir()
    return [
        (T0 + 10, b"first"),
        (T0 + 20, b"second, in flight"),
        (T0 + 30, b"third"),
        (T0 + 40, b"fourth, stranded by a float visibility timeout"),
        (T0 + 50, b"fifth\x00\xff binary"),
    ]


def _drain(q: dirmq.Queue) -> list[dirmq.Message]:
    got = q.get(1000, visibility_s=60)
    for message in got:
        assert message.receipt is not None
        q.ack(message.receipt)
    return got


@pytest.fixture
def import_store(tmp_path: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(tmp_path / "dirmq") as s:
        yield s


def test_import_keeps_order_bodies_and_counts(tmp_path: Path, import_store: dirmq.Store) -> None:
    source = tmp_path / "vsqs" / "jobs"
    expected = _fake_vsqs_dir(source)
    before = sorted(os.listdir(source))
    report = import_vsqs(str(source), import_store, "jobs")
    assert report == ImportReport(
        imported=5,
        imported_in_flight=2,
        skipped_incomplete=1,
        ignored=3,
        journal_path=report.journal_path,
    )
    assert report.journal_path is not None and Path(report.journal_path).parent == source
    assert sorted(os.listdir(source)) == sorted([*before, Path(report.journal_path).name])
    got = _drain(import_store.queue("jobs"))
    assert [(id_time_us(m.id), m.body) for m in got] == expected
    assert [m.id for m in got] == [vsqs_message_id(us, body) for us, body in expected]
    assert all(m.headers == {} for m in got)


def test_import_twice_duplicates_nothing(tmp_path: Path, import_store: dirmq.Store) -> None:
    source = tmp_path / "q"
    _fake_vsqs_dir(source)
    import_vsqs(str(source), import_store, "q")
    again = import_vsqs(str(source), import_store, "q")
    assert (again.imported, again.skipped_existing, again.skipped_incomplete) == (0, 5, 1)
    assert import_store.queue("q").stats().total == 5


def test_rerun_does_not_bring_back_consumed_messages(
    tmp_path: Path, import_store: dirmq.Store
) -> None:
    source = tmp_path / "q"
    _fake_vsqs_dir(source)
    import_vsqs(str(source), import_store, "q")
    q = import_store.queue("q")
    for message in q.get(2, visibility_s=60):
        assert message.receipt is not None
        q.ack(message.receipt)
    again = import_vsqs(str(source), import_store, "q")
    assert (again.imported, again.skipped_existing) == (0, 5)
    assert q.stats().total == 3


def test_a_torn_journal_line_is_not_trusted(tmp_path: Path, import_store: dirmq.Store) -> None:
    source = tmp_path / "q"
    expected = _fake_vsqs_dir(source)
    journal = import_vsqs(str(source), import_store, "q").journal_path
    assert journal is not None
    _drain(import_store.queue("q"))  # everything consumed: only the journal remembers it
    lines = Path(journal).read_bytes().split(b"\n")
    # A crash mid-append: two whole lines, then the third one cut short before its newline.
    Path(journal).write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2])
    again = import_vsqs(str(source), import_store, "q")
    assert (again.imported, again.skipped_existing) == (3, 2)
    got = _drain(import_store.queue("q"))
    assert [(id_time_us(m.id), m.body) for m in got] == expected[2:]


def test_ids_in_the_queue_are_recognised_without_the_journal(
    tmp_path: Path, import_store: dirmq.Store
) -> None:
    """A crash after a batch was committed but before it was journaled: the rerun must see the
    messages by their ids (and, with remove, still clear the source)."""
    source = tmp_path / "q"
    _fake_vsqs_dir(source)
    first = import_vsqs(str(source), import_store, "q")
    assert first.journal_path is not None
    os.unlink(first.journal_path)
    resumed = import_vsqs(str(source), import_store, "q", remove=True)
    assert (resumed.imported, resumed.skipped_existing, resumed.removed) == (0, 5, 5)
    assert import_store.queue("q").stats().total == 5


def test_import_with_remove_clears_only_imported_files(
    tmp_path: Path, import_store: dirmq.Store
) -> None:
    source = tmp_path / "q"
    expected = _fake_vsqs_dir(source)
    report = import_vsqs(str(source), import_store, "q", remove=True)
    assert (report.imported, report.removed, report.journal_path) == (5, 5, None)
    assert sorted(os.listdir(source)) == sorted([f"{T0 + 60}.new", "README", ".hidden", "subdir"])
    again = import_vsqs(str(source), import_store, "q", remove=True)
    assert again == ImportReport(skipped_incomplete=1, ignored=3)
    got = _drain(import_store.queue("q"))
    assert [(id_time_us(m.id), m.body) for m in got] == expected


def test_import_works_in_batches_and_reports_progress(
    tmp_path: Path, import_store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vsqs_import, "BATCH_SIZE", 16)
    source = tmp_path / "q"
    source.mkdir()
    count = 50
    for n in reversed(range(count)):
        (source / str(T0 + n)).write_bytes(b"%d" % n)
    (source / f"{T0 + count}.new").write_bytes(b"")
    steps: list[int] = []
    report = import_vsqs(str(source), import_store, "q", remove=True, progress=steps.append)
    assert (report.imported, report.removed, report.skipped_incomplete) == (count, count, 1)
    assert sum(steps) == count + 1 and len(steps) == 5  # the .new file, then 16+16+16+2
    got = _drain(import_store.queue("q"))
    assert [m.body for m in got] == [b"%d" % n for n in range(count)]


def test_import_reads_millisecond_names_as_milliseconds(
    tmp_path: Path, import_store: dirmq.Store
) -> None:
    source = tmp_path / "q"
    source.mkdir()
    (source / "1415776871123").write_bytes(b"from the README")
    import_vsqs(str(source), import_store, "q")
    (message,) = _drain(import_store.queue("q"))
    assert id_time_us(message.id) == 1415776871123 * 1000


def test_import_in_place_then_use_through_the_compat_api(tmp_path: Path) -> None:
    """A vsqs root becomes a dirmq root; each queue directory is imported into itself."""
    root = tmp_path / "queues"
    expected = _fake_vsqs_dir(root / "jobs")
    with QueueManager(root) as manager:
        q = manager.get_queue("jobs")
        report = import_vsqs(str(root / "jobs"), manager.store, "jobs", remove=True)
        assert (report.imported, report.ignored) == (5, 3)  # README, .hidden, subdir; not @...
        assert [q.receive(timeout=0)[1] for _ in expected] == [body for _, body in expected]
        assert q.receive(timeout=0) == (None, None)


def test_import_refuses_a_message_larger_than_the_queue_allows(
    tmp_path: Path, import_store: dirmq.Store
) -> None:
    source = tmp_path / "q"
    _fake_vsqs_dir(source)
    import_store.create_queue("q", dirmq.QueueConfig(max_message_bytes=10))
    with pytest.raises(MessageTooLarge):
        import_vsqs(str(source), import_store, "q", remove=True)
    q = import_store.queue("q")
    assert q.stats().total == 0  # the batch is all or nothing
    assert os.listdir(os.path.join(q.path, "@tmp")) == []
    assert len(os.listdir(source)) == 9  # nothing removed


def test_import_from_a_missing_directory(tmp_path: Path, import_store: dirmq.Store) -> None:
    with pytest.raises(InvalidArgument):
        import_vsqs(str(tmp_path / "absent"), import_store, "q")


_REAL_VSQS = r"""
import json, sys
from vsqs.queue import QueueManager

manager = QueueManager(sys.argv[1])
q = manager.get_queue("jobs")
published = [[q.publish(b"job %d" % n), "job %d" % n] for n in range(6)]
q.receive(visibility_timeout=3600, timeout=5)  # in flight
q.receive(visibility_timeout=0.5, timeout=5)  # in flight under a float expiry: stranded
manager.close()
print(json.dumps(published))
"""


@pytest.mark.skipif(importlib.util.find_spec("vsqs") is None, reason="vsqs 0.3 not installed")
def test_import_a_queue_written_by_real_vsqs(tmp_path: Path, import_store: dirmq.Store) -> None:
    # vsqs runs in its own interpreter: its watchdog threads and deprecated calls stay there.
    done = subprocess.run(
        [sys.executable, "-c", _REAL_VSQS, str(tmp_path / "vsqs")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    published: list[list[str]] = json.loads(done.stdout)
    source = tmp_path / "vsqs" / "jobs"
    names = os.listdir(source)
    assert sum("." in n for n in names) == 2  # two leases, one of them with a float expiry
    (source / f"{int(published[-1][0]) + 1}.new").write_bytes(b"torn")
    report = import_vsqs(str(source), import_store, "jobs", remove=True)
    assert (report.imported, report.imported_in_flight, report.skipped_incomplete) == (6, 2, 1)
    got = _drain(import_store.queue("jobs"))
    assert [(str(id_time_us(m.id)), m.body.decode()) for m in got] == [
        (m_id, body) for m_id, body in published
    ]
