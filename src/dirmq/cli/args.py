"""Argument types and options shared by the subcommands, and opening the store they name."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from dirmq.errors import InvalidArgument, InvalidName
from dirmq.store import Store, default_root
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.config import Durability
from dirmq.store.names import validate_queue_name
from dirmq.wire.durations import EXAMPLES, duration_seconds
from dirmq.wire.sizes import parse_size

_NONE_WORDS = frozenset({"none", "off", "unset"})


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: `dirmq: error: <message>`, exit status 2."""

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --wait: ..."; the option's name alone says it.
        message = message.removeprefix("argument ")
        print(f"dirmq: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


def subparsers_of(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction[Any]]:
    """The subcommand actions of `parser` (argparse keeps them among its actions)."""
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def describe_commands(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand (at any depth) without a description its one-line help as one,
    so that `dirmq COMMAND --help` starts by saying what COMMAND does."""
    for action in subparsers_of(parser):
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            line = helps.get(name, "")
            if child.description is None and line:
                child.description = f"{line[0].upper()}{line[1:]}."
            describe_commands(child)


def queue_name(text: str) -> str:
    """A valid queue name (checked before anything touches the disk)."""
    try:
        return validate_queue_name(text)
    except InvalidName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> float:
    """Seconds, spelled as HTTP takes them (2.5, 150ms, 2s, 1h2m), within the store's bounds
    (refused here, before anything touches the disk, naming the option; the store checks
    again)."""
    value = duration_seconds(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration ({EXAMPLES})")
    if not value <= MAX_DURATION_S:  # NaN and infinities too
        raise argparse.ArgumentTypeError(
            f"{text!r} is longer than a year, the longest duration dirmq takes"
        )
    return value


def size(text: str) -> int:
    """Bytes: plain (1048576) or with a unit (10MB, 64KiB; `dirmq.wire.sizes`)."""
    try:
        return parse_size(text, "")  # argparse names the option
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count(text: str) -> int:
    """A non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def listen_address(text: str) -> str:
    """An address to listen on, `HOST:PORT` (checked here, so that a bad one is a usage
    error that says what is wrong with it)."""
    from dirmq.server.addresses import parse_address

    try:
        parse_address(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def optional_duration(text: str) -> float | None:
    """A duration, or `none` to unset the setting."""
    return None if text.lower() in _NONE_WORDS else duration(text)


def optional_count(text: str) -> int | None:
    """An integer, or `none` to unset the setting."""
    return None if text.lower() in _NONE_WORDS else count(text)


def optional_rate(text: str) -> float | None:
    """A number of deliveries per second above 0 (2, 0.5), or `none` for no limit."""
    if text.lower() in _NONE_WORDS:
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number a second") from None
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0 (none: no limit)")
    return value


def optional_queue_name(text: str) -> str | None:
    """A queue name, or `none` to unset the setting."""
    return None if text.lower() in _NONE_WORDS else queue_name(text)


_ROOT_HELP = "the dirmq root directory (default: $DIRMQ_ROOT, else ./dirmq-data)"


def add_root_option(parser: argparse.ArgumentParser) -> None:
    """`--root DIR` before the command (`dirmq --root DIR ls`); `args.root` is None without it."""
    parser.add_argument("--root", default=None, metavar="DIR", help=_ROOT_HELP)


def common_options() -> argparse.ArgumentParser:
    """The options every subcommand takes (a parent parser). `--root` is accepted after the
    command too; left out there, it must not reset one given before the command, hence
    SUPPRESS (argparse copies a subcommand's defaults over the main parser's values)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--root", default=argparse.SUPPRESS, metavar="DIR", help=_ROOT_HELP)
    return parent


@dataclass(frozen=True, slots=True)
class _Setting:
    """One queue setting's option: `field` is its `QueueConfig` field and the option's dest."""

    flag: str
    field: str
    help: str
    type: Callable[[str], Any] = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


_SETTINGS = (
    _Setting(
        "--visibility",
        "visibility_timeout_s",
        "visibility timeout: how long a received message is leased (e.g. 30s, 5m)",
        duration,
        "DUR",
    ),
    _Setting(
        "--delay",
        "delay_s",
        "default delivery delay of new messages (e.g. 2.5, 150ms, 1m)",
        duration,
        "DUR",
    ),
    _Setting(
        "--max-receives",
        "max_receives",
        "dead-letter a message after N deliveries",
        optional_count,
        "N",
    ),
    _Setting(
        "--dead-letter",
        "dead_letter_queue",
        "queue receiving dead letters (default: this queue's @dead)",
        optional_queue_name,
        "QUEUE",
    ),
    _Setting(
        "--capacity",
        "capacity",
        "at most N messages ready, in flight or delayed",
        optional_count,
        "N",
    ),
    _Setting(
        "--retention",
        "retention_s",
        "drop ready messages older than DUR (e.g. 336h, two weeks)",
        optional_duration,
        "DUR",
    ),
    _Setting(
        "--max-bytes",
        "max_message_bytes",
        "largest accepted message body: bytes, or with a unit (256KiB, 1MB)",
        size,
        "SIZE",
    ),
    _Setting(
        "--durability",
        "durability",
        "when a put is acknowledged (default: writethrough)",
        choices=tuple(d.value for d in Durability),
    ),
    _Setting(
        "--writeback-delay",
        "writeback_delay_s",
        "longest delay before a writeback flush (e.g. 200ms)",
        duration,
        "DUR",
    ),
    _Setting(
        "--peers",
        "peers",
        "take one of the oldest N+1 messages at random (spreads many consumers)",
        count,
        "N",
    ),
    # Delivery rate and time to live (issue 36; pause and resume are commands of their own).
    _Setting(
        "--rate",
        "delivery_rate_per_s",
        "deliver at most N messages a second over every consumer (e.g. 50, 0.5; none)",
        optional_rate,
        "N",
    ),
    _Setting(
        "--ttl",
        "message_ttl_s",
        "default time to live of new messages: undelivered after DUR, out (e.g. 10m)",
        optional_duration,
        "DUR",
    ),
    _Setting(
        "--ttl-action",
        "ttl_action",
        "what becomes of an expired message (default: dead-letter)",
        choices=("dead-letter", "drop"),
    ),
    _Setting(
        "--priority-levels",
        "priority_levels",
        "priority levels 0 to N-1 (1 to 10; default 1), the highest delivered first",
        count,
        "N",
    ),
)


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """Queue settings; dests are `QueueConfig` field names, present only when given."""
    group = parser.add_argument_group("queue settings ('none' unsets an optional one)")
    for s in _SETTINGS:
        group.add_argument(
            s.flag,
            dest=s.field,
            type=s.type,
            choices=s.choices,
            default=argparse.SUPPRESS,
            metavar=s.metavar,
            help=s.help,
        )


# The settings the options give, and `paused` (dirmq pause, resume).
CONFIG_FIELDS = (*(s.field for s in _SETTINGS), "paused")


def config_changes(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, by `QueueConfig` field name."""
    return {name: getattr(args, name) for name in CONFIG_FIELDS if hasattr(args, name)}


def open_store(args: argparse.Namespace, *, create: bool = False) -> Store:
    """The store at `--root`. Without `create`, a directory that is not a dirmq root is refused
    (QueueNotFound) rather than silently initialised by a read-only command."""
    root: str = args.root or default_root()
    return Store(root, create=create)
