"""SigV4 on the SQS API: `dirmq serve --sqs-credentials FILE` against boto3, and the verifier
itself on hand-made requests (skewed clocks, presigned URLs, malformed headers)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import boto3
import pytest
from botocore import UNSIGNED
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from dirmq.errors import ConfigError
from dirmq.server.contract import Request
from dirmq.sqs.auth import SigV4Authenticator, load_credentials
from dirmq.sqs.errors import SqsError

from .support.servers import ServerProcess, start_server

KEY, SECRET = "AKIDDIRMQTEST0001", "s3cr3t/Key+with=odd_chars"
KEY2, SECRET2 = "reader", "another-secret"


def _write_credentials(path: Path) -> None:
    path.write_text(f"# test credentials\n{KEY} {SECRET}\n\n   {KEY2}   {SECRET2}\n")


@pytest.fixture(scope="module")
def signed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("sqs-auth")
    creds = base / "credentials"
    _write_credentials(creds)
    server = start_server(base / "root", "--sqs-credentials", str(creds))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("sqs-open") / "root")
    yield server
    server.stop()


def _client(url: str, key: str | None, secret: str | None, **config: Any) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name=config.pop("region", "us-east-1"),
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, **config),
    )


def _error(call: Callable[[], object]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


# -- against a server -----------------------------------------------------------------------------


def test_right_keys_work(signed_server: ServerProcess) -> None:
    sqs = _client(signed_server.url, KEY, SECRET)
    url = sqs.create_queue(QueueName="auth-ok")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    got = sqs.receive_message(QueueUrl=url)["Messages"]
    assert [m["Body"] for m in got] == ["hello"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    # The second key, from another region (any region is accepted).
    other = _client(signed_server.url, KEY2, SECRET2, region="eu-west-3")
    assert other.get_queue_url(QueueName="auth-ok")["QueueUrl"].endswith("/auth-ok")


def test_wrong_secret(signed_server: ServerProcess) -> None:
    sqs = _client(signed_server.url, KEY, SECRET + "x")
    code, status, message = _error(sqs.list_queues)
    assert (code, status) == ("SignatureDoesNotMatch", 403)
    assert "does not match" in message


def test_unknown_key(signed_server: ServerProcess) -> None:
    sqs = _client(signed_server.url, "AKIDNOBODY", SECRET)
    assert _error(sqs.list_queues)[:2] == ("InvalidClientTokenId", 403)


def test_unsigned(signed_server: ServerProcess) -> None:
    sqs = _client(signed_server.url, None, None, signature_version=UNSIGNED)
    assert _error(sqs.list_queues)[:2] == ("MissingAuthenticationToken", 403)


def test_tampered_body(signed_server: ServerProcess) -> None:
    sqs = _client(signed_server.url, KEY, SECRET)
    url = sqs.create_queue(QueueName="auth-tamper")["QueueUrl"]

    def tamper(request: Any, **_: Any) -> None:
        body = request.body if isinstance(request.body, bytes) else request.body.encode()
        request.body = body.replace(b"pay me 10", b"pay me 99")  # same length

    sqs.meta.events.register("before-send.sqs.SendMessage", tamper)
    code, status, _ = _error(lambda: sqs.send_message(QueueUrl=url, MessageBody="pay me 10"))
    assert (code, status) == ("SignatureDoesNotMatch", 403)
    clean = _client(signed_server.url, KEY, SECRET)
    assert "Messages" not in clean.receive_message(QueueUrl=url)


def test_tampered_target(signed_server: ServerProcess) -> None:
    """Signed headers count: another action under the same signature is refused."""
    sqs = _client(signed_server.url, KEY, SECRET)

    def retarget(request: Any, **_: Any) -> None:
        request.headers["X-Amz-Target"] = "AmazonSQS.DeleteQueue"

    sqs.meta.events.register("before-send.sqs.ListQueues", retarget)
    assert _error(sqs.list_queues)[0] == "SignatureDoesNotMatch"


def test_native_api_is_not_affected(signed_server: ServerProcess) -> None:
    with urllib.request.urlopen(f"{signed_server.url}/health", timeout=10) as response:
        assert response.status == 200


def test_without_credentials_anything_goes(open_server: ServerProcess) -> None:
    unsigned = _client(open_server.url, None, None, signature_version=UNSIGNED)
    url = unsigned.create_queue(QueueName="open")["QueueUrl"]
    anyone = _client(open_server.url, "whoever", "whatever")
    anyone.send_message(QueueUrl=url, MessageBody="hi")
    assert anyone.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "hi"


def test_bad_credentials_file_fails_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "creds"
    bad.write_text("only-a-key-id\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dirmq",
            "serve",
            "--root",
            str(tmp_path / "root"),
            "--listen",
            "127.0.0.1:0",
            "--sqs-credentials",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode != 0
    assert "ACCESS_KEY_ID SECRET_ACCESS_KEY" in done.stderr
    assert "listening" not in done.stdout


# -- the verifier on hand-made requests --------------------------------------------------------


def test_load_credentials(tmp_path: Path) -> None:
    path = tmp_path / "c"
    _write_credentials(path)
    assert load_credentials(path) == {KEY: SECRET, KEY2: SECRET2}
    for text in ("", "# nothing\n", "a b c\n", "a b\na c\n"):
        path.write_text(text)
        with pytest.raises(ConfigError):
            load_credentials(path)
    with pytest.raises(ConfigError):
        load_credentials(tmp_path / "missing")


HOST = "127.0.0.1:9324"
BODY = b'{"QueueNamePrefix":"a"}'


def _aws_request(
    *,
    method: str = "POST",
    path: str = "/",
    body: bytes = BODY,
    headers: dict[str, str] | None = None,
) -> AWSRequest:
    all_headers = {
        "Host": HOST,
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.ListQueues",
        **(headers or {}),
    }
    return AWSRequest(method=method, url=f"http://{HOST}{path}", data=body, headers=all_headers)


def _to_dirmq(prepared: AWSRequest) -> Request:
    parts = urlsplit(prepared.url)
    raw = [(k, v) for k, v in prepared.headers.items()]
    body = prepared.body or b""
    if isinstance(body, str):
        body = body.encode()
    query: dict[str, str] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(k, v)
    return Request(
        method=prepared.method,
        path=parts.path or "/",
        query=query,
        headers={k.lower(): v for k, v in raw},
        body=body,
        keep_alive=True,
        raw_headers=raw,
    )


def _signed(key: str = KEY, secret: str = SECRET, region: str = "us-east-1", **kw: Any) -> Request:
    request = _aws_request(**kw)
    SigV4Auth(Credentials(key, secret), "sqs", region).add_auth(request)
    return _to_dirmq(request)


def _code(auth: SigV4Authenticator, request: Request) -> str | None:
    try:
        auth(request)
    except SqsError as error:
        return error.kind.code
    return None


@pytest.fixture
def auth() -> SigV4Authenticator:
    return SigV4Authenticator({KEY: SECRET, KEY2: SECRET2})


def test_verifier_accepts_signed_requests(auth: SigV4Authenticator) -> None:
    assert _code(auth, _signed()) is None
    assert _code(auth, _signed(KEY2, SECRET2, region="ap-south-1")) is None
    # A query-protocol GET with parameters, and a path with characters to encode.
    assert (
        _code(
            auth,
            _signed(method="GET", path="/000000000000/q-1?Action=ListQueues&b=x%20y", body=b""),
        )
        is None
    )


def test_verifier_clock_skew(auth: SigV4Authenticator) -> None:
    request = _signed()
    now = time.time()
    late = SigV4Authenticator(auth.secrets, clock=lambda: now + 16 * 60)
    with pytest.raises(SqsError) as info:
        late(request)
    assert info.value.kind.code == "SignatureDoesNotMatch"
    assert info.value.message.startswith("Signature expired:")
    early = SigV4Authenticator(auth.secrets, clock=lambda: now - 16 * 60)
    with pytest.raises(SqsError) as info:
        early(request)
    assert info.value.message.startswith("Signature not yet current:")
    assert _code(SigV4Authenticator(auth.secrets, clock=lambda: now + 14 * 60), request) is None


def test_verifier_refusals(auth: SigV4Authenticator) -> None:
    good = _signed()
    assert _code(auth, _to_dirmq(_aws_request())) == "MissingAuthenticationToken"

    def with_header(name: str, value: str | None) -> Request:
        raw = [(k, v) for k, v in good.raw_headers if k.lower() != name]
        if value is not None:
            raw.append((name, value))
        return Request(
            good.method,
            good.path,
            good.query,
            {k.lower(): v for k, v in raw},
            good.body,
            True,
            raw,
        )

    authorization = good.headers["authorization"]
    assert _code(auth, with_header("authorization", "AWS AKID:sig")) == "IncompleteSignature"
    assert (
        _code(auth, with_header("authorization", authorization.split(", Signature=")[0]))
        == "IncompleteSignature"
    )
    assert _code(auth, with_header("x-amz-date", None)) == "IncompleteSignature"
    scoped_elsewhere = authorization.replace("/sqs/", "/sns/")
    assert _code(auth, with_header("authorization", scoped_elsewhere)) == "SignatureDoesNotMatch"
    no_host = authorization.replace(";host;", ";")
    assert _code(auth, with_header("authorization", no_host)) == "IncompleteSignature"
    # A claimed payload hash that is not the body's.
    assert _code(auth, with_header("x-amz-content-sha256", "0" * 64)) == "SignatureDoesNotMatch"
    # Changed signed header, changed path, changed query.
    assert _code(auth, with_header("x-amz-target", "AmazonSQS.DeleteQueue")) == (
        "SignatureDoesNotMatch"
    )
    moved = Request("POST", "/other", good.query, good.headers, good.body, True, good.raw_headers)
    assert _code(auth, moved) == "SignatureDoesNotMatch"
    queried = Request("POST", "/", {"a": "1"}, good.headers, good.body, True, good.raw_headers)
    assert _code(auth, queried) == "SignatureDoesNotMatch"


def _presigned(expires: int = 60, key: str = KEY, secret: str = SECRET) -> Request:
    request = AWSRequest(
        method="GET",
        url=f"http://{HOST}/?Action=ListQueues&Version=2012-11-05",
        headers={"Host": HOST},
    )
    SigV4QueryAuth(Credentials(key, secret), "sqs", "us-east-1", expires=expires).add_auth(request)
    return _to_dirmq(request)


def test_verifier_presigned(auth: SigV4Authenticator) -> None:
    request = _presigned()
    assert "X-Amz-Signature" in request.query
    assert _code(auth, request) is None
    assert _code(auth, _presigned(secret="nope")) == "SignatureDoesNotMatch"
    assert _code(auth, _presigned(key="nobody")) == "InvalidClientTokenId"
    later = SigV4Authenticator(auth.secrets, clock=lambda: time.time() + 120)
    assert _code(later, request) == "RequestExpired"
    tampered = dict(request.query, Action="DeleteQueue")
    forged = Request("GET", "/", tampered, request.headers, b"", True, request.raw_headers)
    assert _code(auth, forged) == "SignatureDoesNotMatch"
    partial = {k: v for k, v in request.query.items() if k != "X-Amz-Credential"}
    stripped = Request("GET", "/", partial, request.headers, b"", True, request.raw_headers)
    assert _code(auth, stripped) == "IncompleteSignature"
