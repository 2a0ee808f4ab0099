"""Flow control of deliveries: a paused queue delivers nothing, and a delivery rate limit is
shared by every process and server on the root.

Theory of operation. Both are keys of @queue.json (`paused`, `delivery_rate_per_s`), which
every process re-reads when it changes (view.py). A get of a paused queue claims nothing, and
while the queue is paused it reads the configuration again at each look (a stat) and looks
every `PAUSE_RECHECK_S`: a resume written by any process wakes every waiting get within that.
Leases already out are not touched.

A rate limit is a budget of deliveries per second of the wall clock, kept in files every
process sees (docs/FORMAT.md, "Flow control"): second `s` has `quota(rate, s)` slots, and a get
takes one slot per message it may claim by creating `@rate/<s>.<n>` (n below the quota) with
O_EXCL: no lock, and NFS keeps O_EXCL. The quotas of consecutive seconds add up to the rate
(floor(rate * (s + 1)) - floor(rate * s)), so 2.5/s delivers 2, 3, 2, 3... and 0.5/s one
message every other second. A get takes slots for at most what its index shows ready, and
unlinks those it did not use (others may take them in that second). Whoever takes slot 0 of a
second removes the files of earlier seconds but the last: the directory holds about two
seconds of slots. A slot file is empty and never fsynced: a crash can lose one second's count,
never a message.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from dataclasses import dataclass, field

from dirmq.errors import storage_error
from dirmq.store import layout
from dirmq.store.config import QueueConfig
from dirmq.store.filemodes import Access
from dirmq.store.index import QueueIndex
from dirmq.store.view import QueueView

RATE_DIR = layout.RATE
PAUSE_RECHECK_S = 0.2  # a paused queue's waiting gets read @queue.json this often
_EXCL = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)


def parse_slot(name: str) -> tuple[int, int] | None:
    """(second, n) of a slot file's name `<second>.<n>`, or None (not a slot)."""
    second, dot, n = name.partition(".")
    if not (dot and second.isascii() and second.isdigit() and n.isascii() and n.isdigit()):
        return None
    return int(second), int(n)


def quota(rate: float, second: int) -> int:
    """Deliveries second `second` (of the Unix epoch) may make at `rate` per second."""
    return math.floor(rate * (second + 1)) - math.floor(rate * second)


@dataclass(slots=True)
class Admission:
    """What flow control lets one look of a get claim: `count` messages (with `slots` taken for
    them); when it is 0 because of flow control, `hold_s` says when to look again."""

    count: int
    hold_s: float | None = None
    slots: list[str] = field(default_factory=list)


class RateSlots:
    """This process's taker of one queue's slots (used under the view's lock)."""

    def __init__(self, queue_dir: str, access: Access) -> None:
        self.directory = os.path.join(queue_dir, RATE_DIR)
        self._access = access
        self._second = -1
        self._next = 0  # slots below this in `_second` are known taken

    def take(self, rate: float, want: int, now_s: float) -> list[str]:
        """Up to `want` slots of the current second (their names); [] when it has none left."""
        second = int(now_s)
        if second != self._second:
            self._second, self._next = second, 0
        limit = quota(rate, second)
        taken: list[str] = []
        n = self._next
        while n < limit and len(taken) < want:
            name = f"{second}.{n}"
            if self._create(name):
                taken.append(name)
                if n == 0:
                    self._clean(second)
            n += 1
        self._next = n
        return taken

    def give_back(self, names: list[str]) -> None:
        """Unlink slots taken and not used (another get may take them within their second)."""
        for name in names:
            try:
                os.unlink(os.path.join(self.directory, name))
            except OSError:
                continue
            parsed = parse_slot(name)
            if parsed is not None and parsed[0] == self._second:
                self._next = min(self._next, parsed[1])

    def _create(self, name: str) -> bool:
        path = os.path.join(self.directory, name)
        for _attempt in range(2):
            try:
                os.close(self._access.open(path, _EXCL))
                return True
            except FileExistsError:
                return False
            except FileNotFoundError:  # the first limit set on this queue: @rate is made now
                try:
                    self._access.mkdir(self.directory)
                except FileExistsError:
                    pass
            except OSError as exc:
                raise storage_error(exc, f"taking a delivery slot in {self.directory}") from exc
        return False  # the queue went away meanwhile: its get finds out

    def _clean(self, second: int) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            parsed = parse_slot(name)
            if parsed is None or parsed[0] < second - 1:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError:
                    pass


_slots: weakref.WeakKeyDictionary[QueueView, RateSlots] = weakref.WeakKeyDictionary()
_slots_lock = threading.Lock()


def _rate_slots(view: QueueView) -> RateSlots:
    with _slots_lock:
        slots = _slots.get(view)
        if slots is None:
            slots = _slots[view] = RateSlots(view.path, view.files.context.access)
        return slots


def current_config(view: QueueView) -> QueueConfig:
    """The view's configuration, read again now if it was paused: a resume is seen at once."""
    config = view.config
    if config.paused:
        view.reload_config()
        config = view.config
    return config


def admit(
    view: QueueView, config: QueueConfig, index: QueueIndex, want: int, at_ms: int
) -> Admission:
    """How many messages a get claiming at `at_ms` may claim (call under the view's lock): its
    slots are of the second its leases say they were taken in."""
    if config.paused:
        return Admission(0, PAUSE_RECHECK_S)
    rate = config.delivery_rate_per_s
    if rate is None:
        return Admission(want)
    if not index.backlog:
        want = min(want, len(index.ready))
        if not want:
            return Admission(0)  # nothing ready: the usual wait, no slot spent
    now_s = at_ms / 1000
    taken = _rate_slots(view).take(rate, want, now_s)
    if not taken:
        return Admission(0, max(0.001, math.floor(now_s) + 1 - now_s))
    return Admission(len(taken), None, taken)


def settle(view: QueueView, admission: Admission, delivered: int) -> None:
    """Give back the slots of `admission` beyond the `delivered` messages they were taken for."""
    if len(admission.slots) > delivered:
        _rate_slots(view).give_back(admission.slots[delivered:])


def hold_s(config: QueueConfig) -> float | None:
    """When a waiter of a queue under flow control should look again though nothing changed:
    paused, soon (a resume makes no event it hears); rate-limited, at the next second."""
    if config.paused:
        return PAUSE_RECHECK_S
    if config.delivery_rate_per_s is not None:
        now_s = time.time()
        return max(0.001, math.floor(now_s) + 1 - now_s)
    return None


def admit_named(view: QueueView, config: QueueConfig, want: int, at_ms: int) -> Admission:
    """How many of `want` named ready messages a planned claim (`claim_named`, `lease_named`)
    may lease now: none while paused; under a rate limit, as many as the slots it gets (the
    others stay ready: the caller's next plan lists them again). Call under the view's lock."""
    if config.paused or not want:
        return Admission(0)
    rate = config.delivery_rate_per_s
    if rate is None:
        return Admission(want)
    taken = _rate_slots(view).take(rate, want, at_ms / 1000)
    return Admission(len(taken), None, taken)
