"""The console's sessions and CSRF tokens: stateless, signed, valid in every worker.

A session cookie is `<principal, base64url>.<expiry, epoch s>.<HMAC-SHA256 of both>` under a
secret the server makes once before its workers fork (`new_secret`), so any worker checks any
cookie without shared state; a restart makes a new secret and every session ends (sign in
again). Without credentials the console gives every browser an anonymous session (principal
""), so that its forms carry a CSRF token all the same: a console on loopback is still a
target for another site's forms.

The CSRF token of a session is an HMAC of its cookie under the same secret: the page puts it
in each form (hidden field) and htmx in an `X-CSRF-Token` header; a state-changing request
without it, or whose `Origin` is not the server's own, is refused (403).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

COOKIE = "dirmq_console"
SESSION_S = 12 * 3600  # how long a sign-in lasts
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


def new_secret() -> bytes:
    """A fresh signing secret (made by `serve` before the workers fork: they share it)."""
    return secrets.token_bytes(32)


@dataclass(frozen=True, slots=True)
class Session:
    principal: str  # "" on a server without credentials
    expires_s: int
    cookie: str  # the signed value, as sent


class Sessions:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def issue(self, principal: str, now_s: float | None = None) -> Session:
        expires = int((time.time() if now_s is None else now_s) + SESSION_S)
        encoded = base64.urlsafe_b64encode(principal.encode()).decode().rstrip("=")
        signed = f"{encoded}.{expires}"
        return Session(principal, expires, f"{signed}.{self._sign('session', signed)}")

    def check(self, cookie: str | None, now_s: float | None = None) -> Session | None:
        """The session `cookie` holds, or None if it is absent, forged, malformed or expired."""
        if not cookie:
            return None
        encoded, sep, rest = cookie.partition(".")
        expires_text, sep2, signature = rest.partition(".")
        if not (sep and sep2 and expires_text.isdigit()):
            return None
        expected = self._sign("session", f"{encoded}.{expires_text}")
        if not hmac.compare_digest(signature, expected):
            return None
        expires = int(expires_text)
        if expires <= (time.time() if now_s is None else now_s):
            return None
        try:
            principal = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return Session(principal, expires, cookie)

    def csrf(self, session: Session) -> str:
        """The CSRF token of `session` (the same in every worker, for its whole life)."""
        return self._sign("csrf", session.cookie)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf(session), token or "")

    def _sign(self, purpose: str, text: str) -> str:
        mac = hmac.new(self._secret, f"{purpose}\n{text}".encode(), hashlib.sha256)
        return mac.hexdigest()


def cookie_header(session: Session | None, secure: bool) -> str:
    """The `Set-Cookie` value for `session` (None: one that signs out)."""
    value, age = (session.cookie, SESSION_S) if session else ("", 0)
    flags = f"; Path=/ui/; Max-Age={age}; HttpOnly; SameSite=Strict"
    return f"{COOKIE}={value}{flags}{'; Secure' if secure else ''}"


def cookie_of(header: str | None) -> str | None:
    """This console's cookie among those of a `Cookie` header."""
    if not header:
        return None
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE:
            return value
    return None


def same_origin(
    origin: str | None, host: str | None, scheme: str, fetch_site: str | None = None
) -> bool:
    """Whether a request's `Origin` (absent: as good as the same) is this server's own. Under
    `Referrer-Policy: no-referrer` a browser sends `Origin: null` with the console's own form
    posts; those are told apart by `Sec-Fetch-Site: same-origin`, which no page's script can
    set (a sandboxed frame elsewhere says `cross-site`)."""
    if origin is None:
        return True
    if origin == "null":
        return fetch_site == "same-origin"
    return bool(host) and origin == f"{scheme}://{host}"
