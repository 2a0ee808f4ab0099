"""Which query parameters each native route takes (HEAD uses GET's row)."""

from __future__ import annotations

from collections.abc import Mapping

from dirmq.server.parameters import check_parameters

# (route kind, method, action) -> the parameters it takes.
NATIVE: dict[tuple[str, str, str], frozenset[str]] = {
    ("root", "GET", ""): frozenset({"prefix"}),
    ("server", "GET", ""): frozenset(),
    ("metrics", "GET", ""): frozenset({"queue"}),  # one queue's depth series
    ("queue", "GET", ""): frozenset(),
    ("queue", "PUT", ""): frozenset(),
    ("queue", "DELETE", ""): frozenset(),
    ("messages", "POST", ""): frozenset(
        {"delay", "dedup", "group", "durability", "timeout", "ttl", "priority"}
    ),
    ("messages", "GET", ""): frozenset({"max", "wait", "visibility", "peek", "after", "state"}),
    ("messages", "DELETE", ""): frozenset({"state"}),
    ("message", "GET", ""): frozenset(),
    ("message", "DELETE", ""): frozenset({"receipt"}),
    ("action", "POST", "nack"): frozenset({"delay"}),
    ("action", "POST", "extend"): frozenset({"visibility"}),
    ("action", "POST", "dead-letter"): frozenset({"reason", "kind"}),
    ("batch", "POST", "ack"): frozenset(),  # the batch's options are in its JSON body
    ("batch", "POST", "nack"): frozenset(),
    ("batch", "POST", "extend"): frozenset(),
    ("redrive", "POST", ""): frozenset(),  # its options are in its JSON body
    ("redrive", "GET", ""): frozenset(),
    ("task", "GET", ""): frozenset(),
    ("task", "DELETE", ""): frozenset(),
}


_SHAPES = {
    "root": "/",
    "queue": "/{queue}",
    "messages": "/{queue}/messages",
    "message": "/{queue}/messages/{id}",
    "action": "/{queue}/messages/{receipt}/",
    "batch": "/{queue}/messages/",
    "redrive": "/{queue}/redrive",
    "task": "/{queue}/redrive/{task}",
}


def check_native(query: Mapping[str, str], kind: str, method: str, action: str, path: str) -> None:
    """`check_parameters` for a native route (a method the route lacks is left to the 405)."""
    accepted = NATIVE.get((kind, method, action))
    if accepted is not None:
        shape = _SHAPES.get(kind, path) + action  # `path` only for the server's fixed paths
        check_parameters(query, accepted, f"{method} {shape}")
