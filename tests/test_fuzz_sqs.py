"""Fuzz the SQS endpoint with botocore's SQS service model driving the inputs: Hypothesis
strategies built from each operation's input shape (hostile strings, huge integers, binary,
real queue URLs and receipt handles mixed in) are sent four ways: through real boto3 clients of
both protocols with parameter validation off (so what the model's constraints would stop still
reaches the server), and as raw JSON-protocol and query-protocol requests whose values are
further mangled (wrong JSON types, bytes that are not UTF-8). No answer may be a 5xx or an
`InternalError`, every answer must parse (botocore's parsers, or JSON / XML for the raw ones)
and come within a timeout; afterwards `fsck` finds the server's root clean.

A handful of derandomized examples in `make test`; under `make fuzz` (`DIRMQ_FUZZ_SECONDS`)
rounds with fresh seeds run until the time is up."""

from __future__ import annotations

import base64
import json
import os
import random
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import boto3
import botocore.session
import httpx
import pytest
from botocore import xform_name
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.serialize import create_serializer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dirmq.sqs.context import DEFAULT_ACCOUNT
from dirmq.sqs.protocol_query import query_model, query_model_document
from dirmq.store.fsck import Kind, fsck

from .support.fixtures import serve
from .support.servers import ServerProcess
from .test_fuzz_openapi import ServerLog

FUZZ_SECONDS = float(os.environ.get("DIRMQ_FUZZ_SECONDS", "0"))
# The whole run is bounded by DIRMQ_FUZZ_SECONDS; the margin covers start-up, shrinking and fsck.
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(FUZZ_SECONDS + 300)]

BOUNDED_EXAMPLES = 60  # a handful per transport, in `make test`
ROUND_EXAMPLES = 300  # per round under `make fuzz`, each round with a fresh seed
REQUEST_TIMEOUT_S = 30.0  # above SQS's longest wait (20 s), which a queue attribute can set
QUEUE_NAMES = ("fz-std", "fz-dlq", "fz.fifo")
TRANSPORTS = ("boto3-json", "boto3-query", "raw-json", "raw-query")
JSON_TARGET = "AmazonSQS."
JSON_TYPE = "application/x-amz-json-1.0"
FORM_TYPE = "application/x-www-form-urlencoded; charset=utf-8"


@dataclass
class Tally:
    requests: int = 0
    examples: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass
class Seeds:
    """Real queue URLs and receipt handles for the fuzzer to use, kept stocked."""

    client: Any
    urls: list[str] = field(default_factory=list)
    receipts: list[str] = field(default_factory=list)

    def stock(self) -> None:
        for name in QUEUE_NAMES:
            attributes = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
            try:
                url = self.client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
            except ClientError:  # the fuzzer changed its attributes: it still exists
                url = f"{self.client.meta.endpoint_url}/{DEFAULT_ACCOUNT}/{name}"
            if url not in self.urls:
                self.urls.append(url)
            extra = {"MessageGroupId": "g", "MessageDeduplicationId": str(time.time_ns())}
            try:  # the attributes the fuzzer gave the queue may refuse these: that is fine
                for n in range(3):
                    self.client.send_message(
                        QueueUrl=url, MessageBody=f"seed {n}", **(extra if "fifo" in name else {})
                    )
                got = self.client.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=3600, WaitTimeSeconds=0
                )
            except ClientError:
                continue
            self.receipts += [m["ReceiptHandle"] for m in got.get("Messages", [])]
        self.receipts[:] = self.receipts[-40:]


server = serve()


def make_client(server: ServerProcess, data_path: Path | None) -> Any:
    """A boto3 SQS client that sends whatever it is given: parameter validation off, no retries,
    a read timeout that catches a hang."""
    session = botocore.session.get_session()
    if data_path is not None:  # the query protocol: botocore reads our query model first
        session.get_component("data_loader").search_paths.insert(0, str(data_path))
    return boto3.Session(botocore_session=session).client(
        "sqs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="anything",
        aws_secret_access_key="anything",
        config=Config(
            retries={"max_attempts": 1},
            parameter_validation=False,
            read_timeout=REQUEST_TIMEOUT_S,
            connect_timeout=REQUEST_TIMEOUT_S,
        ),
    )


# -- strategies from the model ---------------------------------------------------------------------
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=300),
    st.sampled_from(["", " ", "0", "-1", "1e309", "NaN", "true", "\x00", "../..", "a" * 300]),
)
INTEGERS = st.one_of(st.integers(-3, 25), st.integers(-(2**63), 2**63 - 1))


def strategy_for(shape: Any, member: str, seeds: Seeds, depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for botocore `shape` (the input member `member`), as a boto3 client takes them."""
    kind = shape.type_name
    if kind == "structure":
        members = {
            name: strategy_for(inner, name, seeds, depth + 1)
            for name, inner in shape.members.items()
        }
        required = set(shape.required_members)
        return st.fixed_dictionaries(
            {name: s for name, s in members.items() if name in required},
            optional={name: s for name, s in members.items() if name not in required},
        )
    if kind == "list":
        return st.lists(strategy_for(shape.member, member, seeds, depth + 1), max_size=4)
    if kind == "map":
        keys = strategy_for(shape.key, f"{member}.key", seeds, depth + 1)
        values = strategy_for(shape.value, member, seeds, depth + 1)
        return st.dictionaries(keys, values, max_size=4)
    if kind in ("integer", "long"):
        return INTEGERS
    if kind == "boolean":
        return st.booleans()
    if kind == "blob":
        return st.binary(max_size=64)
    if kind in ("float", "double"):
        return st.floats()
    if kind == "timestamp":
        return st.datetimes()
    return string_for(shape, member, seeds)


def string_for(shape: Any, member: str, seeds: Seeds) -> st.SearchStrategy[str]:
    known: list[st.SearchStrategy[str]] = []
    if shape.enum:
        known.append(st.sampled_from(shape.enum))
    if member == "QueueUrl":
        known.append(st.sampled_from(seeds.urls))
    if member in ("SourceArn", "DestinationArn", "TaskHandle"):
        arns = [f"arn:aws:sqs:us-east-1:{DEFAULT_ACCOUNT}:{name}" for name in QUEUE_NAMES]
        known.append(st.sampled_from(arns))
    if member in ("QueueName", "QueueNamePrefix"):
        known.append(st.sampled_from(QUEUE_NAMES))
        known.append(st.from_regex(r"\A[A-Za-z0-9_-]{1,80}(\.fifo)?\Z"))
    if member == "ReceiptHandle":
        known.append(st.sampled_from(seeds.receipts or ["none"]))
    if member.endswith(".key") and member.startswith("Attributes"):
        known.append(st.sampled_from(["VisibilityTimeout", "DelaySeconds", "RedrivePolicy"]))
    if member in ("DataType",):
        known.append(st.sampled_from(["String", "Number", "Binary", "String.x", "Number.1"]))
    # Mostly real names, URLs and handles, so most requests get past "no such queue".
    return st.one_of(*known, *known, *known, HOSTILE_TEXT) if known else HOSTILE_TEXT


def tamed(operation: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` with a valid receive wait cut to at most 1 s (a long poll is no hang, but it
    slows the run); invalid ones are left for the server to refuse."""
    wait = params.get("WaitTimeSeconds")
    if operation == "ReceiveMessage":
        if isinstance(wait, int) and 1 < wait <= 20:
            params["WaitTimeSeconds"] = 1
        elif wait is None:
            params["WaitTimeSeconds"] = 0  # not the queue's own wait, which the fuzzer may set
    return params


# -- the four ways in ---------------------------------------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


def as_json(shape: Any, value: Any) -> Any:
    """`value` as the JSON protocol carries it (blobs as base64, timestamps as epoch seconds)."""
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        return {k: as_json(shape.members[k], v) for k, v in value.items() if k in shape.members}
    if kind == "list" and isinstance(value, list):
        return [as_json(shape.member, v) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: as_json(shape.value, v) for k, v in value.items()}
    if kind == "blob" and isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if kind == "timestamp":
        return value.timestamp()
    return value


def mangle(document: Any, draw: Any) -> Any:
    """Replace one value somewhere in `document` with any JSON value (a wrong type, usually)."""
    if isinstance(document, dict) and document and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(document)))
        return {**document, key: mangle(document[key], draw)}
    if isinstance(document, list) and document and draw(st.booleans()):
        at = draw(st.integers(0, len(document) - 1))
        return [*document[:at], mangle(document[at], draw), *document[at + 1 :]]
    return draw(JSON_VALUES)


@dataclass
class Sent:
    """What one example sent and what came back, for the failure message."""

    transport: str
    operation: str
    request: str
    status: int = 0
    answer: str = ""


def check_raw_json(answer: httpx.Response, sent: Sent) -> str:
    sent.status, sent.answer = answer.status_code, answer.text[:400]
    assert answer.status_code < 500, sent
    document = json.loads(answer.content) if answer.content else {}
    assert isinstance(document, dict), sent
    kind = str(document.get("__type", ""))
    assert "InternalError" not in kind and "InternalFailure" not in kind, sent
    return f"{answer.status_code} {kind.rsplit('#', 1)[-1]}".strip()


def check_raw_query(answer: httpx.Response, sent: Sent) -> str:
    sent.status, sent.answer = answer.status_code, answer.text[:400]
    assert answer.status_code < 500, sent
    tree = ET.fromstring(answer.content)  # must be well-formed XML
    code = tree.findtext(".//{*}Error/{*}Code") or tree.findtext(".//Error/Code") or ""
    assert code != "InternalError", sent
    return f"{answer.status_code} {code}".strip()


def test_sqs_survives_the_fuzzer(server: ServerProcess, tmp_path: Path) -> None:
    query_data = tmp_path / "botocore-data"
    (query_data / "sqs" / "2012-11-05").mkdir(parents=True)
    (query_data / "sqs" / "2012-11-05" / "service-2.json").write_text(
        json.dumps(query_model_document())
    )
    clients = {
        "boto3-json": make_client(server, None),
        "boto3-query": make_client(server, query_data),
    }
    json_model = clients["boto3-json"].meta.service_model
    query_serializer = create_serializer("query")
    query_operations = query_model()
    tally = Tally()
    log = ServerLog(server)

    def count_request(**_kwargs: Any) -> None:
        tally.requests += 1

    for client in clients.values():
        client.meta.events.register("before-send.sqs", count_request)
    seeds = Seeds(clients["boto3-json"])
    seeds.stock()
    strategies = {
        name: strategy_for(json_model.operation_model(name).input_shape, name, seeds)
        for name in sorted(json_model.operation_names)
    }
    examples = st.sampled_from(sorted(strategies)).flatmap(
        lambda name: st.tuples(st.just(name), st.sampled_from(TRANSPORTS), strategies[name])
    )
    failures: list[str] = []
    rng = random.Random(15)

    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as raw:

        def run(operation: str, transport: str, params: dict[str, Any], data: Any) -> None:
            params = tamed(operation, params)
            tally.examples += 1
            sent = Sent(transport, operation, repr(params)[:600])
            if transport.startswith("boto3"):
                outcome = call_boto3(clients[transport], operation, params, sent)
            elif transport == "raw-json":
                shape = json_model.operation_model(operation).input_shape
                document = as_json(shape, params)
                if data.draw(st.booleans()):
                    document = mangle(document, data.draw)
                body = json.dumps(document).encode()
                sent.request = body.decode()[:600]
                tally.requests += 1
                answer = raw.post(
                    "/",
                    content=body,
                    headers={"X-Amz-Target": JSON_TARGET + operation, "Content-Type": JSON_TYPE},
                )
                outcome = check_raw_json(answer, sent)
            else:
                form = query_form(query_serializer, query_operations, operation, params)
                # A value that is not UTF-8, or any text (Action and Version are always there).
                if len(form) > 2 and data.draw(st.booleans()):
                    key = data.draw(st.sampled_from(sorted(set(form) - {"Action", "Version"})))
                    form[key] = data.draw(st.binary(max_size=8) | st.text(max_size=20))
                body = urlencode(form).encode()
                sent.request = body.decode()[:600]
                tally.requests += 1
                answer = raw.post("/", content=body, headers={"Content-Type": FORM_TYPE})
                outcome = check_raw_query(answer, sent)
            tally.count(f"{transport} {outcome}")
            if operation in ("DeleteQueue", "PurgeQueue"):
                seeds.stock()

        deadline = time.monotonic() + FUZZ_SECONDS
        rounds = 0
        while True:
            seed = None if FUZZ_SECONDS <= 0 else rng.getrandbits(64)

            @settings(
                max_examples=BOUNDED_EXAMPLES if FUZZ_SECONDS <= 0 else ROUND_EXAMPLES,
                derandomize=seed is None,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate, Phase.shrink],
            )
            @given(example=examples, data=st.data())
            def fuzz(example: tuple[str, str, dict[str, Any]], data: Any) -> None:
                run(*example, data)

            if seed is not None:
                fuzz._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
            try:
                fuzz()
            except Exception as failure:  # keep going until the time is up; report them all
                failures.append(str(failure)[:3000])
            rounds += 1
            if time.monotonic() >= deadline:
                break
    for client in clients.values():
        client.close()
    print(f"sqs fuzz: {rounds} rounds, {tally.examples} examples, {tally.requests} requests")
    for outcome, times in sorted(tally.outcomes.items()):
        print(f"  {outcome}: {times}")
    assert not failures, "\n\n".join(failures)
    assert server.stop() == 0
    assert log.errors() == [], "\n".join(log.lines[-200:])
    report = fsck(server.root, repair=False)
    # A dead-letter queue named before it exists is allowed (the API says so): fsck notes it.
    assert [p for p in report.problems if p.kind is not Kind.MISSING_DLQ] == [], report.problems


def call_boto3(client: Any, operation: str, params: dict[str, Any], sent: Sent) -> str:
    """Call `operation` through boto3: an answer it parses, or an error that is not ours."""
    method = getattr(client, xform_name(operation))
    sends: list[str] = []

    def note(**_kwargs: Any) -> None:
        sends.append(operation)

    client.meta.events.register("before-send.sqs", note)
    try:
        method(**params)
    except (TypeError, ValueError, AttributeError):
        if sends:
            raise
        return "not sent (botocore cannot serialize it)"
    except ClientError as error:
        code = str(error.response["Error"]["Code"])
        sent.status = int(error.response["ResponseMetadata"]["HTTPStatusCode"])
        sent.answer = str(error.response["Error"].get("Message", ""))[:400]
        assert sent.status < 500 and code not in ("InternalError", "InternalFailure"), sent
        return f"{sent.status} {code}"
    finally:
        client.meta.events.unregister("before-send.sqs", note)
    return "200"


def query_form(
    serializer: Any, model: Any, operation: str, params: dict[str, Any]
) -> dict[str, Any]:
    """`params` as the query protocol's form fields (botocore's serializer; no validation)."""
    request = serializer.serialize_to_request(params, model.operation_model(operation))
    body = request["body"]
    return dict(body) if isinstance(body, dict) else {"Action": operation}
