"""Process identity and liveness (`dirmq.store.processes`), with real processes: a live child, one
killed and reaped, a zombie, a reused pid (a wrong start time), another pid namespace (a record's
namespace id, and a real one under `unshare --pid --fork` where the machine allows it), another
host; earlier versions' names and records judged conservatively. Then the regression the issue
names: a live process in another container sharing the host name is judged dead by none of the
five users (holds, pub/sub presence, temp-file recovery, file pools, metrics directories)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import SubscriptionBusy
from dirmq.pubsub import PubSub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.server.multiprocess import MetricsFiles
from dirmq.store import holds, layout, poolreclaim, recovery
from dirmq.store.filemodes import PRIVATE, Access
from dirmq.store.fsck import fsck
from dirmq.store.holds import Busy, Hold
from dirmq.store.processes import (
    HOST_TAG,
    Liveness,
    ProcessIdentity,
    current,
    host_tag,
    liveness,
    parse_token,
)

from .support.procs import REPO, dead_pid

ACCESS = Access.named(PRIVATE)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}

# A child that says who it is, then waits for its stdin to close.
SAY_WHO = """
import sys
from dirmq.store.processes import current
print(current().token(), flush=True)
sys.stdin.read()
"""


def _child() -> tuple[subprocess.Popen[str], ProcessIdentity]:
    child = subprocess.Popen(
        [sys.executable, "-c", SAY_WHO],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert child.stdout is not None
    identity = parse_token(child.stdout.readline().strip())
    assert identity is not None
    return child, identity


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], ProcessIdentity]]:
    proc, identity = _child()
    try:
        yield proc, identity
    finally:
        proc.kill()
        proc.communicate()  # reaps it, closes its pipes


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 1 :].split()[0]


def test_this_process_and_its_token() -> None:
    me = current()
    stat = Path("/proc/self/stat").read_bytes()
    start = int(stat[stat.rindex(b")") + 2 :].split()[19])
    assert me == ProcessIdentity(HOST_TAG, os.stat("/proc/self/ns/pid").st_ino, os.getpid(), start)
    assert host_tag(socket.gethostname()) == HOST_TAG
    assert me.token() == f"{HOST_TAG}.{me.pid_ns}.{me.pid}.{me.start}"
    assert parse_token(me.token()) == me and parse_token(me.token("-"), "-") == me
    assert parse_token(me.token("-")) is None and parse_token(f"{me.token()}.1") is None
    assert parse_token("elsewhere.1.2.3") is None  # a host tag is 8 hex digits
    assert liveness(me) is Liveness.ALIVE


def test_a_forked_child_has_its_own_identity() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, current().token().encode())
        finally:
            os._exit(0)
    os.close(write)
    token = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    theirs = parse_token(token)
    assert theirs is not None and theirs.pid == pid and theirs.pid_ns == current().pid_ns
    assert theirs.start >= current().start and theirs != current()


def test_a_live_child_is_alive_and_once_killed_and_reaped_dead(
    child: tuple[subprocess.Popen[str], ProcessIdentity],
) -> None:
    proc, identity = child
    assert identity.pid == proc.pid and identity.host == HOST_TAG and identity.start
    assert liveness(identity) is Liveness.ALIVE
    proc.kill()
    proc.communicate()
    assert liveness(identity) is Liveness.DEAD


def test_a_zombie_is_dead(child: tuple[subprocess.Popen[str], ProcessIdentity]) -> None:
    proc, identity = child
    proc.kill()  # and not waited for: it stays a zombie until reaped
    deadline = time.monotonic() + 30
    while _state(proc.pid) != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.02)
    assert liveness(identity) is Liveness.DEAD


def test_a_reused_pid_is_dead(child: tuple[subprocess.Popen[str], ProcessIdentity]) -> None:
    _, identity = child  # its pid runs, but started at another time: another process
    assert liveness(replace(identity, start=identity.start - 1)) is Liveness.DEAD
    # A start time unknown (0) cannot tell: the pid alone says it runs.
    assert liveness(replace(identity, start=0)) is Liveness.ALIVE


def test_another_pid_namespace_or_host_is_unknown_alive_or_dead(
    child: tuple[subprocess.Popen[str], ProcessIdentity],
) -> None:
    _, identity = child
    dead = replace(identity, pid=dead_pid())
    for who in (identity, dead):
        assert liveness(replace(who, pid_ns=who.pid_ns + 1)) is Liveness.UNKNOWN
        assert liveness(replace(who, host=f"{int(HOST_TAG, 16) ^ 1:08x}")) is Liveness.UNKNOWN
        assert liveness(replace(who, pid_ns=0)) is Liveness.UNKNOWN  # namespace not known
    assert liveness(dead) is Liveness.DEAD


def test_earlier_versions_names_parse_with_what_they_say() -> None:
    gone = dead_pid()
    # Temp names carried the host tag and pid only.
    parsed = layout.parse_tmp(f"{'1' * 16}-{'a' * 12}.{HOST_TAG}.{gone}.tmp")
    assert parsed is not None and parsed[1] == ProcessIdentity(HOST_TAG, 0, gone, 0)
    beside = layout.parse_temp_beside(f".{'1' * 16}-{'a' * 12}.{HOST_TAG}-{gone}")
    assert beside is not None and beside[1] == ProcessIdentity(HOST_TAG, 0, gone, 0)
    assert liveness(parsed[1]) is Liveness.UNKNOWN  # its namespace is not known: never dead
    # This version's, both forms.
    message_id = f"{'1' * 16}-{'a' * 12}"
    assert layout.parse_tmp(layout.tmp_name(message_id)) == (message_id, current())
    assert layout.parse_temp_beside(layout.temp_beside(message_id)) == (message_id, current())


def _plant_hold(directory: Path, record: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "token": "theirs", "timeout_s": 30.0, **record}
    Path(holds.record_path(str(directory), "runner.", 1)).write_text(json.dumps(record))


def test_an_earlier_versions_hold_record_is_judged_by_its_heartbeat(tmp_path: Path) -> None:
    _plant_hold(tmp_path, {"pid": dead_pid(), "started": None})  # no "process"
    busy = holds.take(str(tmp_path), "runner.", 30.0, access=ACCESS)
    assert isinstance(busy, Busy) and busy.record.process is None


def test_a_hold_record_from_another_container_is_not_judged_dead(tmp_path: Path) -> None:
    """Same host name, another pid namespace, a pid that names no process here: the bug was to
    take it over at once."""
    other = ProcessIdentity(HOST_TAG, current().pid_ns + 1, dead_pid(), 1)
    _plant_hold(tmp_path, {"process": other.token(), "pid": other.pid, "started": "1"})
    busy = holds.take(str(tmp_path), "runner.", 30.0, access=ACCESS)
    assert isinstance(busy, Busy) and busy.record.process == other
    # The same record from this namespace is a dead holder's: taken over at once.
    here = replace(other, pid_ns=current().pid_ns)
    _plant_hold(tmp_path, {"process": here.token(), "pid": here.pid, "started": "1"})
    assert isinstance(holds.take(str(tmp_path), "runner.", 30.0, access=ACCESS), Hold)


def test_a_presence_from_another_container_is_not_judged_dead(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        hub = PubSub(store)
        present = Path(PubSubPaths.under(str(root)).present) / "billing"
        other = ProcessIdentity(HOST_TAG, current().pid_ns + 1, dead_pid(), 1)
        present.write_text(f"{other.token()} {uuid.uuid4().hex}")  # refreshed just now
        with pytest.raises(SubscriptionBusy):
            hub.subscribe("billing")
        # An earlier version's "<host name> <pid> <token>" of a dead pid: its heartbeat decides.
        present.write_text(f"{socket.gethostname()} {other.pid} {uuid.uuid4().hex}")
        with pytest.raises(SubscriptionBusy):
            hub.subscribe("billing")
        # The same session in this namespace is dead: taken over at once.
        present.write_text(f"{replace(other, pid_ns=current().pid_ns).token()} x")
        hub.subscribe("billing").close()


# ---- a real other pid namespace ------------------------------------------------------------

# Run under `unshare --pid --fork`, without its own /proc mount: /proc shows the outer
# namespace. It forks until its pid is one no outer process has (else the old rule, kill(pid, 0)
# here, would find some other process and pass by luck), then holds a hold, attaches a
# subscription, leaves a temp file as a writer in the middle of a put, has an own file pool and
# a metrics directory, says so, and waits for its stdin to close.
OTHER_CONTAINER = """
import os, sys
root, holds_dir, metrics_dir = sys.argv[1:4]
for _ in range(5000):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if os.path.exists(f"/proc/{os.getpid()}"):
            os._exit(3)
        break
    os.close(write)
    if os.read(read, 1):  # the child found its pid free outside: it does the work
        sys.exit(os.waitpid(pid, 0)[1] >> 8)
    os.waitpid(pid, 0)
else:
    sys.exit("no free pid found")
os.write(write, b"!")
import dirmq
from dirmq.pubsub import PubSub
from dirmq.server.multiprocess import MetricsFiles
from dirmq.store import holds, layout
from dirmq.store.filemodes import Access
from dirmq.store.processes import current
store = dirmq.Store(root)
hold = holds.take(holds_dir, "runner.", 30.0, access=Access.named("private"))
assert isinstance(hold, holds.Hold), hold
sub = PubSub(store).subscribe("billing")
q = store.queue("q")
q.ack(q.get_one().receipt)  # retired into this process's own pool
temp = os.path.join(q.path, layout.TMP, layout.tmp_name(dirmq.store.ids.new_id()))
os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # the root's access
metrics = MetricsFiles.create(metrics_dir)
print(current().token(), temp, metrics.path, flush=True)
sys.stdin.read()
sub.close()
hold.release()
"""


def _unshare() -> list[str]:
    """The command that runs a program in a new pid namespace here, or skip saying why not."""
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` (util-linux) here: no second pid namespace to run a process in")
    tried = []
    for command in (
        ["unshare", "--pid", "--fork"],
        ["unshare", "--user", "--map-root-user", "--pid", "--fork"],
    ):
        probe = subprocess.run([*command, "true"], check=False, capture_output=True, text=True)
        if probe.returncode == 0:
            return command
        tried.append(f"{' '.join(command)}: {probe.stderr.strip()}")
    pytest.skip(
        "no new pid namespace allowed here (needs root or unprivileged user namespaces): "
        + "; ".join(tried)
    )


def test_a_live_process_in_another_pid_namespace_is_judged_dead_by_none(tmp_path: Path) -> None:
    command = _unshare()
    root, holds_dir, metrics_dir = tmp_path / "root", tmp_path / "holds", tmp_path / "metrics"
    metrics_dir.mkdir()
    with dirmq.Store(root) as store:
        PubSub(store)  # lays out @pubsub
        q = store.create_queue("q")
        q.put(b"one")
    program = [sys.executable, "-c", OTHER_CONTAINER, str(root), str(holds_dir), str(metrics_dir)]
    other = subprocess.Popen(
        [*command, *program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert other.stdout is not None
        token, temp, their_metrics = other.stdout.readline().split()
        theirs = parse_token(token)
        assert theirs is not None and theirs.host == HOST_TAG
        assert theirs.pid_ns != current().pid_ns and not Path(f"/proc/{theirs.pid}").exists()
        assert liveness(theirs) is Liveness.UNKNOWN
        # Holds: busy.
        busy = holds.take(str(holds_dir), "runner.", 30.0, access=ACCESS)
        assert isinstance(busy, Busy) and busy.record.process == theirs
        with dirmq.Store(root) as store:
            # Pub/sub presence: attached.
            with pytest.raises(SubscriptionBusy):
                PubSub(store).subscribe("billing")
            # A writer's temp file and its own pool: left alone by a sweep and by fsck.
            queue = store.queue("q")
            (pool_dir,) = [p for p in Path(queue.path, layout.FREE).iterdir() if p.is_dir()]
            assert parse_token(pool_dir.name.rsplit("-", 1)[0]) == theirs
            assert not recovery.is_orphan(temp, os.path.basename(temp))
            assert poolreclaim.pool_owner(pool_dir.name, str(pool_dir)) is poolreclaim.Owner.ALIVE
            report = queue.sweep()
            assert (report.orphans_removed, report.pools_reclaimed) == (0, 0)
            assert Path(temp).exists() and pool_dir.exists()
            found = fsck(root, repair=True).problems
            assert not [p for p in found if p.path in (temp, str(pool_dir))]
            assert Path(temp).exists() and pool_dir.exists()
        # Metrics: a starting server leaves its directory alone.
        with MetricsFiles.create(str(metrics_dir)):
            assert Path(their_metrics).exists()
    finally:
        other.communicate(timeout=60)  # its stdin closed: it detaches, releases, exits
    assert other.returncode == 0
