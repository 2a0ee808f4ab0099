"""The Queue contract: what every transport (library, HTTP client) must do identically."""

from __future__ import annotations

import threading
import time

import pytest

import dirmq
from dirmq import OutgoingMessage

from .conftest import LocalTransport


def test_put_get_ack_round_trip_keeps_body_and_headers(transport: LocalTransport) -> None:
    q = transport.make_queue()
    body = bytes(range(256)) * 3 + b"\n\n\r\n"
    headers = {"Content-Type": "application/octet-stream", "X-Attr-Colour": "blue ü"}
    message_id = q.put(body, headers)
    message = q.get_one()
    assert message is not None
    assert (message.id, message.body, message.headers) == (message_id, body, headers)
    assert message.receive_count == 1
    assert message.content_type == "application/octet-stream"
    assert abs(message.published_at_s - time.time()) < 5
    q.ack(message.receipt)
    assert q.get_one() is None
    assert q.stats().total == 0


def test_empty_queue_returns_nothing_without_waiting(transport: LocalTransport) -> None:
    q = transport.make_queue()
    started = time.monotonic()
    assert q.get() == []
    assert q.get_one() is None
    assert time.monotonic() - started < 0.5


def test_fifo_order_and_max_count(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ids = [q.put(str(i).encode()) for i in range(25)]
    got = q.get(10) + q.get(10) + q.get(10)
    assert [m.id for m in got] == ids
    assert [m.body for m in got] == [str(i).encode() for i in range(25)]


def test_put_many_is_ordered_and_atomic_in_effect(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ids = q.put_many([b"a", OutgoingMessage(b"b", {"X-Attr-K": "v"}), b"c"])
    assert len(set(ids)) == 3 and ids == sorted(ids)
    got = q.get(5)
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert got[1].headers == {"X-Attr-K": "v"}


def test_ids_sort_by_publish_time(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ids = [q.put(b"x") for _ in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50


def test_ack_twice_is_a_stale_receipt(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"x")
    message = q.get_one()
    assert message is not None and message.receipt is not None
    q.ack(message.receipt)
    with pytest.raises(dirmq.StaleReceipt):
        q.ack(message.receipt)


def test_garbage_receipt_is_rejected_clearly(transport: LocalTransport) -> None:
    q = transport.make_queue()
    for receipt in ["", "../../etc/passwd", "nonsense", "1.2.3"]:
        with pytest.raises(dirmq.InvalidArgument):
            q.ack(receipt)


def test_expired_lease_returns_to_its_fifo_place(transport: LocalTransport) -> None:
    q = transport.make_queue()
    first, second, third = (q.put(b) for b in (b"1", b"2", b"3"))
    leased = q.get_one(visibility_s=0.2)
    assert leased is not None and leased.id == first
    middle = q.get_one(visibility_s=60)
    assert middle is not None and middle.id == second
    time.sleep(0.3)  # the first lease expires while the third message waits, ready
    again = q.get_one()
    assert again is not None
    assert again.id == first, "the requeued message must come back before later ones"
    assert again.receive_count == 2
    with pytest.raises(dirmq.StaleReceipt):
        q.ack(leased.receipt)
    q.ack(again.receipt)
    last = q.get_one()
    assert last is not None and last.id == third


def test_blocking_get_wakes_when_a_lease_expires(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"x")
    assert q.get_one(visibility_s=0.3) is not None
    started = time.monotonic()
    again = q.get_one(wait_s=5)
    waited = time.monotonic() - started
    assert again is not None
    assert 0.2 < waited < 1.5


def test_fractional_visibility_timeouts(transport: LocalTransport) -> None:
    q = transport.make_queue(visibility_timeout_s=0.25)
    q.put(b"x")
    assert q.get_one() is not None
    assert q.get_one() is None
    assert q.get_one(wait_s=2) is not None


def test_nack_returns_message_to_its_place_at_once(transport: LocalTransport) -> None:
    q = transport.make_queue()
    a, b = q.put(b"a"), q.put(b"b")
    first = q.get_one()
    assert first is not None and first.id == a
    q.nack(first.receipt)
    again = q.get_one()
    assert again is not None and again.id == a and again.receive_count == 2
    following = q.get_one()
    assert following is not None and following.id == b


def test_nack_with_delay(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"a")
    first = q.get_one()
    assert first is not None
    nacked = time.monotonic()  # before the nack: the delay runs from it, however slow the calls
    q.nack(first.receipt, delay_s=0.3)
    assert q.get_one() is None
    assert q.stats().delayed == 1
    again = q.get_one(wait_s=3)
    assert again is not None and again.id == first.id
    assert time.monotonic() - nacked > 0.25  # 0.3 s, less the due time's ms rounding


def test_extend_keeps_the_lease_and_the_receipt(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"a")
    message = q.get_one(visibility_s=0.3)
    assert message is not None
    for _ in range(3):
        time.sleep(0.15)
        q.extend(message.receipt, 0.3)
    assert q.get_one() is None, "a heartbeat must keep the message invisible"
    q.ack(message.receipt)
    assert q.stats().total == 0


def test_extend_of_a_lost_lease_is_stale(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"a")
    message = q.get_one(visibility_s=0.1)
    assert message is not None
    again = q.get_one(wait_s=2)
    assert again is not None
    with pytest.raises(dirmq.StaleReceipt):
        q.extend(message.receipt, 10)


def test_ack_many_reports_each_failure_by_receipt(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put_many([b"m"] * 1001)  # one more than a request of the HTTP clients takes
    got = q.get(1000) + q.get(1000)
    receipts = [m.receipt for m in got if m.receipt is not None]
    assert len(receipts) == 1001
    failures = q.ack_many([*receipts[:500], "nonsense", *receipts[500:]])
    assert list(failures) == ["nonsense"]
    assert isinstance(failures["nonsense"], dirmq.InvalidArgument)
    assert q.stats().total == 0
    again = q.ack_many(receipts[:2])
    assert list(again) == receipts[:2]
    assert all(isinstance(e, dirmq.StaleReceipt) for e in again.values())
    assert q.ack_many([]) == {}


def test_a_receipt_named_twice_in_a_batch_is_settled_once(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put_many([b"a", b"b"])
    first, second = (m.receipt for m in q.get(2, visibility_s=30) if m.receipt is not None)
    assert q.extend_many([first, first], 30) == {}
    assert q.ack_many([first, second, first, second]) == {}
    assert q.stats().total == 0


def test_extend_many_keeps_the_leases_and_the_receipts(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put_many([b"a", b"b", b"c"])
    leased = q.get(3, visibility_s=0.3)
    receipts = [m.receipt for m in leased if m.receipt is not None]
    q.ack(receipts[2])
    failures = q.extend_many([*receipts, "../junk"], 30)
    assert list(failures) == [receipts[2], "../junk"]
    assert isinstance(failures[receipts[2]], dirmq.StaleReceipt)
    assert isinstance(failures["../junk"], dirmq.InvalidArgument)
    time.sleep(0.4)
    assert q.get_one() is None, "the extended leases outlived their first 0.3 s"
    assert q.ack_many(receipts[:2]) == {}, "the receipts stayed valid"
    assert q.extend_many([], 1) == {}
    with pytest.raises(dirmq.InvalidArgument):
        q.extend_many(receipts, -1)


def test_delay_hides_then_delivers(transport: LocalTransport) -> None:
    q = transport.make_queue()
    late = q.put(b"late", delay_s=0.4)
    now = q.put(b"now")
    got = q.get_one()
    assert got is not None and got.id == now
    assert q.get_one() is None
    started = time.monotonic()
    delivered = q.get_one(wait_s=3)
    assert delivered is not None and delivered.id == late
    assert time.monotonic() - started > 0.2


def test_default_delay_from_config(transport: LocalTransport) -> None:
    q = transport.make_queue(delay_s=0.3)
    q.put(b"a")
    assert q.get_one() is None
    assert q.get_one(wait_s=3) is not None
    q.put(b"b", delay_s=0)
    assert q.get_one() is not None


def test_delete_by_id_in_every_state(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ready = q.put(b"ready")
    leased = q.put(b"leased")
    delayed = q.put(b"delayed", delay_s=60)
    assert q.delete(ready)
    got = q.get_one()
    assert got is not None and got.id == leased
    assert q.delete(leased)
    assert q.delete(delayed)
    assert not q.delete(ready)
    assert q.stats().total == 0
    with pytest.raises(dirmq.StaleReceipt):
        q.ack(got.receipt)


def test_delete_unknown_and_invalid_ids(transport: LocalTransport) -> None:
    q = transport.make_queue()
    assert not q.delete(dirmq.store.ids.new_id())
    with pytest.raises(dirmq.InvalidArgument):
        q.delete("../@queue.json")


def test_nack_past_max_receives_dead_letters(transport: LocalTransport) -> None:
    dlq = transport.make_queue("dlq")
    q = transport.make_queue("work", max_receives=2, dead_letter_queue="dlq")
    message_id = q.put(b"poison", {"X-Attr-A": "1"})
    first = q.get_one()
    assert first is not None
    q.nack(first.receipt)
    second = q.get_one()
    assert second is not None and second.receive_count == 2
    assert q.nack(second.receipt) == "dead-lettered"
    assert q.get_one() is None
    assert q.stats().total == 0
    dead = dlq.get_one()
    assert dead is not None
    assert (dead.id, dead.body, dead.headers) == (message_id, b"poison", {"X-Attr-A": "1"})
    assert dead.dead is not None
    assert (dead.dead.reason, dead.dead.receive_count) == ("max-receives", 2)
    assert dead.dead.source.endswith("work")


def test_expired_lease_past_max_receives_dead_letters(transport: LocalTransport) -> None:
    q = transport.make_queue("work", max_receives=1)
    q.put(b"poison")
    assert q.get_one(visibility_s=0.1) is not None
    time.sleep(0.2)
    assert q.get_one() is None
    stats = q.stats()
    assert (stats.total, stats.dead) == (0, 1)


def test_explicit_dead_letter(transport: LocalTransport) -> None:
    dlq = transport.make_queue("dlq")
    q = transport.make_queue("work", dead_letter_queue="dlq")
    message_id = q.put(b"bad")
    m = q.get_one()
    assert m is not None
    q.dead_letter(m.receipt, "no such sku", reason="unreadable")
    assert q.stats().total == 0
    dead = dlq.get_one()
    assert dead is not None and dead.id == message_id
    assert dead.dead is not None
    assert (dead.dead.reason, dead.dead.detail) == ("unreadable", "no such sku")


def test_the_own_dead_area_is_browsed_and_purged(transport: LocalTransport) -> None:
    q = transport.make_queue("work", max_receives=1)
    ids = q.put_many([b"a", b"b", b"c"])
    for m in q.get(2):
        assert q.nack(m.receipt) == "dead-lettered"
    assert [m.id for m in q.browse(state="dead")] == ids[:2]
    assert [m.dead.reason for m in q.browse(state="dead")] == ["max-receives"] * 2
    assert [m.id for m in q.browse()] == ids[2:]
    assert q.purge(dead=True) == 2
    assert (q.stats().dead, q.stats().ready) == (0, 1)


def test_browse_pages_through_more_than_one_answer(transport: LocalTransport) -> None:
    """Over HTTP an answer holds at most 1000 messages: browse asks for the next pages."""
    q = transport.make_queue()
    ids = q.put_many([b"%d" % i for i in range(2345)])
    leased = q.get(5)  # not ready: not browsed
    browsed = [m.id for m in q.browse()]
    assert browsed == [i for i in ids if i not in {m.id for m in leased}]
    assert [m.id for m in q.browse(1500)] == browsed[:1500]
    assert [m.id for m in q.browse(after=browsed[999])] == browsed[1000:]


def test_peek_and_browse_do_not_lease(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ids = [q.put(f"m{i}".encode()) for i in range(5)]
    peeked = q.peek(ids[2])
    assert peeked.body == b"m2" and peeked.receipt is None
    assert [m.id for m in q.browse()] == ids
    assert [m.id for m in q.browse(limit=2)] == ids[:2]
    assert [m.id for m in q.browse(after=ids[1])] == ids[2:]  # a page after a message
    assert [m.id for m in q.browse(1, after=ids[3])] == ids[4:]
    assert list(q.browse(after=ids[4])) == []
    with pytest.raises(dirmq.InvalidArgument):
        list(q.browse(after="../x"))
    assert q.stats().ready == 5
    with pytest.raises(dirmq.MessageNotFound):
        q.peek(dirmq.store.ids.new_id())


def test_stats_counts_each_state(transport: LocalTransport) -> None:
    q = transport.make_queue()
    for i in range(4):
        q.put(str(i).encode())
    q.put(b"later", delay_s=60)
    assert q.get_one() is not None
    stats = q.stats()
    assert (stats.ready, stats.in_flight, stats.delayed, stats.dead) == (3, 1, 1, 0)
    assert stats.oldest_ready_age_s is not None and stats.oldest_ready_age_s >= 0


def test_purge_removes_everything(transport: LocalTransport) -> None:
    q = transport.make_queue()
    for i in range(10):
        q.put(str(i).encode())
    q.put(b"d", delay_s=60)
    assert q.get_one() is not None
    assert q.purge() == 11
    assert q.stats().total == 0
    q.put(b"after")
    assert q.get_one() is not None


def test_capacity_blocks_then_times_out(transport: LocalTransport) -> None:
    q = transport.make_queue(capacity=2)
    q.put(b"1")
    q.put(b"2")
    started = time.monotonic()
    with pytest.raises(dirmq.QueueFull):
        q.put(b"3", timeout_s=0.3)
    assert 0.25 < time.monotonic() - started < 2
    m = q.get_one()
    assert m is not None
    q.ack(m.receipt)
    q.put(b"3", timeout_s=0)
    assert q.stats().total == 2


def test_capacity_put_unblocks_when_a_message_is_acked(transport: LocalTransport) -> None:
    q = transport.make_queue(capacity=1)
    q.put(b"1")
    m = q.get_one()
    assert m is not None
    timer = threading.Timer(0.3, q.ack, args=(m.receipt,))
    timer.start()
    started = time.monotonic()
    q.put(b"2", timeout_s=5)
    timer.join()
    assert time.monotonic() - started < 2


def test_capacity_put_many_all_or_nothing(transport: LocalTransport) -> None:
    q = transport.make_queue(capacity=3)
    q.put(b"1")
    with pytest.raises(dirmq.QueueFull):
        q.put_many([b"a", b"b", b"c"], timeout_s=0.1)
    assert q.stats().total == 1
    q.put_many([b"a", b"b"], timeout_s=0)
    assert q.stats().total == 3


def test_message_size_limit(transport: LocalTransport) -> None:
    q = transport.make_queue(max_message_bytes=10)
    q.put(b"x" * 10)
    with pytest.raises(dirmq.MessageTooLarge):
        q.put(b"x" * 11)
    assert q.stats().total == 1


@pytest.mark.parametrize(
    "headers",
    [{"Bad Name": "v"}, {"X-A": "line\nbreak"}, {"Content-Length": "3"}, {"Dirmq-Slot": "1"}],
)
def test_invalid_headers_are_refused(transport: LocalTransport, headers: dict[str, str]) -> None:
    q = transport.make_queue()
    with pytest.raises(dirmq.InvalidArgument):
        q.put(b"x", headers)
    assert q.stats().total == 0


def test_blocking_get_wakes_on_publish_from_another_thread(transport: LocalTransport) -> None:
    q = transport.make_queue()
    timer = threading.Timer(0.2, q.put, args=(b"hello",))
    timer.start()
    started = time.monotonic()
    message = q.get_one(wait_s=5)
    timer.join()
    assert message is not None and message.body == b"hello"
    assert time.monotonic() - started < 1.0


def test_get_wait_times_out_empty(transport: LocalTransport) -> None:
    q = transport.make_queue()
    started = time.monotonic()
    assert q.get_one(wait_s=0.3) is None
    assert 0.25 < time.monotonic() - started < 2


def test_retention_drops_old_messages(transport: LocalTransport) -> None:
    q = transport.make_queue(retention_s=0.2)
    q.put(b"old")
    time.sleep(0.3)
    fresh = q.put(b"fresh")
    got = q.get_one()
    assert got is not None and got.id == fresh
    assert q.stats().total == 1


def test_visibility_zero_redelivers_at_once(transport: LocalTransport) -> None:
    q = transport.make_queue()
    q.put(b"x")
    first = q.get_one(visibility_s=0)
    second = q.get_one()
    assert first is not None and second is not None and first.id == second.id
    assert second.receive_count == 2


def test_peers_option_still_delivers_everything_once(transport: LocalTransport) -> None:
    q = transport.make_queue(peers=3)
    ids = {q.put(str(i).encode()) for i in range(40)}
    seen = []
    while (m := q.get_one()) is not None:
        seen.append(m.id)
        q.ack(m.receipt)
    assert sorted(seen) == sorted(ids)


def test_invalid_arguments(transport: LocalTransport) -> None:
    q = transport.make_queue()
    with pytest.raises(dirmq.InvalidArgument):
        q.get(0)
    with pytest.raises(dirmq.InvalidArgument):
        q.get(visibility_s=-1)
    with pytest.raises(dirmq.InvalidArgument):
        q.put(b"x", delay_s=float("nan"))
    with pytest.raises(dirmq.InvalidArgument):
        q.put("text")  # type: ignore[arg-type]


def test_queue_lifecycle(transport: LocalTransport) -> None:
    transport.make_queue("fish/saltwater")
    transport.make_queue("fish")
    transport.make_queue("snazzy party")
    assert transport.list_queues() == ["fish", "fish/saltwater", "snazzy party"]
    transport.delete_queue("fish")
    assert transport.list_queues() == ["fish/saltwater", "snazzy party"]


def test_deleted_queue_refuses_puts(transport: LocalTransport) -> None:
    q = transport.make_queue("gone")
    q.put(b"x")
    assert q.get_one() is not None
    transport.delete_queue("gone")
    with pytest.raises(dirmq.QueueNotFound):
        q.put(b"y")
    with pytest.raises(dirmq.QueueNotFound):
        transport.open_queue("gone")
    again = transport.make_queue("gone")
    assert again.stats().total == 0, "in-flight messages are deleted with their queue"


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "..", "a//b", "@ready", "a/@x", "x\x00y"])
def test_invalid_queue_names(transport: LocalTransport, name: str) -> None:
    with pytest.raises(dirmq.InvalidName):
        transport.make_queue(name)


def test_configuration_changes_apply(transport: LocalTransport) -> None:
    q = transport.make_queue("c")
    transport.configure("c", visibility_timeout_s=0.2)
    time.sleep(0.6)  # configuration is re-read at most every 0.5 s
    q.put(b"x")
    assert q.get_one() is not None
    assert q.get_one(wait_s=2) is not None


def test_dedup_id_publishes_once_within_the_window(transport: LocalTransport) -> None:
    q = transport.make_queue(dedup_window_s=60)
    first = q.put(b"order 42", dedup_id="order-42")
    again = q.put(b"order 42, retried", dedup_id="order-42")
    other = q.put(b"order 43", dedup_id="order-43")
    assert again == first and other != first
    batch = q.put_many(
        [
            OutgoingMessage(b"x", dedup_id="order-42"),
            OutgoingMessage(b"y", dedup_id="b"),
            OutgoingMessage(b"y again", dedup_id="b"),
            b"plain",
        ]
    )
    assert batch[0] == first and batch[1] == batch[2] and len(set(batch)) == 3
    got = q.get(10)
    assert [m.body for m in got] == [b"order 42", b"order 43", b"y", b"plain"]
    for m in got:
        q.ack(m.receipt)
    assert q.put(b"after ack", dedup_id="order-42") == first, "dedup outlives consumption"


def test_dedup_window_expires(transport: LocalTransport) -> None:
    q = transport.make_queue(dedup_window_s=0.2)
    first = q.put(b"a", dedup_id="k")
    time.sleep(0.3)
    assert q.put(b"a", dedup_id="k") != first
    assert q.stats().ready == 2


def test_groups_are_delivered_in_order_one_at_a_time(transport: LocalTransport) -> None:
    q = transport.make_queue()
    a1 = q.put_many([OutgoingMessage(b"a1", group="A")])[0]
    a2 = q.put_many([OutgoingMessage(b"a2", group="A")])[0]
    b1 = q.put_many([OutgoingMessage(b"b1", group="B")])[0]
    q.put_many([OutgoingMessage(b"a3", group="A")])
    u1 = q.put(b"u1")
    got = q.get(10)
    assert [m.id for m in got] == [a1, b1, u1], "one message per group in flight"
    assert [m.group for m in got] == ["A", "B", None]
    assert q.get(10) == []
    q.ack(got[0].receipt)
    second = q.get_one()
    assert second is not None and second.id == a2
    q.nack(got[1].receipt)
    again = q.get_one()
    assert again is not None and again.id == b1 and again.receive_count == 2
    assert q.get_one() is None


def test_a_group_keeps_its_order_through_an_expired_lease(transport: LocalTransport) -> None:
    q = transport.make_queue()
    ids = [q.put_many([OutgoingMessage(f"g{i}".encode(), group="G")])[0] for i in range(3)]
    first = q.get_one(visibility_s=0.2)
    assert first is not None and first.id == ids[0]
    again = q.get_one(wait_s=3)
    assert again is not None and again.id == ids[0] and again.receive_count == 2
    q.ack(again.receipt)
    following = q.get_one()
    assert following is not None and following.id == ids[1]
