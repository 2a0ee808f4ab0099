"""The server's logging: stdlib `logging`, one handler, text or JSON lines.

`configure(LogSettings)` is called once per server process (and again in each worker after the
fork). Every record goes to one handler on the root logger: stderr (journald, a terminal, a
pipe), or `--log-file`, reopened when logrotate moves it.

Structured fields ride on a record as `extra={"fields": {...}}` (see `fields`): the text format
appends them as `key=value` (logfmt: a value with spaces or quotes is quoted as JSON), the JSON
format merges them into the line's object next to `time`, `level`, `logger`, `message`:

    2026-05-01T10:00:00.123Z INFO dirmq.access request door=native method=POST ...
    {"time":"2026-05-01T10:00:00.123Z","level":"INFO","logger":"dirmq.access",...}

Loggers: `dirmq.access` (a line per request, `access_log.py`), `dirmq.auth` (authentication
failures, rate-limited), `dirmq.server` (start-up, shutdown, errors answering), `dirmq.store.*`
(quarantined files, expired leases returned), `dirmq.pubsub` (sweeps), `dirmq.sqs`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import InvalidArgument
from dirmq.server.logforms import FORMATS, LEVELS


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = "info"  # one of LEVELS
    format: str = "text"  # one of FORMATS
    file: str | None = None  # None: stderr
    access: bool = False  # the access log (INFO on `dirmq.access`): off unless asked for


def fields(**values: object) -> dict[str, Any]:
    """`extra=` for a record with structured fields: `log.info("...", extra=fields(queue=q))`."""
    return {"fields": values}


class _Stamp:
    """UTC ISO 8601 times with milliseconds; the part up to the second formatted once a second
    (strftime per record would cost more than the rest of an access line)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((created - second) * 1000):03d}Z"


_NEEDS_QUOTES = re.compile(r"[\s\"=\\]|[^\x21-\x7e]")  # else a logfmt value goes bare
_json_line = json.JSONEncoder(separators=(",", ":"), default=str).encode  # built once
# Strings found to need no quotes: doors, methods, routes, queues and peers repeat on every
# access line, and a set lookup is a fraction of a regex scan. Emptied when full.
_BARE: set[str] = set()
_BARE_MAX = 1024


def logfmt(values: Mapping[str, object]) -> str:
    """`key=value key=value`: an empty string or None as `-`, a string with spaces, quotes,
    `=` or anything but printable ASCII quoted as JSON (so a line is always one line)."""
    return " ".join(
        [
            f"{key}={value}"
            if (kind := type(value)) is int or kind is float or (kind is str and value in _BARE)
            else f"{key}={_logfmt_value(value)}"
            for key, value in values.items()
        ]
    )


def _logfmt_value(value: object) -> str:
    if value is None or value == "":
        return "-"
    if not isinstance(value, str):
        return str(value) if isinstance(value, int | float) else json.dumps(str(value))
    if _NEEDS_QUOTES.search(value):
        return json.dumps(value)
    if len(_BARE) >= _BARE_MAX:
        _BARE.clear()
    _BARE.add(value)
    return value


class TextFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger> <message> key=value ...`, a traceback on the lines after."""

    def __init__(self) -> None:
        super().__init__()
        self._stamp = _Stamp()

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self._stamp(record.created)} {record.levelname} {record.name} {record.getMessage()}"
        )
        extra: Mapping[str, object] | None = record.__dict__.get("fields")
        if extra:
            line = f"{line} {logfmt(extra)}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, pid, the record's fields, and
    `exception` (the traceback) when there is one."""

    def __init__(self) -> None:
        super().__init__()
        self._stamp = _Stamp()

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": self._stamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        extra: Mapping[str, object] | None = record.__dict__.get("fields")
        if extra:
            doc.update(extra)  # (a field named like the keys above would replace it)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return _json_line(doc)


PIPE_BUF = 4096  # a write to a pipe this long or shorter is never interleaved with another's
FLUSH_AFTER_S = 0.1  # info and debug lines wait at most this long to be written
FLUSH_BYTES = 64 * 1024  # or until this much waits
DEFERRED_BYTES = 256  # what a record not formatted yet is counted as


class BatchHandler(logging.Handler):
    """Formats each record at once; on the event loop, writes info and debug lines together
    FLUSH_AFTER_S later (or once FLUSH_BYTES wait): a write per access line, to the journal's
    socket or a pipe, cost more than the rest of the line (the reader's wake-up included).
    A warning or an error is written at once, after what waits; so is every record outside
    an event loop (start-up, the store's pool threads). Writes are cut at line ends into
    pieces of at most PIPE_BUF bytes, so that workers sharing stderr never mix their lines.
    With `path`, appends to that file and reopens it when it was moved or removed
    (logrotate). A SIGKILL loses at most the last FLUSH_AFTER_S of info lines."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.path = path
        self._fd = 2  # stderr
        self._identity: tuple[int, int] | None = None
        if path is not None:
            self._open(path)
        self._pending: list[bytes | logging.LogRecord] = []
        self._pending_bytes = 0
        self._scheduled = False

    def _open(self, path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)

    def emit(self, record: logging.LogRecord) -> None:
        if record.args or record.exc_info or record.levelno >= logging.WARNING:
            # Formatted now: its arguments may change, its traceback go, before the flush.
            line = self._line(record)
            if line is None:
                return
            self._pending.append(line)
            self._pending_bytes += len(line)
        else:  # a constant message and fields made for it (the access log): at the flush
            self._pending.append(record)
            self._pending_bytes += DEFERRED_BYTES
        if record.levelno >= logging.WARNING or self._pending_bytes >= FLUSH_BYTES:
            self._write_pending()  # (the handler's lock is held)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop in this thread: now
            self._write_pending()
            return
        if not self._scheduled:
            self._scheduled = True
            loop.call_later(FLUSH_AFTER_S, self.flush)

    def _line(self, record: logging.LogRecord) -> bytes | None:
        try:
            return (self.format(record) + "\n").encode("utf-8", "backslashreplace")
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return None

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_pending()

    def _write_pending(self) -> None:
        self._scheduled = False
        if not self._pending:
            return
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        try:
            if self.path is not None:
                self._reopen_if_moved(self.path)
            piece: list[bytes] = []
            size = 0
            for entry in lines:
                line = entry if isinstance(entry, bytes) else self._line(entry)
                if line is None:
                    continue
                if piece and size + len(line) > PIPE_BUF:
                    _write_all(self._fd, b"".join(piece))
                    piece, size = [], 0
                piece.append(line)
                size += len(line)
            _write_all(self._fd, b"".join(piece))
        except OSError:
            pass  # nowhere to say it (stderr gone, disk full): the server goes on regardless

    def _reopen_if_moved(self, path: str) -> None:
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == self._identity:
                return
        except FileNotFoundError:
            pass
        old = self._fd
        self._open(path)
        os.close(old)

    def close(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_pending()
            if self.path is not None and self._fd > 2:
                os.close(self._fd)
                self._fd = 2
        super().close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def flush() -> None:
    """Write what the handlers hold now (before a fork, and before a worker's `os._exit`)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


# A forked child must not write the lines its parent had not written yet: they are written first.
os.register_at_fork(before=flush)


def configure(settings: LogSettings) -> None:
    """Send every record at `settings.level` and above to one handler, in `settings.format`
    (replacing whatever handlers were there: called again in a forked worker)."""
    if settings.level not in LEVELS:
        raise InvalidArgument(f"log level {settings.level!r} is not one of {', '.join(LEVELS)}")
    if settings.format not in FORMATS:
        raise InvalidArgument(f"log format {settings.format!r} is not one of {', '.join(FORMATS)}")
    try:
        handler = BatchHandler(settings.file)
    except OSError as exc:
        raise InvalidArgument(
            f"cannot open the log file {settings.file}: {exc.strerror or exc}"
        ) from exc
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()  # (inherited over fork: the parent wrote its lines before forking)
    root.addHandler(handler)
    root.setLevel(settings.level.upper())
    # What no line shows, no record should pay for (each is a lookup per record).
    logging.logThreads = False
    logging.logMultiprocessing = False
    if hasattr(logging, "logAsyncioTasks"):  # Python 3.12+
        logging.logAsyncioTasks = False
    logging.captureWarnings(True)
