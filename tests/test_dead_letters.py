"""Dead letters that say why, on every door: refused targets, provenance after each reason,
the own dead area as a state (browse, purge), and what a nack that dead-letters answers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from botocore.exceptions import ClientError

import dirmq
from dirmq.client import RemoteStore
from dirmq.store import codec, layout

from .support.servers import ServerProcess, fresh, sqs_client


def cli(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "dirmq", "--root", str(root), *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


# -- dead-letter targets are checked on every door -----------------------------------------------
def test_a_missing_or_self_dead_letter_queue_is_refused_on_every_door(
    module_server: ServerProcess, module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    jobs, dlq = fresh("jobs"), fresh("jobs-dlq")
    typo = dlq.replace("dlq", "dql")
    module_lib.create_queue(dlq)
    for bad in (typo, jobs):
        with pytest.raises(dirmq.InvalidArgument, match="dead-letter queue"):
            module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1, dead_letter_queue=bad))
        answer = module_http.put(f"/{jobs}", json={"max_receives": 1, "dead_letter_queue": bad})
        assert answer.status_code == 400, answer.text
        assert "dead-letter queue" in answer.json()["message"]
        done = cli(module_server.root, "create", jobs, "--max-receives", "1", "--dead-letter", bad)
        assert done.returncode == 2, done.stderr
        assert b"dead-letter queue" in done.stderr
        assert not module_lib.exists(jobs)
    missing = module_http.put(
        f"/{jobs}", json={"max_receives": 1, "dead_letter_queue": typo}
    ).json()
    assert missing["message"] == (
        f"dead-letter queue {typo!r} does not exist: create it first (dirmq create {typo}, or "
        f"PUT /{typo})"
    )
    # An existing queue may not be reconfigured to name one either, by any door.
    module_lib.create_queue(jobs)
    with pytest.raises(dirmq.InvalidArgument):
        module_lib.configure(jobs, dead_letter_queue=jobs)
    assert module_http.put(f"/{jobs}", json={"dead_letter_queue": typo}).status_code == 400
    assert cli(module_server.root, "configure", jobs, "--dead-letter", typo).returncode == 2
    assert module_lib.queue(jobs).config.dead_letter_queue is None
    module_http.put(f"/{jobs}", json={"dead_letter_queue": dlq}).raise_for_status()
    module_lib.queue(jobs).reload_config()
    assert module_lib.queue(jobs).config.dead_letter_queue == dlq


def test_sqs_refuses_a_redrive_policy_naming_a_missing_queue(module_server: ServerProcess) -> None:
    sqs = sqs_client(module_server.url)
    url = sqs.create_queue(QueueName=fresh("sqsjobs"))["QueueUrl"]
    policy = '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:nowhere", '
    policy += '"maxReceiveCount": "1"}'
    with pytest.raises(ClientError) as info:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    assert info.value.response["Error"]["Code"] in (
        "InvalidParameterValue",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
    )


# -- provenance ---------------------------------------------------------------------------------
def test_each_reason_leaves_its_provenance_in_the_file_and_on_every_door(
    module_server: ServerProcess, module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    """max-receives (by a nack, and by a lease that expired), rejected with words, unreadable:
    the dead letter keeps its id, body, headers and group, and says why, where from, after how
    many receives and when: in its file, to the library, as X-Dead-* headers and in a browse."""
    dlq, jobs = fresh("dlq"), fresh("jobs")
    module_lib.create_queue(dlq)
    module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=2, dead_letter_queue=dlq))
    queue = module_lib.queue(jobs)
    before = time.time()
    ids = {
        name: queue.put(name.encode(), {"X-Attr-Kind": name})
        for name in ("nacked", "expired", "rejected", "unreadable")
    }
    got = {m.body.decode(): m for m in queue.get(4, visibility_s=60)}
    assert queue.nack(got["nacked"].receipt or "") == "returned"  # 1 of 2 receives
    queue.extend(got["expired"].receipt or "", 0.05)
    queue.dead_letter(got["rejected"].receipt or "", "bad sku 42")
    queue.dead_letter(got["unreadable"].receipt or "", reason="unreadable")
    (again,) = queue.get(visibility_s=60)
    assert again.body == b"nacked"
    answer = module_http.post(f"/{jobs}/messages/{again.receipt}/nack")
    assert answer.status_code == 204 and answer.headers["x-outcome"] == "dead-lettered"
    time.sleep(0.1)
    (expired,) = queue.get(visibility_s=0.01)  # its second receive
    time.sleep(0.05)
    assert queue.sweep().dead_lettered == 1
    assert expired.body == b"expired"

    expected = {
        "nacked": ("max-receives", 2, None),
        "expired": ("max-receives", 2, None),
        "rejected": ("rejected", 1, "bad sku 42"),
        "unreadable": ("unreadable", 1, None),
    }
    dead_queue = module_lib.queue(dlq)
    browsed = {m.id: m for m in dead_queue.browse()}
    assert set(browsed) == set(ids.values())
    for name, (reason, count, detail) in expected.items():
        message = browsed[ids[name]]
        assert (message.body, message.headers) == (name.encode(), {"X-Attr-Kind": name})
        assert message.receive_count == 0  # not yet received where it is now
        assert message.dead is not None
        assert (message.dead.reason, message.dead.source) == (reason, jobs)
        assert (message.dead.receive_count, message.dead.detail) == (count, detail)
        assert before - 1 <= message.dead.at_s <= time.time() + 1
        # In the file, readable with cat: the codec's system headers.
        path = Path(dead_queue.path) / layout.READY / ids[name]
        decoded = codec.decode(path.read_bytes(), ids[name])
        assert decoded.system["Dead-Reason"] == reason
        assert decoded.system["Dead-Source"] == jobs
        # Native: on a peek, and on a delivery.
        peeked = module_http.get(f"/{dlq}/messages/{ids[name]}")
        assert peeked.headers["x-dead-reason"] == reason
        assert peeked.headers["x-dead-source"] == jobs
        assert peeked.headers["x-dead-receive-count"] == str(count)
        assert peeked.headers["x-dead-at"].endswith("Z")
        assert peeked.headers.get("x-dead-detail") == detail
    page = module_http.get(f"/{dlq}/messages", params={"peek": 1}).json()["messages"]
    rejected = next(m for m in page if m["id"] == ids["rejected"])
    assert rejected["dead"]["reason"] == "rejected" and rejected["dead"]["detail"] == "bad sku 42"
    # The HTTP client rebuilds the provenance from the headers.
    with RemoteStore(module_server.url) as remote:
        delivered = remote.queue(dlq).get(4)
        assert {m.id: m.dead.reason for m in delivered if m.dead} == {
            i: expected[n][0] for n, i in ids.items()
        }
        remote.queue(dlq).ack_many(m.receipt or "" for m in delivered)
        # The streaming consumer's deliveries carry it too.
        again = module_lib.queue(jobs)
        again.put(b"streamed")
        (last,) = again.get()
        again.dead_letter(last.receipt or "", "over a stream")
        with remote.queue(dlq).consume(prefetch=1) as consumer:
            streamed = consumer.get(timeout_s=10)
            assert streamed is not None and streamed.dead is not None
            assert (streamed.dead.reason, streamed.dead.detail) == ("rejected", "over a stream")
            consumer.ack(streamed)


def test_sqs_shows_provenance_as_attributes(
    module_server: ServerProcess, module_lib: dirmq.Store
) -> None:
    sqs = sqs_client(module_server.url)
    dlq_url = sqs.create_queue(QueueName=fresh("sqsdlq"))["QueueUrl"]
    dlq = dlq_url.rsplit("/", 1)[1]
    source = fresh("sqssrc")
    module_lib.create_queue(source, dirmq.QueueConfig(max_receives=1, dead_letter_queue=dlq))
    queue = module_lib.queue(source)
    queue.put(b"poison", {"X-Attr-Colour": "blue"})
    (message,) = queue.get()
    queue.dead_letter(message.receipt or "", "cannot parse")
    got = sqs.receive_message(
        QueueUrl=dlq_url, AttributeNames=["All"], MessageAttributeNames=["All"]
    )["Messages"][0]
    assert got["Body"] == "poison"
    assert got["Attributes"]["DeadLetterQueueSourceArn"].endswith(f":{source}")
    attributes = got["MessageAttributes"]
    assert attributes["Colour"]["StringValue"] == "blue"
    assert attributes["dirmq.DeadReason"]["StringValue"] == "rejected"
    assert attributes["dirmq.DeadDetail"]["StringValue"] == "cannot parse"
    assert attributes["dirmq.DeadReceiveCount"] == {"StringValue": "1", "DataType": "Number"}


def test_a_batch_nack_says_which_were_dead_lettered(
    module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    jobs = fresh("jobs")
    module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=2))
    queue = module_lib.queue(jobs)
    queue.put_many([b"a", b"b"])
    first = queue.get(2)
    queue.nack(first[0].receipt or "")  # a has used one of its two receives
    queue.nack(first[1].receipt or "")
    once = {m.body: m.receipt for m in queue.get(2)}
    answer = module_http.post(f"/{jobs}/messages/nack", json={"receipts": list(once.values())})
    assert answer.json() == {
        "settled": 2,
        "failed": [],
        "dead_lettered": [once[b"a"], once[b"b"]],
    }
    assert queue.stats().dead == 2


def test_a_consumer_verdict_is_checked(module_http: httpx.Client, module_lib: dirmq.Store) -> None:
    jobs = fresh("jobs")
    module_lib.create_queue(jobs)
    queue = module_lib.queue(jobs)
    queue.put(b"x")
    (message,) = queue.get()
    receipt = message.receipt or ""
    with pytest.raises(dirmq.InvalidArgument, match="reason must be one of"):
        queue.dead_letter(receipt, reason="max-receives")  # the store's verdict, not a consumer's
    with pytest.raises(dirmq.InvalidArgument, match="control"):
        queue.dead_letter(receipt, "two\nlines")
    answer = module_http.post(
        f"/{jobs}/messages/{receipt}/dead-letter", params={"reason": "x" * 2000}
    )
    assert answer.status_code == 400 and "the limit is 1024" in answer.json()["message"]
    answer = module_http.post(f"/{jobs}/messages/{receipt}/dead-letter", params={"kind": "bored"})
    assert answer.status_code == 400
    assert queue.stats().in_flight == 1  # nothing happened to it
    answer = module_http.post(
        f"/{jobs}/messages/{receipt}/dead-letter", params={"reason": "ünïcode"}
    )
    assert answer.status_code == 204
    assert next(queue.browse(state="dead")).dead.detail == "ünïcode"  # type: ignore[union-attr]


# -- the own dead area: a state -----------------------------------------------------------------
def test_the_own_dead_area_is_browsed_counted_and_purged_on_every_door(
    module_server: ServerProcess, module_http: httpx.Client, module_lib: dirmq.Store
) -> None:
    jobs = fresh("jobs")
    module_lib.create_queue(jobs, dirmq.QueueConfig(max_receives=1))
    queue = module_lib.queue(jobs)
    dead_ids = [queue.put(f"dead{i}".encode()) for i in range(3)]
    live = queue.put(b"live")
    for message in queue.get(3):
        queue.nack(message.receipt or "")
    assert [m.id for m in queue.browse(state="dead")] == dead_ids
    assert [m.id for m in queue.browse()] == [live]
    page = module_http.get(f"/{jobs}/messages", params={"peek": 1, "state": "dead", "max": 2})
    assert [m["id"] for m in page.json()["messages"]] == dead_ids[:2]
    assert {m["state"] for m in page.json()["messages"]} == {"dead"}
    after = module_http.get(
        f"/{jobs}/messages", params={"peek": 1, "state": "dead", "after": dead_ids[1]}
    )
    assert [m["id"] for m in after.json()["messages"]] == dead_ids[2:]
    bad = module_http.get(f"/{jobs}/messages", params={"peek": 1, "state": "gone"})
    assert bad.status_code == 400 and "dead" in bad.json()["message"]
    assert module_http.get(f"/{jobs}/messages", params={"state": "dead"}).status_code == 400
    shown = cli(module_server.root, "peek", "--dead", jobs)
    assert shown.returncode == 0, shown.stderr
    assert [line.split()[0] for line in shown.stdout.decode().splitlines()[1:]] == dead_ids
    listed = cli(module_server.root, "ls", jobs)
    assert listed.returncode == 0
    row = next(line for line in listed.stdout.decode().splitlines() if line.startswith(jobs))
    assert row.split()[1:] == ["1", "0", "0", "3"]
    # A purge of the live messages leaves the dead area; a purge of the dead area, the rest.
    assert module_http.delete(f"/{jobs}/messages", params={"state": "dead"}).json() == {"purged": 3}
    assert queue.stats().dead == 0 and queue.stats().ready == 1
    assert module_http.delete(f"/{jobs}/messages", params={"state": "ready"}).status_code == 400
    queue.put(b"dies too")
    for message in queue.get(2):
        queue.nack(message.receipt or "")
    purged = cli(module_server.root, "purge", "--dead", jobs)
    assert purged.returncode == 0 and purged.stdout == b"purged 2 message(s)\n"
    assert queue.stats().dead == 0


def test_a_dead_copy_that_cannot_be_written_leaves_the_message_dead_and_whole(
    tmp_path: Path,
) -> None:
    """The dead-letter queue refuses the copy (its @tmp is no directory: every create there
    fails, as on a full or failing disk): the message stays dead in the source's own dead
    area, whole, and the settle still succeeds."""
    store = dirmq.Store(tmp_path / "root")
    dlq = store.create_queue("dlq")
    jobs = store.create_queue("jobs", dirmq.QueueConfig(max_receives=1, dead_letter_queue="dlq"))
    message_id = jobs.put(b"keep me", {"X-Attr-K": "v"})
    (message,) = jobs.get()
    tmp = Path(dlq.path) / layout.TMP
    tmp.rename(tmp.with_name("@tmp.away"))
    tmp.write_bytes(b"")
    try:
        jobs.dead_letter(message.receipt or "", "full")
    finally:
        tmp.unlink()
        tmp.with_name("@tmp.away").rename(tmp)
    (kept,) = jobs.browse(state="dead")
    assert (kept.id, kept.body, kept.headers) == (message_id, b"keep me", {"X-Attr-K": "v"})
    assert dlq.stats().ready == 0 and jobs.stats().in_flight == 0
    # Redriven later, it goes back to its queue whole.
    assert jobs.redrive() == 1
    assert [m.id for m in jobs.browse()] == [message_id]
    store.close()


def test_put_dead_letter_stores_a_message_that_died_elsewhere(module_lib: dirmq.Store) -> None:
    dlq = module_lib.create_queue(fresh("dlq"))
    message_id = dlq.put_dead_letter(
        b"b",
        {"X-Attr-K": "v"},
        reason="max-receives",
        source="@channel/orders",
        receive_count=5,
        detail="aborted",
        group="g1",
    )
    (message,) = dlq.get()
    assert (message.id, message.group, message.headers) == (message_id, "g1", {"X-Attr-K": "v"})
    assert message.dead is not None
    assert (message.dead.source, message.dead.receive_count) == ("@channel/orders", 5)
    with pytest.raises(dirmq.InvalidArgument):
        dlq.put_dead_letter(b"", reason="bored", source="x", receive_count=1)


def test_the_cli_says_when_a_nack_dead_letters(module_server: ServerProcess) -> None:
    jobs = fresh("jobs")
    assert cli(module_server.root, "create", jobs, "--max-receives", "2").returncode == 0
    assert cli(module_server.root, "put", jobs, stdin=b"x").returncode == 0
    for attempt in (1, 2):
        got = cli(module_server.root, "get", jobs)
        receipt = got.stderr.decode().split()[-1]
        nacked = cli(module_server.root, "nack", jobs, receipt)
        assert nacked.returncode == 0
        said = b"dead-lettered (max_receives reached): now in its own dead area" in nacked.stderr
        assert said == (attempt == 2), nacked.stderr
    shown = cli(module_server.root, "peek", "--dead", "--json", jobs)
    assert json.loads(shown.stdout)["dead"]["reason"] == "max-receives"
