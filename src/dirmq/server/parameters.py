"""Query parameters, checked before a handler runs: each dialect keeps the table of what its
routes take and checks a request against it here. A parameter a route does not take is refused
(400 naming the ones it takes), never ignored: a misspelt `?wiat=5s` would otherwise answer at
once, a `?dealy=1h` publish a message ready now."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl

from dirmq.errors import InvalidArgument


def check_parameters(query: Mapping[str, str], accepted: frozenset[str], where: str) -> None:
    """InvalidArgument if a name in `query` is not in `accepted`, saying which are, or if a
    name or value is not UTF-8 once percent-decoded (see `http_wire.first_values`)."""
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
