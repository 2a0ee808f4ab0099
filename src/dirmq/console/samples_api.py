"""The samples as JSON, for the console's charts and overview (`samples.py` takes them):

    GET /ui/api/samples              the totals over every queue, the last hour
    GET /ui/api/samples?queue=NAME   one queue's last hour (any permission on it: SEE)
    GET /ui/api/rates[?prefix=P]     the last sample of every sampled queue the principal may
                                     see (depth and rates), and the totals

Every worker answers from the run's sample files, so every answer is the same whichever worker
takes the request. An answer carries an `ETag` naming the last sample (and, with credentials,
the principal): a client that sends it back in `If-None-Match` gets 304 until the next sample,
having cost a `stat`. Files are read on the broker's pool, never on the event loop.

`SamplesApi` is a dialect of its own for now (asked first on the native port); `ROUTES` and the
`samples_response`/`rates_response` methods are what the console's own dialect mounts.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from dirmq.console.samples import Sampler
from dirmq.console.samples_files import SERIES, TOTAL, SampleFiles
from dirmq.errors import DirmqError, InvalidArgument, QueueNotFound
from dirmq.server.access import OPEN, Access
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.server.credentials import SEE
from dirmq.server.dialect import Dialect
from dirmq.server.errors import error_response, json_error
from dirmq.store import layout
from dirmq.store.names import queue_path

PREFIX = "/ui/api/"
JSON = "application/json"


class SamplesApi(Dialect):
    """The samples' routes of one worker, and its `Sampler` (started and stopped with it)."""

    name = "console"

    def __init__(
        self,
        broker: Broker,
        run_dir: str,
        access: Access = OPEN,
        *,
        interval_s: int,
        max_queues: int,
    ) -> None:
        self.broker = broker
        self.access = access
        store = broker.store
        self.sampler = Sampler(
            broker.census,
            store.access,
            broker.queue_counts,
            run_dir,
            interval_s=interval_s,
            max_queues=max_queues,
        )
        self.files = SampleFiles(run_dir, store.access)
        self.root = store.root

    def start(self) -> None:
        self.sampler.start()

    async def close(self) -> None:
        await self.broker.call(self.sampler.close)

    def claims(self, request: Request) -> bool:
        return request.path.startswith(PREFIX) and _route(request.path) is not None

    async def __call__(self, request: Request) -> Response:
        route = _route(request.path)
        request.route = route or "invalid"
        try:
            if route is None:
                raise InvalidArgument(f"no such path: {request.path}")
            if request.method not in ("GET", "HEAD"):
                response = json_error(
                    405, "MethodNotAllowed", f"{request.path} is read-only: GET or HEAD"
                )
                response.headers.append(("Allow", "GET, HEAD"))
                return response
            return await ROUTES[route](self, request)
        except DirmqError as exc:
            return error_response(exc)

    # -- the routes ------------------------------------------------------------------------------
    async def samples_response(self, request: Request) -> Response:
        """`GET /ui/api/samples[?queue=NAME]`: {"interval_s", "queue", "t": [...], and a list
        per column of `samples_files.SERIES`}, null where a point is missing."""
        _only(request, {"queue"})
        queue = request.query.get("queue")
        if queue is not None:
            queue_path(self.root, queue)  # InvalidName for what is no queue's name
            self.access.require(request.principal, SEE, queue)
        etag = self._etag(request, self.files.latest_version())
        if etag is not None and _matches(request, etag):
            return _not_modified(etag)
        version, body = await self.broker.call(self._series, queue)
        return _json(body, self._etag(request, version))

    async def rates_response(self, request: Request) -> Response:
        """`GET /ui/api/rates`: {"interval_s", "t", "queues": {name: {depth, oldest ready age,
        rates, cumulative counts}}, "total": {...}, "queue_count", "omitted"}: the last sample;
        queues only those the principal may see (with `prefix`, only those whose name starts
        with it: an overview's page)."""
        _only(request, {"prefix"})
        prefix = request.query.get("prefix", "")
        etag = self._etag(request, self.files.latest_version())
        if etag is not None and _matches(request, etag):
            return _not_modified(etag)
        latest = await self.broker.call(self.files.read_latest)
        # The tag names the sample read, not the one stat'ed above: a newer sample may have
        # replaced it meanwhile, and one tag must always name one body.
        etag = None if latest is None else self._etag(request, latest[0])
        if latest is None:
            body: dict[str, Any] = {
                "interval_s": self.sampler.interval_s,
                "t": None,
                "queues": {},
                "total": None,
                "queue_count": None,
                "omitted": None,
            }
        else:
            sample = latest[1]
            visible = self.access.visible(request.principal)
            body = {
                "interval_s": sample["interval_s"],
                "t": sample["t"],
                "queues": {
                    n: q for n, q in sample["queues"].items() if n.startswith(prefix) and visible(n)
                },
                "total": sample["total"],
                "queue_count": sample["queue_count"],
                "omitted": sample["omitted"],
            }
        return _json(body, etag)

    def _series(self, queue: str | None) -> tuple[tuple[int, int] | None, dict[str, Any]]:
        """(the version of the last sample the series ends at, the series)."""
        interval = self.sampler.interval_s
        latest = self.files.read_latest()
        body: dict[str, Any] = {"interval_s": interval, "queue": queue}
        if latest is None:
            if queue is not None:
                self._require_queue(queue)
            body.update((name, []) for name in SERIES)
            return None, body
        end_t = int(latest[1]["t"])
        ring = queue if queue is not None else TOTAL
        if queue is not None and not os.path.exists(self.files.ring_path(queue)):
            self._require_queue(queue)  # a queue not sampled (yet) answers nulls, none a 404
        body.update(self.files.read_series(ring, interval, end_t))
        return latest[0], body

    def _require_queue(self, queue: str) -> None:
        if not os.path.exists(os.path.join(queue_path(self.root, queue), layout.CONFIG_FILE)):
            raise QueueNotFound.missing(queue)

    def _etag(self, request: Request, version: tuple[int, int] | None) -> str | None:
        """What names the answer: the sample's file (each sample is a new one), and with
        credentials who asks (what it may see differs); None before the first sample."""
        if version is None:
            return None
        principal = ""
        if self.access.enabled:
            principal = f"-{zlib.crc32(request.principal.encode()):08x}"
        return f'"{version[0]:x}-{version[1]:x}{principal}"'


Route = Callable[[SamplesApi, Request], Awaitable[Response]]
# The paths the console mounts (`SamplesApi`'s methods, by route name).
ROUTES: dict[str, Route] = {
    "samples": SamplesApi.samples_response,
    "rates": SamplesApi.rates_response,
}


def _route(path: str) -> str | None:
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX) :].rstrip("/")
    return name if name in ROUTES else None


def _only(request: Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) if allowed else "none"
        raise InvalidArgument(
            f"unknown query parameter {unknown[0]!r} for {request.path} (it takes: {takes})"
        )


def _matches(request: Request, etag: str) -> bool:
    """Whether `If-None-Match` names `etag` (weak or strong: a GET compares weakly)."""
    header = request.headers.get("if-none-match")
    if header is None:
        return False
    for listed in header.split(","):
        tag = listed.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def _not_modified(etag: str) -> Response:
    return Response(304, b"", [("ETag", etag), ("Cache-Control", "no-cache")])


def _json(body: dict[str, Any], etag: str | None) -> Response:
    headers = [("Content-Type", JSON), ("Cache-Control", "no-cache")]
    if etag is not None:
        headers.append(("ETag", etag))
    return Response(200, json.dumps(body, separators=(",", ":")).encode() + b"\n", headers)
