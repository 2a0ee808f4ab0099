"""Holds: which process holds something (a consumer name, a running task), on any filesystem.

    <directory>/<prefix><generation, 20 digits>
        {"process", "host", "pid", "started", "token", "timeout_s"}

A hold is a lease without file locks (`flock` silently fails on NFS): `link`, `utime` and a
listing only. The record of the highest generation is the holder's, and its mtime is the
holder's heartbeat, renewed (`Hold.renew`) well within `timeout_s`.

- **Taking** (`take`): read the highest generation n. If that holder is alive, the answer is
  `Busy`. Otherwise (no record, released, not renewed for its `timeout_s`, or its process is
  gone from this host) create generation n + 1 with `link(2)`, which refuses an existing name:
  of several takers at once, one wins, and the others look again and find the winner alive.
  Older generations are then removed.
- **Giving it back** (`Hold.release`): the record's mtime is set to 0 (released). The file
  stays, so generation numbers only grow and a taker that judged generation n free can never
  take a hold someone re-created under a lower number.
- **Losing it**: a holder whose record was superseded (another process judged it dead: it did
  not renew for `timeout_s`) or removed no longer holds it. `renew` says so (False) and the
  holder must stop acting as one; `Hold.lost` says why.

Alive means: renewed within its `timeout_s`, by a process that `processes.liveness` does not
call dead (`process`: its identity): a holder this process can see die (same host and pid
namespace) is taken over at once, one elsewhere once its heartbeat lapses. `host`, `pid` and
`started` are kept for people and earlier versions; a record without `process` (an earlier
version's) is judged by its heartbeat alone. The heartbeat is a file's mtime compared with this
host's clock, so the hosts' clocks must agree to well within `timeout_s` (as for message leases).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from dirmq.store import smallfiles
from dirmq.store.filemodes import Access
from dirmq.store.processes import Liveness, ProcessIdentity, current, liveness, parse_token

RELEASED_MTIME = 0.0
_GENERATION_DIGITS = 20


class Lost(StrEnum):
    """Why a `Hold` is no longer held."""

    SUPERSEDED = "superseded"  # another process took it over (this one did not renew in time)
    REMOVED = "removed"  # its record is gone (its directory was removed)
    RELEASED = "released"  # given back by `release`


def record_path(directory: str, prefix: str, generation: int) -> str:
    return os.path.join(directory, f"{prefix}{generation:0{_GENERATION_DIGITS}d}")


def generations(directory: str, prefix: str) -> list[int]:
    """The generations recorded in `directory`, ascending ([] if it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = (n[len(prefix) :] for n in names if n.startswith(prefix))
    return sorted(int(g) for g in found if len(g) == _GENERATION_DIGITS and g.isdigit())


@dataclass(frozen=True, slots=True)
class HoldRecord:
    host: str  # the holder's host name
    pid: int
    process: ProcessIdentity | None  # None in an earlier version's record
    token: str
    timeout_s: float
    renewed_at: float  # the file's mtime

    def describe(self, now: float) -> str:
        age_s = max(0.0, now - self.renewed_at)
        return f"host {self.host}, pid {self.pid}, renewed {age_s:.0f} s ago"

    def is_alive(self, now: float) -> bool:
        """Renewed within its timeout by a process that is not known to be gone."""
        if self.renewed_at == RELEASED_MTIME or now - self.renewed_at > self.timeout_s:
            return False
        return self.process is None or liveness(self.process) is not Liveness.DEAD


def read_record(path: str) -> HoldRecord | None:
    """The record at `path`, or None if it is gone. A damaged record counts as released."""
    try:
        renewed_at = os.stat(path).st_mtime
    except FileNotFoundError:
        return None
    raw = smallfiles.read_file(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return HoldRecord(
            str(data["host"]),
            int(data["pid"]),
            parse_token(data["process"]) if "process" in data else None,
            str(data["token"]),
            float(data["timeout_s"]),
            renewed_at,
        )
    except (ValueError, KeyError, TypeError):
        return HoldRecord("", 0, None, "", 0.0, RELEASED_MTIME)


@dataclass(frozen=True, slots=True)
class Busy:
    """`take` found a live holder: its `record`, at `path`."""

    path: str
    record: HoldRecord


class Hold:
    """This process's hold (see the module docstring). Thread-safe."""

    def __init__(self, directory: str, prefix: str, generation: int, token: str) -> None:
        self.directory = directory
        self.prefix = prefix
        self.generation = generation
        self.path = record_path(directory, prefix, generation)
        self._token = token
        self._lost: Lost | None = None
        # A heartbeat thread renews while another releases: a renewal must not undo a release.
        self._lock = threading.Lock()

    @property
    def lost(self) -> Lost | None:
        """Why the hold is no longer held, or None while it is (as of the last renewal)."""
        return self._lost

    def renew(self) -> bool:
        """Refresh the heartbeat; False (and remembered) once the hold is lost."""
        with self._lock:
            return self._renew()

    def _renew(self) -> bool:
        if self._lost is not None:
            return False
        mine = read_record(self.path)
        newer = [g for g in generations(self.directory, self.prefix) if g > self.generation]
        if mine is None or mine.token != self._token or newer:
            self._lost = Lost.SUPERSEDED if newer else Lost.REMOVED
            return False
        try:
            os.utime(self.path)
        except FileNotFoundError:
            return self._renew()  # removed meanwhile: say why
        return True

    def release(self) -> None:
        """Give the hold back (it stays with whoever took it over, if someone did)."""
        with self._lock:
            if self._lost is None and self._renew():
                try:
                    os.utime(self.path, (RELEASED_MTIME, RELEASED_MTIME))
                except OSError:
                    pass  # not renewed any more: it lapses after its timeout
            if self._lost is None:
                self._lost = Lost.RELEASED


def take(
    directory: str,
    prefix: str,
    timeout_s: float,
    *,
    access: Access,
    attempts: int = 10,
    grace_s: float = 0.0,
) -> Hold | Busy | None:
    """Take the hold whose records are `<directory>/<prefix>*` for this process (`directory`
    is created if need be; it and the records with the root's `access`), or return the live
    holder (`Busy`); None if other takers kept winning `attempts` times in a row. `grace_s`:
    how long a live holder on this host is given to go first (one that is stopping may not
    have released yet)."""
    grace_until = time.monotonic() + grace_s
    token = uuid.uuid4().hex
    me = current()
    host = socket.gethostname()
    record = {
        "process": me.token(),
        "host": host,
        "pid": me.pid,
        "started": str(me.start) if me.start else None,
        "token": token,
        "timeout_s": timeout_s,
    }
    races = 0
    while races < attempts:
        found = generations(directory, prefix)
        top = found[-1] if found else 0
        if top:
            path = record_path(directory, prefix, top)
            holder = read_record(path)
            if holder is None:
                races += 1
                continue  # superseded and removed meanwhile: look again
            if holder.is_alive(time.time()):
                if holder.host == host and time.monotonic() < grace_until:
                    time.sleep(0.05)
                    continue  # read the record again
                return Busy(path, holder)
        created = smallfiles.create_file(
            record_path(directory, prefix, top + 1),
            json.dumps(record).encode(),
            durable=True,
            access=access,
            make_parents=True,
        )
        if created:
            for old in found:
                try:
                    os.unlink(record_path(directory, prefix, old))
                except FileNotFoundError:
                    pass
            return Hold(directory, prefix, top + 1, token)
        races += 1  # another process took generation top + 1 first: look again
    return None
