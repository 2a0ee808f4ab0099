"""Durations as each door spells them: the HTTP client's text, VSQS waits past the store's bound,
pub/sub timeouts that are not numbers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import dirmq
from dirmq.client import RemoteStore, protocol
from dirmq.compat.vsqs import QueueManager
from dirmq.errors import InvalidArgument
from dirmq.pubsub.model import check_timeout
from dirmq.wire.durations import parse_duration

from .support.fixtures import serve
from .support.servers import ServerProcess

server = serve()


@pytest.mark.parametrize("value", [0, 1e-05, 0.25, 1.5e-3, 30, 12.0, 86400 * 365])
def test_the_client_spells_durations_the_server_parses(value: float) -> None:
    assert parse_duration(protocol.seconds(value)) == pytest.approx(value, abs=1e-6)


def test_a_tiny_visibility_goes_over_http(server: ServerProcess) -> None:
    with RemoteStore(server.url) as remote:
        queue = remote.create_queue("tiny")
        queue.put(b"x")
        message = queue.get_one(visibility_s=1e-05, wait_s=0)  # was a 400: "1e-05" has an exponent
        assert message is not None and message.body == b"x"


def test_a_vsqs_receive_may_wait_longer_than_the_store_bound(tmp_path: Path) -> None:
    manager = QueueManager(str(tmp_path))
    queue = manager.get_queue("q")
    threading.Timer(0.3, lambda: queue.publish(b"late")).start()
    message_id, data = queue.receive(timeout=float("inf"))
    assert data == b"late" and message_id is not None


@pytest.mark.parametrize("value", [True, "5", None])
def test_pubsub_timeouts_must_be_numbers(value: object) -> None:
    with pytest.raises(InvalidArgument, match="number of seconds"):
        check_timeout("accept timeout", value)  # type: ignore[arg-type]


def test_the_store_refuses_what_vsqs_slices(store: dirmq.Store) -> None:
    with pytest.raises(InvalidArgument):
        store.create_queue("q").get_one(wait_s=float("inf"))
