"""A connection's intake: the bytes it reads, parsed into requests (httptools' callbacks).

It parses what one read brings a piece at a time, keeping the rest unparsed while the
connection must not be read; holds a request's head to its size limit and its body to the
server's limit, the application's early check and the memory budget (reserved from the
Content-Length before a byte of it is read, a chunked one as it arrives); reads a large body
into one buffer, or hands it to the sink the application gives for it (`bodies.py`) as it
arrives; answers `Expect: 100-continue`; and hands each complete `Request` to be answered
(`http_answers.py`), in order. A limit broken inside a callback is raised as `_Reject`, which
`_feed_piece` turns into a refusal (`http_refusals.py`). A connection's first read may send a
streaming consumer to another worker (`balance.py`).
"""

from __future__ import annotations

import io
import logging
import time
from collections import deque

import httptools

from dirmq.server.bodies import STREAM_BODY_BYTES, Upload, window_for
from dirmq.server.contract import Request, Response
from dirmq.server.http_connection import HttpConnection
from dirmq.server.http_wire import (
    PREALLOCATE_BYTES,
    content_length,
    first_values,
    header_text,
    split_url,
)

log = logging.getLogger("dirmq.server")

# What one read brings is parsed this much at a time, so that parsing stops (keeping the rest)
# as soon as the connection must not be read: 256 KiB of pipelined requests would otherwise
# become thousands of queued requests (megabytes) on every such connection.
FEED_BYTES = 4 * 1024
UPLOAD_FEED_BYTES = 64 * 1024
RETRY_AFTER_S = 1


def _over_the_limit(limit_bytes: int) -> str:
    """What a 413 for the server's own limit says: the limit, and who may raise it."""
    return (
        f"over the server's limit of {limit_bytes} bytes (its operator raises it with "
        "`dirmq serve --max-body-bytes SIZE`)"
    )


class _Reject(Exception):
    """A request refused from inside a parser callback (httptools wraps it: `_feed_piece`)."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
        response: Response | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.response = response  # the answer, when the application wrote it


class Intake(HttpConnection):
    """The bytes read, parsed into requests; a part of `HttpProtocol` (`http.py`)."""

    __slots__ = ()

    # -- reading -----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._upgraded is not None:
            self._upgraded.data_received(data)
            return
        if self._first_read and self._pass_stream(data):
            return
        if self._upgrade_tail is not None:  # a read that came before pausing took effect
            self._upgrade_tail += data
            return
        if self._closed or self._refusal is not None:
            return
        kept = self._take_unparsed()
        if kept is not None:  # a read that came before pausing took effect: in order
            data = bytes(kept) + data
        if len(data) <= FEED_BYTES:
            self._feed_piece(data)  # the usual case: one request, or a few
        else:
            self._feed(memoryview(data))
        if self._unparsed is not None or self._upload is not None:
            self._update_reading()

    def _pass_stream(self, data: bytes) -> bool:
        """A connection whose first bytes ask for an upgrade (a streaming consumer) may go to
        a worker serving fewer streams (balance.py); True if it went. One that stays counts as
        a stream here at once, not at its 101: else several streams arriving together each see
        the same counts, and all stay on the worker that took them."""
        self._first_read = False  # only a connection's first bytes are looked at
        balance = self._server.balance
        transport = self._transport
        if (
            balance is None
            or transport is None
            or self._closed
            or not self._counted
            or data[:4] != b"GET "
            or b"upgrade:" not in data[:4096].lower()
        ):
            return False
        if not self._received_as_stream and balance.pass_stream(
            transport.get_extra_info("socket"), self._server.listener, data
        ):
            self._closed = True
            transport.abort()  # our copy only: the connection lives on over there
            return True
        balance.stream_opened()
        self._stream_counted = True
        return False

    def _feed(self, data: memoryview) -> None:
        """Parse FEED_BYTES at a time while the connection may be read; keep the rest."""
        while data:
            if self._closed or self._refusal is not None:
                return  # refused: the rest is dropped
            if self._must_pause():
                self._keep_unparsed(data)
                return
            # An upload's body in larger pieces: it ends no request, only its window pauses.
            size = UPLOAD_FEED_BYTES if self._upload is not None else FEED_BYTES
            if not self._feed_piece(data[:size]):
                if self._upgrade_tail is not None:
                    self._upgrade_tail += data[size:]
                return
            data = data[size:]

    def _feed_unparsed(self) -> None:
        data = self._take_unparsed()
        if data is not None:
            self._feed(data)
        self._update_reading()

    def _keep_unparsed(self, data: memoryview) -> None:
        """Received but not to be parsed yet (at most one read, ~256 KiB): it is in memory, so
        it counts against the budget until parsed, and uploads wait rather than the sum grow."""
        self._unparsed = data
        self._server.budget.take(len(data))

    def _feed_piece(self, data: bytes | memoryview) -> bool:
        """Parse; False if the request was refused (the rest is not to be parsed)."""
        try:
            self._parser.feed_data(data)
            return True
        except httptools.HttpParserUpgrade as upgrade:
            if self._upgrade_tail is None:  # not a GET: nothing answers it
                self._fail(400, "protocol upgrades are not supported on this endpoint")
            else:  # what follows the request waits for its answer (reading stops until then)
                self._upgrade_tail = bytes(data[upgrade.args[0] :])
                self._update_reading()
        except httptools.HttpParserError as exc:
            # httptools wraps what our callbacks raise; a limit we enforced is the real answer.
            reject = exc.__context__ if isinstance(exc.__context__, _Reject) else None
            if reject is not None:
                self._fail(reject.status, reject.message, reject.headers, reject.response)
            else:
                self._fail(400, f"malformed HTTP request: {exc}")
        return False

    # -- parsing (httptools callbacks) -------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._drop_upload()
        self._reset_message()
        self._in_message = True
        self._began = time.monotonic()
        self._arm(self._limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        text_name, text = name.decode("latin-1"), header_text(value)
        self._raw_headers.append((text_name, text))
        key = text_name.lower()
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_bytes:
            raise _Reject(431, f"request head over {self._limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        headers = self._headers
        length = content_length(headers)
        if length:
            self._check_body(length)
            # A large body may go to a sink as it arrives (its window reserved), else it is
            # reserved whole and read into memory.
            if length < STREAM_BODY_BYTES or not self._stream_body(length):
                self._reserve(length)
                if length >= PREALLOCATE_BYTES:
                    # Filled in place: `bytes(n)` is lazily zeroed memory, and a BytesIO that
                    # holds the only reference to its bytes writes into them and hands them
                    # back as is.
                    self._body_io = io.BytesIO(bytes(length))
        expect = headers.get("expect")
        if (
            expect is not None
            and expect.strip().lower() == "100-continue"
            and self._transport
            and not self._file_sending  # its bytes would land amid the body being sent
        ):
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(self._limits.body_timeout_s)

    def _check_body(self, length: int) -> None:
        """Refuse a body from its Content-Length, before reading it: over the server's limit
        or the application's (413), or over what the memory budget has left (503: a retry
        cures it once other requests are answered). Then reserve it."""
        limit = self._limits.max_body_bytes
        if length > limit:
            raise _Reject(413, f"body of {length} bytes {_over_the_limit(limit)}")
        check = self._server.body_check
        if check is not None:
            path, _query = split_url(self._url)
            try:
                refusal = check(self._method(), path, self._headers, length)
            except Exception:  # a bug there must not pass for a malformed request: read on
                log.exception("checking the body of %s failed", path)
                refusal = None
            if refusal is not None:
                raise _Reject(refusal.status, "refused by the application", response=refusal)

    def _stream_body(self, length: int) -> bool:
        """Whether the body (of `length` bytes, checked) goes to a sink the application gives
        for it as it arrives (bodies.py), its window reserved."""
        body_sink = self._server.body_sink
        sink = None
        if body_sink is not None:
            path, query = split_url(self._url)
            head = Request(
                self._method(),
                path,
                first_values(query) if query else {},
                self._headers,
                b"",
                False,
                self._raw_headers,
                query,
                scheme=self._server.scheme,
                peer=self._peer,
            )
            self._reserve(window_for(length))  # before a sink is made: 503 makes none
            try:
                sink = body_sink(head, length)
            except Exception:  # a bug there must not cost the request: read it into memory
                log.exception("choosing a sink for the body of %s failed", path)
            if sink is None:
                self._give_body_charge()
        if sink is None:
            return False
        self._upload = Upload(sink, length, self._upload_progress)
        return True

    def _reserve(self, size: int) -> None:
        """Reserve `size` bytes of the budget for the body being read (503 if they do not
        fit)."""
        budget = self._server.budget
        if not budget.try_take(size):
            raise _Reject(
                503,
                f"the server's memory for request bodies ({budget.limit} bytes, "
                f"--max-body-memory) is in use by other requests; retry shortly",
                (("Retry-After", str(RETRY_AFTER_S)),),
            )
        self._body_charge += size

    def _upload_progress(self) -> None:
        """The upload's writer caught up (or failed): read on."""
        self._update_reading()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._upload is not None:
            self._upload.feed(body)  # within its Content-Length: llhttp checks that
            return
        if self._body_io is not None:
            self._body_io.write(body)  # within its Content-Length: llhttp checks that
            return
        if self._body_bytes > self._limits.max_body_bytes:
            raise _Reject(413, f"body {_over_the_limit(self._limits.max_body_bytes)}")
        if self._body_bytes > self._body_charge:  # sent chunked: reserved as it arrives
            self._reserve(self._body_bytes - self._body_charge)
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        upgrade = self._parser.should_upgrade()
        if upgrade and (self._method() != "GET" or self._body_bytes):
            self._drop_upload()
            self._give_body_charge()
            self._reset_message()
            return  # refused as httptools stops after it (`_feed_piece`)
        path, query = split_url(self._url)
        body = self._body
        request = Request(
            self._method(),
            path,
            first_values(query) if query else {},
            self._headers,
            (
                self._body_io.getvalue()
                if self._body_io is not None
                else body[0]
                if len(body) == 1
                else b"".join(body)
            ),
            # After a request to upgrade that is not switched, httptools parses nothing more.
            self._parser.should_keep_alive() and not upgrade,
            self._raw_headers,
            query,
            self._body_charge,
            time.monotonic(),
            scheme=self._server.scheme,
            peer=self._peer,
            upload=self._upload,
        )
        if self._upload is not None:
            self._upload.finish()
            self._upload = None  # the request's now, like its charge
        self._body_charge = 0  # the request's now
        self._reset_message()
        if upgrade:
            self._upgrade_tail = b""  # nothing more is parsed: see `_feed_piece`
        if self._task is None and not self._pending and not self._closed and not self._write_paused:
            self._begin(request)  # the usual case
            return
        if self._pending is None:
            self._pending = deque()
        self._pending.append(request)
        self._update_reading()
        self._start_next()
