"""Reading the pub/sub retained log over HTTP (`GET /@pubsub/retained`, `/@pubsub/retained/head`)
against a real `dirmq serve`: paging, filters, missing and damaged entries, the size cap, bad
parameters. Through the Python client and, where the wire itself is the point, raw HTTP."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dirmq.client.pubsub import RemotePubSub
from dirmq.errors import InvalidArgument
from dirmq.pubsub import PubSub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.store import Store

from .support.servers import ServerProcess, start_server

CHANNELS = ("orders.eu", "orders.us", "audit")
SUBJECTS = ("created", "paid")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server and one log of 25 entries for the tests that only read it."""
    started = start_server(tmp_path_factory.mktemp("retained-http"))
    try:
        with RemotePubSub(started.url, timeout_s=10) as hub:
            publish(hub, 25)
        yield started
    finally:
        started.stop()


@pytest.fixture
def hub(server: ServerProcess) -> Iterator[RemotePubSub]:
    with RemotePubSub(server.url, timeout_s=10) as client:
        yield client


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test's own, for tests that damage the log."""
    started = start_server(tmp_path / "root")
    yield started
    started.stop(signal.SIGKILL if started.proc.poll() is None else signal.SIGTERM)


def publish(hub: RemotePubSub, count: int, tag: str = "m") -> None:
    """`count` retained messages; message i goes to CHANNELS[i % 3], subject SUBJECTS[i % 2]."""
    for i in range(count):
        hub.publish(
            CHANNELS[i % 3],
            f"{tag}{i}".encode(),
            subject=SUBJECTS[i % 2],
            mode="future",
            headers={"Content-Type": "text/plain", "X-Attr-N": str(i)},
        )


def test_pages_through_the_whole_log_and_consumes_nothing(hub: RemotePubSub) -> None:
    assert hub.retained_head() == 25
    seqs, bodies, pages = [], [], 0
    next_seq = 1
    while True:
        page = hub.read_retained(next_seq, 10)
        assert page.head == 25 and page.missing == []
        if page.next_seq == next_seq:  # nothing there yet: the reader has caught up
            assert page.entries == []
            break
        pages += 1
        seqs += [seq for seq, _ in page.entries]
        bodies += [entry.body for _, entry in page.entries]
        next_seq = page.next_seq
    assert pages == 3 and seqs == list(range(1, 26))
    assert bodies == [f"m{i}".encode() for i in range(25)]
    # Read again, from the middle: the same entries (nothing was consumed).
    again = hub.read_retained(11, 3)
    assert [seq for seq, _ in again.entries] == [11, 12, 13] and again.next_seq == 14
    _, entry = again.entries[0]
    assert entry.envelope.channel == CHANNELS[10 % 3] and entry.envelope.subject == SUBJECTS[0]
    assert entry.envelope.mode.value == "future" and entry.envelope.published_us > 0
    assert entry.headers == {"Content-Type": "text/plain", "X-Attr-N": "10"}
    # Past the head: an empty page that says where to ask again.
    ahead = hub.read_retained(40, 5)
    assert (ahead.entries, ahead.missing, ahead.next_seq, ahead.head) == ([], [], 40, 25)


def test_filters_skip_entries_but_count_them(hub: RemotePubSub) -> None:
    orders = hub.read_retained(1, 1000, channels=["orders"])
    assert [s for s, _ in orders.entries] == [s for s in range(1, 26) if (s - 1) % 3 != 2]
    assert orders.next_seq == 26
    paid_audit = hub.read_retained(1, 1000, channels=["audit", "x"], subjects=["paid"])
    assert [s for s, _ in paid_audit.entries] == [s for s in range(1, 26) if (s - 1) % 6 == 5]
    # `limit` counts entries examined, matching or not: a page may hold none and still move on.
    empty = hub.read_retained(1, 5, channels=["nobody"])
    assert (empty.entries, empty.next_seq) == ([], 6)


def test_wire_format(http: httpx.Client) -> None:
    response = http.get(
        "/@pubsub/retained", params=[("from", "2"), ("limit", "2"), ("subject", "")]
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert response.headers["x-next-seq"] == "4"
    assert response.headers["x-retained-head"] == "25"
    assert response.headers["x-missing-count"] == "0"
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["seq"] for line in lines] == [2, 3]
    assert base64.b64decode(lines[0]["body_base64"]) == b"m1"
    assert lines[0]["channel"] == "orders.us" and lines[0]["subject"] == "paid"
    assert set(lines[0]) >= {"id", "headers", "published_us", "mode", "persistence"}
    defaults = http.get("/@pubsub/retained")  # from 1, at most 100 entries
    assert defaults.headers["x-next-seq"] == "26" and len(defaults.text.splitlines()) == 25
    head = http.get("/@pubsub/retained/head")
    assert head.json() == {"head": 25} and head.headers["x-retained-head"] == "25"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "0"}, "from='0' must be an integer from 1"),
        ({"from": "x"}, "from='x' must be an integer"),
        ({"limit": "0"}, "limit='0' must be an integer from 1 to 1000"),
        ({"limit": "1001"}, "limit='1001' must be an integer from 1 to 1000"),
        ({"limit": "-3"}, "limit='-3'"),
        ({"max": "10"}, "unknown parameter 'max'"),
        ({"channel": "a\nb"}, "filter prefix"),
    ],
)
def test_bad_parameters_are_400(http: httpx.Client, params: dict[str, str], message: str) -> None:
    response = http.get("/@pubsub/retained", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "InvalidArgument"
    assert message in response.json()["message"]


def test_wrong_methods_are_405(http: httpx.Client) -> None:
    for path in ("/@pubsub/retained", "/@pubsub/retained/head"):
        response = http.post(path)
        assert response.status_code == 405 and response.headers["allow"] == "GET"
    assert http.get("/@pubsub/retained/tail").status_code == 404


def test_client_checks_its_arguments(hub: RemotePubSub) -> None:
    with pytest.raises(InvalidArgument, match="limit"):
        hub.read_retained(1, 0)
    with pytest.raises(InvalidArgument, match="from_seq"):
        hub.read_retained(0, 10)


def test_missing_and_damaged_entries_are_reported(own_server: ServerProcess) -> None:
    paths = PubSubPaths.under(str(own_server.root))
    with RemotePubSub(own_server.url, timeout_s=10) as hub:
        assert hub.retained_head() == 0
        assert hub.read_retained(1, 10).next_seq == 1  # an empty log
        publish(hub, 12)
        os.unlink(paths.retained_entry(4))
        with open(paths.retained_entry(7), "r+b") as f:  # flip the last byte of the body
            f.seek(-1, os.SEEK_END)
            f.write(b"X")
        os.unlink(paths.retained_entry(12))  # the tail: still a loss, not a shorter log
        page = hub.read_retained(1, 100, channels=["orders.eu"])  # 4 and 7 would match
        assert [s for s, _ in page.entries] == [1, 10]
        assert [seq for seq, _ in page.missing] == [4, 7, 12]
        assert page.missing[0][1] == "absent" and page.missing[1][1].startswith("damaged: ")
        assert page.next_seq == 13 and page.head == 12
        with httpx.Client(base_url=own_server.url, timeout=10) as http:
            response = http.get("/@pubsub/retained", params={"from": "3", "limit": "2"})
            assert response.headers["x-missing-count"] == "1"
            assert json.loads(response.text.splitlines()[1]) == {"seq": 4, "missing": "absent"}


def test_a_hole_ahead_of_the_head_does_not_hide_later_entries(own_server: ServerProcess) -> None:
    """Entries linked by another process past one deleted right above the server's head."""
    with RemotePubSub(own_server.url, timeout_s=10) as hub:
        publish(hub, 3)
        assert hub.retained_head() == 3
        time.sleep(0.05)  # into a later tick of the filesystem's (coarse) mtime clock
        local = PubSub(Store(own_server.root))
        try:
            for i in range(3):
                local.publish("audit", f"other{i}".encode(), mode="future")
        finally:
            local.close()
        os.unlink(PubSubPaths.under(str(own_server.root)).retained_entry(4))
        assert hub.retained_head() == 6
        page = hub.read_retained(4, 10)
        assert page.missing == [(4, "absent")] and [s for s, _ in page.entries] == [5, 6]


def test_a_page_stops_after_a_few_mib_of_bodies(own_server: ServerProcess) -> None:
    big = os.urandom(3 * 1024 * 1024)
    with RemotePubSub(own_server.url, timeout_s=30) as hub:
        for _ in range(4):
            hub.publish("big", big, mode="future")
        first = hub.read_retained(1, 10)
        assert [s for s, _ in first.entries] == [1, 2, 3] and first.next_seq == 4
        assert first.entries[0][1].body == big
        rest = hub.read_retained(first.next_seq, 10)
        assert [s for s, _ in rest.entries] == [4] and rest.next_seq == 5
