"""Redrive, over HTTP and from the shell: a queue's own dead area back to it, a dead-letter
queue shared by two sources back to each message's source, by ids and by reason, paced,
cancelled half-way, and resumed after a SIGKILL of the server with every message moved once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import dirmq
from dirmq.redrive import model
from dirmq.redrive.records import TaskFiles
from dirmq.redrive.tasks import Redrives

from .support.servers import ServerProcess, fresh, start_server


def kill(queue: dirmq.Queue, count: int, *, verdict: str | None = None) -> list[str]:
    """Publish `count` messages and dead-letter each (a nack past max receives, or a consumer's
    verdict: "rejected" or "unreadable"); their ids, oldest first."""
    ids = [queue.put(f"{queue.name}-{i}".encode(), {"X-Attr-N": str(i)}) for i in range(count)]
    for message in queue.get(count, max_per_group=None):
        if verdict is None:
            queue.nack(message.receipt or "")
        else:
            queue.dead_letter(message.receipt or "", reason=verdict)
    return ids


def shared_dlq(lib: dirmq.Store, count: int) -> tuple[str, dict[str, list[str]]]:
    """A dead-letter queue two sources share, holding `count` dead letters of each."""
    dlq = fresh("dlq")
    lib.create_queue(dlq)
    died = {}
    for _ in range(2):
        name = fresh("src")
        queue = lib.create_queue(name, dirmq.QueueConfig(max_receives=1, dead_letter_queue=dlq))
        died[name] = kill(queue, count)
    return dlq, died


def wait_task(
    http: httpx.Client, path: str, done: Callable[[dict[str, Any]], bool], timeout_s: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            task: dict[str, Any] = http.get(path).json()
        except httpx.TransportError:
            task = {}
        if task and done(task):
            return task
        assert time.monotonic() < deadline, f"the task never got there: {task}"
        time.sleep(0.05)


def finished(task: dict[str, Any]) -> bool:
    return task.get("status") in ("completed", "cancelled", "failed")


def ids_in(lib: dirmq.Store, name: str, state: str = "ready") -> list[str]:
    return [m.id for m in lib.queue(name).browse(state=state)]


def test_a_shared_dead_letter_queue_is_redriven_to_each_source_keeping_ids_and_headers(
    module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    dlq, died = shared_dlq(module_lib, 3)
    first = next(iter(died))
    started = module_http.post(f"/{dlq}/redrive")
    assert started.status_code == 202, started.text
    task = started.json()
    assert started.headers["location"] == f"/{dlq}/redrive/{task['task_id']}"
    assert task["status"] in ("running", "completed")  # 6 moves may be done before the answer
    assert (task["to_move"], task["to"]) == (6, None)
    done = wait_task(module_http, started.headers["location"], finished)
    assert (done["status"], done["moved"], done["left"]) == ("completed", 6, {})
    for name, ids in died.items():
        assert ids_in(module_lib, name) == ids
        for i, message in enumerate(module_lib.queue(name).browse()):
            assert message.headers == {"X-Attr-N": str(i)}
            assert message.receive_count == 0
            assert message.dead is not None and message.dead.source == name  # its history
    assert ids_in(module_lib, dlq) == []
    listed = module_http.get(f"/{dlq}/redrive").json()["tasks"]
    assert [t["task_id"] for t in listed] == [task["task_id"]]
    # A second redrive finds nothing dead: the redriven messages are live in their sources.
    again = module_http.post(f"/{dlq}/redrive").json()
    assert wait_task(module_http, f"/{dlq}/redrive/{again['task_id']}", finished)["moved"] == 0
    assert ids_in(module_lib, first) == died[first]
    # Their sources have no dead to redrive either.
    for name in died:
        nothing = module_http.post(f"/{name}/redrive").json()
        assert (
            wait_task(module_http, f"/{name}/redrive/{nothing['task_id']}", finished)["moved"] == 0
        )
        assert ids_in(module_lib, name) == died[name]


def test_by_ids_by_reason_and_to_a_queue_named(
    module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    jobs, other = fresh("jobs"), fresh("other")
    queue = module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1))
    module_lib.create_queue(other)
    expired = kill(queue, 3)  # max-receives
    rejected = kill(queue, 2, verdict="rejected")
    unreadable = kill(queue, 2, verdict="unreadable")
    assert ids_in(module_lib, jobs, "dead") == sorted(expired + rejected + unreadable)

    by_ids = module_http.post(f"/{jobs}/redrive", json={"ids": [expired[1], rejected[0]]}).json()
    assert wait_task(module_http, f"/{jobs}/redrive/{by_ids['task_id']}", finished)["moved"] == 2
    assert ids_in(module_lib, jobs) == sorted([expired[1], rejected[0]])

    by_reason = module_http.post(
        f"/{jobs}/redrive", json={"reason": "unreadable", "to": other}
    ).json()
    task = wait_task(module_http, f"/{jobs}/redrive/{by_reason['task_id']}", finished)
    assert (task["moved"], task["to"], task["reason"]) == (2, other, "unreadable")
    assert ids_in(module_lib, other) == unreadable
    assert ids_in(module_lib, jobs, "dead") == sorted([expired[0], expired[2], rejected[1]])

    everything = module_http.post(f"/{jobs}/redrive").json()
    assert (
        wait_task(module_http, f"/{jobs}/redrive/{everything['task_id']}", finished)["moved"] == 3
    )
    assert ids_in(module_lib, jobs, "dead") == []
    assert ids_in(module_lib, jobs) == sorted(expired + rejected)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"ids": "x"}, "list of message ids"),
        ({"ids": ["nonsense"]}, "not a dirmq message id"),
        ({"reason": "bored"}, "reason must be one of"),
        ({"ids": [], "reason": "rejected"}, "not both"),
        ({"rate_per_s": 0}, "rate_per_s must be from 1"),
        ({"rate_per_s": "fast"}, "rate_per_s must be an integer"),
        ({"to": "no-such-queue"}, "does not exist"),
        ({"colour": "blue"}, "unknown key"),
    ],
)
def test_a_bad_start_is_refused_saying_why(
    module_http: httpx.Client, module_lib: dirmq.Store, body: dict[str, Any], words: str
) -> None:
    jobs = fresh("jobs")
    kill(module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1)), 1)
    answer = module_http.post(f"/{jobs}/redrive", json=body)
    assert answer.status_code in (400, 404), answer.text
    assert words in answer.json()["message"]
    assert module_http.get(f"/{jobs}/redrive").json() == {"tasks": []}
    assert module_lib.queue(jobs).stats().dead == 1


def test_one_redrive_of_a_queue_at_a_time_and_unknown_tasks(
    module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    jobs = fresh("jobs")
    kill(module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1)), 20)
    slow = module_http.post(f"/{jobs}/redrive", json={"rate_per_s": 5}).json()
    busy = module_http.post(f"/{jobs}/redrive")
    assert busy.status_code == 409 and "already running" in busy.json()["message"]
    assert module_http.get(f"/{jobs}/redrive/{'f' * 32}").status_code == 404
    assert module_http.get(f"/{fresh('no-such-queue')}/redrive").status_code == 404
    module_http.delete(f"/{jobs}/redrive/{slow['task_id']}").raise_for_status()
    wait_task(module_http, f"/{jobs}/redrive/{slow['task_id']}", finished)


def test_a_paced_redrive_takes_its_time_and_a_cancel_stops_it_half_way(
    module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    """100 messages at 20 a second take about 5 s (timed); another 100 at 20 a second,
    cancelled after about 2 s, stop with about 40 moved, and those are exactly the oldest."""
    jobs = fresh("jobs")
    queue = module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1))
    kill(queue, 100)
    began = time.monotonic()
    task = module_http.post(f"/{jobs}/redrive", json={"rate_per_s": 20}).json()
    done = wait_task(module_http, f"/{jobs}/redrive/{task['task_id']}", finished)
    took = time.monotonic() - began
    assert done["moved"] == 100 and done["rate_per_s"] == 20
    assert 4.5 <= took <= 8.0, took

    queue.purge()  # the redriven ones: the next get must take the new messages
    dead = kill(queue, 100)
    task = module_http.post(f"/{jobs}/redrive", json={"rate_per_s": 20}).json()
    path = f"/{jobs}/redrive/{task['task_id']}"
    time.sleep(2)
    cancelled = module_http.delete(path).json()
    assert cancelled["status"] in ("cancelling", "cancelled")
    done = wait_task(module_http, path, finished)
    assert done["status"] == "cancelled"
    assert 20 <= done["moved"] <= 60, done
    still_dead = ids_in(module_lib, jobs, "dead")
    assert len(still_dead) == 100 - done["moved"]
    assert still_dead == dead[done["moved"] :]  # oldest first: the moved ones are the first
    assert module_http.delete(path).json()["status"] == "cancelled"  # a finished task stays so


def test_a_redrive_resumes_after_a_sigkill_and_moves_each_message_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    first = start_server(root)
    try:
        with dirmq.Store(root, create=False) as lib:
            dlq, died = shared_dlq(lib, 40)
            with httpx.Client(base_url=first.url, timeout=30) as http:
                task = http.post(f"/{dlq}/redrive", json={"rate_per_s": 20}).json()
                path = f"/{dlq}/redrive/{task['task_id']}"
                wait_task(http, path, lambda t: t["moved"] >= 10)
            first.stop(signal.SIGKILL)
            moved_before = sum(len(ids_in(lib, name)) for name in died)
            assert 10 <= moved_before < 80
            second = start_server(root)  # resumes it at start-up, from its record
            try:
                with httpx.Client(base_url=second.url, timeout=30) as http:
                    done = wait_task(http, path, finished, timeout_s=60)
            finally:
                assert second.stop() == 0
            assert done["status"] == "completed"
            for name, ids in died.items():
                assert ids_in(lib, name) == ids  # each once, every one
            assert ids_in(lib, dlq) == []
    finally:
        first.stop(signal.SIGKILL)


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dirmq", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dirmq_redrive_from_the_shell(
    module_server: ServerProcess, module_lib: dirmq.Store
) -> None:
    dlq, died = shared_dlq(module_lib, 2)
    first, second = died
    shown = cli(module_server.root, "redrive", dlq, "--ids", died[first][0], "--json")
    assert shown.returncode == 0, shown.stderr
    task = json.loads(shown.stdout)
    assert (task["status"], task["moved"]) == ("completed", 1)
    assert ids_in(module_lib, first) == died[first][:1]
    done = cli(module_server.root, "redrive", dlq, "--reason", "max-receives", "--rate", "100")
    assert done.returncode == 0, done.stderr
    assert "redrove 3 message(s)" in done.stdout
    assert ids_in(module_lib, first) == died[first] and ids_in(module_lib, second) == died[second]
    listed = cli(module_server.root, "redrive", dlq, "--list")
    assert listed.returncode == 0 and listed.stdout.count("completed") == 2
    refused = cli(module_server.root, "redrive", dlq, "--reason", "bored")
    assert refused.returncode == 2 and "invalid choice: 'bored'" in refused.stderr


def test_dirmq_redrive_says_busy_and_unknown_task_by_exit_code(
    module_server: ServerProcess, module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    """A redrive of a queue already being redriven (here by the module_server) is exit 10 (busy), a
    cancel of a task the queue never had exit 3 (not found): one line each, no traceback."""
    jobs = fresh("jobs")
    kill(module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1)), 20)
    slow = module_http.post(f"/{jobs}/redrive", json={"rate_per_s": 5}).json()
    busy = cli(module_server.root, "redrive", jobs)
    assert busy.returncode == 10, busy.stderr
    assert (
        busy.stderr.startswith("dirmq: error: a redrive of queue")
        and "Traceback" not in busy.stderr
    )
    unknown = cli(module_server.root, "redrive", jobs, "--cancel", "f" * 32)
    assert unknown.returncode == 3, unknown.stderr
    assert unknown.stderr == f"dirmq: error: no redrive task {'f' * 32!r} of queue {jobs!r}\n"
    module_http.delete(f"/{jobs}/redrive/{slow['task_id']}").raise_for_status()
    wait_task(module_http, f"/{jobs}/redrive/{slow['task_id']}", finished)


def test_a_cancel_answers_cancelling_though_the_runner_stops_before_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task a cancel answers is the task as it was asked, CANCELLING: this process's
    runner may read the cancel and stop it, CANCELLED, before the answer is written (it
    answered `cancelled` then; the docs' example flaked on it under load)."""
    store = dirmq.Store(tmp_path / "root")
    try:
        jobs = store.create_queue("jobs", dirmq.QueueConfig(max_receives=1))
        kill(jobs, 3)
        tasks = Redrives(store, resume=False)
        running = tasks.start("jobs", rate_per_s=1, background=False)
        real_request = TaskFiles.request_cancel

        def request_then_stop(files: TaskFiles, task: model.RedriveTask) -> None:
            real_request(files, task)
            running.status = model.CANCELLED  # the runner got there first

        monkeypatch.setattr(TaskFiles, "request_cancel", request_then_stop)
        with tasks._lock:
            tasks._running[running.task_id] = (running, threading.Event())
        answered = tasks.cancel("jobs", running.task_id)
        assert answered.to_json()["status"] == "cancelling"
        assert running.status == model.CANCELLED and answered is not running
    finally:
        store.close()
