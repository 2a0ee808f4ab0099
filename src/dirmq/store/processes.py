"""Process identity and liveness: the one answer to "is the process that wrote this alive?".

Whatever a process leaves on disk for others to judge (its temp files, its pool of recycled
files, a hold record, a pub/sub presence file, its metrics directory) carries its identity:

    <host>.<pidns>.<pid>.<start>        (`ProcessIdentity.token`; FORMAT.md, "Process identity")

- `<host>`: the CRC-32 of the host name, 8 hex digits (`HOST_TAG`);
- `<pidns>`: the inode of its pid namespace (`/proc/self/ns/pid`), 0 where unknown. Containers
  sharing a root often share a host name (`--network host`), and a pid means something only in
  its own namespace;
- `<pid>`: its process id, in that namespace;
- `<start>`: its start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`), 0 where
  unknown: with the pid it names one process even after the pid is reused.

`liveness` judges an identity by one rule, for every user:
- another host, an unknown namespace (0: a name or record of an earlier version) or another
  namespace: `UNKNOWN` (nothing here can see that process: never "dead" by guess; the caller
  falls back on what it has, a heartbeat or an age);
- no such pid, a zombie, or a pid whose start time differs (reused): `DEAD`;
- otherwise `ALIVE` (also when the pid runs but its start time cannot be read: a reused pid
  then keeps the dead process's things until it exits, never the other way round).

Why the start time, not just `kill(pid, 0)`: pids are reused within minutes on a busy host.
Why /proc is checked to be this namespace's: in a pid namespace without its own /proc mount
(`unshare --pid` without `--mount-proc`), `/proc/<pid>` names another namespace's process.
"""

from __future__ import annotations

import os
import re
import socket
import zlib
from dataclasses import dataclass
from enum import Enum


def host_tag(hostname: str) -> str:
    """The 8-hex tag of a host name, as identities carry it."""
    return f"{zlib.crc32(hostname.encode()):08x}"


HOST_TAG = host_tag(socket.gethostname())

_FIELD = "[0-9]{1,20}"
_TOKEN_RES = {
    sep: re.compile(
        rf"([0-9a-f]{{8}}){re.escape(sep)}({_FIELD})"
        rf"(?:{re.escape(sep)}({_FIELD}){re.escape(sep)}({_FIELD}))?"
    )
    for sep in (".", "-")
}


class Liveness(Enum):
    ALIVE = "alive"  # it runs (the pid with that start time, not a zombie)
    DEAD = "dead"  # gone for sure: what it left may be taken or removed
    UNKNOWN = "unknown"  # cannot be seen from here: judge by a heartbeat or an age instead


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    host: str  # HOST_TAG of its host
    pid_ns: int  # inode of its pid namespace, 0 if unknown
    pid: int
    start: int  # clock ticks since boot, 0 if unknown

    def token(self, sep: str = ".") -> str:
        """`<host>.<pidns>.<pid>.<start>`; `sep="-"` where a name's suffix may hold no dot (a
        temp beside its final name: GlusterFS hashes `.<x>.<suffix>` as `<x>`)."""
        return f"{self.host}{sep}{self.pid_ns}{sep}{self.pid}{sep}{self.start}"

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host} (pid namespace {self.pid_ns})"


def parse_token(text: str, sep: str = ".") -> ProcessIdentity | None:
    """The identity `token(sep)` rendered, or None. Also `<host><sep><pid>`, the temp names of
    earlier versions: namespace and start time unknown (0), which `liveness` never calls dead."""
    match = _TOKEN_RES[sep].fullmatch(text)
    if match is None:
        return None
    host, first, pid, start = match.groups()
    if pid is None:
        return ProcessIdentity(host, 0, int(first), 0)
    return ProcessIdentity(host, int(first), int(pid), int(start))


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a /proc stat file after the command name (state first), or None."""
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold anything, spaces and ")" included.
    return stat[stat.rfind(b")") + 2 :].split()


def _read_current() -> tuple[ProcessIdentity, bool]:
    """This process's identity, and whether /proc shows this pid namespace's processes."""
    pid = os.getpid()
    try:
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
        proc_is_ours = os.readlink("/proc/self") == str(pid)
    except OSError:
        pid_ns, proc_is_ours = 0, False
    fields = _stat_fields("/proc/self/stat") or []
    start = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0
    return ProcessIdentity(HOST_TAG, pid_ns, pid, start), proc_is_ours


_current, _proc_is_ours = _read_current()


def _after_fork() -> None:
    global _current, _proc_is_ours
    _current, _proc_is_ours = _read_current()


os.register_at_fork(after_in_child=_after_fork)


def current() -> ProcessIdentity:
    """This process's identity (a forked child has its own)."""
    return _current


def liveness(identity: ProcessIdentity) -> Liveness:
    """Whether the process `identity` names runs: the rule in the module docstring."""
    me = _current
    if identity.host != me.host or not identity.pid_ns or identity.pid_ns != me.pid_ns:
        return Liveness.UNKNOWN
    if identity.pid <= 0:
        return Liveness.DEAD  # no process has it (and kill would signal a group)
    fields = _stat_fields(f"/proc/{identity.pid}/stat") if _proc_is_ours else None
    if fields is None:  # gone, or no /proc of this namespace: the pid alone must do
        try:
            os.kill(identity.pid, 0)
        except ProcessLookupError:
            return Liveness.DEAD
        except PermissionError:
            pass  # it exists, another user's (hidden from /proc by `hidepid`)
        return Liveness.ALIVE
    if fields[:1] in ([b"Z"], [b"X"]):
        return Liveness.DEAD  # exited, not reaped yet: it does nothing any more
    started = int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0
    if identity.start and started and started != identity.start:
        return Liveness.DEAD  # the pid was reused by a later process
    return Liveness.ALIVE
