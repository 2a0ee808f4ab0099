"""Several hosts on one root over HTTP (issue 19): one real `dirmq serve` per mount of a GlusterFS
volume (tests/support/gluster.py: two mounts stand for two hosts), producers and consumers on both
servers at once, then the counts the issue asks for, all 0; and the guide in docs/operations.md
("Several hosts on one root"), whose examples run here against the same two mounts.

What is counted, by message body (each body is unique):
- lost: published (the server answered 201) but never delivered, nor left in the queue;
- twice: delivered more than once (leases are 120 s and nothing nacks: no redelivery is due);
- stale: acks of fresh leases the server refused (StaleReceipt, or any other failure);
- corrupt: files in any `@corrupt/` under the root; and `dirmq fsck` from each mount.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import dirmq
from dirmq.client import RemoteStore
from dirmq.client.remote import RemoteQueue
from dirmq.errors import DirmqError
from dirmq.store import layout

from .support.gluster import GlusterVolume
from .support.servers import REPO, ServerProcess, start_server
from .test_docs import Block, Python, Rewriter, Shell, _environment, _run_command, blocks, commands

QUEUE = "jobs"
VISIBILITY_S = 120.0  # far beyond the test: any second delivery is a fault, not an expiry
MESSAGES = int(os.environ.get("DIRMQ_GLUSTER_SERVER_MESSAGES", "800"))
BATCH = 25  # messages per publish request, per get, a stream's prefetch
PRODUCERS_PER_SERVER = 2
POLLERS_PER_SERVER = 2  # and one streaming consumer
LOAD_DEADLINE_S = 60.0
QUIET_S = 8.0  # no delivery for this long, everything published: what is missing is gone


@dataclass
class Tally:
    """What the clients were told, by body."""

    published: set[bytes] = field(default_factory=set)
    delivered: dict[bytes, int] = field(default_factory=dict)  # body -> deliveries
    by_consumer: dict[str, int] = field(default_factory=dict)
    refused_acks: list[str] = field(default_factory=list)  # receipt: error
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, consumer: str, body: bytes) -> None:
        with self.lock:
            self.delivered[body] = self.delivered.get(body, 0) + 1
            self.by_consumer[consumer] = self.by_consumer.get(consumer, 0) + 1

    @property
    def twice(self) -> list[bytes]:
        return [body for body, n in self.delivered.items() if n > 1]


def corrupt_files(root: Path) -> list[str]:
    """The files in every `@corrupt/` under `root`."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        if os.path.basename(dirpath) == layout.CORRUPT:
            found += [os.path.join(dirpath, name) for name in filenames]
            dirnames[:] = []
    return found


def fsck(root: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "dirmq", "fsck", "--root", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report: dict[str, object] = (
        json.loads(done.stdout) if done.stdout.strip() else {"ok": False, "stderr": done.stderr}
    )
    report["exit"] = done.returncode
    return report


class HttpLoad:
    """Producers and consumers (polling and streaming) on each server at once."""

    def __init__(self, urls: list[str], messages: int, tally: Tally) -> None:
        self.tally = tally
        self.producers_done = threading.Event()
        self.stop = threading.Event()
        self.produced_s = 0.0
        producers = [(url, n) for url in urls for n in range(PRODUCERS_PER_SERVER)]
        shares = [
            messages // len(producers) + (i < messages % len(producers))
            for i in range(len(producers))
        ]
        self.producers = [
            threading.Thread(target=self._produce, args=(url, f"s{s}p{n}", shares[s]))
            for s, (url, n) in enumerate(producers)
        ]
        self.consumers = [
            threading.Thread(target=self._poll, args=(url, f"poll{s}.{n}"))
            for s, url in enumerate(urls)
            for n in range(POLLERS_PER_SERVER)
        ]
        self.consumers += [
            threading.Thread(target=self._stream, args=(url, f"stream{s}"))
            for s, url in enumerate(urls)
        ]

    def run(self, deadline_s: float) -> None:
        started = time.monotonic()
        for thread in self.producers + self.consumers:
            thread.start()
        for thread in self.producers:
            thread.join(deadline_s)
        self.producers_done.set()
        self.produced_s = time.monotonic() - started
        # Until every published message came, or none came for QUIET_S (the rest is gone).
        deadline = time.monotonic() + deadline_s
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < QUIET_S:
            with self.tally.lock:
                if self.tally.published <= self.tally.delivered.keys():
                    break
                if len(self.tally.delivered) != seen:
                    seen, quiet_since = len(self.tally.delivered), time.monotonic()
            time.sleep(0.1)
        self.stop.set()
        for thread in self.consumers:
            thread.join(30)

    def _produce(self, url: str, name: str, count: int) -> None:
        with RemoteStore(url, timeout_s=30) as store:
            queue = RemoteQueue(store, QUEUE)
            for start in range(0, count, BATCH):
                bodies = [f"{name}-{i}".encode() for i in range(start, min(count, start + BATCH))]
                try:
                    ids = queue.put_many(bodies)
                except DirmqError as exc:  # in doubt: not counted as published
                    with self.tally.lock:
                        self.tally.errors.append(f"{name} put: {exc!r}")
                    continue
                assert len(ids) == len(bodies)
                with self.tally.lock:
                    self.tally.published.update(bodies)

    def _poll(self, url: str, name: str) -> None:
        with RemoteStore(url, timeout_s=30) as store:
            queue = RemoteQueue(store, QUEUE)
            while not self.stop.is_set():
                try:
                    got = queue.get(BATCH, visibility_s=VISIBILITY_S, wait_s=0.5)
                    for message in got:
                        self.tally.got(name, message.body)
                    failed = queue.ack_many(m.receipt or "" for m in got)
                except DirmqError as exc:
                    with self.tally.lock:
                        self.tally.errors.append(f"{name}: {exc!r}")
                    continue
                with self.tally.lock:
                    self.tally.refused_acks += [f"{name} {r}: {e!r}" for r, e in failed.items()]

    def _stream(self, url: str, name: str) -> None:
        with RemoteStore(url, timeout_s=30) as store:
            queue = RemoteQueue(store, QUEUE)
            try:
                with queue.consume(prefetch=BATCH, visibility_s=VISIBILITY_S) as consumer:
                    while not self.stop.is_set():
                        message = consumer.get(timeout_s=0.5)
                        if message is not None:
                            self.tally.got(name, message.body)
                            consumer.ack(message)
                        elif consumer.closed:
                            raise DirmqError("the stream ended")
                # Closed (acks flushed and answered): what the server refused is known now.
                with self.tally.lock:
                    self.tally.refused_acks += [f"{name} {r}: {e!r}" for r, e in consumer.failures]
            except DirmqError as exc:
                with self.tally.lock:
                    self.tally.errors.append(f"{name}: {exc!r}")


@dataclass
class TwoHosts:
    volume: GlusterVolume
    roots: tuple[Path, Path]  # one root, as each mount sees it
    servers: tuple[ServerProcess, ServerProcess]


@pytest.fixture(scope="module")
def two_hosts(gluster_volume: GlusterVolume) -> Iterator[TwoHosts]:
    """`dirmq serve` on each mount, on one root (`load`) at the volume's top."""
    roots = (Path(gluster_volume.mounts[0]) / "load", Path(gluster_volume.mounts[1]) / "load")
    with dirmq.Store(roots[0]) as store:
        store.create_queue(QUEUE, dirmq.QueueConfig(visibility_timeout_s=VISIBILITY_S))
    first = start_server(roots[0])
    try:
        second = start_server(roots[1])
        try:
            yield TwoHosts(gluster_volume, roots, (first, second))
        finally:
            second.stop()
    finally:
        first.stop()


def test_two_servers_on_two_mounts_lose_and_repeat_nothing(two_hosts: TwoHosts) -> None:
    tally = Tally()
    started = time.monotonic()
    load = HttpLoad([s.url for s in two_hosts.servers], MESSAGES, tally)
    load.run(LOAD_DEADLINE_S)
    load_s = time.monotonic() - started
    # What no consumer took is still in the queue (read from the other mount).
    left: set[bytes] = set()
    with dirmq.Store(two_hosts.roots[1], create=False) as store:
        queue = store.queue(QUEUE)
        while got := queue.get(100, visibility_s=VISIBILITY_S):
            left.update(m.body for m in got)
            queue.ack_many(m.receipt or "" for m in got)
    lost = tally.published - tally.delivered.keys() - left
    counts = {
        "published": len(tally.published),
        "delivered": sum(tally.delivered.values()),
        "by_consumer": dict(sorted(tally.by_consumer.items())),
        "left": len(left),
        "lost": len(lost),
        "twice": len(tally.twice),
        "stale": len(tally.refused_acks),
        "corrupt": len(corrupt_files(two_hosts.roots[0])),
        "produced_s": round(load.produced_s, 1),
        "load_s": round(load_s, 1),
    }
    print(counts, tally.refused_acks[:10], tally.errors[:5])
    assert not tally.errors, (counts, tally.errors[:5])
    assert len(tally.published) == MESSAGES, counts
    # Both servers delivered, to polling and to streaming consumers.
    assert all(
        tally.by_consumer.get(c, 0) > 0 for c in ("poll0.0", "poll1.0", "stream0", "stream1")
    ), counts
    assert (len(lost), len(tally.twice), len(tally.refused_acks)) == (0, 0, 0), (
        counts,
        sorted(lost)[:5],
        tally.twice[:5],
        tally.refused_acks[:5],
    )
    assert not left, counts  # every message was consumed in time
    assert corrupt_files(two_hosts.roots[0]) == []
    for root in two_hosts.roots:
        report = fsck(root)
        assert report["ok"] is True and report["exit"] == 0, (root, report)


# -- the guide: docs/operations.md, "Several hosts on one root" ---------------------------------
# Its examples are marked `<!-- server: gluster -->` (so tests/test_docs.py leaves them to this
# file, SERVER_KINDS), each after a `<!-- host: NAME -->` saying on which host it runs. Every host
# mounts the volume at GUIDE_MOUNT; here each host is one mount of the test volume, with its own
# shell, interpreter and `dirmq serve` (started where the guide runs one, with its arguments).
GUIDE = REPO / "docs" / "operations.md"
GUIDE_MOUNT = "/mnt/mq"
_HOST = re.compile(r"<!--\s*host:\s*(\S+)\s*-->")


def guide_blocks() -> list[tuple[str, Block]]:
    """(host, block) of each of the guide's blocks marked for a GlusterFS mount, in order."""
    lines = GUIDE.read_text().splitlines()
    found = []
    for block in blocks(GUIDE):
        if block.server != "gluster":
            continue
        before = [m.group(1) for line in lines[: block.line - 1] if (m := _HOST.search(line))]
        assert before, f"{block.where}: no <!-- host: NAME --> before it"
        # This runner knows hosts and servers only: no setup, check, needs or no-run.
        assert not (block.setup or block.check or block.needs or block.no_run), block.where
        found.append((before[-1], block))
    return found


class GuideHost:
    """One host of the guide: its mount, its shell and interpreter, its server once started."""

    def __init__(self, mount: str, workdir: Path, seen: dict[str, str]) -> None:
        workdir.mkdir()
        self.env = _environment(workdir)
        self.shell = Shell(workdir, self.env)
        self.python = Python(workdir, self.env)
        self.server: ServerProcess | None = None
        placeholder = ServerProcess(None, "http://127.0.0.1:8080", None, Path(mount))  # type: ignore[arg-type]
        self.rewrite = Rewriter(placeholder)
        self.rewrite.paths = {GUIDE_MOUNT: mount}
        self.rewrite.seen = seen  # a value one host printed, used on another

    def serve(self, command: str) -> None:
        """Start the `dirmq serve` the guide runs (its --listen port becomes ours)."""
        args = shlex.split(self.rewrite.command(command))[2:]
        root = Path(args.pop(args.index("--root") + 1))
        args.remove("--root")
        listen = args.pop(args.index("--listen") + 1)
        args.remove("--listen")
        self.server = start_server(root, *args)
        self.rewrite.ports = {
            ":" + listen.rsplit(":", 1)[1]: ":" + self.server.url.rsplit(":", 1)[1]
        }

    def close(self) -> None:
        self.shell.close()
        self.python.close()
        if self.server is not None:
            self.server.stop()


def test_the_guide_runs_on_two_mounts(gluster_volume: GlusterVolume, tmp_path: Path) -> None:
    """docs/operations.md's "Several hosts on one root": each example on its host's mount."""
    marked = guide_blocks()
    assert {host for host, _ in marked} == {"mq1", "mq2"}, marked
    seen: dict[str, str] = {}
    hosts = {
        name: GuideHost(mount, tmp_path / name, seen)
        for name, mount in zip(("mq1", "mq2"), gluster_volume.mounts, strict=True)
    }
    failures: list[str] = []
    try:
        for name, block in marked:
            host = hosts[name]
            if block.lang == "python":
                error = host.python.run(host.rewrite.command(block.text), block.where)
                failures += [error] if error else []
                continue
            for command in commands(block):
                if command.text.startswith("dirmq serve "):
                    host.serve(command.text)
                    continue
                where = f"{block.where} ({name}), line {command.line}"
                if failure := _run_command(host.shell, host.rewrite, command, where):
                    failures.append(failure)
    finally:
        for host in hosts.values():
            host.close()
    assert not failures, "\n\n".join(failures)
    assert all(h.server is not None for h in hosts.values()), "the guide starts no server"
