"""Who a request is (authentication) and what it may do (authorisation), on every door.

One `Access` per server, built by the composition root from the credentials
(`server/credentials.py`), shared by every listener and worker:

- The listener's `Router` calls `identify` before any dialect does any work: it returns the
  principal's name (put on `Request.principal`), "" when the request carries no credentials,
  or raises `Unauthenticated` for wrong ones. A request without credentials goes on only to
  what its dialect calls public (`/health`, `/metrics` as the file says); else 401.
- Each dialect then authorises its own parsed route by name (`allows`, `require`), before any
  lookup: a refusal is the same whether the queue exists or not.

Credentials a request may carry: `Authorization: Bearer <token>`; `Authorization: Basic` with
the token as the password (any user name: curl's `-u :TOKEN`, browsers); AWS Signature V4 (a
header, or a presigned query), checked by the `signature` function the SQS layer provides.
A token is looked up by its SHA-256 in a dict; a header seen valid before is found in a small
cache without hashing (so a publish pays ~0.1 µs for its token, not a hash).

`Access(None)` is the open server: no credentials configured, everything allowed (protected
mode keeps it on loopback: `service.py`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping

from dirmq.errors import AccessDenied, Unauthenticated
from dirmq.server.contract import Request
from dirmq.server.credentials import SEE, Credentials, Principal, token_digest

# The SigV4 check of a request: the principal owning the access key, or Unauthenticated.
SignatureCheck = Callable[[Request], str]
KNOWN_HEADERS = 1024  # Authorization values seen valid, kept to skip hashing them again
DECISIONS = 65536  # (principal, permission, name) -> allowed, kept until there are this many
_SIGV4 = "AWS4-HMAC-SHA256"


def credentials_required() -> Unauthenticated:
    return Unauthenticated(
        "credentials required: send 'Authorization: Bearer <token>' (or HTTP Basic with the "
        "token as the password)",
        aws_code="MissingAuthenticationToken",
    )


class Access:
    def __init__(
        self, credentials: Credentials | None, signature: SignatureCheck | None = None
    ) -> None:
        self.credentials = credentials
        self.enabled = credentials is not None
        self._principals: Mapping[str, Principal] = credentials.principals if credentials else {}
        self._tokens: Mapping[str, str] = credentials.tokens if credentials else {}
        self._signature = signature
        self.health_open = credentials is None or credentials.health == "anyone"
        self.metrics_open = credentials is None or credentials.metrics == "anyone"
        self._metrics_any_principal = credentials is not None and credentials.metrics != "granted"
        self._known: dict[str, str] = {}
        self._decisions: dict[tuple[str, str, str], bool] = {}

    # -- authentication --------------------------------------------------------------------------
    def identify(self, request: Request) -> str:
        """The principal's name; "" for a request without credentials (or on an open server);
        Unauthenticated for credentials that are wrong or malformed."""
        if not self.enabled:
            return ""
        authorization = request.headers.get("authorization")
        if authorization is None:
            query = request.query
            if "X-Amz-Signature" in query or "X-Amz-Credential" in query:
                return self._signed(request)  # a presigned URL
            return ""
        known = self._known.get(authorization)
        if known is not None:
            return known
        scheme, _, value = authorization.strip().partition(" ")
        if scheme == _SIGV4:
            return self._signed(request)
        return self._token(authorization, scheme, value)

    def token_of(self, authorization: str | None) -> str:
        """The principal of a Bearer or Basic `Authorization` value, else "" (never raises):
        what a request's head alone can tell (`Router.body_check`), and all a fast path
        looks at (anything else: the general path answers)."""
        if authorization is None or not self.enabled:
            return ""
        known = self._known.get(authorization)
        if known is not None:
            return known
        scheme, _, value = authorization.strip().partition(" ")
        if scheme == _SIGV4:
            return ""
        try:
            return self._token(authorization, scheme, value)
        except Unauthenticated:
            return ""

    def _token(self, authorization: str, scheme: str, value: str) -> str:
        kind = scheme.lower()
        if kind == "bearer":
            token = value.strip()
        elif kind == "basic":
            token = _basic_password(value.strip())
        else:
            raise Unauthenticated(
                f"unsupported authorization scheme {scheme[:30]!r}: use Bearer <token>, or "
                "Basic with the token as the password"
            )
        name = self._tokens.get(token_digest(token)) if token else None
        if name is None:
            raise Unauthenticated("the token is not valid")
        if len(self._known) >= KNOWN_HEADERS:
            self._known.clear()  # many valid spellings (Basic user names): start again
        self._known[authorization] = name
        return name

    def _signed(self, request: Request) -> str:
        if self._signature is None:
            raise Unauthenticated("AWS signatures are not accepted on this server")
        return self._signature(request)

    # -- authorisation ---------------------------------------------------------------------------
    def allows(self, principal: str, permission: str, name: str) -> bool:
        """Whether `principal` has `permission` (browse, read, write, admin; `SEE`: any) on the
        queue or pub/sub resource `name` (`credentials.GRANTED_BY`: read grants browse too).
        Always true on an open server."""
        if not self.enabled:
            return True
        key = (principal, permission, name)
        decided = self._decisions.get(key)
        if decided is None:
            found = self._principals.get(principal)
            decided = found is not None and found.may(permission, name)
            if len(self._decisions) >= DECISIONS:
                self._decisions.clear()
            self._decisions[key] = decided
        return decided

    def covers(self, principal: str, permission: str, prefix: str) -> bool:
        """Whether `principal` has `permission` on every name starting with `prefix`."""
        if not self.enabled:
            return True
        found = self._principals.get(principal)
        return found is not None and found.covers(permission, prefix)

    def require(self, principal: str, permission: str, name: str, what: str = "queue") -> None:
        """Return if allowed, else raise the refusal (401 for no principal, else 403), which
        names the permission and the name asked for, never whether it exists."""
        if not self.allows(principal, permission, name):
            raise self.refusal(principal, permission, f"{what} {name!r}")

    def refusal(self, principal: str, permission: str, target: str) -> Exception:
        if not principal:
            return credentials_required()
        wanted = "permission" if permission == SEE else f"{permission} permission"
        return AccessDenied(f"principal {principal!r} has no {wanted} on {target}")

    def may_read_metrics(self, principal: str) -> bool:
        if self.metrics_open:
            return True
        if not principal:
            return False
        found = self._principals.get(principal)
        return self._metrics_any_principal or (found is not None and found.metrics)

    def visible(self, principal: str, prefix: str = "") -> Callable[[str], bool]:
        """A filter of names `principal` may see (listings), `prefix` + name judged."""
        if not self.enabled:
            return lambda _name: True
        return lambda name: self.allows(principal, SEE, prefix + name)


def _basic_password(encoded: str) -> str:
    try:
        text = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Unauthenticated("malformed Basic credentials (not base64 of user:token)") from None
    _user, sep, password = text.partition(":")
    if not sep:
        raise Unauthenticated("malformed Basic credentials (not base64 of user:token)")
    return password


OPEN = Access(None)
