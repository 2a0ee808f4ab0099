"""The message file codec: headers, a blank line, then the exact body bytes (readable with `cat`).

    Dirmq-Format: 1
    Content-Length: 9
    Body-CRC32: 0a1b2c3d
    Dirmq-Id: 1716000000000000-0123456789ab
    Content-Type: text/plain; charset=UTF-8
    X-Attr-Colour: blue

    swordfish

`Dirmq-Format`, `Content-Length` and `Body-CRC32` are written by the codec and checked on every
read, so a truncated or damaged file is reported as `CorruptMessage`, never delivered. Headers
whose names start with `Dirmq-` are reserved for the store; every other header is the user's and
comes back on delivery exactly as given.

`Dirmq-Id` is the id of the message the file was written for. A reader that knows the file's
name passes the id in it to `decode`, and a file holding another message is corrupt too: a
recycled file (pool.py) is overwritten in place and renamed before its data is flushed under
`writeback`/`memory`, so a crash can leave an acknowledged message's intact bytes, checksum and
all, under a new name; and on a filesystem without ordered metadata a crash can bring a renamed
file back under an older name. Files written before the header existed have none and are not
checked. (Pub/sub files carry `Dirmq-Pubsub-Id` instead: their names are keys, not ids.)
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dirmq.errors import CorruptMessage, InvalidArgument

FORMAT_VERSION = 1
# Room for SQS's 1 MiB of message attributes (binary ones stored as base64: 4/3 of that).
MAX_HEADER_BYTES = 2 * 1024 * 1024
_TOKEN_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_RESERVED = frozenset({"content-length", "body-crc32"})
# The head `encode` writes for a message without headers (most of them), parsed in one match.
_BARE_HEAD_RE = re.compile(
    rb"Dirmq-Format: 1\nContent-Length: (\d{1,12})\nBody-CRC32: ([0-9a-f]{8})\n"
    rb"Dirmq-Id: ([0-9a-f-]{1,64})\n\n"
)
RESERVED_PREFIX = "dirmq-"
ID = "Id"  # Dirmq-Id, in `Decoded.system`


@dataclass(frozen=True, slots=True)
class Decoded:
    headers: dict[str, str]
    body: bytes
    system: dict[str, str]


# What an HTTP field value may not hold (RFC 9110: no control character but tab), so that a
# header stored through any door can be delivered over HTTP unchanged; a label not even tab.
_VALUE_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")
_LABEL_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_headers(headers: Mapping[str, str]) -> None:
    """Raise `InvalidArgument` unless every header can be stored and returned unchanged."""
    seen: set[str] = set()
    size = 0  # bytes of the header lines; checked here, not only in `encode`, so a message
    # that `Queue.validate` passed cannot fail the batch it joins (nor pass as a dedup repeat)
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN_RE.fullmatch(name):
            raise InvalidArgument(f"header name {name!r} is not an HTTP token")
        lowered = name.lower()
        if lowered in _RESERVED or lowered.startswith(RESERVED_PREFIX):
            raise InvalidArgument(f"header {name!r} is reserved by dirmq")
        if lowered in seen:
            raise InvalidArgument(f"header {name!r} is given twice")
        seen.add(lowered)
        if not isinstance(value, str) or _VALUE_CONTROL.search(value):
            raise InvalidArgument(
                f"header {name!r} has a value with a control character (only tab is allowed)"
            )
        length = utf8_length(value)
        if length is None:
            raise InvalidArgument(f"header {name!r} has a value that is not valid Unicode")
        size += len(name) + 3 + length
    if size > MAX_HEADER_BYTES:
        raise InvalidArgument(f"headers take {size} bytes; the limit is {MAX_HEADER_BYTES}")


def check_label(name: str, value: object) -> None:
    """Raise `InvalidArgument` unless `value` (a message group or dedup id) is None or a
    non-empty Unicode string without control characters: it travels in a header line."""
    if value is not None and (
        not isinstance(value, str)
        or not value
        or _LABEL_CONTROL.search(value)
        or utf8_length(value) is None
    ):
        raise InvalidArgument(
            f"{name} must be a non-empty single-line Unicode string without control characters"
        )


def utf8_length(text: str) -> int | None:
    """The length of `text` in UTF-8, or None if it has none (a lone surrogate)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        return None


def encode(
    body: bytes,
    headers: Mapping[str, str],
    system: Mapping[str, str] | None = None,
    *,
    message_id: str | None = None,
) -> bytes:
    """The bytes of a message file. Headers must have passed `check_headers`. A queue message
    passes its `message_id` (written as `Dirmq-Id`, checked against the file's name on read)."""
    if not headers and not system and message_id is not None:  # the common bare message
        return b"Dirmq-Format: %d\nContent-Length: %d\nBody-CRC32: %08x\nDirmq-Id: %s\n\n%b" % (
            FORMAT_VERSION,
            len(body),
            zlib.crc32(body),
            message_id.encode("ascii"),
            body,
        )
    lines = [
        f"Dirmq-Format: {FORMAT_VERSION}",
        f"Content-Length: {len(body)}",
        f"Body-CRC32: {zlib.crc32(body):08x}",
    ]
    if message_id is not None:
        lines.append(f"Dirmq-{ID}: {message_id}")
    if system:
        lines.extend(f"Dirmq-{name}: {value}" for name, value in system.items())
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    head = ("\n".join(lines) + "\n\n").encode("utf-8")
    if len(head) > MAX_HEADER_BYTES:
        raise InvalidArgument(f"headers take {len(head)} bytes; the limit is {MAX_HEADER_BYTES}")
    return head + body


def decode(data: bytes, message_id: str | None = None) -> Decoded:
    """Parse a message file, checking its length and checksum; raise `CorruptMessage` if damaged.

    With `message_id` (the id in the file's name), a file whose `Dirmq-Id` names another message
    is corrupt as well (see the module docstring); a file without `Dirmq-Id` passes."""
    bare = _BARE_HEAD_RE.match(data)
    if bare is not None:
        body = data[bare.end() :]
        stored_id = bare[3].decode("ascii")
        if (
            int(bare[1]) == len(body)
            and int(bare[2], 16) == zlib.crc32(body)
            and (message_id is None or stored_id == message_id)
        ):
            return Decoded({}, body, {ID: stored_id})
        # Damaged, or another message's: the full parse below says exactly what is wrong.
    split = data.find(b"\n\n")
    if split < 0:
        raise CorruptMessage("no blank line after the headers (truncated file?)")
    return decode_parts(data[:split], data[split + 2 :], message_id)


def decode_parts(head_bytes: bytes, body: bytes, message_id: str | None = None) -> Decoded:
    """`decode` of a file read as its head (up to, without, the blank line) and its body: a
    large file's body read on its own is not copied out of the whole file's bytes."""
    headers, system = decode_head(head_bytes, len(body), lambda: zlib.crc32(body), message_id)
    return Decoded(headers, body, system)


def decode_head(
    head_bytes: bytes,
    body_size: int,
    body_crc: Callable[[], int],
    message_id: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """(headers, system headers) of a file's head, checked as `decode_parts` checks a whole
    file, against a body of `body_size` bytes whose CRC-32 `body_crc()` tells (asked only once
    the length is right): a body left in its file is checked without being held."""
    try:
        head = head_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptMessage("headers are not UTF-8") from exc
    headers: dict[str, str] = {}
    system: dict[str, str] = {}
    length = crc = version = None
    for line in head.split("\n"):
        name, sep, value = line.partition(": ")
        if not sep:
            raise CorruptMessage(f"malformed header line {line[:80]!r}")
        lowered = name.lower()
        if lowered == "content-length":
            length = value
        elif lowered == "body-crc32":
            crc = value
        elif lowered == "dirmq-format":
            version = value
        elif lowered.startswith(RESERVED_PREFIX):
            system[name[len(RESERVED_PREFIX) :]] = value
        else:
            headers[name] = value
    if version != str(FORMAT_VERSION):
        raise CorruptMessage(f"unknown or missing Dirmq-Format {version!r}")
    if length is None or not length.isdigit() or int(length) != body_size:
        raise CorruptMessage(f"body is {body_size} bytes but Content-Length says {length!r}")
    if crc is None or crc != f"{body_crc():08x}":
        raise CorruptMessage("body checksum mismatch")
    if message_id is not None and system.get(ID, message_id) != message_id:
        raise CorruptMessage(
            f"the file holds message {system[ID][:80]!r}, not {message_id}: a recycled file's "
            "old content or a rename undone by a crash"
        )
    return headers, system
