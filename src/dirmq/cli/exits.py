"""Exit codes of the `dirmq` command, and the one table mapping errors to them.

  0  ok
  1  unexpected error (a bug: a traceback is printed)
  2  usage error: bad arguments or option values, invalid queue name, queue already exists
  3  empty or not found: no message on `get`, unknown message id
  4  queue not found (or the root is not a dirmq root)
  5  queue full: the put timed out at capacity
  6  storage failure: disk full, I/O error, permission denied, damaged message or config file
  7  stale receipt: the lease was lost (expired and redelivered, or already acknowledged), or a
     pub/sub delivery is no longer held
  8  fsck found problems it did not repair
  9  duplicate: a pub/sub message id that was already published
 10  busy: the pub/sub subscription name is attached in another process
 11  cannot listen: `serve` could not bind an address (in use, not local, privileged port),
     or protected mode refused one other hosts reach (no credentials)
130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import sys

from dirmq.errors import (
    CannotListen,
    ConfigError,
    CorruptConfig,
    CorruptMessage,
    DeliveryNotFound,
    DuplicateMessage,
    InvalidArgument,
    InvalidName,
    MessageNotFound,
    MessageTooLarge,
    QueueExists,
    QueueFull,
    QueueNotFound,
    RedriveBusy,
    ScheduleNotFound,
    StaleReceipt,
    StorageError,
    SubscriptionBusy,
    TaskNotFound,
)

OK = 0
UNEXPECTED = 1
USAGE = 2
EMPTY = 3
NO_QUEUE = 4
FULL = 5
STORAGE = 6
STALE = 7
FSCK_UNREPAIRED = 8
DUPLICATE = 9
BUSY = 10
CANNOT_LISTEN = 11
INTERRUPTED = 130
BROKEN_PIPE = 141

# First match wins: subclasses before their bases (StorageError is an OSError).
ERROR_EXITS: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidName, USAGE),
    (InvalidArgument, USAGE),
    (CorruptConfig, STORAGE),  # the stored @queue.json is bad, not the arguments: run fsck
    (ConfigError, USAGE),
    (MessageTooLarge, USAGE),
    (QueueExists, USAGE),
    (MessageNotFound, EMPTY),
    (QueueNotFound, NO_QUEUE),
    (QueueFull, FULL),
    (StaleReceipt, STALE),
    (DeliveryNotFound, STALE),
    (DuplicateMessage, DUPLICATE),
    (SubscriptionBusy, BUSY),
    (RedriveBusy, BUSY),
    (TaskNotFound, EMPTY),
    (ScheduleNotFound, EMPTY),
    (CannotListen, CANNOT_LISTEN),
    (CorruptMessage, STORAGE),
    (StorageError, STORAGE),
    (OSError, STORAGE),  # foreign errors that reached the CLI unmapped (permissions, ...)
)


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of an expected error, or None for an unexpected one (a bug)."""
    for error_type, code in ERROR_EXITS:
        if isinstance(exc, error_type):
            return code
    return None


def describe(exc: BaseException) -> str:
    """One line saying what went wrong (an OSError with a file name names it)."""
    if isinstance(exc, StorageError) and exc.strerror:
        return str(exc.strerror)  # already says what was being done, and why it failed
    if isinstance(exc, QueueNotFound) and exc.queue is not None:
        # The store's words cannot know the door: say what creates a queue from the shell.
        return f"queue {exc.queue!r} does not exist: `dirmq create {exc.queue}` creates it"
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def error(message: str) -> None:
    """Print `dirmq: error: <message>` on stderr (the one format of every failure)."""
    print(f"dirmq: error: {message}", file=sys.stderr)
