"""Reading a TOML file (the server's config file, the credentials file) with errors that name
the file: unreadable, not UTF-8, not TOML (tomllib's message carries the line and column)."""

from __future__ import annotations

import os
import tomllib
from typing import Any

from dirmq.errors import DirmqError


def read_toml(
    path: str | os.PathLike[str], what: str, error: type[DirmqError]
) -> tuple[str, dict[str, Any]]:
    """(the text, the document) of the TOML file at `path`; `error` says what is wrong, naming
    the file (`what` it is, in the message of a file that cannot be read)."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise error(f"cannot read the {what} {where}: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8")
        return text, tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML: {exc}") from exc
