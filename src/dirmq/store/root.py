"""A root directory of queues: create, open, list, reconfigure and delete them.

A queue is any directory under the root that holds `@queue.json`; names may nest
(`fish/saltwater`), and a queue may have child queues. Deleting a queue first removes its
configuration (so nobody opens it any more), then moves each state directory into `@trash`
(atomically, so a concurrent put fails with QueueNotFound instead of stranding a message), then
removes the trash.

Why it is long: the Store is the library's front door; what it holds per process (the open
queues and their one-read opening, the shared inotify hub, the group commit, the root's access)
is created, shared and closed together here.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

from dirmq.errors import (
    ConfigError,
    CorruptConfig,
    InvalidArgument,
    QueueExists,
    QueueNotFound,
    storage_error,
)
from dirmq.store import layout, smallfiles
from dirmq.store.config import QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.dataflush import DataFlush
from dirmq.store.events import StoreEvents, with_quarantined
from dirmq.store.filemodes import GROUP, PRIVATE, Access, conform, group_id, mismatches, root_access
from dirmq.store.filesystems import resolve_shared
from dirmq.store.fsio import GroupCommit
from dirmq.store.holders import Holders
from dirmq.store.journal import Journal
from dirmq.store.journal_judge import marked_unflushed
from dirmq.store.journal_replay import recover_journals
from dirmq.store.marker import (
    check_readable,
    format_to_write,
    mark_current,
    root_marker_bytes,
    write_marker,
)
from dirmq.store.names import queue_path
from dirmq.store.queue import Queue
from dirmq.store.watch import InotifyHub, polls
from dirmq.store.writeback import WritebackFlusher

log = logging.getLogger(__name__)

DEFAULT_ROOT = "./dirmq-data"
EXISTS_RECHECK_S = 0.5
# Configurations parsed, by their file's bytes: most queues of a root share a few (the defaults),
# and a parse and its checks cost 3x the read (a long poll on each of thousands of queues opens
# each once, on the server's event loop). Cleared when full.
PARSED_CONFIGS = 256


def _config_stat(name: str, path: str) -> os.stat_result:
    """The stat of queue `name`'s @queue.json (under `path`); QueueNotFound if there is none."""
    try:
        return os.stat(path + "/" + layout.CONFIG_FILE)
    except (FileNotFoundError, NotADirectoryError):
        raise QueueNotFound.missing(name) from None
    except OSError as exc:
        raise storage_error(exc, f"reading the configuration of queue {name!r}") from exc


def default_root() -> str:
    return os.environ.get("DIRMQ_ROOT") or DEFAULT_ROOT


class Store:
    """Every queue under one root, as seen by this process. Thread-safe.

    `watch_mode`: "auto" (inotify, or polling on network filesystems), "inotify" or "poll".
    `events` are told of failures as they happen (events.py: a corrupt file set aside, a dead
    letter, expired leases, a redrive); `on_quarantine` is `events.quarantined` alone. Each must
    be quick and thread-safe (a metric's counter).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        create: bool = True,
        watch_mode: str = "auto",
        poll_interval_s: float = 0.5,
        on_quarantine: Callable[[str], None] | None = None,
        events: StoreEvents | None = None,
        shared: bool | None = None,
        journal: bool = True,
    ) -> None:
        """`shared`: the shared-filesystem mode (docs/FORMAT.md, "Filesystems") on or off;
        None chooses it from the filesystem the root is on (`filesystems.is_shared`).
        `journal`: writethrough publishes on a local filesystem committed through the commit
        journal (journal.py: one `fdatasync` a group; the root becomes format 6 at its first
        use); False flushes each group's files and directories as format 5 did. Either way,
        opening recovers the journals other processes left (journal_replay.py)."""
        self.root = os.path.abspath(os.fspath(root if root is not None else default_root()))
        marker = os.path.join(self.root, layout.ROOT_MARKER)
        if not _exists(marker):
            if not create:
                raise QueueNotFound(f"{self.root} is not a dirmq root (no {layout.ROOT_MARKER})")
            _init_root(self.root, Access.named(PRIVATE))
        try:
            # Read once: every file and directory this Store (and the layers above it, through
            # `store.access`) creates under the root gets the modes it says.
            self.access = root_access(self.root)
        except OSError as exc:
            raise storage_error(exc, f"reading {marker}") from exc
        check_readable(self.root)
        mark_current(self.root)
        try:
            recover_journals(self.root, self.access)
        except OSError as exc:
            # A reader that may not write (a read-only mount, another user's root) leaves the
            # journals to the next process that may: they lose nothing meanwhile.
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise storage_error(exc, f"recovering the commit journals of {self.root}") from exc
        shared = resolve_shared(shared, self.root)
        self.journal = Journal(self.root, self.access, enabled=journal and not shared)
        self.group_commit = GroupCommit(DataFlush().flush)
        self.writeback = WritebackFlusher(self.root)
        # What each queue is given of this Store (queues never see the Store itself).
        self.context = QueueContext(
            watch_mode=watch_mode,
            poll_interval_s=poll_interval_s,
            inotify_hub=self.inotify_hub,
            group_commit=self.group_commit,
            writeback=self.writeback,
            dead_letter_dir=self.dead_letter_dir,
            events=with_quarantined(events, on_quarantine),
            access=self.access,
            shared=shared,
            journal=self.journal,
            holders=Holders(self.root, self.access),
            parse_config=self._parse_config,
        )
        self._queues: dict[str, Queue] = {}
        self._checked: dict[str, float] = {}  # name -> when its @queue.json was last seen
        self._parsed: dict[bytes, QueueConfig] = {}  # see PARSED_CONFIGS
        self._polled_devices: dict[int, bool] = {}  # st_dev -> polled under "auto": _polls
        self._lock = threading.Lock()
        self._hub: InotifyHub | None = None

    @property
    def watch_mode(self) -> str:
        return self.context.watch_mode

    @watch_mode.setter
    def watch_mode(self, mode: str) -> None:
        """For queues opened from now on (an open queue keeps how it watches)."""
        self.context = replace(self.context, watch_mode=mode)

    @property
    def poll_interval_s(self) -> float:
        return self.context.poll_interval_s

    # -- queues ----------------------------------------------------------------------------------
    def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = True
    ) -> Queue:
        """Create queue `name` (and its parents' directories). With `exist_ok`, an existing
        queue is returned unchanged; otherwise QueueExists."""
        path = queue_path(self.root, name)
        config_path = os.path.join(path, layout.CONFIG_FILE)
        if os.path.exists(config_path):
            if not exist_ok:
                raise QueueExists(f"queue {name!r} already exists")
            return self.queue(name)
        config = config or QueueConfig()
        self._check_dead_letter_queue(name, config.dead_letter_queue)
        try:
            for directory in layout.STATE_DIRS:
                self.access.makedirs(os.path.join(path, directory))
            # The config file appears last: a queue is visible only once complete.
            created = smallfiles.create_file(
                config_path, config.dumps(), durable=True, access=self.access
            )
        except OSError as exc:
            raise storage_error(exc, f"creating queue {name!r}") from exc
        if not created and not exist_ok:
            raise QueueExists(f"queue {name!r} already exists")
        return self.queue(name)

    def queue(self, name: str, *, lazy: bool = False) -> Queue:
        """Open an existing queue (QueueNotFound if absent). One object per name per Store.

        An open queue is re-checked for existence at most every 0.5 s (as its configuration is):
        this is on every request's path in the server. `lazy`: a queue not open yet has its
        configuration read at its first use (a bad one is reported then), only its existence
        checked now: one stat instead of a read (the server's, whose long polls open thousands
        of queues on its event loop, most of them only to wait on)."""
        now = time.monotonic()
        with self._lock:
            cached = self._queues.get(name)
            if cached is not None and now - self._checked.get(name, 0.0) < EXISTS_RECHECK_S:
                return cached
        path = queue_path(self.root, name)  # validated here, once
        with self._lock:
            cached = self._queues.get(name)
            if cached is not None:
                try:
                    os.stat(os.path.join(cached.path, layout.CONFIG_FILE))
                except (FileNotFoundError, NotADirectoryError):
                    pass  # deleted, or deleted and created again: read it afresh below
                except OSError:
                    return cached  # cannot tell now: keep it, and look again next time
                else:
                    self._checked[name] = now
                    return cached
            if lazy:
                config, st = None, _config_stat(name, path)
            else:
                config, st = self._read_config_stamped(name, path)
            if cached is not None:
                cached.close()
            stamp = (st.st_ino, st.st_mtime_ns)
            polled = self._polls(st.st_dev, path)
            queue = Queue(self.context, name, path, config, config_stamp=stamp, polled=polled)
            self._queues[name] = queue
            self._checked[name] = now
            return queue

    def _read_config_stamped(self, name: str, path: str) -> tuple[QueueConfig, os.stat_result]:
        """The configuration and its file's stat: the queue's first index build then stats
        the file rather than reading and parsing it again (a long poll on each of thousands
        of queues opens each once, on the server's event loop)."""
        try:
            fd = os.open(os.path.join(path, layout.CONFIG_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise QueueNotFound.missing(name) from None
        except OSError as exc:
            raise storage_error(exc, f"reading the configuration of queue {name!r}") from exc
        try:
            st = os.fstat(fd)
            raw = os.read(fd, st.st_size + 1)  # whole: the file is replaced, never rewritten
        except OSError as exc:
            raise storage_error(exc, f"reading the configuration of queue {name!r}") from exc
        finally:
            os.close(fd)
        try:
            config = self._parse_config(raw)
        except ConfigError as exc:
            raise CorruptConfig(f"queue {name!r}: stored configuration: {exc}") from exc
        return config, st

    def _polls(self, device: int, path: str) -> bool:
        """Whether a queue at `path`, on `device` (its @queue.json's st_dev), is watched by
        polling (`watch.polls`): under "auto", a statfs once a device, not once a queue (a
        long poll on each of thousands of queues opens each on the server's event loop)."""
        mode = self.context.watch_mode
        if mode != "auto":
            return mode == "poll"
        polled = self._polled_devices.get(device)
        if polled is None:
            polled = self._polled_devices[device] = polls(mode, path)
        return polled

    def _parse_config(self, raw: bytes) -> QueueConfig:
        """`QueueConfig.loads(raw)`, shared by queues whose @queue.json has the same bytes
        (ConfigError if bad); any thread (`QueueContext.parse_config`)."""
        config = self._parsed.get(raw)
        if config is None:
            config = QueueConfig.loads(raw)
            if not config.metadata:  # shared by queues alike: nothing mutable in it
                if len(self._parsed) >= PARSED_CONFIGS:
                    self._parsed.clear()
                self._parsed[raw] = config  # (one dict operation each: no lock needed)
        return config

    def _read_config(self, name: str, path: str) -> QueueConfig:
        try:
            with open(os.path.join(path, layout.CONFIG_FILE), "rb") as f:
                return QueueConfig.loads(f.read())
        except (FileNotFoundError, NotADirectoryError):
            raise QueueNotFound.missing(name) from None
        except ConfigError as exc:
            raise CorruptConfig(f"queue {name!r}: stored configuration: {exc}") from exc
        except OSError as exc:
            raise storage_error(exc, f"reading the configuration of queue {name!r}") from exc

    def exists(self, name: str) -> bool:
        return os.path.exists(os.path.join(queue_path(self.root, name), layout.CONFIG_FILE))

    def configure(self, name: str, **changes: object) -> QueueConfig:
        """Change settings of queue `name`; other processes see them within 0.5 s."""
        path = queue_path(self.root, name)
        config = self._read_config(name, path).updated(**changes)
        if "dead_letter_queue" in changes:
            self._check_dead_letter_queue(name, config.dead_letter_queue)
        try:
            smallfiles.replace_file(
                os.path.join(path, layout.CONFIG_FILE),
                config.dumps(),
                durable=True,
                access=self.access,
            )
        except OSError as exc:
            raise storage_error(exc, f"configuring queue {name!r}") from exc
        with self._lock:
            cached = self._queues.get(name)
        if cached is not None:
            cached.reload_config()  # this process sees its own change at once
        return config

    def _check_dead_letter_queue(self, name: str, dlq: str | None) -> None:
        """InvalidArgument unless `dlq` (a queue's `dead_letter_queue`) is unset or another
        queue that exists: a typo would otherwise send dead letters to the queue's own @dead
        unnoticed, and a queue that is its own dead-letter queue would retry forever."""
        if dlq is None:
            return
        if dlq == name:
            raise InvalidArgument(
                f"queue {name!r} cannot be its own dead-letter queue: name another queue, or "
                "none (its dead letters then stay in its own dead area)"
            )
        if not self.exists(dlq):
            raise InvalidArgument(
                f"dead-letter queue {dlq!r} does not exist: create it first "
                f"(dirmq create {dlq}, or PUT /{dlq})"
            )

    def list_queues(self, prefix: str = "") -> list[str]:
        """Names of every queue under the root, sorted, optionally filtered by name prefix."""
        return sorted(n for n in self._walk() if n.startswith(prefix))

    def _walk(self) -> Iterator[str]:
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith("@")]
            if layout.CONFIG_FILE in filenames and dirpath != self.root:
                yield os.path.relpath(dirpath, self.root).replace(os.sep, "/")

    def delete_queue(self, name: str) -> None:
        """Delete queue `name` and every message in it, in flight or not. Child queues stay."""
        path = queue_path(self.root, name)
        try:
            os.unlink(os.path.join(path, layout.CONFIG_FILE))
        except FileNotFoundError:
            raise QueueNotFound.missing(name) from None
        except OSError as exc:
            raise storage_error(exc, f"deleting queue {name!r}") from exc
        self.journal.forget(name)
        trash = os.path.join(self.root, layout.ROOT_TRASH)
        self.access.makedirs(trash)
        for directory in layout.STATE_DIRS:
            try:
                os.rename(os.path.join(path, directory), os.path.join(trash, uuid.uuid4().hex))
            except FileNotFoundError:
                continue
        with self._lock:
            cached = self._queues.pop(name, None)
            self._checked.pop(name, None)
        if cached is not None:
            cached.close()
        self.empty_trash()
        _remove_empty_parents(path, self.root)

    def empty_trash(self) -> None:
        trash = os.path.join(self.root, layout.ROOT_TRASH)
        try:
            entries = os.listdir(trash)
        except FileNotFoundError:
            return
        for entry in entries:
            shutil.rmtree(os.path.join(trash, entry), ignore_errors=True)

    def dead_letter_dir(self, name: str | None) -> str | None:
        """The @ready directory of dead-letter queue `name`, or None if unset or absent."""
        if not name:
            return None
        path = queue_path(self.root, name)
        if not os.path.exists(os.path.join(path, layout.CONFIG_FILE)):
            return None
        return os.path.join(path, layout.READY)

    def sweep_journals(self) -> int:
        """Flush and remove the commit journals of processes of this boot that died (and replay
        an earlier boot's), as an open does; the number of messages written back. A process
        that publishes runs this every 10 s in its checkpoints; a long-lived one that may only
        consume (the server) calls it now and then, or a dead publisher's journal would outlive
        the acks of what it covers, and a machine crash later bring all of those back. A
        failure is logged (the journals are kept: journal_replay.py), never raised."""
        try:
            return recover_journals(self.root, self.access)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                log.warning("recovering the commit journals of %s: %s", self.root, exc)
            return 0

    def release_idle(self, idle_s: float) -> int:
        """Stop watching every open queue that nobody waits on (no long poll, no blocked get,
        no subscriber) and nobody used for `idle_s` seconds, and forget its index: its four
        inotify watches go back to the user's budget, its index's memory to the allocator. Its
        next use builds both again (one listing of its directories), as the first use did.
        Returns how many queues were released. A long-lived process that touches many queues
        (the server) calls it now and then."""
        unused_since = time.monotonic() - idle_s
        with self._lock:
            queues = list(self._queues.values())
        return sum(queue.release_if_idle(unused_since) for queue in queues)

    def inotify_hub(self) -> InotifyHub:
        """The one inotify instance shared by every queue this Store watches."""
        with self._lock:
            if self._hub is None:
                self._hub = InotifyHub()
            return self._hub

    def watch_fileno(self) -> int | None:
        """The shared inotify descriptor, for an event loop to pump (`pump_watches`) when it
        becomes readable; None until a queue is watched or when polling."""
        return self._hub.fileno() if self._hub is not None else None

    def pump_watches(self) -> None:
        if self._hub is not None:
            self._hub.pump()

    def close(self) -> None:
        self.writeback.flush_now()
        self.journal.close()  # a last checkpoint: nothing of this Store left to recover
        with self._lock:
            for queue in self._queues.values():
                queue.close()
            self._queues.clear()
            if self._hub is not None:
                self._hub.close()
                self._hub = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _exists(marker: str) -> bool:
    """Whether the root marker exists; StorageError if that cannot be told (a root this user
    may not enter is not "no root", which would invite creating one)."""
    try:
        os.stat(marker)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise storage_error(exc, f"opening root {os.path.dirname(marker)}") from exc
    return True


def _init_root(root: str, access: Access, *, replace_marker: bool = False) -> None:
    """Make `root` a root of `access`: its directory (missing parents as `mkdir -p` makes them)
    and its marker. Without `replace_marker` an existing marker is kept (of processes making one
    root at once, one writes it); a directory that was there already gets the access's mode
    when its marker is made here (where this user may change it): the root is new, whoever
    made its directory."""
    marker = os.path.join(root, layout.ROOT_MARKER)
    try:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        try:
            access.mkdir(root)
            existed = False
        except FileExistsError:
            existed = True
        if replace_marker:
            write_marker(root, access)
        elif (
            smallfiles.create_file(
                marker,
                root_marker_bytes(access, format_to_write(root)),
                durable=True,
                access=access,
            )
            and existed
        ):
            with contextlib.suppress(PermissionError):
                os.chmod(root, access.dir_mode)
    except OSError as exc:
        raise storage_error(exc, f"initialising root {root}") from exc


def init_root(root: str | os.PathLike[str], *, group: str | int | None = None) -> int:
    """Make `root` a private root, or with `group` a root shared by that group (a name or a
    number), whether it exists or not: its marker records the access, and every entry already
    under it is given the modes (and group) new ones get. Returns how many entries were changed.
    Processes that have the root open keep the access they read until they open it again.
    InvalidArgument for an unknown group; StorageError if an entry cannot be changed (another
    user's file: run it as that user, or as root)."""
    path = os.path.abspath(os.fspath(root))
    access = Access.named(PRIVATE if group is None else GROUP)
    gid = None if group is None else group_id(group)
    _init_root(path, access, replace_marker=True)  # then the walk gives the root its modes
    changed = 0
    try:
        journals = os.path.join(path, layout.JOURNAL_DIR) + "/"
        for entry, st, _problem in list(mismatches(path, access, gid)):
            if entry.startswith(journals) and marked_unflushed(entry):
                continue  # its mode keeps it until a reboot replays it
            try:
                conform(entry, st, access, gid)
            except FileNotFoundError:
                continue
            changed += 1
    except OSError as exc:
        raise storage_error(exc, f"giving the entries of {path} the root's access") from exc
    return changed


def _remove_empty_parents(path: str, root: str) -> None:
    root = os.path.abspath(root)
    current = os.path.abspath(path)
    while current != root and current.startswith(root):
        try:
            os.rmdir(current)
        except OSError:
            return
        current = os.path.dirname(current)
