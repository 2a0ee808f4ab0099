"""Which query parameters each route takes: one table per dialect, checked before a handler
runs. A parameter a route does not take is refused (400 naming the ones it takes), never
ignored: a misspelt `?wiat=5s` would otherwise answer at once, a `?dealy=1h` publish a message
ready now."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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


def check_parameters(names: Iterable[str], accepted: frozenset[str], where: str) -> None:
    """InvalidArgument if a name in `names` is not in `accepted`, saying which are."""
    for name in names:
        if name not in accepted:
            takes = (
                "takes " + ", ".join(f"{p}=" for p in sorted(accepted))
                if accepted
                else "takes no query parameters"
            )
            raise InvalidArgument(f"unknown parameter {name[:100]!r}: {where} {takes}")


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
