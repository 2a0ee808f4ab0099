"""Queue names, and the one function that turns a name into a path under the root.

A queue name is one or more segments joined by `/` (`orders`, `fish/saltwater`). Every segment
is 1-255 bytes of UTF-8, is not `.` or `..`, does not start with `@` (reserved for the queue's own
state directories, see FORMAT.md) and has no control characters. The whole name is at most 1024
bytes. A name that passes can never resolve outside the root. Names every door could not reach
(`health`, `ui/...`, `x/messages`, ...) are reserved: see `_refuse_reserved`.
"""

from __future__ import annotations

import functools
import os
import re
import unicodedata

from dirmq.errors import InvalidName

MAX_NAME_BYTES = 1024
MAX_SEGMENT_BYTES = 255
RESERVED_PREFIX = "@"


def validate_queue_name(name: str) -> str:
    """Return `name` unchanged if it is a valid queue name, else raise `InvalidName` saying why."""
    if not isinstance(name, str) or not name:
        raise InvalidName("queue name is empty")
    # A str subclass is judged as its text: its own hash, equality or __str__ must not reach
    # the cache (str.__str__ gives the text itself, whatever the subclass says).
    _check_name(name if type(name) is str else str.__str__(name))
    return name


# The names in use pass again and again: every request's route and its queue's open check
# one (a few µs each, twice a request). A refused name is not remembered: it raises each time.
@functools.lru_cache(maxsize=8192)
def _check_name(name: str) -> None:
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_NAME_BYTES:
        raise InvalidName(f"queue name is {len(encoded)} bytes; the limit is {MAX_NAME_BYTES}")
    if name.startswith("/"):
        raise InvalidName(f"queue name {name!r} is absolute; names are relative to the root")
    segments = name.split("/")
    for segment in segments:
        _validate_segment(name, segment)
    _refuse_reserved(name, segments)


# Names one door cannot reach are refused on every door (docs/http-api.md "Queue names"): the
# native API's own paths, and names its grammar reads as `{queue}/messages[/{ref}[/{action}]]`.
SERVER_PATHS = frozenset({"health", "metrics", "openapi.json"})
CONSOLE = "ui"  # /ui and everything under it: the operators' web console (dirmq.console)
MESSAGE_ACTIONS = frozenset({"nack", "extend", "dead-letter"})
REDRIVE = "redrive"  # /{queue}/redrive and /{queue}/redrive/{task id}
_TASK_ID = re.compile("[0-9a-f]{32}")


def is_task_id(segment: str) -> bool:
    """Whether `segment` is spelled as a redrive task's id (32 lower-case hex digits)."""
    return _TASK_ID.fullmatch(segment) is not None


def _refuse_reserved(name: str, segments: list[str]) -> None:
    if name in SERVER_PATHS:
        raise InvalidName(f"queue name {name!r} is reserved (the HTTP server's /{name})")
    if segments[0] == CONSOLE:
        raise InvalidName(
            f"queue name {name!r} is reserved: /{CONSOLE}/ and what is under it is the web "
            "console (open /ui/ in a browser); choose another first segment"
        )
    n = len(segments)
    if (
        (n >= 2 and segments[-1] == "messages")
        or (n >= 3 and segments[-2] == "messages")
        or (n >= 4 and segments[-3] == "messages" and segments[-1] in MESSAGE_ACTIONS)
    ):
        raise InvalidName(
            f"queue name {name!r} is reserved: over HTTP, /{name} addresses the messages of "
            "another queue"
        )
    if (n >= 2 and segments[-1] == REDRIVE) or (
        n >= 3 and segments[-2] == REDRIVE and is_task_id(segments[-1])
    ):
        raise InvalidName(
            f"queue name {name!r} is reserved: over HTTP, /{name} addresses the redrive tasks "
            "of another queue"
        )


def _validate_segment(name: str, segment: str) -> None:
    if not segment:
        raise InvalidName(f"queue name {name!r} has an empty segment (leading, trailing or '//')")
    if segment in (".", ".."):
        raise InvalidName(f"queue name {name!r} has a {segment!r} segment")
    if segment.startswith(RESERVED_PREFIX):
        raise InvalidName(f"queue name {name!r}: segments may not start with '@' (reserved)")
    if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
        raise InvalidName(f"queue name {name!r}: a segment is over {MAX_SEGMENT_BYTES} bytes")
    if segment.isascii() and segment.isprintable() and "\\" not in segment:
        return  # no control character, no surrogate: the usual name, without a loop
    for char in segment:
        category = unicodedata.category(char)
        if category in ("Cc", "Cs") or char == "\\":
            raise InvalidName(f"queue name {name!r} contains a forbidden character {char!r}")


def queue_path(root: str, name: str) -> str:
    """The directory of queue `name` under `root`, after validation; never outside `root`."""
    validate_queue_name(name)
    # A valid name has no empty, "." or ".." segment: joining is concatenating (no join's
    # per-segment work: the server opens thousands of queues on its event loop).
    path = (root if root.endswith(os.sep) else root + os.sep) + name
    # Belt and braces: validation already excludes every escape, this re-checks the result
    # (one normpath, not commonpath's).
    real_root = _real_root(root)
    if not os.path.normpath(real_root + name).startswith(real_root):
        raise InvalidName(f"queue name {name!r} resolves outside the root")
    return path


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    """`root` made absolute and normal, with one trailing separator (a process has few roots;
    a relative one is taken from the working directory at its first use, as a Store takes it)."""
    return os.path.abspath(root).rstrip(os.sep) + os.sep
