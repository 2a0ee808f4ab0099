"""The server's logging: stdlib `logging`, one handler, text or JSON lines.

`configure(LogSettings)` is called once per server process (and again in each worker after the
fork). Every record goes to one handler on the root logger: stderr (journald, a terminal, a
pipe), or `--log-file`, reopened when logrotate moves it.

Structured fields ride on a record as `extra={"fields": {...}}` (see `fields`): the text format
appends them as `key=value` (logfmt: a value with spaces or quotes is quoted as JSON), the JSON
format merges them into the line's object next to `time`, `level`, `logger`, `message`:

    2026-05-01T10:00:00.123Z INFO dirmq.access request door=native method=POST ...
    {"time":"2026-05-01T10:00:00.123Z","level":"INFO","logger":"dirmq.access",...}

Loggers: `dirmq.access` (a line per request, `access.py`), `dirmq.auth` (authentication
failures, rate-limited), `dirmq.server` (start-up, shutdown, errors answering), `dirmq.store.*`
(quarantined files, expired leases returned), `dirmq.pubsub` (sweeps), `dirmq.sqs`.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import InvalidArgument

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = "info"  # one of LEVELS
    format: str = "text"  # one of FORMATS
    file: str | None = None  # None: stderr
    access: bool = True  # the access log (INFO on `dirmq.access`)


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


class _LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes each record in one `write` (one line: atomic on a pipe
    shared by workers) and skips the separate flush when the stream flushes at each line
    (stderr does) - half a microsecond of every access line."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream
            stream.write(self.format(record) + "\n")
            if not getattr(stream, "line_buffering", False):
                stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def configure(settings: LogSettings) -> None:
    """Send every record at `settings.level` and above to one handler, in `settings.format`
    (replacing whatever handlers were there: called again in a forked worker)."""
    if settings.level not in LEVELS:
        raise InvalidArgument(f"log level {settings.level!r} is not one of {', '.join(LEVELS)}")
    if settings.format not in FORMATS:
        raise InvalidArgument(f"log format {settings.format!r} is not one of {', '.join(FORMATS)}")
    handler: logging.Handler
    if settings.file:
        try:
            # Reopens the file when it was moved or removed (logrotate without copytruncate).
            handler = logging.handlers.WatchedFileHandler(settings.file, encoding="utf-8")
        except OSError as exc:
            raise InvalidArgument(
                f"cannot open the log file {settings.file}: {exc.strerror or exc}"
            ) from exc
    else:
        handler = _LineHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()  # a file handler inherited over fork; a stream handler leaves stderr open
    root.addHandler(handler)
    root.setLevel(settings.level.upper())
    # What no line shows, no record should pay for (each is a lookup per record).
    logging.logThreads = False
    logging.logMultiprocessing = False
    if hasattr(logging, "logAsyncioTasks"):  # Python 3.12+
        logging.logAsyncioTasks = False
    logging.captureWarnings(True)
