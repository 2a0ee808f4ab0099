"""Which query parameters each route takes: one table per dialect, checked before a handler
runs. A parameter a route does not take is refused (400 naming the ones it takes), never
ignored: a misspelt `?wiat=5s` would otherwise answer at once, a `?dealy=1h` publish a message
ready now."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl

from dirmq.errors import InvalidArgument

# Native API: (route kind, method, action) -> the parameters it takes. HEAD uses GET's row.
NATIVE: dict[tuple[str, str, str], frozenset[str]] = {
    ("root", "GET", ""): frozenset({"prefix"}),
    ("server", "GET", ""): frozenset(),
    ("queue", "GET", ""): frozenset(),
    ("queue", "PUT", ""): frozenset(),
    ("queue", "DELETE", ""): frozenset(),
    ("messages", "POST", ""): frozenset({"delay", "dedup", "group", "durability", "timeout"}),
    ("messages", "GET", ""): frozenset({"max", "wait", "visibility", "peek"}),
    ("messages", "DELETE", ""): frozenset(),
    ("message", "GET", ""): frozenset(),
    ("message", "DELETE", ""): frozenset({"receipt"}),
    ("action", "POST", "nack"): frozenset({"delay"}),
    ("action", "POST", "extend"): frozenset({"visibility"}),
    ("action", "POST", "dead-letter"): frozenset(),
}


def check_parameters(query: Mapping[str, str], accepted: frozenset[str], where: str) -> None:
    """InvalidArgument if a name in `query` is not in `accepted`, saying which are, or if a
    name or value is not UTF-8 once percent-decoded (see `http._first_values`)."""
    for name, value in query.items():
        if not _is_text(name) or not _is_text(value):
            raise InvalidArgument(
                f"the query string of {where} is not valid UTF-8 once percent-decoded"
            )
    for name in query:
        if name not in accepted:
            takes = (
                "takes " + ", ".join(f"{p}=" for p in sorted(accepted))
                if accepted
                else "takes no query parameters"
            )
            raise InvalidArgument(f"unknown parameter {name[:100]!r}: {where} {takes}")


def every_value(raw_query: str, where: str) -> list[tuple[str, str]]:
    """Every (name, value) of a query string, repeats included, percent-decoded; InvalidArgument
    for one that is not UTF-8 (`Request.query` has only the first value of each name)."""
    pairs = parse_qsl(raw_query, keep_blank_values=True, errors="surrogateescape")
    if not all(_is_text(name) and _is_text(value) for name, value in pairs):
        raise InvalidArgument(
            f"the query string of {where} is not valid UTF-8 once percent-decoded"
        )
    return pairs


def _is_text(decoded: str) -> bool:
    if decoded.isascii():
        return True
    try:
        decoded.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a byte that was not UTF-8
        return False
    return True


_SHAPES = {
    "root": "/",
    "queue": "/{queue}",
    "messages": "/{queue}/messages",
    "message": "/{queue}/messages/{id}",
    "action": "/{queue}/messages/{receipt}/",
}


def check_native(query: Mapping[str, str], kind: str, method: str, action: str, path: str) -> None:
    """`check_parameters` for a native route (a method the route lacks is left to the 405)."""
    accepted = NATIVE.get((kind, method, action))
    if accepted is not None:
        shape = _SHAPES.get(kind, path) + action  # `path` only for the server's fixed paths
        check_parameters(query, accepted, f"{method} {shape}")
