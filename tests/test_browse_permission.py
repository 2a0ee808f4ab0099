"""The `browse` permission (issue 32) on a real `dirmq serve --credentials FILE`: a principal
with `browse` only may look at everything its patterns match (listings, stats, configuration,
peeks of messages in every state, retained pub/sub pages, SQS's looking actions) and nothing
else, on every door: native (the Python client too), the streaming consumer's WebSocket
upgrade, yaq, pub/sub, SQS (boto3). After all its attempts the messages are as they were.

Principals of the shared server:

    ops       token, AWS key     everything
    viewer    token, AWS key     browse on orders*, @channel/orders*, @subscription/orders*
    reader    token              read on orders* (read implies browse)
    keeper    token              write and admin on orders* (neither implies browse)
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from dirmq.client import RemoteStore
from dirmq.client.pubsub import RemotePubSub
from dirmq.dialects.native import handlers
from dirmq.dialects.native.app import FILTERED, NEEDS
from dirmq.dialects.native.routes import parse_route
from dirmq.errors import AccessDenied, ConfigError
from dirmq.server.access import Access
from dirmq.server.credentials import (
    BROWSE,
    SEE,
    Credentials,
    Principal,
    load_credentials,
    new_token,
    token_digest,
)
from dirmq.sqs.actions import load

from .support.fixtures import serve
from .support.servers import ServerProcess

OPS, VIEWER, READER, KEEPER = (new_token() for _ in range(4))
OPS_KEY, OPS_SECRET = "AKIDOPS", "ops-secret"
VIEWER_KEY, VIEWER_SECRET = "AKIDVIEWER", "viewer-secret"

CREDENTIALS = f"""
[principals.ops]
token_sha256 = "{token_digest(OPS)}"
aws_keys = [{{ id = "{OPS_KEY}", secret = "{OPS_SECRET}" }}]
read = ["*"]
write = ["*"]
admin = ["*"]

[principals.viewer]
token_sha256 = "{token_digest(VIEWER)}"
aws_keys = [{{ id = "{VIEWER_KEY}", secret = "{VIEWER_SECRET}" }}]
browse = ["orders*", "@channel/orders*", "@subscription/orders*"]

[principals.reader]
token_sha256 = "{token_digest(READER)}"
read = ["orders*"]

[principals.keeper]
token_sha256 = "{token_digest(KEEPER)}"
write = ["orders*"]
admin = ["orders*"]
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


server = serve(yaq=True, credentials=CREDENTIALS)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


# -- native ---------------------------------------------------------------------------------------
def _publish(http: httpx.Client, queue: str, body: bytes, **params: str) -> str:
    answer = http.post(f"/{queue}/messages", params=params, headers=bearer(OPS), content=body)
    assert answer.status_code == 201, answer.text
    return str(answer.headers["x-message-id"])


def _receive(http: httpx.Client, queue: str) -> httpx.Response:
    answer = http.get(f"/{queue}/messages", params={"visibility": "1h"}, headers=bearer(OPS))
    assert answer.status_code == 200, answer.text
    return answer


@pytest.fixture(scope="module")
def states(http: httpx.Client) -> dict[str, str]:
    """Queue `orders` holding one message in each state: in flight (leased by ops for an
    hour), dead (in the queue's own dead area), delayed (an hour) and ready; their ids by
    state, and the in-flight one's receipt."""
    assert http.put("/orders", headers=bearer(OPS)).status_code == 201
    assert http.put("/billing", headers=bearer(OPS)).status_code == 201
    found = {"in_flight": _publish(http, "orders", b"held")}
    found["receipt"] = _receive(http, "orders").headers["x-receipt"]
    found["dead"] = _publish(http, "orders", b"failed")
    dying = _receive(http, "orders").headers["x-receipt"]
    dead = http.post(f"/orders/messages/{dying}/dead-letter", headers=bearer(OPS))
    assert dead.status_code == 204
    found["delayed"] = _publish(http, "orders", b"later", delay="1h")
    found["ready"] = _publish(http, "orders", b"waiting")
    return found


def _stats(http: httpx.Client, queue: str = "orders") -> dict[str, Any]:
    stats = http.get(f"/{queue}", headers=bearer(OPS)).json()["stats"]
    return {k: stats[k] for k in ("ready", "in_flight", "delayed", "dead")}


BEFORE = {"ready": 1, "in_flight": 1, "delayed": 1, "dead": 1}


def test_native_looking_calls_are_allowed(http: httpx.Client, states: dict[str, str]) -> None:
    viewer = bearer(VIEWER)
    assert _stats(http) == BEFORE
    listed = http.get("/", headers=viewer).json()["queues"]
    assert "orders" in listed and "billing" not in listed
    shown = http.get("/orders", headers=viewer)
    assert shown.status_code == 200
    assert shown.json()["stats"]["dead"] == 1 and "max_receives" in shown.json()["config"]
    assert http.head("/orders", headers=viewer).status_code == 200
    for flag in ("1", "true"):
        page = http.get("/orders/messages", params={"peek": flag}, headers=viewer)
        assert page.status_code == 200
        assert [m["id"] for m in page.json()["messages"]] == [states["ready"]]
    for state in ("ready", "in_flight", "delayed", "dead"):
        page = http.get("/orders/messages", params={"peek": 1, "state": state}, headers=viewer)
        assert [m["id"] for m in page.json()["messages"]] == [states[state]], state
    assert http.get("/orders/redrive", headers=viewer).json() == {"tasks": []}
    for state in ("ready", "in_flight", "delayed", "dead"):
        peeked = http.get(f"/orders/messages/{states[state]}", headers=viewer)
        assert peeked.status_code == 200, (state, peeked.text)
        assert peeked.headers["x-message-id"] == states[state]
        assert http.head(f"/orders/messages/{states[state]}", headers=viewer).status_code == 200
    assert http.get("/openapi.json", headers=viewer).status_code == 200
    assert _stats(http) == BEFORE


def _refused(answer: httpx.Response, permission: str, queue: str = "orders") -> None:
    assert answer.status_code == 403, answer.text
    assert answer.json() == {
        "error": "AccessDenied",
        "message": f"principal 'viewer' has no {permission} permission on queue '{queue}'",
    }


def test_native_consuming_calls_are_refused(http: httpx.Client, states: dict[str, str]) -> None:
    viewer, receipt, ready = bearer(VIEWER), states["receipt"], states["ready"]
    receipts = {"receipts": [receipt], "visibility": "1m"}
    calls: list[tuple[str, str, dict[str, Any], str]] = [
        ("GET", "/orders/messages", {}, "read"),  # the fast path's receive
        ("GET", "/orders/messages", {"params": {"max": "5", "wait": "0"}}, "read"),
        ("GET", "/orders/messages", {"params": {"peek": "0"}}, "read"),  # not a peek
        ("DELETE", f"/orders/messages/{receipt}", {}, "read"),  # the fast path's ack
        ("DELETE", f"/orders/messages/{ready}", {}, "read"),  # a delete by id
        ("DELETE", f"/orders/messages/{ready}", {"params": {"receipt": receipt}}, "read"),
        ("POST", f"/orders/messages/{receipt}/nack", {}, "read"),
        ("POST", f"/orders/messages/{receipt}/extend", {"params": {"visibility": "1m"}}, "read"),
        ("POST", f"/orders/messages/{receipt}/dead-letter", {}, "read"),
        ("POST", "/orders/messages/ack", {"json": receipts}, "read"),
        ("POST", "/orders/messages/nack", {"json": receipts}, "read"),
        ("POST", "/orders/messages/extend", {"json": receipts}, "read"),
        ("POST", "/orders/messages", {"content": b"no"}, "write"),
        ("DELETE", "/orders/messages", {}, "admin"),  # purge
        ("DELETE", "/orders/messages", {"params": {"state": "dead"}}, "admin"),
        ("POST", "/orders/redrive", {"json": {}}, "admin"),
        ("DELETE", f"/orders/redrive/{'0' * 32}", {}, "admin"),  # a cancel
        ("PUT", "/orders", {"json": {"max_receives": 1}}, "admin"),
        ("DELETE", "/orders", {}, "admin"),
    ]
    for method, path, kwargs, permission in calls:
        _refused(http.request(method, path, headers=viewer, **kwargs), permission)
    # Every rule of the native API that is not a look was tried above.
    tried = {(parse_route(path).kind, method) for method, path, _kwargs, _needs in calls}
    assert {rule for rule, needs in NEEDS.items() if needs not in (BROWSE, SEE)} <= tried
    assert _stats(http) == BEFORE
    # The ready message was never received, and ops's lease still holds.
    peeked = http.get(f"/orders/messages/{ready}", headers=bearer(OPS))
    assert peeked.headers["x-receive-count"] == "0"
    extend = f"/orders/messages/{receipt}/extend"
    kept = http.post(extend, params={"visibility": "1h"}, headers=bearer(OPS))
    assert kept.status_code == 204


def test_read_implies_browse_and_admin_does_not(http: httpx.Client, states: dict[str, str]) -> None:
    ready = states["ready"]
    assert http.get(f"/orders/messages/{ready}", headers=bearer(READER)).status_code == 200
    peeked = http.get("/orders/messages", params={"peek": "1"}, headers=bearer(READER))
    assert peeked.status_code == 200
    for path, params in ((f"/orders/messages/{ready}", {}), ("/orders/messages", {"peek": "1"})):
        refused = http.get(path, params=params, headers=bearer(KEEPER))
        assert refused.status_code == 403
        assert refused.json()["message"] == (
            "principal 'keeper' has no browse permission on queue 'orders'"
        )
    assert http.get("/orders", headers=bearer(KEEPER)).status_code == 200  # stats: any
    # Outside its patterns the viewer is refused alike whether the queue exists or not.
    for queue in ("billing", "billing-missing"):
        _refused(
            http.get(f"/{queue}/messages", params={"peek": "1"}, headers=bearer(VIEWER)),
            "browse",
            queue,
        )
        refused = http.get(f"/{queue}", headers=bearer(VIEWER))
        assert refused.json()["message"] == (
            f"principal 'viewer' has no permission on queue '{queue}'"
        )
    assert _stats(http) == BEFORE


def test_a_redrive_to_a_queue_named_needs_write_there(
    http: httpx.Client, states: dict[str, str]
) -> None:
    """`admin` on the source is not enough to move its messages into a queue one may not
    write to (as SQS asks `write` on a move task's DestinationArn)."""
    keeper = bearer(KEEPER)  # write and admin on orders*, nothing on billing
    refused = http.post("/orders/redrive", json={"to": "billing"}, headers=keeper)
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        "principal 'keeper' has no write permission on queue 'billing'"
    )
    assert _stats(http) == BEFORE
    for queue in ("orders-spare", "orders-fixes"):
        assert http.put(f"/{queue}", headers=bearer(OPS)).status_code == 201
    allowed = http.post("/orders-spare/redrive", json={"to": "orders-fixes"}, headers=keeper)
    assert allowed.status_code == 202, allowed.text


def _upgrade(server: ServerProcess, path: str, token: str) -> str:
    """The status line answering a WebSocket upgrade of `path` (the streaming consumer's)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0].decode()


def test_the_streaming_consumer_is_refused(
    server: ServerProcess, http: httpx.Client, states: dict[str, str]
) -> None:
    assert http.put("/orders-empty", headers=bearer(OPS)).status_code == 201
    for path in ("/orders/messages", "/orders/messages?peek=1", "/orders-empty/messages"):
        assert _upgrade(server, path, VIEWER) == "HTTP/1.1 403 Forbidden", path
    # The same upgrade is a stream to a reader (on an empty queue: nothing is leased).
    assert _upgrade(server, "/orders-empty/messages", READER).startswith("HTTP/1.1 101 ")
    with RemoteStore(server.url, token=VIEWER) as store:
        queue = store.queue("orders")
        refused = pytest.raises(AccessDenied, match="no read permission on queue 'orders'")
        with refused, queue.consume(prefetch=1) as consumer:
            consumer.get(timeout_s=1)
    assert _stats(http) == BEFORE


def test_the_python_client(
    server: ServerProcess, http: httpx.Client, states: dict[str, str]
) -> None:
    with RemoteStore(server.url, token=VIEWER) as store:
        listed = store.list_queues()
        assert "orders" in listed and "billing" not in listed
        queue = store.queue("orders")
        assert queue.stats().dead == 1
        assert queue.peek(states["dead"]).body == b"failed"
        assert [m.body for m in queue.browse()] == [b"waiting"]
        for call in (
            queue.get,
            lambda: queue.ack(states["receipt"]),
            lambda: queue.nack(states["receipt"]),
            lambda: queue.delete(states["ready"]),
            queue.purge,
            lambda: queue.put(b"no"),
        ):
            with pytest.raises(AccessDenied):
                call()
    assert _stats(http) == BEFORE


def test_yaq(server: ServerProcess, http: httpx.Client, states: dict[str, str]) -> None:
    assert server.yaq_url is not None
    with httpx.Client(base_url=server.yaq_url, timeout=10) as yaq:
        viewer = bearer(VIEWER)
        for params in ({"timeout": "0"}, {"quantity": "2", "timeout": "0"}):
            refused = yaq.get("/orders", params=params, headers=viewer)
            assert refused.status_code == 403
            assert "principal 'viewer' has no read permission on queue 'orders'" in refused.text
        assert yaq.post("/orders", headers=viewer, content=b"no").status_code == 403
    assert _stats(http) == BEFORE


# -- pub/sub ---------------------------------------------------------------------------------------
def test_pubsub(server: ServerProcess, http: httpx.Client) -> None:
    viewer, keeper = bearer(VIEWER), bearer(KEEPER)
    with RemotePubSub(server.url, token=OPS, timeout_s=10) as ops:
        ops.publish("orders.eu", b"kept", mode="future")
        with ops.subscribe("orders-audit", channels=["orders"]) as sub:
            delivery = sub.receive(wait_s=10)
            assert delivery is not None and delivery.body == b"kept"
            head = http.get("/@pubsub/retained/head", headers=viewer)
            assert head.status_code == 200
            # Looking: the subscriptions it may see, retained pages of its channels.
            listed = http.get("/@pubsub/subscriptions", headers=viewer)
            assert [s["name"] for s in listed.json()] == ["orders-audit"]
            page = http.get("/@pubsub/retained", params={"channel": "orders"}, headers=viewer)
            assert page.status_code == 200 and page.text.count("\n") == 1
            # Consuming: attach (named or not), settle, publish, delete; and every channel.
            settle = f"/@pubsub/subscriptions/orders-audit/deliveries/{delivery.key}/"
            refusals = [
                http.get("/@pubsub/retained", headers=viewer),
                http.post(settle + "done", headers=viewer),
                http.post(settle + "abort", headers=viewer),
                http.post(
                    "/@pubsub/publish",
                    params={"channel": "orders.eu"},
                    headers=viewer,
                    content=b"no",
                ),
                http.delete("/@pubsub/subscriptions/orders-audit", headers=viewer),
                http.get("/@pubsub", headers=viewer),  # counters: as /metrics
                http.get("/@pubsub/retained", params={"channel": "orders"}, headers=keeper),
            ]
            for params in ({"channel": "orders"}, {"channel": "orders", "name": "orders-audit"}):
                with http.stream(
                    "GET", "/@pubsub/subscribe", params=params, headers=viewer
                ) as attach:
                    refusals.append(attach)
            for refused in refusals:
                assert refused.status_code == 403, (refused.request.url, refused.status_code)
            assert refusals[0].json()["message"] == (
                "principal 'viewer' has no browse permission on every channel starting with ''"
            )
            sub.done(delivery)  # still ops's to settle: nothing took it
        assert http.get("/@pubsub/retained/head", headers=viewer).json() == head.json()


# -- SQS ---------------------------------------------------------------------------------------
def _sqs(url: str, key: str, secret: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


def _arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:000000000000:{name}"


def test_sqs(server: ServerProcess) -> None:
    ops, viewer = _sqs(server.url, OPS_KEY, OPS_SECRET), _sqs(server.url, VIEWER_KEY, VIEWER_SECRET)
    dlq = ops.create_queue(QueueName="orders-dlq")["QueueUrl"]
    policy = f'{{"deadLetterTargetArn": "{_arn("orders-dlq")}", "maxReceiveCount": "5"}}'
    url = ops.create_queue(QueueName="orders-sqs", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    ops.create_queue(QueueName="billing-sqs")
    ops.send_message(QueueUrl=url, MessageBody="untouched")
    task = ops.start_message_move_task(SourceArn=_arn("orders-dlq"))["TaskHandle"]
    entry = {"Id": "a", "ReceiptHandle": "bogus"}
    looking: dict[str, Callable[[], object]] = {
        "ListQueues": viewer.list_queues,
        "GetQueueUrl": lambda: viewer.get_queue_url(QueueName="orders-sqs"),
        "GetQueueAttributes": lambda: viewer.get_queue_attributes(
            QueueUrl=url, AttributeNames=["All"]
        ),
        "ListQueueTags": lambda: viewer.list_queue_tags(QueueUrl=url),
        "ListDeadLetterSourceQueues": lambda: viewer.list_dead_letter_source_queues(QueueUrl=dlq),
        "ListMessageMoveTasks": lambda: viewer.list_message_move_tasks(
            SourceArn=_arn("orders-dlq")
        ),
    }
    consuming: dict[str, Callable[[], object]] = {
        "ReceiveMessage": lambda: viewer.receive_message(QueueUrl=url, VisibilityTimeout=0),
        "DeleteMessage": lambda: viewer.delete_message(QueueUrl=url, ReceiptHandle="bogus"),
        "DeleteMessageBatch": lambda: viewer.delete_message_batch(QueueUrl=url, Entries=[entry]),
        "ChangeMessageVisibility": lambda: viewer.change_message_visibility(
            QueueUrl=url, ReceiptHandle="bogus", VisibilityTimeout=0
        ),
        "ChangeMessageVisibilityBatch": lambda: viewer.change_message_visibility_batch(
            QueueUrl=url, Entries=[{**entry, "VisibilityTimeout": 0}]
        ),
        "SendMessage": lambda: viewer.send_message(QueueUrl=url, MessageBody="no"),
        "SendMessageBatch": lambda: viewer.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "no"}]
        ),
        "PurgeQueue": lambda: viewer.purge_queue(QueueUrl=url),
        "DeleteQueue": lambda: viewer.delete_queue(QueueUrl=url),
        "SetQueueAttributes": lambda: viewer.set_queue_attributes(
            QueueUrl=url, Attributes={"DelaySeconds": "1"}
        ),
        "CreateQueue": lambda: viewer.create_queue(QueueName="orders-new"),
        "TagQueue": lambda: viewer.tag_queue(QueueUrl=url, Tags={"a": "b"}),
        "UntagQueue": lambda: viewer.untag_queue(QueueUrl=url, TagKeys=["a"]),
        "AddPermission": lambda: viewer.add_permission(
            QueueUrl=url, Label="l", AWSAccountIds=["000000000000"], Actions=["SendMessage"]
        ),
        "RemovePermission": lambda: viewer.remove_permission(QueueUrl=url, Label="l"),
        "StartMessageMoveTask": lambda: viewer.start_message_move_task(
            SourceArn=_arn("orders-dlq")
        ),
        "CancelMessageMoveTask": lambda: viewer.cancel_message_move_task(TaskHandle=task),
    }
    assert sorted([*looking, *consuming]) == sorted(load())  # every action, one way or the other
    answers = {action: call() for action, call in looking.items()}
    listed = answers["ListQueues"]["QueueUrls"]
    assert dlq in listed and url in listed and not [u for u in listed if "billing" in u]
    assert answers["ListDeadLetterSourceQueues"]["queueUrls"] == [url]
    (listed_task,) = answers["ListMessageMoveTasks"]["Results"]
    assert listed_task["SourceArn"] == _arn("orders-dlq")
    for action, call in consuming.items():
        with pytest.raises(ClientError) as info:
            call()
        error = info.value.response
        assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == (
            "AccessDenied",
            403,
        ), action
        assert f"sqs:{action}" in error["Error"]["Message"]
    attributes = ops.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "1"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
    (message,) = ops.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"])[
        "Messages"
    ]
    assert (message["Body"], message["Attributes"]["ApproximateReceiveCount"]) == ("untouched", "1")


# -- the credentials file and the rules ---------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("browse = 'orders/*'\n", "principal 'a': browse must be a list of name patterns"),
        ("browse = ['']\n", "principal 'a': browse pattern '' is empty"),
        ('browse = ["a\\u0001"]\n', "browse pattern 'a\\x01' is empty or has control characters"),
        (
            "browze = []\n",
            "unknown key 'browze': a principal takes token_sha256, aws_keys, browse, read, "
            "write, admin, metrics",
        ),
    ],
)
def test_browse_is_validated_like_the_others(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[principals.a]\ntoken_sha256 = '{'0' * 64}'\n{text}")
    with pytest.raises(ConfigError) as info:
        load_credentials(path)
    assert str(info.value).startswith(f"{path}:1: ") and says in str(info.value)


def test_who_may_browse() -> None:
    principals = [
        Principal("viewer", {"browse": ["orders/*", "@channel/eu.*"]}, token_digests=["0" * 64]),
        Principal("reader", {"read": ["orders/*", "@channel/eu.*"]}, token_digests=["1" * 64]),
        Principal("owner", {"write": ["*"], "admin": ["*"]}, token_digests=["2" * 64]),
    ]
    access = Access(Credentials.of(principals))
    for name in ("viewer", "reader"):
        assert access.allows(name, "browse", "orders/a")
        assert access.allows(name, "see", "orders/a")
        assert access.covers(name, "browse", "@channel/eu.fr")
        assert not access.allows(name, "browse", "billing")
    assert not access.allows("viewer", "read", "orders/a")  # browse never implies read
    assert not access.covers("viewer", "read", "@channel/eu.fr")
    assert not access.allows("owner", "browse", "orders/a")
    assert access.allows("owner", "see", "orders/a")


def test_every_native_route_has_a_rule() -> None:
    """A route without a rule is refused to everyone (never open); this keeps each route's
    rule written down instead."""
    assert set(handlers.TABLE) - FILTERED <= set(NEEDS)
