"""Bounds live in the store (issue 15, defect 1): every duration, count and size that ends up in a
file name is checked where the store accepts it, so no door can make a name `fsck` rejects; each
door answers a refusal in its own words (InvalidArgument/ConfigError, exit 2, 400, SQS
InvalidParameterValue) and nothing is lost."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from dirmq import ConfigError, InvalidArgument, QueueConfig, Store
from dirmq.store import bounds, codec, layout
from dirmq.store.fsck import fsck
from dirmq.store.ids import new_id
from dirmq.store.message import OutgoingMessage
from dirmq.store.queue import Queue

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess, sqs_client

# The reproductions of the defect (1e12, 1e13, 1e300, 2.26e307: 2.26e307 * 1000 overflows to
# inf) and the other values no duration may take.
OUT_OF_BOUNDS_SECONDS: list[Any] = [
    1e12,
    1e13,
    1e300,
    2.26e307,
    math.inf,
    -math.inf,
    math.nan,
    -1,
    -0.001,
    True,
    10**400,  # no float holds it: compared, never converted
    "5",
]
JUST_OVER_S = bounds.MAX_DURATION_S + 0.001


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "root") as s:
        yield s


@pytest.fixture
def queue(store: Store) -> Queue:
    return store.create_queue("q")


def assert_clean(store: Store) -> None:
    report = fsck(store.root, repair=False)
    assert report.ok, [(p.kind, p.detail) for p in report.problems]
    assert report.problems == ()


# -- the library ---------------------------------------------------------------------------------


def _operations(queue: Queue) -> dict[str, Callable[[Any], object]]:
    """Each store call that takes a duration, given the duration (the queue holds messages)."""

    def extend(value: Any) -> None:
        message = queue.get_one(visibility_s=30)
        assert message is not None
        try:
            queue.extend(message.receipt, value)
        finally:
            queue.nack(message.receipt)

    def nack(value: Any) -> None:
        message = queue.get_one(visibility_s=30)
        assert message is not None
        try:
            queue.nack(message.receipt, delay_s=value)
        except InvalidArgument:
            queue.nack(message.receipt)  # give it back: the test looks for it
            raise

    return {
        "put": lambda v: queue.put(b"x", delay_s=v),
        "put_many": lambda v: queue.put_many([OutgoingMessage(b"x", delay_s=v)]),
        "validate": lambda v: queue.validate(OutgoingMessage(b"x", delay_s=v)),
        "get.visibility_s": lambda v: queue.get(visibility_s=v),
        "get.wait_s": lambda v: queue.get(wait_s=v),
        "get_one": lambda v: queue.get_one(visibility_s=v),
        "claim_named": lambda v: queue.claim_named(queue.ready_names(1), visibility_s=v),
        "lease_named": lambda v: queue.lease_named(queue.ready_names(1), visibility_s=v),
        "extend": extend,
        "nack": nack,
    }


OPERATIONS = [
    "put",
    "put_many",
    "validate",
    "get.visibility_s",
    "get.wait_s",
    "get_one",
    "claim_named",
    "lease_named",
    "extend",
    "nack",
]


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("value", OUT_OF_BOUNDS_SECONDS, ids=lambda v: repr(v)[:12])
def test_every_store_call_refuses_a_duration_out_of_bounds(
    store: Store, queue: Queue, operation: str, value: Any
) -> None:
    ids = [queue.put(b"one"), queue.put(b"two")]
    with pytest.raises(InvalidArgument) as refused:
        _operations(queue)[operation](value)
    assert "_s must be" in str(refused.value)  # names the parameter and its bounds
    # Nothing lost, nothing stuck: both messages come back, in order, and the names are sound.
    assert queue.stats().ready == 2
    got = queue.get(2, visibility_s=30)
    assert [m.id for m in got] == ids
    assert_clean(store)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_the_bound_itself_is_accepted_and_makes_a_sound_name(
    store: Store, queue: Queue, operation: str
) -> None:
    queue.put(b"one")
    queue.put(b"two")
    value = 0.001 if operation == "get.wait_s" else bounds.MAX_DURATION_S
    _operations(queue)[operation](value)
    assert_clean(store)
    stats = queue.stats()
    assert stats.ready + stats.in_flight + stats.delayed >= 2


def test_just_over_the_bound_is_refused(queue: Queue) -> None:
    with pytest.raises(InvalidArgument, match="a year"):
        queue.put(b"x", delay_s=JUST_OVER_S)
    with pytest.raises(InvalidArgument, match="visibility_s"):
        queue.get(visibility_s=JUST_OVER_S)


DURATION_FIELDS = [
    "visibility_timeout_s",
    "delay_s",
    "writeback_delay_s",
    "dedup_window_s",
    "retention_s",
]


@pytest.mark.parametrize("name", DURATION_FIELDS)
@pytest.mark.parametrize("value", OUT_OF_BOUNDS_SECONDS, ids=lambda v: repr(v)[:12])
def test_queue_config_refuses_every_duration_out_of_bounds(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        QueueConfig(**{name: value})
    with pytest.raises(ConfigError, match=name):
        QueueConfig().updated(**{name: value})
    with pytest.raises(ConfigError, match=name):
        QueueConfig.from_json({name: value})


@pytest.mark.parametrize("name", DURATION_FIELDS)
def test_queue_config_accepts_a_year(name: str) -> None:
    assert getattr(QueueConfig(**{name: bounds.MAX_DURATION_S}), name) == bounds.MAX_DURATION_S


COUNT_FIELDS = {
    "max_receives": bounds.MAX_RECEIVE_COUNT,
    "capacity": bounds.MAX_CAPACITY,
    "max_message_bytes": bounds.MAX_MESSAGE_BYTES,
    "peers": bounds.MAX_PEERS,
}


@pytest.mark.parametrize(("name", "maximum"), COUNT_FIELDS.items())
def test_queue_config_counts_have_upper_bounds(name: str, maximum: int) -> None:
    assert getattr(QueueConfig(**{name: maximum}), name) == maximum
    for bad in (maximum + 1, 10**400, 1e300, math.inf, math.nan, True, -1, 2.5):
        with pytest.raises(ConfigError, match=name):
            QueueConfig(**{name: bad})


def test_a_stored_configuration_out_of_bounds_is_reported_not_used(store: Store) -> None:
    """A config written by an older version with the defect's values: CorruptConfig (500, exit
    6: not a silent use of it), which fsck reports and repairs."""
    store.create_queue("old")
    path = Path(store.root) / "old" / layout.CONFIG_FILE
    path.write_text('{"visibility_timeout_s": 1e13}')
    with Store(store.root) as fresh, pytest.raises(ConfigError, match="visibility_timeout_s"):
        fresh.queue("old")
    assert not fsck(store.root, repair=False).ok
    stats = dirmq(Path(store.root), "stats", "old")
    assert stats.returncode == 6, stats.stderr  # the stored file is bad, not the arguments
    assert "visibility_timeout_s" in stats.stderr.decode()
    assert dirmq(Path(store.root), "fsck", "--repair").returncode == 0
    assert dirmq(Path(store.root), "stats", "old").returncode == 0


def test_configure_refuses_and_keeps_the_old_configuration(store: Store, queue: Queue) -> None:
    with pytest.raises(ConfigError, match="visibility_timeout_s"):
        store.configure("q", visibility_timeout_s=1e13)
    with pytest.raises(ConfigError, match="retention_s"):
        store.configure("q", retention_s=1e300)
    assert store.queue("q").config == QueueConfig()


def test_a_default_visibility_at_the_bound_makes_sound_names(store: Store) -> None:
    queue = store.create_queue(
        "long", QueueConfig(visibility_timeout_s=bounds.MAX_DURATION_S, delay_s=0)
    )
    queue.put(b"x")
    assert queue.get_one() is not None
    store.configure("long", delay_s=bounds.MAX_DURATION_S)
    queue.put(b"y")
    assert queue.stats().delayed == 1
    assert_clean(store)


@pytest.mark.usefixtures("private_umask")  # files it plants get the root's modes
def test_a_receive_count_never_outgrows_its_digits(store: Store, queue: Queue) -> None:
    """Without max_receives, a message about to be received for the 10**9-th time is
    dead-lettered when given back, rather than requeued under a name with a 10-digit count."""
    message_id = new_id()
    count = bounds.MAX_RECEIVE_COUNT - 1
    ready = Path(queue.path) / layout.READY / layout.ready_name(message_id, count)
    ready.write_bytes(codec.encode(b"tired", {}, message_id=message_id))
    queue.sweep()  # the index learns of the planted file
    message = queue.get_one(visibility_s=30)
    assert message is not None and message.receive_count == bounds.MAX_RECEIVE_COUNT
    queue.nack(message.receipt)
    stats = queue.stats()
    assert (stats.ready, stats.dead) == (0, 1)
    assert queue.peek(message_id).body == b"tired"
    assert_clean(store)


@pytest.mark.usefixtures("private_umask")  # files it plants get the root's modes
def test_an_expired_lease_at_the_count_bound_is_dead_lettered(store: Store, queue: Queue) -> None:
    message_id = new_id()
    lease = layout.timed_name(message_id, bounds.MAX_RECEIVE_COUNT, 1)  # long expired
    path = Path(queue.path) / layout.LEASED / lease
    path.write_bytes(codec.encode(b"tired", {}, message_id=message_id))
    report = queue.sweep()
    assert report.dead_lettered == 1
    assert queue.stats().dead == 1
    assert_clean(store)


def test_the_longest_duration_from_now_fits_a_name() -> None:
    """The bounds agree with the name grammar: a deadline a year from now has 15 digits."""
    deadline_ms = int(time.time() * 1000) + int(bounds.MAX_DURATION_S * 1000)
    assert deadline_ms <= bounds.MAX_AT_MS
    name = layout.timed_name(new_id(), bounds.MAX_RECEIVE_COUNT, deadline_ms, "0" * 12)
    assert layout.parse_entry(name) is not None
    too_far = layout.timed_name(new_id(), 1, bounds.MAX_AT_MS + 1)
    assert layout.parse_entry(too_far) is None


# -- edges are never looser than the store -------------------------------------------------------


def test_every_edge_limit_is_within_the_store_bound() -> None:
    from dirmq.pubsub.model import MAX_TIMEOUT_S
    from dirmq.sqs.attributes import MAX_RETENTION_S
    from dirmq.wire import durations

    assert durations.MAX_DURATION_S is bounds.MAX_DURATION_S
    assert MAX_TIMEOUT_S <= bounds.MAX_DURATION_S
    assert MAX_RETENTION_S <= bounds.MAX_DURATION_S
    with pytest.raises(InvalidArgument):
        durations.parse_duration(f"{bounds.MAX_DURATION_S + 1:.0f}", "delay")
    assert durations.parse_duration(f"{bounds.MAX_DURATION_S:.0f}") == bounds.MAX_DURATION_S


@pytest.mark.parametrize("option", ["leaseSeconds", "pollWaitSeconds"])
@pytest.mark.parametrize("text", ["1e12", "1e300", "2.26e307", "inf", "nan", "0", "-1"])
def test_spark_durations_are_refused_before_a_query_starts(
    tmp_path: Path, option: str, text: str
) -> None:
    from dirmq.spark.options import parse_options

    with pytest.raises(InvalidArgument, match=option):
        parse_options({"path": str(tmp_path), "queue": "jobs", option: text})
    year = f"{bounds.MAX_DURATION_S:.0f}"
    parse_options({"path": str(tmp_path), "queue": "jobs", option: year})


# -- the CLI -------------------------------------------------------------------------------------


def dirmq(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "dirmq", args[0], "--root", str(root), *args[1:]]
    return subprocess.run(command, input=stdin, capture_output=True, timeout=60, check=False)


def refused(result: subprocess.CompletedProcess[bytes], word: str) -> None:
    """Exit 2 (usage), one `dirmq: error:` line naming what was wrong, no traceback."""
    lines = result.stderr.decode().splitlines()
    assert result.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("dirmq: error: "), lines
    assert word in lines[0], lines


def dirmq_here(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """`dirmq` run in this process (its `main`), as `dirmq` runs it, for refusals that need no
    process of their own: a new interpreter per command made this module a minute long."""
    from dirmq.cli import main

    argv = [args[0], "--root", str(root), *args[1:]]
    stdout, stderr = io.StringIO(), io.StringIO()
    fake_stdin = io.TextIOWrapper(io.BytesIO(stdin))
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = fake_stdin, stdout, stderr
    try:
        code = main(argv)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return subprocess.CompletedProcess(
        argv, code, stdout.getvalue().encode(), stderr.getvalue().encode()
    )


def refuses_every_duration(root: Path, value: str, run: Callable[..., Any]) -> None:
    """Each duration option of the CLI refuses `value` (exit 2, one line), and nothing of the
    queue is lost or created."""
    first = dirmq(root, "put", "q", "--create", stdin=b"kept").stdout.decode().strip()
    refused(run(root, "put", "q", "--delay", value, stdin=b"x"), "--delay")
    refused(run(root, "put", "new", "--create", "--delay", value, stdin=b"x"), "--delay")
    refused(run(root, "get", "q", "--visibility", value), "--visibility")
    refused(run(root, "get", "q", "--wait", value), "--wait")
    refused(run(root, "create", "other", "--visibility", value), "--visibility")
    refused(run(root, "configure", "q", "--retention", value), "--retention")
    refused(run(root, "configure", "q", "--writeback-delay", value), "--writeback-delay")
    made = sorted(n for n in os.listdir(root) if n != layout.JOURNAL_DIR)  # (the first put's)
    assert made == [layout.ROOT_MARKER, "q"]  # nothing was created
    got = dirmq(root, "get", "q", "--visibility", "60")
    assert got.returncode == 0 and got.stdout == b"kept"
    receipt = got.stderr.decode().strip()
    assert receipt.startswith(first)
    refused(run(root, "nack", "q", receipt, "--delay", value), "--delay")
    assert dirmq(root, "ack", "q", receipt).returncode == 0
    assert dirmq(root, "fsck").returncode == 0


def test_cli_refuses_durations_out_of_bounds_and_loses_nothing(tmp_path: Path) -> None:
    """One value through real `dirmq` processes (exit status, one line, no traceback)."""
    refuses_every_duration(tmp_path / "root", "1e300", dirmq)


@pytest.mark.parametrize("value", ["1e12", "2.26e307", "inf", "nan"])
def test_cli_refuses_every_out_of_bounds_duration(tmp_path: Path, value: str) -> None:
    refuses_every_duration(tmp_path / "root", value, dirmq_here)


def test_cli_maps_the_store_refusal_to_exit_2(tmp_path: Path) -> None:
    """A value the CLI lets through but the store refuses is exit 2 too (a usage error)."""
    root = tmp_path / "root"
    assert dirmq(root, "create", "q").returncode == 0
    refused(dirmq(root, "configure", "q", "--writeback-delay", "0"), "writeback_delay_s")
    refused(dirmq(root, "configure", "q", "--retention", "0.0001"), "retention_s")


def test_cli_refuses_counts_out_of_bounds(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert dirmq(root, "create", "q").returncode == 0
    refused(dirmq(root, "configure", "q", "--max-receives", "1000000000"), "max_receives")
    refused(dirmq(root, "configure", "q", "--capacity", "1000000000"), "capacity")
    refused(dirmq(root, "configure", "q", "--peers", "100000"), "peers")
    refused(dirmq(root, "configure", "q", "--max-bytes", str(2**40)), "max_message_bytes")


# -- native HTTP -----------------------------------------------------------------------------------


server = serve()


http = http_client()


# The defect's reproductions as JSON text (2.26e307 overflowed in the store, 1e300 made a name
# too long for the filesystem), and a JSON integer no float can hold.
JSON_HOSTILE = ["1e12", "1e13", "1e300", "2.26e307", "-1", "true", "1" + "0" * 400]


@pytest.mark.parametrize("field", DURATION_FIELDS)
@pytest.mark.parametrize("number", JSON_HOSTILE)
def test_http_put_queue_refuses_durations_out_of_bounds(
    http: httpx.Client, server: ServerProcess, field: str, number: str
) -> None:
    name = f"h-{field}-{len(number)}-{number[:6]}".replace(".", "_").replace("+", "")
    body = f'{{"{field}": {number}}}'
    created = http.put(f"/{name}", content=body)
    assert created.status_code == 400, created.text
    assert created.json()["error"] == "ConfigError"
    assert field in created.json()["message"]
    assert http.get(f"/{name}").status_code == 404  # nothing was created
    assert http.put(f"/{name}").status_code == 201
    assert http.post(f"/{name}/messages", content=b"kept").status_code == 201
    changed = http.put(f"/{name}", content=body)  # reconfiguring: refused, config unchanged
    assert changed.status_code == 400 and field in changed.json()["message"]
    assert http.get(f"/{name}").json()["config"] == QueueConfig().to_json()
    got = http.get(f"/{name}/messages")
    assert got.status_code == 200 and got.content == b"kept"
    assert os.listdir(server.root / name / layout.CORRUPT) == []  # nothing set aside


@pytest.mark.parametrize("number", ["1e13", "1e300", "2.26e307"])
def test_http_visibility_out_of_bounds_never_reaches_a_name(
    http: httpx.Client, server: ServerProcess, number: str
) -> None:
    """The issue's own reproduction: the queue's visibility, then a receive and fsck."""
    name = f"v-{number.replace('.', '_').replace('+', '')}"
    assert http.put(f"/{name}").status_code == 201
    refused_put = http.put(f"/{name}", content=f'{{"visibility_timeout_s": {number}}}')
    assert refused_put.status_code == 400
    assert "visibility_timeout_s" in refused_put.json()["message"]
    http.post(f"/{name}/messages", content=b"one")
    for param in ("visibility", "wait"):
        answer = http.get(f"/{name}/messages", params={param: number})
        assert answer.status_code == 400 and param in answer.json()["message"]
    answer = http.post(f"/{name}/messages", content=b"two", params={"delay": number})
    assert answer.status_code == 400
    stats = http.get(f"/{name}").json()["stats"]
    assert stats["ready"] == 1
    report = fsck(server.root, repair=False)
    assert report.ok, [(p.kind, p.detail) for p in report.problems]


def test_http_batch_line_delay_out_of_bounds(http: httpx.Client) -> None:
    assert http.put("/batchq").status_code == 201
    lines = b'{"body": "a"}\n{"body": "b", "delay": 1e13}\n'
    answer = http.post(
        "/batchq/messages", content=lines, headers={"Content-Type": "application/x-ndjson"}
    )
    assert answer.status_code == 400, answer.text
    assert http.get("/batchq").json()["stats"]["ready"] == 0  # all or none


# -- SQS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url)


def sqs_code(call: Callable[[], object]) -> str:
    with pytest.raises(ClientError) as raised:
        call()
    return str(raised.value.response["Error"]["Code"])


@pytest.mark.parametrize("number", [10**12, 10**13, 10**300])
def test_sqs_refuses_durations_out_of_bounds(sqs: Any, server: ServerProcess, number: int) -> None:
    url = sqs.create_queue(QueueName=f"bounds-{len(str(number))}")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    codes = {
        sqs_code(lambda: sqs.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=number)),
        sqs_code(lambda: sqs.receive_message(QueueUrl=url, VisibilityTimeout=number)),
        sqs_code(lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=number)),
    }
    entry = {"Id": "a", "MessageBody": "x", "DelaySeconds": number}
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[entry])
    assert batch["Failed"] and not batch.get("Successful")
    codes.add(batch["Failed"][0]["Code"])
    for attribute in ("VisibilityTimeout", "DelaySeconds", "MessageRetentionPeriod"):
        codes.add(
            sqs_code(
                lambda a=attribute: sqs.set_queue_attributes(  # type: ignore[misc]
                    QueueUrl=url, Attributes={a: str(number)}
                )
            )
        )
    got = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"]
    handle = got[0]["ReceiptHandle"]
    codes.add(
        sqs_code(
            lambda: sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=number
            )
        )
    )
    assert codes <= {"InvalidParameterValue", "InvalidAttributeValue"}, codes
    assert got[0]["Body"] == "kept"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    report = fsck(server.root, repair=False)
    assert report.ok, [(p.kind, p.detail) for p in report.problems]


def test_the_openapi_document_states_the_store_bounds() -> None:
    """The fuzzer generates from the document: its maxima must be the store's."""
    import json
    from importlib import resources

    document = json.loads(
        resources.files("dirmq.dialects.native").joinpath("openapi.json").read_text()
    )
    for schema in ("QueueConfig", "QueueConfigUpdate"):
        properties = document["components"]["schemas"][schema]["properties"]
        for name in DURATION_FIELDS:
            assert properties[name]["maximum"] == bounds.MAX_DURATION_S, (schema, name)
        for name, maximum in COUNT_FIELDS.items():
            assert properties[name]["maximum"] == maximum, (schema, name)


def test_sqs_answers_a_bad_stored_configuration_as_its_own_fault(
    sqs: Any, server: ServerProcess
) -> None:
    """A @queue.json out of bounds (written before the store had bounds) is the server's fault:
    500 InternalError, not InvalidParameterValue (a client would "fix" its correct request)."""
    url = sqs.create_queue(QueueName="bounds-stored")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    path = server.root / "bounds-stored" / layout.CONFIG_FILE
    stored = path.read_text()
    path.write_text(stored.replace('"visibility_timeout_s": 30.0', '"visibility_timeout_s": 1e13'))
    try:
        deadline = time.monotonic() + 30  # the server re-reads a configuration within 0.5 s
        with pytest.raises(ClientError) as raised:
            while time.monotonic() < deadline:
                sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
                time.sleep(0.1)
        error = raised.value.response["Error"]
        assert error["Code"] == "InternalError", error
        assert "visibility_timeout_s" in error["Message"]
    finally:
        path.write_text(stored)
