"""The composition root of `dirmq serve`: which dialects answer on which listener.

The runtime (`dirmq.server`: connections, framing, the broker, workers) knows no dialect, and no
dialect knows another. Here, once per worker, the dialects are built on the worker's broker and
put in each listener's `Router`:

- the native port: pub/sub (`/@pubsub...`), then SQS (an `X-Amz-Target` or `Action` request,
  or a GET of an unknown SQS queue URL), then the native API, which takes the rest;
- `--yaq-listen`: the yaq dialect alone;
- `--sqs-listen`: SQS alone (the same SQS dialect as on the native port).

Every listener's `Router` tells the same observers of each answered request (`observers`: the
access log, the log of authentication failures; request metrics join them here). A new dialect
(the console) or a concern that wraps them all (authentication) is added here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dirmq.dialects.native.app import NativeApp
from dirmq.dialects.pubsub import PubSubApi
from dirmq.dialects.yaq import YaqApp
from dirmq.server import serve as runtime
from dirmq.server.access_log import AccessLog, AuthFailureLog, combine
from dirmq.server.dialect import Router
from dirmq.server.http import Limits, Observe
from dirmq.server.logs import LogSettings
from dirmq.sqs.app import Authenticate, SqsApp

DEFAULT_LISTEN = "127.0.0.1:8080"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    root: str
    listen: str = DEFAULT_LISTEN
    yaq_listen: str | None = None
    sqs_listen: str | None = None
    workers: int = 1
    drain_timeout_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    sqs_credentials: str | None = None  # file of `KEY_ID SECRET` lines: SQS requires SigV4
    sqs_deleted_wait_s: float | None = None  # CreateQueue after DeleteQueue: AWS's 60 s wait
    log: LogSettings = field(default_factory=LogSettings)


def observers(options: ServeOptions, worker: runtime.Worker) -> list[Observe]:
    """What `worker`'s listeners tell of every answered request (built once per worker, after
    the fork: request metrics would be the worker's own)."""
    found: list[Observe] = [AuthFailureLog()]
    if options.log.access:
        found.append(AccessLog())
    return found


def serve(options: ServeOptions, announce: Callable[[str], None] = print) -> int:
    """Run the server in the foreground; returns the exit status."""
    authenticate: Authenticate | None = None
    if options.sqs_credentials is not None:
        from dirmq.sqs.auth import SigV4Authenticator

        # Loaded now: a bad file fails before anything is announced; workers share the result.
        authenticate = SigV4Authenticator.from_file(options.sqs_credentials)
    listeners = [runtime.Listener("native", options.listen)]
    if options.yaq_listen:
        listeners.append(runtime.Listener("yaq", options.yaq_listen))
    if options.sqs_listen:
        listeners.append(runtime.Listener("sqs", options.sqs_listen))

    def compose(worker: runtime.Worker) -> dict[str, Router]:
        broker = worker.broker
        observe = combine(observers(options, worker))
        sqs = SqsApp(broker, authenticate=authenticate, deleted_wait_s=options.sqs_deleted_wait_s)
        routers = {
            "native": Router(
                [PubSubApi(broker, worker.metrics), sqs, NativeApp(broker, worker.metrics)],
                observe=observe,
            ),
            "sqs": Router([sqs], observe=observe),
        }
        if options.yaq_listen:
            routers["yaq"] = Router([YaqApp(broker)], observe=observe)
        return routers

    runtime_options = runtime.RuntimeOptions(
        root=options.root,
        listeners=tuple(listeners),
        workers=options.workers,
        drain_timeout_s=options.drain_timeout_s,
        limits=options.limits,
        log=options.log,
    )
    return runtime.serve(runtime_options, compose, announce)
