"""Commands on messages: put, get, ack, nack, delete, peek.

Bodies travel as raw bytes (stdin and `sys.stdout.buffer`), so any binary payload round-trips
exactly. `get` writes the body before it acknowledges (`--ack`): if the output cannot be written,
the message is not lost but returns to its FIFO place when the lease ends.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any

from dirmq.cli import exits
from dirmq.cli.args import count, duration, open_store, queue_name
from dirmq.errors import InvalidArgument, MessageNotFound, QueueNotFound
from dirmq.store import Message
from dirmq.store.message import LeaseHolder
from dirmq.wire.messages import dead_json, holder_json

_PREVIEW_CHARS = 48
_RECEIPT_HELP = "the receipt `get` printed on stderr (or in its --json output)"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the message commands to the subparsers action `sub`."""
    p = sub.add_parser("put", parents=[common], help="publish stdin as one message, print its id")
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to publish to")
    p.add_argument(
        "--header",
        action="append",
        type=header,
        default=[],
        metavar="NAME:VALUE",
        help="a message header (repeatable)",
    )
    p.add_argument("--content-type", metavar="TYPE", help="the Content-Type header")
    p.add_argument(
        "--delay",
        type=duration,
        metavar="DUR",
        help="deliver after DUR (e.g. 2.5, 150ms, 1h2m; default: the queue's delay)",
    )
    p.add_argument(
        "--timeout",
        type=duration,
        metavar="DUR",
        help="at capacity, wait at most DUR for room (default: as long as it takes)",
    )
    p.add_argument(
        "--ttl",
        type=duration,
        metavar="DUR",
        help="not delivered within DUR of now: dead-lettered or dropped (default: the queue's)",
    )
    p.add_argument(
        "--priority",
        type=count,
        default=0,
        metavar="N",
        help="its priority: 0 (the default, lowest) to the queue's priority_levels - 1",
    )
    p.add_argument("--create", action="store_true", help="create the queue if it does not exist")
    p.set_defaults(handler=cmd_put)

    p = sub.add_parser(
        "get", parents=[common], help="receive one message: body to stdout, receipt to stderr"
    )
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to receive from")
    p.add_argument(
        "--wait",
        type=duration,
        default=0.0,
        metavar="DUR",
        help="wait up to DUR for a message (e.g. 2s, 500ms; default: 0, do not wait)",
    )
    p.add_argument(
        "--visibility",
        type=duration,
        metavar="DUR",
        help="lease length (default: the queue's visibility timeout)",
    )
    p.add_argument("--ack", action="store_true", help="acknowledge at once (after printing)")
    p.add_argument("--json", action="store_true", help="print the whole message as JSON")
    p.set_defaults(handler=cmd_get)

    p = sub.add_parser("ack", parents=[common], help="acknowledge (delete) a received message")
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue it came from")
    p.add_argument("receipt", metavar="RECEIPT", help=_RECEIPT_HELP)
    p.set_defaults(handler=cmd_ack)

    p = sub.add_parser("nack", parents=[common], help="give a received message back")
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue it came from")
    p.add_argument("receipt", metavar="RECEIPT", help=_RECEIPT_HELP)
    p.add_argument(
        "--delay",
        type=duration,
        default=0.0,
        metavar="DUR",
        help="make it ready again after DUR (e.g. 30s; default: at once)",
    )
    p.set_defaults(handler=cmd_nack)

    p = sub.add_parser("delete", parents=[common], help="delete a message by id, in any state")
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue holding it")
    p.add_argument("id", metavar="ID", help="the message id `put` printed")
    p.set_defaults(handler=cmd_delete)

    p = sub.add_parser(
        "peek",
        parents=[common],
        help="show a message by id, or the oldest ready (or dead) ones, without leasing",
    )
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to look into")
    p.add_argument(
        "id", nargs="?", metavar="ID", help="show this message only (default: the oldest ready)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=10,
        metavar="N",
        help="without ID: show at most N messages (default: 10)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per message and line")
    p.add_argument(
        "--state",
        choices=("ready", "in_flight", "delayed", "dead"),
        default="ready",
        help="without ID: which messages (default: ready; dead: the queue's own dead area)",
    )
    p.add_argument(
        "--dead",
        dest="state",
        action="store_const",
        const="dead",
        help="without ID: the queue's own dead area, with why each died (--state dead)",
    )
    p.set_defaults(handler=cmd_peek)


def header(text: str) -> tuple[str, str]:
    """`NAME:VALUE` (spaces around the value are dropped, as in HTTP)."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:VALUE")
    return name.strip(), value.strip()


def _how_to_create(exc: QueueNotFound, name: str) -> QueueNotFound:
    """Often a new user's first `put` fails so: say what makes a queue (and a root)."""
    if exc.queue is None:  # the root is not a dirmq root
        return QueueNotFound(
            f"{exc}: `dirmq create {name}` creates the queue (and the root), or publish with "
            "`put --create`"
        )
    return QueueNotFound(
        f"queue {name!r} does not exist: `dirmq create {name}` creates it, or publish with "
        "`put --create`"
    )


def cmd_put(args: argparse.Namespace) -> int:
    headers = dict(args.header)
    if len(headers) != len(args.header):
        raise InvalidArgument("a header is given twice")
    if args.content_type is not None:
        if any(name.lower() == "content-type" for name in headers):
            raise InvalidArgument("Content-Type is given twice (--content-type and --header)")
        headers["Content-Type"] = args.content_type
    name: str = args.queue
    try:
        store = open_store(args, create=args.create)
    except QueueNotFound as exc:
        raise _how_to_create(exc, name) from exc
    with store:
        try:
            queue = store.create_queue(name) if args.create else store.queue(name)
        except QueueNotFound as exc:
            raise _how_to_create(exc, name) from exc
        # Read only once the queue is known to exist, so a typo fails before stdin is consumed.
        body = sys.stdin.buffer.read()
        message_id = queue.put(
            body,
            headers,
            delay_s=args.delay,
            timeout_s=args.timeout,
            ttl_s=args.ttl,
            priority=args.priority,
        )
    print(message_id)
    return exits.OK


def cmd_get(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        queue = store.queue(args.queue)
        message = queue.get_one(visibility_s=args.visibility, wait_s=args.wait)
        if message is None:
            exits.error(f"queue {args.queue!r} is empty")
            return exits.EMPTY
        if args.json:
            _print_json(message_json(message))
        else:
            body = message.body
            if body and not body.endswith(b"\n") and sys.stdout.isatty():
                # The id or receipt follows on stderr: on a terminal it would run into the body.
                # Piped or redirected, the bytes stay exact.
                body += b"\n"
            sys.stdout.buffer.write(body)
            sys.stdout.buffer.flush()
        assert message.receipt is not None  # a leased message always has one
        if args.ack:
            queue.ack(message.receipt)
        if not args.json:
            print(message.id if args.ack else message.receipt, file=sys.stderr)
    return exits.OK


def cmd_ack(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.queue(args.queue).ack(args.receipt)
    return exits.OK


def cmd_nack(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        queue = store.queue(args.queue)
        outcome = queue.nack(args.receipt, delay_s=args.delay)
        if outcome == "dead-lettered":  # said, since the message is not coming back
            where = queue.config.dead_letter_queue or "its own dead area (dirmq peek --dead)"
            print(f"dirmq: dead-lettered (max_receives reached): now in {where}", file=sys.stderr)
    return exits.OK


def cmd_delete(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if not store.queue(args.queue).delete(args.id):
            raise MessageNotFound(f"no message {args.id} in queue {args.queue!r}")
    return exits.OK


def cmd_peek(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidArgument(f"--limit must be at least 1, got {args.limit}")
    with open_store(args) as store:
        queue = store.queue(args.queue)
        if args.id is not None:
            message = queue.peek(args.id)
            if args.json:
                _print_json(message_json(message))
            else:
                sys.stdout.buffer.write(message.body)
                sys.stdout.buffer.flush()
            return exits.OK
        state = "leased" if args.state == "in_flight" else args.state
        dead, leased = state == "dead", state == "leased"
        for shown, message in enumerate(queue.browse(args.limit, state=state)):
            if args.json:
                _print_json(message_json(message))
                continue
            if not shown:
                why = f"  {'REASON':<12}  {'FROM':<16}" if dead else ""
                why += f"  {'HOLDER':<32}" if leased else ""
                print(f"{'ID':<29}  {'RECEIVES':>8}  {'BYTES':>9}  {'AGE_S':>9}{why}  BODY")
            age_s = max(0.0, time.time() - message.published_at_s)
            why = ""
            if dead:
                known = message.dead  # None: dead-lettered before dirmq kept why
                reason, source = ("?", "?") if known is None else (known.reason, known.source)
                why = f"  {reason:<12}  {source:<16}"
            if leased:
                why = f"  {holder_cell(message.holder):<32}"
            print(
                f"{message.id:<29}  {message.receive_count:>8}  {len(message.body):>9}  "
                f"{age_s:>9.1f}{why}  {preview(message.body)}"
            )
    return exits.OK


def body_json(body: bytes) -> dict[str, str]:
    """`body` and `body_encoding` fields: UTF-8 text when the body is valid UTF-8, else base64."""
    try:
        return {"body": body.decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}


def message_json(message: Message) -> dict[str, object]:
    """A message as JSON (see `body_json` for the body)."""
    return {
        "id": message.id,
        "receipt": message.receipt,
        "receive_count": message.receive_count,
        **({"priority": message.priority} if message.priority else {}),
        "state": message.state,
        "published_at_s": message.published_at_s,
        "lease_deadline_s": message.lease_deadline_s,
        "headers": message.headers,
        **({} if message.dead is None else {"dead": dead_json(message.dead)}),
        **({} if message.holder is None else {"holder": holder_json(message.holder)}),
        **body_json(message.body),
    }


def holder_cell(holder: LeaseHolder | None) -> str:
    """Who holds a lease in one word: `label/pid@host` (the program for a label), or
    `unknown` (docs/FORMAT.md, "Lease holders")."""
    if holder is None or not holder.known:
        return "unknown"
    who = holder.label or holder.program or "?"
    return f"{who}/{holder.pid if holder.pid is not None else '?'}@{holder.host or '?'}"


def preview(body: bytes) -> str:
    """The start of a body on one line, control characters escaped."""
    text = body[: _PREVIEW_CHARS * 4].decode("utf-8", "backslashreplace")
    cut = text[:_PREVIEW_CHARS]
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return shown + ("..." if len(text) > _PREVIEW_CHARS else "")


def _print_json(data: dict[str, object]) -> None:
    # ASCII escapes keep the output valid whatever the terminal's encoding.
    print(json.dumps(data), flush=True)
