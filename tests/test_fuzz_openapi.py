"""Fuzz the HTTP API from its own OpenAPI document: schemathesis loads `/openapi.json` from a
real `dirmq serve` and sends every operation generated requests, valid (positive) and invalid
(negative) ones. Each answer must not be a 5xx, must carry a documented status, content type,
headers and body schema, and must come within a timeout (no hang). The fuzzer's queue names,
message ids and receipts are sometimes swapped for real ones, so requests get past the 404s into
the handlers. Afterwards `fsck` must find the server's root clean: no request may leave a file
name it rejects.

Bounded (derandomized, a few dozen examples per operation) in `make test`; under `make fuzz`
(`DIRMQ_FUZZ_SECONDS`) rounds with fresh seeds run until the time is up."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from dirmq.errors import InvalidArgument
from dirmq.store.fsck import Kind, fsck
from dirmq.wire.durations import parse_duration

from .support.fixtures import serve
from .support.servers import ServerProcess

FUZZ_SECONDS = float(os.environ.get("DIRMQ_FUZZ_SECONDS", "0"))
# The whole run is bounded by DIRMQ_FUZZ_SECONDS; the margin covers start-up, shrinking and fsck.
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(FUZZ_SECONDS + 300)]
BOUNDED_EXAMPLES = 20  # per operation and generation mode, in `make test`
ROUND_EXAMPLES = 60  # per operation and mode in each round under `make fuzz`
REQUEST_TIMEOUT_S = 15.0  # no documented answer may take longer (waits are capped below)
LONGEST_WAIT_S = 2.0  # a generated wait/timeout longer than this is cut to keep the run moving
# A message delivered as the body (receive without `max` or `peek`, get by id) is the publisher's
# bytes under the publisher's Content-Type, or none if it was stored without one, as the document
# says in words: no schema of the document applies to it (a message published as
# application/json is not a BrowseResult), and OpenAPI cannot say "no Content-Type".
MESSAGE_DELIVERIES = frozenset({"GET /{queue}/messages", "GET /{queue}/messages/{ref}"})


def header_names(response: Any) -> set[str]:
    return {name.lower() for name in response.headers}


def is_message_body(response: Any, case: Case) -> bool:
    return case.operation.label in MESSAGE_DELIVERIES and "x-message-id" in header_names(response)


def content_type_unless_untyped(ctx: Any, response: Any, case: Case) -> bool | None:
    if is_message_body(response, case) and "content-type" not in header_names(response):
        return None
    return content_type_conformance(ctx, response, case)


def schema_unless_message_body(ctx: Any, response: Any, case: Case) -> bool | None:
    if is_message_body(response, case):
        return None
    return response_schema_conformance(ctx, response, case)


def no_server_error_but_queue_full(ctx: Any, response: Any, case: Case) -> bool | None:
    """A 504 `QueueFull` is a publish's documented answer at capacity (the fuzzer sets
    capacities), not a server error."""
    if case.operation.label == "POST /{queue}/messages" and response.status_code == 504:
        assert response.json()["error"] == "QueueFull", response.text
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [
    no_server_error_but_queue_full,
    status_code_conformance,
    content_type_unless_untyped,
    response_headers_conformance,
    schema_unless_message_body,
]
SEEDED_QUEUES = ("fz", "fz/a", "fz/b/c")
WAIT_PARAMETERS = ("wait", "X-Wait", "timeout", "X-Timeout")


@dataclass
class Tally:
    requests: int = 0
    examples: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    by_operation: dict[str, dict[int, int]] = field(default_factory=dict)

    def count(self, label: str, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        of_operation = self.by_operation.setdefault(label, {})
        of_operation[status] = of_operation.get(status, 0) + 1


class ServerLog:
    """The server's output (read as it comes by `start_server`), for the failure message."""

    def __init__(self, server: ServerProcess) -> None:
        self._server = server

    @property
    def lines(self) -> list[str]:
        return [line.rstrip("\n") for line in list(self._server.lines)]

    def errors(self) -> list[str]:
        """Tracebacks: every unhandled error is logged with one, whatever status it became."""
        if self._server.reader is not None:
            self._server.reader.join(timeout=REQUEST_TIMEOUT_S)
        return [line for line in self.lines if line.startswith("Traceback")]


server = serve()


class Seeds:
    """Real queues, message ids and receipts for the fuzzer to use, kept stocked."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http  # generated text rarely names a real queue, id or receipt: these do
        self.ids: list[str] = []

    def stock(self, queue: str) -> None:
        # One queue of priority levels, so generated priorities are stored, not only refused.
        self.http.put(f"/{queue}", json={"priority_levels": 3} if queue == "fz/a" else None)
        # Messages as clients store them: typed, with an empty type, with none at all, and of a
        # priority (refused, 400, where the queue has one level).
        for headers in (
            {"Content-Type": "text/plain", "X-Attr-N": "1"},
            {"Content-Type": ""},
            {},
            {"X-Priority": "2"},
        ):
            answer = self.http.post(f"/{queue}/messages", content=b"seed", headers=headers)
            if answer.status_code == 201:
                self.ids.append(answer.headers["X-Message-Id"])
        self.ids[:] = self.ids[-50:]

    def receipt(self, queue: str) -> str | None:
        answer = self.http.get(f"/{queue}/messages", params={"visibility": "1h"})
        if answer.status_code != 200:
            self.stock(queue)
            answer = self.http.get(f"/{queue}/messages", params={"visibility": "1h"})
        return answer.headers.get("X-Receipt")


def steer(case: Case, seeds: Seeds, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
    """Point `case` at real queues, ids and receipts some of the time (Hypothesis' choices, so a
    failure shrinks and replays); cap long waits."""
    path = case.path_parameters or {}
    if "queue" in path and draw(st.booleans()):
        path["queue"] = queue = draw(st.sampled_from(SEEDED_QUEUES))
        if "ref" in path and draw(st.booleans()):
            receipt = seeds.receipt(queue) if draw(st.booleans()) else None
            path["ref"] = receipt or draw(st.sampled_from(seeds.ids or [path["ref"]]))
        if "receipt" in path and draw(st.booleans()):
            path["receipt"] = seeds.receipt(queue) or path["receipt"]
        receipts = case.body.get("receipts") if isinstance(case.body, dict) else None
        if isinstance(receipts, list) and draw(st.booleans()):  # a batch settle's body
            receipts.append(seeds.receipt(queue) or "")
    if case.query and isinstance(case.query.get("queue"), str) and draw(st.booleans()):
        case.query["queue"] = draw(st.sampled_from(SEEDED_QUEUES))  # a sampled queue's series
    for where in (case.query, case.headers):
        for name in WAIT_PARAMETERS:
            if where and isinstance(where.get(name), str):
                try:
                    too_long = parse_duration(where[name]) > LONGEST_WAIT_S
                except InvalidArgument:
                    continue
                if too_long:
                    where[name] = "0.1"


def send(case: Case, session: requests.Session, base_url: str) -> requests.Response:
    if case.operation.label == "GET /@pubsub/subscribe":
        # A 200 here is an endless event stream: take the head, then hang up.
        kwargs = case.as_transport_kwargs(base_url=base_url)
        answer = session.request(**kwargs, stream=True, timeout=REQUEST_TIMEOUT_S)
        if answer.status_code == 200:
            answer.close()
            raise _Streamed(answer)
        return answer
    return case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S)


class _Streamed(Exception):
    def __init__(self, answer: requests.Response) -> None:
        self.answer = answer


def explain(failure: BaseException) -> str:
    """The failure with what a group (or Hypothesis' flaky report) wraps, cut to a readable size."""
    text = str(failure)
    if isinstance(failure, BaseExceptionGroup):
        text += "".join(f"\n  {explain(inner)}" for inner in failure.exceptions)
    return text[:3000]


def fuzz_with(
    strategy: st.SearchStrategy[Case],
    examples: int,
    seed: int | None,
    run: Callable[[Case, Callable[[st.SearchStrategy[Any]], Any]], None],
) -> None:
    """Run `examples` cases of `strategy` (derandomized without a seed); shrink a failure."""

    @settings(
        max_examples=examples,
        derandomize=seed is None,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        print_blob=True,
    )
    @given(case=strategy, data=st.data())
    def check(case: Case, data: st.DataObject) -> None:
        run(case, data.draw)

    if seed is not None:
        check._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    check()


def test_every_operation_survives_the_fuzzer(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    tally = Tally()
    rng = random.Random(15)
    log = ServerLog(server)

    def count_request(_request: httpx.Request) -> None:
        tally.requests += 1

    hooks = {"request": [count_request]}
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S, event_hooks=hooks) as http:
        seeds = Seeds(http)
        for queue in SEEDED_QUEUES:
            seeds.stock(queue)
        session = requests.Session()

        def run(case: Case, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
            steer(case, seeds, draw)
            tally.examples += 1
            tally.requests += 1
            try:
                answer = send(case, session, server.url)
            except requests.RequestException as failure:  # no answer (a hang, a dropped line)
                curl = case.as_curl_command(base_url=server.url)
                raise AssertionError(f"{failure}\n{curl}") from failure
            except _Streamed as streamed:
                tally.count(case.operation.label, 200)
                assert "text/event-stream" in streamed.answer.headers["Content-Type"]
                return
            tally.count(case.operation.label, answer.status_code)
            try:
                case.validate_response(answer, checks=CHECKS)
            except (AssertionError, BaseExceptionGroup) as failure:
                curl = case.as_curl_command(base_url=server.url)
                raise AssertionError(f"{failure}\n{curl}\n-> {answer.text[:300]}") from failure
            if case.method == "DELETE" and case.path_parameters:
                queue = case.path_parameters.get("queue")
                if queue in SEEDED_QUEUES:
                    seeds.stock(queue)

        deadline = time.monotonic() + FUZZ_SECONDS
        rounds = 0
        failures: list[str] = []
        passes = [(operation, mode) for operation in operations for mode in GenerationMode]
        while True:
            seed = None if FUZZ_SECONDS <= 0 else rng.getrandbits(64)
            examples = BOUNDED_EXAMPLES if FUZZ_SECONDS <= 0 else ROUND_EXAMPLES
            # Each operation alone (each is covered), then all of them interleaved: a setting
            # one request stores is what a later request on the same queue runs into.
            for operation, mode in list(passes):
                if rounds and time.monotonic() >= deadline:
                    break  # every pass ran at least once
                try:
                    fuzz_with(operation.as_strategy(generation_mode=mode), examples, seed, run)
                except Unsatisfiable:
                    # Nothing to get wrong (no parameters, no body): no negative case exists.
                    assert mode is GenerationMode.NEGATIVE, operation.label
                    passes.remove((operation, mode))
                except (Exception, BaseExceptionGroup) as failure:  # report every one at once
                    failures.append(f"{operation.label} ({mode.value}): {explain(failure)}")
            mixed = st.one_of([op.as_strategy(generation_mode=mode) for op, mode in passes])
            try:
                fuzz_with(mixed, examples * len(operations), seed, run)
            except (Exception, BaseExceptionGroup) as failure:
                failures.append(f"interleaved: {explain(failure)}")
            rounds += 1
            if time.monotonic() >= deadline:
                break
        session.close()
    print(f"openapi fuzz: {rounds} rounds, {tally.examples} examples, {tally.requests} requests")
    print(f"  statuses {tally.statuses}")
    for label, statuses in sorted(tally.by_operation.items()):
        print(f"  {label}: {dict(sorted(statuses.items()))}")
    assert server.stop() == 0
    assert not failures, "\n\n".join([*failures, *log.lines[-100:]])
    assert log.errors() == [], "\n".join(log.lines[-200:])
    report = fsck(server.root, repair=False)
    # A dead-letter queue named before it exists is allowed (the API says so): fsck notes it.
    assert [p for p in report.problems if p.kind is not Kind.MISSING_DLQ] == [], report.problems
