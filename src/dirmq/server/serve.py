"""The server's process runtime: listening sockets, worker processes, signals, graceful drain.

It serves whatever the composition root (`dirmq.service`) plugs in: a `Compose` function that
each worker calls with its store, broker and metrics (whose files, `multiprocess.py`, every
worker of the run shares), and that returns a `Router` of dialects per
listener. Nothing here knows a dialect.

With `--workers N` the parent binds the listening ports with SO_REUSEPORT, forks N workers that
each bind their own socket to the same ports (the kernel spreads connections across them), then
only supervises: it forwards SIGTERM/SIGINT and restarts a worker that died. Each worker is a
complete brokerless dirmq process on the shared root, so workers need no coordination.

With `--tls-cert`/`--tls-key` every listener serves HTTPS: the parent builds and checks the
`ssl.SSLContext` (`tls.py`) before binding anything, and the workers it forks inherit it.

SIGTERM drains: the listeners close, waiting long polls are answered (204), requests in
progress finish (up to `drain_timeout_s`), then the process exits. Nothing that got a 2xx
depends on the process surviving: a put is durable before its 201 is sent, so even SIGKILL
loses no acknowledged message.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import os
import re
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvloop

from dirmq.errors import CannotListen, InvalidArgument
from dirmq.server.broker import Broker
from dirmq.server.budget import MemoryBudget, WorkerSlots, shared_slots
from dirmq.server.dialect import Router, unique_dialects
from dirmq.server.http import LINGER_S, HttpServer, Limits
from dirmq.server.metrics import DEFAULT_MAX_QUEUES, Metrics
from dirmq.server.multiprocess import MetricsFiles
from dirmq.server.tls import TlsFiles, requires_client_certificate, server_context
from dirmq.store import Store

BACKLOG = 4096


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # the API it serves, as messages name it ("native", "yaq", "sqs")
    address: str  # HOST:PORT


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    root: str
    listeners: tuple[Listener, ...]
    workers: int = 1
    drain_timeout_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    tls: TlsFiles | None = None  # HTTPS on every listener
    loopback_only: bool = False  # protected mode: connections from other hosts are turned away
    metrics_max_queues: int = DEFAULT_MAX_QUEUES  # queues with depth series of their own


@dataclass(frozen=True, slots=True)
class Worker:
    """What one worker process's dialects share."""

    store: Store
    broker: Broker
    metrics: Metrics


Compose = Callable[[Worker], dict[str, Router]]  # a Router for each listener, by name


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[v6]:PORT` or `:PORT` (all interfaces); port 0 picks a free port.
    `InvalidArgument` says what is wrong with anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not port:
        raise InvalidArgument(
            f"listen address {text!r} must be HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080 or :8080)"
        )
    if not (port.isascii() and port.isdigit()):
        raise InvalidArgument(f"listen address {text!r}: port {port!r} is not a number")
    if int(port) > 65535:
        raise InvalidArgument(
            f"listen address {text!r}: port {int(port)} is out of range "
            "(1-65535, or 0 for any free port)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ip(host, 6):
            raise InvalidArgument(f"listen address {text!r}: [{host}] is not an IPv6 address")
    host = host or "0.0.0.0"
    if not (_is_ip(host, 4) or _is_ip(host, 6) or _is_host_name(host)):
        raise InvalidArgument(
            f"listen address {text!r}: {host!r} is not an IP address or a host name"
        )
    return host, int(port)


def _is_ip(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host).version == version
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """Whether listening on `host` (as `parse_address` returns it) reaches this host only: a
    loopback address, or a name all of whose addresses are loopback ones. A name that does not
    resolve is left to the bind to report."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return True
    addresses = {str(info[4][0]).partition("%")[0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _is_host_name(host: str) -> bool:
    labels = host.rstrip(".").split(".")
    if all(label.isdigit() for label in labels):
        return False  # a malformed IPv4 address (999.1.1.1), not a name
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


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
) -> None:
    """Serve until SIGTERM/SIGINT, then drain. `metrics_files`: the run's metrics directory,
    active (`multiprocess.py`). `budget_slots`: the body budget's slots shared by every worker
    (`budget.py`); this worker's is `worker`. `tls`: HTTPS on every listener."""
    loop = asyncio.get_running_loop()
    metrics = Metrics(
        metrics_files, options.root, max_queues=options.metrics_max_queues, worker=worker
    )
    store = Store(options.root, on_quarantine=metrics.quarantined)
    broker = Broker(store, counts=metrics)
    routers = compose(Worker(store, broker, metrics))
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
            observe=router.observe,
            scheme="https" if tls else "http",
            require_client_certificate=requires_client_certificate(tls),
            loopback_only=options.loopback_only,
        )
        http_servers.append(http)
        listeners.append(
            await loop.create_server(
                http.protocol, sock=endpoint.sock, backlog=BACKLOG, **_tls_arguments(tls, options)
            )
        )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Everything imported and built so far lives as long as the process: out of the collector's
    # sight, a full collection under load walks only what requests allocate.
    gc.freeze()
    await stop.wait()
    for listener in listeners:
        listener.close()
    # Dialects first (event streams end, held deliveries go back) while the pool still runs.
    await asyncio.gather(*(dialect.close() for dialect in dialects))
    broker.close()  # waiting long polls answer now
    await asyncio.gather(*(h.drain(options.drain_timeout_s) for h in http_servers))
    metrics.close()
    store.close()


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
    announce(
        f"storing queues under {os.path.abspath(options.root)} "
        f"({options.workers} worker{'s' if options.workers > 1 else ''})"
    )
    sys.stdout.flush()
    # Before any metric is made, and before the workers are forked: they all write there.
    with MetricsFiles.create() as metrics_files:
        if options.workers == 1:
            uvloop.run(run_worker(options, compose, endpoints, metrics_files, tls=tls))
            return 0
        return _supervise(options, compose, endpoints, metrics_files, tls)


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

    def spawn(number: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
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
                    run_worker(options, compose, own, metrics_files, budget_slots, number, tls)
                )
            except BaseException:  # a worker must never return into the parent's code
                code = 1
            os._exit(code)
        children[pid] = number

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for number in range(options.workers):
        spawn(number)
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
            time.sleep(0.1)  # a worker crashed: replace it
            budget_slots[number] = 0  # what it held died with it
            spawn(number)
        elif os.waitstatus_to_exitcode(wait_status) != 0:
            status = 1
    return status
