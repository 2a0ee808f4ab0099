"""Dead-letter queue redrive over the SQS API (StartMessageMoveTask, ListMessageMoveTasks,
CancelMessageMoveTask) with boto3 against a real `dirmq serve`.

Queues are wired with the native API (`PUT /{queue}` with dead_letter_queue/max_receives) and
inspected with the library on the same root, so these tests need only the SQS actions under
test plus Create/Send/Receive/Delete."""

from __future__ import annotations

import base64
import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

import dirmq
from dirmq.sqs.actions.move_tasks import decode_handle, encode_handle
from dirmq.store.filemodes import Access

from .support.fixtures import serve
from .support.servers import ServerProcess, sqs_client, start_server
from .support.waiting import wait_until

ACCOUNT = "000000000000"
_names = itertools.count()


server = serve()


@pytest.fixture(scope="module")
def sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url)


@pytest.fixture(scope="module")
def store(server: ServerProcess) -> Iterator[dirmq.Store]:
    with dirmq.Store(server.root, create=False) as s:
        yield s


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def native_put(server: ServerProcess, queue: str, config: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{server.url}/{queue}", data=json.dumps(config).encode(), method="PUT"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 201)


def pipe(
    server: ServerProcess, store: dirmq.Store, count: int, *, fifo: bool = False
) -> tuple[str, str]:
    """A source queue whose dead-letter queue holds `count` messages m0, m1, ..."""
    suffix = ".fifo" if fifo else ""
    source, dlq = fresh("src") + suffix, fresh("dlq") + suffix
    native_put(server, dlq, {})
    native_put(server, source, {"dead_letter_queue": dlq, "max_receives": 1})
    if count:
        store.queue(dlq).put_many([f"m{i}".encode() for i in range(count)])
    return source, dlq


def ready(store: dirmq.Store, name: str) -> int:
    return store.queue(name).stats().ready


def bodies(store: dirmq.Store, name: str) -> list[bytes]:
    return [m.body for m in store.queue(name).browse()]


def wait_for(
    sqs: Any, dlq: str, done: Callable[[dict[str, Any]], bool], timeout_s: float = 15
) -> dict[str, Any]:
    """The newest move task of `dlq` once `done` says so."""

    def newest_done() -> dict[str, Any] | None:
        results = sqs.list_message_move_tasks(SourceArn=arn(dlq))["Results"]
        return dict(results[0]) if results and done(results[0]) else None

    return wait_until(newest_done, timeout_s, "the move task")


def finished(entry: dict[str, Any]) -> bool:
    return entry["Status"] not in ("RUNNING", "CANCELLING")


def error_of(call: Callable[[], object]) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


# -- moving ----------------------------------------------------------------------------------------


def test_redrive_back_to_the_source(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    """End to end: messages die after maxReceiveCount, then go back where they came from."""
    source, dlq = pipe(server, store, 0)
    source_url = f"{server.url}/{ACCOUNT}/{source}"
    sent = {f"order {i}" for i in range(12)}
    for body in sent:
        sqs.send_message(QueueUrl=source_url, MessageBody=body)
    received = 0
    deadline = time.monotonic() + 10
    while received < len(sent):  # received once each, never deleted: dead after one receive
        assert time.monotonic() < deadline
        got = sqs.receive_message(
            QueueUrl=source_url, MaxNumberOfMessages=10, VisibilityTimeout=0
        ).get("Messages", [])
        received += len(got)
    deadline = time.monotonic() + 10
    while ready(store, dlq) < len(sent):
        sqs.receive_message(QueueUrl=source_url, VisibilityTimeout=0)  # promotes dead leases
        assert time.monotonic() < deadline
    assert ready(store, source) == 0

    handle = sqs.start_message_move_task(SourceArn=arn(dlq))["TaskHandle"]
    assert decode_handle(handle)[1] == arn(dlq)
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "COMPLETED"
    assert entry["ApproximateNumberOfMessagesMoved"] == len(sent)
    assert entry["ApproximateNumberOfMessagesToMove"] == len(sent)
    assert entry["SourceArn"] == arn(dlq)
    assert "DestinationArn" not in entry and "TaskHandle" not in entry
    assert abs(entry["StartedTimestamp"] / 1000 - time.time()) < 60

    assert ready(store, dlq) == 0 and store.queue(dlq).stats().in_flight == 0
    back: list[str] = []
    while len(back) < len(sent):
        assert time.monotonic() < deadline + 10
        got = sqs.receive_message(QueueUrl=source_url, MaxNumberOfMessages=10)["Messages"]
        for message in got:
            back.append(message["Body"])
            sqs.delete_message(QueueUrl=source_url, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(back) == sorted(sent)  # all back, each once
    assert ready(store, source) == 0


def test_redrive_to_a_destination_keeps_headers_and_groups(
    server: ServerProcess, sqs: Any, store: dirmq.Store
) -> None:
    source, dlq = pipe(server, store, 0, fifo=True)
    destination = fresh("dst") + ".fifo"
    native_put(server, destination, {})
    store.queue(dlq).put_many(
        [
            dirmq.OutgoingMessage(b"a1", {"X-Colour": "blue"}, group="a"),
            dirmq.OutgoingMessage(b"b1", {"X-Colour": "red"}, group="b"),
            dirmq.OutgoingMessage(b"a2", {"X-Colour": "green"}, group="a"),
        ]
    )
    sqs.start_message_move_task(SourceArn=arn(dlq), DestinationArn=arn(destination))
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "COMPLETED", entry
    assert entry["DestinationArn"] == arn(destination)
    assert entry["ApproximateNumberOfMessagesMoved"] == 3
    moved = {m.body: m for m in store.queue(destination).browse()}
    assert set(moved) == {b"a1", b"b1", b"a2"}
    assert moved[b"a1"].headers == {"X-Colour": "blue"} and moved[b"a1"].group == "a"
    assert moved[b"b1"].group == "b" and moved[b"a2"].headers == {"X-Colour": "green"}
    # Group order survives: a2 only once a1 is done.
    queue = store.queue(destination)
    first = queue.get(10, visibility_s=60)
    assert sorted(m.body for m in first) == [b"a1", b"b1"]
    for message in first:
        queue.ack(message.receipt or "")
    assert [m.body for m in queue.get(10, visibility_s=60)] == [b"a2"]
    assert ready(store, dlq) == 0 and ready(store, source) == 0


def test_rate_limit_and_running_entry(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    source, dlq = pipe(server, store, 15)
    started = time.monotonic()
    handle = sqs.start_message_move_task(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=10)[
        "TaskHandle"
    ]
    running = sqs.list_message_move_tasks(SourceArn=arn(dlq), MaxResults=10)["Results"]
    assert len(running) == 1
    assert running[0]["Status"] == "RUNNING"
    assert running[0]["TaskHandle"] == handle
    assert running[0]["MaxNumberOfMessagesPerSecond"] == 10
    assert running[0]["ApproximateNumberOfMessagesToMove"] == 15
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "COMPLETED"
    assert time.monotonic() - started >= 0.9  # 10 at once, the other 5 a second later
    assert sorted(bodies(store, source)) == sorted(f"m{i}".encode() for i in range(15))


def test_empty_dlq_completes_at_once(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    _source, dlq = pipe(server, store, 0)
    sqs.start_message_move_task(SourceArn=arn(dlq))
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "COMPLETED"
    assert entry["ApproximateNumberOfMessagesMoved"] == 0
    assert entry["ApproximateNumberOfMessagesToMove"] == 0


def test_cancel(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    source, dlq = pipe(server, store, 20)
    handle = sqs.start_message_move_task(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=2)[
        "TaskHandle"
    ]
    wait_for(sqs, dlq, lambda e: e["ApproximateNumberOfMessagesMoved"] >= 2)
    moved_at_cancel = sqs.cancel_message_move_task(TaskHandle=handle)[
        "ApproximateNumberOfMessagesMoved"
    ]
    assert 2 <= moved_at_cancel < 20
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "CANCELLED"
    assert "TaskHandle" not in entry
    moved = entry["ApproximateNumberOfMessagesMoved"]
    assert moved < 20
    # Nothing lost, nothing doubled: what moved is in the source, the rest still in the DLQ.
    assert ready(store, source) == moved
    assert ready(store, dlq) == 20 - moved
    assert sorted(bodies(store, source) + bodies(store, dlq)) == sorted(
        f"m{i}".encode() for i in range(20)
    )
    code, status, message = error_of(lambda: sqs.cancel_message_move_task(TaskHandle=handle))
    assert (code, status, message) == ("ResourceNotFoundException", 404, "Task does not exist.")
    # A new task may start now; the list shows both, newest first.
    sqs.start_message_move_task(SourceArn=arn(dlq))
    wait_for(sqs, dlq, finished)
    history = sqs.list_message_move_tasks(SourceArn=arn(dlq), MaxResults=10)["Results"]
    assert [e["Status"] for e in history] == ["COMPLETED", "CANCELLED"]
    assert ready(store, source) == 20 and ready(store, dlq) == 0


def test_one_running_task_per_source(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    _source, dlq = pipe(server, store, 5)
    handle = sqs.start_message_move_task(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=1)[
        "TaskHandle"
    ]
    code, status, message = error_of(lambda: sqs.start_message_move_task(SourceArn=arn(dlq)))
    assert (code, status) == ("InvalidParameterValue", 400)
    assert message.startswith("There is already a task running.")
    sqs.cancel_message_move_task(TaskHandle=handle)
    wait_for(sqs, dlq, finished)


def test_deleted_destination_fails_the_task(
    server: ServerProcess, sqs: Any, store: dirmq.Store
) -> None:
    _source, dlq = pipe(server, store, 10)
    destination = fresh("dst")
    native_put(server, destination, {})
    sqs.start_message_move_task(
        SourceArn=arn(dlq), DestinationArn=arn(destination), MaxNumberOfMessagesPerSecond=2
    )
    wait_for(sqs, dlq, lambda e: e["ApproximateNumberOfMessagesMoved"] >= 1)
    sqs.delete_queue(QueueUrl=f"{server.url}/{ACCOUNT}/{destination}")
    entry = wait_for(sqs, dlq, finished)
    assert entry["Status"] == "FAILED"
    assert entry["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    # The batch in hand went back: every message not moved is still in the DLQ.
    assert ready(store, dlq) == 10 - entry["ApproximateNumberOfMessagesMoved"]


def test_a_dead_letter_queue_shared_by_two_sources_sends_each_message_back_to_its_own(
    server: ServerProcess, sqs: Any, store: dirmq.Store
) -> None:
    """Each dead letter records the queue it died in: without a DestinationArn, a move task of
    a DLQ that two queues share returns each message to its own source, keeping its id; a
    message stored in the DLQ without provenance (by hand) stays, since it has no one source."""
    first, dlq = pipe(server, store, 0)
    second = fresh("src")
    native_put(server, second, {"dead_letter_queue": dlq, "max_receives": 1})
    died: dict[str, set[str]] = {first: set(), second: set()}
    for name in (first, second):
        queue = store.queue(name)
        for i in range(3):
            died[name].add(queue.put(f"{name}-{i}".encode()))
            (message,) = queue.get()
            assert queue.nack(message.receipt or "") == "dead-lettered"
    plain = store.queue(dlq).put(b"by hand")
    sqs.start_message_move_task(SourceArn=arn(dlq))
    entry = wait_for(sqs, dlq, finished)
    assert (entry["Status"], entry["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 6)
    for name in (first, second):
        assert {m.id for m in store.queue(name).browse()} == died[name]
    assert [m.id for m in store.queue(dlq).browse()] == [plain]


# -- errors ----------------------------------------------------------------------------------------


def test_start_errors(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    _source, dlq = pipe(server, store, 1)
    plain = fresh("plain")
    native_put(server, plain, {})

    def start(**params: Any) -> tuple[str, int, str]:
        return error_of(lambda: sqs.start_message_move_task(**params))

    assert start(SourceArn=arn("no-such-queue")) == (
        "ResourceNotFoundException",
        404,
        "The resource that you specified for the SourceArn parameter doesn't exist.",
    )
    assert start(SourceArn=arn(plain)) == (
        "InvalidParameterValue",
        400,
        "Source queue must be configured as a Dead Letter Queue.",
    )
    assert start(SourceArn=arn(dlq), DestinationArn=arn("no-such-queue")) == (
        "ResourceNotFoundException",
        404,
        "The resource that you specified for the DestinationArn parameter doesn't exist.",
    )
    for rate in (0, 501):
        code, _, message = start(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=rate)
        assert code == "InvalidParameterValue" and "MaxNumberOfMessagesPerSecond" in message
    assert start(SourceArn="not-an-arn")[0] == "InvalidParameterValue"
    assert start(SourceArn=arn(dlq), DestinationArn=arn(dlq))[0] == "InvalidParameterValue"
    fifo = fresh("dst") + ".fifo"
    native_put(server, fifo, {})
    assert start(SourceArn=arn(dlq), DestinationArn=arn(fifo))[0] == "InvalidParameterValue"
    assert ready(store, dlq) == 1  # nothing started


def test_list_and_cancel_errors(server: ServerProcess, sqs: Any, store: dirmq.Store) -> None:
    _source, dlq = pipe(server, store, 0)
    assert sqs.list_message_move_tasks(SourceArn=arn(dlq))["Results"] == []
    assert error_of(lambda: sqs.list_message_move_tasks(SourceArn=arn("nope")))[:2] == (
        "ResourceNotFoundException",
        404,
    )
    for bad in (0, 11):
        code, _, message = error_of(
            lambda bad=bad: sqs.list_message_move_tasks(SourceArn=arn(dlq), MaxResults=bad)
        )
        assert code == "InvalidParameterValue" and "MaxResults" in message

    def cancel(handle: str) -> tuple[str, int, str]:
        return error_of(lambda: sqs.cancel_message_move_task(TaskHandle=handle))

    assert cancel("foobared") == (
        "InvalidParameterValue",
        400,
        "Value for parameter TaskHandle is invalid.",
    )
    assert cancel(encode_handle("10f57157-fc38-4da9-a113-4de7e12d05dd", arn("gone"))) == (
        "ResourceNotFoundException",
        404,
        "The resource that you specified for the SourceArn parameter doesn't exist.",
    )
    assert cancel(encode_handle("10f57157-fc38-4da9-a113-4de7e12d05aa", arn(dlq))) == (
        "ResourceNotFoundException",
        404,
        "Task does not exist.",
    )


def test_task_handle_shape() -> None:
    handle = encode_handle("dc16951e-021e-44bd-bf36-11d72fc73c50", arn("dead"))
    assert json.loads(base64.b64decode(handle)) == {
        "taskId": "dc16951e-021e-44bd-bf36-11d72fc73c50",
        "sourceArn": arn("dead"),
    }
    assert decode_handle(handle) == ("dc16951e-021e-44bd-bf36-11d72fc73c50", arn("dead"))


# -- tasks shared between processes ----------------------------------------------------------------


def _client(server: ServerProcess) -> Any:
    """A client of its own: a new connection, which either worker of the server may take."""
    return sqs_client(server.url)


def test_every_worker_sees_and_cancels_the_same_task(tmp_path: Any) -> None:
    """With 2 workers a task lives in files under the root: listing, the one-task rule and
    cancelling work whichever worker a request reaches."""
    server = start_server(tmp_path / "root", "--workers", "2")
    try:
        with dirmq.Store(server.root, create=False) as store:
            _source, dlq = pipe(server, store, 30)
            handle = _client(server).start_message_move_task(
                SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=2
            )["TaskHandle"]
            for _ in range(6):
                sqs = _client(server)
                (entry,) = sqs.list_message_move_tasks(SourceArn=arn(dlq))["Results"]
                assert (entry["Status"], entry["TaskHandle"]) == ("RUNNING", handle)
                code, _status, message = error_of(
                    lambda sqs=sqs: sqs.start_message_move_task(SourceArn=arn(dlq))
                )
                assert code == "InvalidParameterValue", message
            _client(server).cancel_message_move_task(TaskHandle=handle)
            for _ in range(4):
                status = _client(server).list_message_move_tasks(SourceArn=arn(dlq))["Results"]
                assert status[0]["Status"] in ("CANCELLING", "CANCELLED")
            entry = wait_for(_client(server), dlq, finished)
            assert entry["Status"] == "CANCELLED"
            assert entry["ApproximateNumberOfMessagesMoved"] < 30
    finally:
        assert server.stop() == 0


def test_a_task_whose_server_was_killed_resumes_after_a_restart(tmp_path: Any) -> None:
    """SIGKILL mid-task; the next server picks the task up at start-up and finishes it: every
    message ends in the destination exactly once, none stays in the DLQ."""
    root = tmp_path / "root"
    server = start_server(root)
    with dirmq.Store(root, create=False) as store:
        source, dlq = pipe(server, store, 40)
        sqs = _client(server)
        sqs.start_message_move_task(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=10)
        wait_for(sqs, dlq, lambda e: e["ApproximateNumberOfMessagesMoved"] >= 10)
        server.stop(signal.SIGKILL)
        moved_before = ready(store, source)
        assert 10 <= moved_before < 40
    server = start_server(root)
    try:
        sqs = _client(server)
        entry = wait_for(sqs, dlq, finished, timeout_s=90)  # a batch in flight waits LEASE_S
        assert entry["Status"] == "COMPLETED"
        with dirmq.Store(root, create=False) as store:
            assert sorted(bodies(store, source)) == sorted(f"m{i}".encode() for i in range(40))
            assert ready(store, dlq) == 0
    finally:
        assert server.stop() == 0


# -- who runs a task: holds, not flock (NFS) -------------------------------------------------------


@dataclass
class _Task:
    """What TaskFiles needs of a task (the processes below define the same)."""

    task_id: str
    source: str
    status: str = "RUNNING"
    moved: int = 0

    def record(self) -> dict[str, object]:
        return {
            "task_id": self.task_id,
            "source": self.source,
            "status": self.status,
            "moved": self.moved,
            "started_ms": 1,
        }


_TASK = """
import sys, time
from dataclasses import dataclass
from dirmq.redrive.records import TaskFiles
from dirmq.store.filemodes import Access

@dataclass
class Task:
    task_id: str
    source: str
    status: str = "RUNNING"
    moved: int = 0

    def record(self):
        return {"task_id": self.task_id, "source": self.source, "status": self.status,
                "moved": self.moved, "started_ms": 1}
"""

_STARTER = (
    _TASK
    + """
root, me, at = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = TaskFiles(root, access=Access.named("private"))
time.sleep(max(0.0, at - time.time()))
print(files.create(Task(me, "dlq")), flush=True)
sys.stdin.readline()  # keep running the task until every starter has answered
"""
)


def test_of_processes_starting_a_task_of_one_source_at_once_exactly_one_starts(
    tmp_path: Any,
) -> None:
    from dirmq.redrive.records import TaskFiles

    for attempt in range(3):
        root = tmp_path / f"root{attempt}"
        at = time.time() + 1.5  # every process started and waiting by then
        starters = [
            subprocess.Popen(
                [sys.executable, "-c", _STARTER, str(root), f"task{n}", str(at)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(5)
        ]
        answers = []
        for starter in starters:
            assert starter.stdout is not None
            answers.append(starter.stdout.readline().strip())
        for starter in starters:
            starter.communicate("done\n", timeout=30)
        assert sorted(answers) == ["False"] * 4 + ["True"]
        [(record, _cancel)] = TaskFiles(str(root), access=Access.named("private")).load("dlq")
        assert record["task_id"] == f"task{answers.index('True')}"


_STALLED = (
    _TASK
    + """
root = sys.argv[1]
files = TaskFiles(root, access=Access.named("private"), hold_timeout_s=1.0)
task = Task("t", "dlq")
print(files.create(task), flush=True)
sys.stdin.readline()  # stalled: renews nothing meanwhile
task.moved = 999
print(files.save(task), flush=True)
task.status = "COMPLETED"
files.finish(task)
"""
)


def test_a_runner_that_stalls_past_its_hold_is_taken_over_and_writes_nothing_more(
    tmp_path: Any,
) -> None:
    from dirmq.redrive.records import TaskFiles

    task = _Task("t", "dlq")
    files = TaskFiles(str(tmp_path), access=Access.named("private"), hold_timeout_s=1.0)
    stalled = subprocess.Popen(
        [sys.executable, "-c", _STALLED, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stalled.stdout is not None
    try:
        assert stalled.stdout.readline().strip() == "True"
        assert not files.try_own(task)  # its process lives and its hold is fresh
        time.sleep(1.3)
        assert files.try_own(task)  # alive, but silent for longer than its timeout
        task.moved = 5
        assert files.save(task)
        assert stalled.stdin is not None
        stalled.stdin.write("wake up\n")
        stalled.stdin.flush()
        assert stalled.stdout.readline().strip() == "False"  # it learns, and writes nothing
        assert stalled.wait(timeout=30) == 0
        [(record, _cancel)] = files.load("dlq")
        assert (record["status"], record["moved"]) == ("RUNNING", 5)
        task.status = "COMPLETED"
        files.finish(task)
        [(record, _cancel)] = files.load("dlq")
        assert (record["status"], record["moved"]) == ("COMPLETED", 5)
    finally:
        stalled.kill()
        stalled.communicate()


def test_a_killed_runner_is_taken_over_by_a_running_server(tmp_path: Any) -> None:
    """Two servers on one root: while the one running a task lives, the other refuses to start
    another and leaves the task alone; SIGKILLed mid-task, its hold lapses at once (its process
    is gone from this host), the other takes the task over when it next looks, and finishes it:
    every message ends in the destination exactly once, none stays in the DLQ."""
    root = tmp_path / "root"
    first, second = start_server(root), start_server(root)
    try:
        with dirmq.Store(root, create=False) as store:
            source, dlq = pipe(first, store, 40)
            sqs, other = _client(first), _client(second)
            handle = sqs.start_message_move_task(
                SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=10
            )["TaskHandle"]
            wait_for(sqs, dlq, lambda e: e["ApproximateNumberOfMessagesMoved"] >= 10)
            code, _status, _message = error_of(
                lambda: other.start_message_move_task(SourceArn=arn(dlq))
            )
            assert code == "InvalidParameterValue"
            (entry,) = other.list_message_move_tasks(SourceArn=arn(dlq))["Results"]
            assert (entry["Status"], entry["TaskHandle"]) == ("RUNNING", handle)
            first.stop(signal.SIGKILL)
            entry = wait_for(other, dlq, finished, timeout_s=90)  # a batch in flight: LEASE_S
            assert entry["Status"] == "COMPLETED"
            assert sorted(bodies(store, source)) == sorted(f"m{i}".encode() for i in range(40))
            assert ready(store, dlq) == 0
    finally:
        first.stop(signal.SIGKILL)
        assert second.stop() == 0
