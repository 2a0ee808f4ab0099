"""Requests built once as bytes (HTTP/1.1, RESP), and replies parsed only as far as a load needs."""

from __future__ import annotations

from collections.abc import Iterable

from bench.harness import BODY, HOST


def http_request(
    method: str, path: str, body: bytes = b"", headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def batch_body(count: int) -> bytes:
    """JSON lines: `count` messages of 100 B."""
    return b"".join(b'{"body":"' + BODY + b'"}\n' for _ in range(count))


def resp_command(*args: bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


# A parsed reply: (bytes consumed, code, head, payload). For HTTP the code is the status and the
# payload the body; for RESP the code is the type byte (":" 58, "$" 36, "*" 42, "-" 45, "+" 43)
# and the payload the value (None for a nil bulk string or array).
RESP_INT, RESP_BULK, RESP_ARRAY = ord(":"), ord("$"), ord("*")
Reply = tuple[int, int, bytes, bytes | None]


def parse_http(buf: bytearray) -> Reply | None:
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end])
    status = int(head[9:12])
    at = head.find(b"\r\nContent-Length: ")
    if at < 0:
        at = head.lower().find(b"\r\ncontent-length: ")
    length = 0
    if at >= 0:
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 18 : stop if stop >= 0 else len(head)])
    elif b"\r\ntransfer-encoding: chunked" in head.lower():
        raise RuntimeError("chunked responses are not expected here")
    total = end + 4 + length
    if len(buf) < total:
        return None
    return total, status, head, bytes(buf[end + 4 : total])


def parse_resp(buf: bytearray) -> Reply | None:
    """Simple strings, errors, integers, bulk strings, and flat arrays of bulk strings (whose
    last element is the payload, as BLPOP answers `key, value`)."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None
    kind = buf[0]
    if kind == RESP_BULK:
        size = int(buf[1:end])
        if size < 0:
            return end + 2, kind, b"", None
        stop = end + 2 + size
        if len(buf) < stop + 2:
            return None
        return stop + 2, kind, b"", bytes(buf[end + 2 : stop])
    if kind == RESP_ARRAY:
        count = int(buf[1:end])
        pos, last = end + 2, None
        if count < 0:
            return pos, kind, b"", None
        for _ in range(count):
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                return None
            stop = line_end + 2 + int(buf[pos + 1 : line_end])
            if len(buf) < stop + 2:
                return None
            last, pos = bytes(buf[line_end + 2 : stop]), stop + 2
        return pos, kind, b"", last
    return end + 2, kind, b"", bytes(buf[1:end])


def header_value(head: bytes, name: bytes) -> bytes | None:
    at = head.find(b"\r\n" + name + b": ")
    if at < 0:
        return None
    start = at + len(name) + 4
    stop = head.find(b"\r\n", start)
    return head[start : stop if stop >= 0 else len(head)]
