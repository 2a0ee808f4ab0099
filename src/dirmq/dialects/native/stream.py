"""The streaming receive: `GET /{queue}/messages` with `Upgrade: websocket` (docs/http-api.md,
"Streaming receive"; the frames are `wire/stream.py`'s).

A session leases messages for one consumer and pushes them while its credit allows: at most
`prefetch` (plus the `credit` it was granted) unacknowledged deliveries, as an AMQP consumer's
prefetch. Each push is one store get for as many messages as there is room for (through the
broker's shared lease batcher; when the queue is empty, the broker's long-poll waiter, woken by
inotify: no polling). Acks from every session of a queue are gathered into one
`Broker.ack_many` (one store call) per batch (`_AckLine`); a settlement that fails is reported
back to its session. When the WebSocket closes, for whatever reason (the client left, was
killed, broke the protocol, or the server stops), every delivery still unacknowledged is given
back at once, as AMQP requeues on channel close: another consumer gets it without waiting for
its lease to expire.

Why it is long: a session's bookkeeping (tags, receipts, credit, the push loop, give-back) and
the per-queue ack line that reports failures back to sessions change together.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

from dirmq.errors import DirmqError, InvalidArgument
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, SwitchProtocols
from dirmq.server.errors import status_of
from dirmq.server.parameters import check_parameters
from dirmq.server.websocket import (
    GOING_AWAY,
    INTERNAL_ERROR,
    INVALID_DATA,
    POLICY_VIOLATION,
    UNSUPPORTED_DATA,
    WebSocket,
    handshake_headers,
)
from dirmq.store import Message, Queue
from dirmq.wire import stream as wire
from dirmq.wire.durations import parse_duration

log = logging.getLogger("dirmq.server")

DEFAULT_PREFETCH = 100
MAX_PREFETCH = 1000
MAX_WINDOW = 10_000  # prefetch plus every credit granted
MAX_ACK_BATCH = 1000  # receipts per store call
CLOSE_WAIT_S = 5.0
PARAMETERS = frozenset({"prefetch", "visibility"})
SETTLE_KEYS = frozenset({"ack", "ack_through", "nack", "delay", "credit"})


class StreamSessions:
    """Every stream session of one worker (the native API's), and the queues' ack lines."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.sessions: set[Session] = set()
        self._ack_lines: dict[str, _AckLine] = {}
        self._endings: set[asyncio.Task[None]] = set()  # give-backs under way
        self.closing = False

    def open(self, request: Request, queue_name: str) -> SwitchProtocols:
        """Accept a stream request (authorised already): the 101 and its session; a bad
        parameter or handshake raises InvalidArgument (400), a missing queue 404."""
        if self.closing or self.broker.closing:
            raise InvalidArgument("the server is shutting down")
        if request.query:
            check_parameters(request.query, PARAMETERS, "GET /{queue}/messages (stream)")
        prefetch = _prefetch(request.query.get("prefetch"))
        visibility = request.query.get("visibility") or request.headers.get("x-visibility")
        visibility_s = None if visibility is None else parse_duration(visibility, "visibility")
        headers = handshake_headers(request)
        queue = self.broker.queue(queue_name)
        session = Session(self, queue, prefetch, visibility_s, request.principal or None)
        return SwitchProtocols(headers, WebSocket(session))

    def ack_line(self, queue: Queue) -> _AckLine:
        line = self._ack_lines.get(queue.name)
        if line is None or line.queue is not queue:
            line = self._ack_lines[queue.name] = _AckLine(self.broker, queue)
        return line

    def give_back(self, queue: Queue, receipts: list[str]) -> None:
        """Nack `receipts` now, in one pool call (the close of a session)."""
        task = asyncio.get_running_loop().create_task(self._give_back(queue, receipts))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    async def _give_back(self, queue: Queue, receipts: list[str]) -> None:
        try:
            # Not `nack_many`: no consumer asked, so no nack is counted. What fails: its lease
            # expires instead.
            await self.broker.call(queue.nack_each, receipts)
        except Exception:  # (the pool is shut down) their leases expire instead
            log.exception("giving back %d messages of %s failed", len(receipts), queue.name)

    async def close(self) -> None:
        """At shutdown, before the broker's pool stops: close every stream (1001), give back
        what each held, and wait (a while) for the give-backs and pending acks."""
        self.closing = True
        for session in list(self.sessions):
            session.shutdown()
        deadline = asyncio.get_running_loop().time() + CLOSE_WAIT_S
        while self._endings or any(line.busy for line in self._ack_lines.values()):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.01)


def _prefetch(value: str | None) -> int:
    if value is None:
        return DEFAULT_PREFETCH
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PREFETCH:
        raise InvalidArgument(f"prefetch={value!r} must be an integer from 1 to {MAX_PREFETCH}")
    return int(value)


class Session:
    """One consumer's stream: the `websocket.Endpoint` of its connection."""

    __slots__ = (
        "_by_receipt",
        "_incoming",
        "_order",
        "_pump",
        "_room",
        "_socket",
        "_tags",
        "consumer",
        "last_tag",
        "queue",
        "sessions",
        "visibility_s",
        "window",
    )

    def __init__(
        self,
        sessions: StreamSessions,
        queue: Queue,
        prefetch: int,
        visibility_s: float | None,
        consumer: str | None = None,
    ) -> None:
        self.sessions = sessions
        self.queue = queue
        self.window = prefetch
        self.visibility_s = visibility_s
        self.consumer = consumer  # the principal its leases name as their holder
        self.last_tag = 0
        self._tags: dict[int, str] = {}  # unacknowledged: delivery tag -> receipt
        self._by_receipt: dict[str, int] = {}
        self._order: deque[int] = deque()  # tags in delivery order (settled ones dropped lazily)
        self._incoming = 0  # direct deliveries on their way (`taken`, `arrived`)
        self._room = asyncio.Event()
        self._socket: WebSocket | None = None
        self._pump: asyncio.Task[None] | None = None

    # -- websocket.Endpoint -----------------------------------------------------------------------
    def opened(self, socket: WebSocket) -> None:
        self._socket = socket
        self.sessions.sessions.add(self)
        self._room.set()
        self._pump = asyncio.get_running_loop().create_task(self._push())

    def text(self, text: str) -> None:
        try:
            document = json.loads(text)
            if not isinstance(document, dict) or not document.keys() <= SETTLE_KEYS:
                raise ValueError("not an object of ack, ack_through, nack, delay, credit")
            self._settle(document)
        except (ValueError, TypeError, DirmqError) as exc:
            self._close(INVALID_DATA, f"bad settle message: {exc}")
        except _Unknown as exc:
            self._close(POLICY_VIOLATION, str(exc))

    def binary(self, data: bytes) -> None:
        self._close(UNSUPPORTED_DATA, "the client sends text (JSON) messages only")

    def closed(self, code: int, reason: str) -> None:
        """Give back everything unacknowledged, at once; stop pushing."""
        self.sessions.sessions.discard(self)
        if self._pump is not None:
            self._pump.cancel()  # a lease under way is given back by the broker
        receipts = list(self._tags.values())
        self._tags.clear()
        self._by_receipt.clear()
        self._order.clear()
        if receipts:
            self.sessions.give_back(self.queue, receipts)

    def shutdown(self) -> None:
        if self._socket is not None:
            self._socket.shutdown()

    # -- waiter.SideDelivery: while the push waits, the direct path's publishes -------------------
    def taken(self) -> None:
        self._incoming += 1

    def arrived(self, messages: list[Message]) -> bool:
        """A publish leased straight for this stream while it waited (the waiter stays in the
        line: a stream with credit takes every publish of this worker, not one a wait)."""
        self._incoming -= 1
        socket = self._socket
        if socket is None or not socket.open:  # closed: what it held went back already
            return not messages
        if messages:
            self._push_now(socket, messages, wire.encode_delivery)
        return True

    # -- inside -----------------------------------------------------------------------------------
    def _close(self, code: int, reason: str) -> None:
        if self._socket is not None:
            self._socket.close(code, reason)

    def _settle(self, document: dict[str, Any]) -> None:
        acked: list[tuple[int, str]] = []
        ack = document.get("ack")
        if ack is not None:
            acked.extend(self._take_each(ack, "ack"))
        through = document.get("ack_through")
        if through is not None:
            acked.extend(self._take_through(through))
        if acked:
            self.sessions.ack_line(self.queue).add(self, acked)
        nack = document.get("nack")
        if nack is not None:
            delay = document.get("delay", 0)
            if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
                raise InvalidArgument(f"delay must be a number of seconds, got {delay!r}")
            taken = self._take_each(nack, "nack")
            if taken:
                asyncio.get_running_loop().create_task(self._nack(taken, float(delay)))
        credit = document.get("credit")
        if credit is not None:
            if isinstance(credit, bool) or not isinstance(credit, int) or credit < 0:
                raise InvalidArgument(f"credit must be a non-negative integer, got {credit!r}")
            self.window = min(self.window + credit, MAX_WINDOW)
        if len(self._tags) < self.window:
            self._room.set()

    def _take_each(self, refs: Any, what: str) -> list[tuple[int, str]]:
        """The (tag, receipt) of each delivery tag or receipt in `refs`, now settled here. A
        tag already settled is skipped (acks may cross a give-back); one never delivered is a
        protocol error. A receipt this session does not hold is passed on as is: the store
        judges it."""
        if not isinstance(refs, list):
            raise InvalidArgument(f"{what} must be a list of delivery tags or receipts")
        tags, by_receipt = self._tags, self._by_receipt
        taken: list[tuple[int, str]] = []
        for ref in refs:
            if type(ref) is int:
                receipt = tags.pop(ref, None)
                if receipt is None:
                    if not 0 < ref <= self.last_tag:
                        raise _Unknown(f"delivery tag {ref} was never delivered on this stream")
                    continue
                del by_receipt[receipt]
                taken.append((ref, receipt))
            elif isinstance(ref, str) and ref:
                tag = by_receipt.pop(ref, 0)
                if tag:
                    del tags[tag]
                taken.append((tag, ref))
            else:
                raise InvalidArgument(f"{what}: {ref!r} is neither a delivery tag nor a receipt")
        order = self._order
        while order and order[0] not in tags:  # keep the order short without ack_through
            order.popleft()
        return taken

    def _take_through(self, through: Any) -> list[tuple[int, str]]:
        if isinstance(through, bool) or not isinstance(through, int):
            raise InvalidArgument(f"ack_through must be a delivery tag, got {through!r}")
        if through > self.last_tag:
            raise _Unknown(f"delivery tag {through} was never delivered on this stream")
        tags, by_receipt, order = self._tags, self._by_receipt, self._order
        taken: list[tuple[int, str]] = []
        while order and order[0] <= through:
            tag = order.popleft()
            receipt = tags.pop(tag, None)
            if receipt is not None:
                del by_receipt[receipt]
                taken.append((tag, receipt))
        return taken

    async def _nack(self, taken: list[tuple[int, str]], delay_s: float) -> None:
        try:
            failures = await self.sessions.broker.nack_many(
                self.queue, [receipt for _tag, receipt in taken], delay_s
            )
        except Exception as exc:
            failures = {receipt: exc for _tag, receipt in taken}
        if failures:
            self.failed(taken, failures)

    def failed(self, taken: list[tuple[int, str]], failures: dict[str, Exception]) -> None:
        """Tell the client which of its settlements did not take (e.g. StaleReceipt: the lease
        had expired, and the message may be delivered again)."""
        socket = self._socket
        if socket is None or not socket.open:
            return
        report: list[dict[str, object]] = []
        for tag, receipt in taken:
            error = failures.get(receipt)
            if error is not None:
                entry: dict[str, object] = {"receipt": receipt}
                if tag:
                    entry["tag"] = tag
                entry["error"] = type(error).__name__
                entry["message"] = str(error)
                report.append(entry)
        socket.send_text(wire.encode_failed(report))

    async def _push(self) -> None:
        """Lease as many messages as the credit allows, push them, again."""
        socket = self._socket
        assert socket is not None
        broker = self.sessions.broker
        encode = wire.encode_delivery
        try:
            while socket.open:
                room = self.window - len(self._tags) - self._incoming
                if room <= 0:
                    self._room.clear()
                    await self._room.wait()
                    continue
                if not socket.can_write.is_set():
                    await socket.can_write.wait()
                    continue
                got = await broker.receive(
                    self.queue,
                    min(room, MAX_PREFETCH),
                    self.visibility_s,
                    None,
                    consumer=self.consumer,
                    side=self,
                )
                if not socket.open:
                    self.sessions.give_back(self.queue, [m.receipt or "" for m in got])
                    return
                if not got:
                    if broker.closing:
                        socket.close(GOING_AWAY, "the server is shutting down")
                        return
                    continue
                self._push_now(socket, got, encode)
        except asyncio.CancelledError:
            raise
        except DirmqError as exc:  # e.g. the queue was deleted
            socket.close(_close_code(exc), f"{type(exc).__name__}: {exc}")
        except Exception:
            log.exception("a stream of %s failed", self.queue.name)
            socket.close(INTERNAL_ERROR, "internal server error")

    def _push_now(self, socket: WebSocket, got: list[Message], encode: Any) -> None:
        tags, by_receipt, order = self._tags, self._by_receipt, self._order
        tag = self.last_tag
        frames: list[bytes] = []
        for message in got:
            tag += 1
            receipt = message.receipt or ""
            tags[tag] = receipt
            by_receipt[receipt] = tag
            order.append(tag)
            frames.append(encode(tag, message))
        self.last_tag = tag
        socket.send_binary(frames)


class _Unknown(Exception):
    """A settlement names a delivery tag this stream never sent."""


def _close_code(error: DirmqError) -> int:
    """4000 + the HTTP status the error has in the native API (4404: the queue is gone)."""
    return 4000 + status_of(error)


class _AckLine:
    """Acks for one queue from every session of this worker, applied in one `Broker.ack_many`
    per batch: whatever arrives while a batch is being applied forms the next."""

    def __init__(self, broker: Broker, queue: Queue) -> None:
        self.broker = broker
        self.queue = queue
        self._pending: list[tuple[Session, list[tuple[int, str]]]] = []
        self._count = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self._task is not None

    def add(self, session: Session, taken: list[tuple[int, str]]) -> None:
        self._pending.append((session, taken))
        self._count += len(taken)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending, self._count = self._pending, [], 0
                receipts = [receipt for _session, taken in batch for _tag, receipt in taken]
                failures: dict[str, Exception] = {}
                for start in range(0, len(receipts), MAX_ACK_BATCH):
                    chunk = receipts[start : start + MAX_ACK_BATCH]
                    try:
                        failures.update(await self.broker.ack_many(self.queue, chunk))
                    except Exception as exc:  # every ack of the chunk learns it
                        failures.update((receipt, exc) for receipt in chunk)
                if failures:
                    for session, taken in batch:
                        if any(receipt in failures for _tag, receipt in taken):
                            session.failed(taken, failures)
        finally:
            self._task = None
