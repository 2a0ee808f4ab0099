"""Real filesystem faults: a full ext4 loop mount and a read-only remount.

At a full disk publishers get `DiskFull`, but consumers keep working (receives and acks never
fail for want of space) and what they acknowledge gives its space back. A lease that fails on a
read-only filesystem leaves the message where it was, in this process's view too: it is
delivered, in FIFO order, as soon as the filesystem is writable again (library and server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.store import layout
from dirmq.store.fsck import fsck

from .support.disks import ext4_loop, free_bytes, read_only, small_tmpfs
from .support.servers import start_server
from .support.waiting import wait_until


def _journal_closed(root: Path) -> None:
    """Wait until the writers' commit journals are closed (a second after their last
    publish): a file open for writing keeps a remount read-only busy."""
    journals = root / layout.JOURNAL_DIR
    wait_until(lambda: not journals.exists() or not os.listdir(journals), 10, "the journal closed")


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Path]:
    with ext4_loop(tmp_path, 32) as mount_point:
        yield mount_point


def _fill(q: dirmq.Queue, body: bytes) -> int:
    """Publish batches, then single messages, until the disk refuses; how many were stored."""
    stored = 0
    for batch in (32, 1):
        for _ in range(100_000):
            try:
                q.put_many([body] * batch)
            except dirmq.DiskFull:
                break
            stored += batch
        else:
            raise AssertionError("the disk never filled")
    return stored


def test_consumers_drain_a_full_disk_and_free_its_space(ext4: Path) -> None:
    store = dirmq.Store(ext4 / "root")
    q = store.create_queue("q")
    body = os.urandom(3000)
    stored = _fill(q, body)
    assert stored > 1000
    # At the edge of full, the blocks of the refused put's temp file come back when it is
    # removed, and one more small put may fit in them (seen once in CI): the disk stays full,
    # and refuses again within a few puts.
    for _ in range(8):
        try:
            q.put(body)
        except dirmq.DiskFull:
            break
        stored += 1
    else:
        raise AssertionError("a full disk took 8 more puts")
    at_full = free_bytes(ext4)

    received = 0
    while (message := q.get_one()) is not None:  # no DiskFull, no StorageError at all
        assert message.body == body
        q.ack(message.receipt or "")
        received += 1
    assert received == stored
    # Acknowledged files gave their space back instead of waiting in @free for recycling.
    assert free_bytes(ext4) - at_full > stored * len(body) // 2
    q.put_many([body] * 64)
    q.put(b"after")
    assert q.stats().ready == 65
    store.close()
    assert fsck(ext4 / "root", repair=False).ok


def test_a_lease_that_fails_on_a_read_only_disk_is_delivered_after(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "8m") as mount_point:
        store = dirmq.Store(mount_point / "root")
        q = store.create_queue("q")
        q.put_many([b"one", b"two", b"three"])
        _journal_closed(mount_point / "root")
        with read_only(mount_point):
            for _ in range(3):
                with pytest.raises(dirmq.StorageError, match="Read-only"):
                    q.get_one()
            assert q.stats().ready == 3
        got = []
        while (message := q.get_one()) is not None:
            q.ack(message.receipt or "")
            got.append(message.body)
        assert got == [b"one", b"two", b"three"]
        store.close()


def test_settles_that_fail_on_a_read_only_disk_work_after(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "8m") as mount_point:
        store = dirmq.Store(mount_point / "root")
        q = store.create_queue("q")
        q.put_many([b"one", b"two", b"three"])
        first, second = q.get(2)
        _journal_closed(mount_point / "root")
        with read_only(mount_point):
            with pytest.raises(dirmq.StorageError):
                q.ack(first.receipt or "")
            with pytest.raises(dirmq.StorageError):
                q.nack(second.receipt or "")
            with pytest.raises(dirmq.StorageError):
                q.put(b"four")
            with pytest.raises(dirmq.StorageError):
                q.purge()
        q.ack(first.receipt or "")
        q.nack(second.receipt or "")
        got = []
        while (message := q.get_one()) is not None:
            q.ack(message.receipt or "")
            got.append(message.body)
        assert got == [b"two", b"three"]
        store.close()
        assert fsck(mount_point / "root", repair=False).ok


def test_server_delivers_what_a_read_only_disk_refused_in_order(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "8m") as mount_point:
        root = mount_point / "root"
        server = start_server(root)
        try:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                assert client.put("/q").status_code in (200, 201)
                for body in (b"zero", b"one", b"two", b"three"):
                    assert client.post("/q/messages", content=body).status_code in (200, 201)
                first = client.get("/q/messages")
                assert first.content == b"zero"
                _journal_closed(root)
                with read_only(mount_point):
                    for _ in range(3):
                        answer = client.get("/q/messages")
                        assert answer.status_code == 503, answer.text
                        assert "Retry-After" in answer.headers
                    refused = client.delete(f"/q/messages/{first.headers['X-Receipt']}")
                    assert refused.status_code == 503, refused.text
                    assert client.post("/q/messages", content=b"four").status_code == 503
                    assert client.get("/q").json()["stats"]["total"] == 4
                acked = client.delete(f"/q/messages/{first.headers['X-Receipt']}")
                assert acked.status_code == 204, acked.text
                got = []
                for _ in range(4):
                    answer = client.get("/q/messages")
                    if answer.status_code == 204:
                        break
                    assert answer.status_code == 200, answer.text
                    got.append(answer.content)
                    receipt = answer.headers["X-Receipt"]
                    assert client.delete(f"/q/messages/{receipt}").status_code in (200, 204)
                assert got == [b"one", b"two", b"three"]
        finally:
            server.stop()
        assert sorted(os.listdir(root / "q" / layout.READY)) == []


def test_server_consumers_drain_a_full_disk_without_errors(ext4: Path) -> None:
    server = start_server(ext4 / "root")
    body = os.urandom(3000)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as admin:
            assert admin.put("/q").status_code == 201

        def publish_until_full() -> tuple[list[str], httpx.Response]:
            ids: list[str] = []
            with httpx.Client(base_url=server.url, timeout=60) as client:
                for _ in range(100_000):
                    answer = client.post("/q/messages", content=body)
                    if answer.status_code != 201:
                        return ids, answer
                    ids.append(answer.headers["X-Message-Id"])
            raise AssertionError("the disk never filled")

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda _: publish_until_full(), range(8)))
        published = {i for ids, _ in outcomes for i in ids}
        for _ids, refusal in outcomes:
            assert refusal.status_code == 503, refusal.text
            assert refusal.json()["error"] == "DiskFull"
            assert "Retry-After" in refusal.headers
        at_full = free_bytes(ext4)

        def consume() -> list[str]:
            ids: list[str] = []
            with httpx.Client(base_url=server.url, timeout=60) as client:
                while (answer := client.get("/q/messages")).status_code == 200:
                    assert answer.content == body
                    ids.append(answer.headers["X-Message-Id"])
                    receipt = answer.headers["X-Receipt"]
                    acked = client.delete(f"/q/messages/{receipt}")
                    assert acked.status_code == 204, acked.text
                assert answer.status_code == 204, answer.text  # never a 503 DiskFull
            return ids

        with ThreadPoolExecutor(4) as pool:
            received = [i for ids in pool.map(lambda _: consume(), range(4)) for i in ids]
        assert sorted(received) == sorted(published)
        assert free_bytes(ext4) - at_full > len(published) * len(body) // 2
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.post("/q/messages", content=body).status_code == 201
    finally:
        server.stop()
    assert fsck(ext4 / "root", repair=False).ok


def test_a_new_process_opens_a_queue_on_a_read_only_disk(tmp_path: Path) -> None:
    """Recovery on open (orphans, dead pools, expired leases) cannot write on a read-only
    disk: the queue still opens, reads work, and recovery happens once it is writable."""
    with small_tmpfs(tmp_path, "8m") as mount_point:
        root = mount_point / "root"
        script = (
            "import dirmq, sys\n"
            "from dirmq.store import layout\n"
            "q = dirmq.Store(sys.argv[1]).create_queue('q')\n"
            "q.put_many([b'one', b'two', b'three'])\n"
            "m = q.get_one(visibility_s=0.01)\n"
            "q.ack(q.get_one().receipt)\n"  # leaves a file in this process's pool
            f"open(q.path + '/{layout.TMP}/' + layout.tmp_name('1' * 16 + '-' + 'a' * 12), 'w')\n"
            "os._exit(0)\n"  # dies as a crash would: no exit hook hands its pool over
        )
        subprocess.run([sys.executable, "-c", "import os\n" + script, str(root)], check=True)
        time.sleep(0.05)  # the lease has expired
        with read_only(mount_point), dirmq.Store(root) as store:
            q = store.queue("q")
            assert (q.stats().ready, q.stats().total) == (2, 2)
            assert q.peek(m_id(q, b"three")).body == b"three"
            with pytest.raises(dirmq.StorageError, match="Read-only"):
                q.get_one()
        with dirmq.Store(root) as store:
            q = store.queue("q")
            got = [q.get_one() for _ in range(2)]
            assert [m.body for m in got if m] == [b"one", b"three"]
            report = store.queue("q").sweep()
            assert report.orphans_removed == 1 and report.pools_reclaimed == 1
        assert fsck(root, repair=False).ok


def m_id(q: dirmq.Queue, body: bytes) -> str:
    return next(m.id for m in q.browse() if m.body == body)
