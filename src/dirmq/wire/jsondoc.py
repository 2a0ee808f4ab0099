"""JSON documents from clients, decoded with a nesting bound: the one decoder every door uses
(native queue configuration and JSON-lines batches, SQS JSON bodies, JSON inside SQS attribute
values and tokens).

The standard decoder recurses once per level, so 50,000 `[` end in a RecursionError (a 500)
rather than a clear 400. No document dirmq takes from a client nests deeper than a few levels;
`MAX_JSON_DEPTH` leaves room and refuses anything deeper. A document with fewer brackets than
the bound cannot nest deeper and is decoded as is; another is decoded (the C decoder's own
recursion guard stops a very deep one) and its depth measured without recursion. No scan of
the text: a hostile document of quotes and backslashes costs no more than its decoding."""

from __future__ import annotations

import json
from collections.abc import Collection

from dirmq.errors import InvalidArgument

MAX_JSON_DEPTH = 64


def depth_of(value: object, stop_after: int | None = None) -> int:
    """How deep the lists and dicts of a decoded document nest (0 for a scalar), level by level
    (no recursion); counting stops past `stop_after` levels."""
    depth = 0
    level = [value] if isinstance(value, dict | list) else []
    while level and (stop_after is None or depth <= stop_after):
        depth += 1
        below: list[object] = []
        for item in level:
            below.extend(item.values() if isinstance(item, dict) else item)
        level = [child for child in below if isinstance(child, dict | list)]
    return depth


def loads(document: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> object:
    """`json.loads(document)`, refusing a document nested deeper than `max_depth` with
    InvalidArgument (a ValueError). Malformed JSON raises json's ValueError (UnicodeDecodeError
    for bytes that are not UTF-8): callers catch ValueError for all three."""
    if isinstance(document, str):
        brackets = document.count("[") + document.count("{")
    else:
        brackets = document.count(b"[") + document.count(b"{")
    if brackets <= max_depth:
        return json.loads(document)
    too_deep = f"JSON nested more than {max_depth} levels deep; at most {max_depth} are accepted"
    try:
        value = json.loads(document)
    except RecursionError:
        raise InvalidArgument(too_deep) from None
    if depth_of(value, max_depth) > max_depth:
        raise InvalidArgument(too_deep)
    return value


def load_object(
    body: bytes, must: str, keys: Collection[str], takes: str, key_kind: str = "key"
) -> dict[str, object]:
    """A request body that is a JSON object of `keys` (an empty body: {}); InvalidArgument
    otherwise: `must` ("... must be a JSON object"), or for a key it does not know,
    "unknown <key_kind> '<key>': <takes>"."""
    if not body.strip():
        return {}
    try:
        data = loads(body)
    except ValueError as exc:
        raise InvalidArgument(f"{must}: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgument(must)
    for key in data:
        if key not in keys:
            raise InvalidArgument(f"unknown {key_kind} {str(key)[:100]!r}: {takes}")
    return data
