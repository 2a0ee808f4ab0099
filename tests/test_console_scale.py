"""The console's overview of a large root (issue 33): 1,000 queues, one of them 1,000,000 messages
deep, answers within a second, and a refresh does not list the deep queue's @ready again: the
kernel's own account (inotify sees every open of that directory) says so, not only ours."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.store.census import Census
from dirmq.store.ids import new_ids

from .support.servers import ServerProcess, start_server

QUEUES = 1000
DEEP = 1_000_000  # messages of the deep queue (names only: a census reads no file)
LINKS_PER_FILE = 50_000
IN_ACCESS, IN_OPEN = 0x1, 0x20  # a listing opens the directory and reads it (getdents)


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("scale") / "root"
    with dirmq.Store(root) as store:
        for n in range(QUEUES):
            store.create_queue(f"q{n:04d}")
        ready = Path(store.queue("q0500").path) / "@ready"
    # What the census needs is in the names: a million links to a few empty files (an inode
    # holds 65,000 links on ext4) are made fifty times faster than a million files.
    blanks = [root / f"blank-{n}" for n in range(DEEP // LINKS_PER_FILE + 1)]
    for blank in blanks:
        blank.touch()
    directory = os.open(ready, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n, message_id in enumerate(new_ids(DEEP)):
            os.link(blanks[n // LINKS_PER_FILE], message_id, dst_dir_fd=directory)
    finally:
        os.close(directory)
    settled = time.time() - 10  # written long ago: a listing of it may be kept
    for path in root.glob("q*/@*"):
        os.utime(path, (settled, settled))
    yield root
    # Not kept among pytest's last runs (a million names), and removed beside the next tests
    # rather than before them: `rm` runs on in the background (it removes only our root).
    subprocess.run(["sh", "-c", 'rm -rf -- "$1" &', "sh", str(root.parent)], check=True)


class DirectoryOpens:
    """Counts opens and reads of one directory by anyone, from inotify (the kernel reports a
    listing as IN_OPEN then IN_ACCESS; a stat reports nothing)."""

    def __init__(self, path: Path) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self._fd >= 0, os.strerror(ctypes.get_errno())
        watch = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_OPEN | IN_ACCESS)
        assert watch >= 0, os.strerror(ctypes.get_errno())

    def take(self) -> int:
        """Events since the last call."""
        events = 0
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                *_, length = struct.unpack_from("iIII", data, offset)
                events += 1
                offset += 16 + length

    def close(self) -> None:
        os.close(self._fd)


@pytest.fixture(scope="module")
def server(big_root: Path) -> Iterator[ServerProcess]:
    running = start_server(big_root)
    yield running
    assert running.stop() == 0


def test_a_kept_census_lists_no_settled_ready_again(big_root: Path) -> None:
    kept = Census(str(big_root), shared=False)
    found = {d.name: d.stats for d in kept.depths()}
    assert len(found) == QUEUES and found["q0500"].ready == DEEP
    listed = kept.listings
    again = {d.name: d.stats.ready for d in kept.depths()}
    assert again["q0500"] == DEEP
    assert kept.listings - listed == 2 * QUEUES  # @leased and @delayed of each, nothing else


def test_the_overview_of_a_thousand_queues_answers_within_a_second(
    server: ServerProcess, big_root: Path
) -> None:
    deep_ready = big_root / "q0500" / "@ready"
    opens = DirectoryOpens(deep_ready)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as ui:
            assert ui.get("/ui/").status_code == 200  # the first lists every directory once
            assert opens.take() > 0  # (so the watch does see a listing)
            for params in ({}, {"part": "table"}, {"sort": "ready", "desc": "1"}):
                started = time.monotonic()
                answer = ui.get("/ui/", params=params)
                took = time.monotonic() - started
                assert answer.status_code == 200
                assert took <= 1.0, (params, took)
            assert "1,000,000" in answer.text or "1000000" in answer.text
            # Three refreshes (and whatever the server's sampler did meanwhile: it shares the
            # census) and the deep @ready was not opened once.
            assert opens.take() == 0
    finally:
        opens.close()
