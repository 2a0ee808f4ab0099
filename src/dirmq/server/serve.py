"""The server's process runtime: listening sockets, worker processes, signals, graceful drain.

It serves whatever the composition root (`dirmq.service`) plugs in: a `Compose` function that
each worker calls with its store, broker and metrics (whose files, `multiprocess.py`, every
worker of the run shares), and that returns a `Router` of dialects per
listener. Nothing here knows a dialect.

With `--workers N` the parent binds the listening ports with SO_REUSEPORT, forks N workers that
each bind their own socket to the same ports (the kernel spreads connections across them), then
only supervises: it forwards SIGTERM/SIGINT and restarts a worker that died (counted in the
metrics: `dirmq_worker_restarts_total`). Each worker is a complete brokerless dirmq process on
the shared root, so workers need no coordination.

With `--tls-cert`/`--tls-key` every listener serves HTTPS: the parent builds and checks the
`ssl.SSLContext` (`tls.py`) before binding anything, and the workers it forks inherit it.

Connections are kept even over the workers by `balance.py` (plain TCP only).

Why it is long: binding, forking, supervising and draining are one sequence over one set of
sockets and children; split up, each part would need the others' state passed around.

SIGTERM drains: the listeners close, waiting long polls are answered (204), requests in
progress finish (up to `drain_timeout_s`), then the process exits. Nothing that got a 2xx
depends on the process surviving: a put is durable before its 201 is sent, so even SIGKILL
loses no acknowledged message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvloop

from dirmq import __version__
from dirmq.errors import CannotListen, InvalidArgument
from dirmq.server import logs
from dirmq.server.addresses import parse_address
from dirmq.server.balance import ConnectionBalance
from dirmq.server.broker import Broker
from dirmq.server.budget import MemoryBudget, WorkerSlots, shared_slots
from dirmq.server.dialect import Router, unique_dialects
from dirmq.server.http import HttpServer
from dirmq.server.http_listener import Limits
from dirmq.server.http_refusals import LINGER_S
from dirmq.server.logs import fields
from dirmq.server.metrics import DEFAULT_MAX_QUEUES, Metrics, worker_restarts
from dirmq.server.multiprocess import MetricsFiles
from dirmq.server.notify import forget_notify_socket, notify
from dirmq.server.queuecounts import QueueCounts
from dirmq.server.tls import TlsFiles, requires_client_certificate, server_context
from dirmq.store import Store, holders
from dirmq.store.census import Census

BACKLOG = 4096
FULL_COLLECTION_EVERY = 100  # middle-generation collections (Python's default: 10)
log = logging.getLogger("dirmq.server")
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
# A SIGTERM or SIGINT that came before the event loop listened for them (right after READY=1
# or a fork): the worker stops, drained, as soon as it listens.
_stop_requested = False


def _remember_stop(_signum: int, _frame: object) -> None:
    global _stop_requested
    _stop_requested = True


def _catch_stop_early() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _remember_stop)


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # the API it serves, as messages name it ("native", "yaq", "sqs")
    address: str  # HOST:PORT


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    root: str
    listeners: tuple[Listener, ...]
    workers: int = 1
    journal: bool = True  # the Store's commit journal (store/journal.py; `--no-journal`)
    drain_timeout_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    tls: TlsFiles | None = None  # HTTPS on every listener
    loopback_only: bool = False  # protected mode: connections from other hosts are turned away
    metrics_max_queues: int = DEFAULT_MAX_QUEUES  # queues with depth series of their own
    log: logs.LogSettings | None = None  # None: logging is left as the caller set it up


@dataclass(frozen=True, slots=True)
class Worker:
    """What one worker process's dialects share."""

    store: Store
    broker: Broker
    metrics: Metrics
    # The server run's private directory (0700; removed at exit), shared by every worker: the
    # metrics' files, and beside them what else the workers share (the console's samples).
    run_dir: str


Compose = Callable[[Worker], dict[str, Router]]  # a Router for each listener, by name


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class _Endpoint:
    name: str
    host: str
    port: int
    sock: socket.socket

    def url(self, scheme: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"


def _bind_all(options: RuntimeOptions) -> list[_Endpoint]:
    """Bind every address (all checked first), or none: `CannotListen` names the one that
    failed and why (in use, not an address of this host, a privileged port...)."""
    parsed = [(ls.name, ls.address, *parse_address(ls.address)) for ls in options.listeners]
    endpoints: list[_Endpoint] = []
    try:
        for name, address, host, port in parsed:
            try:
                sock = _listen(host, port, reuse_port=options.workers > 1)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise CannotListen(f"cannot listen on {address} ({name} API): {reason}") from exc
            endpoints.append(_Endpoint(name, host, sock.getsockname()[1], sock))
    except BaseException:
        _close(endpoints)
        raise
    return endpoints


def _close(endpoints: list[_Endpoint]) -> None:
    for endpoint in endpoints:
        endpoint.sock.close()


async def run_worker(
    options: RuntimeOptions,
    compose: Compose,
    endpoints: list[_Endpoint],
    metrics_files: MetricsFiles,
    budget_slots: WorkerSlots | None = None,
    worker: int = 0,
    tls: ssl.SSLContext | None = None,
    balance: ConnectionBalance | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain. `metrics_files`: the run's metrics directory,
    active (`multiprocess.py`). `budget_slots`: the body budget's slots shared by every worker
    (`budget.py`); this worker's is `worker`. `tls`: HTTPS on every listener. `balance`: the
    workers' connections kept even (`balance.py`)."""
    loop = asyncio.get_running_loop()
    census = Census(options.root)  # the metrics', the console's and its sampler's
    metrics = Metrics(
        metrics_files,
        options.root,
        max_queues=options.metrics_max_queues,
        worker=worker,
        census=census,
    )
    queue_counts = QueueCounts()  # by queue: the console's samples read them
    holders.set_program(f"dirmq serve worker {worker}")  # who holds its leases (FORMAT.md)
    store = Store(
        options.root, events=queue_counts.events(metrics.events()), journal=options.journal
    )
    broker = Broker(store, counts=metrics, queue_counts=queue_counts, census=census)
    routers = compose(Worker(store, broker, metrics, metrics_files.path))
    dialects = unique_dialects(list(routers.values()))
    broker.start()
    metrics.start()
    for dialect in dialects:
        dialect.start()
    http_servers: list[HttpServer] = []
    listeners: list[asyncio.Server] = []
    # One for every listener, and with several workers one for the whole server.
    budget = MemoryBudget(options.limits.max_body_memory_bytes, budget_slots, worker)
    for endpoint in endpoints:
        router = routers[endpoint.name]
        http = HttpServer(
            router,
            options.limits,
            router.fast,
            budget=budget,
            body_check=router.body_check,
            body_sink=router.body_sink,
            observe=router.observe,
            scheme="https" if tls else "http",
            require_client_certificate=requires_client_certificate(tls),
            loopback_only=options.loopback_only,
        )
        http.balance = balance
        http.listener = len(http_servers)
        http_servers.append(http)
        listeners.append(
            await loop.create_server(
                http.protocol, sock=endpoint.sock, backlog=BACKLOG, **_tls_arguments(tls, options)
            )
        )
    passed: set[asyncio.Task[Any]] = set()

    def serve_passed(
        listener: int, sock: socket.socket, received: bytes, arrived: Callable[[], None]
    ) -> None:
        # A connection another worker accepted and passed on, served as if accepted here.
        http = http_servers[listener]
        task = loop.create_task(
            loop.connect_accepted_socket(lambda: http.passed_protocol(received, arrived), sock)
        )
        passed.add(task)
        task.add_done_callback(functools.partial(settled, arrived))

    def settled(arrived: Callable[[], None], task: asyncio.Task[Any]) -> None:
        # A client gone before its connection was set up here: nothing to serve, nothing to log.
        passed.discard(task)
        if task.cancelled() or task.exception() is not None:
            arrived()  # never counted here: no longer on its way either

    if balance is not None:
        balance.attach(worker, loop, serve_passed)
    stop = asyncio.Event()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    # A forked worker holds the stop signals back from its fork until here (`spawn`): one that
    # came while the handlers changed hands was run by whichever Python handler was in place
    # when Python got to it, and uvloop's no-op one (it hears signals through its wakeup fd)
    # dropped it: the worker served on, never stopped (a stop right after READY hung 1 time
    # in ~40). Held back, it waits in the kernel and reaches the loop now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    if _stop_requested:
        stop.set()
    # Everything imported and built so far lives as long as the process: out of the collector's
    # sight, a full collection under load walks only what requests allocate.
    gc.freeze()
    # A full collection walks every object alive: under a burst of thousands of long polls
    # (their connections, queues, waiters) 0.1-0.4 s each on a busy 2-core VM, the loop stopped
    # and a publish waiting behind it (1.3-2 s late). One every 100 middle-generation
    # collections, not 10; the young ones still take what requests leave behind.
    gc.set_threshold(*gc.get_threshold()[:2], FULL_COLLECTION_EVERY)
    if options.workers > 1:
        log.info("worker %d serving", worker, extra=fields(worker=worker, pid=os.getpid()))
    await stop.wait()
    began = time.monotonic()
    notify("STOPPING=1", "STATUS=draining")  # a no-op in a forked worker
    connections = sum(len(h.connections) for h in http_servers)
    log.info(
        "draining",
        extra=fields(
            worker=worker, connections=connections, drain_timeout_s=options.drain_timeout_s
        ),
    )
    if balance is not None:
        balance.leave()
        balance.take_waiting(serve_passed)  # passed on before we left: drained like the rest
        await asyncio.gather(*passed, return_exceptions=True)
    for listener in listeners:
        listener.close()
    # Dialects first (event streams end, held deliveries go back) while the pool still runs.
    await asyncio.gather(*(dialect.close() for dialect in dialects))
    broker.close()  # waiting long polls answer now
    cut = sum(await asyncio.gather(*(h.drain(options.drain_timeout_s) for h in http_servers)))
    metrics.close()
    store.close()
    drained = fields(worker=worker, seconds=round(time.monotonic() - began, 3), cut=cut)
    if cut:
        log.warning("drain timed out: %d connections cut mid-request", cut, extra=drained)
    else:
        log.info("drained", extra=drained)


def _tls_arguments(tls: ssl.SSLContext | None, options: RuntimeOptions) -> dict[str, Any]:
    """`create_server`'s TLS arguments. The handshake is part of the request head: it gets the
    head's time (not uvloop's 60 s, which would let silent sockets sit unseen by the connection
    limit). Closing waits for the client's close_notify (reading and dropping what it still
    sends, as the plain-TCP linger after a refusal does) only LINGER_S, not uvloop's 30 s: an
    idle keep-alive client never answers, and every connection closed on drain would wait."""
    if tls is None:
        return {}
    return {
        "ssl": tls,
        "ssl_handshake_timeout": max(options.limits.header_timeout_s, 1.0),
        "ssl_shutdown_timeout": LINGER_S,
    }


def serve(
    options: RuntimeOptions, compose: Compose, announce: Callable[[str], None] = print
) -> int:
    """Run the server in the foreground; returns the exit status."""
    if options.log is not None:
        logs.configure(options.log)
    if options.workers < 1:
        raise InvalidArgument("--workers must be at least 1")
    limits = options.limits
    if limits.max_body_memory_bytes < limits.max_body_bytes:
        # Else a body under the size limit could never fit: a 503 that no retry cures.
        raise InvalidArgument(
            f"--max-body-memory ({limits.max_body_memory_bytes}) must be at least "
            f"--max-body-bytes ({limits.max_body_bytes})"
        )
    # Before binding: a bad certificate or key must leave nothing behind, and say so first.
    tls = server_context(options.tls) if options.tls is not None else None
    endpoints = _bind_all(options)  # before the root: a busy port must leave nothing behind
    try:
        Store(options.root)  # create the root now, so a bad path fails before we announce
    except BaseException:
        _close(endpoints)
        raise
    scheme = "https" if tls else "http"
    for endpoint in endpoints:
        announce(f"dirmq {endpoint.name} API listening on {endpoint.url(scheme)}")
    root = os.path.abspath(options.root)
    workers = f"{options.workers} worker{'s' if options.workers > 1 else ''}"
    announce(f"storing queues under {root} ({workers})")
    sys.stdout.flush()
    log.info(
        "started",
        extra=fields(
            version=__version__,
            **{f"{e.name}_url": e.url(scheme) for e in endpoints},
            root=root,
            workers=options.workers,
            pid=os.getpid(),
        ),
    )
    urls = ", ".join(f"{e.name} {e.url(scheme)}" for e in endpoints)
    _catch_stop_early()  # from now on a stop drains, even before the event loop runs
    notify("READY=1", f"STATUS=serving {urls} ({workers})", f"MAINPID={os.getpid()}")
    # Before any metric is made, and before the workers are forked: they all write there.
    with MetricsFiles.create() as metrics_files:
        if options.workers == 1:
            uvloop.run(run_worker(options, compose, endpoints, metrics_files, tls=tls))
            status = 0
        else:
            status = _supervise(options, compose, endpoints, metrics_files, tls)
    log.info("stopped", extra=fields(status=status))
    return status


def _supervise(
    options: RuntimeOptions,
    compose: Compose,
    endpoints: list[_Endpoint],
    metrics_files: MetricsFiles,
    tls: ssl.SSLContext | None,
) -> int:
    children: dict[int, int] = {}  # pid -> worker number
    stopping = False
    budget_slots = shared_slots(options.workers)
    # TLS connections are never passed on (balance.py): their handshake comes first.
    balance = ConnectionBalance(options.workers) if tls is None else None
    # In the supervisor's own file of the run's metrics directory: any worker's scrape reads it.
    restarts = worker_restarts()

    def spawn(number: int) -> None:
        # Signals wait during the fork: a child must not run the parent's `forward`.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            raise
        if pid == 0:  # the child keeps them blocked (its threads too) until its loop listens
            _catch_stop_early()
        else:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if pid == 0:  # the worker
            forget_notify_socket()  # systemd hears its main process only
            if options.log is not None:
                logs.configure(options.log)
            own = (
                endpoints
                if number == 0
                else [
                    _Endpoint(e.name, e.host, e.port, _listen(e.host, e.port, reuse_port=True))
                    for e in endpoints
                ]
            )
            code = 0
            try:
                uvloop.run(
                    run_worker(
                        options, compose, own, metrics_files, budget_slots, number, tls, balance
                    )
                )
            except BaseException:  # a worker must never return into the parent's code
                code = 1
            logs.flush()  # os._exit skips logging's own flush at exit
            os._exit(code)
        children[pid] = number

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        if not stopping:
            notify("STOPPING=1", "STATUS=draining")
            log.info("stopping %d workers", len(children), extra=fields(signal=signum))
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for number in range(options.workers):
        spawn(number)
    if _stop_requested or stopping:  # before or while they were forked: tell every one
        forward(signal.SIGTERM, None)
    status = 0
    while children:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        number = children.pop(pid)
        metrics_files.process_dead(pid)  # its live gauges go; its counts stay
        if not stopping:
            try:
                restarts.inc()  # before the new worker answers a scrape
            except Exception:  # a metrics failure (a full /dev/shm) must not stop a restart
                log.exception("counting a worker restart failed")
            log.error(
                "worker %d died (%s): restarting it",
                number,
                _exit_reason(wait_status),
                extra=fields(worker=number, pid=pid),
            )
            time.sleep(0.1)  # a worker crashed: replace it
            budget_slots[number] = 0  # what it held died with it
            spawn(number)
        elif os.waitstatus_to_exitcode(wait_status) != 0:
            status = 1
    return status


def _exit_reason(wait_status: int) -> str:
    if os.WIFSIGNALED(wait_status):
        return f"killed by {signal.strsignal(os.WTERMSIG(wait_status))}"
    return f"exit status {os.waitstatus_to_exitcode(wait_status)}"
