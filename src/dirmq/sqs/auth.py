"""AWS Signature Version 4: who signed an SQS request (or any request, on any door).

The access keys come from the credentials (`server/credentials.py`): the `aws_keys` of the
principals of `--credentials FILE`, or the legacy `--sqs-credentials FILE` of lines

    # comment lines and blank lines are ignored
    AKIAEXAMPLE1 wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY
    ci-reader    another-secret

Without credentials every SQS request is served whatever it carries (clients must still sign,
as SDKs do, but nothing is checked). With them, a request must be signed, for service `sqs`
and any region, with one of the keys, and it is that key's principal's (`identify`): the
Router authenticates it (`server/access.py`), the SQS dialect authorises its action.

The signature goes in the `Authorization` header (what every SDK does) or, for presigned URLs,
in the query (`X-Amz-Algorithm`, `X-Amz-Credential`, `X-Amz-Date`, `X-Amz-SignedHeaders`,
`X-Amz-Expires`, `X-Amz-Signature`). The expected signature is computed by botocore's own
SigV4 signer from what arrived (method, raw path, query, the headers the client says it signed,
the SHA-256 of the body actually received), so both sides run the same algorithm; the two are
compared in constant time. Refusals are AWS's:

    no signature                          403 MissingAuthenticationToken
    malformed Authorization / X-Amz-*     400 IncompleteSignature
    unknown access key                    403 InvalidClientTokenId
    wrong signature, tampered request     403 SignatureDoesNotMatch
    X-Amz-Date more than 15 min off       403 SignatureDoesNotMatch ("Signature expired: ...",
                                              as SQS answers it)
    presigned URL past X-Amz-Expires      400 RequestExpired

Security tokens (`X-Amz-Security-Token`) are not checked: they are an ordinary header here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import HTTPHeaders  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from dirmq.errors import Unauthenticated
from dirmq.server import credentials as principals
from dirmq.server.access import SignatureCheck
from dirmq.server.contract import Request
from dirmq.server.credentials import read_key_lines
from dirmq.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 15 * 60
MAX_PRESIGN_EXPIRES_S = 7 * 24 * 3600
_AMZ_DATE = "%Y%m%dT%H%M%SZ"
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your "
    "AWS Secret Access Key and signing method. Consult the service documentation for details."
)


def load_credentials(path: str | os.PathLike[str]) -> dict[str, str]:
    """Access key id -> secret access key, from a file of `KEY_ID SECRET` lines."""
    return read_key_lines(path)


@dataclass(slots=True)
class _Received:
    """The request as botocore's signer reads it (the attributes of an AWSRequest it uses)."""

    method: str
    url: str
    params: dict[str, str]
    headers: HTTPHeaders
    body: bytes
    signed: list[tuple[str, str]]  # (lower-case name, value) of each signed header, in order
    context: dict[str, Any] = field(default_factory=dict)


class _Verifier(SigV4Auth):  # type: ignore[misc]
    """botocore's SigV4 signer, told which headers were signed instead of choosing them."""

    def headers_to_sign(self, request: _Received) -> HTTPHeaders:
        chosen = HTTPHeaders()
        for name, value in request.signed:
            chosen[name] = value
        return chosen


@dataclass(frozen=True, slots=True)
class _Signature:
    key_id: str
    date: str  # scope date, YYYYMMDD
    region: str
    service: str
    signed_headers: list[str]
    signature: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    expires_s: int | None = None  # presigned only


class SigV4Authenticator:
    """`identify(request)`: the principal whose access key signed the request; SqsError (in
    AWS's words) when it is not signed by a known key. `owners`: key id -> principal name
    (default: the key id)."""

    def __init__(
        self,
        secrets: Mapping[str, str],
        *,
        owners: Mapping[str, str] | None = None,
        max_skew_s: float = MAX_SKEW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.secrets = dict(secrets)
        self.owners = dict(owners or {})
        self.max_skew_s = max_skew_s
        self.clock = clock

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> SigV4Authenticator:
        return cls(load_credentials(path))

    @classmethod
    def of(cls, credentials: principals.Credentials) -> SigV4Authenticator:
        return cls(credentials.aws_secrets, owners=credentials.aws_owners)

    def __call__(self, request: Request) -> None:
        self.identify(request)

    def identify(self, request: Request) -> str:
        authorization = request.headers.get("authorization")
        # The canonical query is computed from the query exactly as sent (repeated parameters
        # included), minus the signature itself for a presigned URL.
        pairs = [p for p in request.raw_query.split("&") if p] or [
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in request.query.items()
        ]
        if authorization:
            sig = _from_header(authorization, request)
            query = "&".join(pairs)
        elif "X-Amz-Signature" in request.query or "X-Amz-Credential" in request.query:
            sig = _from_query(request.query)
            query = "&".join(p for p in pairs if not p.startswith("X-Amz-Signature="))
        else:
            raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
        secret = self.secrets.get(sig.key_id)
        if secret is None:
            raise SqsError(
                "InvalidClientTokenId", "The security token included in the request is invalid."
            )
        self._check_scope_and_time(sig)
        expected = self._expected(sig, secret, request, query)
        if not hmac.compare_digest(expected.encode(), sig.signature.encode()):
            raise SqsError("SignatureDoesNotMatch", _MISMATCH)
        return self.owners.get(sig.key_id, sig.key_id)

    def check(self) -> SignatureCheck:
        """`identify` as the Router's `Access` calls it: a refusal is Unauthenticated, whose
        `aws_code` keeps AWS's code for the SQS door to answer with."""

        def identify(request: Request) -> str:
            try:
                return self.identify(request)
            except SqsError as error:
                raise Unauthenticated(error.message, aws_code=error.kind.code) from None

        return identify

    def _check_scope_and_time(self, sig: _Signature) -> None:
        if sig.service != SERVICE:
            raise SqsError(
                "SignatureDoesNotMatch",
                f"Credential should be scoped to correct service: '{SERVICE}'.",
            )
        try:
            signed_at = datetime.strptime(sig.amz_date, _AMZ_DATE).replace(tzinfo=UTC)
        except ValueError:
            raise SqsError(
                "IncompleteSignature", f"Invalid X-Amz-Date {sig.amz_date!r}: not YYYYMMDDTHHMMSSZ"
            ) from None
        if sig.date != sig.amz_date[:8]:
            raise SqsError(
                "SignatureDoesNotMatch",
                f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of "
                f"date from HTTP: '{sig.date}' != '{sig.amz_date[:8]}', from '{sig.amz_date}'.",
            )
        now = self.clock()
        at = signed_at.timestamp()
        if sig.expires_s is not None:
            if now > at + sig.expires_s:
                raise SqsError("RequestExpired", "Request has expired.")
            if at - now > self.max_skew_s:
                raise SqsError("SignatureDoesNotMatch", _not_yet(sig.amz_date, now, self))
            return
        if now - at > self.max_skew_s:
            earliest = _stamp(now - self.max_skew_s)
            raise SqsError(
                "SignatureDoesNotMatch",
                f"Signature expired: {sig.amz_date} is now earlier than {earliest} "
                f"({_stamp(now)} - {round(self.max_skew_s / 60)} min.)",
            )
        if at - now > self.max_skew_s:
            raise SqsError("SignatureDoesNotMatch", _not_yet(sig.amz_date, now, self))

    def _expected(self, sig: _Signature, secret: str, request: Request, query: str) -> str:
        body_hash = hashlib.sha256(request.body).hexdigest()
        claimed = request.headers.get("x-amz-content-sha256")
        if claimed is not None and claimed != body_hash:
            raise SqsError(
                "SignatureDoesNotMatch",
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
            )
        values: dict[str, list[str]] = {}
        for name, value in request.raw_headers:
            values.setdefault(name.lower(), []).append(value)
        signed = [(name, ",".join(values.get(name, []))) for name in sig.signed_headers]
        host = request.headers.get("host") or ""
        received = _Received(
            method=request.method,
            url=f"http://{host}{request.path}" + (f"?{query}" if query else ""),
            params={},
            # Only for botocore's X-Amz-Content-SHA256 lookup, which the check above makes moot.
            headers=HTTPHeaders(),
            body=request.body,
            signed=signed,
            context={"timestamp": sig.amz_date},
        )
        verifier = _Verifier(Credentials(sig.key_id, secret), sig.service, sig.region)
        canonical = verifier.canonical_request(received)
        string_to_sign = verifier.string_to_sign(received, canonical)
        return str(verifier.signature(string_to_sign, received))


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime(_AMZ_DATE)


def _not_yet(amz_date: str, now: float, auth: SigV4Authenticator) -> str:
    latest = _stamp(now + auth.max_skew_s)
    minutes = round(auth.max_skew_s / 60)
    return (
        f"Signature not yet current: {amz_date} is still later than {latest} "
        f"({_stamp(now)} + {minutes} min.)"
    )


def _incomplete(message: str) -> SqsError:
    return SqsError("IncompleteSignature", message)


def _from_header(authorization: str, request: Request) -> _Signature:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _incomplete(
            f"Unsupported authorization type {algorithm[:40]!r}: only {ALGORITHM} is accepted."
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name] = value
    missing = [n for n in ("Credential", "SignedHeaders", "Signature") if not fields.get(n)]
    if missing:
        raise _incomplete(
            " ".join(f"Authorization header requires '{n}' parameter." for n in missing)
            + f" Authorization={authorization[:200]}"
        )
    amz_date = request.headers.get("x-amz-date")
    if not amz_date:
        raise _incomplete(
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
        )
    return _signature(fields["Credential"], fields["SignedHeaders"], fields["Signature"], amz_date)


def _from_query(query: Mapping[str, str]) -> _Signature:
    names = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-SignedHeaders")
    missing = [n for n in (*names, "X-Amz-Signature") if not query.get(n)]
    if missing:
        raise _incomplete(
            " ".join(f"AWS query-string parameters must include '{n}'." for n in missing)
        )
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise _incomplete(f"X-Amz-Algorithm must be {ALGORITHM}.")
    expires_text = query.get("X-Amz-Expires", str(MAX_PRESIGN_EXPIRES_S))
    if not (expires_text.isascii() and expires_text.isdigit()):
        raise _incomplete("X-Amz-Expires must be a whole number of seconds.")
    expires = int(expires_text)
    if expires > MAX_PRESIGN_EXPIRES_S:
        raise _incomplete(
            f"X-Amz-Expires must be less than a week (in seconds) that is {MAX_PRESIGN_EXPIRES_S}"
        )
    sig = _signature(
        query["X-Amz-Credential"],
        query["X-Amz-SignedHeaders"],
        query["X-Amz-Signature"],
        query["X-Amz-Date"],
    )
    return _Signature(
        sig.key_id,
        sig.date,
        sig.region,
        sig.service,
        sig.signed_headers,
        sig.signature,
        sig.amz_date,
        expires,
    )


def _signature(credential: str, signed_headers: str, signature: str, amz_date: str) -> _Signature:
    scope = credential.split("/")
    if len(scope) != 5 or not all(scope) or scope[4] != "aws4_request":
        raise _incomplete(
            f"Credential must have exactly 5 slash-delimited elements, e.g. keyid/date/region/"
            f"service/term, got '{quote(credential[:200], safe='/')}'"
        )
    names = [n.strip().lower() for n in signed_headers.split(";") if n.strip()]
    if "host" not in names:
        raise _incomplete("'Host' must be a 'SignedHeader' in the AWS Authorization.")
    key_id, date, region, service, _term = scope
    return _Signature(key_id, date, region, service, names, signature.strip(), amz_date)
