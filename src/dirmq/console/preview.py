"""A safe preview of a message body: what a page may show of bytes anyone could have sent.

Text is returned as text (the template escapes it: autoescape), JSON pretty-printed, anything
that is not UTF-8 as a hex dump; the preview is cut at `limit` bytes of the body and says so.
Nothing here is ever marked safe: the templates escape every character of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PREVIEW_BYTES = 4096  # of a body, in a listing
HEX_ROW = 16


@dataclass(frozen=True, slots=True)
class Preview:
    kind: str  # "text", "json", "binary" or "empty"
    text: str
    cut: bool  # the body is longer than what is shown
    size: int


def preview(body: bytes, limit: int | None = PREVIEW_BYTES) -> Preview:
    size = len(body)
    if not body:
        return Preview("empty", "", False, 0)
    cut = limit is not None and size > limit
    shown = body[:limit] if cut and limit is not None else body
    try:
        text = shown.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut may split a character: a body that is UTF-8 up to its last few bytes is text.
        if cut and exc.start >= len(shown) - 3:
            text = shown[: exc.start].decode("utf-8")
        else:
            return Preview("binary", hex_dump(shown), cut, size)
    if not cut and text.lstrip()[:1] in ("{", "["):
        try:
            return Preview("json", json.dumps(json.loads(text), indent=2), False, size)
        except ValueError:
            pass  # looks like JSON, is not: shown as text
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return Preview("binary", hex_dump(shown), cut, size)
    return Preview("text", text, cut, size)


def hex_dump(data: bytes) -> str:
    """Offset, hex bytes and printable ASCII, 16 bytes a row."""
    rows = []
    for offset in range(0, len(data), HEX_ROW):
        chunk = data[offset : offset + HEX_ROW]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{offset:08x}  {hexes:<{HEX_ROW * 3 - 1}}  {shown}")
    return "\n".join(rows)
