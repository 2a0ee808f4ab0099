"""What every console view is given: the worker's `Console` (store, access, sessions,
templates, the overview's census) and the request as a `Call` (its session, form and CSRF
token)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from dirmq.console.queue_flags import FlagsCache
from dirmq.console.render import Renderer
from dirmq.console.session import Session, Sessions
from dirmq.server.access import Access
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the overview tells of the server, fixed when it starts."""

    version: str
    workers: int
    started_s: float
    root: str


@dataclass(slots=True)
class Call:
    """One console request as a view sees it."""

    request: Request
    session: Session
    form: dict[str, list[str]]
    csrf: str

    def arg(self, name: str, default: str = "") -> str:
        values = self.form.get(name)
        if values:
            return values[0]
        return self.request.query.get(name, default)


class Console:
    """What the views share (one per worker)."""

    def __init__(self, broker: Broker, access: Access, secret: bytes, facts: ServerFacts) -> None:
        self.broker = broker
        self.store = broker.store
        self.access = access
        self.sessions = Sessions(secret)
        self.render = Renderer()
        self.facts = facts
        # Kept across refreshes: a settled deep @ready is not listed again (store/census.py).
        self.census = broker.census
        self.flags = FlagsCache(self.store.root)  # each queue's flow settings, by mtime
        self.hub: object | None = None  # the pub/sub hub, once the overview needs it

    def may(self, call: Call, permission: str, name: str) -> bool:
        return self.access.allows(call.session.principal, permission, name)

    def require(self, call: Call, permission: str, name: str) -> None:
        self.access.require(call.session.principal, permission, name)


View = Callable[[Console, Call], Response]


def queue_of(path: str) -> str:
    """The queue a `/ui/q/<queue>/...` path names (percent-decoded)."""
    return unquote(path.split("/")[3], errors="strict")


def ref_of(path: str) -> str:
    """The id (message, task) after `/ui/q/<queue>/<kind>/`."""
    return unquote(path.split("/")[5])
