"""Who holds a lease: a token in the lease's name, naming a record written once per process.

Theory of operation. A get is one rename and must stay one, so who holds a lease cannot be a
file written per lease. Each process writes instead, once per label (a server's principal,
a Spark consumer name, a library caller's `consumer=`; or none), one small record

    <root>/@holders/<token>.json   {"host", "host_tag", "pidns", "pid", "start", "program",
                                    "label", "created"}

(temp + rename, `smallfiles.py`), before the first lease that names it, and puts `+<token>` in
the name of each lease it takes for that label (`layout.timed_name`). The token is 12 random
hex digits: a record is never rewritten, so a reader caches it for good. An extension keeps
the token (the same holder); a nack, an expiry or a dead-letter drops it (nobody holds a ready
message). A record this process cannot write (a read-only root) costs nothing but the holder:
the lease is taken without a token, and shows as unknown.

A record whose process is gone (this host and pid namespace, no process with that pid and
start time: the pools' rule, `_alive`) is removed by `sweep`, and by each process when it
first opens a queue of the root; another host's cannot be judged,
and is removed by `dirmq fsck --repair` once no lease names it and it is an hour old (a
notice, `orphan-holder`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass

from dirmq.errors import InvalidArgument
from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import Access
from dirmq.store.message import LeaseHolder
from dirmq.store.processes import Liveness, ProcessIdentity, current, liveness
from dirmq.store.recovery import older_than

log = logging.getLogger(__name__)
RECORD_SUFFIX = ".json"
MAX_LABEL_CHARS = 256
ORPHAN_RECORD_GRACE_S = 3600.0  # fsck: a record no lease names is left alone this long
_generation = 0  # bumped in a forked child: its holder records are its own, not its parent's
_program: str | None = None


def _after_fork() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_after_fork)


def set_program(name: str) -> None:
    """What this process calls itself in the holder records it writes from now on ("dirmq
    serve worker 2"); by default its command line's first word."""
    global _program
    _program = name


def program() -> str:
    if _program is not None:
        return _program
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else sys.executable
    name = os.path.basename(argv0)
    if name == "__main__.py":  # `python -m package`: the package's name says more
        name = os.path.basename(os.path.dirname(argv0))
    return name or "python"


def check_label(label: str | None) -> None:
    """A consumer label names a holder: text of at most 256 characters, no control one."""
    if label is None:
        return
    if (
        not isinstance(label, str)
        or not 0 < len(label) <= MAX_LABEL_CHARS
        or any(ord(c) < 32 or ord(c) == 127 for c in label)
    ):
        raise InvalidArgument(
            f"consumer must be text of 1 to {MAX_LABEL_CHARS} characters without control "
            f"characters, not {str(label)[:80]!r}"
        )


def token_of(holders: Holders | None, consumer: str | None) -> str | None:
    """The token this process's lease names carry (for `consumer`, if named): its record is
    written once per process and label, then it is a dict lookup."""
    if holders is None:
        return None
    check_label(consumer)
    return holders.token(consumer)


@dataclass(frozen=True, slots=True)
class _Record:
    host_tag: str
    pidns: int
    pid: int
    start: int


class Holders:
    """The holder records of one root: this process's tokens (one per label, written once),
    and the records of every process, read by token and cached. Thread-safe."""

    def __init__(self, root: str, access: Access) -> None:
        self.dir = os.path.join(root, layout.HOLDERS_DIR)
        self._access = access
        self._lock = threading.Lock()
        self._tokens: dict[str | None, str | None] = {}
        self._generation = _generation
        self._known: dict[str, LeaseHolder] = {}
        self._failed = False
        self._swept = False

    def token(self, label: str | None = None) -> str | None:
        """The token this process puts in the names of the leases it takes for `label`; its
        record is written the first time. None when it cannot be written (logged once)."""
        if self._generation == _generation:
            found = self._tokens.get(label, "")
            if found != "":
                return found
        with self._lock:
            if self._generation != _generation:
                self._tokens.clear()
                self._generation = _generation
            if label not in self._tokens:
                self._tokens[label] = self._write(label)
            return self._tokens[label]

    def _write(self, label: str | None) -> str | None:
        token = secrets.token_hex(layout.HOLDER_LENGTH // 2)
        me = current()
        record = {
            "host": socket.gethostname(),
            "host_tag": me.host,
            "pidns": me.pid_ns,
            "pid": me.pid,
            "start": me.start,
            "program": program(),
            "label": label,
            "created": time.time(),
        }
        data = json.dumps(record).encode() + b"\n"
        try:
            smallfiles.replace_file(
                self._path(token), data, durable=False, access=self._access, make_parents=True
            )
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot write holder records in %s (%s)", self.dir, exc)
            return None
        return token

    def _path(self, token: str) -> str:
        return os.path.join(self.dir, token + RECORD_SUFFIX)

    def describe(self, token: str | None) -> LeaseHolder:
        """Who holds a lease whose name carries `token`: its record (cached: records never
        change), or an unknown holder (no token: an older writer; or its record is gone)."""
        if token is None:
            return LeaseHolder(None)
        known = self._known.get(token)
        if known is not None:
            return known
        data = smallfiles.read_file(self._path(token))
        holder = _holder(token, data)
        if holder.known:
            if len(self._known) > 4096:
                self._known.clear()
            self._known[token] = holder
        return holder

    def sweep_once(self) -> None:
        """`sweep`, the first time this process opens a queue of the root: the records of
        processes that ran a get and exited (a `dirmq get` each) do not pile up between
        sweeps."""
        if not self._swept:
            self._swept = True
            self.sweep()

    def sweep(self) -> int:
        """Remove the records of processes that are gone (on this host and pid namespace);
        how many. Temps of interrupted writes an hour old go too."""
        removed = 0
        try:
            names = os.listdir(self.dir)
        except OSError:
            return 0
        for name in names:
            if not name.endswith(RECORD_SUFFIX) or len(name) != layout.HOLDER_LENGTH + 5:
                continue
            path = os.path.join(self.dir, name)
            record = _process_of(smallfiles.read_file(path))
            if record is not None and _alive(record, path) is False:
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
        smallfiles.remove_stale_temps(self.dir)
        return removed


def is_record_name(name: str) -> bool:
    token = name[: -len(RECORD_SUFFIX)]
    return (
        name.endswith(RECORD_SUFFIX)
        and len(token) == layout.HOLDER_LENGTH
        and all(c in "0123456789abcdef" for c in token)
    )


def record_alive(path: str) -> bool | None:
    """Whether the process of the record at `path` runs: None when that cannot be told (another
    host or pid namespace, or the record does not read)."""
    record = _process_of(smallfiles.read_file(path))
    return None if record is None else _alive(record, path)


def orphan_record(path: str, in_use: set[str]) -> str | None:
    """Why the record at `path` may go (fsck), or None: it is another host's (or pid
    namespace's), which no sweep here can judge, names no lease in `in_use`, and is over an
    hour old. The record of a process gone from this host is no damage: `sweep` removes it
    (as it requeues an expired lease)."""
    token = os.path.basename(path)[: layout.HOLDER_LENGTH]
    if token in in_use or not older_than(path, ORPHAN_RECORD_GRACE_S):
        return None
    if record_alive(path) is None:
        return "a holder record no lease names, of a process this host cannot judge"
    return None


def _alive(record: _Record, path: str) -> bool | None:
    """The store's one rule of process liveness (store/processes.py): True, False, or None
    for a process that cannot be judged from here (another host or pid namespace)."""
    del path  # judged from the record alone
    found = liveness(ProcessIdentity(record.host_tag, record.pidns, record.pid, record.start))
    return None if found is Liveness.UNKNOWN else found is Liveness.ALIVE


def _process_of(data: bytes | None) -> _Record | None:
    try:
        found = json.loads(data) if data else None
        if not isinstance(found, dict):
            return None
        return _Record(
            str(found["host_tag"]), int(found["pidns"]), int(found["pid"]), int(found["start"])
        )
    except (ValueError, KeyError, TypeError):
        return None


def _holder(token: str, data: bytes | None) -> LeaseHolder:
    try:
        found = json.loads(data) if data else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return LeaseHolder(token)

    def text(key: str) -> str | None:
        value = found.get(key)
        return value if isinstance(value, str) else None

    pid, created = found.get("pid"), found.get("created")
    return LeaseHolder(
        token,
        label=text("label"),
        host=text("host"),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        program=text("program"),
        created_s=float(created) if isinstance(created, (int, float)) else None,
        known=True,
    )
