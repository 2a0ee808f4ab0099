"""Poison messages contained (issue 32): a message its subscriber always fails comes back after
a growing backoff, at most `max_deliveries` times, then is dismissed once (or dead-lettered)
while other messages keep flowing; a busy subscriber does not hold back other messages'
timeouts; `dirmq sweep` sweeps pub/sub; a failing `--exec` does not flood stderr."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dirmq.client import RemoteStore
from dirmq.client.pubsub import RemotePubSub
from dirmq.errors import InvalidArgument, QueueNotFound
from dirmq.pubsub import PubSub
from dirmq.pubsub.check import check_pubsub
from dirmq.pubsub.policy import DeliveryPolicy
from dirmq.server.credentials import new_token, token_digest
from dirmq.store import Store

from .support.servers import ServerProcess, start_server
from .test_cli_pubsub import PubSubRun, finish

REPLY = "replies"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    started = start_server(tmp_path / "root")
    yield started
    started.stop(signal.SIGKILL if started.proc.poll() is None else signal.SIGTERM)


def reports(url: str, queue: str = REPLY) -> list[tuple[str, str]]:
    """(message id, outcome) of the reports waiting in `queue`, consumed."""
    found: list[tuple[str, str]] = []
    with RemoteStore(url) as store:
        if not store.exists(queue):
            return found
        q = store.queue(queue)
        while (message := q.get_one()) is not None:
            report = json.loads(message.body)
            found.append((report["id"], report["outcome"]))
            q.ack(message.receipt or "")
    return found


@pytest.mark.parametrize("mode", ["anyone", "future"])
def test_a_message_always_failed_is_delivered_at_most_max_times_spaced_by_a_growing_backoff(
    server: ServerProcess, mode: str
) -> None:
    with (
        RemotePubSub(server.url, timeout_s=10) as hub,
        hub.subscribe(
            "worker", channels=["jobs"], max_deliveries=4, backoff_s=0.5, backoff_max_s=10
        ) as sub,
    ):
        acks = "accepted,done,aborted,dismissed"
        poison = hub.publish("jobs", b"poison", mode=mode, acks=acks, reply_to=REPLY).id
        good: set[str] = set()
        done: set[str] = set()
        poison_at: list[float] = []
        deadline = time.monotonic() + 8.0  # 4 deliveries take 0.5 + 1 + 2 s of backoff
        while time.monotonic() < deadline:
            if len(good) < 40:  # others keep coming while the poison one fails
                published = hub.publish("jobs", b"good", mode=mode, acks=acks, reply_to=REPLY)
                good.add(published.id)
            delivery = sub.receive(wait_s=0.1)
            if delivery is None:
                continue
            if delivery.id == poison:
                poison_at.append(time.monotonic())
                sub.abort(delivery)
            else:
                sub.done(delivery)
                done.add(delivery.id)
        while (delivery := sub.receive(wait_s=0.5)) is not None:
            assert delivery.id != poison
            sub.done(delivery)
            done.add(delivery.id)
    assert len(poison_at) == 4, poison_at
    gaps = [b - a for a, b in itertools.pairwise(poison_at)]
    assert 0.4 <= gaps[0] < gaps[1] < gaps[2], gaps  # 0.4-0.5 s, 0.8-1 s, 1.6-2 s
    assert done == good  # the other messages flowed meanwhile, every one processed
    outcomes = Counter(
        outcome for message_id, outcome in reports(server.url) if message_id == poison
    )
    assert outcomes == {"accepted": 4, "aborted": 3, "dismissed": 1}


@pytest.mark.parametrize("mode", ["anyone", "everyone"])
def test_a_message_given_up_on_is_dead_lettered_with_its_provenance(
    server: ServerProcess, mode: str
) -> None:
    with RemoteStore(server.url) as store:
        store.create_queue("dlq")
    with (
        RemotePubSub(server.url, timeout_s=10) as hub,
        hub.subscribe("resizer", max_deliveries=2, backoff_s=0.05, dead_letter="dlq") as sub,
    ):
        poison = hub.publish(
            "images",
            b"not an image",
            mode=mode,
            headers={"X-Attr-Tenant": "42"},
            acks="aborted,dismissed",
            reply_to=REPLY,
        ).id
        deliveries = 0
        while (delivery := sub.receive(wait_s=1)) is not None:
            deliveries += 1
            sub.abort(delivery)
    assert deliveries == 2
    assert reports(server.url) == [(poison, "aborted"), (poison, "dismissed")]
    with httpx.Client(base_url=server.url, timeout=10) as http:
        answer = http.get("/dlq/messages")
        assert answer.status_code == 200, answer.text
        assert answer.content == b"not an image"
        assert answer.headers["X-Attr-Tenant"] == "42"
        assert answer.headers["X-Dead-Reason"] == "max-receives"
        assert answer.headers["X-Dead-Source"] == "@channel/images"
        assert answer.headers["X-Dead-Receive-Count"] == "2"
        assert answer.headers["X-Dead-Detail"] == (
            f"pub/sub message {poison} delivered 2 times to subscription resizer, "
            "the last: aborted by the subscriber"
        )
        assert "X-Dead-At" in answer.headers
        assert http.get("/dlq/messages").status_code == 204  # exactly one


def test_naming_a_dead_letter_queue_needs_write_on_it(tmp_path: Path) -> None:
    worker, other, ops = new_token(), new_token(), new_token()
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(
        f"""
[principals.worker]
token_sha256 = "{token_digest(worker)}"
read = ["@channel/jobs*"]
write = ["jobs-dlq"]

[principals.other]
token_sha256 = "{token_digest(other)}"
read = ["@channel/jobs*"]

[principals.ops]
token_sha256 = "{token_digest(ops)}"
admin = ["*"]
"""
    )
    credentials.chmod(0o600)
    server = start_server(tmp_path / "root", "--credentials", str(credentials))
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.put("/jobs-dlq", headers=_bearer(ops)).status_code == 201
            params = {"channel": "jobs", "dead_letter": "jobs-dlq"}
            for token, status in ((other, 403), (worker, 200)):
                with http.stream(
                    "GET", "/@pubsub/subscribe", params=params, headers=_bearer(token)
                ) as answer:
                    assert answer.status_code == status, token
    finally:
        server.stop()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_policy_is_kept_with_the_subscription_and_checked(server: ServerProcess) -> None:
    with RemotePubSub(server.url, timeout_s=10) as hub:
        with hub.subscribe("kept", max_deliveries=2, backoff_s=0.25, backoff_max_s=1):
            (listed,) = [s for s in hub.subscriptions() if s["name"] == "kept"]
        assert listed["delivery"] == {
            "max_deliveries": 2,
            "backoff_ms": 250,
            "backoff_max_ms": 1000,
            "dead_letter": None,
        }
        with pytest.raises(InvalidArgument, match="backoff max"):
            hub.subscribe("bad", backoff_s=10, backoff_max_s=1)
        with pytest.raises(QueueNotFound, match="create it first"):
            hub.subscribe("bad", dead_letter="no-such-queue")


def test_log_deliveries_count_across_a_restart_of_the_subscription(tmp_path: Path) -> None:
    """An `everyone`/`future` delivery's count lives in the subscription's saved positions: a
    subscriber that gives it back and comes back does not start counting again."""
    with Store(tmp_path / "root") as store:
        hub = PubSub(store)
        hub.publish("c", b"poison", mode="future", acks="dismissed", reply_to=REPLY)
        for _ in range(2):
            with hub.subscribe("w", max_deliveries=3, backoff_s=0) as sub:
                delivery = sub.receive(wait_s=2)
                assert delivery is not None
                sub.abort(delivery)
        with hub.subscribe("w", max_deliveries=3, backoff_s=0) as sub:
            delivery = sub.receive(wait_s=2)
            assert delivery is not None and delivery.body == b"poison"
            assert sub.abort(delivery).value == "dismissed"  # the third delivery: given up on
            assert sub.receive(wait_s=0.3) is None
        with hub.subscribe("w", max_deliveries=3, backoff_s=0) as sub:
            assert sub.receive(wait_s=0.3) is None  # never delivered to it again
        report = store.queue(REPLY).get_one()
        assert report is not None and json.loads(report.body)["outcome"] == "dismissed"
        assert store.queue(REPLY).get_one() is None  # exactly one


def test_a_dead_subscribers_last_delivery_is_dismissed_by_dirmq_sweep(tmp_path: Path) -> None:
    """The subscriber process dies holding an `anyone` message at its last delivery allowed:
    the sweeper applies the subscription's stored policy (dismissed, not returned), and
    `dirmq sweep` sweeps pub/sub, reporting what it did (the dead session's presence too)."""
    ps = PubSubRun(tmp_path / "root")
    message = ps.publish("jobs", b"x", "--ack", "dismissed,aborted", "--reply-to", "out",
                         "--process-timeout", "1s")  # fmt: skip
    proc = ps.start("subscribe", "--name", "w", "--max-deliveries", "1", "--exec", "sleep 5")
    ps.wait_attached("w", proc)
    taken = tmp_path / "root" / "@pubsub" / "subs" / "w" / "taken"
    deadline = time.monotonic() + 30
    while not any(taken.iterdir()):
        assert time.monotonic() < deadline, "the subscriber took nothing"
        time.sleep(0.02)
    proc.kill()  # SIGKILL, mid-command (its `sleep` ends on its own, holding nothing)
    proc.communicate()
    time.sleep(1.2)  # the deadline (1 s, no more heartbeats) passes
    swept = ps.ok("sweep").stdout.decode().splitlines()
    (line,) = [s for s in swept if s.startswith("@pubsub:")]
    counts = dict(part.split("=") for part in line.split()[1:])
    assert counts["dismissed"] == "1" and counts["aborted"] == "0", line
    assert counts["detached"] == "1", line  # the dead session's presence file
    assert ps.outcomes() == [(message, "dismissed")]
    assert not any(taken.iterdir())
    assert not any((tmp_path / "root" / "@pubsub" / "anyone").iterdir())


def test_dirmq_sweep_times_out_pubsub_messages_nobody_accepted(tmp_path: Path) -> None:
    ps = PubSubRun(tmp_path / "root")
    message = ps.publish("nobody", b"x", "--accept-timeout", "100ms", "--ack", "timeout",
                         "--reply-to", "out")  # fmt: skip
    time.sleep(0.2)  # its accept timeout passes
    swept = ps.ok("sweep").stdout.decode().splitlines()
    assert "@pubsub: timed_out=1 aborted=0 dismissed=0 reported=0 recovered=0 removed=0 " \
        "detached=0" in swept  # fmt: skip
    assert ps.outcomes() == [(message, "timeout")]
    # A root without pub/sub: no such line; one queue: only that queue.
    bare = PubSubRun(tmp_path / "bare")
    bare.ok("create", "q")
    assert bare.ok("sweep").stdout.decode().startswith("q: ")
    assert "@pubsub" not in ps.ok("sweep", "out").stdout.decode()


def test_a_busy_subscriber_does_not_hold_back_another_messages_timeout(tmp_path: Path) -> None:
    """The trial: the only process using the root is a subscriber busy with one message (here
    a long `--exec`); another message's accept timeout passes. Its `timeout` report used to wait
    until the subscriber was idle (only an idle `receive` swept); the subscription's heartbeat
    thread sweeps now."""
    ps = PubSubRun(tmp_path / "root")
    ps.ok("create", "out")
    ps.publish("jobs", b"long work")
    proc = ps.start("subscribe", "--channel", "jobs", "--exec", "sleep 30")
    try:
        subs = tmp_path / "root" / "@pubsub" / "subs"
        deadline = time.monotonic() + 30
        while not any(any(taken.iterdir()) for taken in subs.glob("*/taken")):
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the subscriber took nothing"
            time.sleep(0.02)
        other = ps.publish("other", b"x", "--accept-timeout", "500ms", "--ack", "timeout",
                           "--reply-to", "out")  # fmt: skip
        deadline = time.monotonic() + 10
        while not (found := ps.outcomes()):
            assert time.monotonic() < deadline, "no timeout report while the subscriber was busy"
            time.sleep(0.1)
        assert found == [(other, "timeout")]
        assert proc.poll() is None  # still busy with its message
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc)


def test_a_failing_exec_warns_at_most_once_per_interval(tmp_path: Path) -> None:
    """30 failures of one message (no backoff, no limit, to make them fast): one warning
    line, and at exit one more saying how many were held back."""
    ps = PubSubRun(tmp_path / "root")
    message = ps.publish("jobs", b"x")
    result = ps("subscribe", "--exec", "exit 3", "--backoff", "0", "--max-deliveries", "0",
                "--count", "30")  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stderr.decode().splitlines()
    assert lines == [
        f"dirmq: warning: 'exit 3' exited 3: message {message} given back",
        f"dirmq: warning: 29 similar warnings held back, the last: 'exit 3' exited 3: "
        f"message {message} given back",
    ]


def test_a_failing_exec_dismisses_after_max_deliveries(tmp_path: Path) -> None:
    ps = PubSubRun(tmp_path / "root")
    message = ps.publish("jobs", b"x", "--ack", "aborted,dismissed", "--reply-to", "out")
    result = ps("subscribe", "--exec", "exit 3", "--backoff", "50ms", "--max-deliveries", "3",
                "--wait", "1s")  # fmt: skip
    lines = result.stderr.decode().splitlines()
    assert f"dirmq: warning: 'exit 3' exited 3: message {message} dismissed (delivered 3 " \
        "times)" in lines  # fmt: skip
    assert ps.outcomes() == [(message, "aborted"), (message, "aborted"), (message, "dismissed")]


def test_backoff_grows_to_its_cap_with_jitter_below() -> None:
    policy = DeliveryPolicy(max_deliveries=0, backoff_s=1, backoff_max_s=5)
    for deliveries, full_ms in ((1, 1000), (2, 2000), (3, 4000), (4, 5000), (60, 5000)):
        for _ in range(50):
            assert 0.8 * full_ms <= policy.backoff_ms(deliveries) <= full_ms
    assert not policy.exhausted(10**6)
    assert DeliveryPolicy(max_deliveries=3).exhausted(3)
    assert DeliveryPolicy(backoff_s=0).backoff_ms(5) == 0
    with pytest.raises(InvalidArgument, match="max deliveries"):
        DeliveryPolicy(max_deliveries=-1)


def test_fsck_accepts_entries_that_count_deliveries_and_wait_a_backoff(tmp_path: Path) -> None:
    with Store(tmp_path / "root") as store:
        hub = PubSub(store)
        hub.publish("c", b"x")
        with hub.subscribe("w", backoff_s=60) as sub:
            delivery = sub.receive(wait_s=2)
            assert delivery is not None
            (taken,) = (tmp_path / "root" / "@pubsub" / "subs" / "w" / "taken").iterdir()
            assert taken.name.endswith(".1")  # its first delivery
            report = check_pubsub(str(tmp_path / "root"))
            assert report is not None and report.findings == []
            sub.abort(delivery)
            assert sub.receive(wait_s=0.2) is None  # waiting out its backoff
        (pooled,) = (tmp_path / "root" / "@pubsub" / "anyone").iterdir()
        assert len(pooled.name.split(".")) == 4  # key, accept ms, deliveries, due ms
        report = check_pubsub(str(tmp_path / "root"))
        assert report is not None and report.findings == []


@pytest.mark.parametrize("mode", ["anyone", "future"])
def test_a_dead_letter_queue_that_refuses_keeps_the_message_given_back(
    tmp_path: Path, mode: str
) -> None:
    with Store(tmp_path / "root") as store:
        store.create_queue("dlq")
        hub = PubSub(store)
        hub.publish("c", b"poison", mode=mode)
        with hub.subscribe("w", max_deliveries=1, backoff_s=0, dead_letter="dlq") as sub:
            store.delete_queue("dlq")  # deleted since the subscription attached
            delivery = sub.receive(wait_s=2)
            assert delivery is not None
            assert sub.abort(delivery, "bad") == "aborted"  # kept: not lost, not dismissed
            store.create_queue("dlq")
            delivery = sub.receive(wait_s=2)
            assert delivery is not None and delivery.body == b"poison"
            assert sub.abort(delivery, "bad again") == "dismissed"
            assert sub.receive(wait_s=0.2) is None
        dead = store.queue("dlq").get_one()
        assert dead is not None and dead.body == b"poison" and dead.dead is not None
        assert dead.dead.receive_count == 2
        assert dead.dead.detail is not None and dead.dead.detail.endswith("the last: bad again")
        assert store.queue("dlq").get_one() is None
