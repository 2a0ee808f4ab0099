"""The credentials of `dirmq serve`: principals, their secrets and their permissions, read once
at start from `--credentials FILE` (TOML) or the legacy `--sqs-credentials FILE` (key lines).

    health = "anyone"      # who may GET /health: "anyone" (default) | "principals"
    metrics = "granted"    # who may GET /metrics: "granted" (default: principals whose
                           # `metrics = true`) | "principals" | "anyone"

    [principals.shop]
    token_sha256 = "<64 hex digits>"            # or a list: several tokens (rotation)
    aws_keys = [{ id = "AKIA...", secret = "..." }]
    browse = ["billing/*"]                      # look, never consume: peek, browse, stats
    read = ["orders/*"]                         # receive, ack, subscribe, settle; and browse
    write = ["orders/*", "@channel/orders*"]    # publish
    admin = ["orders/*"]                        # create, configure, purge, delete, redrive
    metrics = false

A token is a random string (`new_token`, `dirmq token new`) of which the file holds only the
SHA-256: a token has 256 bits of entropy, so a fast hash is enough (nothing to brute-force),
and it costs one hash per request, or none once the token was seen. SigV4 needs the AWS
secret itself, so a file with `aws_keys` must be private (the server warns when it is not).

`browse` is looking without consuming or changing anything: listing, stats and configuration,
peeking and browsing messages in every state, reading retained pub/sub pages. `read` implies
it (`GRANTED_BY`); no other permission does. SEE (stats, configuration, listings) is any of
the four.

Patterns are `fnmatch` globs over the whole name, case-sensitive: `*` is any run of characters
(`/` included: `orders/*` matches `orders/eu/fr`), `?` one character, `[abc]` one of a set.
Pub/sub resources are named `@channel/<channel>` and `@subscription/<name>` (no queue name
starts with `@`, so a pattern never mixes them up; `*` matches them too). docs/security.md is
the reader's description of this file: keep the two in step.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any

from dirmq.errors import ConfigError
from dirmq.wire.tomlfile import read_toml

BROWSE, READ, WRITE, ADMIN = "browse", "read", "write", "admin"
PERMISSIONS = (BROWSE, READ, WRITE, ADMIN)
SEE = "see"  # any of the four: a principal sees (lists, inspects) what it may touch at all
# The patterns each permission is granted by: a reader may look at what it may consume.
GRANTED_BY: dict[str, tuple[str, ...]] = {
    READ: (READ,),
    WRITE: (WRITE,),
    ADMIN: (ADMIN,),
    BROWSE: (BROWSE, READ),
    SEE: PERMISSIONS,
}
HEALTH_MODES = ("anyone", "principals")
METRICS_MODES = ("granted", "principals", "anyone")
CHANNEL_PREFIX = "@channel/"
SUBSCRIPTION_PREFIX = "@subscription/"
TOKEN_PREFIX = "dmq_"
_PRINCIPAL_KEYS = ("token_sha256", "aws_keys", *PERMISSIONS, "metrics")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}")
_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_KEY_ID = re.compile(r"[A-Za-z0-9_.+=@-]{1,128}")


def new_token() -> str:
    """A fresh bearer token: 32 random bytes, URL-safe, with a prefix that secret scanners and
    people recognise."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What the credentials file holds of a token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class Principal:
    """Who a request is, and what it may do: patterns per permission (compiled once)."""

    __slots__ = ("_compiled", "aws_keys", "grants", "metrics", "name", "token_digests")

    def __init__(
        self,
        name: str,
        grants: Mapping[str, Iterable[str]],
        *,
        metrics: bool = False,
        token_digests: Iterable[str] = (),
        aws_keys: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.grants = {p: tuple(grants.get(p, ())) for p in PERMISSIONS}
        self.metrics = metrics
        self.token_digests = tuple(token_digests)
        self.aws_keys = dict(aws_keys or {})  # access key id -> secret access key
        self._compiled = {
            p: [re.compile(translate(pattern)) for pattern in patterns]
            for p, patterns in self.grants.items()
        }

    def may(self, permission: str, name: str) -> bool:
        """Whether a pattern granting `permission` matches `name` (`GRANTED_BY`: browse is
        granted by browse or read patterns, SEE by any)."""
        return any(rx.match(name) for kind in GRANTED_BY[permission] for rx in self._compiled[kind])

    def covers(self, permission: str, prefix: str) -> bool:
        """Whether `permission` holds for every name that starts with `prefix` (a pub/sub
        filter receives every channel that starts with its prefix): some pattern that ends in
        `*` matches `prefix` itself. Such a pattern `X*` matches every extension of what it
        matches, and a pattern without a final `*` cannot (its last piece is fixed)."""
        return any(
            pattern.endswith("*") and rx.match(prefix)
            for kind in GRANTED_BY[permission]
            for pattern, rx in zip(self.grants[kind], self._compiled[kind], strict=True)
        )

    def __repr__(self) -> str:
        return f"Principal({self.name!r})"


@dataclass(frozen=True, slots=True)
class Credentials:
    principals: dict[str, Principal]
    health: str = "anyone"
    metrics: str = "granted"
    source: str = ""  # the file they came from, for messages
    tokens: dict[str, str] = field(default_factory=dict)  # SHA-256 hex -> principal name
    aws_secrets: dict[str, str] = field(default_factory=dict)  # access key id -> secret
    aws_owners: dict[str, str] = field(default_factory=dict)  # access key id -> principal name

    @classmethod
    def of(cls, principals: Iterable[Principal], source: str = "", **modes: str) -> Credentials:
        """Credentials for `principals`, with the lookup tables built (a token digest or an
        access key given to two principals is refused)."""
        by_name: dict[str, Principal] = {}
        tokens: dict[str, str] = {}
        aws_secrets: dict[str, str] = {}
        aws_owners: dict[str, str] = {}
        for principal in principals:
            if principal.name in by_name:
                raise ConfigError(f"{source}: principal {principal.name!r} is given twice")
            by_name[principal.name] = principal
            for digest in principal.token_digests:
                other = tokens.setdefault(digest, principal.name)
                if other != principal.name:
                    raise ConfigError(
                        f"{source}: principals {other!r} and {principal.name!r} have the same "
                        f"token (token_sha256 {digest[:12]}...): give each its own"
                    )
            for key_id, secret in principal.aws_keys.items():
                other = aws_owners.setdefault(key_id, principal.name)
                if other != principal.name:
                    raise ConfigError(
                        f"{source}: principals {other!r} and {principal.name!r} have the same "
                        f"AWS access key id {key_id!r}"
                    )
                aws_secrets[key_id] = secret
        return cls(
            by_name,
            source=source,
            tokens=tokens,
            aws_secrets=aws_secrets,
            aws_owners=aws_owners,
            **modes,
        )

    @property
    def holds_secrets(self) -> bool:
        return bool(self.aws_secrets)


def load_credentials(path: str | os.PathLike[str]) -> Credentials:
    """The credentials file at `path`; ConfigError names the file, the principal (and its
    line) and what is wrong."""
    where = os.fspath(path)
    text, data = read_toml(path, "credentials file", ConfigError)
    unknown = sorted(set(data) - {"principals", "health", "metrics"})
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r} at the top: the file takes health, metrics "
            "and [principals.NAME] tables"
        )
    modes = {
        "health": _mode(data, "health", HEALTH_MODES, where),
        "metrics": _mode(data, "metrics", METRICS_MODES, where),
    }
    tables = data.get("principals")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(
            f"{where}: no principals: add at least one [principals.NAME] table (see "
            "docs/security.md)"
        )
    principals = [
        _principal(name, table, f"{where}{_line_of(text, name)}: principal {name!r}")
        for name, table in tables.items()
    ]
    return Credentials.of(principals, where, **modes)


def _mode(data: dict[str, Any], key: str, choices: tuple[str, ...], where: str) -> str:
    value = data.get(key, choices[0])
    if value not in choices:
        raise ConfigError(
            f"{where}: {key} = {value!r}: must be one of " + ", ".join(f'"{c}"' for c in choices)
        )
    return str(value)


def _line_of(text: str, name: str) -> str:
    """`:N` for the line of `[principals.NAME]`, where the table is written as such."""
    header = re.compile(
        r"^[ \t]*\[[ \t]*principals[ \t]*\.[ \t]*(?:"
        + re.escape(name)
        + r"|\""
        + re.escape(name)
        + r"\"|'"
        + re.escape(name)
        + r"')[ \t]*\]",
        re.MULTILINE,
    )
    found = header.search(text)
    return "" if found is None else f":{text.count(chr(10), 0, found.start()) + 1}"


def _principal(name: str, table: object, where: str) -> Principal:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: a principal's name is 1-128 characters of A-Z a-z 0-9 _ . @ + -, "
            "starting with a letter or digit"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table ([principals.{name}])")
    unknown = sorted(set(table) - set(_PRINCIPAL_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}: a principal takes " + ", ".join(_PRINCIPAL_KEYS)
        )
    digests = _digests(table.get("token_sha256", []), where)
    aws_keys = _aws_keys(table.get("aws_keys", []), where)
    if not digests and not aws_keys:
        raise ConfigError(
            f"{where}: has no credentials: give it token_sha256 (`dirmq token new` makes a "
            "token and prints the line) or aws_keys"
        )
    grants = {p: _patterns(table.get(p, []), p, where) for p in PERMISSIONS}
    metrics = table.get("metrics", False)
    if not isinstance(metrics, bool):
        raise ConfigError(f"{where}: metrics must be true or false, not {metrics!r}")
    return Principal(name, grants, metrics=metrics, token_digests=digests, aws_keys=aws_keys)


def _digests(value: object, where: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{where}: token_sha256 must be a string or a list of strings")
    for item in items:
        if not _DIGEST.fullmatch(item):
            # The value is not echoed: it may be a token pasted by mistake.
            raise ConfigError(
                f"{where}: token_sha256 holds a value of {len(item)} characters that is not a "
                "SHA-256 digest (64 hex digits): store the digest `dirmq token new` prints, "
                "never the token itself"
            )
    return [i.lower() for i in items]


def _aws_keys(value: object, where: str) -> dict[str, str]:
    shape = (
        'aws_keys must be a list of tables, e.g. aws_keys = [{ id = "AKIA...", secret = "..." }]'
    )
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {shape}")
    keys: dict[str, str] = {}
    for item in value:
        if not isinstance(item, dict) or set(item) != {"id", "secret"}:
            raise ConfigError(f"{where}: {shape}")
        key_id, secret = item["id"], item["secret"]
        if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
            raise ConfigError(
                f"{where}: AWS access key id {key_id!r} must be 1-128 characters of "
                "A-Z a-z 0-9 _ . + = @ -"
            )
        if not isinstance(secret, str) or not secret or any(c.isspace() for c in secret):
            raise ConfigError(
                f"{where}: the secret of AWS access key {key_id!r} must be a non-empty string "
                "without spaces"
            )
        if key_id in keys:
            raise ConfigError(f"{where}: AWS access key id {key_id!r} is given twice")
        keys[key_id] = secret
    return keys


def _patterns(value: object, permission: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise ConfigError(
            f"{where}: {permission} must be a list of name patterns, e.g. {permission} = "
            '["orders/*"]'
        )
    for pattern in value:
        if not pattern or any(ord(c) < 32 or ord(c) == 127 for c in pattern):
            raise ConfigError(
                f"{where}: {permission} pattern {pattern!r} is empty or has control characters"
            )
    return value


def read_key_lines(path: str | os.PathLike[str]) -> dict[str, str]:
    """Access key id -> secret access key, from the legacy `--sqs-credentials` file of
    `KEY_ID SECRET` lines (`#` comments and blank lines are ignored)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read SQS credentials {os.fspath(path)!r}: {exc}") from exc
    found: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.split()
        if len(parts) != 2:
            raise ConfigError(
                f"{os.fspath(path)}:{number}: expected 'ACCESS_KEY_ID SECRET_ACCESS_KEY'"
            )
        key_id, secret = parts
        if key_id in found and found[key_id] != secret:
            raise ConfigError(f"{os.fspath(path)}:{number}: access key {key_id} given twice")
        found[key_id] = secret
    if not found:
        raise ConfigError(f"{os.fspath(path)}: no credentials in the file")
    return found


def legacy_credentials(path: str | os.PathLike[str]) -> Credentials:
    """`--sqs-credentials FILE`: each access key is a principal of that name with every
    permission on everything (metrics included), whose secret is also its token on the HTTP
    doors (Bearer, or Basic with it as the password). Two keys with the same secret: the
    token is the first one's (they may do the same anyway)."""
    keys = read_key_lines(path)
    everything = {p: ["*"] for p in PERMISSIONS}
    principals = []
    seen: set[str] = set()
    for key_id, secret in keys.items():
        digest = token_digest(secret)
        principals.append(
            Principal(
                key_id,
                everything,
                metrics=True,
                token_digests=() if digest in seen else (digest,),
                aws_keys={key_id: secret},
            )
        )
        seen.add(digest)
    return Credentials.of(principals, os.fspath(path))


def exposure_warning(path: str | os.PathLike[str], credentials: Credentials) -> str | None:
    """A warning when a file holding AWS secrets can be read by other users, else None."""
    if not credentials.holds_secrets:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) == 0:
        return None
    return (
        f"{os.fspath(path)} holds AWS secret keys and other users may read it (mode "
        f"{stat.S_IMODE(mode):04o}): chmod 600 it"
    )
