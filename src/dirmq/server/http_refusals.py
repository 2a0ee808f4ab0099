"""A connection's refusals: a request it could not parse or accept (over a limit, refused by
the application's early check, malformed, too slow) is answered with its error after the
answers to the requests pipelined before it, reading nothing more meanwhile; then the
connection closes. It closes once the client has closed its side or `LINGER_S` has passed,
reading and dropping what the client still sends: closing with unread data makes the kernel
send a reset, which can destroy the answer before the client reads it. Observers see a refused
request too.
"""

from __future__ import annotations

import functools

import httptools

from dirmq.server.contract import Request, Response
from dirmq.server.http_connection import HttpConnection
from dirmq.server.http_wire import error_body, response_head, split_url
from dirmq.wire import framing

# After refusing a request whose body is unread, how long we keep reading (and dropping) what
# the client still sends (also TLS's bound for the client's close_notify: serve.py).
LINGER_S = 2.0


class Refusals(HttpConnection):
    """A request refused, then the connection closed; a part of `HttpProtocol` (`http.py`)."""

    __slots__ = ()

    def _fail(
        self,
        status: int,
        message: str,
        extra: tuple[tuple[str, str], ...] = (),
        response: Response | None = None,
    ) -> None:
        """Refuse a request we could not parse or accept, after the answers to the requests
        pipelined before it (reading nothing more meanwhile), then close the connection."""
        self._disarm()
        self._drop_upload()
        self._give_body_charge()
        if self._closed or self._refusal is not None:
            return
        refusal = functools.partial(self._refuse, status, message, extra, response)
        if self._task is None and not self._pending:
            refusal()
            return
        self._refusal = refusal
        self._update_reading()

    def _observe_refusal(self, status: int, response: Response | None) -> None:
        """Observers see a refused request too, as far as it arrived (no method before the
        parser read one: "-")."""
        try:
            method = self._method() if self._url else "-"
        except httptools.HttpParserError:
            method = "-"
        path, query = split_url(self._url) if self._url else ("-", "")
        request = Request(
            method,
            path,
            {},
            self._headers,
            b"",
            False,
            self._raw_headers,
            query,
            scheme=self._server.scheme,
        )
        request.started = self._began
        request.peer = self._peer
        sent = len(response.body) if response is not None else len(error_body(status, ""))
        self._observed(request, status, sent)

    def _refuse(
        self,
        status: int,
        message: str,
        extra: tuple[tuple[str, str], ...],
        response: Response | None,
    ) -> None:
        """Write the refusal; close once the client closes its side or LINGER_S has passed,
        reading and dropping what it still sends (a body we refused) meanwhile."""
        self._closed = True
        self._take_unparsed()
        transport = self._transport
        if transport is None:
            return
        if self._server.observe is not None:
            self._observe_refusal(status, response)
        if response is None:
            self._write_error(status, message, extra)
        else:
            response.headers = [*response.headers, ("Connection", "close")]
            head = response_head(
                self._server.clock.prefix(response.status),
                response.headers,
                response.status,
                len(response.body),
                keep_alive=True,  # "Connection: close" is among the headers already
            )
            transport.write(head + response.body)
        if transport.can_write_eof():
            transport.write_eof()
            self._lingering = True
            self._update_reading()
            self._arm(LINGER_S)
        else:
            # TLS: no half-close, but closing sends close_notify and then reads and drops what
            # the client still sends until it answers, for up to LINGER_S (serve.py's
            # ssl_shutdown_timeout): the same linger, done by the TLS layer.
            transport.close()

    def _write_error(
        self, status: int, message: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        if self._transport is None:
            return
        body = error_body(status, message)
        headers = self._base_headers([("Content-Type", "application/json"), *extra])
        head = framing.response_head(status, headers, content_length=len(body), keep_alive=False)
        self._transport.write(head + body)
