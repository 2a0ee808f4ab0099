"""The `dirmq` command: queues and messages of a local root, from the shell.

Every subcommand takes `--root DIR`, before or after its name (default `$DIRMQ_ROOT`, else
`./dirmq-data`). Failures print one line, `dirmq: error: <message>`, on stderr and exit with a
code from `dirmq.cli.exits` (the table is in docs/cli.md); a traceback is printed only for a bug.

    commands    module
    put get ack nack delete peek                    messages.py
    dead-letter redrive                             deadletters.py
    ls stats create configure rm purge sweep        queues.py
    fsck import-vsqs                                maintenance.py
    serve                                           server.py (imports dirmq.server lazily)
    publish subscribe                               pubsub.py
    token new, token hash                           tokens.py
    schedule put|list|show|pause|resume|delete|run  schedules.py

A CLI call's time is mostly imports, paid by every `dirmq get` in a shell loop: so a module
imports at its top only what its parser needs, and the rest of a command's machinery (fsck,
the pub/sub hub, redrive tasks, the credentials) inside the handler that uses it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from dirmq import __version__
from dirmq.cli import (
    deadletters,
    exits,
    maintenance,
    messages,
    pubsub,
    queues,
    schedules,
    server,
    tokens,
)
from dirmq.cli.args import Parser, add_root_option, common_options, describe_commands

__all__ = ["build_parser", "main"]


def build_parser() -> Parser:
    parser = Parser(
        prog="dirmq",
        description="A durable message queue whose storage is plain directories of files.",
        epilog="Exit codes: 0 ok, 1 unexpected error, 2 usage, 3 empty/not found, 4 no such "
        "queue, 5 queue full, 6 storage failure, 7 stale receipt, 8 fsck left problems, "
        "9 duplicate message id, 10 subscription busy.",
    )
    parser.add_argument("--version", action="version", version=f"dirmq {__version__}")
    add_root_option(parser)
    sub = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        parser_class=Parser,
        help="what to do; `dirmq COMMAND --help` describes each",
    )
    common = common_options()
    messages.register(sub, common)
    deadletters.register(sub, common)
    queues.register(sub, common)
    maintenance.register(sub, common)
    pubsub.register(sub, common)
    schedules.register(sub, common)
    server.register(sub, common)
    tokens.register(sub, common)
    describe_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `dirmq` command; return its exit status (never raises for an expected error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else exits.USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        exits.error("interrupted")
        return exits.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`dirmq peek q | head`): stop quietly, and keep Python from
        # failing again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exits.BROKEN_PIPE
    except Exception as exc:
        code = exits.exit_code_for(exc)
        if code is None:
            traceback.print_exc()
            exits.error(f"unexpected {type(exc).__name__}: {exits.describe(exc)}")
            return exits.UNEXPECTED
        exits.error(exits.describe(exc))
        return code
