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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, Case
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from dirmq.errors import InvalidArgument
from dirmq.store.fsck import fsck
from dirmq.wire.durations import parse_duration

from .servers import ServerProcess, start_server

FUZZ_SECONDS = float(os.environ.get("DIRMQ_FUZZ_SECONDS", "0"))
# The whole run is bounded by DIRMQ_FUZZ_SECONDS; the margin covers start-up, shrinking and fsck.
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(FUZZ_SECONDS + 300)]
BOUNDED_EXAMPLES = 30  # per operation and generation mode, in `make test`
ROUND_EXAMPLES = 60  # per operation and mode in each round under `make fuzz`
REQUEST_TIMEOUT_S = 15.0  # no documented answer may take longer (waits are capped below)
LONGEST_WAIT_S = 2.0  # a generated wait/timeout longer than this is cut to keep the run moving
# A message delivered as the body (receive without `max`, get by id) has no Content-Type when it
# was stored without one: the document says so in words, which OpenAPI cannot say in a schema.
UNTYPED_DELIVERIES = frozenset({"GET /{queue}/messages", "GET /{queue}/messages/{ref}"})


def is_untyped_delivery(response: Any, case: Case) -> bool:
    headers = {name.lower() for name in response.headers}
    return (
        case.operation.label in UNTYPED_DELIVERIES
        and "content-type" not in headers
        and "x-message-id" in headers
    )


def content_type_unless_untyped(ctx: Any, response: Any, case: Case) -> bool | None:
    if is_untyped_delivery(response, case):
        return None
    return content_type_conformance(ctx, response, case)


def schema_unless_untyped(ctx: Any, response: Any, case: Case) -> bool | None:
    if is_untyped_delivery(response, case):
        return None
    return response_schema_conformance(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_unless_untyped,
    response_headers_conformance,
    schema_unless_untyped,
]
SEEDED_QUEUES = ("fz", "fz/a", "fz/b/c")
WAIT_PARAMETERS = ("wait", "X-Wait", "timeout", "X-Timeout")
# Generated text outside what a receipt or an id looks like still gets through the handlers'
# parsing; the real ones take the request further, to the message itself.
SWAP_CHANCE = 0.5


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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    started = start_server(tmp_path_factory.mktemp("fuzz-openapi-root"))
    yield started
    started.stop()


class Seeds:
    """Real queues, message ids and receipts for the fuzzer to use, kept stocked."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.ids: list[str] = []

    def stock(self, queue: str) -> None:
        self.http.put(f"/{queue}")
        # Messages as clients store them: typed, with an empty type, with none at all.
        for headers in ({"Content-Type": "text/plain", "X-Attr-N": "1"}, {"Content-Type": ""}, {}):
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


def steer(case: Case, seeds: Seeds, rng: random.Random) -> None:
    """Point `case` at real queues, ids and receipts some of the time; cap long waits."""
    path = case.path_parameters or {}
    queue = rng.choice(SEEDED_QUEUES)
    if "queue" in path and rng.random() < SWAP_CHANCE:
        path["queue"] = queue
        if "ref" in path and rng.random() < SWAP_CHANCE:
            receipt = seeds.receipt(queue) if rng.random() < 0.5 else None
            path["ref"] = receipt or (rng.choice(seeds.ids) if seeds.ids else path["ref"])
        if "receipt" in path and rng.random() < SWAP_CHANCE:
            path["receipt"] = seeds.receipt(queue) or path["receipt"]
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


def fuzz_operation(
    operation: APIOperation,
    mode: GenerationMode,
    examples: int,
    seed: int | None,
    run: Callable[[Case], None],
) -> None:
    @settings(
        max_examples=examples,
        derandomize=seed is None,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        print_blob=True,
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Case) -> None:
        run(case)

    if seed is not None:
        check._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    try:
        check()
    except Unsatisfiable:
        # An operation with nothing to get wrong (no parameters, no body) has no negative case.
        if mode is not GenerationMode.NEGATIVE:
            raise


def test_every_operation_survives_the_fuzzer(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    tally = Tally()
    rng = random.Random(15)
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as http:
        seeds = Seeds(http)
        for queue in SEEDED_QUEUES:
            seeds.stock(queue)
        session = requests.Session()

        def run(case: Case) -> None:
            steer(case, seeds, rng)
            tally.examples += 1
            tally.requests += 1
            try:
                answer = send(case, session, server.url)
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
        while True:
            seed = None if FUZZ_SECONDS <= 0 else rng.getrandbits(64)
            examples = BOUNDED_EXAMPLES if FUZZ_SECONDS <= 0 else ROUND_EXAMPLES
            for operation in operations:
                for mode in GenerationMode:
                    try:
                        fuzz_operation(operation, mode, examples, seed, run)
                    except (
                        Exception,
                        BaseExceptionGroup,
                    ) as failure:  # keep going: report every operation's at once
                        failures.append(f"{operation.label} ({mode.value}): {explain(failure)}")
            rounds += 1
            if time.monotonic() >= deadline:
                break
        session.close()
    print(f"openapi fuzz: {rounds} rounds, {tally.examples} examples, statuses {tally.statuses}")
    for label, statuses in sorted(tally.by_operation.items()):
        print(f"  {label}: {dict(sorted(statuses.items()))}")
    assert not failures, "\n\n".join(failures)
    assert server.stop() == 0
    report = fsck(server.root, repair=False)
    assert report.problems == (), report.problems
