"""Publish/subscribe over HTTP (httpx, like `RemoteStore`): the library's `PubSub` and
`Subscription` API, talking to a `dirmq serve` instance's `/@pubsub` endpoints.

    from dirmq.client.pubsub import RemotePubSub
    with RemotePubSub("http://127.0.0.1:8080") as hub:
        with hub.subscribe("billing-1", channels=["orders"]) as sub:
            hub.publish("orders", b"{}", acks="done", reply_to="outcomes/shop")
            delivery = sub.receive(wait_s=5)
            if delivery is not None:
                sub.done(delivery)

A subscription is one server-sent event stream (read by a background thread into a local
buffer, so `receive(wait_s)` can time out) plus a POST per settlement. The server sends at most
`window` deliveries that are not settled yet. Outcomes reach the publisher in its `reply_to`
queue: read them with `RemoteStore(url).queue(reply_to)`.

`read_retained` pages through the retained log (`future` messages) by sequence number without
consuming anything; `retained_head` is its highest sequence number. What the server sends is
decoded by `dirmq.wire.pubsub`: a malformed answer raises its ProtocolError, a malformed event
ends the stream (`receive` raises StorageIOError, with the ProtocolError's words).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from dirmq import errors
from dirmq.client import protocol as p
from dirmq.client import tls
from dirmq.client.remote import DEFAULT_TIMEOUT_S, checked, unreachable
from dirmq.pubsub.model import (
    DEFAULT_ACCEPT_TIMEOUT_S,
    DEFAULT_PROCESS_TIMEOUT_S,
    Delivery,
    Mode,
    Persistence,
    Published,
    check_name,
)
from dirmq.pubsub.retained import LostEntry
from dirmq.pubsub.transitions import Entry
from dirmq.store import OutgoingMessage
from dirmq.wire import pubsub as wire

# The server sends a keep-alive comment every 15 s: a stream silent for this long is dead.
STREAM_READ_TIMEOUT_S = 60.0
DETACH_WAIT_S = 2.0  # close() waits this long at most for the server to see the detach
MAX_RETAINED_LIMIT = 1000  # the server's cap on entries examined per page


@dataclass(frozen=True, slots=True)
class RetainedPage:
    """One page of the retained log: `GET /@pubsub/retained`."""

    entries: list[tuple[int, Entry]]  # (seq, entry) that matched the filter, in seq order
    missing: list[tuple[int, str]]  # (seq, why): entries of the range that are gone or damaged
    next_seq: int  # where the next page starts (== from_seq: nothing to read there yet)
    head: int  # the log's highest sequence number when the page was read


class RemotePubSub:
    """Pub/sub on one dirmq server. Thread-safe (one connection pool). An https:// URL takes
    `RemoteStore`'s TLS keywords (`dirmq.client.tls`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        token: str | None = None,
        cafile: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        verify = tls.verify_argument(cafile, certfile, keyfile, ssl_context)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout_s, headers=p.auth_headers(token), verify=verify
        )

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        headers: Mapping[str, bytes] | None = None,
        body: bytes = b"",
    ) -> p.Answer:
        # A sequence of pairs lets a parameter repeat (channel=a&channel=b).
        pairs = list(params.items() if isinstance(params, Mapping) else params or ())
        try:
            response = self._http.request(
                method,
                path,
                params=tuple(pairs) or None,
                headers={k.encode(): v for k, v in (headers or {}).items()} or None,
                content=body or None,
            )
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from exc
        return checked(response)

    def publish(
        self,
        channel: str,
        body: bytes,
        *,
        subject: str = "",
        mode: Mode | str = Mode.ANYONE,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        acks: Iterable[str] | str = (),
        reply_to: str | None = None,
        accept_timeout_s: float = DEFAULT_ACCEPT_TIMEOUT_S,
        process_timeout_s: float = DEFAULT_PROCESS_TIMEOUT_S,
        persistence: Persistence | str = Persistence.WRITETHROUGH,
    ) -> Published:
        """As `PubSub.publish`. Only Content-Type, Content-Encoding and X-Attr-* headers travel
        over HTTP (others are refused here, as the server would drop them)."""
        p.check_message(OutgoingMessage(body, dict(headers or {})))
        params = {
            "channel": channel,
            "subject": subject,
            "mode": str(getattr(mode, "value", mode)),
            "accept_timeout": p.seconds(accept_timeout_s),
            "process_timeout": p.seconds(process_timeout_s),
            "persistence": str(getattr(persistence, "value", persistence)),
        }
        wanted = acks.split(",") if isinstance(acks, str) else [str(a) for a in acks]
        if any(a.strip() for a in wanted):
            params["acks"] = ",".join(a.strip() for a in wanted if a.strip())
        if reply_to:
            params["reply_to"] = reply_to
        if message_id is not None:
            params["id"] = message_id
        encoded = {k: v.encode() for k, v in (headers or {}).items()}
        answer = self.request("POST", "/@pubsub/publish", params, encoded, bytes(body))
        return wire.decode_published(answer.body)

    def subscribe(
        self,
        name: str | None = None,
        *,
        channels: Iterable[str] = (),
        subjects: Iterable[str] = (),
        replay_from: int | None = None,
        window: int = 16,
        max_deliveries: int | None = None,
        backoff_s: float | None = None,
        backoff_max_s: float | None = None,
        dead_letter: str | None = None,
    ) -> RemoteSubscription:
        """Attach subscription `name` (anonymous if None) with a filter; SubscriptionBusy if it
        is attached elsewhere. The delivery policy (`PubSub.subscribe`): the server's defaults
        for what is None."""
        policy: list[tuple[str, str]] = []
        if max_deliveries is not None:
            policy.append(("max_deliveries", str(max_deliveries)))
        if backoff_s is not None:
            policy.append(("backoff", p.seconds(backoff_s)))
        if backoff_max_s is not None:
            policy.append(("backoff_max", p.seconds(backoff_max_s)))
        if dead_letter is not None:
            policy.append(("dead_letter", dead_letter))
        return RemoteSubscription(
            self, name, list(channels), list(subjects), replay_from, window, policy
        )

    def subscriptions(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/@pubsub/subscriptions").json())

    def delete_subscription(self, name: str) -> None:
        self.request("DELETE", f"/@pubsub/subscriptions/{check_name('subscription name', name)}")

    def stats(self) -> dict[str, int]:
        return dict(self.request("GET", "/@pubsub").json())

    def read_retained(
        self,
        from_seq: int = 1,
        limit: int = 100,
        *,
        channels: Iterable[str] = (),
        subjects: Iterable[str] = (),
    ) -> RetainedPage:
        """Retained entries `from_seq` .. `from_seq + limit - 1` (at most 1000 examined; the
        server may stop earlier after a few MiB of bodies) that match the filter. Nothing is
        consumed. Continue from `next_seq`; a page that ends before the range (`next_seq` less
        than `from_seq + limit`) reached the head or the size cap."""
        if not 1 <= limit <= MAX_RETAINED_LIMIT:
            raise errors.InvalidArgument(f"limit must be from 1 to {MAX_RETAINED_LIMIT}")
        if from_seq < 1:
            raise errors.InvalidArgument(f"from_seq must be 1 or more, not {from_seq}")
        params = [("from", str(from_seq)), ("limit", str(limit))]
        params += [("channel", c) for c in channels] + [("subject", s) for s in subjects]
        answer = self.request("GET", "/@pubsub/retained", params)
        entries: list[tuple[int, Entry]] = []
        missing: list[tuple[int, str]] = []
        for item in wire.decode_page(answer.body):
            if isinstance(item, LostEntry):
                why = f"{item.why}: {item.error}" if item.error else item.why
                missing.append((item.seq, why))
            else:
                entries.append(item)
        next_seq = _int_header(answer, wire.NEXT_SEQ_HEADER)
        return RetainedPage(entries, missing, next_seq, _head(answer))

    def retained_head(self) -> int:
        """The retained log's highest sequence number (0 while it is empty)."""
        return _head(self.request("GET", "/@pubsub/retained/head"))

    def open_stream(self, params: list[tuple[str, str]]) -> httpx.Response:
        request = self._http.build_request(
            "GET",
            "/@pubsub/subscribe",
            params=tuple(params),
            headers={"Accept": wire.EVENT_STREAM},
            timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S),
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from exc
        if response.status_code != 200:
            response.read()
            response.close()
            checked(response)
            raise errors.DirmqError(f"subscribe answered HTTP {response.status_code}")
        return response

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemotePubSub:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _int_header(answer: p.Answer, name: str) -> int:
    return wire.decode_count_header(name, answer.header(name.lower()))


def _head(answer: p.Answer) -> int:
    return _int_header(answer, wire.HEAD_HEADER)


class _StreamEnded:
    def __init__(self, error: errors.DirmqError) -> None:
        self.error = error


class RemoteSubscription:
    """The library's `Subscription` API over one event stream. Thread-safe."""

    def __init__(
        self,
        hub: RemotePubSub,
        name: str | None,
        channels: list[str],
        subjects: list[str],
        replay_from: int | None,
        window: int,
        policy: list[tuple[str, str]] | None = None,
    ) -> None:
        self.hub = hub
        params = [("channel", c) for c in channels] + [("subject", s) for s in subjects]
        params += policy or []
        if name is not None:
            params.append(("name", check_name("subscription name", name)))
        if replay_from is not None:
            params.append(("from", str(replay_from)))
        params.append(("window", str(window)))
        self._response = hub.open_stream(params)
        self._events = wire.read_events(self._response.iter_lines())
        self._closed = False
        self._buffer: queue.Queue[Delivery | _StreamEnded] = queue.Queue()
        try:
            kind, data = next(self._events)
            if kind != wire.ATTACHED:
                raise errors.DirmqError(f"the stream began with {kind!r}, not 'attached'")
            attached = wire.decode_attached(data)
        except (StopIteration, httpx.HTTPError, ValueError) as exc:
            self._response.close()
            raise errors.StorageIOError(0, f"the subscription stream broke: {exc}") from exc
        self.name: str = attached.name
        self.cursor: int = attached.cursor
        self._reader = threading.Thread(
            target=self._read, name=f"dirmq-remote-sub-{self.name}", daemon=True
        )
        self._reader.start()

    def _read(self) -> None:
        ended: errors.DirmqError = errors.StorageIOError(0, "the server ended the stream")
        try:
            for kind, data in self._events:
                if kind == wire.MESSAGE:
                    self._buffer.put(wire.decode_delivery(data))
        except Exception as exc:  # whatever broke the stream, `receive` must learn of it
            ended = errors.StorageIOError(0, f"the subscription stream broke: {exc}")
        finally:
            self._buffer.put(_StreamEnded(ended))

    def receive(self, wait_s: float = 0.0) -> Delivery | None:
        """The next delivery, or None after `wait_s` seconds without one. StorageIOError once
        the stream has ended (the server stopped or the connection broke)."""
        self._check_open()
        try:
            item = self._buffer.get(timeout=wait_s) if wait_s > 0 else self._buffer.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, _StreamEnded):
            self._buffer.put(item)  # every later call learns it too
            raise item.error
        return item

    def _path(self, key: str, action: str) -> str:
        return f"/@pubsub/subscriptions/{self.name}/deliveries/{quote(key, safe='')}/{action}"

    def _settle(self, delivery: Delivery | str, action: str, params: dict[str, str]) -> p.Answer:
        self._check_open()
        key = delivery if isinstance(delivery, str) else delivery.key
        return self.hub.request("POST", self._path(key, action), params)

    def done(self, delivery: Delivery | str) -> None:
        self._settle(delivery, "done", {})

    def dismiss(self, delivery: Delivery | str) -> None:
        self._settle(delivery, "dismiss", {})

    def abort(self, delivery: Delivery | str) -> None:
        self._settle(delivery, "abort", {})

    def heartbeat(self, delivery: Delivery | str, extend_s: float | None = None) -> int:
        params = {} if extend_s is None else {"extend": p.seconds(extend_s)}
        deadline = wire.decode_deadline(self._settle(delivery, "heartbeat", params).body)
        if not isinstance(delivery, str):
            delivery.deadline_ms = deadline
        return deadline

    def _check_open(self) -> None:
        if self._closed:
            raise errors.InvalidArgument(f"subscription {self.name!r} is closed")

    def close(self) -> None:
        """Detach: the server gives back every delivery not settled yet."""
        if self._closed:
            return
        self._closed = True
        # Shutting the socket down wakes the reader thread blocked in recv(); closing the
        # response alone would leave it there until the next keep-alive.
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
            self._response.close()
        self._reader.join(timeout=5)
        self._wait_detached(DETACH_WAIT_S)

    def _wait_detached(self, budget_s: float) -> None:
        """The server detaches when it sees the stream end, a moment after we close it: wait
        for that (bounded), so that the name is free once `close` returns (a new attach or a
        DELETE right after it is not refused as busy)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            try:
                listed = self.hub.subscriptions()
            except errors.DirmqError:
                return  # the server is gone: nothing is attached there any more
            if not any(s.get("name") == self.name and s.get("attached") for s in listed):
                return
            time.sleep(0.01)

    def __enter__(self) -> RemoteSubscription:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dirmq.client.RemoteSubscription {self.name!r} at {self.hub.url}>"
