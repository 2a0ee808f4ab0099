"""Model-based test of the store: a Hypothesis state machine drives one queue through put,
put_many, get, ack, nack, extend, delayed puts, purge, crash-and-reopen (a Store dropped without
closing, and a child process SIGKILLed while it holds leases) and time, with ordinary, extreme and
hostile values, and checks the queue against a plain in-memory model after every step.

The store reads the time for lease deadlines and due times through `clock.now_ms` and
`clock.now_ns` (imported by name by the other store modules); the test replaces them everywhere
with a clock that only its `advance` rule moves (tests/support/store_now.py), so expiry is exact
and the run does not depend on the machine being idle.
Message ids still come from the real clock: they only need to increase.

`make test` runs a bounded number of examples; `make fuzz` (DIRMQ_FUZZ_SECONDS) runs batches of
examples until the time is up.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import dirmq
from dirmq.client import RemoteStore
from dirmq.errors import InvalidArgument, MessageNotFound, MessageTooLarge, StaleReceipt
from dirmq.store import layout
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.message import OutgoingMessage

from .support.servers import ServerProcess, start_server
from .support.store_now import store_now

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parent.parent

# The store's upper bound on every duration: durations above it, and infinite ones, must be
# refused with InvalidArgument and change nothing.

SMALL_MAX_BYTES = 70_000  # a queue limit just above one first read (reading._FIRST_READ)
_TOKEN_CHARS = frozenset(
    "!#$%&'*+.^_`|~-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
_HEADER_LIMIT = 2 * 1024 * 1024  # codec.MAX_HEADER_BYTES: beyond it a put is refused


class Clock:
    """The store's wall clock in ms, moved only by the test."""

    def __init__(self) -> None:
        self.ms = time.time_ns() // 1_000_000

    def now_ms(self) -> int:
        return self.ms


CLOCK = Clock()


@contextmanager
def controlled_clock() -> Iterator[Clock]:
    with store_now(CLOCK.now_ms):
        yield CLOCK


# -- the model ---------------------------------------------------------------------------------
@dataclass
class ModelMessage:
    id: str
    body: bytes
    headers: dict[str, str]
    group: str | None
    state: str = "ready"  # ready, leased, delayed, dead
    count: int = 0  # deliveries so far
    at_ms: int | None = None  # lease deadline or due time


@dataclass
class Model:
    messages: dict[str, ModelMessage] = field(default_factory=dict)
    dedup: dict[str, str] = field(default_factory=dict)  # dedup id -> message id
    last_id: str = ""
    # A reopened store promotes due delays and expired leases when it first builds its index,
    # i.e. at the first operation other than a put.
    promote_on_open: bool = False
    max_receives: int | None = None

    def promote(self, now_ms: int) -> None:
        for m in self.messages.values():
            if m.state in ("leased", "delayed") and m.at_ms is not None and m.at_ms <= now_ms:
                dead = m.state == "leased" and self.spent(m)
                m.state, m.at_ms = "dead" if dead else "ready", None

    def spent(self, m: ModelMessage) -> bool:
        """Delivered max_receives times: an expired lease or a nack dead-letters it."""
        return self.max_receives is not None and m.count >= self.max_receives

    def opened(self, now_ms: int) -> None:
        if self.promote_on_open:
            self.promote(now_ms)
            self.promote_on_open = False

    def expected_get(
        self, max_count: int, visibility_ms: int, max_per_group: int | None, now_ms: int
    ) -> list[ModelMessage]:
        """What a get leases: the oldest ready message whose group is free (or held by this get
        within its limit per group), again and again."""
        self.promote(now_ms)
        busy = {m.group for m in self.messages.values() if m.state == "leased" and m.group}
        taken: dict[str, int] = {}
        got: list[ModelMessage] = []
        while len(got) < max_count:
            for m in sorted(self.ready(), key=lambda m: m.id):
                g = m.group
                if g is None:
                    break
                if g in taken:
                    if max_per_group is None or taken[g] < max_per_group:
                        break
                elif g not in busy:
                    break
            else:
                return got
            if g is not None:
                taken[g] = taken.get(g, 0) + 1
                busy.add(g)
            m.state, m.count, m.at_ms = "leased", m.count + 1, now_ms + visibility_ms
            got.append(m)
        return got

    def ready(self) -> list[ModelMessage]:
        return [m for m in self.messages.values() if m.state == "ready"]

    def leased_by_receipt(self, receipt: str) -> ModelMessage | None:
        message_id, _, count = receipt.rpartition(".")
        m = self.messages.get(message_id)
        if m is None or m.state != "leased" or str(m.count) != count:
            return None
        return m

    def stats(self, now_ms: int) -> tuple[int, int, int, int]:
        """(ready, in flight, delayed, dead) as `Queue.stats` counts them: an expired lease or
        a due delay counts as ready before anyone promotes it (even one that will be
        dead-lettered then)."""
        ready = in_flight = delayed = dead = 0
        for m in self.messages.values():
            due = m.at_ms is not None and m.at_ms <= now_ms
            if m.state == "dead":
                dead += 1
            elif m.state == "ready" or due:
                ready += 1
            elif m.state == "leased":
                in_flight += 1
            else:
                delayed += 1
        return ready, in_flight, delayed, dead


# -- values, ordinary and hostile ----------------------------------------------------------------
def valid_seconds(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0 <= value <= MAX_DURATION_S


def due_in_ms(seconds: float) -> int:
    """A lease's deadline or a delay's due time, from a whole-ms clock: rounded up, as the
    store does (`clock.due_ms`: never early)."""
    return -(-round(seconds * 1e9) // 1_000_000)


_durations = [0, 0.0, 0.0004, 0.0005, 0.001, 0.25, 1, 2.5, 30, 3600, 364 * 86400, MAX_DURATION_S]
_hostile_durations: list[object] = [-1, -0.001, -1e300, float("nan"), float("-inf"), "5", True]
_hostile_durations += [MAX_DURATION_S + 1, 1e12, 1e13, 1e300, 2.26e307, float("inf")]
durations = st.sampled_from(_durations) | st.floats(0, 120, allow_nan=False)
any_durations = durations | st.sampled_from(_hostile_durations)

_sizes = [0, 1, 65_535, 65_536, 65_537, SMALL_MAX_BYTES - 1, SMALL_MAX_BYTES, SMALL_MAX_BYTES + 1]
bodies = st.binary(max_size=64) | st.sampled_from(_sizes).map(
    lambda n: bytes(i % 251 for i in range(n))
)

header_names = st.sampled_from(
    [
        *["X-A", "x-a", "Content-Type", "Colour", "a", "~!#$%&'*+.^_`|", "Dirmq-Id", "dirmq-x"],
        *["Content-Length", "body-crc32", "", "a b", "X:Y", "é", "X\n", "X\x00"],
    ]
)
header_values = (
    st.sampled_from(["", " lead", "trail ", "a: b", "ü€😀", "\u2028", "\x85", "\t"])
    | st.sampled_from(["a\nb", "a\rb", "\x00", "\x1f", "a\x0cb", "\x7f"])
    | st.sampled_from(["a\x00b", "\ud800", "x\udfff"])
    | st.text(max_size=20)
    | st.just(_HEADER_LIMIT + 1).map(lambda n: "x" * n)
)
headers_st = st.dictionaries(header_names, header_values, max_size=3)
groups = st.sampled_from(
    [None, None, "g1", "g2", "ü-g", "x" * 300, "", "a\nb", "\x00", "\ud800", "a\x19b", "\t"]
)
dedup_ids = st.sampled_from([None, None, None, "d1", "d2", "", "a\rb", "\udfff"])


# What an HTTP field value cannot carry back (all control characters but tab); a label not
# even tab.
_LABEL_CONTROLS = frozenset(map(chr, [*range(32), 127]))
_VALUE_CONTROLS = _LABEL_CONTROLS - {"\t"}


def valid_headers(headers: dict[str, str]) -> bool:
    seen: set[str] = set()
    size = 0
    for name, value in headers.items():
        lowered = name.lower()
        if not name or not set(name) <= _TOKEN_CHARS or lowered in seen:
            return False
        if lowered in ("content-length", "body-crc32") or lowered.startswith("dirmq-"):
            return False
        if any(c in _VALUE_CONTROLS for c in value) or not _encodable(value):
            return False
        seen.add(lowered)
        size += len(name) + len(value.encode()) + 3
    return size < _HEADER_LIMIT - 200  # the system headers need a little room


def valid_tag(value: object) -> bool:
    """A group or dedup id: None, or a non-empty string without control characters."""
    if value is None:
        return True
    return (
        isinstance(value, str)
        and bool(value)
        and not any(c in _LABEL_CONTROLS for c in value)
        and _encodable(value)
    )


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Draft:
    """One message to publish, and what the store must say about it."""

    body: bytes
    headers: dict[str, str]
    delay_s: object
    group: object
    dedup_id: object

    def refusal(self, max_bytes: int) -> tuple[type[Exception], ...]:
        """The errors the store may raise for this message; () if it must be accepted."""
        errors: list[type[Exception]] = []
        if len(self.body) > max_bytes:
            errors.append(MessageTooLarge)
        if (
            not (self.delay_s is None or valid_seconds(self.delay_s))
            or not valid_headers(self.headers)
            or not valid_tag(self.group)
            or not valid_tag(self.dedup_id)
        ):
            errors.append(InvalidArgument)
        return tuple(errors)


drafts = st.builds(
    Draft,
    body=bodies,
    headers=headers_st,
    delay_s=st.none() | st.none() | any_durations,
    group=groups,
    dedup_id=dedup_ids,
)


# -- the machine ---------------------------------------------------------------------------------
class StoreMachine(RuleBasedStateMachine):
    """One queue of a local Store against `Model`."""

    examples = 0  # machines run, for the fuzz run's report
    steps = 0
    remote = False  # RemoteMachine: the same rules over HTTP, against a real server

    receipts = Bundle("receipts")

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.clock = CLOCK
        self.clock.ms = time.time_ns() // 1_000_000  # each example starts at the real time
        self.root = tempfile.mkdtemp(prefix="dirmq-model-")
        self.store = dirmq.Store(self.root)
        self.dropped: list[dirmq.Store] = []  # stores "crashed" (never closed until teardown)
        self.model = Model()
        self.config = dirmq.QueueConfig()
        self.queue: Any = None
        self.queue_name = "model/q"
        self.children = 0
        self.restarts = 0

    # -- what differs between transports ----------------------------------------------------------
    def now(self) -> int:
        """The store's clock, as the model reads it."""
        return self.clock.ms

    def lease_s(self, seconds: Any) -> Any:
        """A lease duration as this transport can predict it (hostile values unchanged)."""
        return seconds

    def delay_s(self, seconds: Any) -> Any:
        """A delay as this transport can predict it (hostile values unchanged)."""
        return seconds

    def adapt(self, draft: Draft) -> Draft:
        return draft

    def crash_and_reopen(self) -> None:
        """The process 'dies': its Store is dropped unclosed and a new one opens the root."""
        self.dropped.append(self.store)
        self.store = dirmq.Store(self.root, create=False)
        self.queue = self.store.queue(self.queue_name)

    def file_key(self, name: str) -> object:
        """How a state file name is compared with the model's: whole, but for a lease's holder
        token, which the model does not know (tests/test_lease_holders.py checks holders)."""
        entry = layout.parse_entry(name)
        if entry is not None and entry.holder is not None:
            return name.replace(f"+{entry.holder}", "", 1)
        return name

    @initialize(
        visibility_s=st.sampled_from([30, 0, 0.001, 1, 3600]),
        delay_s=st.sampled_from([0, 0, 0, 2.5]),
        max_bytes=st.sampled_from([16 * 1024 * 1024, SMALL_MAX_BYTES]),
        durability=st.sampled_from(list(dirmq.Durability)),
        max_receives=st.sampled_from([None, None, 1, 2]),
    )
    def create(
        self,
        visibility_s: float,
        delay_s: float,
        max_bytes: int,
        durability: dirmq.Durability,
        max_receives: int | None,
    ) -> None:
        self.model.max_receives = max_receives
        visibility_s, delay_s = self.lease_s(visibility_s), self.delay_s(delay_s)
        self.config = dirmq.QueueConfig(
            visibility_timeout_s=visibility_s,
            delay_s=delay_s,
            max_message_bytes=max_bytes,
            durability=durability,
            max_receives=max_receives,
        )
        self.queue = self.store.create_queue(self.queue_name, self.config)

    def teardown(self) -> None:
        for store in [*self.dropped, self.store]:
            store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- publishing ----------------------------------------------------------------------------
    def _publish(self, batch: list[Draft], ids: list[str] | Exception) -> None:
        """Check a put's outcome against the model and record what it stored."""
        refusals = [d.refusal(self.config.max_message_bytes) for d in batch]
        if any(refusals):
            allowed = tuple(e for r in refusals for e in r)
            assert isinstance(ids, allowed), f"expected one of {allowed}, got {ids!r}"
            return
        if isinstance(ids, Exception):
            raise ids
        assert len(ids) == len(batch)
        now = self.now()
        owners: dict[str, str] = {}
        for draft, message_id in zip(batch, ids, strict=True):
            key = draft.dedup_id
            if isinstance(key, str) and key in self.model.dedup:
                assert message_id == self.model.dedup[key], "a repeated dedup id stores again"
                continue
            if isinstance(key, str) and key in owners:
                assert message_id == owners[key]
                continue
            assert message_id > self.model.last_id, "ids must increase (FIFO is id order)"
            self.model.last_id = message_id
            delay_s = self.config.delay_s if draft.delay_s is None else draft.delay_s
            assert isinstance(delay_s, int | float)
            m = ModelMessage(message_id, draft.body, dict(draft.headers), draft.group)  # type: ignore[arg-type]
            if delay_s > 0:
                m.state, m.at_ms = "delayed", now + due_in_ms(delay_s)
            self.model.messages[message_id] = m
            if isinstance(key, str):
                owners[key] = message_id
        for key, message_id in owners.items():
            self.model.dedup[key] = message_id

    @rule(draft=drafts)
    def put(self, draft: Draft) -> None:
        draft = self.adapt(draft)
        outcome: list[str] | Exception
        try:
            outcome = [
                self.queue.put(
                    draft.body,
                    draft.headers,
                    delay_s=draft.delay_s,
                    dedup_id=draft.dedup_id,
                )
            ]
        except (InvalidArgument, MessageTooLarge) as exc:
            outcome = exc
        if draft.group is not None:  # put() takes no group: publish it as put_many does
            draft = Draft(draft.body, draft.headers, draft.delay_s, None, draft.dedup_id)
        self._publish([draft], outcome)

    @rule(batch=st.lists(drafts, min_size=1, max_size=6))
    def put_many(self, batch: list[Draft]) -> None:
        batch = [self.adapt(d) for d in batch]
        outgoing = [
            OutgoingMessage(d.body, d.headers, d.delay_s, d.dedup_id, d.group)  # type: ignore[arg-type]
            for d in batch
        ]
        outcome: list[str] | Exception
        try:
            outcome = self.queue.put_many(outgoing)
        except (InvalidArgument, MessageTooLarge) as exc:
            outcome = exc
        self._publish(batch, outcome)

    # -- receiving -------------------------------------------------------------------------------
    @rule(
        target=receipts,
        max_count=st.integers(1, 5) | st.sampled_from([0, -1, True, 2.0]),
        visibility_s=st.none() | any_durations,
        max_per_group=st.sampled_from([1, 1, 2, None, 0]),
    )
    def get(self, max_count: Any, visibility_s: Any, max_per_group: Any) -> Any:
        visibility_s = self.lease_s(visibility_s)
        if self.remote:  # the HTTP API's get takes one message per group
            max_per_group = 1
        valid = (
            isinstance(max_count, int)
            and not isinstance(max_count, bool)
            and max_count >= 1
            and (visibility_s is None or valid_seconds(visibility_s))
            and max_per_group != 0
        )
        if not valid:
            with pytest.raises(InvalidArgument):
                self._get(max_count, visibility_s, max_per_group)
            return multiple()
        got = self._get(max_count, visibility_s, max_per_group)
        now = self.now()
        self.model.opened(now)
        visibility = self.config.visibility_timeout_s if visibility_s is None else visibility_s
        expected = self.model.expected_get(max_count, due_in_ms(visibility), max_per_group, now)
        assert [m.id for m in got] == [m.id for m in expected], "wrong messages or order"
        for message, m in zip(got, expected, strict=True):
            assert message.body == m.body
            assert message.headers == m.headers
            assert message.group == m.group
            assert message.receive_count == m.count
            assert message.receipt == f"{m.id}.{m.count}"
            assert m.at_ms is not None and message.lease_deadline_s is not None
            if self.remote:  # the server's clock: the model only knows it roughly
                assert abs(message.lease_deadline_s - m.at_ms / 1000) < 60
            else:
                assert message.lease_deadline_s == m.at_ms / 1000
        return multiple(*(message.receipt for message in got))

    def _get(self, max_count: Any, visibility_s: Any, max_per_group: Any) -> Any:
        if self.remote:
            return self.queue.get(max_count, visibility_s=visibility_s)
        return self.queue.get(max_count, visibility_s=visibility_s, max_per_group=max_per_group)

    def _settle_outcome(self, receipt: str, call: Any) -> ModelMessage | None:
        """Run a settle call; the model message it applied to (None: the store said stale)."""
        self.model.opened(self.now())
        m = self.model.leased_by_receipt(receipt)
        if m is None:
            with pytest.raises(StaleReceipt):
                call()
            return None
        call()
        return m

    @rule(receipt=receipts)
    def ack(self, receipt: str) -> None:
        m = self._settle_outcome(receipt, lambda: self.queue.ack(receipt))
        if m is not None:
            del self.model.messages[m.id]

    @rule(receipt=receipts, delay_s=any_durations)
    def nack(self, receipt: str, delay_s: Any) -> None:
        delay_s = self.delay_s(delay_s)
        if not valid_seconds(delay_s):
            with pytest.raises(InvalidArgument):
                self.queue.nack(receipt, delay_s)
            return
        m = self._settle_outcome(receipt, lambda: self.queue.nack(receipt, delay_s))
        if m is None:
            return
        if self.model.spent(m):
            m.state, m.at_ms = "dead", None
        elif delay_s > 0 and m.group is not None:  # stays in flight, holding its group
            m.at_ms = self.now() + due_in_ms(delay_s)
        elif delay_s > 0:
            m.state, m.at_ms = "delayed", self.now() + due_in_ms(delay_s)
        else:
            m.state, m.at_ms = "ready", None

    @rule(receipt=receipts, detail=st.none() | st.sampled_from(["bad sku", "ünï", "x" * 1024]))
    def dead_letter(self, receipt: str, detail: str | None) -> None:
        m = self._settle_outcome(receipt, lambda: self.queue.dead_letter(receipt, detail))
        if m is not None:
            m.state, m.at_ms = "dead", None
            dead = self.queue.peek(m.id).dead
            assert dead is not None and (dead.reason, dead.detail) == ("rejected", detail)
            assert dead.receive_count == m.count

    @precondition(lambda self: not self.remote)  # a redrive task over HTTP: test_redrive.py
    @rule()
    def redrive(self) -> None:
        """Every dead message back to its FIFO place, received 0 times, its provenance kept."""
        self.model.opened(self.now())
        dead = [m for m in self.model.messages.values() if m.state == "dead"]
        assert self.queue.redrive() == len(dead)
        for m in dead:
            m.state, m.count, m.at_ms = "ready", 0, None

    @rule()
    def purge_dead(self) -> None:
        removed = self.queue.purge(dead=True)
        self.model.opened(self.now())
        dead = [i for i, m in self.model.messages.items() if m.state == "dead"]
        assert removed == len(dead)
        for message_id in dead:
            del self.model.messages[message_id]

    @rule(receipt=receipts, visibility_s=any_durations)
    def extend(self, receipt: str, visibility_s: Any) -> None:
        visibility_s = self.lease_s(visibility_s)
        if not valid_seconds(visibility_s):
            with pytest.raises(InvalidArgument):
                self.queue.extend(receipt, visibility_s)
            return
        m = self._settle_outcome(receipt, lambda: self.queue.extend(receipt, visibility_s))
        if m is not None:
            m.at_ms = self.now() + due_in_ms(visibility_s)

    @rule(
        receipt=st.sampled_from(
            ["", "nonsense", "x" * 10_000, "0000000000000000-000000000000", "\ud800", "1.2.3"]
        )
    )
    def settle_garbage(self, receipt: str) -> None:
        # Over HTTP a DELETE of a message id deletes by id (MQ semantics): not found here.
        refused = (InvalidArgument, MessageNotFound) if self.remote else InvalidArgument
        with pytest.raises(refused):
            self.queue.ack(receipt)
        with pytest.raises(InvalidArgument):
            self.queue.extend(receipt, 1)

    @rule()
    def settle_unknown(self) -> None:
        with pytest.raises(StaleReceipt):
            self.queue.ack("0000000000000001-000000000000.1")
        self.model.opened(self.now())

    # -- whole queue, time, crashes -----------------------------------------------------------
    @rule()
    def purge(self) -> None:
        removed = self.queue.purge()
        self.model.opened(self.now())
        live = [i for i, m in self.model.messages.items() if m.state != "dead"]
        assert removed == len(live)  # @dead is kept
        for message_id in live:
            del self.model.messages[message_id]

    @precondition(lambda self: not self.remote)  # a server keeps its own time
    @rule(data=st.data())
    def advance(self, data: st.DataObject) -> None:
        """Move the clock: a little, a lot, or to exactly a deadline (or 1 ms either side)."""
        times = sorted({m.at_ms for m in self.model.messages.values() if m.at_ms is not None})
        choices = st.integers(0, 3000) | st.sampled_from([86_400_000, 400 * 86_400_000])
        if times:
            target = data.draw(st.sampled_from(times)) + data.draw(st.sampled_from([-1, 0, 1]))
            choices = choices | st.just(max(0, target - self.clock.ms))
        self.clock.ms += data.draw(choices)

    @precondition(lambda self: not self.remote or self.restarts < 1)  # a restart takes ~0.5 s
    @rule()
    def reopen_after_crash(self) -> None:
        self.restarts += 1
        self.crash_and_reopen()
        self.model.promote_on_open = True

    @precondition(lambda self: self.children < 2)
    @rule(max_count=st.integers(1, 3), visibility_s=durations)
    def child_leases_then_dies(self, max_count: int, visibility_s: float) -> None:
        """Another process takes leases at this clock's time and is SIGKILLed holding them."""
        self.children += 1
        visibility_s = self.lease_s(visibility_s)
        clock = 0 if self.remote else self.now()  # 0: the child keeps the real clock
        script = (
            "import json, os, signal, sys, dirmq\n"
            "from dirmq.store import clock\n"
            "real = {'now_ms': clock.now_ms, 'now_ns': clock.now_ns}\n"
            "at_ms = int(sys.argv[4])\n"
            "fake = {'now_ms': lambda: at_ms, 'now_ns': lambda: at_ms * 10**6}\n"
            "if at_ms:\n"
            "    for module in list(sys.modules.values()):\n"
            "        for read, fn in real.items():\n"
            "            if getattr(module, read, None) is fn:\n"
            "                setattr(module, read, fake[read])\n"
            "q = dirmq.Store(sys.argv[1], create=False).queue(sys.argv[2])\n"
            "got = q.get(int(sys.argv[3]), visibility_s=float(sys.argv[5]))\n"
            "print(json.dumps([m.id for m in got]), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"
        )
        args = [self.root, self.queue_name, str(max_count), str(clock), repr(visibility_s)]
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr
        got = json.loads(done.stdout)
        # The child builds its own index: it promotes everything due, like any get.
        expected = self.model.expected_get(
            max_count, due_in_ms(float(repr(visibility_s))), 1, self.now()
        )
        assert got == [m.id for m in expected]

    # -- after every step ------------------------------------------------------------------------
    @invariant()
    def matches_the_model(self) -> None:
        if self.queue is None:
            return
        type(self).steps += 1
        now = self.now()
        stats = self.queue.stats()
        self.model.opened(now)
        assert (stats.ready, stats.in_flight, stats.delayed, stats.dead) == self.model.stats(now)
        self._check_files()

    def _check_files(self) -> None:
        """Every message is exactly one file, named for its state; nothing else is left."""
        path = os.path.join(self.root, self.queue_name)
        expected: dict[str, set[object]] = {layout.READY: set(), layout.LEASED: set()}
        expected[layout.DELAYED], expected[layout.DEAD] = set(), set()
        for m in self.model.messages.values():
            tag = None if m.group is None else layout.group_tag(m.group)
            if m.state == "dead":
                expected[layout.DEAD].add(self.file_key(layout.dead_name(m.id, m.count, tag)))
            elif m.state == "ready":
                expected[layout.READY].add(self.file_key(layout.ready_name(m.id, m.count, tag)))
            else:
                assert m.at_ms is not None
                directory = layout.LEASED if m.state == "leased" else layout.DELAYED
                name = layout.timed_name(m.id, m.count, m.at_ms, tag)
                expected[directory].add(self.file_key(name))
        for directory, names in expected.items():
            top = Path(path, directory)
            listed = {self.file_key(p.name) for p in top.rglob("*") if p.is_file()}
            assert listed == names, directory
        for bucket in Path(path, layout.DELAYED).iterdir():  # each delay in its due minute's
            for name in os.listdir(bucket):
                assert bucket.name == str(layout.parse_entry(name).at_ms // 60_000), name
        for directory in (layout.CORRUPT, layout.TMP):
            assert os.listdir(os.path.join(path, directory)) == [], directory


class RemoteMachine(StoreMachine):
    """The same rules over HTTP (RemoteStore) against a real `dirmq serve`; a crash is a
    SIGKILL of the server and a restart on the same root. The server keeps its own time, so
    no lease runs out during an example (leases and delays below an hour get an hour more;
    delays of 0 stay 0) and file names are compared without their deadlines. HTTP carries
    Content-Type, Content-Encoding and X-Attr-* only: messages go without headers here (the
    local machine covers odd ones)."""

    remote = True
    server: ServerProcess | None = None  # one per test, shared by its examples

    def __init__(self) -> None:
        RuleBasedStateMachine.__init__(self)
        type(self).examples += 1
        assert self.server is not None
        self.clock = CLOCK
        self.root = str(self.server.root)
        self.store: Any = RemoteStore(self.server.url)
        self.dropped = []
        self.model = Model()
        self.config = dirmq.QueueConfig()
        self.queue = None
        self.queue_name = f"m{self.examples}/q"
        self.children = self.restarts = 0

    def teardown(self) -> None:
        self.store.close()

    def now(self) -> int:
        return time.time_ns() // 1_000_000

    def lease_s(self, seconds: Any) -> Any:
        return seconds + 3600 if valid_seconds(seconds) and seconds < 3600 else seconds

    def delay_s(self, seconds: Any) -> Any:
        return self.lease_s(seconds) if seconds != 0 else seconds

    def adapt(self, draft: Draft) -> Draft:
        delay = None if draft.delay_s is None else self.delay_s(draft.delay_s)
        return Draft(draft.body, {}, delay, draft.group, draft.dedup_id)

    def crash_and_reopen(self) -> None:
        server = type(self).server
        assert server is not None
        server.stop(signal.SIGKILL)
        type(self).server = server = start_server(server.root)
        self.store.close()
        self.store = RemoteStore(server.url)
        self.queue = self.store.queue(self.queue_name)

    def file_key(self, name: str) -> object:
        entry = layout.parse_entry(name)
        assert entry is not None, name
        return entry.message_id, entry.count, entry.group


def _settings() -> settings:
    return settings(
        max_examples=25,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _run(machine: type[StoreMachine], max_examples: int) -> None:
    """`max_examples` examples, then batches of fresh ones for DIRMQ_FUZZ_SECONDS (make fuzz)."""
    fuzz_s = float(os.environ.get("DIRMQ_FUZZ_SECONDS") or 0)
    end = time.monotonic() + fuzz_s
    machine.examples = machine.steps = 0
    with controlled_clock():
        run_state_machine_as_test(
            machine, settings=settings(_settings(), max_examples=max_examples)
        )
        while time.monotonic() < end:
            run_state_machine_as_test(
                machine, settings=settings(_settings(), max_examples=50, database=None)
            )
    if fuzz_s:
        print(f"\n{machine.__name__}: {machine.examples} examples, {machine.steps} steps")


def test_store_matches_the_model() -> None:
    _run(StoreMachine, max_examples=25)


def test_the_server_matches_the_model(tmp_path: Path) -> None:
    RemoteMachine.server = start_server(tmp_path / "root")
    try:
        _run(RemoteMachine, max_examples=10)
    finally:
        RemoteMachine.server.stop()
        RemoteMachine.server = None


# -- what the machine found, pinned as plain regression tests -----------------------------------
@pytest.mark.parametrize(
    "message",
    [
        OutgoingMessage(b"x", {"X-A": "\ud800"}),
        OutgoingMessage(b"x", group="\ud800"),
        OutgoingMessage(b"x", dedup_id="\udfff"),
    ],
    ids=["header-value", "group", "dedup-id"],
)
def test_a_lone_surrogate_is_an_invalid_argument(
    store: dirmq.Store, message: OutgoingMessage
) -> None:
    """It was a UnicodeEncodeError out of put_many (a 500 at any door that lets one through)."""
    queue = store.create_queue("q")
    with pytest.raises(InvalidArgument, match="Unicode"):
        queue.validate(message)
    with pytest.raises(InvalidArgument, match="Unicode"):
        queue.put_many([message])
    assert queue.stats().total == 0


def test_oversized_headers_are_refused_by_validate_and_on_a_dedup_repeat(
    store: dirmq.Store,
) -> None:
    """The header size was checked only when a file was encoded: `validate` passed such a
    message (so it failed the whole batch it joined), and a dedup repeat, never encoded,
    was accepted."""
    queue = store.create_queue("q")
    huge = {"X-A": "x" * (2 * 1024 * 1024 + 1)}
    with pytest.raises(InvalidArgument, match="limit"):
        queue.validate(OutgoingMessage(b"x", huge))
    first = queue.put(b"x", dedup_id="d")
    with pytest.raises(InvalidArgument, match="limit"):
        queue.put(b"x", huge, dedup_id="d")
    assert queue.put(b"x", dedup_id="d") == first


@pytest.mark.parametrize("seconds", [MAX_DURATION_S + 1, 1e13, float("inf")])
@pytest.mark.parametrize("operation", ["put", "get", "extend", "nack"])
def test_durations_beyond_the_bound_are_refused(
    store: dirmq.Store, operation: str, seconds: float
) -> None:
    queue = store.create_queue("q")
    queue.put(b"held")
    held = queue.get_one()
    assert held is not None and held.receipt is not None
    calls = {
        "put": lambda: queue.put(b"x", delay_s=seconds),
        "get": lambda: queue.get(visibility_s=seconds),
        "extend": lambda: queue.extend(held.receipt, seconds),
        "nack": lambda: queue.nack(held.receipt, seconds),
    }
    queue.put(b"ready")
    with pytest.raises(InvalidArgument):
        calls[operation]()
    stats = queue.stats()
    assert (stats.ready, stats.in_flight, stats.delayed) == (1, 1, 0)


@pytest.mark.parametrize(
    "message",
    [
        OutgoingMessage(b"x", group="a\nX-Group: b"),
        OutgoingMessage(b"x", dedup_id="a\rb"),
        OutgoingMessage(b"x", dedup_id=""),
        OutgoingMessage(b"x", group="\ud800"),
    ],
    ids=["group-LF", "dedup-CR", "dedup-empty", "group-surrogate"],
)
def test_the_http_client_refuses_a_bad_group_or_dedup_id(
    tmp_path: Path, message: OutgoingMessage
) -> None:
    """The HTTP client wrote them into header lines unchecked: a LF split a batch part's
    headers (a batch of three stored two), a CR was 'cannot reach dirmq' (StorageIOError),
    a surrogate a UnicodeEncodeError."""
    server = start_server(tmp_path / "root")
    try:
        with RemoteStore(server.url) as remote:
            queue = remote.create_queue("q")
            for batch in ([message], [OutgoingMessage(b"a"), message, OutgoingMessage(b"b")]):
                with pytest.raises(InvalidArgument, match="single-line"):
                    queue.put_many(batch)
            assert queue.stats().total == 0
    finally:
        server.stop()
