"""What ReceiveMessage remembers between requests, in this server process only.

- ReceiveRequestAttemptId (FIFO queues): the messages a receive returned, by attempt id, for
  five minutes, so a client that lost the answer and retries with the same id gets the same
  messages and receipt handles (their visibility timeout restarts). Kept in memory: a retry
  that reaches another server process, or this one after a restart, receives afresh (the
  messages of the lost answer then come back when their visibility timeout ends).
- ApproximateFirstReceiveTimestamp: the store counts receives but does not record when the
  first one happened, so the time is remembered here when this process hands out a first
  receive (a bounded table; elsewhere the sent time stands in for it).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

ATTEMPT_TTL_S = 300.0
MAX_ATTEMPTS = 10_000
MAX_FIRST_RECEIVES = 100_000


@dataclass(slots=True)
class Attempt:
    receipts: list[str]
    messages: list[dict[str, Any]]  # as rendered for the first answer
    created: float = field(default_factory=time.monotonic)


class ReceiveMemory:
    def __init__(self) -> None:
        self._attempts: OrderedDict[tuple[str, str], Attempt] = OrderedDict()
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._first: OrderedDict[tuple[str, str], int] = OrderedDict()

    # -- attempts --------------------------------------------------------------------------------
    def lock(self, queue: str, attempt_id: str) -> asyncio.Lock:
        """Serialises receives that share an attempt id (a retry racing the original)."""
        key = (queue, attempt_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def attempt(self, queue: str, attempt_id: str) -> Attempt | None:
        self._prune()
        return self._attempts.get((queue, attempt_id))

    def remember(self, queue: str, attempt_id: str, attempt: Attempt) -> None:
        key = (queue, attempt_id)
        self._attempts.pop(key, None)
        self._attempts[key] = attempt
        self._prune()

    def forget(self, queue: str, attempt_id: str) -> None:
        self._attempts.pop((queue, attempt_id), None)

    def _prune(self) -> None:
        now = time.monotonic()
        while self._attempts:
            key, oldest = next(iter(self._attempts.items()))
            if now - oldest.created < ATTEMPT_TTL_S and len(self._attempts) <= MAX_ATTEMPTS:
                break
            del self._attempts[key]
        if len(self._locks) > 2 * MAX_ATTEMPTS or len(self._locks) > len(self._attempts) + 1000:
            for key in [k for k, lock in self._locks.items() if not lock.locked()]:
                if key not in self._attempts:
                    del self._locks[key]

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


def memory_for(owner: object) -> ReceiveMemory:
    """The memory of one broker (one per server process and root)."""
    memory = _MEMORIES.get(owner)
    if memory is None:
        memory = _MEMORIES[owner] = ReceiveMemory()
    return memory
