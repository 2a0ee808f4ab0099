"""A connection's answers: its requests answered one at a time, in the order they came.

A request goes first to the application's fast path, which may answer at once or later through
a callback (no task); else to a task running the handler. The answer is written from
preformatted head bytes: a body in memory, a body from its file (`filesend.py`), or a stream
of chunks with trailers, paced by the transport's back-pressure. A `SwitchProtocols` answer
writes the 101 and hands the connection to the `Upgraded` object it names (`websocket.py`).
Each answer is counted and observed, then the connection closes or goes on to the next
request.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from dirmq.server import filesend
from dirmq.server.contract import (
    LATER,
    Later,
    Request,
    Response,
    StreamResponse,
    SwitchProtocols,
)
from dirmq.server.http_connection import HttpConnection
from dirmq.server.http_wire import NO_BODY, PREALLOCATE_BYTES, error_body, response_head
from dirmq.wire import framing

log = logging.getLogger("dirmq.server")


class Answers(HttpConnection):
    """The requests answered in order; a part of `HttpProtocol` (`http.py`)."""

    __slots__ = ()

    def _start_next(self) -> None:
        if self._task is not None or self._closed or self._write_paused:
            return
        if not self._pending:
            refusal, self._refusal = self._refusal, None
            if refusal is not None:  # every request before it is answered: its turn
                refusal()
            return
        request = self._pending.popleft()
        self._update_reading()
        self._begin(request)

    def _begin(self, request: Request) -> None:
        fast = self._server.fast
        if fast is not None:
            # Busy from now on: should `respond` run before `fast` returns (an answer ready at
            # once), it clears this, and LATER must not be set again after it.
            self._task = LATER
            try:
                result = fast(request, functools.partial(self._respond, request))
            except Exception:
                log.exception("unhandled error answering %s %s", request.method, request.path)
                result = _internal_error()
            if isinstance(result, Later):
                if result is not LATER and self._task is LATER:
                    self._task = result  # not answered yet: cancelled if the client leaves
                return
            if isinstance(result, Response):
                self._task = None
                self._release(request)
                self._reply(request, result)
                return
        task = self._task = self._loop.create_task(self._answer(request))
        if request.held_bytes or request.upload is not None:
            # Not in `_answer`: a task cancelled before it starts never runs its `finally`.
            task.add_done_callback(lambda _task: self._release(request))

    def _respond(self, request: Request, outcome: Response | BaseException) -> bool:
        """A fast answer is ready: reply (unless the connection went away)."""
        self._task = None
        self._release(request)
        if isinstance(outcome, BaseException):
            log.error(
                "unhandled error answering %s %s",
                request.method,
                request.path,
                exc_info=outcome,
            )
            outcome = _internal_error()
        return self._reply(request, outcome)

    def _reply(self, request: Request, response: Response) -> bool:
        """Send a fast answer's response, then what `_answer` does after its own; False if the
        connection is gone."""
        if self._transport is None or self._closed:
            if response.file is not None:
                response.file.close()
            return False
        keep_alive = request.keep_alive and not self._server.draining
        if response.file is not None:  # sent from its file: a task (see `_send_file`)
            self._task = self._loop.create_task(self._answer_file(request, response, keep_alive))
            return True
        self._write_response(request, response, keep_alive)
        self._server.requests_served += 1
        self._observed(request, response.status, len(response.body))
        self._next_request(keep_alive)
        return True

    def _next_request(self, keep_alive: bool) -> None:
        """A response is out: close, or wait for (or start) the next request."""
        if self._transport is None or self._closed:
            return
        if not keep_alive:
            self._transport.close()
            return
        if not self._in_message:
            self._arm(self._limits.idle_timeout_s)
        self._start_next()

    async def _answer(self, request: Request) -> None:
        sent: list[int] = []  # the response's status and body bytes, once it has begun
        try:
            try:
                response = await self._server.handler(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("unhandled error answering %s %s", request.method, request.path)
                response = _internal_error()
            if isinstance(response, SwitchProtocols):
                self._switch(request, response)
                return
            keep_alive = request.keep_alive and not self._server.draining
            sent = [response.status, 0]
            await self._send(request, response, keep_alive, sent)
            self._server.requests_served += 1
            if isinstance(response, Response) and response.after is not None:
                # Shielded: the bytes are out, so the follow-up (an ack) must happen even if
                # the client hangs up this very moment and our task is cancelled.
                await asyncio.shield(response.after())
        except asyncio.CancelledError:
            return
        except ConnectionError:
            keep_alive = False
        finally:
            self._task = None
            if sent:  # also a stream the client left (its end is how an SSE stream ends)
                self._observed(request, sent[0], sent[1])
        self._next_request(keep_alive)

    async def _answer_file(self, request: Request, response: Response, keep_alive: bool) -> None:
        """A fast answer whose body is a file: `_reply`'s rest, after the body is sent."""
        sent = 0
        try:
            await self._send_file(request, response, keep_alive)
            sent = response.file.size if response.file is not None else 0
            self._server.requests_served += 1
        except asyncio.CancelledError:
            return
        except ConnectionError:
            keep_alive = False
        finally:
            self._task = None
            self._observed(request, response.status, sent)
        self._next_request(keep_alive)

    async def _send_file(self, request: Request, response: Response, keep_alive: bool) -> None:
        """Write a response whose body is a file (filesend.py): on plain TCP by `sendfile`
        from a thread, under TLS copied through the transport a piece at a time. The file is
        closed once sent, or the sending given up."""
        transport, file = self._transport, response.file
        assert transport is not None and file is not None
        status = response.status
        head = response_head(
            self._server.clock.prefix(status), response.headers, status, file.size, keep_alive
        )
        if self._closed or transport.is_closing():
            file.close()
            raise ConnectionResetError("client went away")
        if request.method == "HEAD" or status in NO_BODY:
            file.close()
            transport.write(head)
            return
        self._file_sending = True
        try:
            await filesend.send(transport, head, file, self._limits.idle_timeout_s, self._writable)
        finally:
            self._file_sending = False

    async def _writable(self) -> None:
        """Once the transport's write buffer is under its high-water mark."""
        if self._can_write is not None:
            await self._can_write.wait()

    def _switch(self, request: Request, response: SwitchProtocols) -> None:
        """Write the 101 and hand the connection to `response.connection` (from `_answer`,
        whose `finally` clears `_task`: the connection stays busy for the drain)."""
        transport = self._transport
        tail, self._upgrade_tail = self._upgrade_tail or b"", None
        if transport is None or self._closed:
            return
        head = response_head(
            self._server.clock.prefix(101), response.headers, 101, 0, keep_alive=True
        )
        transport.write(head)
        self._upgraded = response.connection
        if self._counted and not self._stream_counted and self._server.balance is not None:
            self._server.balance.stream_opened()
            self._stream_counted = True
        self._disarm()  # the protocol keeps its own timers
        self._server.requests_served += 1
        self._observed(request, 101, 0)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        response.connection.start(transport, tail)
        if self._write_paused:
            response.connection.writable(False)

    def _write_response(self, request: Request, response: Response, keep_alive: bool) -> None:
        transport = self._transport
        assert transport is not None
        status, content = response.status, response.body
        head = response_head(
            self._server.clock.prefix(status), response.headers, status, len(content), keep_alive
        )
        if status in NO_BODY or request.method == "HEAD" or not content:
            transport.write(head)
        elif len(content) < PREALLOCATE_BYTES:
            transport.write(head + content)  # one small buffer for the transport
        else:
            # Not `head + content`: a big body's copy. The transport keeps the bytes themselves.
            transport.write(head)
            transport.write(content)
            self._charge_response(len(content))

    async def _send(
        self,
        request: Request,
        response: Response | StreamResponse,
        keep_alive: bool,
        sent: list[int],
    ) -> None:
        """Write `response`; `sent[1]` counts its body bytes as they go."""
        transport = self._transport
        assert transport is not None
        if isinstance(response, Response):
            if response.file is not None:
                await self._send_file(request, response, keep_alive)
                sent[1] = response.file.size
                return
            self._write_response(request, response, keep_alive)
            sent[1] = len(response.body)
            return
        # uvloop refuses a write to a closed transport with a RuntimeError, which nothing here
        # would handle: a stream whose connection closed (a drain, or the client left) stops.
        if self._closed or transport.is_closing():
            raise ConnectionResetError("client went away")
        headers = self._base_headers(response.headers)
        transport.write(
            framing.response_head(
                response.status,
                headers,
                content_length=None,
                keep_alive=keep_alive,
                trailers=response.trailer_names,
            )
        )
        body = response.body
        try:
            async for piece in body:
                if self._closed or transport.is_closing():
                    raise ConnectionResetError("client went away")
                transport.write(framing.chunk(piece))
                sent[1] += len(piece)
                if self._can_write is not None:
                    await self._can_write.wait()
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            # The head is gone already: the only honest signal left is an aborted connection
            # (a client sees a truncated chunked body, never a hang).
            log.exception("a streamed response failed")
            transport.abort()
            raise ConnectionResetError("stream failed") from None
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
        if self._closed or transport.is_closing():
            raise ConnectionResetError("client went away")  # while the body ended
        transport.write(framing.last_chunk(response.trailers))


def _internal_error() -> Response:
    return Response(
        500, error_body(500, "internal server error"), [("Content-Type", "application/json")]
    )
