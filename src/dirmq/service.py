"""The composition root of `dirmq serve`: which dialects answer on which listener.

The runtime (`dirmq.server`: connections, framing, the broker, workers) knows no dialect, and no
dialect knows another. Here, once per worker, the dialects are built on the worker's broker and
put in each listener's `Router`:

- the native port: the web console (`/ui/...`, with the samples' `/ui/api/samples` and
  `/ui/api/rates` mounted in it; each worker's sampler is started and stopped with it), pub/sub
  (`/@pubsub...`), then SQS (an
  `X-Amz-Target` or `Action` request, or a GET of an unknown SQS queue URL), then the native
  API, which takes the rest;
- `--yaq-listen`: the yaq dialect alone;
- `--sqs-listen`: SQS alone (the same SQS dialect as on the native port).

Every listener's `Router` tells the same observers of each answered request (`observers`: the
request metrics, the access log, the log of authentication failures). A new dialect (the
console: `dirmq.console`, first on the native port) or a concern that wraps them all is
added here, once. Authentication: one `Access`
(`server/access.py`) from `--credentials` (or the legacy `--sqs-credentials`), given to every
listener's Router (which identifies the principal of each request) and to every dialect (which
authorises its routes). Without credentials the server is open, and protected mode keeps it on
this host: it refuses to listen anywhere but on loopback unless `--allow-anonymous`, and turns
other hosts' connections away.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dirmq import __version__
from dirmq.console.app import ConsoleApp
from dirmq.console.call import ServerFacts
from dirmq.console.samples import DEFAULT_INTERVAL_S, check_interval
from dirmq.console.samples_api import SamplesApi
from dirmq.console.session import new_secret
from dirmq.dialects.native.app import NativeApp
from dirmq.dialects.pubsub import PubSubApi
from dirmq.dialects.yaq import YaqApp
from dirmq.errors import CannotListen, InvalidArgument
from dirmq.server import serve as runtime
from dirmq.server.access import Access
from dirmq.server.access_log import AccessLog, AuthFailureLog
from dirmq.server.addresses import is_loopback_host, parse_address
from dirmq.server.contract import Observe
from dirmq.server.credentials import exposure_warning, legacy_credentials, load_credentials
from dirmq.server.dialect import Router, observe_all
from dirmq.server.http_listener import Limits
from dirmq.server.logs import LogSettings
from dirmq.server.metrics import DEFAULT_MAX_QUEUES
from dirmq.server.tls import tls_files
from dirmq.sqs.app import SqsApp
from dirmq.sqs.auth import SigV4Authenticator

DEFAULT_LISTEN = "127.0.0.1:8080"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    root: str
    listen: str = DEFAULT_LISTEN
    yaq_listen: str | None = None
    sqs_listen: str | None = None
    workers: int = 1
    journal: bool = True  # writethrough publishes through the commit journal (store/journal.py)
    drain_timeout_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    credentials: str | None = None  # TOML file of principals (docs/security.md)
    sqs_credentials: str | None = None  # legacy: `KEY_ID SECRET` lines, each key can do anything
    allow_anonymous: bool = False  # no credentials, yet listen beyond loopback
    sqs_deleted_wait_s: float | None = None  # CreateQueue after DeleteQueue: AWS's 60 s wait
    # HTTPS on every listener (PEM files); with tls_client_ca, client certificates required.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    metrics_max_queues: int = DEFAULT_MAX_QUEUES  # queues with depth series of their own
    sample_interval_s: float = DEFAULT_INTERVAL_S  # the console's samples (whole seconds)
    log: LogSettings = field(default_factory=LogSettings)


def load_access(options: ServeOptions) -> Access:
    """The server's `Access`, from its credentials (ConfigError for a bad file, before anything
    is announced; workers share the result). Warns on stderr when a file holding AWS secrets
    is readable by other users."""
    if options.credentials is not None and options.sqs_credentials is not None:
        # Not merged: the legacy keys may do anything, which would quietly widen a file
        # written to narrow what each principal may do.
        raise InvalidArgument(
            "--credentials and --sqs-credentials exclude each other: move the SQS keys into "
            "the credentials file as aws_keys of principals (docs/security.md)"
        )
    path = options.credentials or options.sqs_credentials
    if path is None:
        return Access(None)
    if options.allow_anonymous:
        raise InvalidArgument(
            "--allow-anonymous is for a server without credentials: with them, every request "
            "must carry some (open /health or /metrics in the credentials file)"
        )
    loaded = load_credentials(path) if options.credentials else legacy_credentials(path)
    warning = exposure_warning(path, loaded)
    if warning is not None:
        print(f"dirmq: warning: {warning}", file=sys.stderr)
    return Access(loaded, SigV4Authenticator.of(loaded).check())


def refuse_exposure(listeners: list[runtime.Listener]) -> None:
    """Protected mode: without credentials, an address other hosts can reach is refused."""
    for listener in listeners:
        host, _port = parse_address(listener.address)
        if not is_loopback_host(host):
            raise CannotListen(
                f"refusing to listen on {listener.address} ({listener.name} API) without "
                "credentials: anyone who can reach it could read, write and delete every "
                "queue; give --credentials FILE, or --allow-anonymous to accept that"
            )


def observers(options: ServeOptions, worker: runtime.Worker) -> list[Observe]:
    """What `worker`'s listeners tell of every answered request (built once per worker, after
    the fork: request metrics are the worker's own)."""
    found: list[Observe] = [worker.metrics.observe, AuthFailureLog()]
    if options.log.access:
        found.append(AccessLog())
    return found


def serve(options: ServeOptions, announce: Callable[[str], None] = print) -> int:
    """Run the server in the foreground; returns the exit status."""
    tls = tls_files(options.tls_cert, options.tls_key, options.tls_client_ca)
    sample_interval_s = check_interval(options.sample_interval_s)
    access = load_access(options)
    listeners = [runtime.Listener("native", options.listen)]
    if options.yaq_listen:
        listeners.append(runtime.Listener("yaq", options.yaq_listen))
    if options.sqs_listen:
        listeners.append(runtime.Listener("sqs", options.sqs_listen))
    protected = not access.enabled and not options.allow_anonymous
    if protected:
        refuse_exposure(listeners)
    # Made before the workers fork, so that each accepts the console sessions of every other.
    console_secret = new_secret()
    facts = ServerFacts(__version__, options.workers, time.time(), os.path.abspath(options.root))

    def compose(worker: runtime.Worker) -> dict[str, Router]:
        broker, metrics = worker.broker, worker.metrics
        sqs = SqsApp(broker, access=access, deleted_wait_s=options.sqs_deleted_wait_s)
        # Told of every answered request of every listener.
        observe = observe_all(*observers(options, worker))
        samples = SamplesApi(
            broker,
            worker.run_dir,
            access,
            interval_s=sample_interval_s,
            max_queues=options.metrics_max_queues,
        )
        routers = {
            "native": Router(
                [
                    ConsoleApp(broker, access, secret=console_secret, facts=facts, api=samples),
                    PubSubApi(broker, metrics, access),
                    sqs,
                    NativeApp(broker, metrics, access),
                ],
                access,
                observe,
            ),
            "sqs": Router([sqs], access, observe),
        }
        if options.yaq_listen:
            routers["yaq"] = Router([YaqApp(broker, access)], access, observe)
        return routers

    runtime_options = runtime.RuntimeOptions(
        root=options.root,
        listeners=tuple(listeners),
        workers=options.workers,
        journal=options.journal,
        drain_timeout_s=options.drain_timeout_s,
        limits=options.limits,
        tls=tls,
        loopback_only=protected,
        metrics_max_queues=options.metrics_max_queues,
        log=options.log,
    )
    return runtime.serve(runtime_options, compose, announce)
