"""A console session over plain HTTP, as a browser holds one after signing in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from .servers import ServerProcess


@contextmanager
def signed_in(server: ServerProcess, token: str) -> Iterator[httpx.Client]:
    """A client holding a console session (its cookie) for the principal of `token`."""
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        answer = browser.post("/ui/sign-in", data={"token": token})
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/ui/"
        yield browser
