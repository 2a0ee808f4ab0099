"""The state table of `store/states.py` is true and binding.

Read from the source: each row names one function of the store, which exists and is no other
row's; every function of the queue's modules that renames or retires a message file is some
row's (so a new transition without a row fails, and so does a row without its function).
Watched at run time: every row is exercised on real queues while the renames, links and unlinks
the store makes are recorded; each move of a message file is attributed to the innermost row
function on the stack, and must go from one of that row's sources to one of its targets, and
each row's every (source, target) pair is seen.
"""

from __future__ import annotations

import ast
import errno
import importlib
import inspect
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

import dirmq
from dirmq.store import backlog, codec, files, fsio, layout, view
from dirmq.store.direct_lease import DirectLease
from dirmq.store.ids import new_ids
from dirmq.store.states import TRANSITIONS, State, Transition

STORE = Path(files.__file__).parent

# Modules of the store whose renames and unlinks move no message between states.
NOT_MESSAGE_MOVES = {
    "capacity": "capacity tokens (@slots symlinks)",
    "dedup": "dedup records (@dedup symlinks)",
    "recovery": "orphaned temp files in @tmp",
    "root": "queue directories and @queue.json",
    "fsck": "repair: it moves what breaks the table's rules",
    "fsck_backlog": "repair of the backlog: a message moved into its own bucket",
    "fsck_delays": "repair of @delayed: a delay moved into its own bucket",
    "fsck_findings": "repairs several checks make: a file removed, or set aside for a human",
    "fsck_root": "repair of the root's files: @trash emptied",
    "fsck_queue": "repair of a queue's frame: a bad @queue.json set aside (fsck_findings)",
    "fsck_messages": "repair of message files: renamed, re-homed or quarantined",
    "fsck_copies": "repair of copies: a duplicate's other copies, a leaked capacity slot",
    "journal": "the commit journal's files, and a publish done for `Publisher._commit`",
    "journal_replay": "a machine crash's lost publishes written again (the publish row)",
    "journal_judge": "the commit journal's files: a dead process's kept unflushed",
    "fsio": "the mechanics of a publish, done for `Publisher._commit` (seen at run time)",
    "pool": "`FilePool.retire`/`retire_many` is what RETIRED is; its other moves: @tmp, @free",
    "ownpool": "retired files inside @free: the own pools' reaper, their hand-off at exit",
    "poolreclaim": "retired files inside @free: the pools of dead processes",
    "recycled": "retired files inside @free: an unlink for the pool modules",
    "smallfiles": "configs and the upper layers' records, beside the messages",
    "holds": "hold records (who runs a consumer name or a move task)",
    "claimtokens": "the shared-filesystem mode's claim tokens in @tmp (empty files)",
    "holders": "lease holder records in @holders (one per process and label)",
    "flow": "delivery slots of a rate limit in @rate (empty files)",
    "fsck_rate": "repair of @rate: stale delivery slots removed",
}
# Functions that rename for a transition function, and are none themselves.
PRIMITIVES = {
    "settling.SettlingFiles.move",
    "settling.SettlingFiles._rename",
    "settling.SettlingFiles._move_delayed",  # into a delay bucket, made again if it went
    "deadletters.write_replacing",  # a dead copy's temp and rename, for its row's function
    "deadletters._unlink_quietly",  # that temp, when the write failed
}
_OS_CALLS = {"rename", "replace", "link", "unlink"}
_METHOD_CALLS = {"_rename", "move", "retire", "retire_many", "publish", "commit"}
_FUNCTION_CALLS = {"write_replacing"}  # a primitive called by name in its own module


def _resolve(by: str) -> Callable[..., Any]:
    module, _, qualname = by.partition(".")
    target: Any = importlib.import_module(f"dirmq.store.{module}")
    for part in qualname.split("."):
        target = getattr(target, part)
    assert inspect.isfunction(target), by
    return target  # type: ignore[no-any-return]


def _moves_files(node: ast.AST) -> bool:
    """Whether `node`'s own body (not nested functions) calls a rename/retire primitive."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
            func = child.func
            is_os = isinstance(func.value, ast.Name) and func.value.id == "os"
            if (is_os and func.attr in _OS_CALLS) or func.attr in _METHOD_CALLS | _FUNCTION_CALLS:
                return True
        called = child.func if isinstance(child, ast.Call) else None
        if isinstance(called, ast.Name) and called.id in _FUNCTION_CALLS:
            return True
        if _moves_files(child):
            return True
    return False


def _functions_that_move_files() -> set[str]:
    found = set()
    for path in sorted(STORE.glob("*.py")):
        if path.stem in NOT_MESSAGE_MOVES:
            continue
        tree = ast.parse(path.read_text())

        def visit(node: ast.AST, prefix: str, module: str = path.stem) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    if _moves_files(child):
                        found.add(f"{module}.{prefix}{child.name}")
                    visit(child, f"{prefix}{child.name}.")

        visit(tree, "")
    return found


def test_each_row_is_one_function_and_each_function_one_row() -> None:
    events = [t.event for t in TRANSITIONS]
    performers = [t.by for t in TRANSITIONS]
    assert len(set(events)) == len(events)
    assert len(set(performers)) == len(performers), "a function performs one row"
    for row in TRANSITIONS:
        _resolve(row.by)
        assert row.sources and row.targets, row.event
    assert _functions_that_move_files() == set(performers) | PRIMITIVES


def test_every_state_is_reached_and_left() -> None:
    reached = {s for t in TRANSITIONS for s in t.targets}
    left = {s for t in TRANSITIONS for s in t.sources}
    terminal = {State.RETIRED, State.CORRUPT, State.DEAD_LETTER_QUEUE}
    assert reached | {State.WRITING} == set(State)
    assert left | terminal == set(State)


def test_the_finder_sees_a_rename_in_a_nested_block() -> None:
    tree = ast.parse("def f(self):\n    if x:\n        os.rename(a, b)\ndef g():\n    pass\n")
    moving = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and _moves_files(f)]
    assert moving == ["f"]


# -- at run time ----------------------------------------------------------------------------
# A move touching one of these is a message changing state (not a temp, a pool file, a token).
_MESSAGE_STATES = set(State) - {State.WRITING, State.RETIRED}


class MoveSpy:
    """Records every message-file move as (row event, source state, target state)."""

    def __init__(self, root: Path, dead_letter_queue: str) -> None:
        self.root = os.path.realpath(root)
        self.dlq_ready = os.path.join(self.root, dead_letter_queue, layout.READY)
        self.codes: dict[CodeType, Transition] = {_resolve(t.by).__code__: t for t in TRANSITIONS}
        self.seen: dict[str, set[tuple[State, State]]] = defaultdict(set)
        self.wrong: list[str] = []

    def state(self, path: str | None, *, target: bool) -> State | None:
        """The state a path stands for; None outside the root (the spy ignores those)."""
        if path is None:
            return State.WRITING  # an unnamed O_TMPFILE inode
        path = os.path.realpath(path)
        if not path.startswith(self.root + "/"):
            return None
        if os.path.dirname(path) == self.dlq_ready:
            return State.DEAD_LETTER_QUEUE
        parts = path[len(self.root) + 1 :].split("/")
        if layout.BACKLOG in parts:
            return State.BACKLOG
        if layout.DELAYED in parts:  # @delayed itself (format 4), or a bucket of it
            return State.DELAYED
        if layout.FREE in parts:
            return State.RETIRED if target else State.WRITING
        directory = parts[-2] if len(parts) >= 2 else ""
        for state in State:
            if state.value == directory:
                return state
        return None

    def record(self, source: State | None, target: State | None, call: str) -> None:
        if source is None or target is None or not {source, target} & _MESSAGE_STATES:
            return
        frame = sys._getframe(2)
        while frame is not None and frame.f_code not in self.codes:
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            self.wrong.append(f"{call} {source.name} -> {target.name} by no row's function")
            return
        row = self.codes[frame.f_code]
        if source not in row.sources or target not in row.targets:
            self.wrong.append(f"{row.event}: {source.name} -> {target.name} is not in its row")
        self.seen[row.event].add((source, target))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_rename, real_link, real_unlink = os.rename, os.link, os.unlink
        real_link_fd = fsio._link_fd

        def at(path: Any, dir_fd: int | None) -> str:
            text = os.fsdecode(path)
            if dir_fd is not None and not text.startswith("/"):
                return f"{os.readlink(f'/proc/self/fd/{dir_fd}')}/{text}"
            return text

        def rename(src: Any, dst: Any, *, src_dir_fd: Any = None, dst_dir_fd: Any = None) -> None:
            real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            source = self.state(at(src, src_dir_fd), target=False)
            self.record(source, self.state(at(dst, dst_dir_fd), target=True), "rename")

        def link(src: Any, dst: Any, **kwargs: Any) -> None:
            real_link(src, dst, **kwargs)
            source = self.state(os.fsdecode(src), target=False)
            self.record(source, self.state(os.fsdecode(dst), target=True), "link")

        def unlink(path: Any, *, dir_fd: Any = None) -> None:
            source = self.state(at(path, dir_fd), target=False)
            real_unlink(path, dir_fd=dir_fd)
            self.record(source, State.RETIRED, "unlink")

        def link_fd(fd: int, path: str) -> None:
            real_link_fd(fd, path)
            self.record(State.WRITING, self.state(path, target=True), "link_fd")

        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "link", link)
        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(fsio, "_link_fd", link_fd)


@pytest.fixture
def spied(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dirmq.Store, MoveSpy]]:
    with dirmq.Store(root) as store:
        spy = MoveSpy(root, "dlq")
        spy.install(monkeypatch)
        yield store, spy


def _leased(queue: dirmq.Queue, **options: Any) -> str:
    message = queue.get_one(**options)
    assert message is not None and message.receipt is not None
    return message.receipt


def test_every_row_happens_as_the_table_says(
    spied: tuple[dirmq.Store, MoveSpy], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, spy = spied
    store.create_queue("dlq")
    to_dlq = store.create_queue("q", dirmq.QueueConfig(dead_letter_queue="dlq"))
    q = store.create_queue("local", dirmq.QueueConfig(max_receives=3))

    q.put(b"soon", delay_s=0.001)  # publish into @delayed
    time.sleep(0.01)
    q.ack(_leased(q))  # due, lease, ack
    q.put(b"x")  # publish into @ready
    receipt = _leased(q)
    q.extend(receipt, 60)  # extend
    q.nack(receipt)  # nack -> @ready
    q.nack(_leased(q), delay_s=60)  # nack -> @delayed
    assert q.delete(_only_id(q, layout.DELAYED))  # remove from @delayed
    q.put(b"expires")
    _leased(q, visibility_s=0)
    q.dead_letter(_leased(q))  # expire (by that get's promote), lease, dead_letter -> @dead
    assert q.delete(_only_id(q, layout.DEAD))  # remove from @dead
    q.put(b"limit")
    for _ in range(3):
        _leased(q, visibility_s=0)
    assert q.get_one() is None  # its third lease expires at the limit: dead_letter -> @dead
    q.put(b"ready")
    assert q.delete(_only_id(q, layout.READY))  # remove from @ready
    q.put(b"leased")
    _leased(q)
    assert q.delete(_only_id(q, layout.LEASED))  # remove from @leased
    to_dlq.put(b"to the dlq")
    to_dlq.dead_letter(_leased(to_dlq))  # dead_letter, dead_copy -> the dlq, dead_claim_gone
    assert to_dlq.redrive() == 0  # nothing dead in its own @dead
    assert store.queue("dlq").redrive() == 1  # redrive: the dead-letter queue -> q's @ready
    to_dlq.ack(_leased(to_dlq))
    q.put(b"dies here")
    q.dead_letter(_leased(q), "no")  # dead_letter, dead_copy over itself in @dead
    assert q.redrive() == 2  # redrive: @dead -> @ready (this one, and "limit" above)
    q.ack(_leased(q))
    q.ack(_leased(q))
    q.put_dead_letter(
        b"from elsewhere", reason="max-receives", source="@channel/c", receive_count=5
    )
    q.ack(_leased(q))  # dead_arrival

    direct = dirmq.OutgoingMessage(b"straight into a lease")
    q.validate(direct)
    assert q.direct.admits(direct, None)  # nothing ready: the direct path may take it
    [leased] = q.direct.put_leased([DirectLease(direct, 30, None)])  # publish_leased
    q.ack(leased.receipt or "")

    q.put(b"named")
    [(lease, _message)] = q.claim_named(q.ready_names())
    assert q.ack_leases([lease]) == []  # ack_lease

    q.put(b"unreadable")
    real_read = files.read_message

    def read_fails(path: str, message_id: str, body_file_over: int | None = None) -> Any:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(files, "read_message", read_fails)
    with pytest.raises(dirmq.StorageError):
        q.get_one()  # lease, then hand_back
    monkeypatch.setattr(files, "read_message", real_read)
    q.ack(_leased(q))

    # A deep queue (the thresholds made small): publish into the backlog, lease from it
    # straight (@ready empty), remove from it, and a long flat @ready cut down on open
    # (spill_excess); a queue whose gets spread over the head (`peers`) refills @ready.
    monkeypatch.setattr(backlog, "SPILL_AT", 2)
    monkeypatch.setattr(files, "SPILL_AT", 2)
    monkeypatch.setattr(view, "MIGRATE_ABOVE", 3)
    deep = store.create_queue("deep")
    deep.put_many([b"1", b"2", b"3", b"4"])  # publish into @ready, then into the backlog
    in_backlog = [name for _, name in backlog.names(deep.path)]
    assert len(in_backlog) == 2
    assert deep.delete(in_backlog[-1][: layout.ID_LENGTH])  # remove from the backlog
    for _ in range(3):
        deep.ack(_leased(deep))  # the third get finds @ready empty: lease_backlog
    spread = store.create_queue("spread", dirmq.QueueConfig(peers=1))
    spread.put_many([b"1", b"2", b"3"])
    for _ in range(3):
        spread.ack(_leased(spread))  # the third get refills @ready from the backlog
    for message_id in new_ids(5):
        (Path(deep.path) / layout.READY / message_id).write_bytes(
            codec.encode(b"flat", {}, message_id=message_id)
        )
    with dirmq.Store(store.root) as reopened:
        # spill_excess moves 3 on open, and the get leases them from the backlog
        assert len(reopened.queue("deep").get(max_count=5)) == 5

    # A flat delay of format 4 goes into its bucket when a process opens the queue.
    [flat_id] = new_ids(1)
    flat = layout.timed_name(flat_id, 0, int(time.time() * 1000) + 3_600_000)
    (Path(q.path) / layout.DELAYED / flat).write_bytes(codec.encode(b"f", {}, message_id=flat_id))
    with dirmq.Store(store.root) as reopened:
        assert reopened.queue("local").stats().delayed == 1  # migrate_delay
        assert reopened.queue("local").delete(flat_id)

    corrupt_id = new_ids(1)[0]
    (Path(q.path) / layout.READY / corrupt_id).write_bytes(b"not a message")
    assert q.get_one() is None  # lease, then quarantine

    assert spy.wrong == []
    expected = {t.event: {(s, d) for s in t.sources for d in t.targets} for t in TRANSITIONS}
    assert dict(spy.seen) == expected


def _only_id(queue: dirmq.Queue, directory: str) -> str:
    names = [p.name for p in (Path(queue.path) / directory).rglob("*") if p.is_file()]
    [name] = names  # a delay is in the bucket of its due minute
    return name[: layout.ID_LENGTH]
