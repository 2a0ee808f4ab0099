"""The one error hierarchy of dirmq.

    DirmqError
    ├── InvalidName             a queue name that could escape the root or break the format
    ├── InvalidArgument         a bad value (negative timeout, oversized header, bad receipt text)
    ├── QueueNotFound
    ├── QueueExists
    ├── QueueFull               capacity reached and the put timed out
    ├── MessageTooLarge
    ├── MessageNotFound         no message with that id is in the queue
    ├── StaleReceipt            the lease behind a receipt is gone (expired and re-leased, or acked)
    ├── DuplicateMessage        a pub/sub message id that was already published
    ├── SubscriptionBusy        a pub/sub subscription name already attached elsewhere
    ├── ConsumerBusy            a Spark streaming consumer name held by another running query
    ├── CannotListen            a server address that cannot be bound (in use, not local, ...),
    │                           or one protected mode refuses (not loopback, no credentials)
    ├── Unauthenticated         no credentials, or wrong ones, where the server requires them
    ├── AccessDenied            the credentials' principal lacks the permission for this
    ├── DeliveryNotFound        a pub/sub delivery that is no longer held (aborted or settled)
    ├── TaskNotFound            no redrive task with that id for that queue
    ├── RedriveBusy             a redrive of that queue is already running (one at a time)
    ├── ScheduleNotFound        no recurring schedule of that name
    ├── CorruptMessage          a message file that does not decode (truncated, bad checksum)
    ├── ProtocolError           what a server sent does not follow the wire format (a client's
    │                           decoder refused it: not JSON, a field missing or mistyped)
    ├── ConfigError             a queue configuration that does not parse or validate
    │   └── CorruptConfig       ... as stored in @queue.json (the operator must repair it)
    └── StorageError            the filesystem refused: the message cannot be guaranteed stored
        ├── DiskFull            ENOSPC / EDQUOT
        └── StorageIOError      EIO and every other unexpected OSError

Foreign errors (`OSError`) are mapped by `storage_error` where a filesystem call is made: in the
store, and in the layers that keep files of their own under the root (pubsub, spark, compat,
SQS's records).
Losing a race with another process (ENOENT/EEXIST on a claim) is a normal result, never an error.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator


class DirmqError(Exception):
    """Base of every error dirmq raises on purpose."""


class InvalidName(DirmqError, ValueError):
    pass


class InvalidArgument(DirmqError, ValueError):
    pass


class QueueNotFound(DirmqError, LookupError):
    """`queue`: the missing queue's name when one queue is missing (None for a root that is
    not a dirmq root, or an error rebuilt from its text), so that a door can say how it
    creates one (`dirmq create NAME`, `PUT /NAME`)."""

    def __init__(self, message: str = "", queue: str | None = None) -> None:
        super().__init__(message)
        self.queue = queue

    @classmethod
    def missing(cls, queue: str) -> QueueNotFound:
        """The store's words: it cannot know which door the caller came through."""
        return cls(f"queue {queue!r} does not exist: create it first", queue)


class QueueExists(DirmqError):
    pass


class TaskNotFound(DirmqError, LookupError):
    pass


class RedriveBusy(DirmqError):
    pass


class ScheduleNotFound(DirmqError, LookupError):
    pass


class QueueFull(DirmqError):
    pass


class MessageTooLarge(DirmqError, ValueError):
    @classmethod
    def for_queue(cls, queue: str, size_bytes: int, limit_bytes: int) -> MessageTooLarge:
        """The one refusal of a message over its queue's `max_message_bytes` (the store's, and
        the servers' before they read the body), saying how to raise the limit."""
        return cls(
            f"message is {size_bytes} bytes; queue {queue!r} accepts at most {limit_bytes}: "
            f"raise its max_message_bytes (`dirmq configure {queue} --max-bytes SIZE`, or "
            f'PUT /{queue} {{"max_message_bytes": N}})'
        )


class MessageNotFound(DirmqError, LookupError):
    pass


class StaleReceipt(DirmqError):
    pass


class DuplicateMessage(DirmqError):
    pass


class SubscriptionBusy(DirmqError):
    pass


class ConsumerBusy(DirmqError):
    pass


class CannotListen(DirmqError):
    pass


class Unauthenticated(DirmqError):
    """No credentials, or wrong ones (HTTP 401). `aws_code` is how the SQS door says it."""

    def __init__(self, message: str, aws_code: str = "InvalidClientTokenId") -> None:
        super().__init__(message)
        self.aws_code = aws_code


class AccessDenied(DirmqError):
    """The principal is known but may not do this (HTTP 403)."""


class DeliveryNotFound(DirmqError, LookupError):
    pass


class CorruptMessage(DirmqError):
    pass


class ProtocolError(DirmqError, ValueError):
    pass


class ConfigError(DirmqError, ValueError):
    pass


class CorruptConfig(ConfigError):
    pass


class StorageError(DirmqError, OSError):
    """The filesystem failed: what was being written is not stored, nothing partial is visible."""

    def __str__(self) -> str:
        # The message alone: OSError's "[Errno N] " prefix is in `errno`, and it piled up as
        # "[Errno 0] [Errno 28] ..." once an HTTP client rebuilt the error from its message.
        return self.strerror if isinstance(self.strerror, str) else super().__str__()


class DiskFull(StorageError):
    pass


class StorageIOError(StorageError):
    pass


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def storage_error(exc: OSError, what: str) -> StorageError:
    """Map an `OSError` to the dirmq error a caller can act on (raise it `from exc`)."""
    reason = exc.strerror or str(exc)
    if exc.errno in _DISK_FULL:
        return DiskFull(exc.errno, f"{what}: disk full ({reason})")
    return StorageIOError(exc.errno or errno.EIO, f"{what}: {reason}")


@contextlib.contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Map an `OSError` raised in the block with `storage_error` (a `StorageError` passes)."""
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise storage_error(exc, what) from exc
