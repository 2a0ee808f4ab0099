"""The server-wide budget for message bodies held in memory (one per worker process).

Every request body is reserved against it before it is read (from its Content-Length, or chunk
by chunk when it is sent chunked) and given back once its request is answered; a request that
does not fit gets 503 + Retry-After without its body being read, which a retry cures once other
requests finish. Response bodies that a slow reader leaves in a connection's write buffer are
charged too (unconditionally: they are already in memory), so many slow downloads make new
uploads wait instead of letting the sum grow.

Without a budget nothing bounds the sum over thousands of connections of up to `max_body_bytes`
each. The event loop is the only user: no lock.
"""

from __future__ import annotations

import os

DEFAULT_FRACTION_OF_RAM = 4  # a quarter of physical memory...
DEFAULT_CEILING_BYTES = 512 * 1024 * 1024  # ...and at most this


def default_body_memory_bytes() -> int:
    """min(512 MiB, a quarter of RAM): room for eight bodies of the default 64 MiB limit."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return DEFAULT_CEILING_BYTES
    return min(DEFAULT_CEILING_BYTES, ram // DEFAULT_FRACTION_OF_RAM)


class MemoryBudget:
    """Bytes that may be held at once; `held` never exceeds `limit` through `try_take`."""

    __slots__ = ("held", "limit", "peak")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a memory budget must be at least 1 byte")
        self.limit = limit
        self.held = 0
        self.peak = 0

    def try_take(self, size: int) -> bool:
        """Reserve `size` bytes if they fit; False (nothing reserved) if they do not."""
        if self.held + size > self.limit:
            return False
        self.take(size)
        return True

    def take(self, size: int) -> None:
        """Charge bytes that are held already, fit or not."""
        self.held += size
        self.peak = max(self.peak, self.held)

    def give(self, size: int) -> None:
        self.held = max(0, self.held - size)
