"""The server-wide budget for message bodies held in memory (one per worker process).

Every request body is reserved against it before it is read (from its Content-Length, or chunk
by chunk when it is sent chunked) and given back once its request is answered; a request that
does not fit gets 503 + Retry-After without its body being read, which a retry cures once other
requests finish. Response bodies that a slow reader leaves in a connection's write buffer are
charged too (unconditionally: they are already in memory), so many slow downloads make new
uploads wait instead of letting the sum grow. A large body written to its sink as it arrives
(bodies.py: a message's file) is charged only the window it may hold at a time, whatever its
size; the budget bounds how many such uploads run at once. A body sent from its file
(filesend.py) is not in memory, and is not charged.

Without a budget nothing bounds the sum over thousands of connections of up to `max_body_bytes`
each. With `--workers N` the budget is the server's, not each worker's: every worker publishes
what it holds in its own slot of an array the supervisor shares with them before forking, and
checks the sum of all slots before it reserves more (it zeroes a dead worker's slot before
replacing it). Two workers reserving at the same instant may both pass, so the sum can exceed
the limit by at most one body per worker; no lock is taken on the request path. Within a
worker, the event loop is the only user.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from typing import Protocol

DEFAULT_FRACTION_OF_RAM = 4  # a quarter of physical memory...
DEFAULT_CEILING_BYTES = 512 * 1024 * 1024  # ...and at most this


def default_body_memory_bytes() -> int:
    """min(512 MiB, a quarter of RAM): room for eight bodies of the default 64 MiB limit."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return DEFAULT_CEILING_BYTES
    return min(DEFAULT_CEILING_BYTES, ram // DEFAULT_FRACTION_OF_RAM)


class WorkerSlots(Protocol):
    """What each worker holds, by worker number."""

    def __getitem__(self, worker: int, /) -> int: ...
    def __setitem__(self, worker: int, held: int, /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...


def shared_slots(workers: int) -> WorkerSlots:
    """One slot per worker in memory that forked workers share (create it before forking)."""
    from multiprocessing.sharedctypes import RawArray

    return RawArray(ctypes.c_int64, workers)


class MemoryBudget:
    """Bytes that may be held at once; what is held, over every worker sharing `slots`, never
    exceeds `limit` through `try_take` (but for reservations racing in other workers)."""

    __slots__ = ("_slot", "_slots", "held", "limit", "peak")

    def __init__(self, limit: int, slots: WorkerSlots | None = None, slot: int = 0) -> None:
        if limit < 1:
            raise ValueError("a memory budget must be at least 1 byte")
        self.limit = limit
        self.held = 0  # by this worker
        self.peak = 0
        self._slots = slots
        self._slot = slot
        if slots is not None:
            slots[slot] = 0

    def held_by_others(self) -> int:
        """What the other workers hold now (0 without shared slots)."""
        slots = self._slots
        return 0 if slots is None else sum(slots) - slots[self._slot]

    def try_take(self, size: int) -> bool:
        """Reserve `size` bytes if they fit; False (nothing reserved) if they do not."""
        if self.held + size > self.limit:
            return False
        if self._slots is not None and self.held_by_others() + self.held + size > self.limit:
            return False
        self.take(size)
        return True

    def take(self, size: int) -> None:
        """Charge bytes that are held already, fit or not."""
        self.held += size
        self.peak = max(self.peak, self.held)
        if self._slots is not None:
            self._slots[self._slot] = self.held

    def give(self, size: int) -> None:
        self.held = max(0, self.held - size)
        if self._slots is not None:
            self._slots[self._slot] = self.held
