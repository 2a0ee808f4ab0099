"""Publish/subscribe in the brokerless library: modes, filters, outcomes, crashes, faults."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dirmq.errors import (
    DeliveryNotFound,
    DiskFull,
    DuplicateMessage,
    InvalidArgument,
    SubscriptionBusy,
)
from dirmq.pubsub import Delivery, PubSub, Subscription
from dirmq.store import Store
from tests.support import procs
from tests.support.disks import small_tmpfs

REPLY = "outcomes/publisher"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "root") as s:
        yield s


@pytest.fixture
def hub(store: Store) -> PubSub:
    return PubSub(store)


def drain(sub: Subscription, wait_s: float = 0.3, settle: bool = True) -> list[Delivery]:
    """Everything the subscription gets until it has been idle for `wait_s`."""
    got: list[Delivery] = []
    while (delivery := sub.receive(wait_s=wait_s)) is not None:
        got.append(delivery)
        if settle:
            sub.done(delivery)
    return got


def outcomes(store: Store, queue: str = REPLY) -> list[tuple[str, str, str | None]]:
    """(message id, outcome, subscriber) reported to `queue`, consumed."""
    if not store.exists(queue):
        return []
    q = store.queue(queue)
    found = []
    while (message := q.get_one()) is not None:
        report = json.loads(message.body)
        found.append((report["id"], report["outcome"], report["subscriber"]))
        q.ack(message.receipt or "")
    return found


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.body for d in deliveries]


# -- delivery modes -----------------------------------------------------------------------------
def test_anyone_goes_to_exactly_one_matching_subscriber(hub: PubSub) -> None:
    subs = [hub.subscribe(f"s{i}", channels=["orders"]) for i in range(3)]
    other = hub.subscribe("other", channels=["news"])
    for i in range(30):
        hub.publish("orders", f"o{i}".encode(), mode="anyone")
    got = [d for sub in subs for d in drain(sub, 0.1)]
    assert sorted(bodies(got)) == sorted(f"o{i}".encode() for i in range(30))
    assert drain(other, 0.1) == []
    for sub in [*subs, other]:
        sub.close()


def test_anyone_without_subscribers_waits_for_the_first_one(hub: PubSub) -> None:
    first = hub.publish("jobs", b"early", subject="a", mode="anyone")
    with hub.subscribe("late") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        assert (delivery.id, delivery.body, delivery.subject) == (first.id, b"early", "a")
        sub.done(delivery)


def test_anyone_keeps_publish_order_for_one_subscriber(hub: PubSub) -> None:
    for i in range(20):
        hub.publish("c", f"{i}".encode())
    with hub.subscribe("one") as sub:
        assert bodies(drain(sub, 0.1)) == [f"{i}".encode() for i in range(20)]


def test_everyone_reaches_only_the_subscribers_attached_at_that_moment(hub: PubSub) -> None:
    a = hub.subscribe("a")
    b = hub.subscribe("b", subjects=["x."])
    published = hub.publish("room", b"hi", subject="x.1", mode="everyone")
    assert published.subscribers == 2
    hub.publish("room", b"not for b", subject="y.1", mode="everyone")
    late = hub.subscribe("late")
    assert bodies(drain(a)) == [b"hi", b"not for b"]
    assert bodies(drain(b)) == [b"hi"]
    assert drain(late, 0.1) == []
    for sub in (a, b, late):
        sub.close()


def test_everyone_with_nobody_attached_is_delivered_to_nobody(hub: PubSub) -> None:
    assert hub.publish("room", b"void", mode="everyone").subscribers == 0
    with hub.subscribe("after") as sub:
        assert sub.receive(wait_s=0.1) is None


def test_future_reaches_current_and_future_subscribers_and_replays(hub: PubSub) -> None:
    current = hub.subscribe("current", channels=["feed"])
    seqs = [hub.publish("feed", f"r{i}".encode(), mode="future").seq for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert bodies(drain(current)) == [f"r{i}".encode() for i in range(5)]
    with hub.subscribe("newcomer") as newcomer:
        assert [d.seq for d in drain(newcomer)] == [1, 2, 3, 4, 5]
    with hub.subscribe("from3", replay_from=3) as from3:
        assert bodies(drain(from3)) == [b"r2", b"r3", b"r4"]
    current.close()


def test_a_durable_subscription_resumes_where_it_left_off(hub: PubSub) -> None:
    for i in range(3):
        hub.publish("feed", f"r{i}".encode(), mode="future")
    with hub.subscribe("durable") as sub:
        assert len(drain(sub)) == 3
    hub.publish("feed", b"while away", mode="future")
    with hub.subscribe("durable") as sub:
        assert bodies(drain(sub)) == [b"while away"]
        assert sub.cursor == 5


def test_filters_combine_channel_and_subject_prefixes(hub: PubSub) -> None:
    subs = {
        "all": hub.subscribe("all"),
        "orders": hub.subscribe("orders", channels=["orders"]),
        "eu": hub.subscribe("eu", subjects=["eu."]),
        "orders-eu": hub.subscribe("orders-eu", channels=["orders", "refunds"], subjects=["eu."]),
    }
    for channel, subject in [
        ("orders", "eu.fr"),
        ("orders", "us.ny"),
        ("refunds", "eu.de"),
        ("news", "eu.it"),
        ("ordersX", "eu.es"),
    ]:
        hub.publish(channel, f"{channel}/{subject}".encode(), subject=subject, mode="everyone")
    got = {name: sorted(bodies(drain(sub))) for name, sub in subs.items()}
    assert len(got["all"]) == 5
    assert got["orders"] == [b"orders/eu.fr", b"orders/us.ny", b"ordersX/eu.es"]
    assert got["eu"] == sorted([b"orders/eu.fr", b"refunds/eu.de", b"news/eu.it", b"ordersX/eu.es"])
    assert got["orders-eu"] == [b"orders/eu.fr", b"ordersX/eu.es", b"refunds/eu.de"]
    for sub in subs.values():
        sub.close()


def test_headers_and_body_bytes_come_back_unchanged(hub: PubSub) -> None:
    body = bytes(range(256)) * 10
    hub.publish("c", body, headers={"Content-Type": "application/x-raw", "X-Attr-K": "v"})
    with hub.subscribe("s") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        assert delivery.body == body
        assert delivery.headers == {"Content-Type": "application/x-raw", "X-Attr-K": "v"}


# -- outcomes -----------------------------------------------------------------------------------
ALL_ACKS = "queued,accepted,done,timeout,aborted,dismissed"


def test_done_and_dismissed_are_reported(hub: PubSub, store: Store) -> None:
    ok = hub.publish("c", b"ok", acks=ALL_ACKS, reply_to=REPLY)
    bad = hub.publish("c", b"bad", acks=ALL_ACKS, reply_to=REPLY)
    with hub.subscribe("w") as sub:
        for delivery in drain(sub, settle=False):
            (sub.done if delivery.body == b"ok" else sub.dismiss)(delivery)
        with pytest.raises(DeliveryNotFound):
            sub.done(delivery)
    assert sorted(outcomes(store)) == sorted(
        [
            (ok.id, "queued", None),
            (ok.id, "accepted", "w"),
            (ok.id, "done", "w"),
            (bad.id, "queued", None),
            (bad.id, "accepted", "w"),
            (bad.id, "dismissed", "w"),
        ]
    )


def test_only_the_requested_outcomes_are_reported(hub: PubSub, store: Store) -> None:
    published = hub.publish("c", b"x", acks=["done"], reply_to=REPLY)
    with hub.subscribe("w") as sub:
        drain(sub)
    assert outcomes(store) == [(published.id, "done", "w")]


def test_not_accepted_in_time_times_out(hub: PubSub, store: Store) -> None:
    published = hub.publish("c", b"x", acks="timeout", reply_to=REPLY, accept_timeout_s=0.2)
    time.sleep(0.3)
    assert hub.sweep().timed_out == 1
    assert outcomes(store) == [(published.id, "timeout", None)]
    with hub.subscribe("too-late") as sub:
        assert sub.receive(wait_s=0.1) is None


def test_a_subscriber_never_takes_an_expired_message(hub: PubSub, store: Store) -> None:
    hub.publish("c", b"x", acks="timeout", reply_to=REPLY, accept_timeout_s=0.1)
    time.sleep(0.2)
    with hub.subscribe("late") as sub:
        assert sub.receive(wait_s=0.1) is None
    assert [o[1] for o in outcomes(store)] == ["timeout"]


def test_not_settled_in_time_is_aborted_and_delivered_again(hub: PubSub, store: Store) -> None:
    published = hub.publish(
        "c", b"slow", acks="aborted,done", reply_to=REPLY, process_timeout_s=0.2
    )
    with hub.subscribe("w") as sub:
        first = sub.receive(wait_s=1)
        assert first is not None
        again = sub.receive(wait_s=2)  # returned at its deadline, taken again
        assert again is not None
        assert again.id == published.id
        with pytest.raises(DeliveryNotFound):
            sub.done(first.key + "x")
        sub.done(again)
    assert [o[1] for o in outcomes(store)] == ["aborted", "done"]


def test_an_aborted_anyone_message_can_go_to_another_subscriber(hub: PubSub) -> None:
    published = hub.publish("c", b"x", process_timeout_s=0.2)
    slow = hub.subscribe("slow")
    assert slow.receive(wait_s=1) is not None
    other = hub.subscribe("other")
    time.sleep(0.3)
    hub.sweep()  # the slow subscriber is not calling receive: the sweeper returns it
    delivery = other.receive(wait_s=1)
    assert delivery is not None and delivery.id == published.id
    other.done(delivery)
    slow.close()
    other.close()


def test_heartbeat_keeps_a_long_task_alive(hub: PubSub, store: Store) -> None:
    hub.publish("c", b"long", acks="aborted,done", reply_to=REPLY, process_timeout_s=0.3)
    with hub.subscribe("w") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        for _ in range(4):
            time.sleep(0.15)
            hub.sweep()
            sub.heartbeat(delivery)
        sub.done(delivery)
    assert [o[1] for o in outcomes(store)] == ["done"]


def test_explicit_abort_and_close_return_messages(hub: PubSub, store: Store) -> None:
    hub.publish("c", b"x", acks="aborted", reply_to=REPLY)
    sub = hub.subscribe("w", backoff_s=0)  # given back: due again at once (backoff: test_poison)
    delivery = sub.receive(wait_s=1)
    assert delivery is not None
    sub.abort(delivery)
    delivery = sub.receive(wait_s=1)
    assert delivery is not None
    sub.close()  # holding it: given back
    with hub.subscribe("next") as nxt:
        assert bodies(drain(nxt)) == [b"x"]
    assert [o[1] for o in outcomes(store)] == ["aborted", "aborted"]


def test_per_message_timeouts_are_honoured(hub: PubSub) -> None:
    hub.publish("c", b"short", accept_timeout_s=0.1)
    hub.publish("c", b"long", accept_timeout_s=60)
    time.sleep(0.2)
    with hub.subscribe("w") as sub:
        assert bodies(drain(sub)) == [b"long"]


def test_everyone_not_taken_in_time_is_reported_as_timed_out(hub: PubSub, store: Store) -> None:
    sub = hub.subscribe("gone")
    published = hub.publish(
        "c", b"x", mode="everyone", acks="timeout", reply_to=REPLY, accept_timeout_s=0.1
    )
    sub.close()  # durable: it may come back, so nothing is reported yet
    assert outcomes(store) == []
    time.sleep(0.2)
    hub.prune_grace_ms = 0
    hub.sweep()  # the newest entry stays (it keeps the numbering) but times out
    assert outcomes(store) == [(published.id, "timeout", "gone")]
    hub.publish("c", b"next", mode="everyone")
    assert hub.sweep().removed == 1  # once it is not the newest, it is pruned
    assert outcomes(store) == []
    with hub.subscribe("gone") as again:
        assert again.receive(wait_s=0.1) is None
    hub.delete_subscription("gone")
    assert [s["name"] for s in hub.subscriptions()] == []


def test_a_returning_subscription_gets_what_was_published_while_it_was_attached(
    hub: PubSub,
) -> None:
    sub = hub.subscribe("back")
    hub.publish("c", b"while attached", mode="everyone")
    held = sub.receive(wait_s=1)
    assert held is not None
    hub.publish("c", b"while attached 2", mode="everyone")
    sub.close()  # gives back the one it held; the second was never taken
    hub.publish("c", b"while away", mode="everyone")
    with hub.subscribe("back") as sub:
        hub.publish("c", b"after", mode="everyone")
        assert bodies(drain(sub)) == [b"while attached", b"while attached 2", b"after"]


# -- identity, input ----------------------------------------------------------------------------
def test_a_duplicate_id_is_refused_once_and_the_original_delivered_once(hub: PubSub) -> None:
    hub.publish("c", b"original", message_id="order-42")
    with pytest.raises(DuplicateMessage, match="order-42"):
        hub.publish("c", b"copy", message_id="order-42")
    with hub.subscribe("w") as sub:
        assert bodies(drain(sub)) == [b"original"]
    with pytest.raises(DuplicateMessage):  # still known after it finished
        hub.publish("c", b"copy", message_id="order-42")


def test_a_subscription_name_is_attached_once(hub: PubSub) -> None:
    with hub.subscribe("solo"):
        with pytest.raises(SubscriptionBusy):
            hub.subscribe("solo")
        with pytest.raises(SubscriptionBusy):
            hub.delete_subscription("solo")
    hub.subscribe("solo").close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "sometimes"}, "mode"),
        ({"persistence": "maybe"}, "persistence"),
        ({"acks": "done"}, "reply_to"),
        ({"acks": "finished", "reply_to": "q"}, "outcome"),
        ({"subject": "a\nb"}, "subject"),
        ({"message_id": "../x"}, "message id"),
        ({"accept_timeout_s": 0}, "accept timeout"),
        ({"process_timeout_s": -1}, "process timeout"),
        ({"headers": {"Dirmq-X": "1"}}, "reserved"),
    ],
)
def test_bad_input_is_refused_clearly(hub: PubSub, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        hub.publish("c", b"x", **kwargs)  # type: ignore[arg-type]
    assert os.listdir(hub.paths.anyone) == []


@pytest.mark.parametrize("persistence", ["writethrough", "writeback", "none"])
def test_every_persistence_level_delivers(hub: PubSub, persistence: str) -> None:
    hub.publish("c", b"x", persistence=persistence)
    with hub.subscribe("w") as sub:
        assert bodies(drain(sub)) == [b"x"]


def test_fan_out_writes_the_body_once_and_links_it_once(hub: PubSub) -> None:
    subs = [hub.subscribe(f"s{i}") for i in range(10)]
    assert hub.publish("c", b"x" * 10_000, mode="everyone", message_id="big").subscribers == 10
    inode = os.stat(hub.paths.canonical("big", "live")).st_ino
    entries = os.listdir(hub.paths.broadcast)
    assert len(entries) == 1
    assert os.stat(os.path.join(hub.paths.broadcast, entries[0])).st_ino == inode
    for sub in subs:
        assert bodies(drain(sub)) == [b"x" * 10_000]
        sub.close()
    for i in range(10):  # subscriptions keep positions, not copies
        assert sorted(os.listdir(hub.paths.sub(f"s{i}"))) == [
            "cursor",
            "subscription.json",
            "taken",
        ]
        assert os.listdir(hub.paths.taken(f"s{i}")) == []


def test_polling_mode_delivers_without_inotify(tmp_path: Path) -> None:
    with Store(tmp_path / "r", watch_mode="poll", poll_interval_s=0.05) as store:
        hub = PubSub(store)
        with hub.subscribe("w") as sub:
            assert sub.receive(wait_s=0.1) is None
            hub.publish("c", b"x", mode="everyone")
            assert bodies(drain(sub)) == [b"x"]


# -- processes, crashes, faults -----------------------------------------------------------------
def spawn(*args: object) -> subprocess.Popen[str]:
    return procs.spawn(*args, module="tests.support.pubsub_workers")


def test_a_publish_in_another_process_wakes_a_waiting_subscriber(hub: PubSub) -> None:
    with hub.subscribe("waiter") as sub:
        assert sub.receive(wait_s=0.05) is None
        proc = spawn("publish", hub.store.root, "c", 1, "anyone")
        started = time.monotonic()
        delivery = sub.receive(wait_s=10)
        assert delivery is not None and delivery.body == b"m0"
        assert time.monotonic() - started < 5
        proc.communicate(timeout=30)
        assert proc.returncode == 0


def test_a_subscriber_killed_while_holding_messages_loses_none(hub: PubSub, store: Store) -> None:
    ids = [
        hub.publish(
            "c", f"{i}".encode(), acks="aborted,done", reply_to=REPLY, process_timeout_s=0.5
        ).id
        for i in range(5)
    ]
    proc = spawn("take", store.root, "victim", 3)
    assert proc.stdout is not None
    held = [proc.stdout.readline().strip() for _ in range(3)]
    assert proc.stdout.readline().strip() == "holding"
    proc.kill()
    proc.communicate(timeout=30)
    hub.subscribe("victim").close()  # its name is free at once: its process is gone
    got: list[Delivery] = []
    with hub.subscribe("survivor") as sub:  # its own sweeps return the dead one's messages
        deadline = time.monotonic() + 10
        while len(got) < len(ids) and time.monotonic() < deadline:
            if (delivery := sub.receive(wait_s=0.5)) is not None:
                got.append(delivery)
                sub.done(delivery)
        assert sub.receive(wait_s=0.3) is None
    assert sorted(d.id for d in got) == sorted(ids)
    reported = outcomes(store)
    assert sorted(i for i, o, _ in reported if o == "aborted") == sorted(held)
    assert sorted(i for i, o, _ in reported if o == "done") == sorted(ids)


def test_a_publish_cut_short_by_a_crash_is_finished_by_the_sweeper(
    hub: PubSub, store: Store
) -> None:
    published = hub.publish("c", b"x", acks="queued", reply_to=REPLY, message_id="m1")
    outcomes(store)
    # Rewind to the instant after the file was written: not routed, not reported.
    live = hub.paths.canonical("m1", "live")
    for entry in os.listdir(hub.paths.anyone):
        os.unlink(os.path.join(hub.paths.anyone, entry))
    os.rename(live, hub.paths.canonical("m1"))
    hub.recover_after_s = 0.0
    assert hub.sweep().recovered == 1
    assert outcomes(store) == []  # `queued` was reported already: the dedup id holds
    with hub.subscribe("w") as sub:
        assert [d.id for d in drain(sub)] == [published.id]


def test_a_report_that_fails_stays_in_the_outbox(hub: PubSub, store: Store) -> None:
    hub.publish("c", b"x", acks="done", reply_to=REPLY, message_id="m1")
    original = hub.reporter.report
    calls = {"n": 0}

    def failing(*args: object, **kwargs: object) -> bool:
        calls["n"] += 1
        raise DiskFull(28, "reporting: disk full")

    with hub.subscribe("w") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        hub.reporter.report = failing  # type: ignore[method-assign]
        sub.done(delivery)  # the subscriber's result is recorded even if the report fails
        hub.reporter.report = original  # type: ignore[method-assign]
    assert calls["n"] == 1
    assert len(os.listdir(hub.paths.outbox)) == 1
    hub.outbox_grace_s = 0.0
    assert hub.sweep().reported == 1
    assert outcomes(store) == [("m1", "done", "w")]
    assert os.listdir(hub.paths.outbox) == []


def test_disk_full_refuses_the_publish_and_leaves_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, "1m") as mount, Store(mount / "root") as store:
        hub = PubSub(store)
        with pytest.raises(DiskFull):
            hub.publish("c", b"x" * (2 * 1024 * 1024))
        assert os.listdir(hub.paths.messages) == []
        assert os.listdir(hub.paths.anyone) == []
        assert os.listdir(hub.paths.tmp) == []
        hub.publish("c", b"fits")
        with hub.subscribe("w") as sub:
            assert bodies(drain(sub)) == [b"fits"]


def test_an_anonymous_subscription_leaves_nothing_behind(hub: PubSub, store: Store) -> None:
    with hub.subscribe(channels=["c"]) as sub:
        assert sub.name.startswith("anon-")
        hub.publish("c", b"x", mode="everyone", acks="timeout", reply_to=REPLY)
    assert hub.subscriptions() == []
    assert [o[1] for o in outcomes(store)] == ["timeout"]  # it never took it: reported


def test_a_deleted_log_entry_is_skipped_not_waited_for(hub: PubSub) -> None:
    for i in range(3):
        hub.publish("feed", f"r{i}".encode(), mode="future")
    os.unlink(hub.paths.retained_entry(2))  # an operator's mistake: a hole
    with hub.subscribe("reader") as sub:
        assert bodies(drain(sub)) == [b"r0", b"r2"]


def test_a_pruned_broadcast_prefix_is_skipped(hub: PubSub) -> None:
    sub = hub.subscribe("slow")
    hub.publish("c", b"old", mode="everyone", accept_timeout_s=0.1)
    hub.publish("c", b"new", mode="everyone")
    time.sleep(0.2)
    hub.prune_grace_ms = 0
    assert hub.sweep().removed == 1
    assert hub.broadcast.floor() == 2
    assert bodies(drain(sub)) == [b"new"]
    sub.close()


def test_check_finds_and_repairs_damage(hub: PubSub, store: Store) -> None:
    from dirmq.pubsub.check import check_pubsub

    hub.publish("c", b"fine")
    damaged = hub.publish("c", b"to be damaged", message_id="bad")
    for i in range(3):
        hub.publish("feed", f"r{i}".encode(), mode="future")
    os.unlink(hub.paths.retained_entry(2))
    entry = next(n for n in os.listdir(hub.paths.anyone) if damaged.id in n)
    os.unlink(os.path.join(hub.paths.anyone, entry))  # replace the link by a damaged copy
    Path(hub.paths.anyone, entry).write_bytes(b"Dirmq-Format: 1\nContent-Length: 99\n\nshort")
    Path(hub.paths.anyone, "garbage").write_bytes(b"x")
    report = check_pubsub(store.root)
    assert report is not None and not report.ok
    kinds = sorted(f.kind for f in report.findings)
    assert kinds == ["corrupt", "foreign", "hole"]
    repaired = check_pubsub(store.root, repair=True)
    assert repaired is not None
    assert [f.kind for f in repaired.findings if not f.repaired] == ["hole"]  # reported only
    assert sorted(os.listdir(os.path.join(hub.paths.base, "@corrupt")))[0].startswith(entry)
    with hub.subscribe("w") as sub:
        assert bodies(drain(sub)) == [b"fine", b"r0", b"r2"]
