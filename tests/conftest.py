"""Shared fixtures. The queue contract suite runs against every transport listed in TRANSPORTS."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dirmq

QueueFactory = Callable[..., Any]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root) as s:
        yield s


class LocalTransport:
    """The brokerless library on a local directory."""

    name = "local"

    def __init__(self, store: dirmq.Store) -> None:
        self.store = store

    def make_queue(self, name: str = "q", **config: Any) -> dirmq.Queue:
        return self.store.create_queue(name, dirmq.QueueConfig(**config))

    def delete_queue(self, name: str) -> None:
        self.store.delete_queue(name)

    def list_queues(self) -> list[str]:
        return self.store.list_queues()

    def configure(self, name: str, **changes: Any) -> None:
        self.store.configure(name, **changes)


TRANSPORTS = ["local", "local-polling"]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, root: Path) -> Iterator[LocalTransport]:
    if request.param == "local":
        store = dirmq.Store(root)
    elif request.param == "local-polling":  # as on NFS, where inotify misses other hosts
        store = dirmq.Store(root, watch_mode="poll", poll_interval_s=0.05)
    else:  # pragma: no cover
        raise AssertionError(request.param)
    with store:
        yield LocalTransport(store)
