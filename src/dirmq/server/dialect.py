"""What the runtime knows of a dialect, and how one listener's dialects share its requests.

The runtime (connections, framing, the broker, long-poll waiters) knows no dialect. The
composition root (`dirmq.service`) builds the dialects (native, yaq, SQS, pub/sub, ...) and gives
each listener a `Router`: its dialects in the order they are asked whether a request is theirs;
the last one takes whatever the others did not claim (the native API on its port, SQS on its
own). Cross-cutting concerns (authentication, access logs) wrap the dialects here, once.

Authentication is the Router's (`server/access.py`): before a dialect is even chosen, it
identifies the request's principal (`Request.principal`); wrong credentials, or none where the
dialect's route is not public, are refused in the dialect's own words (`Dialect.refuse`), with
no dialect code run. Authorisation is each dialect's: only it knows which queue and which
permission a request means, and it judges them by name before looking anything up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dirmq.errors import DirmqError, Unauthenticated
from dirmq.server.access import Access, credentials_required
from dirmq.server.contract import (
    BodySink,
    Later,
    Observe,
    Request,
    Respond,
    Response,
    StreamResponse,
    SwitchProtocols,
)
from dirmq.server.errors import error_response

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

    async def __call__(self, request: Request) -> Response | StreamResponse | SwitchProtocols:
        raise NotImplementedError

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        """An answer without a Task (see `contract.FastHandler`), or None: `__call__` answers."""
        return None

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int, principal: str = ""
    ) -> Response | None:
        """A refusal from the request head alone (e.g. 413 from Content-Length), before the
        body is read; None to read it. Only the head is known here, not who claims it: a
        dialect refuses only requests of its own shape, and only to a `principal` allowed to
        learn what the refusal tells (a queue's size limit tells that it exists)."""
        return None

    def body_sink(self, head: Request, length: int) -> BodySink | None:
        """Where a large body (`length` bytes) of a request this dialect claims goes as it
        arrives (`contract.BodySinkFor`; `head.principal` is known from a token, if any), or
        None: read into memory."""
        return None

    def public(self, request: Request) -> bool:
        """Whether `request` may be answered without credentials where they are required
        (`/health`, by configuration)."""
        return False

    def refuse(self, request: Request, error: DirmqError) -> Response:
        """The answer to a request the Router refuses (Unauthenticated), in this dialect's
        words."""
        return error_response(error)

    def start(self) -> None:
        """Called once per worker on the event loop, before the first request."""

    async def close(self) -> None:
        """Called once per worker at shutdown, before the broker closes (streams end here)."""


class Router:
    """A listener's handler: each request goes to the first dialect that claims it, else to
    the last. `observe` is told of every answered request (`contract.Observe`): the request says
    which dialect (`door`) answered it, and what it asked as far as that dialect filled in."""

    def __init__(
        self,
        dialects: Sequence[Dialect],
        access: Access | None = None,
        observe: Observe | None = None,
    ) -> None:
        if not dialects:
            raise ValueError("a listener needs at least one dialect")
        self.dialects = tuple(dialects)
        self.observe = observe
        self._asked = self.dialects[:-1]
        self._fallback = self.dialects[-1]
        # None on an open server: not one check on the way of a request.
        self._access = access if access is not None and access.enabled else None

    def dialect_for(self, request: Request) -> Dialect:
        for dialect in self._asked:
            if dialect.claims(request):
                request.door = dialect.name
                return dialect
        request.door = self._fallback.name
        return self._fallback

    async def __call__(self, request: Request) -> Response | StreamResponse | SwitchProtocols:
        access = self._access
        if access is None:
            return await self.dialect_for(request)(request)
        refusal: Unauthenticated | None = None
        if not request.principal:  # (a fast path may have found it already)
            try:
                request.principal = access.identify(request)
            except Unauthenticated as exc:
                refusal = exc
        # Chosen once the principal is known: a claim may look a name up only for a principal
        # allowed to see it (SQS's queue URLs).
        dialect = self.dialect_for(request)
        if refusal is None and not request.principal and not dialect.public(request):
            refusal = credentials_required()
        if refusal is not None:
            return dialect.refuse(request, refusal)
        return await dialect(request)

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        access = self._access
        if access is not None:
            principal = access.token_of(request.headers.get("authorization"))
            if not principal:
                return None  # no token, a wrong one, a signature: the general path answers
            request.principal = principal
        return self.dialect_for(request).fast(request, respond)

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int
    ) -> Response | None:
        principal = ""
        if self._access is not None:
            principal = self._access.token_of(headers.get("authorization"))
            if not principal:
                return None  # read the body: the whole request is judged (401) once here
        for dialect in self.dialects:
            refusal = dialect.body_check(method, path, headers, length, principal)
            if refusal is not None:
                return refusal
        return None

    def body_sink(self, head: Request, length: int) -> BodySink | None:
        """`contract.BodySinkFor`: asked of the dialect that will answer the request, for a
        principal known from its token (none where credentials are required: the body is
        read, and the request judged, as usual)."""
        if self._access is not None:
            head.principal = self._access.token_of(head.headers.get("authorization"))
            if not head.principal:
                return None
        return self.dialect_for(head).body_sink(head, length)


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
