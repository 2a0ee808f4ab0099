"""Observers of answered requests (`contract.Observe`): the access log and the log of
authentication failures. The composition root (`dirmq.service`) puts them, with any other
observer (request metrics), on every listener's `Router` through `dialect.observe_all`.

The access log is on the hot path of every request: one `LogRecord` built directly (no
`findCaller` stack walk, no `%` formatting: its message is a constant and its values are
structured fields), after one `isEnabledFor` check. Measured cost: docs/operations.md, "Logs".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dirmq.server.contract import Request

ACCESS_LOGGER = "dirmq.access"
AUTH_LOGGER = "dirmq.auth"
AUTH_FAILURES = {401: "unauthenticated", 403: "forbidden"}
_new_record = object.__new__
AUTH_WINDOW_S = 60.0  # at most one line per peer and kind in this long
MAX_AUTH_KEYS = 10_000  # peers remembered at once; beyond, the rest share one entry


class AccessLog:
    """A line per answered request on `dirmq.access` at INFO, its values as fields: door,
    method, path, route, queue, status, bytes (of the response body), duration_ms, principal,
    peer."""

    __slots__ = ("_logger", "_template")

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger or logging.getLogger(ACCESS_LOGGER)
        # Every access record is this one but for its time and fields: a copy of its attributes
        # costs an eighth of what LogRecord() does to find them again (pid, paths, thread...).
        # Built per worker (after the fork: the pid is the worker's).
        self._template = logging.LogRecord(
            self._logger.name, logging.INFO, "", 0, "request", None, None
        ).__dict__

    def __call__(self, request: Request, status: int, sent: int, seconds: float) -> None:
        logger = self._logger
        if not logger.isEnabledFor(logging.INFO):
            return
        template = self._template
        record = _new_record(logging.LogRecord)
        record.__dict__ = template.copy()
        record.created = now = time.time()
        record.msecs = (now - int(now)) * 1000
        record.relativeCreated = template["relativeCreated"] + (now - template["created"]) * 1000
        record.fields = {
            "door": request.door,
            "method": request.method,
            "path": request.path,
            "route": request.route,
            "queue": request.queue,
            "status": status,
            "bytes": sent,
            "duration_ms": round(seconds * 1000, 3),
            "principal": request.principal,
            "peer": request.peer,
        }
        logger.handle(record)


@dataclass(slots=True)
class _Window:
    until: float  # when another line may be written for this peer and kind
    suppressed: int = 0  # failures seen since the last line
    flush: asyncio.TimerHandle | None = None


class AuthFailureLog:
    """A warning on `dirmq.auth` for each 401 or 403 answer, at most one per `window_s` per
    peer and kind: the failures in between are counted, and reported in one line when the
    window ends (at the next failure, or by a timer on the event loop)."""

    def __init__(
        self,
        window_s: float = AUTH_WINDOW_S,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self._logger = logger or logging.getLogger(AUTH_LOGGER)
        self._clock = clock
        self._windows: dict[tuple[str, int], _Window] = {}

    def __call__(self, request: Request, status: int, sent: int, seconds: float) -> None:
        kind = AUTH_FAILURES.get(status)
        if kind is None:
            return
        now = self._clock()
        key = (request.peer, status)
        window = self._windows.get(key)
        if window is not None and now < window.until:
            window.suppressed += 1
            if window.flush is None:
                window.flush = _call_later(window.until - now, self._window_ended, key)
            return
        if window is not None:
            self._report(key, window)
        elif len(self._windows) >= MAX_AUTH_KEYS:
            self.flush()
            if len(self._windows) >= MAX_AUTH_KEYS:  # that many live peers: one entry for the rest
                key = ("*", status)
        self._windows[key] = _Window(now + self.window_s)
        self._logger.warning(
            "authentication failed" if status == 401 else "access denied",
            extra={
                "fields": {
                    "kind": kind,
                    "door": request.door,
                    "method": request.method,
                    "path": request.path,
                    "queue": request.queue,
                    "status": status,
                    "principal": request.principal,
                    "peer": request.peer,
                }
            },
        )

    def flush(self) -> None:
        """Report the failures counted in windows that have ended, and forget those windows."""
        now = self._clock()
        for key, window in list(self._windows.items()):
            if now >= window.until:
                self._report(key, window)
                del self._windows[key]

    def _window_ended(self, key: tuple[str, int]) -> None:
        window = self._windows.pop(key, None)
        if window is not None:
            window.flush = None  # fired: nothing to cancel
            self._report(key, window)

    def _report(self, key: tuple[str, int], window: _Window) -> None:
        if window.flush is not None:
            window.flush.cancel()
            window.flush = None
        if window.suppressed:
            peer, status = key
            self._logger.warning(
                "%d more %s failures from %s in %.0f s",
                window.suppressed,
                AUTH_FAILURES[status],
                peer or "-",
                self.window_s,
                extra={
                    "fields": {
                        "kind": AUTH_FAILURES[status],
                        "status": status,
                        "peer": peer,
                        "suppressed": window.suppressed,
                    }
                },
            )
            window.suppressed = 0


def _call_later(
    delay_s: float, callback: Callable[[tuple[str, int]], None], key: tuple[str, int]
) -> asyncio.TimerHandle | None:
    """A timer on the running event loop (none outside one: the next failure reports)."""
    with contextlib.suppress(RuntimeError):
        return asyncio.get_running_loop().call_later(delay_s, callback, key)
    return None
