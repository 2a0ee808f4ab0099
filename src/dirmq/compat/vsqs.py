"""VSQS 0.3's API over a dirmq store: change one import line and keep the rest of your code.

    from dirmq.compat.vsqs import QueueManager, QueueException, QueueFullException

    manager = QueueManager("/var/spool/queues")
    queue = manager.get_queue("jobs", capacity=1000)
    message_id = queue.publish(b"payload")
    message_id, data = queue.receive(visibility_timeout=30, timeout=5)
    queue.delete(message_id)

`QueueManager(path)` is a dirmq `Store` rooted at `path`; each VSQS queue is the dirmq queue of the
same name, so dirmq's native API, HTTP server and tools see the same messages. Where dirmq behaves
differently from vsqs 0.3, it is on purpose, and each difference fixes a vsqs defect:

- `delete(id)` works from any process, whoever received the message (vsqs 0.3 only deleted ids
  it had cached itself; elsewhere it compared full paths with bare ids and deleted nothing).
- A `receive` blocked on an empty queue wakes as soon as another process's lease expires (vsqs
  only woke on a directory change, so it slept through expiries).
- An expired lease goes back to its FIFO place: it is delivered before younger messages.
- Fractional visibility timeouts work (vsqs wrote a float into the file name and never saw that
  message again).
- Every operation costs the same whatever the backlog (vsqs listed the whole directory each time).
- Publishes are durable: the file and its directory are fsynced before `publish` returns.
- Message ids are dirmq ids (`1716123456789012-a1b2c3d4e5f6`: publish time in microseconds, then
  a node), not bare microsecond timestamps. They still sort by publish time.
- `capacity` is a setting of the queue, shared by every process, not of one `Queue` handle:
  `get_queue(name, capacity=n)` stores it; `get_queue(name)` leaves the stored value alone.
- `receive(timeout=0)` looks once without waiting (vsqs returned `(None, None)` without looking).
- `delete` returns True if it removed a message (vsqs returned None); unknown ids are a no-op.
- Errors from the store are `QueueException` (`QueueFullException` at capacity), chained to the
  dirmq error that caused them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from dirmq.errors import DirmqError, QueueFull
from dirmq.store import Queue as StoreQueue
from dirmq.store import QueueConfig, Store
from dirmq.store.ids import is_id

__all__ = ["Queue", "QueueException", "QueueFullException", "QueueManager"]

# A receive without a timeout waits in slices this long, so nothing depends on an infinite deadline.
_WAIT_SLICE_S = 60.0


class QueueException(Exception):
    """Base of every error this module raises; the dirmq error behind it is its `__cause__`."""


class QueueFullException(QueueException):
    """Raised by `Queue.publish` when the queue stayed at capacity for the whole timeout."""


@contextmanager
def _vsqs_errors(what: str) -> Iterator[None]:
    """Translate dirmq's errors into VSQS's two exception types, keeping the cause."""
    try:
        yield
    except QueueFull as exc:
        raise QueueFullException(f"{what}: {exc}") from exc
    except DirmqError as exc:
        raise QueueException(f"{what}: {exc}") from exc


class QueueManager:
    """Queues under one directory (a dirmq root; created if absent). Thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with _vsqs_errors(f"opening {self.path}"):
            self.store = Store(self.path)

    def get_queue(self, name: str, capacity: int | None = None) -> Queue:
        """The queue called `name`, created if absent.

        `capacity` (a positive number of messages) makes publishers block while the queue holds
        that many messages (ready, in flight or delayed). It is stored with the queue, so it binds
        every process; `None` leaves whatever the queue already has. Raises `QueueException` for
        an invalid name or capacity.
        """
        with _vsqs_errors(f"opening queue {name!r}"):
            initial = QueueConfig(capacity=capacity) if capacity is not None else None
            queue = self.store.create_queue(name, initial, exist_ok=True)
            if capacity is not None:
                queue.reload_config()  # another process may have changed it a moment ago
                if queue.config.capacity != capacity:
                    self.store.configure(name, capacity=capacity)
        return Queue(self, queue)

    def close(self) -> None:
        """Release watchers and flush pending write-back data; queues opened here stop waking."""
        with _vsqs_errors(f"closing {self.path}"):
            self.store.close()

    def __enter__(self) -> QueueManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class Queue:
    """One queue, as VSQS 0.3 offered it. Obtain it from `QueueManager.get_queue`."""

    def __init__(self, manager: QueueManager, queue: StoreQueue) -> None:
        self.manager = manager
        self.queue = queue  # the dirmq queue underneath, for anything VSQS could not do
        self.name = queue.name
        self.path = queue.path

    @property
    def capacity(self) -> int | None:
        """The queue's capacity in messages (None: unbounded), as currently stored."""
        with _vsqs_errors(f"reading queue {self.name!r}"):
            return self.queue.config.capacity

    @capacity.setter
    def capacity(self, capacity: int | None) -> None:
        """Store a new capacity for the queue (None: unbounded); it binds every process."""
        with _vsqs_errors(f"configuring queue {self.name!r}"):
            self.manager.store.configure(self.name, capacity=capacity)

    def publish(self, data: bytes | bytearray | memoryview, timeout: float | None = None) -> str:
        """Store `data` as a new message and return its id.

        Returns once the message is on stable storage (the queue's durability permitting). At
        capacity, waits for room: indefinitely if `timeout` is None, else up to `timeout` seconds,
        then raises `QueueFullException`. A delete or expiry in any process makes room at once.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"message data must be bytes, not {type(data).__name__}")
        # vsqs treated a negative timeout like an expired one; dirmq refuses negatives.
        timeout_s = None if timeout is None else max(0.0, timeout)
        with _vsqs_errors(f"publishing to queue {self.name!r}"):
            return self.queue.put(bytes(data), timeout_s=timeout_s)

    def receive(
        self, visibility_timeout: float = 10, timeout: float | None = None
    ) -> tuple[str, bytes] | tuple[None, None]:
        """Take the oldest available message: `(id, data)`, or `(None, None)` after `timeout`.

        `timeout` None waits until a message comes; 0 looks once. The message stays invisible to
        every other receiver for `visibility_timeout` seconds (fractions allowed); `delete` it
        before then, or it returns to its FIFO place for someone else to receive.
        """
        with _vsqs_errors(f"receiving from queue {self.name!r}"):
            if timeout is not None and timeout <= _WAIT_SLICE_S:
                message = self.queue.get_one(
                    visibility_s=visibility_timeout, wait_s=max(0.0, timeout)
                )
            else:
                # Long (even infinite) waits go in slices: the store bounds one wait to a year.
                deadline = math.inf if timeout is None else time.monotonic() + timeout
                message = None
                while message is None and (left_s := deadline - time.monotonic()) > 0:
                    message = self.queue.get_one(
                        visibility_s=visibility_timeout, wait_s=min(left_s, _WAIT_SLICE_S)
                    )
        if message is None:
            return None, None
        return message.id, message.body

    def delete(self, m_id: str) -> bool:
        """Remove message `m_id` whatever its state and whichever process received it.

        Returns True if this call removed it, False if no such message was in the queue (already
        deleted, never existed, or not a dirmq id at all: like vsqs, that is not an error).
        """
        message_id = str(m_id)
        if not is_id(message_id):
            return False
        with _vsqs_errors(f"deleting from queue {self.name!r}"):
            return self.queue.delete(message_id)

    def size(self) -> int:
        """Messages in the queue: ready, being consumed (not yet deleted) and delayed."""
        with _vsqs_errors(f"sizing queue {self.name!r}"):
            return self.queue.stats().total

    def close(self) -> None:
        """Stop watching the directory. The handle stays usable: it reopens on next use."""
        self.queue.close()

    def __repr__(self) -> str:
        return f"<dirmq.compat.vsqs.Queue {self.name!r} at {self.path!r}>"
