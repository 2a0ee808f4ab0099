"""What ReceiveMessage remembers between requests.

- ReceiveRequestAttemptId (FIFO queues): the messages a receive returned, by attempt id, for
  five minutes, so a client that lost the answer and retries with the same id gets the same
  messages and receipt handles (their visibility timeout restarts). Kept as files,
  `<root>/@sqs/attempts/<queue>/<sha256 of the id>.json`, so a retry that reaches another
  worker or process serving the root, or this one after a restart, gets the same answer. A
  record keeps no message data (bodies, message attributes): a retry reads them again from the
  messages, still in flight, so a deleted message's body is not left in a record. Not
  flushed: after a crash of the machine a retry may receive afresh (the messages of the lost
  answer then come back when their visibility timeout ends, their group held until then).
- ApproximateFirstReceiveTimestamp: the store counts receives but does not record when the
  first one happened, so the time is remembered here, in memory, when this process hands out a
  first receive (a bounded table; elsewhere the sent time stands in for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from dirmq.store import Store, layout, smallfiles
from dirmq.store.filemodes import Access

ATTEMPT_TTL_S = 300.0
PRUNE_EVERY_S = 60.0
MAX_FIRST_RECEIVES = 100_000


_DATA_KEYS = frozenset({"Body", "MessageAttributes"})  # the message's own: never in a record


@dataclass(slots=True)
class Attempt:
    receipts: list[str]
    messages: list[dict[str, Any]]  # as rendered for the first answer; read back without data
    attribute_names: list[str] = field(default_factory=list)  # the MessageAttributeNames asked
    created: float = field(default_factory=time.time)  # wall clock: shared between processes


class ReceiveMemory:
    """Attempt records of one root (file operations: call them off the event loop) and this
    process's first-receive times."""

    def __init__(self, root: str, access: Access) -> None:
        self._dir = os.path.join(root, layout.SQS_DIR, "attempts")
        self._access = access  # the root's: the modes of the records made here
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._first: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._pruned: dict[str, float] = {}

    # -- attempts --------------------------------------------------------------------------------
    def lock(self, queue: str, attempt_id: str) -> asyncio.Lock:
        """Serialises receives that share an attempt id in this process (a retry racing the
        original)."""
        key = (queue, attempt_id)
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 1000:
                for stale in [k for k, held in self._locks.items() if not held.locked()]:
                    del self._locks[stale]
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def attempt(self, queue: str, attempt_id: str) -> Attempt | None:
        path = self._path(queue, attempt_id)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
            attempt = Attempt(
                data["receipts"],
                data["messages"],
                list(data.get("attribute_names", [])),
                float(data["created"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            attempt = None  # unreadable: as if it had expired
        if attempt is None or time.time() - attempt.created >= ATTEMPT_TTL_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        return attempt

    def remember(self, queue: str, attempt_id: str, attempt: Attempt) -> None:
        data = {
            "created": attempt.created,
            "receipts": attempt.receipts,
            "messages": [
                {k: v for k, v in m.items() if k not in _DATA_KEYS} for m in attempt.messages
            ],
            "attribute_names": attempt.attribute_names,
        }
        smallfiles.replace_file(
            self._path(queue, attempt_id),
            json.dumps(data, separators=(",", ":")).encode(),
            durable=False,  # see the module docstring
            access=self._access,
            make_parents=True,
        )
        self._prune(queue)

    def forget(self, queue: str, attempt_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(queue, attempt_id))

    def forget_queue(self, queue: str) -> None:
        """The queue was deleted: its attempts with it."""
        shutil.rmtree(os.path.join(self._dir, queue), ignore_errors=True)

    def _path(self, queue: str, attempt_id: str) -> str:
        digest = hashlib.sha256(attempt_id.encode()).hexdigest()[:40]
        return os.path.join(self._dir, queue, f"{digest}.json")

    def _prune(self, queue: str) -> None:
        """Remove the queue's expired records (and temp files of unfinished writes), at most
        once a minute per queue."""
        now = time.time()
        if now - self._pruned.get(queue, 0.0) < PRUNE_EVERY_S:
            return
        self._pruned[queue] = now
        directory = os.path.join(self._dir, queue)
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime >= ATTEMPT_TTL_S + 60:
                        os.unlink(entry.path)

    # -- first receives --------------------------------------------------------------------------
    def first_receive_ms(self, queue: str, message_id: str, receive_count: int, now_ms: int) -> int:
        """When the message was first received, as far as this process knows."""
        key = (queue, message_id)
        known = self._first.get(key)
        if known is not None:
            self._first.move_to_end(key)
            return known
        if receive_count <= 1:
            self._first[key] = now_ms
            if len(self._first) > MAX_FIRST_RECEIVES:
                self._first.popitem(last=False)
            return now_ms
        return -1  # unknown


_MEMORIES: weakref.WeakKeyDictionary[object, ReceiveMemory] = weakref.WeakKeyDictionary()


def memory_for(owner: object, store: Store) -> ReceiveMemory:
    """The memory of one broker (one per server process and root `store`)."""
    memory = _MEMORIES.get(owner)
    if memory is None:
        memory = _MEMORIES[owner] = ReceiveMemory(store.root, store.access)
    return memory
