"""What the runtime knows of a dialect, and how one listener's dialects share its requests.

The runtime (connections, framing, the broker, long-poll waiters) knows no dialect. The
composition root (`dirmq.service`) builds the dialects (native, yaq, SQS, pub/sub, ...) and gives
each listener a `Router`: its dialects in the order they are asked whether a request is theirs;
the last one takes whatever the others did not claim (the native API on its port, SQS on its
own). Cross-cutting concerns
(authentication, access logs) are meant to wrap a `Router` there, once, not each dialect.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dirmq.server.http import Later, Observe, Request, Respond, Response, StreamResponse

log = logging.getLogger("dirmq.server")


class Dialect:
    """One API on the shared runtime. Subclasses answer requests in `__call__`; the rest is
    optional: the defaults claim nothing (a dialect asked last needs no claim), take no fast
    path and check no body early."""

    name = "dialect"

    def claims(self, request: Request) -> bool:
        """Whether `request` is this dialect's, judged from its head and body, when other
        dialects share the listener and this one is not the last."""
        return False

    async def __call__(self, request: Request) -> Response | StreamResponse:
        raise NotImplementedError

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        """An answer without a Task (see `http.FastHandler`), or None: `__call__` answers."""
        return None

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int
    ) -> Response | None:
        """A refusal from the request head alone (e.g. 413 from Content-Length), before the
        body is read; None to read it. Only the head is known here, not who claims it: a
        dialect refuses only requests of its own shape."""
        return None

    def start(self) -> None:
        """Called once per worker on the event loop, before the first request."""

    async def close(self) -> None:
        """Called once per worker at shutdown, before the broker closes (streams end here)."""


class Router:
    """A listener's handler: each request goes to the first dialect that claims it, else to
    the last. `observe` is told of every answered request (`http.Observe`): the request says
    which dialect (`door`) answered it, and what it asked as far as that dialect filled in."""

    def __init__(self, dialects: Sequence[Dialect], observe: Observe | None = None) -> None:
        if not dialects:
            raise ValueError("a listener needs at least one dialect")
        self.dialects = tuple(dialects)
        self.observe = observe
        self._asked = self.dialects[:-1]
        self._fallback = self.dialects[-1]

    def dialect_for(self, request: Request) -> Dialect:
        for dialect in self._asked:
            if dialect.claims(request):
                request.door = dialect.name
                return dialect
        request.door = self._fallback.name
        return self._fallback

    async def __call__(self, request: Request) -> Response | StreamResponse:
        return await self.dialect_for(request)(request)

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        return self.dialect_for(request).fast(request, respond)

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int
    ) -> Response | None:
        for dialect in self.dialects:
            refusal = dialect.body_check(method, path, headers, length)
            if refusal is not None:
                return refusal
        return None


def unique_dialects(routers: Sequence[Router]) -> list[Dialect]:
    """Every dialect of `routers` once (one may serve several listeners), in order."""
    seen: dict[int, Dialect] = {}
    for router in routers:
        for dialect in router.dialects:
            seen.setdefault(id(dialect), dialect)
    return list(seen.values())


def observe_all(*observers: Observe | None) -> Observe | None:
    """One `Observe` that tells each of `observers` (None ones left out) in turn, for a
    `Router` that has several (request metrics, the access log); None if there are none. One
    observer's failure is logged and does not keep the next from being told."""
    chosen = tuple(o for o in observers if o is not None)
    if not chosen:
        return None
    if len(chosen) == 1:
        return chosen[0]

    def observe(request: Request, status: int, sent: int, seconds: float) -> None:
        for observer in chosen:
            try:
                observer(request, status, sent, seconds)
            except Exception:
                log.exception("observing %s %s failed", request.method, request.path)

    return observe
