"""Identities and permissions on every door of a real `dirmq serve --credentials FILE`: native,
yaq, pub/sub (publish, SSE subscribe, settle, retained pages), SQS (boto3's JSON protocol and
the query protocol), /metrics, /health; the legacy `--sqs-credentials`; protected mode; the
credentials file's errors; `dirmq token`.

Principals of the shared server (`guarded`):

    ops       token, AWS key     read, write, admin on everything; metrics
    reader    token, AWS key     read on orders/* and orders-* (the SQS names)
    watcher   token              read on @channel/orders* (pub/sub), write on @channel/orders*
    prom      token              metrics only
    keeper    token              write and admin on orders/*
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore import UNSIGNED
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as AwsCredentials
from botocore.exceptions import ClientError

from dirmq.cli import exits
from dirmq.client import AsyncRemoteStore, RemoteStore
from dirmq.client.pubsub import RemotePubSub
from dirmq.errors import AccessDenied, ConfigError, Unauthenticated
from dirmq.server.access import Access
from dirmq.server.addresses import is_loopback_peer
from dirmq.server.credentials import (
    Credentials,
    Principal,
    load_credentials,
    new_token,
    token_digest,
)
from dirmq.sqs.access import JUDGED
from dirmq.sqs.actions import load

from .support.servers import REPO, ServerProcess, start_server

OPS, READER, WATCHER, PROM, KEEPER = (new_token() for _ in range(5))
OPS_KEY, OPS_SECRET = "AKIDOPS", "ops-secret/with+odd=chars"
READER_KEY, READER_SECRET = "AKIDREADER", "reader-secret"
WRONG = new_token()

CREDENTIALS = f"""
[principals.ops]
token_sha256 = "{token_digest(OPS)}"
aws_keys = [{{ id = "{OPS_KEY}", secret = "{OPS_SECRET}" }}]
read = ["*"]
write = ["*"]
admin = ["*"]
metrics = true

[principals.reader]
token_sha256 = ["{token_digest(READER)}"]
aws_keys = [{{ id = "{READER_KEY}", secret = "{READER_SECRET}" }}]
read = ["orders/*", "orders-*"]

[principals.watcher]
token_sha256 = "{token_digest(WATCHER)}"
read = ["@channel/orders*"]
write = ["@channel/orders*"]

[principals.prom]
token_sha256 = "{token_digest(PROM)}"
metrics = true

[principals.keeper]
token_sha256 = "{token_digest(KEEPER)}"
write = ["orders/*"]
admin = ["orders/*"]
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("access")
    path = base / "credentials.toml"
    path.write_text(CREDENTIALS)
    path.chmod(0o600)
    server = start_server(base / "root", "--credentials", str(path), yaq=True)
    ops = httpx.Client(base_url=server.url, headers=bearer(OPS), timeout=10)
    for queue in ("orders/a", "billing/x", "orders-q", "billing-q"):
        assert ops.put(f"/{queue}").status_code == 201
    assert ops.put("/billing/small", json={"max_message_bytes": 10}).status_code == 201
    assert ops.post("/billing/x/messages", content=b"secret bill").status_code == 201
    ops.close()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(guarded: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=guarded.url, timeout=10) as client:
        yield client


def _same_refusal(first: httpx.Response, second: httpx.Response, names: tuple[str, str]) -> None:
    """Two refusals that differ in nothing but the name asked for."""
    assert first.status_code == second.status_code
    assert first.headers.get("content-type") == second.headers.get("content-type")
    assert first.text.replace(names[0], "NAME") == second.text.replace(names[1], "NAME")


# -- native ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("POST", "/orders/a/messages"),
        ("GET", "/orders/a/messages"),
        ("DELETE", "/orders/a"),
        ("GET", "/openapi.json"),
    ],
)
def test_native_without_or_with_wrong_credentials_is_401(
    http: httpx.Client, method: str, path: str
) -> None:
    for headers in ({}, bearer(WRONG), {"Authorization": "Basic " + _b64(f"x:{WRONG}")}):
        response = http.request(method, path, headers=headers, content=b"m")
        assert response.status_code == 401, (headers, response.text)
        assert response.json()["error"] == "Unauthenticated"
        challenges = response.headers.get_list("www-authenticate")
        assert challenges == ['Bearer realm="dirmq"', 'Basic realm="dirmq", charset="UTF-8"']
    assert http.get("/orders/a", headers=bearer(OPS)).json()["stats"]["ready"] == 0  # untouched


def test_native_permissions_by_pattern(http: httpx.Client) -> None:
    reader = bearer(READER)
    refused = http.post("/orders/a/messages", headers=reader, content=b"no")
    assert refused.status_code == 403
    assert refused.json() == {
        "error": "AccessDenied",
        "message": "principal 'reader' has no write permission on queue 'orders/a'",
    }
    assert http.get("/billing/x/messages", headers=reader).status_code == 403
    assert http.get("/billing/x", headers=reader).status_code == 403
    assert http.delete("/orders/a", headers=reader).status_code == 403  # admin
    assert http.delete("/orders/a/messages", headers=reader).status_code == 403  # purge: admin
    assert http.get("/orders/a/messages", headers=reader).status_code == 204  # read: empty
    # The publish path's fast lane, with a token; then the reader receives and acks it.
    published = http.post("/orders/a/messages", headers=bearer(OPS), content=b"for reader")
    assert published.status_code == 201
    got = http.get("/orders/a/messages", headers=reader)
    assert (got.status_code, got.content) == (200, b"for reader")
    receipt = got.headers["x-receipt"]
    assert http.delete(f"/orders/a/messages/{receipt}", headers=reader).status_code == 204
    # Listing shows only what the principal may see.
    listed = http.get("/", headers=reader).json()["queues"]
    assert "orders/a" in listed and "orders-q" in listed
    assert all(name.startswith("orders") for name in listed)
    assert "billing/x" in http.get("/", headers=bearer(OPS)).json()["queues"]
    assert http.get("/billing/x", headers=bearer(OPS)).json()["stats"]["ready"] == 1


def test_basic_auth_with_the_token_as_password(guarded: ServerProcess) -> None:
    """curl -u (any user name), as a browser would send it after the 401's challenge."""
    done = subprocess.run(
        ["curl", "-s", "-u", f"anyone:{READER}", f"{guarded.url}/"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    listed = json.loads(done.stdout)["queues"]
    assert "orders/a" in listed and "billing/x" not in listed


def test_refusals_do_not_tell_whether_a_queue_exists(http: httpx.Client) -> None:
    pairs = [("billing/x", "billing/missing"), ("orders-q", "nope/missing")]
    for headers in ({}, bearer(WRONG), bearer(READER), bearer(WATCHER)):
        for existing, missing in pairs:
            for method, suffix in (("GET", ""), ("GET", "/messages"), ("DELETE", "")):
                if headers.get("Authorization") == f"Bearer {READER}" and "orders" in existing:
                    continue  # the reader may see orders-q (a 404 for the missing one is fine)
                first = http.request(method, f"/{existing}{suffix}", headers=headers)
                second = http.request(method, f"/{missing}{suffix}", headers=headers)
                assert first.status_code in (401, 403)
                _same_refusal(first, second, (existing, missing))


def test_the_body_size_check_tells_nothing_before_permission(http: httpx.Client) -> None:
    """billing/small takes 10 bytes at most: its 413 comes from Content-Length before the body
    is read, but only to a principal that may publish there."""
    big = b"x" * 100
    assert http.post("/billing/small/messages", content=big).status_code == 401
    assert http.post(
        "/billing/small/messages", headers=bearer(READER), content=big
    ).status_code == (403)
    assert http.post("/billing/small/messages", headers=bearer(OPS), content=big).status_code == 413


def test_settling_many_receipts_takes_read(http: httpx.Client) -> None:
    """`POST /{queue}/messages/ack|nack|extend` needs read, as a single ack does; a refusal
    comes before the body is looked at, and tells nothing of the queue."""
    ops, reader = bearer(OPS), bearer(READER)
    assert http.put("/orders/batch", headers=ops).status_code == 201
    assert http.post("/orders/batch/messages", headers=ops, content=b"b1").status_code == 201
    receipt = http.get("/orders/batch/messages", headers=reader).headers["x-receipt"]
    body = {"receipts": [receipt], "visibility": "1m"}
    for headers in ({}, bearer(WRONG)):
        assert http.post(
            "/orders/batch/messages/extend", headers=headers, json=body
        ).status_code == (401)
    for refused in (bearer(KEEPER), bearer(WATCHER)):  # write and admin, but no read
        answer = http.post("/orders/batch/messages/ack", headers=refused, json=body)
        assert answer.status_code == 403 and answer.json()["error"] == "AccessDenied"
        single = http.delete(f"/orders/batch/messages/{receipt}", headers=refused)
        assert single.status_code == 403, "nor a single ack (its fast path leaves refusals)"
    first = http.post("/billing/x/messages/ack", headers=reader, content=b"not even JSON")
    second = http.post("/billing/missing/messages/ack", headers=reader, content=b"not even JSON")
    assert first.status_code == 403
    _same_refusal(first, second, ("billing/x", "billing/missing"))
    assert http.get("/orders/batch", headers=ops).json()["stats"]["in_flight"] == 1, "untouched"
    extended = http.post("/orders/batch/messages/extend", headers=reader, json=body)
    assert extended.json() == {"settled": 1, "failed": []}
    acked = http.post("/orders/batch/messages/ack", headers=reader, json={"receipts": [receipt]})
    assert acked.json() == {"settled": 1, "failed": []}
    assert http.get("/orders/batch", headers=ops).json()["stats"]["total"] == 0


def test_a_dead_letter_queue_is_written_to(http: httpx.Client) -> None:
    """Naming a dead-letter queue sends messages there: it takes write on it too."""
    keeper = bearer(KEEPER)
    elsewhere = {"dead_letter_queue": "billing/x", "max_receives": 1}
    refused = http.put("/orders/dlq", headers=keeper, json=elsewhere)
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        "principal 'keeper' has no write permission on queue 'billing/x'"
    )
    assert http.put("/orders/dead", headers=keeper).status_code == 201
    own = {"dead_letter_queue": "orders/dead", "max_receives": 1}
    assert http.put("/orders/dlq", headers=keeper, json=own).status_code == 201


def test_python_client_sends_its_token(guarded: ServerProcess, monkeypatch: Any) -> None:
    with RemoteStore(guarded.url, token=READER) as store:
        listed = store.list_queues()
        assert "orders/a" in listed and all(n.startswith("orders") for n in listed)
        queue = store.queue("orders/a")
        with pytest.raises(AccessDenied, match="no write permission on queue 'orders/a'"):
            queue.put(b"x")
        with pytest.raises(AccessDenied):
            store.queue("billing/x")
    monkeypatch.setenv("DIRMQ_TOKEN", OPS)
    with RemoteStore(guarded.url) as store:
        assert store.queue("billing/x").stats().ready == 1
    with RemoteStore(guarded.url, token="") as store, pytest.raises(Unauthenticated):
        store.list_queues()

    async def asynchronously() -> list[str]:
        async with AsyncRemoteStore(guarded.url, token=READER) as store:
            with pytest.raises(AccessDenied):
                await store.queue("billing/x")
            return await store.list_queues()

    assert "billing/x" not in asyncio.run(asynchronously())


# -- yaq -------------------------------------------------------------------------------------------
def test_yaq(guarded: ServerProcess) -> None:
    assert guarded.yaq_url is not None
    with httpx.Client(base_url=guarded.yaq_url, timeout=10) as yaq:
        for headers in ({}, bearer(WRONG)):
            refused = yaq.post("/orders/a", headers=headers, content=b"m")
            assert refused.status_code == 401
            assert refused.headers.get_list("www-authenticate")[0] == 'Bearer realm="dirmq"'
            assert yaq.get("/orders/a", headers=headers, params={"timeout": "0"}).status_code == 401
        reader = bearer(READER)
        assert yaq.post("/orders/a", headers=reader, content=b"m").status_code == 403
        assert yaq.get("/billing/x", headers=reader, params={"timeout": "0"}).status_code == 403
        missing = yaq.get("/billing/none", headers=reader, params={"timeout": "0"})
        assert missing.status_code == 403
        assert missing.text.replace("billing/none", "N") == yaq.get(
            "/billing/x", headers=reader, params={"timeout": "0"}
        ).text.replace("billing/x", "N")
        assert yaq.post("/orders/yaq", headers=bearer(OPS), content=b"via yaq").status_code == 200
        got = yaq.get("/orders/yaq", headers=reader, params={"timeout": "0"})
        assert (got.status_code, got.content) == (200, b"via yaq")
        assert yaq.get("/health").status_code == 200  # open by default


# -- pub/sub -----------------------------------------------------------------------------------
def test_pubsub_publish(http: httpx.Client) -> None:
    path, params = "/@pubsub/publish", {"channel": "orders.eu", "mode": "future"}
    assert http.post(path, params=params, content=b"e").status_code == 401
    assert http.post(path, params=params, headers=bearer(WRONG), content=b"e").status_code == 401
    assert http.post(path, params=params, headers=bearer(READER), content=b"e").status_code == 403
    other = {"channel": "billing", "mode": "future"}
    assert http.post(path, params=other, headers=bearer(WATCHER), content=b"e").status_code == 403
    assert http.post(path, params=params, headers=bearer(WATCHER), content=b"e").status_code == 201
    # reply_to is a queue the server writes reports into: write on it too.
    reply = {**params, "reply_to": "billing/replies", "acks": "done"}
    refused = http.post(path, params=reply, headers=bearer(WATCHER), content=b"e")
    assert refused.status_code == 403
    assert "reply_to queue 'billing/replies'" in refused.json()["message"]


def test_pubsub_subscribe_settle_and_retained(guarded: ServerProcess, http: httpx.Client) -> None:
    # SSE subscribe: none, wrong, lacking (no channel filter: every channel; another channel).
    for headers, params, status in (
        ({}, {"channel": "orders"}, 401),
        (bearer(WRONG), {"channel": "orders"}, 401),
        (bearer(READER), {"channel": "orders"}, 403),
        (bearer(WATCHER), {}, 403),
        (bearer(WATCHER), {"channel": "billing"}, 403),
        (bearer(WATCHER), {"channel": "orders", "name": "orders-1"}, 403),  # needs the name
    ):
        with http.stream("GET", "/@pubsub/subscribe", params=params, headers=headers) as answer:
            assert answer.status_code == status, (headers, params)
    with RemotePubSub(guarded.url, token=WATCHER, timeout_s=10) as watcher:
        watcher.publish("orders.sse", b"hello", mode="anyone")
        with watcher.subscribe(channels=["orders.sse"]) as sub:
            delivery = sub.receive(wait_s=10)
            assert delivery is not None and delivery.body == b"hello"
            # Another principal may not settle it; the refusal is the same for a subscription
            # that is not attached anywhere.
            settle = f"/@pubsub/subscriptions/{sub.name}/deliveries/{delivery.key}/done"
            unknown = f"/@pubsub/subscriptions/nobody-here/deliveries/{delivery.key}/done"
            for headers in (bearer(READER), bearer(WATCHER + "x")):
                first, second = (
                    http.post(settle, headers=headers),
                    http.post(unknown, headers=headers),
                )
                assert first.status_code in (401, 403)
                _same_refusal(first, second, (sub.name, "nobody-here"))
            sub.done(delivery)  # its own principal may
            # The list shows what the principal may see: not @subscription/anon-..., to it.
            assert watcher.subscriptions() == []
            with RemotePubSub(guarded.url, token=OPS) as ops:
                assert sub.name in [s["name"] for s in ops.subscriptions()]
    # Deleting a subscription is admin on it; listing needs a principal.
    for headers, status in ((bearer(READER), 403), (bearer(WATCHER), 403), (bearer(OPS), 404)):
        assert http.delete("/@pubsub/subscriptions/billing-9", headers=headers).status_code == (
            status
        )
    assert http.get("/@pubsub/subscriptions").status_code == 401
    # Retained pages: a channel the principal may read, or every channel.
    page = "/@pubsub/retained"
    assert http.get(page, params={"channel": "orders"}).status_code == 401
    assert http.get(page, params={"channel": "orders"}, headers=bearer(READER)).status_code == 403
    assert http.get(page, headers=bearer(WATCHER)).status_code == 403
    assert http.get(page, params={"channel": "billing"}, headers=bearer(WATCHER)).status_code == 403
    read = http.get(page, params={"channel": "orders"}, headers=bearer(WATCHER))
    assert read.status_code == 200
    assert http.get(f"{page}/head", headers=bearer(WATCHER)).status_code == 200
    assert http.get(f"{page}/head").status_code == 401


# -- SQS ---------------------------------------------------------------------------------------
def _sqs(url: str, key: str | None, secret: str | None, **config: Any) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, **config),
    )


def _code(call: Callable[[], object]) -> tuple[str, int]:
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_sqs_json_protocol(guarded: ServerProcess) -> None:
    ops = _sqs(guarded.url, OPS_KEY, OPS_SECRET)
    url = ops.get_queue_url(QueueName="orders-q")["QueueUrl"]
    ops.send_message(QueueUrl=url, MessageBody="for the reader")
    reader = _sqs(guarded.url, READER_KEY, READER_SECRET)
    got = reader.receive_message(QueueUrl=url)["Messages"]
    assert [m["Body"] for m in got] == ["for the reader"]
    reader.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    assert _code(lambda: reader.send_message(QueueUrl=url, MessageBody="x")) == (
        "AccessDenied",
        403,
    )
    billing = url.replace("orders-q", "billing-q")
    missing = url.replace("orders-q", "billing-none")
    for target in (billing, missing):  # the same for a queue that exists and one that does not
        assert _code(lambda t=target: reader.receive_message(QueueUrl=t)) == ("AccessDenied", 403)
        assert _code(lambda t=target: reader.delete_queue(QueueUrl=t)) == ("AccessDenied", 403)
    assert _code(lambda: reader.create_queue(QueueName="orders-new")) == ("AccessDenied", 403)
    assert reader.list_queues()["QueueUrls"] == [url]
    assert _code(lambda: _sqs(guarded.url, OPS_KEY, "wrong").list_queues()) == (
        "SignatureDoesNotMatch",
        403,
    )
    assert _code(lambda: _sqs(guarded.url, "AKIDNOBODY", "x").list_queues()) == (
        "InvalidClientTokenId",
        403,
    )
    unsigned = _sqs(guarded.url, None, None, signature_version=UNSIGNED)
    assert _code(unsigned.list_queues) == ("MissingAuthenticationToken", 403)


def _query(url: str, key: str, secret: str, form: dict[str, str]) -> httpx.Response:
    """A query-protocol request (form body, XML answer), signed as SDKs sign it."""
    host = url.split("://", 1)[1]
    body = httpx.QueryParams({**form, "Version": "2012-11-05"}).__str__().encode()
    request = AWSRequest(
        method="POST",
        url=f"{url}/",
        data=body,
        headers={"Host": host, "Content-Type": "application/x-www-form-urlencoded"},
    )
    SigV4Auth(AwsCredentials(key, secret), "sqs", "us-east-1").add_auth(request)
    return httpx.post(f"{url}/", content=body, headers=dict(request.headers.items()), timeout=10)


def test_sqs_query_protocol(guarded: ServerProcess) -> None:
    queue_url = f"{guarded.url}/000000000000/billing-q"
    refused = _query(
        guarded.url,
        READER_KEY,
        READER_SECRET,
        {"Action": "SendMessage", "QueueUrl": queue_url, "MessageBody": "x"},
    )
    assert refused.status_code == 403
    assert "<Code>AccessDenied</Code>" in refused.text
    assert "<Type>Sender</Type>" in refused.text
    wrong = _query(guarded.url, READER_KEY, "nope", {"Action": "ListQueues"})
    assert (wrong.status_code, "<Code>SignatureDoesNotMatch</Code>" in wrong.text) == (403, True)
    listed = _query(guarded.url, READER_KEY, READER_SECRET, {"Action": "ListQueues"})
    assert listed.status_code == 200
    assert "orders-q" in listed.text and "billing-q" not in listed.text


def test_every_sqs_action_has_a_permission_rule() -> None:
    assert sorted(load()) == sorted(JUDGED)


# -- metrics and health ------------------------------------------------------------------------
def test_metrics_and_health_by_default(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200  # load balancers need no credentials
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=bearer(WRONG)).status_code == 401
    assert http.get("/metrics", headers=bearer(READER)).status_code == 403
    scraped = http.get("/metrics", headers=bearer(PROM))
    assert scraped.status_code == 200 and "dirmq_" in scraped.text
    assert http.get("/@pubsub", headers=bearer(READER)).status_code == 403
    assert http.get("/@pubsub", headers=bearer(PROM)).status_code == 200


def test_metrics_and_health_as_configured(tmp_path: Path) -> None:
    path = tmp_path / "credentials.toml"
    path.write_text(
        f'health = "principals"\nmetrics = "anyone"\n'
        f'[principals.a]\ntoken_sha256 = "{token_digest(READER)}"\n'
    )
    server = start_server(tmp_path / "root", "--credentials", str(path))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/health").status_code == 401
            assert http.get("/health", headers=bearer(READER)).status_code == 200
            assert http.get("/metrics").status_code == 200
            assert http.get("/").status_code == 401
    finally:
        server.stop()


# -- the legacy --sqs-credentials ---------------------------------------------------------------
def test_sqs_credentials_guard_the_native_api_too(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# legacy\n{OPS_KEY} {OPS_SECRET}\n")
    keys.chmod(0o600)
    server = start_server(tmp_path / "root", "--sqs-credentials", str(keys))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/").status_code == 401
            assert http.post("/jobs/messages", content=b"x").status_code == 401
            assert http.get("/jobs/messages").status_code == 401
            assert http.delete("/jobs").status_code == 401
            # The key's secret is its token on the HTTP doors.
            owner = bearer(OPS_SECRET)
            assert http.put("/jobs", headers=owner).status_code == 201
            assert http.post("/jobs/messages", headers=owner, content=b"x").status_code == 201
            assert http.get("/jobs/messages", headers=owner).content == b"x"
            assert http.get("/metrics", headers=owner).status_code == 200
            assert http.get("/health").status_code == 200
        sqs = _sqs(server.url, OPS_KEY, OPS_SECRET)
        assert sqs.list_queues()["QueueUrls"][0].endswith("/jobs")
    finally:
        server.stop()


# -- protected mode, and options that exclude each other ----------------------------------------
def _serve(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dirmq", "serve", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=REPO,
    )


def test_protected_mode_refuses_a_non_loopback_address(tmp_path: Path) -> None:
    for address in ("0.0.0.0:0", ":0", "[::]:0"):
        done = _serve("--listen", address, root=tmp_path / "root")
        assert done.returncode == exits.CANNOT_LISTEN
        assert done.stderr == (
            f"dirmq: error: refusing to listen on {address} (native API) without credentials: "
            "anyone who can reach it could read, write and delete every queue; give "
            "--credentials FILE, or --allow-anonymous to accept that\n"
        )
        assert done.stdout == ""
    done = _serve("--listen", "127.0.0.1:0", "--yaq-listen", "0.0.0.0:0", root=tmp_path / "r")
    assert done.returncode == exits.CANNOT_LISTEN and "(yaq API)" in done.stderr
    assert not (tmp_path / "root").exists()


def test_allow_anonymous_listens_anywhere(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root", "--listen", "0.0.0.0:0", "--allow-anonymous")
    try:
        port = server.url.rsplit(":", 1)[1]
        assert server.url.startswith("http://0.0.0.0:")
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).json() == {"queues": []}
    finally:
        server.stop()


def test_loopback_peers() -> None:
    local = ("127.0.0.1", 1), ("127.9.9.9", 1), ("::1", 1, 0, 0), ("::ffff:127.0.0.1", 1, 0, 0)
    assert all(is_loopback_peer(peer) for peer in local)
    assert not any(is_loopback_peer(p) for p in (("10.0.0.1", 1), ("::ffff:10.0.0.1", 1, 0, 0)))


def test_options_that_exclude_each_other(tmp_path: Path) -> None:
    creds = tmp_path / "c.toml"
    creds.write_text(f'[principals.a]\ntoken_sha256 = "{token_digest(OPS)}"\n')
    keys = tmp_path / "keys"
    keys.write_text("K S\n")
    both = _serve("--credentials", str(creds), "--sqs-credentials", str(keys), root=tmp_path)
    assert both.returncode == exits.USAGE
    assert "--credentials and --sqs-credentials exclude each other" in both.stderr
    loose = _serve("--credentials", str(creds), "--allow-anonymous", root=tmp_path)
    assert loose.returncode == exits.USAGE and "--allow-anonymous is for" in loose.stderr


# -- the credentials file ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[principals.a\n", "c.toml: not valid TOML: Expected ']' at the end of a table "),
        ("oops = 1\n", "c.toml: unknown key 'oops' at the top"),
        ('metrics = "all"\n', "c.toml: metrics = 'all': must be one of \"granted\", "),
        ("", "c.toml: no principals"),
        ("\n\n[principals.a]\nread = ['*']\n", "c.toml:3: principal 'a': has no credentials"),
        (
            "[principals.a]\ntoken_sha256 = 'abc'\n",
            "principal 'a': token_sha256 holds a value of 3 characters that is not a SHA-256",
        ),
        (
            f"[principals.a]\ntoken_sha256 = '{'0' * 64}'\nread = 'orders/*'\n",
            "c.toml:1: principal 'a': read must be a list of name patterns",
        ),
        (
            f"[principals.a]\ntoken_sha256 = '{'0' * 64}'\nwrite = ['']\n",
            "principal 'a': write pattern '' is empty",
        ),
        (
            f"[principals.a]\ntoken_sha256 = '{'0' * 64}'\nraed = []\n",
            "principal 'a': unknown key 'raed'",
        ),
        (
            "[principals.a]\naws_keys = [{ id = 'K' }]\n",
            "principal 'a': aws_keys must be a list of tables",
        ),
        (
            f"[principals.a]\ntoken_sha256 = '{'0' * 64}'\n"
            f"[principals.b]\ntoken_sha256 = '{'0' * 64}'\n",
            "principals 'a' and 'b' have the same token",
        ),
        (
            "[principals.a]\naws_keys = [{ id = 'K', secret = 's' }]\n"
            "[principals.b]\naws_keys = [{ id = 'K', secret = 't' }]\n",
            "principals 'a' and 'b' have the same AWS access key id 'K'",
        ),
        (
            f"[principals.'a b']\ntoken_sha256 = '{'0' * 64}'\n",
            "c.toml:1: principal 'a b': a principal's name is 1-128 characters",
        ),
    ],
)
def test_credentials_file_errors_say_where_and_what(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_credentials(path)
    assert says in str(info.value)
    assert str(info.value).startswith(str(path))


def test_a_bad_credentials_file_stops_the_server_before_it_listens(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[principals.shop]\nread = ['*']\n")
    done = _serve("--credentials", str(path), root=tmp_path / "root")
    assert done.returncode == exits.USAGE
    assert done.stderr == (
        f"dirmq: error: {path}:1: principal 'shop': has no credentials: give it token_sha256 "
        "(`dirmq token new` makes a token and prints the line) or aws_keys\n"
    )
    assert "listening" not in done.stdout


def test_a_readable_file_of_secrets_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[principals.a]\naws_keys = [{ id = 'K', secret = 's' }]\n")
    path.chmod(0o644)
    with socket.socket() as busy:  # the warning, then a quick exit (the port is taken)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        done = _serve("--credentials", str(path), "--listen", address, root=tmp_path / "root")
    assert done.stderr.splitlines()[0] == (
        f"dirmq: warning: {path} holds AWS secret keys and other users may read it (mode "
        "0644): chmod 600 it"
    )
    path.chmod(0o600)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        done = _serve("--credentials", str(path), "--listen", address, root=tmp_path / "root")
    assert "warning" not in done.stderr


def test_patterns_and_prefixes() -> None:
    grants = {"read": ["orders/*", "@channel/eu.*", "exact"], "write": ["a?c", "[xy]z"]}
    principal = Principal("p", grants, token_digests=["0" * 64])
    access = Access(Credentials.of([principal]))
    allows = access.allows
    assert allows("p", "read", "orders/eu/fr")  # `*` crosses `/`
    assert not allows("p", "read", "orders")
    assert not allows("p", "read", "Orders/x")  # case-sensitive
    assert allows("p", "write", "abc") and allows("p", "write", "yz")
    assert not allows("p", "write", "abbc")
    assert allows("p", "see", "exact") and not allows("p", "see", "other")
    assert not allows("nobody", "read", "orders/x")
    # A channel prefix is covered only by a pattern ending in `*` that matches it.
    assert access.covers("p", "read", "@channel/eu.fr")
    assert not access.covers("p", "read", "@channel/eu")  # "eu" also starts "eux..."
    assert not access.covers("p", "read", "exact")  # no final `*`: "exactly" is not matched
    assert Access(None).allows("", "admin", "anything")


# -- dirmq token ---------------------------------------------------------------------------------
def test_token_new_and_hash(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "dirmq", "token"]
    made = subprocess.run(
        [*run, "new", "--name", "shop"], capture_output=True, text=True, check=True
    )
    lines = made.stdout.splitlines()
    token = lines[1]
    assert token.startswith("dmq_") and len(token) == 47
    assert lines[3:] == ["[principals.shop]", f'token_sha256 = "{token_digest(token)}"']
    (tmp_path / "c.toml").write_text("\n".join(lines[2:]) + "\n")  # what goes into the file
    assert load_credentials(tmp_path / "c.toml").tokens == {token_digest(token): "shop"}
    hashed = subprocess.run(
        [*run, "hash"], input=token + "\n", capture_output=True, text=True, check=True
    )
    assert hashed.stdout == f'token_sha256 = "{token_digest(token)}"\n'
    short = subprocess.run(
        [*run, "hash"], input="abc\n", capture_output=True, text=True, check=False
    )
    assert short.returncode == exits.USAGE and "at least 20 characters" in short.stderr


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_time_is_spent_once_per_token() -> None:
    """A token seen valid is found again without hashing: the fast path's cost."""
    principal = Principal("p", {"write": ["*"]}, token_digests=[token_digest(OPS)])
    access = Access(Credentials.of([principal]))
    header = f"Bearer {OPS}"
    assert access.token_of(header) == "p"
    started = time.perf_counter()
    for _ in range(10_000):
        access.token_of(header)
        access.allows("p", "write", "orders/a")
    assert (time.perf_counter() - started) / 10_000 < 20e-6  # ~0.2 µs unloaded


# -- what docs/security.md shows ------------------------------------------------------------------
SECURITY_MD = REPO / "docs" / "security.md"


def _shown_error(starts: str) -> str:
    """The line of docs/security.md that starts with `starts` (a refusal it shows as text)."""
    return next(x for x in SECURITY_MD.read_text().splitlines() if x.startswith(starts))


def test_the_documented_refusals_are_what_the_server_says(tmp_path: Path) -> None:
    done = _serve("--listen", "0.0.0.0:8080", root=tmp_path / "root")
    assert done.returncode == exits.CANNOT_LISTEN
    assert done.stderr.rstrip("\n") == _shown_error("dirmq: error: refusing to listen")
    # The example credentials file with a token pasted where its digest belongs.
    from .test_docs import blocks

    (example,) = [b.text for b in blocks(SECURITY_MD) if b.file == "credentials.toml"]
    digest = token_digest("dmq_EXAMPLE-shop-token-do-not-use-00000000")
    assert digest in example
    path = tmp_path / "credentials.toml"
    path.write_text(example.replace(digest, "dmq_EXAMPLE-shop-token-do-not-use-00000000"))
    done = _serve("--credentials", str(path), root=tmp_path / "root")
    assert done.returncode == exits.USAGE
    shown = _shown_error("dirmq: error: /etc/dirmq/credentials.toml")
    assert done.stderr.rstrip("\n") == shown.replace("/etc/dirmq/credentials.toml", str(path))


def test_tls_is_the_last_section_of_security_md() -> None:
    """The TLS work fills in the last section; keep it last."""
    headings = [x for x in SECURITY_MD.read_text().splitlines() if x.startswith("## ")]
    assert headings[-1] == "## TLS"
