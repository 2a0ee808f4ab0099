"""Who holds a streaming consumer name: one running query at a time.

    <stateDir>/consumers/<queue>/@<consumer>/
      holder.<generation, 20 digits>   {"host", "pid", "started", "token", "timeout_s"}

Two queries sharing a consumer share its ledger, and would replay each other's batches: each
would deliver every message. So the name is leased. The file of the highest generation is the
holder's record, and its mtime is the holder's heartbeat, renewed by the driver's upkeep thread
(`upkeep.py`) every quarter of `timeout_s` (the query's `leaseSeconds`).

- **Taking the name**: a starting query reads the highest generation n. If that holder is
  alive, the start is refused with `ConsumerBusy`. Otherwise (no record, released, not renewed
  for its `timeout_s`, or its process is gone from this host) it creates generation n + 1 with
  `link(2)`, which refuses an existing name: of two queries starting at once, one wins, and the
  other looks again and finds the winner alive. Older generations are then removed.
- **Giving it back**: `stop()` sets the record's mtime to 0 (released). The file stays, so
  generation numbers only grow and a query that judged generation n free can never take a
  name someone re-created under a lower number.
- **Losing it**: a holder whose record was superseded (another query judged it dead: it did
  not renew for `timeout_s`) or removed (the consumer's directory was deleted, which resets the
  consumer) no longer holds the name; its next planning fails rather than deliver beside the
  new holder.

No file locks (`flock` silently fails on NFS): `link`, `utime` and a listing only. The
heartbeat is a file's mtime compared with this host's clock, so the hosts' clocks must agree to
well within `leaseSeconds` (as for message leases).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from dirmq.errors import ConsumerBusy, storage_error
from dirmq.spark import durable

_PREFIX = "holder."
RELEASED_MTIME = 0.0


def record_path(consumer_dir: str, generation: int) -> str:
    return os.path.join(consumer_dir, f"{_PREFIX}{generation:020d}")


def _generations(consumer_dir: str) -> list[int]:
    try:
        names = os.listdir(consumer_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, f"listing {consumer_dir}") from exc
    found = (n[len(_PREFIX) :] for n in names if n.startswith(_PREFIX))
    return sorted(int(g) for g in found if g.isdigit())


def _proc_stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (state first), or [] if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2 :].split()


def process_started(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None if unknown: a pid reused by
    another process does not pass for the holder."""
    fields = _proc_stat(pid)
    return fields[19].decode() if len(fields) > 19 else None


@dataclass(frozen=True)
class HolderRecord:
    host: str
    pid: int
    started: str | None
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
        if self.host != socket.gethostname():
            return True  # only the heartbeat can tell
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        fields = _proc_stat(self.pid)
        if fields[:1] == [b"Z"]:
            return False  # Spark stops a source's Python worker with a signal: no release
        started = fields[19].decode() if len(fields) > 19 else None
        return self.started is None or started is None or started == self.started


def read_record(path: str) -> HolderRecord | None:
    """The record at `path`, or None if it is gone. A damaged record counts as released."""
    try:
        renewed_at = os.stat(path).st_mtime
        raw = durable.read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, f"reading {path}") from exc
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return HolderRecord(
            str(data["host"]),
            int(data["pid"]),
            data.get("started"),
            str(data["token"]),
            float(data["timeout_s"]),
            renewed_at,
        )
    except (ValueError, KeyError, TypeError):
        return HolderRecord("", 0, None, "", 0.0, RELEASED_MTIME)


class ConsumerHold:
    """This query's hold on a consumer name (see the module docstring)."""

    def __init__(self, consumer_dir: str, label: str, generation: int, token: str) -> None:
        self._consumer_dir = consumer_dir
        self._label = label
        self._generation = generation
        self.path = record_path(consumer_dir, generation)
        self._token = token
        self._lost: str | None = None
        # The upkeep thread renews while stop() releases: a renewal must not undo a release.
        self._lock = threading.Lock()

    def renew(self) -> bool:
        """Refresh the heartbeat; False (and remembered) once the name is lost."""
        with self._lock:
            return self._renew()

    def _renew(self) -> bool:
        if self._lost is not None:
            return False
        mine = read_record(self.path)
        newer = [g for g in _generations(self._consumer_dir) if g > self._generation]
        if mine is None or mine.token != self._token or newer:
            self._lost = (
                f"{self._label} was taken over by another query (this one did not renew its "
                "hold in time)"
                if newer
                else f"{self._label} was reset: its record {self.path} is gone"
            )
            return False
        try:
            os.utime(self.path)
        except FileNotFoundError:
            return self._renew()  # removed meanwhile: say why
        except OSError as exc:
            raise storage_error(exc, f"renewing {self.path}") from exc
        return True

    def check(self) -> None:
        """Raise `ConsumerBusy` if the name was lost."""
        if self._lost is not None:
            raise ConsumerBusy(f"{self._label}: {self._lost}; stopping rather than deliver twice")

    def release(self) -> None:
        """Give the name back (it stays with whoever took it over, if someone did)."""
        with self._lock:
            if self._lost is None and self._renew():
                try:
                    os.utime(self.path, (RELEASED_MTIME, RELEASED_MTIME))
                except OSError:
                    pass  # not renewed any more: it goes stale after its timeout
            self._lost = "released"


def take(
    consumer_dir: str, label: str, timeout_s: float, attempts: int = 10, grace_s: float = 3.0
) -> ConsumerHold:
    """Take the consumer name whose ledger is `consumer_dir` for this process, or raise
    `ConsumerBusy` naming the live holder. `label` names the consumer in messages. A live
    holder on this host is given `grace_s` to go: a query stopped just now may still be ending
    (Spark returns from `stop()` before the source's Python worker has exited)."""
    grace_until = time.monotonic() + grace_s
    token = uuid.uuid4().hex
    pid = os.getpid()
    record = {
        "host": socket.gethostname(),
        "pid": pid,
        "started": process_started(pid),
        "token": token,
        "timeout_s": timeout_s,
    }
    races = 0
    while races < attempts:
        generations = _generations(consumer_dir)
        top = generations[-1] if generations else 0
        if top:
            holder = read_record(record_path(consumer_dir, top))
            if holder is None:
                races += 1
                continue  # superseded and removed meanwhile: look again
            now = time.time()
            alive = holder.is_alive(now)
            if alive and holder.host == record["host"] and time.monotonic() < grace_until:
                time.sleep(0.05)
                continue  # read the record again
            if alive:
                raise ConsumerBusy(
                    f"{label} is held by a running query ({holder.describe(now)}; "
                    f"{record_path(consumer_dir, top)}): stop that query first, or give this "
                    f"one another `consumer` name. A holder that stops renewing is taken over "
                    f"{holder.timeout_s:g} s after its last renewal"
                )
        if durable.create_file(record_path(consumer_dir, top + 1), json.dumps(record).encode()):
            for old in generations:
                try:
                    os.unlink(record_path(consumer_dir, old))
                except FileNotFoundError:
                    pass
            return ConsumerHold(consumer_dir, label, top + 1, token)
        races += 1  # another query took generation top + 1 first: look again
    raise ConsumerBusy(f"{label}: other queries keep taking the name; try again")
