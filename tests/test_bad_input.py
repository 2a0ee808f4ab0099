"""Bad input at the doors (issue 15): each is refused with a clear 4xx (SQS: its own error code)
and loses nothing. Real servers on 127.0.0.1, real boto3, the real CLI."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

import dirmq
from dirmq.wire import jsondoc

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess, sqs_client, start_server

DEEP = b"[" * 50_000  # what made the standard decoder recurse to a 500


server = serve(yaq=True)


http = http_client(scope="function")


# -- JSON nesting (defect 9) ----------------------------------------------------------------------
def test_the_json_decoder_bounds_nesting() -> None:
    assert jsondoc.depth_of({"a": [[1], "[[[[", {"b": "]]"}]}) == 3
    in_strings = "[" + ",".join(['"[[[[[[[["'] * 10) + "]"  # brackets in strings do not nest
    assert jsondoc.loads(in_strings) == ["[[[[[[[["] * 10
    assert jsondoc.loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(dirmq.InvalidArgument, match="more than 64 levels deep"):
        jsondoc.loads("[" * 65 + "]" * 65)
    with pytest.raises(ValueError, match="more than 64 levels deep"):
        jsondoc.loads(DEEP)
    with pytest.raises(ValueError, match="more than 64 levels deep"):
        jsondoc.loads(b"[" * 50_000 + b"]" * 50_000)  # well-formed, as deep
    with pytest.raises(ValueError):  # malformed stays json's own ValueError
        jsondoc.loads(b'{"a": ')


def test_deep_json_in_a_queue_configuration_is_400(http: httpx.Client) -> None:
    response = http.put("/deep-config", content=DEEP)
    assert response.status_code == 400, response.text
    assert "levels deep" in response.json()["message"]
    assert http.get("/deep-config").status_code == 404  # nothing was created


def test_deep_json_in_a_batch_line_is_400_and_stores_nothing(http: httpx.Client) -> None:
    assert http.put("/deep-batch").status_code == 201
    body = b'{"body": "one"}\n' + b'{"body": "two", "headers": ' + DEEP + b"\n"
    response = http.post(
        "/deep-batch/messages", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 400, response.text
    assert "line 2" in response.json()["message"]
    assert http.get("/deep-batch").json()["stats"]["total"] == 0


def test_deep_json_in_an_sqs_json_body_is_a_serialization_error(server: ServerProcess) -> None:
    response = httpx.post(
        server.url + "/",
        content=b'{"QueueUrl": ' + DEEP,
        headers={
            "X-Amz-Target": "AmazonSQS.SendMessage",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    assert response.status_code == 400, response.text
    assert response.json()["__type"].endswith("#SerializationException")
    assert "levels deep" in response.json()["message"]


def test_deep_json_in_an_sqs_attribute_is_invalid(server: ServerProcess) -> None:
    """JSON inside a query-protocol (or JSON-protocol) value: the same bound."""
    deep = "[" * 50_000
    for attribute in ("Policy", "RedrivePolicy", "RedriveAllowPolicy"):
        response = httpx.post(
            server.url + "/",
            data={
                "Action": "CreateQueue",
                "QueueName": "deep-attr",
                "Attribute.1.Name": attribute,
                "Attribute.1.Value": deep,
            },
        )
        assert response.status_code == 400, (attribute, response.text)
        assert b"InternalError" not in response.content
    answered_in_json = httpx.post(  # the query protocol answered in JSON: the same rule
        server.url + "/",
        data={"Action": "CreateQueue", "QueueName": "deep-attr", "Attribute.1.Name": "Policy"}
        | {"Attribute.1.Value": deep},
        headers={"Accept": "application/json"},
    )
    assert answered_in_json.status_code == 400, answered_in_json.text
    assert answered_in_json.json()["Error"]["Code"] == "InvalidAttributeValue"
    sqs = sqs_client(server.url)
    with pytest.raises(sqs.exceptions.ClientError) as caught:
        sqs.create_queue(QueueName="deep-attr", Attributes={"RedrivePolicy": deep})
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "deep-attr" not in json.dumps(sqs.list_queues())


# -- unknown query parameters and JSON keys (defect 3) ---------------------------------------------
def _refused(response: httpx.Response, *named: str) -> str:
    assert response.status_code == 400, response.text
    message: str = response.json()["message"]
    for word in named:
        assert word in message, message
    return message


def test_a_misspelt_wait_is_refused_not_ignored(http: httpx.Client) -> None:
    assert http.put("/params").status_code in (200, 201)
    message = _refused(http.get("/params/messages", params={"wiat": "5s"}), "'wiat'", "wait=")
    assert "max=, peek=, state=, visibility=, wait=" in message


def test_a_misspelt_delay_stores_nothing(http: httpx.Client) -> None:
    assert http.put("/params-delay").status_code in (200, 201)
    _refused(http.post("/params-delay/messages?dealy=1h", content=b"x"), "'dealy'", "delay=")
    assert http.get("/params-delay").json()["stats"]["total"] == 0


@pytest.mark.parametrize(
    ("method", "path", "accepted"),
    [
        ("GET", "/", "prefix="),
        ("GET", "/params", "no query parameters"),
        ("PUT", "/params", "no query parameters"),
        ("DELETE", "/params-absent", "no query parameters"),
        ("DELETE", "/params/messages", "takes state="),
        ("GET", "/params/messages/0000000000000000-0000000000000000", "no query parameters"),
        ("DELETE", "/params/messages/0000000000000000-0000000000000000", "receipt="),
        ("POST", "/params/messages/0000000000000000-0000000000000000.1/nack", "delay="),
        ("POST", "/params/messages/0000000000000000-0000000000000000.1/extend", "visibility="),
        ("POST", "/params/messages/0000000000000000-0000000000000000.1/dead-letter", "kind="),
        ("GET", "/health", "no query parameters"),
        ("GET", "/metrics", "queue="),
        ("GET", "/openapi.json", "no query parameters"),
    ],
)
def test_every_native_route_refuses_unknown_parameters(
    http: httpx.Client, method: str, path: str, accepted: str
) -> None:
    assert http.put("/params").status_code in (200, 201)
    _refused(http.request(method, path, params={"bogus": "1"}), "'bogus'", accepted)
    assert http.get("/params").status_code == 200  # a PUT/DELETE with it did nothing


def test_documented_parameters_still_work(http: httpx.Client) -> None:
    assert http.put("/params-ok").status_code in (200, 201)
    published = http.post(
        "/params-ok/messages",
        params={"delay": "0s", "durability": "writethrough", "timeout": "1s", "group": "g"},
        content=b"x",
    )
    assert published.status_code == 201, published.text
    assert http.get("/params-ok/messages", params={"peek": "1", "max": "5"}).status_code == 200
    got = http.get("/params-ok/messages", params={"wait": "1s", "visibility": "30s"})
    assert got.status_code == 200, got.text
    receipt = got.headers["X-Receipt"]
    extended = http.post(f"/params-ok/messages/{receipt}/extend", params={"visibility": "60s"})
    assert extended.status_code == 204
    assert (
        http.post(f"/params-ok/messages/{receipt}/nack", params={"delay": "0s"}).status_code == 204
    )
    assert http.get("/", params={"prefix": "params-ok"}).json() == {"queues": ["params-ok"]}


def test_unknown_configuration_keys_name_the_known_ones(http: httpx.Client) -> None:
    _refused(
        http.put("/params-config", json={"visibilty_timeout_s": 30}),
        "'visibilty_timeout_s'",
        "visibility_timeout_s",
    )
    assert http.get("/params-config").status_code == 404


def test_unknown_json_line_keys_are_refused(http: httpx.Client) -> None:
    assert http.put("/params-lines").status_code in (200, 201)
    lines = b'{"body": "a"}\n{"body": "b", "dealy": "1h"}\n'
    response = http.post(
        "/params-lines/messages", content=lines, headers={"Content-Type": "application/x-ndjson"}
    )
    _refused(response, "line 2", "'dealy'", "delay")
    assert http.get("/params-lines").json()["stats"]["total"] == 0


@pytest.mark.parametrize(
    ("method", "path", "accepted"),
    [
        ("GET", "/@pubsub", "no query parameters"),
        ("POST", "/@pubsub/publish?channel=c", "persistence="),
        ("GET", "/@pubsub/subscribe", "window="),
        ("GET", "/@pubsub/subscriptions", "no query parameters"),
        ("DELETE", "/@pubsub/subscriptions/nobody", "no query parameters"),
        ("POST", "/@pubsub/subscriptions/s/deliveries/k/done", "no query parameters"),
        ("POST", "/@pubsub/subscriptions/s/deliveries/k/heartbeat", "extend="),
        ("GET", "/@pubsub/retained", "limit="),
        ("GET", "/@pubsub/retained/head", "no query parameters"),
    ],
)
def test_every_pubsub_route_refuses_unknown_parameters(
    http: httpx.Client, method: str, path: str, accepted: str
) -> None:
    response = http.request(method, path, params={"bogus": "1"}, content=b"x")
    _refused(response, "'bogus'", accepted)


def test_a_pubsub_publish_with_a_misspelt_parameter_publishes_nothing(http: httpx.Client) -> None:
    before = http.get("/@pubsub/retained/head").json()["head"]
    _refused(
        http.post("/@pubsub/publish?channel=c&mode=everyone&persistance=memory"), "persistence="
    )
    assert http.get("/@pubsub/retained/head").json()["head"] == before


def test_yaq_refuses_parameters_it_does_not_document(server: ServerProcess) -> None:
    assert server.yaq_url is not None
    with httpx.Client(base_url=server.yaq_url, timeout=30) as yaq:
        response = yaq.post("/yaq-params?timout=1s", content=b"x")
        assert response.status_code == 400
        assert "'timout'" in response.text and "timeout=" in response.text
        response = yaq.get("/yaq-params?quantitiy=2&timeout=0")
        assert response.status_code == 400
        assert "quantity=, timeout=" in response.text
        assert yaq.post("/yaq-params?timeout=1s", content=b"kept").status_code == 200
        assert yaq.get("/yaq-params?quantity=1&timeout=0").content == b"kept"


# -- reserved names; a read never creates a queue (defect 4) ------------------------------------
def test_yaq_health_answers_at_once_and_creates_nothing(server: ServerProcess) -> None:
    assert server.yaq_url is not None
    response = httpx.get(server.yaq_url + "/health", timeout=10)
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert not (server.root / "health").exists()
    posted = httpx.post(server.yaq_url + "/health", content=b"x", timeout=10)
    assert posted.status_code == 400 and "reserved" in posted.text  # nor does an enqueue
    assert not (server.root / "health").exists()


@pytest.mark.parametrize("queue", ["yaq-small", "yaq-not-yet"], ids=["existing", "to-create"])
def test_a_yaq_enqueue_over_the_limit_is_413_before_its_body(
    server: ServerProcess, http: httpx.Client, queue: str
) -> None:
    """As on the native port: refused from its Content-Length, the body never sent."""
    assert server.yaq_url is not None
    if queue == "yaq-small":
        assert http.put(f"/{queue}", json={"max_message_bytes": 1024}).status_code == 201
    size = 1025 if queue == "yaq-small" else dirmq.QueueConfig().max_message_bytes + 1
    address = urlsplit(server.yaq_url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            f"POST /{queue} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()
        )
        head = sock.recv(65536)  # no body sent: the answer must come without it
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert b"accepts at most" in head
    assert http.get(f"/{queue}").status_code == (200 if queue == "yaq-small" else 404)


@pytest.mark.parametrize("name", ["metrics", "openapi.json", "a/messages", "a/messages/b"])
def test_names_the_native_api_reserves_are_refused_on_yaq(server: ServerProcess, name: str) -> None:
    assert server.yaq_url is not None
    for method in ("GET", "POST"):
        response = httpx.request(method, f"{server.yaq_url}/{name}?timeout=0", timeout=10)
        assert response.status_code == 400, (method, response.text)
        assert "reserved" in response.text
    assert not (server.root / name).exists()


def test_a_yaq_read_never_creates_a_queue(server: ServerProcess, http: httpx.Client) -> None:
    assert server.yaq_url is not None
    with httpx.Client(base_url=server.yaq_url, timeout=30) as yaq:
        assert yaq.get("/never-made?timeout=0").status_code == 504
        assert (
            yaq.get("/never-made?timeout=100ms&quantity=2")
            .headers["content-type"]
            .startswith("multipart/mixed")
        )
    assert http.get("/never-made").status_code == 404
    assert "never-made" not in http.get("/").json()["queues"]


def test_a_yaq_read_waiting_for_a_queue_gets_the_first_message(server: ServerProcess) -> None:
    """yaq's consumers may come first: a dequeue waits for the queue as for a message."""
    assert server.yaq_url is not None
    url = server.yaq_url + "/made-later"
    answers: list[httpx.Response] = []
    reader = threading.Thread(target=lambda: answers.append(httpx.get(url + "?timeout=60s")))
    reader.start()
    try:
        assert httpx.post(url, content=b"first", timeout=30).status_code == 200
    finally:
        reader.join(timeout=90)
    assert [(a.status_code, a.content) for a in answers] == [(200, b"first")]


@pytest.mark.parametrize(
    "name", ["health", "metrics", "openapi.json", "x/messages", "x/messages/y"]
)
def test_reserved_names_are_refused_by_the_library_and_cli(tmp_path: Path, name: str) -> None:
    store = dirmq.Store(tmp_path)
    with pytest.raises(dirmq.InvalidName, match="reserved"):
        store.create_queue(name)
    cli = subprocess.run(
        [sys.executable, "-m", "dirmq", "create", "--root", str(tmp_path), name],
        check=False,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2, cli.stderr
    assert "reserved" in cli.stderr
    assert store.list_queues() == []


def test_reserved_names_are_refused_by_the_native_api(http: httpx.Client) -> None:
    """The native grammar cannot reach queue `a/messages` (`/a/messages` is queue `a`'s
    messages): the one path left that names it is refused, not served."""
    for path in ("/a/messages/messages", "/a/messages/b/messages"):
        response = http.post(path, content=b"x")
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"] == "InvalidName" and "reserved" in response.text
    assert http.put("/health").status_code == 405


def test_reserved_names_are_refused_by_sqs(server: ServerProcess) -> None:
    sqs = sqs_client(server.url)
    for name in ("health", "metrics"):
        with pytest.raises(sqs.exceptions.ClientError) as caught:
            sqs.create_queue(QueueName=name)
        assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
        assert not (server.root / name).exists()


# -- a corrupt message file in @ready (defect 2) ------------------------------------------------
def _corrupt_ready_file(root: Path, queue: str, message_id: str) -> Path:
    """Flip the last byte of the message's body: its checksum no longer matches."""
    (path,) = (root / queue / "@ready").glob(message_id + "*")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def test_the_library_reports_a_corrupt_file_and_sets_it_aside_on_get(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = dirmq.Store(tmp_path)
    queue = store.create_queue("damaged")
    message_id = queue.put(b"hello")
    kept_id = queue.put(b"intact")
    _corrupt_ready_file(tmp_path, "damaged", message_id)
    with pytest.raises(dirmq.CorruptMessage):
        queue.peek(message_id)  # not MessageNotFound: stats still count it ready
    assert queue.stats().ready == 2
    assert queue.corrupt_quarantined == 0
    with caplog.at_level("WARNING", logger="dirmq.store.files"):
        got = queue.get()
    assert [m.id for m in got] == [kept_id]  # the damaged one is skipped, the next given
    lines = [r.getMessage() for r in caplog.records if r.name == "dirmq.store.files"]
    assert len(lines) == 1
    assert "'damaged'" in lines[0] and message_id in lines[0]
    assert queue.corrupt_quarantined == 1
    assert [p.name[: len(message_id)] for p in (tmp_path / "damaged" / "@corrupt").iterdir()] == [
        message_id
    ]
    with pytest.raises(dirmq.MessageNotFound):
        queue.peek(message_id)  # set aside: no longer in the queue
    store.close()


def test_the_cli_peek_of_a_corrupt_file_exits_6(tmp_path: Path) -> None:
    store = dirmq.Store(tmp_path)
    message_id = store.create_queue("damaged").put(b"hello")
    store.close()
    _corrupt_ready_file(tmp_path, "damaged", message_id)
    peek = subprocess.run(
        [sys.executable, "-m", "dirmq", "peek", "--root", str(tmp_path), "damaged", message_id],
        check=False,
        capture_output=True,
        text=True,
    )
    assert peek.returncode == 6, (peek.stdout, peek.stderr)
    assert "CorruptMessage" in peek.stderr or "checksum" in peek.stderr


def test_http_peek_is_500_and_a_receive_counts_and_logs_it(tmp_path: Path) -> None:
    process = start_server(tmp_path / "root")
    try:
        with httpx.Client(base_url=process.url, timeout=30) as http:
            assert http.put("/damaged").status_code == 201
            message_id = http.post("/damaged/messages", content=b"hello").json()["id"]
            _corrupt_ready_file(process.root, "damaged", message_id)
            peeked = http.get(f"/damaged/messages/{message_id}")
            assert peeked.status_code == 500
            assert peeked.json()["error"] == "CorruptMessage"
            assert http.get("/damaged").json()["stats"]["ready"] == 1
            assert http.get("/damaged/messages").status_code == 204  # set aside, not delivered
            metrics = http.get("/metrics").text
            (sample,) = [
                line
                for line in metrics.splitlines()
                if line.startswith("dirmq_messages_corrupt_total{") and '"damaged"' in line
            ]
            assert float(sample.rsplit(" ", 1)[1]) == 1.0
            assert http.get("/damaged").json()["stats"]["total"] == 0
    finally:
        process.stop()
    logged = [line for line in process.output.splitlines() if "does not decode" in line]
    assert len(logged) == 1, process.output
    assert "'damaged'" in logged[0] and message_id in logged[0]


# -- SQS query protocol: bytes that are not UTF-8 (defect 10) -----------------------------------
def _sqs_query(server: ServerProcess, form: str, in_query: bool) -> httpx.Response:
    """A query-protocol request whose parameters are sent exactly as written (percent-escapes
    included), in the form body or in the query string."""
    if in_query:
        return httpx.post(f"{server.url}/?{form}", timeout=30)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return httpx.post(server.url + "/", content=form.encode("ascii"), headers=headers, timeout=30)


@pytest.mark.parametrize("in_query", [False, True], ids=["form", "query-string"])
def test_sqs_query_refuses_a_body_that_is_not_utf8(server: ServerProcess, in_query: bool) -> None:
    sqs = sqs_client(server.url)
    url = sqs.create_queue(QueueName="not-utf8")["QueueUrl"]
    form = f"Action=SendMessage&QueueUrl={url}&MessageBody=%FF%FE"
    response = _sqs_query(server, form, in_query)
    assert response.status_code == 400, response.text
    assert "<Code>InvalidMessageContents</Code>" in response.text
    # The JSON protocol's answer to the same text (lone surrogates are what JSON can carry).
    with pytest.raises(sqs.exceptions.ClientError) as caught:
        sqs.send_message(QueueUrl=url, MessageBody="\udcff\udcfe")
    assert caught.value.response["Error"]["Code"] == "InvalidMessageContents"
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)


def test_sqs_query_refuses_an_attribute_value_that_is_not_utf8(server: ServerProcess) -> None:
    sqs = sqs_client(server.url)
    url = sqs.create_queue(QueueName="not-utf8-attr")["QueueUrl"]
    form = (
        f"Action=SendMessage&QueueUrl={url}&MessageBody=fine"
        "&MessageAttribute.1.Name=city&MessageAttribute.1.Value.DataType=String"
        "&MessageAttribute.1.Value.StringValue=Z%FCrich"
    )
    response = _sqs_query(server, form, False)
    assert response.status_code == 400, response.text
    assert "<Code>InvalidParameterValue</Code>" in response.text
    with pytest.raises(sqs.exceptions.ClientError) as caught:  # the JSON protocol: the same
        sqs.send_message(
            QueueUrl=url,
            MessageBody="fine",
            MessageAttributes={"city": {"DataType": "String", "StringValue": "Z\udcfcrich"}},
        )
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    # Valid UTF-8, percent-encoded, still round-trips.
    form = f"Action=SendMessage&QueueUrl={url}&MessageBody=Z%C3%BCrich"
    assert _sqs_query(server, form, True).status_code == 200
    (message,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)["Messages"]
    assert message["Body"] == "Zürich"


# -- control characters: found by the OpenAPI fuzzer (a stored group broke its delivery) ----------
@pytest.mark.parametrize(
    "character", ["\x19", "\x0c", "\x7f", "\t"], ids=["x19", "FF", "DEL", "TAB"]
)
def test_a_group_or_dedup_id_with_a_control_character_is_refused(
    store: dirmq.Store, character: str
) -> None:
    queue = store.create_queue("labels")
    for label in ("group", "dedup_id"):
        message = dirmq.OutgoingMessage(b"x", **{label: f"a{character}b"})  # type: ignore[arg-type]
        with pytest.raises(dirmq.InvalidArgument, match="control characters"):
            queue.put_many([message])
    assert queue.stats().ready == 0


@pytest.mark.parametrize("character", ["\x19", "\x0c", "\x7f"], ids=["x19", "FF", "DEL"])
def test_a_header_value_with_a_control_character_is_refused_tab_kept(
    http: httpx.Client, store_root_queue: str, character: str
) -> None:
    url = f"/{store_root_queue}/messages"
    refused = http.post(url, params={"group": f"a{character}b"}, content=b"x")
    assert refused.status_code == 400 and "control characters" in refused.json()["message"]
    with pytest.raises(dirmq.InvalidArgument, match="control character"):
        dirmq.store.codec.check_headers({"X-Attr-Note": f"a{character}b"})
    kept = http.post(f"/{store_root_queue}/messages", content=b"y", headers={"X-Attr-Note": "a\tb"})
    assert kept.status_code == 201
    delivered = http.get(f"/{store_root_queue}/messages")
    assert delivered.status_code == 200 and delivered.headers["X-Attr-Note"] == "a\tb"


@pytest.fixture
def store_root_queue(http: httpx.Client) -> Iterator[str]:
    assert http.put("/control-chars").status_code in (200, 201)
    yield "control-chars"
    http.delete("/control-chars")


def test_a_storage_error_says_its_message_once_through_every_door(tmp_path: Path) -> None:
    """'[Errno 0] [Errno 28] writing ...' was what an HTTP client saw of a full disk: the
    errno prefix went into the message the server sent, and the client added its own."""
    full = dirmq.errors.storage_error(OSError(28, "No space left on device"), "writing a message")
    assert isinstance(full, dirmq.DiskFull) and full.errno == 28
    assert str(full) == "writing a message: disk full (No space left on device)"
    rebuilt = dirmq.errors.DiskFull(0, str(full))  # as the HTTP client rebuilds it
    assert str(rebuilt) == str(full)
