"""`dirmq serve`: the HTTP server on the same root the library and the CLI use.

Every option can also come from `--config FILE` (TOML) or a DIRMQ_* variable (`config.py`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from dirmq.cli import config
from dirmq.cli.args import count, duration, listen_address, size
from dirmq.server.logforms import FORMATS, LEVELS
from dirmq.sqs.deleted import WINDOW_S
from dirmq.store.root import DEFAULT_ROOT


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve",
        parents=[common],
        help="run the HTTP server (native API; yaq with --yaq-listen)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="read settings from this TOML file (keys: the long options without the dashes; "
        "flags win over DIRMQ_* variables, which win over the file); default $DIRMQ_CONFIG",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resulting configuration (as a --config file, secrets masked) and exit",
    )
    p.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="native API address (default 127.0.0.1:8080; port 0 picks a free one)",
    )
    p.add_argument(
        "--yaq-listen",
        type=listen_address,
        default=None,
        metavar="HOST:PORT",
        help="also serve the yaq dialect on this address",
    )
    p.add_argument(
        "--sqs-listen",
        type=listen_address,
        default=None,
        metavar="HOST:PORT",
        help="also serve the Amazon SQS API on a port of its own (it is always served on "
        "--listen too)",
    )
    access = p.add_argument_group("who may do what (docs/security.md)")
    access.add_argument(
        "--credentials",
        default=None,
        metavar="FILE",
        help="principals, their tokens (as SHA-256) or AWS keys, and their permissions by queue "
        "name pattern (TOML); every request must then carry credentials on every door",
    )
    access.add_argument(
        "--sqs-credentials",
        default=None,
        metavar="FILE",
        help="legacy: lines 'ACCESS_KEY_ID SECRET_ACCESS_KEY' (# comments); each key may do "
        "anything, signing (SigV4) or sending its secret as a token",
    )
    access.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="without credentials, listen on addresses other hosts can reach all the same "
        "(default: refused, and only this host's clients are served: protected mode)",
    )
    p.add_argument(
        "--sqs-delay-recently-deleted",
        action="store_true",
        help="refuse SQS CreateQueue of a name deleted less than 60 s ago "
        "(QueueDeletedRecently), as AWS does; default: allow it at once",
    )
    p.add_argument(
        "--no-journal",
        action="store_true",
        help="flush each durable publish's files and directories instead of committing it "
        'through the commit journal (one fdatasync a group; docs/FORMAT.md, "The commit '
        'journal"); the root then stays readable by dirmq versions of format 5',
    )
    p.add_argument(
        "--workers",
        type=count,
        default=1,
        metavar="N",
        help="worker processes sharing the port (SO_REUSEPORT); default 1",
    )
    p.add_argument(
        "--drain-timeout",
        type=duration,
        default=10.0,
        metavar="DUR",
        help="on SIGTERM, how long requests in progress may take to finish (default 10s)",
    )
    tls = p.add_argument_group("TLS (HTTPS on every listener; see docs/security.md)")
    tls.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate (then any intermediates); needs --tls-key",
    )
    tls.add_argument(
        "--tls-key", default=None, metavar="FILE", help="the certificate's PEM private key"
    )
    tls.add_argument(
        "--tls-client-ca",
        default=None,
        metavar="FILE",
        help="require client certificates signed by a CA in this PEM file (mutual TLS)",
    )
    p.add_argument(
        "--metrics-max-queues",
        type=count,
        default=None,
        metavar="N",
        help="/metrics gives depth series of their own to the N deepest queues at most; all "
        "are in the totals, /metrics?queue=NAME gives any one (default 1000)",
    )
    p.add_argument(
        "--sample-interval",
        type=duration,
        default=None,
        metavar="DUR",
        help="how often the server samples every queue's depth and rates for the console's "
        "charts (an hour of them is kept; whole seconds, 1s to 10m; default 10s)",
    )
    logging = p.add_argument_group("logs (stderr, or --log-file)")
    logging.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="the least severe records written (default info: start-up, shutdown, a line per "
        "request, sweeps that moved messages)",
    )
    logging.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text (a line of key=value fields) or json (an object per line); default text",
    )
    logging.add_argument(
        "--log-file",
        default=None,
        metavar="FILE",
        help="append to FILE instead of stderr (reopened when moved, for logrotate)",
    )
    logging.add_argument(
        "--access-log",
        choices=("on", "off"),
        default="off",
        help="a line per request at level info (default off: it costs a CPU-bound server "
        "about a quarter of its requests per second)",
    )
    limits = p.add_argument_group("limits that protect the server from its clients")
    limits.add_argument(
        "--max-connections",
        type=count,
        default=20_000,
        metavar="N",
        help="open connections beyond this get 503 (default 20000)",
    )
    limits.add_argument(
        "--max-body-bytes",
        type=size,
        default=64 * 1024 * 1024,
        metavar="SIZE",
        help="larger request bodies get 413: bytes, or with a unit (10MB, 64MiB; default 64MiB)",
    )
    limits.add_argument(
        "--max-body-memory",
        type=size,
        default=None,
        metavar="SIZE",
        help="request bodies held in memory at once, summed over every connection of every "
        "worker; a body that does not fit gets 503 + Retry-After before it is read (default "
        "a quarter of RAM, at most 512MiB, at least --max-body-bytes)",
    )
    limits.add_argument(
        "--max-header-bytes",
        type=size,
        default=16 * 1024,
        metavar="SIZE",
        help="a larger request line + headers gets 431 (default 16KiB)",
    )
    limits.add_argument(
        "--header-timeout",
        type=duration,
        default=10.0,
        metavar="DUR",
        help="a request head slower than this gets 408 (default 10s)",
    )
    limits.add_argument(
        "--body-timeout",
        type=duration,
        default=60.0,
        metavar="DUR",
        help="a request body slower than this gets 408 (default 60s)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=duration,
        default=75.0,
        metavar="DUR",
        help="idle keep-alive connections are closed after this (default 75s)",
    )
    p.set_defaults(handler=cmd_serve)
    config.layer(p, defaults={"root": DEFAULT_ROOT})  # last: it covers every option above


def cmd_serve(args: argparse.Namespace) -> int:
    from dirmq.console.samples import DEFAULT_INTERVAL_S
    from dirmq.server.budget import default_body_memory_bytes
    from dirmq.server.http_listener import Limits
    from dirmq.server.logs import LogSettings
    from dirmq.server.metrics import DEFAULT_MAX_QUEUES
    from dirmq.service import ServeOptions, serve

    values = config.resolve(args, os.environ)
    if args.print_config:
        print(config.render(values), end="")
        return 0
    options = ServeOptions(
        root=args.root,
        listen=args.listen,
        yaq_listen=args.yaq_listen,
        sqs_listen=args.sqs_listen,
        credentials=args.credentials,
        sqs_credentials=args.sqs_credentials,
        allow_anonymous=args.allow_anonymous,
        sqs_deleted_wait_s=WINDOW_S if args.sqs_delay_recently_deleted else None,
        workers=args.workers,
        journal=not args.no_journal,
        drain_timeout_s=args.drain_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        metrics_max_queues=(
            DEFAULT_MAX_QUEUES if args.metrics_max_queues is None else args.metrics_max_queues
        ),
        sample_interval_s=(
            DEFAULT_INTERVAL_S if args.sample_interval is None else args.sample_interval
        ),
        limits=Limits(
            max_connections=args.max_connections,
            max_body_bytes=args.max_body_bytes,
            max_body_memory_bytes=args.max_body_memory
            or max(default_body_memory_bytes(), args.max_body_bytes),
            max_header_bytes=args.max_header_bytes,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            idle_timeout_s=args.idle_timeout,
        ),
        log=LogSettings(
            level=args.log_level,
            format=args.log_format,
            file=args.log_file,
            access=args.access_log == "on",
        ),
    )
    return serve(options)
