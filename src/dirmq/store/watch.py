"""Change notification for a queue's state directories: inotify, or polling where it cannot work.

The index of each process learns what other processes did (publish, claim, ack, requeue) from
these events instead of listing directories. inotify is used through `ctypes` (the standard
library has no binding). On NFS and other filesystems where inotify does not see other hosts'
changes, `PollingWatcher` reports `RESCAN` every `interval_s` and the index re-reads the
directories. inotify's own queue overflow also degrades to one `RESCAN`.

inotify is a per-user budget: 128 instances and `fs.inotify.max_user_watches` watches (8,192 on
many kernels), shared by every process of the user. A queue that cannot get its watches (ENOSPC,
EMFILE, ENOMEM) is polled instead, with a warning, never refused: it answers as a queue on NFS
does, its waiters woken within `poll_interval_s`. Watches are five per queue a process keeps
open; `Store.release_idle` gives back those of queues nobody waits on.

Why it is long: the one inotify instance a Store shares (the hub), each queue's view of it, the
light signal of a queue only watched until a change (long polls on idle queues), and polling
are one mechanism with one budget, and the fallbacks between them must agree.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import NamedTuple, Protocol

from dirmq.store.filesystems import is_shared
from dirmq.store.libc import LIBC_PATH

_libc = ctypes.CDLL(LIBC_PATH, use_errno=True)
log = logging.getLogger(__name__)
# What inotify_init1 and inotify_add_watch fail with once the user's inotify budget is spent.
OUT_OF_INOTIFY = frozenset({errno.ENOSPC, errno.EMFILE, errno.ENOMEM})
WARN_EVERY_S = 60.0  # at most one warning a minute about queues polled for want of watches

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")
_FS_ENCODING = sys.getfilesystemencoding()
_READ_BYTES = 1 << 16
# A read that returned less than this left no event queued (the kernel fills the buffer with
# every whole event that fits, and one event is at most a header and NAME_MAX + 1 bytes).
_SHORT_READ = _READ_BYTES - _EVENT.size - 256


class Event(NamedTuple):
    """A tuple: every process's every rename makes one in each process watching the queue, and
    a tuple is built in a fraction of a frozen dataclass's time."""

    directory: str  # the watched directory's key (e.g. "@ready")
    name: str
    added: bool  # True: the name appeared; False: it went away


RESCAN = "rescan"


class Watcher(Protocol):
    listeners: list[Callable[[], None]]
    polls: bool  # changes are noticed by polling: `fileno()` is None

    def fileno(self) -> int | None: ...
    def wait(self, timeout_s: float) -> None: ...
    def drain(self) -> list[Event] | str: ...
    def close(self) -> None: ...


class InotifyHub:
    """One inotify instance for every queue a Store watches (the kernel allows only 128
    instances per user, and watches are cheap). Whoever pumps it (any thread draining a queue,
    or an event loop reading `fileno()`) distributes events to each queue's `HubWatcher` and
    wakes that watcher's eventfd."""

    def __init__(self) -> None:
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = int(fd)
        self.lock = threading.Lock()
        # Each watched directory's subscribers, a tuple (one a directory, nearly always: a
        # tuple is one object less than a list of them for the collector, per directory).
        self._subscribers: dict[int, tuple[tuple[_Subscriber, str], ...]] = {}
        # A Store that is dropped without close() must not keep one of the user's 128
        # inotify instances.
        self._finalizer = weakref.finalize(self, _close_quietly, self._fd)

    def fileno(self) -> int:
        return self._fd

    def subscribe(self, directories: dict[str, str]) -> HubWatcher:
        watcher = HubWatcher(self)
        self._add(watcher, directories)
        return watcher

    def listen(self, directories: dict[str, str], listener: Callable[[], None]) -> ChangeSignal:
        """`listener` called when anything in `directories` changes: a `ChangeSignal`, which
        keeps no event (OSError as `subscribe`)."""
        signal = ChangeSignal(self, listener)
        self._add(signal, directories)
        return signal

    def _add(self, watcher: _Subscriber, directories: dict[str, str]) -> None:
        subscribers = self._subscribers
        try:
            with self.lock:
                for key, path in directories.items():
                    wd = add_watch(self._fd, path, _MASK | IN_ONLYDIR)
                    subscribers[wd] = (*subscribers.get(wd, ()), (watcher, key))
                    watcher.wds.append(wd)
        except OSError:
            watcher.close()  # the watches it got (and a HubWatcher's eventfd)
            raise

    def add_optional(self, watcher: HubWatcher, key: str, path: str) -> None:
        """Watch `path` for `watcher` too, as `key`: a directory whose removal is no loss
        (a delay bucket: delays.py). OSError as `subscribe`'s (FileNotFoundError: gone)."""
        with self.lock:
            if key in watcher.optional:
                return
            wd = add_watch(self._fd, path, _MASK | IN_ONLYDIR)
            self._subscribers[wd] = (*self._subscribers.get(wd, ()), (watcher, key))
            watcher.wds.append(wd)
            watcher.optional[key] = wd

    def remove_optional(self, watcher: HubWatcher, key: str) -> None:
        with self.lock:
            wd = watcher.optional.pop(key, None)
            if wd is None:
                return
            remaining = tuple(s for s in self._subscribers.get(wd, ()) if s[0] is not watcher)
            if remaining:
                self._subscribers[wd] = remaining
            else:
                self._subscribers.pop(wd, None)
                _libc.inotify_rm_watch(self._fd, wd)  # EINVAL once the kernel dropped it
            if wd in watcher.wds:
                watcher.wds.remove(wd)

    def _forget_optional(self, wd: int) -> None:
        """The kernel dropped watch `wd` (its directory went): nobody is subscribed to it any
        more (a watcher of another directory by that wd was told `lost`; under the lock)."""
        for watcher, key in self._subscribers.pop(wd, ()):
            if watcher.optional.get(key) == wd:
                del watcher.optional[key]
            if wd in watcher.wds:
                watcher.wds.remove(wd)

    def unsubscribe(self, watcher: _Subscriber) -> None:
        with self.lock:
            self._remove(watcher)

    def _remove(self, watcher: _Subscriber) -> None:
        for wd in watcher.wds:
            remaining = tuple([s for s in self._subscribers.get(wd, ()) if s[0] is not watcher])
            if remaining:
                self._subscribers[wd] = remaining
            else:
                self._subscribers.pop(wd, None)
                _libc.inotify_rm_watch(self._fd, wd)
        watcher.wds.clear()
        watcher.optional.clear()

    def pump(self) -> None:
        """Read every pending event and hand each to the watchers of its directory."""
        with self.lock:
            woken: set[_Subscriber] = set()
            while True:
                try:
                    data = os.read(self._fd, _READ_BYTES)
                except BlockingIOError:
                    break
                except OSError:  # closed
                    return
                self._dispatch(data, woken)
                if len(data) < _SHORT_READ:
                    break  # nothing was left queued: no read that only says EAGAIN
            for watcher in woken:
                watcher.signal()
        for watcher in woken:  # outside the lock: a listener may drain right away
            for listener in list(watcher.listeners):
                listener()

    def _dispatch(self, data: bytes, woken: set[_Subscriber]) -> None:
        offset, end, size = 0, len(data), _EVENT.size
        unpack, subscribed, new_event = _EVENT.unpack_from, self._subscribers, tuple.__new__
        while offset < end:
            wd, mask, _cookie, length = unpack(data, offset)
            offset += size
            raw = data[offset : offset + length]
            offset += length
            if mask & IN_Q_OVERFLOW:
                for every in subscribed.values():
                    for watcher, _key in every:
                        watcher.overflowed = True
                        woken.add(watcher)
                continue
            subscribers = subscribed.get(wd)
            if not subscribers:
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                for watcher, key in subscribers:
                    if key in watcher.optional:
                        continue  # a delay bucket removed: an event of its parent tells
                    watcher.lost = True
                    woken.add(watcher)
                if mask & IN_IGNORED:
                    self._forget_optional(wd)
                continue
            # os.fsdecode's own spelling, without its function calls.
            name = raw.rstrip(b"\0").decode(_FS_ENCODING, "surrogateescape")
            added = bool(mask & (IN_MOVED_TO | IN_CREATE))
            for watcher, key in subscribers:
                watcher.pending.append(new_event(Event, (key, name, added)))
                woken.add(watcher)

    def take(self, watcher: HubWatcher) -> list[Event] | str:
        """What `watcher` has been given since it last asked (RESCAN after an overflow)."""
        with self.lock:
            events, watcher.pending = watcher.pending, []
            if watcher.overflowed:
                watcher.overflowed = False
                return RESCAN
            return events

    def close(self) -> None:
        with self.lock:
            self._finalizer()
            self._fd = -1
            self._subscribers.clear()


class HubWatcher:
    """One queue's view of an `InotifyHub`; `fileno()` is an eventfd set when it has events.

    The eventfd is written only while somebody may be waiting on it: a thread in `wait`, or
    whoever was given `fileno()`. Most changes a server hears of are its own renames, each
    echoed back by inotify, and nobody waits for those: a write per echo, and a read to clear
    it, were two syscalls per event."""

    polls = False

    def __init__(self, hub: InotifyHub) -> None:
        self._hub = hub
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._finalizer = weakref.finalize(self, _close_quietly, self._efd)
        self.wds: list[int] = []
        # key -> wd of directories whose removal is no loss (delay buckets: `add_optional`)
        self.optional: dict[str, int] = {}
        self.listeners: list[Callable[[], None]] = []  # called (any thread) when signalled
        self.pending: list[Event] = []
        self.overflowed = False
        self.lost = False  # a watched directory was deleted or moved (the queue is gone)
        self._exposed = False  # `fileno()` was handed out: it may be selected on at any time
        self._waiting = 0  # threads in `wait` (changed under the hub's lock, as `signal` runs)
        self._written = False  # the eventfd may be set: `drain` clears it

    def signal(self) -> None:
        """There is something to take (called under the hub's lock)."""
        if self._efd >= 0 and (self._exposed or self._waiting):
            self._written = True
            os.eventfd_write(self._efd, 1)

    def fileno(self) -> int | None:
        if not self._exposed:
            with self._hub.lock:
                self._exposed = True
                if self.pending or self.overflowed or self.lost:  # arrived unsignalled
                    self.signal()
        return self._efd

    def wait(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        with self._hub.lock:
            self._waiting += 1  # before the look at `pending`: see `signal`
        try:
            if self.pending or self.overflowed or self.lost:
                return
            deadline = time.monotonic() + timeout_s
            while (remaining := deadline - time.monotonic()) > 0:
                hub_fd = self._hub.fileno()
                readable, _, _ = select.select([self._efd, hub_fd], [], [], remaining)
                if hub_fd in readable:
                    self._hub.pump()
                if self._efd in readable or self.pending or self.overflowed or self.lost:
                    return
        finally:
            with self._hub.lock:
                self._waiting -= 1

    def drain(self) -> list[Event] | str:
        self._hub.pump()
        if self._written:
            self._written = False
            try:
                os.eventfd_read(self._efd)
            except BlockingIOError:
                pass
        return self._hub.take(self)

    def watch_optional(self, key: str, path: str) -> None:
        """Watch `path` too, its events keyed `key`, its removal no loss (`add_optional`)."""
        self._hub.add_optional(self, key, path)

    def unwatch_optional(self, key: str) -> None:
        self._hub.remove_optional(self, key)

    def close(self) -> None:
        if self._efd >= 0:
            self._hub.unsubscribe(self)
            self._finalizer()
            self._efd = -1


class ChangeSignal:
    """A subscription to an `InotifyHub` that keeps no events and has no eventfd: its
    listeners are called (by whoever pumps the hub) when a watched directory changed, went
    away, or the hub overflowed. What a long poll on a queue without an index waits on
    (`QueueView.watch_if_idle`): it needs to know when to look, not what changed."""

    def __init__(self, hub: InotifyHub, listener: Callable[[], None]) -> None:
        self._hub = hub
        self.wds: list[int] = []
        self.optional: dict[str, int] = {}  # never any: see HubWatcher
        self.listeners = [listener]
        self.pending: list[Event] = []  # emptied as soon as it is filled: see `signal`
        self.overflowed = False
        self.lost = False
        self._closed = False

    def signal(self) -> None:
        """Called under the hub's lock after events were given: nobody takes them."""
        self.pending.clear()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub.unsubscribe(self)


_Subscriber = HubWatcher | ChangeSignal


class PollingWatcher:
    """For filesystems without cross-host inotify: asks for a rescan every `interval_s`."""

    polls = True

    def __init__(self, interval_s: float) -> None:
        self.listeners: list[Callable[[], None]] = []  # polling notices nothing by itself
        self._interval_s = interval_s
        self._next = time.monotonic() + interval_s

    def fileno(self) -> int | None:
        return None

    def wait(self, timeout_s: float) -> None:
        delay = min(timeout_s, self._next - time.monotonic())
        if delay > 0:
            time.sleep(delay)

    def drain(self) -> list[Event] | str:
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self._interval_s
        return RESCAN

    def close(self) -> None:
        pass


def add_watch(fd: int, path: str, mask: int) -> int:
    """inotify_add_watch(2): the watch descriptor, or OSError (ENOSPC: the user's
    max_user_watches are spent). A module function: the fault tests replace it."""
    wd = int(_libc.inotify_add_watch(fd, os.fsencode(path), mask))
    if wd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"inotify_add_watch {path}: {os.strerror(code)}")
    return wd


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def needs_polling(path: str) -> bool:
    """True on shared filesystems, where inotify misses other hosts' changes."""
    return is_shared(path)


def polls(mode: str, path: str) -> bool:
    """Whether a queue at `path` is watched by polling under watch mode `mode`: "auto"
    (inotify unless on a network filesystem), "inotify" or "poll"."""
    return mode == "poll" or (mode == "auto" and needs_polling(path))


def open_watcher(
    directories: dict[str, str],
    mode: str,
    poll_interval_s: float,
    hub: Callable[[], InotifyHub],
    polled: bool | None = None,
) -> Watcher:
    """`mode`: as in `polls`, unless `polled` (known already) says; `hub` gives the Store's
    shared inotify instance. Out of inotify instances or watches (`OUT_OF_INOTIFY`), the
    directories are polled: a warning, not an error (under "inotify" too: a queue that
    answers late beats one that fails)."""
    if polls(mode, next(iter(directories.values()))) if polled is None else polled:
        return PollingWatcher(poll_interval_s)
    try:
        return hub().subscribe(directories)
    except OSError as exc:
        if exc.errno not in OUT_OF_INOTIFY:
            raise
        _warn_polling(directories, exc)
        return PollingWatcher(poll_interval_s)


_last_warning = [-WARN_EVERY_S]  # time.monotonic() of the last warning, per process
_polled_since_warning = [0]


def _warn_polling(directories: dict[str, str], exc: OSError) -> None:
    """One warning a minute at most: past the limit every queue opened says the same."""
    _polled_since_warning[0] += 1
    now = time.monotonic()
    if now - _last_warning[0] < WARN_EVERY_S:
        return
    count, _polled_since_warning[0] = _polled_since_warning[0], 0
    _last_warning[0] = now
    where = os.path.dirname(next(iter(directories.values())))
    log.warning(
        "out of inotify watches (%s): %s and %d other watch set(s) since the last warning are "
        "polled instead; raise fs.inotify.max_user_watches (and max_user_instances)",
        exc.strerror or exc,
        where,
        count - 1,
    )
