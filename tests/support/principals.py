"""Credentials files for tests: one `principal(...)` per principal, joined, instead of a TOML
block copied into every module (docs/security.md describes the file)."""

from __future__ import annotations

import json

from dirmq.server.credentials import token_digest

GRANTS = ("read", "write", "admin", "browse")


def principal(name: str, token: str, **grants: list[str]) -> str:
    """The `[principals.<name>]` table of a principal whose bearer token is `token`, with its
    grants (`read=["orders*"]`, `admin=["*"]`...), in the credentials file's own syntax."""
    unknown = set(grants) - set(GRANTS)
    if unknown:
        raise ValueError(f"unknown grants {sorted(unknown)}: a principal has {GRANTS}")
    lines = [f"[principals.{name}]", f'token_sha256 = "{token_digest(token)}"']
    lines += [f"{grant} = {json.dumps(grants[grant])}" for grant in GRANTS if grant in grants]
    return "\n".join(lines) + "\n\n"


def everything(name: str, token: str) -> str:
    """A principal that may read, write and administer every queue."""
    return principal(name, token, read=["*"], write=["*"], admin=["*"])
