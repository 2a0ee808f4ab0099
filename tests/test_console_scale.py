"""The console's overview of a large root (issue 33): 1,000 queues, one of them deep, answers
within a second, and a refresh does not list the deep queue's @ready again."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.console.depths import Depths
from dirmq.store.ids import new_ids

from .servers import ServerProcess, start_server

QUEUES = 1000
DEEP = 100_000  # messages of the deep queue (names only: a census reads no file)


@pytest.fixture(scope="module")
def big_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "root"
    with dirmq.Store(root) as store:
        for n in range(QUEUES):
            store.create_queue(f"q{n:04d}")
        ready = Path(store.queue("q0500").path) / "@ready"
    ids = new_ids(DEEP)
    for message_id in ids:  # empty files: what the census needs is in the names
        os.close(os.open(ready / message_id, os.O_CREAT | os.O_WRONLY, 0o600))
    settled = time.time() - 10  # written long ago: a listing of it may be kept
    for path in root.glob("q*/@*"):
        os.utime(path, (settled, settled))
    return root


@pytest.fixture(scope="module")
def server(big_root: Path) -> Iterator[ServerProcess]:
    running = start_server(big_root)
    yield running
    assert running.stop() == 0


def test_a_refresh_lists_no_settled_ready_again(big_root: Path) -> None:
    depths = Depths(str(big_root), shared=False)
    found = {d.name: d.stats for d in depths.all()}
    assert len(found) == QUEUES and found["q0500"].ready == DEEP
    listed = depths.listings
    started = time.monotonic()
    again = {d.name: d.stats.ready for d in depths.all()}
    took = time.monotonic() - started
    assert again["q0500"] == DEEP
    assert depths.listings - listed == 2 * QUEUES  # @leased and @delayed of each, nothing else
    assert took < 1.0


def test_the_overview_of_a_thousand_queues_answers_within_a_second(
    server: ServerProcess,
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as ui:
        ui.get("/ui/")  # the first lists every directory once
        for params in ({}, {"part": "table"}, {"sort": "ready", "desc": "1"}):
            started = time.monotonic()
            answer = ui.get("/ui/", params=params)
            took = time.monotonic() - started
            assert answer.status_code == 200
            assert took <= 1.0, (params, took)
        assert "q0500" in ui.get("/ui/", params={"sort": "ready", "desc": "1"}).text
