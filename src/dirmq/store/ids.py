"""Message ids: sortable by publish time, unique across processes and hosts.

An id is `<microseconds since the epoch, 16 digits>-<node, 12 hex digits>`. Within a process the
time part strictly increases (a clock step backwards or two ids in one microsecond borrow the next
microsecond), so one producer's messages keep their order. The node is 48 random bits drawn per
process (and again after `fork`), so two processes or hosts never mint the same id in practice;
FIFO across producers means id order, i.e. publish time to the microsecond.
"""

from __future__ import annotations

import os
import re
import threading
import time

ID_PATTERN = r"[0-9]{16}-[0-9a-f]{12}"
_ID_RE = re.compile(ID_PATTERN)

_lock = threading.Lock()
_node = ""
_last_us = 0


def _reset_node() -> None:
    global _node, _last_us
    _node = os.urandom(6).hex()
    _last_us = 0


_reset_node()
os.register_at_fork(after_in_child=_reset_node)


def new_id() -> str:
    """A fresh id, greater than every id this process minted before."""
    global _last_us
    with _lock:
        _last_us = max(time.time_ns() // 1000, _last_us + 1)
        return f"{_last_us:016d}-{_node}"


def new_ids(count: int) -> list[str]:
    """`count` fresh ids in increasing order (one lock for the lot: a batch's ids)."""
    global _last_us
    with _lock:
        first = max(time.time_ns() // 1000, _last_us + 1)
        _last_us = first + count - 1
        return [f"{us:016d}-{_node}" for us in range(first, first + count)]


def is_id(text: str) -> bool:
    return _ID_RE.fullmatch(text) is not None


def id_time_us(message_id: str) -> int:
    """Publish time of an id, in microseconds since the epoch."""
    return int(message_id[:16])
