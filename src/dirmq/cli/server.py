"""`dirmq serve`: the HTTP server on the same root the library and the CLI use."""

from __future__ import annotations

import argparse
from typing import Any

from dirmq.cli.args import count, seconds
from dirmq.store import default_root


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "serve",
        parents=[common],
        help="run the HTTP server (native API; yaq with --yaq-listen)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="native API address (default 127.0.0.1:8080; port 0 picks a free one)",
    )
    p.add_argument(
        "--yaq-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve the yaq dialect on this address",
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
        type=seconds,
        default=10.0,
        metavar="S",
        help="on SIGTERM, how long requests in progress may take to finish",
    )
    p.add_argument("--max-connections", type=count, default=20_000, metavar="N")
    p.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from dirmq.server.http import Limits
    from dirmq.server.serve import ServeOptions, serve

    options = ServeOptions(
        root=args.root or default_root(),
        listen=args.listen,
        yaq_listen=args.yaq_listen,
        workers=args.workers,
        drain_timeout_s=args.drain_timeout,
        limits=Limits(max_connections=args.max_connections),
    )
    return serve(options)
