"""Shared fixtures. The queue contract suite runs against every transport listed in TRANSPORTS."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dirmq
from dirmq.client import RemoteStore
from dirmq.server.multiprocess import MetricsFiles

from .support.async_adapter import BlockingAsyncStore
from .support.browser import (  # noqa: F401  (chromium for browser tests: tests/support/browser.py)
    browser,
    browser_session,
    page,
    page_log,
    playwright_loop,
)
from .support.gluster import gluster_volume  # noqa: F401  (the session's one GlusterFS volume)
from .support.procs import reap_spawned
from .support.servers import ServerProcess, start_server

QueueFactory = Callable[..., Any]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (`make test`) keeps the files that share one thing of the machine on one
    worker and starts the longest first (support/distribution.py); other modes are xdist's."""
    if config.getvalue("dist") != "loadfile":
        return None
    from .support.distribution import SharedResourceScheduling

    return SharedResourceScheduling(config, log)


@pytest.fixture(autouse=True)
def _workers_reaped() -> Iterator[None]:
    """Workers a test spawned (support/procs.py) and left running, killed after it."""
    yield
    reap_spawned()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root) as s:
        yield s


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One `dirmq serve` for a test module's tests (each names its queues with `fresh`)."""
    running = start_server(tmp_path_factory.mktemp("module") / "root")
    yield running
    assert running.stop() == 0


@pytest.fixture
def module_http(module_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=module_server.url, timeout=30) as client:
        yield client


@pytest.fixture
def module_lib(module_server: ServerProcess) -> Iterator[dirmq.Store]:
    """The library on the module server's root, beside it (no second root made)."""
    with dirmq.Store(module_server.root, create=False) as store:
        yield store


@pytest.fixture
def private_umask() -> Iterator[None]:
    """Files a test plants by hand in a (private) root get the modes the store gives its own,
    so that `dirmq fsck` finds only the damage the test planted. (The store sets its modes
    itself, whatever the umask: test_data_at_rest.py checks that under the usual 022.)"""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


class Transport:
    """One way to reach queues; tests use queue names relative to `prefix`."""

    def __init__(self, store: Any, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix

    def _name(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def make_queue(self, name: str = "q", **config: Any) -> Any:
        if config.get("dead_letter_queue"):
            config["dead_letter_queue"] = self._name(config["dead_letter_queue"])
        return self.store.create_queue(self._name(name), dirmq.QueueConfig(**config))

    def open_queue(self, name: str) -> Any:
        return self.store.queue(self._name(name))

    def delete_queue(self, name: str) -> None:
        self.store.delete_queue(self._name(name))

    def list_queues(self) -> list[str]:
        names = self.store.list_queues(self.prefix)
        return [n[len(self.prefix) :] for n in names]

    def configure(self, name: str, **changes: Any) -> None:
        self.store.configure(self._name(name), **changes)


LocalTransport = Transport  # kept for readability in type hints
TRANSPORTS = ["local", "local-polling", "http", "http-async"]
_prefixes = itertools.count()


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("http-root"))
    yield server
    server.stop()


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, root: Path) -> Iterator[Transport]:
    if request.param in ("http", "http-async"):  # http-async: the asyncio client, made blocking
        server: ServerProcess = request.getfixturevalue("http_server")
        client = RemoteStore if request.param == "http" else BlockingAsyncStore
        with client(server.url) as remote:
            yield Transport(remote, prefix=f"t{next(_prefixes)}/")
        return
    if request.param == "local":
        store = dirmq.Store(root)
    elif request.param == "local-polling":  # as on NFS, where inotify misses other hosts
        store = dirmq.Store(root, watch_mode="poll", poll_interval_s=0.05)
    else:  # pragma: no cover
        raise AssertionError(request.param)
    with store:
        yield Transport(store)


@pytest.fixture
def fast_root(tmp_path: Path) -> Iterator[Path]:
    """A root in memory (/dev/shm) where there is one: the fault tests run hundreds of cases
    with injected faults, so the flushes of a busy disk would only make them slow."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path / "root"
        return
    parent = Path(tempfile.mkdtemp(prefix="dirmq-faults-", dir="/dev/shm"))
    try:
        yield parent / "root"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def metrics_files(tmp_path: Path) -> Iterator[MetricsFiles]:
    """A server run's metrics directory, active in this process for the test (and gone after:
    metrics made afterwards are in memory again)."""
    with MetricsFiles.create(str(tmp_path)) as files:
        yield files
