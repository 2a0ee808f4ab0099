"""`dirmq token new|hash`: bearer tokens for the credentials file of `dirmq serve
--credentials`, without writing Python (docs/security.md).

`new` makes a random token and prints it with the line that goes into the file (only the
token's SHA-256 is stored there); `hash` prints that line for a token read from stdin (never
from the command line, where `ps` and the shell history would show it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dirmq.errors import InvalidArgument

MIN_TOKEN_CHARS = 20  # a token is only hashed once: it must not be guessable


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("token", help="make a bearer token for the credentials file")
    actions = p.add_subparsers(
        dest="token_command", metavar="ACTION", required=True, help="new or hash"
    )
    new = actions.add_parser(
        "new", help="print a new random token and the token_sha256 line for it"
    )
    new.add_argument(
        "--name", metavar="PRINCIPAL", help="also print the [principals.PRINCIPAL] line"
    )
    new.set_defaults(handler=cmd_new)
    hashed = actions.add_parser(
        "hash", help="print the token_sha256 line of a token read from stdin"
    )
    hashed.set_defaults(handler=cmd_hash)


def cmd_new(args: argparse.Namespace) -> int:
    from dirmq.server.credentials import new_token  # here: cli/__init__.py says why

    token = new_token()
    print("# the token: give it to the client (it is stored nowhere; a lost one is replaced)")
    print(token)
    print("# for the credentials file (dirmq serve --credentials FILE):")
    if args.name:
        print(f"[principals.{args.name}]")
    print(_line(token))
    return 0


def cmd_hash(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgument(
            f"a token must be at least {MIN_TOKEN_CHARS} characters read from stdin (got "
            f"{len(token)}): `dirmq token new` makes a random one"
        )
    print(_line(token))
    return 0


def _line(token: str) -> str:
    from dirmq.server.credentials import token_digest

    return f'token_sha256 = "{token_digest(token)}"'
