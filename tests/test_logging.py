"""The server's log: a line per request from every door (text and JSON), start-up and shutdown,
quarantined files, expired leases and sweeps that moved something, authentication failures
rate-limited; `--log-level`, `--log-file`, `--access-log off`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from dirmq.server.access_log import AccessLog, AuthFailureLog
from dirmq.server.contract import Request
from dirmq.server.dialect import observe_all
from dirmq.server.logs import (
    FLUSH_AFTER_S,
    BatchHandler,
    JsonFormatter,
    TextFormatter,
    fields,
    logfmt,
)

from .support.servers import REPO, ServerProcess, sqs_client, start_server

_TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) (\S+) (.*)"
)
_FIELD = re.compile(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)')
_FIELDS_AT_END = re.compile(r'(?: \w+=(?:"(?:[^"\\]|\\.)*"|\S+))*$')


def _text_value(raw: str) -> object:
    if raw.startswith('"'):
        return json.loads(raw)
    if raw == "-":
        return ""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def parse_log(output: str) -> list[dict[str, Any]]:
    """The log records in a server's output (text or JSON lines; stdout's lines skipped), as
    {level, logger, message, **fields}; text's `-` read as the empty string."""
    records: list[dict[str, Any]] = []
    for line in output.splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
            continue
        found = _TEXT_LINE.fullmatch(line)
        if found is None:
            continue
        level, logger, rest = found.groups()
        tail = _FIELDS_AT_END.search(" " + rest)
        assert tail is not None
        message = (" " + rest)[: tail.start()].strip()
        fields = {k: _text_value(v) for k, v in _FIELD.findall(tail.group(0))}
        records.append({"level": level, "logger": logger, "message": message, **fields})
    return records


def _one(records: list[dict[str, Any]], **match: object) -> dict[str, Any]:
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found or records)
    return found[0]


ACCESS_FIELDS = {
    "door",
    "method",
    "path",
    "route",
    "queue",
    "status",
    "bytes",
    "duration_ms",
    "principal",
    "peer",
}


def _exercise_every_door(server: ServerProcess) -> None:
    assert server.yaq_url is not None
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put("/orders").status_code == 201
        assert http.post("/orders/messages", content=b"hello").status_code == 201
        assert http.get("/nope/messages").status_code == 404
        published = http.post("/@pubsub/publish", params={"channel": "news"}, content=b"hi")
        assert published.status_code < 300, published.text
    sqs = sqs_client(server.url)
    url = sqs.get_queue_url(QueueName="orders")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="from sqs")
    assert httpx.post(server.yaq_url + "/orders", content=b"yaq", timeout=30).status_code < 300


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_line_per_request_from_every_door_and_start_up_and_shutdown(
    tmp_path: Path, log_format: str
) -> None:
    server = start_server(
        tmp_path / "root", "--log-format", log_format, "--access-log", "on", yaq=True
    )
    try:
        _exercise_every_door(server)
    finally:
        assert server.stop() == 0
    records = parse_log(server.output)
    access = [r for r in records if r["logger"] == "dirmq.access"]
    assert all(r["level"] == "INFO" and set(r) >= ACCESS_FIELDS for r in access), access
    assert all(r["peer"] == "127.0.0.1" and r["principal"] == "" for r in access)
    assert all(isinstance(r["duration_ms"], int | float) and r["duration_ms"] >= 0 for r in access)
    native = _one(access, door="native", method="POST", path="/orders/messages")
    assert native["route"] == "messages" and native["queue"] == "orders"
    assert native["status"] == 201 and native["bytes"] == 39  # {"id":"<29 characters>"}\n
    missing = _one(access, door="native", status=404)
    assert missing["queue"] == "nope" and missing["bytes"] > 0
    sent = _one(access, door="sqs", route="SendMessage")
    assert sent["queue"] == "orders" and sent["status"] == 200 and sent["method"] == "POST"
    assert _one(access, door="sqs", route="GetQueueUrl")["queue"] == "orders"
    yaq = _one(access, door="yaq")
    assert (yaq["method"], yaq["route"], yaq["queue"]) == ("POST", "enqueue", "orders")
    pubsub = _one(access, door="pubsub")
    assert pubsub["method"] == "POST" and pubsub["route"] == "publish"
    assert pubsub["queue"] == "" and pubsub["status"] < 300  # a publish names a channel
    assert len(access) == 7  # nothing else, nothing twice

    started = _one(records, logger="dirmq.server", message="started")
    assert started["native_url"] == server.url and started["yaq_url"] == server.yaq_url
    assert started["root"] == str(tmp_path / "root") and started["workers"] == 1
    assert started["pid"] == server.proc.pid and started["version"]
    draining = _one(records, logger="dirmq.server", message="draining")
    assert draining["drain_timeout_s"] == 10
    assert _one(records, logger="dirmq.server", message="drained")["cut"] == 0
    assert _one(records, logger="dirmq.server", message="stopped")["status"] == 0
    # The lines tests and scripts parse are still on stdout, as they were.
    assert f"dirmq native API listening on {server.url}\n" in server.output


def test_a_quarantined_file_expired_leases_and_a_pubsub_timeout_are_logged(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    log_file = tmp_path / "dirmq.log"
    server = start_server(root, "--log-format", "json", "--log-file", str(log_file))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.put("/damaged").status_code == 201
            message_id = http.post("/damaged/messages", content=b"hello").json()["id"]
            (path,) = (root / "damaged" / "@ready").glob(message_id + "*")
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF  # the body no longer matches its checksum
            path.write_bytes(bytes(data))
            assert http.get("/damaged/messages").status_code == 204  # set aside, not delivered

            assert http.put("/leases").status_code == 201
            assert http.post("/leases/messages", content=b"once").status_code == 201
            assert http.get("/leases/messages", params={"visibility": "0.1"}).status_code == 200
            time.sleep(0.2)
            assert http.get("/leases/messages").status_code == 200  # the lease came back

            params = {"channel": "nobody-listens", "mode": "anyone", "accept_timeout": "0.1"}
            assert http.post("/@pubsub/publish", params=params, content=b"x").status_code < 300
            deadline = time.monotonic() + 10
            while "pub/sub swept" not in log_file.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        assert server.stop() == 0
    assert '"logger"' not in server.output  # the log went to the file alone
    records = parse_log(log_file.read_text())
    corrupt = _one(records, logger="dirmq.store.files", level="WARNING")
    assert corrupt["queue"] == "damaged" and corrupt["file"].startswith(f"@corrupt/{message_id}")
    assert (root / "damaged" / corrupt["file"]).is_file()
    assert "does not decode" in corrupt["message"]
    returned = _one(records, logger="dirmq.store.files", level="INFO")
    assert (returned["queue"], returned["requeued"], returned["dead"]) == ("leases", 1, 0)
    swept = [
        r for r in records if r["logger"] == "dirmq.pubsub" and r["message"] == "pub/sub swept"
    ]
    assert swept and swept[0]["timed_out"] == 1, records


def test_a_drain_that_times_out_says_what_it_cut(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root", "--drain-timeout", "0.3", "--log-format", "json")
    host, port = server.url.removeprefix("http://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=30) as slow,
        socket.create_connection((host, int(port)), timeout=30),
    ):  # the second is idle: closed at once, not cut
        slow.sendall(b"POST /q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n1")
        assert server.wait_for(lambda line: False, timeout_s=0.2) == []
        assert server.stop() == 0
    records = parse_log(server.output)
    assert _one(records, message="draining")["connections"] == 2
    cut = _one(records, logger="dirmq.server", level="WARNING")
    assert cut["message"] == "drain timed out: 1 connections cut mid-request"
    assert cut["cut"] == 1 and cut["seconds"] >= 0.3


def test_level_warning_and_access_log_off_leave_the_request_lines_out(tmp_path: Path) -> None:
    for flags in (["--log-level", "warning", "--access-log", "on"], ["--access-log", "off"], []):
        server = start_server(tmp_path / "root", *flags)
        try:
            assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        finally:
            assert server.stop() == 0
        records = parse_log(server.output)
        assert not [r for r in records if r["logger"] == "dirmq.access"], flags
        started = [r for r in records if r.get("message") == "started"]
        assert len(started) == (0 if "warning" in flags else 1), flags


def test_workers_log_each_in_their_own_lines(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "root", "--workers", "2", "--log-format", "json", "--access-log", "on"
    )
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for _ in range(20):
                assert http.get("/health", headers={"Connection": "close"}).status_code == 200
    finally:
        assert server.stop() == 0
    records = parse_log(server.output)  # every line whole: the workers share one pipe
    assert len([r for r in records if r["logger"] == "dirmq.access"]) == 20
    serving = [r for r in records if r["message"].endswith(" serving")]
    assert sorted(r["worker"] for r in serving) == [0, 1]
    assert len({r["pid"] for r in serving} | {server.proc.pid}) == 3
    assert len([r for r in records if r["message"] == "drained"]) == 2
    assert _one(records, message="stopped")["pid"] == server.proc.pid


# -- authentication failures, rate-limited ---------------------------------------------------
def test_failed_sigv4_requests_are_logged_once_per_peer_and_window(tmp_path: Path) -> None:
    """Today's one door with authentication: SQS with --sqs-credentials (403s). Five failures
    from one client make one line; the other four are reported when the minute ends."""
    credentials = tmp_path / "credentials"
    credentials.write_text("AKIDRIGHT right-secret\n")
    server = start_server(
        tmp_path / "root", "--sqs-credentials", str(credentials), "--access-log", "on"
    )
    try:
        sqs = sqs_client(server.url)  # signs with the key id "test": unknown here
        for _ in range(5):
            with pytest.raises(ClientError):
                sqs.list_queues()
    finally:
        assert server.stop() == 0
    records = parse_log(server.output)
    denied = [r for r in records if r["logger"] == "dirmq.auth"]
    assert len(denied) == 1, denied
    assert denied[0]["level"] == "WARNING" and denied[0]["status"] == 403
    assert (denied[0]["door"], denied[0]["peer"], denied[0]["kind"]) == (
        "sqs",
        "127.0.0.1",
        "forbidden",
    )
    assert len([r for r in records if r["logger"] == "dirmq.access" and r["status"] == 403]) == 5


def test_refusals_are_logged_rate_limited_and_the_access_log_names_the_principal(
    tmp_path: Path,
) -> None:
    token = "dmq_logging-test-token-0123456789"
    credentials = tmp_path / "credentials.toml"
    digest = hashlib.sha256(token.encode()).hexdigest()
    credentials.write_text(f'[principals.app]\ntoken_sha256 = "{digest}"\nread = ["orders/*"]\n')
    credentials.chmod(0o600)
    server = start_server(
        tmp_path / "root",
        "--credentials",
        str(credentials),
        "--log-format",
        "json",
        "--access-log",
        "on",
    )
    bearer = {"Authorization": f"Bearer {token}"}
    try:
        for _ in range(5):  # one line for all five: the same peer, the same kind of refusal
            assert httpx.get(server.url + "/", timeout=30).status_code == 401
        denied = httpx.post(server.url + "/orders/a/messages", content=b"x", headers=bearer)
        assert denied.status_code == 403
        listed = httpx.get(server.url + "/", headers=bearer, timeout=30)
        assert listed.status_code == 200
    finally:
        assert server.stop() == 0
    records = parse_log(server.output)
    refused = [r for r in records if r["logger"] == "dirmq.auth"]
    assert [(r["status"], r["door"]) for r in refused] == [(401, "native"), (403, "native")]
    assert refused[1]["principal"] == "app" and refused[1]["queue"] == "orders/a"
    access = [r for r in records if r["logger"] == "dirmq.access"]
    assert [(r["method"], r["status"], r["principal"]) for r in access] == [
        *[("GET", 401, "")] * 5,
        ("POST", 403, "app"),
        ("GET", 200, "app"),
    ]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _request(peer: str, status_path: str = "/orders/messages") -> Request:
    return Request("GET", status_path, {}, {}, b"", True, door="native", queue="orders", peer=peer)


def _auth_log(window_s: float, now: list[float]) -> tuple[AuthFailureLog, _Records]:
    logger = logging.getLogger(f"test.auth.{id(now)}")
    logger.propagate = False
    handler = _Records()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return AuthFailureLog(window_s, logger, clock=lambda: now[0]), handler


def test_the_rate_limiter_counts_per_peer_and_kind_and_reports_the_rest() -> None:
    now = [100.0]
    auth, seen = _auth_log(60, now)
    for _ in range(4):
        auth(_request("10.0.0.1"), 401, 0, 0.001)
    auth(_request("10.0.0.1"), 403, 0, 0.001)  # another kind: a line of its own
    auth(_request("10.0.0.2"), 401, 0, 0.001)  # another peer: a line of its own
    auth(_request("10.0.0.1"), 200, 0, 0.001)  # not a failure
    auth(_request("10.0.0.1"), 404, 0, 0.001)
    lines = [(r.getMessage(), r.fields["peer"], r.fields["status"]) for r in seen.records]  # type: ignore[attr-defined]
    assert lines == [
        ("authentication failed", "10.0.0.1", 401),
        ("access denied", "10.0.0.1", 403),
        ("authentication failed", "10.0.0.2", 401),
    ]
    now[0] += 30
    auth.flush()  # the window has not ended: nothing yet
    assert len(seen.records) == 3
    now[0] += 31
    auth(_request("10.0.0.1"), 401, 0, 0.001)  # the next failure reports the window before
    summary, again = seen.records[3:]
    assert summary.getMessage() == "3 more unauthenticated failures from 10.0.0.1 in 60 s"
    assert summary.fields == {  # type: ignore[attr-defined]
        "kind": "unauthenticated",
        "status": 401,
        "peer": "10.0.0.1",
        "suppressed": 3,
    }
    assert again.getMessage() == "authentication failed"
    now[0] += 61
    auth.flush()  # ended windows with nothing suppressed: forgotten, no line
    assert len(seen.records) == 5
    assert auth._windows == {}


def test_the_rate_limiter_reports_a_burst_when_its_window_ends_without_more() -> None:
    async def burst() -> list[logging.LogRecord]:
        auth, seen = _auth_log(0.05, [0.0])
        auth._clock = time.monotonic
        for _ in range(10):
            auth(_request("10.0.0.9"), 401, 0, 0.001)
        await asyncio.sleep(0.2)
        return seen.records

    records = asyncio.run(burst())
    assert [r.getMessage() for r in records] == [
        "authentication failed",
        "9 more unauthenticated failures from 10.0.0.9 in 0 s",
    ]


# -- formats and observers in process ---------------------------------------------------------
def _access_record(request: Request) -> logging.LogRecord:
    logger = logging.getLogger("test.access")
    logger.propagate = False
    handler = _Records()
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    AccessLog(logger)(request, 201, 39, 0.000842)
    (record,) = handler.records
    return record


def test_text_and_json_lines_carry_the_same_fields() -> None:
    request = _request("10.1.2.3", '/odd path/"quoted"=x')
    record = _access_record(request)
    text = TextFormatter().format(record)
    assert text.count("\n") == 0
    assert text.endswith(
        ' request door=native method=GET path="/odd path/\\"quoted\\"=x" route=- queue=orders'
        " status=201 bytes=39 duration_ms=0.842 principal=- peer=10.1.2.3"
    )
    (parsed,) = parse_log(text)
    doc = json.loads(JsonFormatter().format(record))
    assert {k: v for k, v in parsed.items() if k != "level"} == {
        k: v for k, v in doc.items() if k not in {"time", "level", "pid"}
    }
    assert doc["path"] == '/odd path/"quoted"=x' and doc["route"] == ""


def test_logfmt_keeps_a_line_one_line() -> None:
    assert logfmt({"a": "x\ny", "b": "é", "c": None, "d": 1.5, "e": True}) == (
        'a="x\\ny" b="\\u00e9" c=- d=1.5 e=True'
    )


def test_combined_observers_each_see_every_request_even_if_one_fails() -> None:
    seen: list[str] = []

    def failing(request: Request, status: int, sent: int, seconds: float) -> None:
        raise RuntimeError("an observer's bug")

    def counting(request: Request, status: int, sent: int, seconds: float) -> None:
        seen.append(request.path)

    assert observe_all(None, None) is None
    assert observe_all(counting, None) is counting
    both = observe_all(failing, counting)
    assert both is not None
    logging.getLogger("dirmq.server").disabled = True  # the failure is logged; not here
    try:
        both(_request("x", "/a"), 200, 0, 0.0)
        both(_request("x", "/b"), 200, 0, 0.0)
    finally:
        logging.getLogger("dirmq.server").disabled = False
    assert seen == ["/a", "/b"]


def test_the_documented_sample_lines_have_the_real_fields() -> None:
    """docs/operations.md shows an access line as text and as JSON: they carry exactly the
    fields a real line does."""
    text = (REPO / "docs" / "operations.md").read_text()
    (sample_text,) = [ln for ln in text.splitlines() if " INFO dirmq.access request " in ln]
    (sample_json,) = [ln for ln in text.splitlines() if ln.startswith('{"time"')]
    real = _access_record(_request("10.0.0.7"))
    (from_text,) = parse_log(sample_text)
    assert set(from_text) - {"level", "logger", "message"} == ACCESS_FIELDS
    assert set(json.loads(sample_json)) == set(json.loads(JsonFormatter().format(real)))


def test_info_lines_wait_a_moment_a_warning_goes_at_once_and_a_moved_file_is_reopened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "dirmq.log"
    handler = BatchHandler(str(path))
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("test.batch")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)

    async def main() -> None:
        logger.info("first", extra=fields(n=1))
        logger.info("second")
        assert path.read_text() == ""  # waiting for the flush
        await asyncio.sleep(FLUSH_AFTER_S + 0.1)
        assert [line.split(" ", 3)[3] for line in path.read_text().splitlines()] == [
            "first n=1",
            "second",
        ]
        path.rename(tmp_path / "dirmq.log.1")  # logrotate
        logger.info("third")
        logger.warning("a warning: %s", "now")  # written at once, after what waited
        assert [line.split(" ", 3)[3] for line in path.read_text().splitlines()] == [
            "third",
            "a warning: now",
        ]

    try:
        asyncio.run(main())
        logger.info("outside an event loop: at once")
        assert path.read_text().endswith(" outside an event loop: at once\n")
    finally:
        handler.close()
    assert len((tmp_path / "dirmq.log.1").read_text().splitlines()) == 2
