"""One listening server's shared state, and the limits it holds its clients to.

`Listener` is what every connection of one listener shares: the application's callables (the
handler, the fast path, the body check and sink, the observer), the `Limits`, the memory
budget, the `Clock` of response heads, and the connections themselves, which it watches with
one deadline sweep (instead of a timer per connection) and closes on a drain. It knows a
connection only as `Watched`; `http.py`'s `HttpServer` is the listener that makes them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

from dirmq.server.balance import ConnectionBalance
from dirmq.server.budget import MemoryBudget, default_body_memory_bytes
from dirmq.server.contract import BodyCheck, BodySinkFor, FastHandler, Handler, Observe
from dirmq.server.http_wire import Clock

MAX_SWEEP_S = 0.5  # timeouts fire at most this late (less when a limit is shorter)


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout_s: float = 10.0  # the whole request head must arrive within this
    body_timeout_s: float = 60.0  # and its body within this after the head
    idle_timeout_s: float = 75.0  # keep-alive connections with no request are closed
    max_connections: int = 20_000
    # The sum of request bodies (and response bodies stuck in write buffers) held in memory.
    max_body_memory_bytes: int = field(default_factory=default_body_memory_bytes)


def limits_of(limits: Limits) -> tuple[float, float, float]:
    return (limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s)


class Watched(Protocol):
    """What a listener asks of a connection: its deadline kept, closing when idle or at once."""

    deadline: float  # loop time at which the connection times out; 0: never

    def timed_out(self) -> None: ...

    def close_if_idle(self) -> bool: ...

    def abort(self) -> None: ...


class Listener:
    """Shared state of every connection of one listening server."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits | None = None,
        fast: FastHandler | None = None,
        *,
        budget: MemoryBudget | None = None,
        body_check: BodyCheck | None = None,
        body_sink: BodySinkFor | None = None,
        observe: Observe | None = None,
        scheme: str = "http",
        require_client_certificate: bool = False,
        loopback_only: bool = False,
    ) -> None:
        self.handler = handler
        # Protected mode (no credentials configured): a peer not on this host is turned away.
        self.loopback_only = loopback_only
        self.scheme = scheme  # "https": the listener wraps connections in TLS (serve.py)
        # TLS let a client without a certificate through (`tls.py`): refuse it here, in words.
        self.require_client_certificate = require_client_certificate
        self.fast = fast
        self.body_check = body_check
        self.body_sink = body_sink  # large bodies written as they arrive (bodies.py)
        self.observe = observe
        self.limits = limits or Limits()
        # Shared by every listener of a worker process (serve.py passes one).
        self.budget = budget or MemoryBudget(self.limits.max_body_memory_bytes)
        self.connections: set[Watched] = set()
        # With several workers: connections spread evenly over them (balance.py), and this
        # listener's index among the worker's, which a passed connection names.
        self.balance: ConnectionBalance | None = None
        self.listener = 0
        self.draining = False
        self.clock = Clock()
        self.requests_served = 0
        # One timer for every connection's deadline instead of a timer per connection armed
        # and cancelled three times a request: a timeout fires up to one sweep period late.
        shortest = min(limits_of(self.limits))
        self._sweep_s = min(MAX_SWEEP_S, max(shortest / 4, 0.01))
        self._sweeper: asyncio.TimerHandle | None = None

    def watch(self, connection: Watched) -> None:
        self.connections.add(connection)
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._sweep_s, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        expired = [c for c in self.connections if 0.0 < c.deadline <= now]
        for connection in expired:
            connection.timed_out()
        self._sweeper = (
            loop.call_later(self._sweep_s, self._sweep, loop) if self.connections else None
        )

    async def drain(self, timeout_s: float) -> int:
        """Finish what is in progress, then close every connection (the listener is already
        closed by the caller). Idle connections close now; busy ones after their response.
        Returns how many were still busy at the deadline, and cut."""
        self.draining = True
        # Closed idle ones are not waited for: over TLS, closing waits for the client's
        # close_notify, which an idle keep-alive client never sends (they are aborted below).
        idle = {c for c in list(self.connections) if c.close_if_idle()}
        deadline = time.monotonic() + timeout_s
        while self.connections - idle and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        cut = list(self.connections)
        for connection in cut:
            connection.abort()
        return len(cut)
