"""The OpenAPI document (`dirmq/dialects/native/openapi.json`): valid OpenAPI 3.1, served exactly
as packaged, and true to the server. Every documented operation is sent a simple request against a
real server and must answer a status it documents, with the documented body schema and
required headers; every native route the server has is documented; and every path refuses,
with 405, exactly the methods it does not document."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from dirmq.console.samples_api import PREFIX as CONSOLE_PREFIX
from dirmq.console.samples_api import ROUTES as CONSOLE_ROUTES
from dirmq.dialects.native import handlers as native
from dirmq.dialects.native.routes import SERVER_PATHS, parse_route
from dirmq.dialects.native.schedules import PREFIX as SCHEDULES_PREFIX
from dirmq.dialects.pubsub import METHODS as PUBSUB_METHODS
from dirmq.dialects.pubsub import is_pubsub_path, parse_pubsub_route
from dirmq.errors import InvalidArgument
from dirmq.store.codec import MAX_HEADER_BYTES
from dirmq.wire.durations import parse_duration

from .support.fixtures import serve
from .support.servers import ServerProcess

SPEC_BYTES = resources.files("dirmq.dialects.native").joinpath("openapi.json").read_bytes()
SPEC: dict[str, Any] = json.loads(SPEC_BYTES)
SPEC_URI = "urn:dirmq:openapi.json"
REGISTRY: Registry[Any] = Registry().with_resource(
    SPEC_URI, Resource.from_contents(SPEC, default_specification=DRAFT202012)
)
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
TRANSPORT_STATUSES = {"400", "408", "413", "431", "500", "503"}
MISSING_QUEUE = "oa-missing/q"
SOME_ID = "0000000000000001-000000000000"
SOME_KEY = f"0000000000000001_{SOME_ID}"


@dataclass(frozen=True)
class Operation:
    path: str
    method: str
    spec: dict[str, Any]

    @property
    def op_id(self) -> str:
        return str(self.spec["operationId"])


def resolve(obj: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` (`#/components/...`) to what it names."""
    while "$ref" in obj:
        node: dict[str, Any] = SPEC
        for part in obj["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        obj = node
    return obj


def operations() -> list[Operation]:
    return [
        Operation(path, method, item[method])
        for path, item in SPEC["paths"].items()
        for method in HTTP_METHODS
        if method in item
    ]


def fill(template: str, queue: str, ref: str = SOME_ID, receipt: str = f"{SOME_ID}.1") -> str:
    filled = template.replace("{queue}", queue).replace("{ref}", ref).replace("{receipt}", receipt)
    filled = filled.replace("{task}", "0" * 32)
    return filled.replace("{name}", "oa-sub").replace("{key}", SOME_KEY).replace("{action}", "done")


def kind_of(path: str) -> str:
    """The route kind of a filled path: pub/sub's own, the console's, else the native grammar's."""
    if path.startswith(CONSOLE_PREFIX):
        return f"console:{path.removeprefix(CONSOLE_PREFIX)}"
    if path.startswith(SCHEDULES_PREFIX):  # judged by dialects/native/schedules.py
        return "schedules:one" if path.startswith(SCHEDULES_PREFIX + "/") else "schedules:all"
    if is_pubsub_path(path):
        route = parse_pubsub_route(path)
        assert route is not None, path
        return f"pubsub:{route.kind}"
    return parse_route(path).kind


def pointer(*parts: str) -> str:
    """A JSON pointer (RFC 6901), percent-encoded for use as a URI fragment."""
    escaped = (part.replace("~", "~0").replace("/", "~1") for part in parts)
    return quote("/" + "/".join(escaped), safe="/~")


def check_documented(operation: Operation, response: httpx.Response) -> dict[str, Any]:
    """Assert `response` is one `operation` documents (status, required headers, content type,
    JSON body schema); return the documented response object."""
    status = str(response.status_code)
    where = f"{operation.method.upper()} {operation.path} -> {status}: {response.text[:200]}"
    assert status in operation.spec["responses"], f"undocumented status: {where}"
    documented: dict[str, Any] = operation.spec["responses"][status]
    location = pointer("paths", operation.path, operation.method, "responses", status)
    if "$ref" in documented:
        location = str(documented["$ref"]).removeprefix("#")
        documented = resolve(documented)
    for name, header in documented.get("headers", {}).items():
        if resolve(header).get("required"):
            assert name in response.headers, f"missing header {name}: {where}"
    content: dict[str, Any] = documented.get("content", {})
    if not content:
        assert response.content == b"", f"a body where none is documented: {where}"
        return documented
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    keys = {key.split(";")[0].strip().lower(): key for key in content}
    key = keys.get(media_type) or keys.get("*/*")
    assert key is not None, f"undocumented content type {media_type!r}: {where}"
    if media_type == "application/json" and "schema" in content[key]:
        schema_at = location + pointer("content", key, "schema")
        validator = OAS31Validator({"$ref": f"{SPEC_URI}#{schema_at}"}, registry=REGISTRY)
        validator.validate(response.json())
    if "x-line-schema" in content[key]:  # JSON lines: each line against the line schema
        schema_at = location + pointer("content", key, "x-line-schema")
        validator = OAS31Validator({"$ref": f"{SPEC_URI}#{schema_at}"}, registry=REGISTRY)
        for line in response.text.splitlines():
            validator.validate(json.loads(line))
    return documented


# -- the document itself ------------------------------------------------------------------------
def test_document_is_valid_openapi_3_1() -> None:
    assert SPEC["openapi"].startswith("3.1.")
    validate(SPEC)


def test_every_native_route_and_server_path_is_documented() -> None:
    documented = set()
    for operation in operations():
        documented.add((kind_of(fill(operation.path, "some/queue")), operation.method.upper()))
    served = set(native.TABLE) | {("server", "GET")}
    served |= {(f"pubsub:{kind}", m) for kind, methods in PUBSUB_METHODS.items() for m in methods}
    served |= {(f"console:{route}", m) for route in CONSOLE_ROUTES for m in ("GET", "HEAD")}
    served |= {("schedules:all", "GET")} | {("schedules:one", m) for m in ("GET", "PUT", "DELETE")}
    assert documented == served
    server_paths = {p.strip("/") for p in SPEC["paths"] if kind_of(fill(p, "q")) == "server"}
    assert server_paths == SERVER_PATHS


def test_every_native_operation_documents_the_transport_answers() -> None:
    for operation in operations():
        if kind_of(fill(operation.path, "q")) == "server":
            continue
        missing = TRANSPORT_STATUSES - set(operation.spec["responses"])
        assert not missing, f"{operation.op_id} lacks {missing}"
    unavailable = resolve({"$ref": "#/components/responses/Unavailable"})
    assert resolve(unavailable["headers"]["Retry-After"])["required"] is True


@pytest.mark.parametrize(
    "text",
    [
        *("2", "0.25", ".5", "5.", "150ms", "1h2m3.5s", "+2s", " 2s ", "1µs", "1μs", "10us", "0"),
        *("", "-1", "bogus", "2x", "1h-2m", "s", "1 s", "1e3", "inf", "nan", "1.2.3s"),
    ],
)
def test_duration_pattern_matches_the_parser(text: str) -> None:
    pattern = resolve({"$ref": "#/components/schemas/Duration"})["pattern"]
    try:
        parse_duration(text)
        parses = True
    except InvalidArgument:
        parses = False
    assert (re.search(pattern, text) is not None) == parses


# -- against a real server ----------------------------------------------------------------------
server = serve()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_served_document_is_the_packaged_file_compacted(http: httpx.Client) -> None:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == json.loads(SPEC_BYTES)
    assert len(response.content) < 0.7 * len(SPEC_BYTES)  # without the file's indentation


@dataclass(frozen=True)
class Case:
    """A simple request for one operation, on a fresh queue holding one message."""

    op_id: str
    expected: int
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    fresh: bool = False  # the queue must not exist yet
    lease: bool = False  # lease the message first (for the receipt)


SETUP_HEADERS = {"Content-Encoding": "identity", "X-Group": "g1", "X-Attr-Colour": "blue"}
MULTIPART = (
    b"--XYZ\r\nContent-Type: text/plain\r\nX-Attr-N: 1\r\n\r\none\r\n"
    b"--XYZ\r\nX-Delay: 1h\r\nX-Group: g\r\n\r\ntwo\r\n--XYZ--\r\n"
)
MULTIPART_EMPTY_TYPE = b"--B\r\nContent-Type: \r\n\r\nplain\r\n--B--\r\n"
JSON_LINE_EMPTY_TYPE = b'{"body": "plain", "headers": {"Content-Type": " "}}\n'
CASES = [
    Case("health", 200),
    Case("metrics", 200),
    Case("openapi", 200),
    Case("listQueues", 200, params={"prefix": "oa/"}),
    Case("getQueue", 200),
    Case("putQueue", 201, body=b'{"visibility_timeout_s": 5, "max_receives": 3}', fresh=True),
    Case("putQueue", 200, body=b'{"delay_s": 0.5}'),
    Case("putQueue", 200),
    Case("deleteQueue", 204),
    Case(
        "publish",
        201,
        params={"delay": "1s", "durability": "writeback"},
        headers={"Content-Type": "text/plain", "X-Dedup-Id": "d1", "X-Group": "g2"},
        body=b"hello",
    ),
    Case("publish", 201, headers={"Content-Type": "multipart/mixed; boundary=XYZ"}, body=MULTIPART),
    Case(
        "publish",
        201,
        headers={"Content-Type": "application/x-ndjson"},
        body=b'{"body": "a", "group": "g"}\n'
        b'{"body_base64": "AAE=", "headers": {"X-Attr-K": "v"}, "delay": 0.5}\n',
    ),
    Case("receive", 200, params={"visibility": "30s"}),
    Case("receive", 200, params={"max": "10", "wait": "0"}),
    Case("receive", 200, params={"peek": "1", "max": "5"}),
    Case("receive", 204, params={"wait": "10ms"}, lease=True),
    Case("purge", 200),
    Case("peekMessage", 200),
    Case("deleteMessage", 204),
    Case("deleteMessage", 204, lease=True),
    Case("nack", 204, params={"delay": "100ms"}, lease=True),
    Case("extend", 204, params={"visibility": "1m"}, lease=True),
    Case("deadLetter", 204, lease=True),
    Case("deadLetter", 204, params={"reason": "bad sku", "kind": "unreadable"}, lease=True),
    Case("receive", 200, params={"peek": "1", "state": "dead"}),
    Case("purge", 200, params={"state": "dead"}),
    Case("startRedrive", 202, body=b'{"reason": "rejected", "rate_per_s": 100}'),
    Case("startRedrive", 400, body=b'{"ids": ["nonsense"]}'),
    Case("listRedrives", 200),
    Case("getRedrive", 404),
    Case("cancelRedrive", 404),
    Case("ackMany", 200, body=b'{"receipts": ["%s.1", "nonsense"]}' % SOME_ID.encode()),
    Case("nackMany", 200, body=b'{"receipts": ["%s.1"], "delay": "1s"}' % SOME_ID.encode()),
    Case("extendMany", 200, body=b'{"receipts": [], "visibility": 30}'),
    Case("extendMany", 400, body=b'{"receipts": []}'),
    Case("pubsubStats", 200),
    Case(
        "pubsubPublish",
        201,
        params={"channel": "oa", "subject": "s", "mode": "future", "acks": "queued"}
        | {"reply_to": "oa/replies", "accept_timeout": "1m", "process_timeout": "30s"}
        | {"persistence": "writeback"},
        headers={"Content-Type": "text/plain", "X-Attr-K": "v"},
        body=b"hello",
    ),
    Case("pubsubPublish", 400, params={"channel": "oa", "mode": "sometimes"}),
    Case("pubsubSubscribe", 400, params={"window": "0"}),  # 200 (a stream): see below
    Case("pubsubSubscriptions", 200),
    Case("pubsubDeleteSubscription", 404),
    Case("pubsubSettle", 404),
    Case("pubsubRetained", 200, params={"from": "1", "limit": "10", "channel": "oa"}),
    Case("pubsubRetained", 400, params={"limit": "0"}),
    Case("pubsubRetainedHead", 200),
    Case("consoleSamples", 200),
    Case("consoleSamples", 404, params={"queue": "oa/never-made"}),
    Case("consoleSamples", 400, params={"queue": "oa//q"}),
    Case("consoleSamplesHead", 200),
    Case("consoleRates", 200),
    Case("consoleRates", 200, params={"prefix": "oa/"}),
    Case("consoleRates", 400, params={"queue": "oa"}),
    Case("consoleRatesHead", 200),
    Case("listSchedules", 200),
    Case("getSchedule", 404),
    Case("putSchedule", 404, body=b'{"queue": "oa-never-made", "every_s": 60}'),
    Case("putSchedule", 400, body=b'{"queue": "oa", "every_s": 60, "missed": "twice"}'),
    Case("deleteSchedule", 404),
]


def test_cases_cover_every_operation() -> None:
    assert {c.op_id for c in CASES} == {o.op_id for o in operations()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op_id}-{c.expected}")
def test_operation_answers_a_documented_status(http: httpx.Client, case: Case) -> None:
    (operation,) = [o for o in operations() if o.op_id == case.op_id]
    has_queue = "{queue}" in operation.path  # `/metrics?queue=` names one but makes none
    queue = f"oa/{case.op_id}"
    message_id = receipt = SOME_ID
    try:
        if has_queue and not case.fresh:
            assert http.put(f"/{queue}").status_code == 201
            published = http.post(f"/{queue}/messages", content=b"hello", headers=SETUP_HEADERS)
            message_id = published.headers["X-Message-Id"]
            if case.lease:
                receipt = http.get(f"/{queue}/messages").headers["X-Receipt"]
        response = http.request(
            operation.method.upper(),
            fill(operation.path, queue, ref=receipt if case.lease else message_id, receipt=receipt),
            params=case.params,
            headers=case.headers,
            content=case.body or None,
        )
        check_documented(operation, response)
        assert response.status_code == case.expected, response.text
        if (
            case.op_id == "receive"
            and case.expected == 200
            and not {"max", "peek"} & set(case.params)
        ):
            documented = resolve(operation.spec["responses"]["200"])["headers"]
            # Every header but a dead letter's provenance (this message never died) and the
            # priority (absent at level 0, as documented).
            missing = [h for h in documented if h not in response.headers]
            assert [h for h in missing if not h.startswith("X-Dead-") and h != "X-Priority"] == []
    finally:
        if has_queue:
            http.delete(f"/{queue}")


@pytest.mark.parametrize(
    "operation",
    [o for o in operations() if "{queue}" in o.path],
    ids=lambda o: o.op_id,
)
def test_missing_queue_answers_a_documented_status(
    http: httpx.Client, operation: Operation
) -> None:
    try:
        response = http.request(operation.method.upper(), fill(operation.path, MISSING_QUEUE))
        check_documented(operation, response)
        expected = 201 if operation.op_id == "putQueue" else 404
        assert response.status_code == expected, response.text
    finally:
        http.delete(f"/{MISSING_QUEUE}")


@pytest.mark.parametrize("path", list(SPEC["paths"]))
def test_undocumented_methods_get_405(http: httpx.Client, path: str) -> None:
    documented = {m.upper() for m in HTTP_METHODS if m in SPEC["paths"][path]}
    allowed = resolve({"$ref": "#/components/responses/MethodNotAllowed"})
    filled = fill(path, MISSING_QUEUE)
    is_server_path = kind_of(filled) == "server"
    for method in ("GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"):
        if method in documented:
            continue
        response = http.request(method, filled)
        assert response.status_code == 405, f"{method} {path}: {response.text}"
        body = response.json()
        assert set(body) == {"error", "message"} and body["error"] == "MethodNotAllowed"
        if not is_server_path:  # the server's own paths send no Allow header (yet)
            assert response.headers["allow"] == ", ".join(sorted(documented))
            assert "Allow" in allowed["headers"]


def test_pubsub_stream_and_duplicate_answer_documented_statuses(http: httpx.Client) -> None:
    (subscribe,) = [o for o in operations() if o.op_id == "pubsubSubscribe"]
    (publish,) = [o for o in operations() if o.op_id == "pubsubPublish"]
    with http.stream("GET", "/@pubsub/subscribe", params={"name": "oa-stream"}) as stream:
        assert stream.status_code == 200
        media_type = stream.headers["content-type"]
        assert media_type in resolve(subscribe.spec["responses"]["200"])["content"]
        busy = http.get("/@pubsub/subscribe", params={"name": "oa-stream"})
        check_documented(subscribe, busy)
        assert busy.status_code == 409
    params = {"channel": "oa", "id": "oa-once"}
    check_documented(publish, http.post("/@pubsub/publish", params=params))
    duplicate = http.post("/@pubsub/publish", params=params)
    check_documented(publish, duplicate)
    assert duplicate.status_code == 409


@pytest.mark.parametrize(
    "publish",
    [
        {"headers": {"Content-Type": ""}, "content": b"plain"},
        {
            "headers": {"Content-Type": "multipart/mixed; boundary=B"},
            "content": MULTIPART_EMPTY_TYPE,
        },
        {"headers": {"Content-Type": "application/x-ndjson"}, "content": JSON_LINE_EMPTY_TYPE},
    ],
    ids=["single", "multipart", "json-lines"],
)
def test_an_empty_content_type_is_not_stored(http: httpx.Client, publish: dict[str, Any]) -> None:
    """An empty Content-Type is no media type: delivering it back would be a malformed header
    (schemathesis found it), so it is stored as no Content-Type at all (found by the fuzzer)."""
    queue = "oa/empty-type"
    try:
        assert http.put(f"/{queue}").status_code == 201
        assert http.post(f"/{queue}/messages", **publish).status_code == 201
        delivered = http.get(f"/{queue}/messages")
        assert delivered.status_code == 200 and delivered.content == b"plain"
        assert "content-type" not in delivered.headers
        peeked = http.get(f"/{queue}/messages/{delivered.headers['X-Message-Id']}")
        assert "content-type" not in peeked.headers
    finally:
        http.delete(f"/{queue}")


def _parameter_description(name: str) -> str:
    return str(SPEC["components"]["parameters"][name]["description"])


def test_batch_level_parameters_do_what_the_document_says(http: httpx.Client) -> None:
    """The document once said `delay`, `dedup` and `group` were ignored for batches, while the
    server applied the first and last to every line and refused the second: no fuzzer catches
    a wrong description whose statuses are all documented, so this holds the words to the code."""
    assert "every part or line that does not set its own" in _parameter_description("delay")
    assert "every part or line that does not set its own" in _parameter_description("group")
    assert "on a batch it is a 400" in _parameter_description("dedup")
    queue = "oa/batch-params"
    lines = b'{"body": "a"}\n{"body": "b", "delay": "0s"}\n'
    ndjson = {"Content-Type": "application/x-ndjson"}
    try:
        assert http.put(f"/{queue}").status_code == 201
        delayed = http.post(f"/{queue}/messages?delay=1h", content=lines, headers=ndjson)
        assert delayed.status_code == 201, delayed.text
        stats = http.get(f"/{queue}").json()["stats"]
        assert (stats["delayed"], stats["ready"]) == (1, 1), stats  # the line's own delay wins
        refused = http.post(f"/{queue}/messages?dedup=x", content=lines, headers=ndjson)
        assert refused.status_code == 400 and refused.json()["error"] == "InvalidArgument"
        assert http.get(f"/{queue}").json()["stats"]["ready"] == 1  # nothing stored
        assert http.delete(f"/{queue}/messages").status_code == 200  # purge
        grouped = http.post(
            f"/{queue}/messages?group=g", content=b'{"body": "c"}\n', headers=ndjson
        )
        assert grouped.status_code == 201, grouped.text
        delivered = http.get(f"/{queue}/messages")
        assert delivered.status_code == 200 and delivered.headers.get("X-Group") == "g"
    finally:
        http.delete(f"/{queue}")


def test_the_documented_header_limit_is_the_stores() -> None:
    publish = SPEC["paths"]["/{queue}/messages"]["post"]["requestBody"]["description"]
    assert f"at most {MAX_HEADER_BYTES // (1024 * 1024)} MiB" in publish


def test_a_ref_naming_a_batch_path_is_a_documented_405(http: httpx.Client) -> None:
    """`/{queue}/messages/ack` (and nack, extend) is the batch settle path, POST only: what a GET
    or DELETE of `{ref}` spelled so answers is documented there too."""
    for op_id in ("peekMessage", "deleteMessage"):
        (operation,) = [o for o in operations() if o.op_id == op_id]
        for ref in ("ack", "nack", "extend"):
            response = http.request(
                operation.method.upper(), fill(operation.path, MISSING_QUEUE, ref=ref)
            )
            check_documented(operation, response)
            assert response.status_code == 405 and response.headers["allow"] == "POST"


def test_a_schedule_s_answers_are_documented(http: httpx.Client) -> None:
    """The schedule operations' answers on success (CASES cannot make the queue a body names)."""
    by_id = {o.op_id: o for o in operations()}
    queue, path = "oa/scheduled", "/@schedules/oa-beat"
    spec = {"queue": queue, "cron": "0 3 * * *", "timezone": "Europe/Berlin", "body": "b"}
    assert http.put(f"/{queue}").status_code == 201
    try:
        for op_id, method, url, status in (
            ("putSchedule", "PUT", path, 201),
            ("putSchedule", "PUT", path, 200),
            ("getSchedule", "GET", path, 200),
            ("listSchedules", "GET", "/@schedules", 200),
            ("deleteSchedule", "DELETE", path, 204),
        ):
            body = json.dumps(spec).encode() if method == "PUT" else None
            response = http.request(method, url, content=body)
            check_documented(by_id[op_id], response)
            assert response.status_code == status, response.text
    finally:
        http.delete(path)
        http.delete(f"/{queue}")
