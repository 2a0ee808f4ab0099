"""The values `--log-level` and `--log-format` accept: shared by the CLI's parser and the
server's log settings (logs.py), apart so that parsing a command line does not import the
server's logging (and asyncio) into every `dirmq` call."""

from __future__ import annotations

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
