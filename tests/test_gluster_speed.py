"""A `dirmq serve` on a GlusterFS mount group-commits concurrent publishes durably (issue 19).

On FUSE `syncfs` flushes nothing, so the server's batches must fsync each file; their directory
fsyncs are still shared by a batch. Observed from outside with strace on the server process:
every acknowledged message's file was fsynced before the answer, no `syncfs` was relied on,
and fewer directory fsyncs than messages were made (batches of more than one). The messages
are then read back through the volume's other mount (another host's view).
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import dirmq
from tests.support.gluster import GlusterVolume
from tests.support.servers import ServerProcess, start_server

PUBLISHERS = 24
PER_PUBLISHER = 5


@pytest.fixture
def server_on_mount(gluster_volume: GlusterVolume) -> Iterator[ServerProcess]:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (it observes the server's flushes)")
    root = Path(gluster_volume.mounts[0]) / "speed-root"
    server = start_server(root, "--workers", "1")
    try:
        yield server
    finally:
        server.stop()


class Strace:
    """strace attached to one process (ours, by PID): its fsync and syncfs calls, with paths."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self._log = open(out, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            ["strace", "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync,syncfs", "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        time.sleep(1.0)  # attaching to each thread takes a moment

    def stop(self) -> list[str]:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._log.close()
        return self.out.read_text().splitlines()


def _publish(url: str, queue: str, bodies: list[bytes]) -> list[str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    ids = []
    try:
        for body in bodies:
            conn.request("POST", f"/{queue}/messages", body)
            reply = conn.getresponse()
            payload = reply.read()
            assert reply.status == 201, (reply.status, payload[:200])
            ids.append(json.loads(payload)["id"])
    finally:
        conn.close()
    return ids


def test_concurrent_publishes_on_the_mount_are_fsynced_in_shared_batches(
    server_on_mount: ServerProcess,
    gluster_volume: GlusterVolume,
    tmp_path: Path,
) -> None:
    server = server_on_mount
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port)
    conn.request("PUT", "/speed", b"{}")
    assert conn.getresponse().status in (200, 201)
    conn.close()
    _publish(server.url, "speed", [b"warm-up"])  # the queue's publish line exists

    trace = Strace(server.proc.pid, tmp_path / "strace.txt")
    bodies = [[b"p%d-m%d" % (p, m) for m in range(PER_PUBLISHER)] for p in range(PUBLISHERS)]
    barrier = threading.Barrier(PUBLISHERS)

    def producer(mine: list[bytes]) -> list[str]:
        barrier.wait()
        return _publish(server.url, "speed", mine)

    started = time.monotonic()
    try:
        with ThreadPoolExecutor(PUBLISHERS) as pool:
            ids = [i for batch in pool.map(producer, bodies) for i in batch]
        seconds = time.monotonic() - started
    finally:
        lines = trace.stop()

    total = PUBLISHERS * PER_PUBLISHER
    assert len(set(ids)) == total
    calls = [line for line in lines if re.search(r"\b(fsync|fdatasync|syncfs)\(", line)]
    assert not [c for c in calls if "syncfs(" in c], "syncfs flushes nothing on FUSE"
    dir_flushes = [c for c in calls if re.search(r"/speed/@ready>\)", c)]
    file_flushes = [c for c in calls if "/speed/@" in c and c not in dir_flushes]
    assert len(file_flushes) >= total, (len(file_flushes), calls[:10])
    # One directory fsync per batch: batches of more than one message on average.
    assert 1 <= len(dir_flushes) < total / 2, (len(dir_flushes), total)

    # Another host's view: every acknowledged message is there, whole.
    with dirmq.Store(Path(gluster_volume.mounts[1]) / "speed-root") as other:
        got = other.queue("speed").get(max_count=total + 10, max_per_group=None)
    assert sorted(m.body for m in got if m.body != b"warm-up") == sorted(
        b for mine in bodies for b in mine
    )
    print(f"{total} publishes in {seconds:.2f} s, {len(dir_flushes)} batches")
