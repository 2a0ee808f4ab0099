"""JSON documents from clients, decoded with a nesting bound: the one decoder every door uses
(native queue configuration and JSON-lines batches, SQS JSON bodies, JSON inside SQS attribute
values and tokens).

The standard decoder recurses once per level, so 50,000 `[` end in a RecursionError (a 500)
rather than a clear 400. No document dirmq takes from a client nests deeper than a few levels;
`MAX_JSON_DEPTH` leaves room and refuses, before decoding, anything deeper."""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate

from dirmq.errors import InvalidArgument

MAX_JSON_DEPTH = 64

# A JSON string (brackets inside one do not nest): the unrolled form, linear on long strings.
_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes


class JsonTooDeep(InvalidArgument):
    """A JSON document nested deeper than the bound (a ValueError, as json's own errors)."""


def nesting_depth(document: bytes) -> int:
    """How deep the arrays and objects of `document` nest (0 for a scalar). Exact for valid
    JSON; for malformed JSON (an unterminated string) an estimate, which decoding refuses
    anyway."""
    brackets = _STRING_BYTES.sub(b"", document).translate(None, _NOT_BRACKETS)
    return max(accumulate(array("b", brackets.translate(_STEPS))), default=0)


def loads(document: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`json.loads(document)`, refusing a document nested deeper than `max_depth` with
    JsonTooDeep. Malformed JSON raises json's ValueError (UnicodeDecodeError for bytes that are
    not UTF-8): callers catch ValueError for both."""
    raw = document.encode("utf-8", "surrogatepass") if isinstance(document, str) else document
    # Counting is cheap, scanning less so: only a document with enough brackets is scanned.
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise JsonTooDeep(f"JSON nested {depth} levels deep; at most {max_depth} are accepted")
    return json.loads(document)
