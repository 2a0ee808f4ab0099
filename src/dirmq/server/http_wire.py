"""HTTP/1.1 as bytes and text, with no connection behind it: each answer's head (the status
line with Date and Server preformatted once a second by `Clock`, then its header fields), the
JSON error body, the request URL split into path and query, the query's first values decoded,
a header value decoded, the declared body size. Every connection (`http_connection.py` and its
parts) uses these on every request; they hold no state of a connection.
"""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from urllib.parse import parse_qsl

import httptools

from dirmq.wire import framing

# Statuses whose answer has no body (nor a Content-Length).
NO_BODY = frozenset({204, 304})
# Bodies from this size on are handled without a copy: a request's is read into one buffer of
# its Content-Length (smaller ones: joining the pieces is cheaper), an answer's is written
# apart from its head (smaller ones: one buffer for the transport).
PREALLOCATE_BYTES = 256 * 1024


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": framing.reason(status), "message": message}).encode() + b"\n"


class Clock:
    """The Date header, formatted at most once a second, and each status line with the Date and
    Server headers as bytes, built at most once a second per status."""

    def __init__(self) -> None:
        self._second = 0
        self._text = ""
        self._prefixes: dict[int, bytes] = {}

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._text = now, formatdate(now, usegmt=True)
            self._prefixes = {}
        return self._text

    def prefix(self, status: int) -> bytes:
        """`HTTP/1.1 <status> <reason>`, `Date` and `Server`, each line ending in CRLF."""
        date = self.date()
        prefix = self._prefixes.get(status)
        if prefix is None:
            line = (
                f"HTTP/1.1 {status} {framing.reason(status)}\r\nDate: {date}\r\nServer: dirmq\r\n"
            )
            prefix = self._prefixes[status] = line.encode()
        return prefix


def response_head(
    prefix: bytes, headers: list[tuple[str, str]], status: int, length: int, keep_alive: bool
) -> bytes:
    """What `framing.response_head` makes of a response with a body of `length` bytes (byte for
    byte, the CR/LF check included), from the status line, Date and Server already encoded."""
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers])
    if fields.count("\n") != len(headers) or fields.count("\r") != len(headers):
        raise ValueError(f"header line with CR/LF: {fields[:60]!r}")
    tail = b"" if status in NO_BODY or status < 200 else b"Content-Length: %d\r\n" % length
    if not keep_alive:
        tail += b"Connection: close\r\n"
    return prefix + fields.encode() + tail + b"\r\n"


def split_url(raw_url: bytes) -> tuple[str, str]:
    """(path, query), both still percent-encoded."""
    if raw_url[:1] == b"/" and b"?" not in raw_url and b"#" not in raw_url:
        return raw_url.decode("latin-1"), ""  # the usual origin-form: nothing to split
    url = httptools.parse_url(raw_url)
    path = url.path.decode("latin-1") if url.path else "/"
    return path, url.query.decode("latin-1") if url.query else ""


def content_length(headers: dict[str, str]) -> int | None:
    """The declared body size (llhttp has checked it is digits, and that repeats agree: they
    are joined with ", " here, so the first value is the one)."""
    length = headers.get("content-length")
    if length is None:
        return None
    digits = length.split(",", 1)[0].strip()
    return int(digits) if digits.isascii() and digits.isdigit() else None


def header_text(value: bytes) -> str:
    """Header values are UTF-8 when they decode as such (what our client sends), else latin-1."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def first_values(query: str) -> dict[str, str]:
    """Percent-decoded as UTF-8; bytes that are not UTF-8 are kept as lone surrogates (not
    U+FFFD, which would pass for a real value), so each dialect can refuse them its own way."""
    values: dict[str, str] = {}
    if "%" not in query and "+" not in query:  # nothing to decode (`?wait=20s`): as parse_qsl
        for field in query.split("&"):
            if field:
                name, _, value = field.partition("=")
                values.setdefault(name, value)
        return values
    for name, value in parse_qsl(query, keep_blank_values=True, errors="surrogateescape"):
        values.setdefault(name, value)
    return values
