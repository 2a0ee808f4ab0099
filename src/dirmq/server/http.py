"""The HTTP/1.1 server: an `asyncio.Protocol` with httptools (llhttp) doing all the parsing.

It reads and writes every connection (`serve.py` only binds the listening sockets). It enforces
the limits that protect the server from its clients (header and body size, slow or idle clients,
connection count), handles keep-alive, pipelining (answered in order, one at a time),
`Expect: 100-continue`, streaming responses with trailers, back-pressure from slow readers, and
draining on shutdown. What a request means is the business of the listener's dialects
(`dialect.py`); what it hands them and takes back is the contract (`contract.py`). A `GET`
asking for a protocol upgrade is answered like any other; if the application answers it with
`SwitchProtocols`, the connection's bytes go to the `Upgraded` object it names from then on
(`websocket.py`), else the connection closes after the answer. A large body the application
gives a sink for is written there as it arrives (`bodies.py`), and an answer whose body is a
file is sent from it (`filesend.py`): neither is held in memory.

This module puts the server together. One connection is one `HttpProtocol`: the state and life
of `HttpConnection` (`http_connection.py`) with its three parts, `Intake` (`http_intake.py`),
`Answers` (`http_answers.py`) and `Refusals` (`http_refusals.py`), in one object with one set
of slots: the invariants (answers in order, each budget charge given back exactly once) span
all of them, and a call from one part to another is a plain method call. `HttpServer` is the
`Listener` (`http_listener.py`: the limits, the shared state, the deadline sweep, the drain)
that makes them; response heads and the rest of the bytes are `http_wire.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from dirmq.server.http_answers import Answers
from dirmq.server.http_intake import Intake
from dirmq.server.http_listener import Listener
from dirmq.server.http_refusals import Refusals


class HttpProtocol(Intake, Answers, Refusals):
    """One connection: what it reads, how it answers, how it refuses."""

    __slots__ = ()


class HttpServer(Listener):
    """A listener whose connections are `HttpProtocol`s."""

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    def passed_protocol(self, received: bytes, arrived: Callable[[], None]) -> HttpProtocol:
        """For a connection another worker passed on (balance.py) with the bytes it had read:
        it stays here; `arrived` is called once it is counted here."""
        return HttpProtocol(self, movable=False, received=received, arrived=arrived)
