"""Fixture factories for a test module's server and its HTTP client, in place of the copies each
module kept: `server = serve("--max-body-bytes", "2kB", yaq=True)` at a module's top level
defines its `server` fixture (and `http = http_client()` its client on that server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest

from .servers import ServerProcess, start_server

Scope = Literal["function", "module"]


def serve(
    *options: str,
    yaq: bool = False,
    credentials: str | None = None,
    scope: Scope = "module",
    name: str = "server",
) -> Any:
    """A fixture `name`: `dirmq serve` on a root of its own with `options` (`credentials`: the
    text of a credentials file, written 0600 and passed with --credentials), stopped by PID at
    the end of its scope, which asserts it exited cleanly."""

    @pytest.fixture(scope=scope, name=name)
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
        base = tmp_path_factory.mktemp(name)
        arguments = list(options)
        if credentials is not None:
            path = base / "credentials.toml"
            path.write_text(credentials)
            path.chmod(0o600)
            arguments += ["--credentials", str(path)]
        running = start_server(base / "root", *arguments, yaq=yaq)
        try:
            yield running
        finally:
            assert running.stop() == 0, running.output[-2000:]

    return server


def http_client(scope: Scope = "module", server: str = "server", timeout_s: float = 30) -> Any:
    """A fixture `http`: an httpx client on the fixture `server`'s native URL."""

    @pytest.fixture(scope=scope, name="http")
    def http(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
        running: ServerProcess = request.getfixturevalue(server)
        with httpx.Client(base_url=running.url, timeout=timeout_s) as client:
            yield client

    return http
