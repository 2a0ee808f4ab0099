"""Commands on publish/subscribe: publish, subscribe (`dirmq.pubsub` on the local root).

`subscribe` reports `done` only after a message was written out (or its `--exec` command exited
0): if the output cannot be written, or the process is stopped, what it holds is given back
(`aborted`) and delivered again, after the subscription's backoff (`--backoff`, at most
`--max-deliveries` times: dirmq.pubsub.policy). SIGINT and SIGTERM only set a flag, checked
between short waits, so no transition is ever cut in half by a signal. What a failing `--exec`
says on stderr is rate-limited (cli/throttle.py).

Why it is long: two commands with their output formats (text, JSON lines, `--exec`), the signal
handling they share and subscribe's delivery policy options; the next cut is `--exec`'s runner
into a module of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from dirmq.cli import exits
from dirmq.cli.args import count, duration, open_store, queue_name
from dirmq.cli.messages import body_json, header
from dirmq.cli.throttle import ThrottledWarnings, warn
from dirmq.errors import DeliveryNotFound, InvalidArgument
from dirmq.pubsub.model import (
    DEFAULT_ACCEPT_TIMEOUT_S,
    DEFAULT_PROCESS_TIMEOUT_S,
    Delivery,
    Mode,
    Outcome,
    Persistence,
    check_name,
    parse_outcomes,
)
from dirmq.pubsub.policy import DEFAULT_BACKOFF_MAX_S, DEFAULT_BACKOFF_S, DEFAULT_MAX_DELIVERIES

if TYPE_CHECKING:
    from dirmq.pubsub.subscription import Subscription

# Longest wait inside the library before the loop looks at the signal flag again.
SLICE_S = 0.2


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `publish` and `subscribe` to the subparsers action `sub`."""
    p = sub.add_parser(
        "publish",
        parents=[common],
        help="publish stdin (or --body) to a pub/sub channel, print its id",
    )
    p.add_argument("channel", metavar="CHANNEL", help="the channel to publish to")
    p.add_argument("--subject", default="", metavar="S", help="the message's subject")
    p.add_argument(
        "--mode",
        choices=[m.value for m in Mode],
        default=Mode.ANYONE.value,
        help="anyone: one subscriber; everyone: every attached one; future: everyone, now "
        "and later, kept in the numbered log (default: anyone)",
    )
    p.add_argument(
        "--ack",
        type=outcomes,
        default=frozenset(),
        metavar="LIST",
        help="outcomes to report to --reply-to, comma-separated: queued, accepted, done, "
        "timeout, aborted, dismissed",
    )
    p.add_argument(
        "--reply-to", type=queue_name, metavar="QUEUE", help="queue receiving the outcomes"
    )
    p.add_argument("--id", type=message_id, metavar="ID", help="message id (default: a new one)")
    p.add_argument(
        "--accept-timeout",
        type=duration,
        default=DEFAULT_ACCEPT_TIMEOUT_S,
        metavar="DUR",
        help="dropped (timeout) if no subscriber takes it within DUR "
        f"(default {DEFAULT_ACCEPT_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--process-timeout",
        type=duration,
        default=DEFAULT_PROCESS_TIMEOUT_S,
        metavar="DUR",
        help="given back (aborted) if a subscriber holds it longer than DUR without a "
        f"heartbeat (default {DEFAULT_PROCESS_TIMEOUT_S:g}s)",
    )
    p.add_argument(
        "--persistence",
        choices=[m.value for m in Persistence],
        default=Persistence.WRITETHROUGH.value,
        help="writethrough: on disk before publish returns (default); writeback: flushed "
        "within half a second; none: never flushed",
    )
    p.add_argument(
        "--header",
        action="append",
        type=header,
        default=[],
        metavar="NAME:VALUE",
        help="a message header (repeatable)",
    )
    p.add_argument("--content-type", metavar="TYPE", help="the Content-Type header")
    p.add_argument("--body", metavar="TEXT", help="the body (UTF-8) instead of stdin")
    p.set_defaults(handler=cmd_publish)

    p = sub.add_parser(
        "subscribe",
        parents=[common],
        help="receive pub/sub messages: print them, or run a command on each",
    )
    p.add_argument(
        "--name",
        type=subscription_name,
        metavar="N",
        help="a durable subscription (what it missed while detached waits for it); default: "
        "an anonymous one, removed on exit",
    )
    p.add_argument(
        "--channel",
        action="append",
        default=[],
        metavar="P",
        help="only channels starting with P (repeatable; default: every channel)",
    )
    p.add_argument(
        "--subject",
        action="append",
        default=[],
        metavar="P",
        help="only subjects starting with P (repeatable; default: every subject)",
    )
    p.add_argument(
        "--from",
        dest="replay_from",
        type=sequence,
        metavar="SEQ",
        help="read retained (future) messages from sequence number SEQ",
    )
    p.add_argument("--count", type=positive, metavar="N", help="stop after N messages")
    p.add_argument(
        "--wait",
        type=duration,
        metavar="DUR",
        help="stop after DUR without a message (default: run until stopped)",
    )
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object per message and line")
    output.add_argument(
        "--exec",
        dest="command",
        metavar="CMD",
        help="run CMD (with sh -c) for each message, body on stdin: exit 0 reports done, "
        "anything else gives the message back",
    )
    p.add_argument(
        "--dismiss-on-error",
        action="store_true",
        help="with --exec: exit status 1 dismisses the message (dropped) instead",
    )
    add_policy_options(p)
    p.set_defaults(handler=cmd_subscribe)


def add_policy_options(p: argparse.ArgumentParser) -> None:
    """The subscription's delivery policy (dirmq.pubsub.policy): what it gives back."""
    p.add_argument(
        "--max-deliveries",
        type=count,
        default=DEFAULT_MAX_DELIVERIES,
        metavar="N",
        help="dismiss a message given back after its Nth delivery (dead-letter it with "
        f"--dead-letter); 0: no limit (default {DEFAULT_MAX_DELIVERIES})",
    )
    p.add_argument(
        "--backoff",
        type=duration,
        default=DEFAULT_BACKOFF_S,
        metavar="DUR",
        help="a message given back comes again after DUR, doubled after each delivery "
        f"(default {DEFAULT_BACKOFF_S:g}s)",
    )
    p.add_argument(
        "--backoff-max",
        type=duration,
        default=DEFAULT_BACKOFF_MAX_S,
        metavar="DUR",
        help=f"the longest backoff (default {DEFAULT_BACKOFF_MAX_S:g}s)",
    )
    p.add_argument(
        "--dead-letter",
        type=queue_name,
        metavar="QUEUE",
        help="put messages given up on (--max-deliveries) into QUEUE, with why",
    )


# -- argument types ------------------------------------------------------------------------------
def outcomes(text: str) -> frozenset[str]:
    try:
        return frozenset(o.value for o in parse_outcomes(text))
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def message_id(text: str) -> str:
    try:
        return check_name("message id", text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def subscription_name(text: str) -> str:
    try:
        return check_name("subscription name", text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(text: str) -> int:
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def sequence(text: str) -> int:
    try:
        return positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a sequence number (1 or more)") from None


# -- publish -------------------------------------------------------------------------------------
def cmd_publish(args: argparse.Namespace) -> int:
    headers = dict(args.header)
    if len(headers) != len(args.header):
        raise InvalidArgument("a header is given twice")
    if args.content_type is not None:
        if any(name.lower() == "content-type" for name in headers):
            raise InvalidArgument("Content-Type is given twice (--content-type and --header)")
        headers["Content-Type"] = args.content_type
    if args.ack and not args.reply_to:
        raise InvalidArgument("--ack needs --reply-to (the queue the outcomes go to)")
    with open_store(args, create=True) as store:
        from dirmq.pubsub.hub import PubSub  # here: cli/__init__.py says why

        hub = PubSub(store)
        # Read only once the arguments and the root are known to be good.
        body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
        published = hub.publish(
            args.channel,
            body,
            subject=args.subject,
            mode=args.mode,
            headers=headers,
            message_id=args.id,
            acks=args.ack,
            reply_to=args.reply_to,
            accept_timeout_s=args.accept_timeout,
            process_timeout_s=args.process_timeout,
            persistence=args.persistence,
        )
    if published.seq is not None:
        print(published.id, published.seq)
    else:
        print(published.id)
    if published.mode is Mode.EVERYONE and published.subscribers == 0:
        warn("no attached subscriber matched: nobody received the message")
    return exits.OK


# -- subscribe -----------------------------------------------------------------------------------
@dataclass
class Stop:
    """The first SIGINT/SIGTERM received, and the --exec child to pass it on to."""

    signum: int | None = None
    child: subprocess.Popen[bytes] | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        if self.child is not None and self.child.poll() is None:
            # The command runs in a process group of its own (a terminal's Ctrl-C reaches only
            # us): pass the signal on to the whole group once, so that `sh -c` and whatever it
            # started stop too, rather than an orphan keeping our stdout open.
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                pass

    @property
    def requested(self) -> bool:
        return self.signum is not None


@contextmanager
def stop_on_signals() -> Iterator[Stop]:
    stop = Stop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        stop.previous[signum] = signal.signal(signum, stop.handle)
    try:
        yield stop
    finally:
        for number, previous in stop.previous.items():
            signal.signal(number, previous)


def cmd_subscribe(args: argparse.Namespace) -> int:
    if args.dismiss_on_error and args.command is None:
        raise InvalidArgument("--dismiss-on-error only applies with --exec")
    with open_store(args, create=True) as store, stop_on_signals() as stop:
        from dirmq.pubsub.hub import PubSub  # here: cli/__init__.py says why

        hub = PubSub(store)
        subscription = hub.subscribe(
            args.name,
            channels=args.channel,
            subjects=args.subject,
            replay_from=args.replay_from,
            max_deliveries=args.max_deliveries,
            backoff_s=args.backoff,
            backoff_max_s=args.backoff_max,
            dead_letter=args.dead_letter,
        )
        warnings = ThrottledWarnings()
        try:
            received = _consume(subscription, args, stop, warnings)
        finally:
            subscription.close()  # gives back what it holds; an anonymous one is removed
            warnings.flush()
    if stop.signum == signal.SIGINT:
        return exits.INTERRUPTED
    if stop.signum is None and received == 0 and args.wait is not None:
        exits.error(f"no message within {args.wait:g}s")
        return exits.EMPTY
    return exits.OK


def _consume(
    subscription: Subscription, args: argparse.Namespace, stop: Stop, warnings: ThrottledWarnings
) -> int:
    """Receive and settle until --count, --wait or a signal; returns how many were received."""
    wait_s: float = math.inf if args.wait is None else args.wait
    received = 0
    idle_until = time.monotonic() + wait_s
    while not stop.requested and (args.count is None or received < args.count):
        remaining = idle_until - time.monotonic()
        delivery = subscription.receive(wait_s=max(0.0, min(SLICE_S, remaining)))
        if delivery is None:
            if remaining <= SLICE_S:
                break
            continue
        received += 1
        if args.command is not None:
            _run_command(subscription, delivery, args, stop, warnings)
        else:
            _print(delivery, as_json=args.json)
            _settle(subscription, delivery, "done", warnings)
        idle_until = time.monotonic() + wait_s
    return received


def _print(delivery: Delivery, *, as_json: bool) -> None:
    out = sys.stdout.buffer
    if as_json:
        out.write(json.dumps(delivery_json(delivery)).encode() + b"\n")
    else:
        out.write(delivery.body)
        if not delivery.body.endswith(b"\n"):
            out.write(b"\n")  # one message per line when bodies are lines of text
    out.flush()


def delivery_json(delivery: Delivery) -> dict[str, object]:
    """A delivery as JSON (see `body_json` for the body)."""
    return {
        "id": delivery.id,
        "channel": delivery.channel,
        "subject": delivery.subject,
        "mode": delivery.mode.value,
        "seq": delivery.seq,
        "headers": delivery.headers,
        **body_json(delivery.body),
    }


def _run_command(
    subscription: Subscription,
    delivery: Delivery,
    args: argparse.Namespace,
    stop: Stop,
    warnings: ThrottledWarnings,
) -> None:
    env = {
        **os.environ,
        "DIRMQ_ID": delivery.id,
        "DIRMQ_CHANNEL": delivery.channel,
        "DIRMQ_SUBJECT": delivery.subject,
        "DIRMQ_MODE": delivery.mode.value,
        "DIRMQ_SEQ": "" if delivery.seq is None else str(delivery.seq),
    }
    # Heartbeat well before the deadline: a third of the message's own process timeout.
    every_s = max(0.05, delivery.envelope.process_timeout_s / 3)
    sys.stdout.flush()
    child = subprocess.Popen(
        ["/bin/sh", "-c", args.command], stdin=subprocess.PIPE, env=env, start_new_session=True
    )
    stop.child = child
    if stop.requested:  # a signal came between receive and Popen: pass it on now
        stop.handle(stop.signum or signal.SIGTERM, None)
    held = True
    body: bytes | None = delivery.body
    next_beat = time.monotonic() + every_s
    try:
        while True:
            try:
                child.communicate(body, timeout=min(SLICE_S, every_s))
                break
            except subprocess.TimeoutExpired:
                body = None  # already being written: communicate() keeps its place
            if held and time.monotonic() >= next_beat:
                try:
                    subscription.heartbeat(delivery)
                except DeliveryNotFound:
                    held = False
                    warnings.warn(
                        "lost", f"message {delivery.id} was given back while {args.command!r} ran"
                    )
                next_beat = time.monotonic() + every_s
    finally:
        stop.child = None
        if child.poll() is None:  # only if communicate() itself failed
            child.kill()
            child.wait()
    status = child.returncode
    if not held:
        return
    if status == 0:
        _settle(subscription, delivery, "done", warnings)
    elif status == 1 and args.dismiss_on_error:
        _settle(subscription, delivery, "dismiss", warnings)
    else:
        how = f"was killed by signal {-status}" if status < 0 else f"exited {status}"
        try:
            outcome = subscription.abort(delivery, f"{args.command!r} {how}")
        except DeliveryNotFound:
            outcome = None
        if outcome is Outcome.DISMISSED:
            where = "dead-lettered" if args.dead_letter else "dismissed"
            warnings.warn(
                "dismissed",
                f"{args.command!r} {how}: message {delivery.id} {where} "
                f"(delivered {args.max_deliveries} times)",
            )
        else:
            warnings.warn("failed", f"{args.command!r} {how}: message {delivery.id} given back")


def _settle(
    subscription: Subscription, delivery: Delivery, how: str, warnings: ThrottledWarnings
) -> None:
    try:
        if how == "done":
            subscription.done(delivery)
        else:
            subscription.dismiss(delivery)
    except DeliveryNotFound:
        warnings.warn("lost", f"message {delivery.id} was given back before it was reported {how}")
