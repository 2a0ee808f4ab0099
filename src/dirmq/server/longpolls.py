"""Long polls. A waiting receive is a future in its queue's waiter line, not a thread, and a
line that waits is a subscription to its queue's changes and a timer, not a task: thousands of
polls on thousands of queues cost a few KiB each and nothing while nothing happens.

A line is armed by its first waiter: subscribed to the queue's inotify descriptor (any
process's publish, nack or expiry calls it), told when the next lease or delay falls due, and
given a first look (a change before the subscription would go unnoticed). On a local disk, with
the queue's index at hand, that is a few calls on the event loop at once, as a lease is
(`Broker.runs_here`). On a queue this worker holds no index of, the arming waits a few loop
turns behind the requests (registrations.py; a publish here to the queue runs it at once), then
is only a watch ("quiet", `Queue.watch_if_idle`) if the queue is idle, else one call on the
pool's cold lane (coldlane.py), which a burst of registrations shares without standing in the
way of deliveries. A change (or the timer) starts
a dispatch: messages leased for the waiters in arrival order, on the event loop or the pool as
a lease would be (the pool while the queue is polled: its look may list the queue's
directories). Messages leased for a waiter that gave up meanwhile go to the next waiter that
leases alike, else back at once. A line whose last waiter left unsubscribes and is forgotten.

Why it is long: one waiter line is one state machine (idle, pending, quiet, arming, armed), and
each of its transitions needs the others' bookkeeping; the registrations' pacing, the cold lane
and the direct path's taking of a waiter are already modules of their own.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections import deque
from collections.abc import Callable

from dirmq.server.arming import Armed, subscribe_and_look
from dirmq.server.broker_host import INLINE_MAX_MESSAGES, BrokerHost
from dirmq.server.queuecounts import DELIVERED
from dirmq.server.waiter import SideDelivery, Waiter, expire
from dirmq.store import Message, Queue

IDLE_RECHECK_S = 30.0
# An armed line whose last waiter left stays armed (subscribed, its timer kept) this long: a
# queue polled by one consumer at a time (poll, message, ack, poll again) is not subscribed to,
# looked at and unsubscribed from again for every message. Its next waiter gets one look. A
# quiet line (only watched) lingers too: a consumer's next poll on its idle queue, once the
# last one's wait is over, is not registered again (three watches and looks a poll).
LINGER_S = 1.0
_IDLE, _PENDING, _QUIET, _ARMING, _ARMED = "idle", "pending", "quiet", "arming", "armed"


class LongPolls:
    """The waiter line of one queue. `ended` is called when its last waiter has left and it
    has unsubscribed: the broker forgets it."""

    def __init__(
        self, broker: BrokerHost, queue: Queue, ended: Callable[[LongPolls], None]
    ) -> None:
        self.broker = broker
        self.queue = queue
        self._ended = ended
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()  # made on the loop: see `_notice`
        self._waiters: deque[Waiter] = deque()
        self._forgotten = 0  # waiters that ended since the line was last swept (`_forget`)
        self._state = _IDLE
        self._unsubscribe: Callable[[], None] | None = None
        self._polled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_idle = False  # `_timer` is an idle re-check, not a due time's
        self._dispatch_task: asyncio.Task[None] | None = None
        self._again = False  # woken while a dispatch (or the arming) was under way
        self._wake_pending = False  # a `_woken` is scheduled (set from any thread)
        self._linger: asyncio.TimerHandle | None = None  # armed, unwaited: see LINGER_S

    def waiting(self) -> int:
        """Polls waiting in this line now."""
        return sum(not waiter.future.done() for waiter in self._waiters)

    def lingering(self) -> bool:
        """Whether the line is only kept armed after its last waiter left (`LINGER_S`)."""
        return self._linger is not None

    async def wait(
        self,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        max_per_group: int | None = 1,
        consumer: str | None = None,
        side: SideDelivery | None = None,
    ) -> list[Message]:
        loop = self._loop
        future: asyncio.Future[list[Message]] = loop.create_future()
        waiter = Waiter(max_count, visibility_s, future, max_per_group, consumer, side)
        self._enter(waiter)
        # A parked poll is just this future and one timer: thousands must stay cheap.
        timer = None if wait_s is None else loop.call_later(wait_s, expire, future)
        try:
            got = await future  # cancelling the request cancels the future: see _give_up
        except asyncio.CancelledError:
            self._give_up(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not got:
            self._forget(waiter)
        return got

    def park(
        self,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        consumer: str | None,
        done: Callable[[list[Message] | BaseException], None],
    ) -> asyncio.Future[list[Message]]:
        """`wait` without a coroutine (later_receive.py): `done` gets the messages (none once
        `wait_s` is over) or the error, on the event loop. Cancelling the future returned (the
        client left) takes the wait out of the line, and `done` is not called; once the
        future is done, what it holds is `done`'s to answer or give back."""
        loop = self._loop
        waiter = Waiter(max_count, visibility_s, loop.create_future(), 1, consumer)
        self._enter(waiter)
        future = waiter.future
        timer = None if wait_s is None else loop.call_later(wait_s, expire, future)
        future.add_done_callback(functools.partial(self._parked_done, waiter, timer, done))
        return future

    def _parked_done(
        self,
        waiter: Waiter,
        timer: asyncio.TimerHandle | None,
        done: Callable[[list[Message] | BaseException], None],
        future: asyncio.Future[list[Message]],
    ) -> None:
        if timer is not None:
            timer.cancel()
        if future.cancelled():
            self._forget(waiter)
            return
        error = future.exception()
        if error is not None:  # `_fail` cleared the line
            done(error)
            return
        got = future.result()
        if not got:
            self._forget(waiter)
        done(got)

    def _enter(self, waiter: Waiter) -> None:
        """`waiter` joins the line, arming it if it is the first (a lingering line is armed
        already: a look, as the arming's, for what came since the caller's own look; a
        lingering quiet one needs none: a change would have ended it, or has its wake-up
        scheduled, which arms it for this waiter). Any other armed line needs none: what came
        since the caller's look made a change, and its wake-up, under way or still to come,
        leases for each waiter in turn, this one too (tests/test_armed_lines.py)."""
        self._waiters.append(waiter)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
            if self._state is not _QUIET:
                self._woken()
            return
        if self._state is _IDLE:
            if self.queue.indexed():  # a few calls on the index: at once, as a lease would be
                self._arm()
            else:  # behind the requests (registrations.py): it waits for a change anyway
                self._state = _PENDING
                self.broker.register_later(self._register)

    def _forget(self, waiter: Waiter) -> None:
        """`waiter` has ended (its future is done). It leaves the line as it reaches the head
        (`_live_waiters`), or when ended ones are half the line, which is swept then: removing
        each from the middle cost a scan of the line, O(n^2) when thousands of polls on one
        queue end together (their wait over, their clients gone)."""
        self._forgotten += 1
        if self._forgotten * 2 > len(self._waiters):
            self._waiters = deque(w for w in self._waiters if not w.future.done())
            self._forgotten = 0
        self._retire_if_unwaited()

    def _give_up(self, waiter: Waiter) -> None:
        if waiter.future.done() and not waiter.future.cancelled():
            if waiter.future.exception() is None:
                self.broker.give_back(self.queue, waiter.future.result())
        else:
            waiter.future.cancel()
        self._forget(waiter)

    def release_all(self) -> None:
        """Answer every waiter with nothing (the broker is closing) and unsubscribe."""
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result([])
        self._waiters.clear()
        self._retire_if_unwaited(linger=False)

    def take_waiter(self, admit: Callable[[Waiter], bool]) -> Waiter | None:
        """A waiting poll, out of the line, if `admit` (called on it) says so: a publish is to
        be leased straight for it (server/direct.py), which then answers its future. The first
        one; while a dispatch is under way (it leases for the first), the last, if another.
        None while the line is arming (its first look leases for the first). A waiter with a
        side delivery that wants more than one stays in the line, wanting one less: what is
        returned is a waiter of one for it, whose message goes to `side.arrived`."""
        if self._state is not _ARMED or not self._live_waiters():
            return None
        waiters = self._waiters
        if self._dispatch_task is not None:
            while waiters[-1].future.done():  # ended, not swept yet (`_forget`); the head lives
                waiters.pop()
        waiter = waiters[0] if self._dispatch_task is None else waiters[-1]
        if waiter.future.done() or (self._dispatch_task is not None and waiter is waiters[0]):
            return None
        if not admit(waiter):
            return None
        side = waiter.side
        if waiter is waiters[0]:  # out of the line from its end (no scan of it)
            waiters.popleft()
        else:
            waiters.pop()
        if side is None or waiter.max_count <= 1:
            return waiter
        waiter.max_count -= 1
        side.taken()
        waiters.append(waiter)  # to the back, as a stream that waits again: the others' turn
        one = Waiter(1, waiter.visibility_s, self._loop.create_future(), 1, waiter.consumer)
        one.future.add_done_callback(functools.partial(self._arrived, side))
        return one

    def _arrived(self, side: SideDelivery, future: asyncio.Future[list[Message]]) -> None:
        """A side delivery's message (`take_waiter`) is there: to its consumer, or back."""
        got = [] if future.cancelled() or future.exception() is not None else future.result()
        self._arrived_side(side, got)

    def _arrived_side(self, side: SideDelivery, got: list[Message]) -> None:
        if not side.arrived(got):
            self.broker.give_back(self.queue, got)
        elif got:
            self.broker.moved(DELIVERED, self.queue.name, len(got))

    # -- arming: subscribed, due time known, a first look ---------------------------------------
    def _register(self) -> None:
        """The registration's turn has come (or a publish here hurried it): arm the line,
        unless every waiter has left meanwhile (then the line is retired already)."""
        if self._state is _PENDING:
            self._state = _IDLE
            if self._live_waiters():
                self._arm()
            else:
                self._retire_if_unwaited()

    def hurry(self) -> None:
        """This worker is publishing to the queue: a registration still pending runs now (the
        message is found by its look, or its watch), not when the line of them gets to it."""
        self._register()

    def _arm(self) -> None:
        if not self._quiet():
            self._arm_indexed()

    def _arm_indexed(self) -> None:
        self._state = _ARMING
        self._again = False
        head = self._waiters[0]
        look = functools.partial(
            subscribe_and_look,
            self.queue,
            self._notice,
            head.max_count,
            head.visibility_s,
            head.max_per_group,
            head.consumer,
        )
        if self.broker.runs_here(self.queue, head.max_count):
            try:
                armed = self.broker.call_here(look)
            except Exception as exc:
                self._armed(head, None, exc)
            else:
                self._armed(head, armed, None)
        else:
            self.broker.first_use(look, functools.partial(self._armed, head))

    def _quiet(self) -> bool:
        """A queue without an index here that has nothing to lease nor anything falling due
        (a restart's consumers polling thousands of idle queues) is only watched until a change
        comes (`Queue.watch_if_idle`): no index, no timer, on the event loop (or, after a stall
        of the loop lately, on the cold lane: still no index). The change arms the line as
        usual (`_woken`)."""
        if self.queue.indexed() or not self.broker.on_local_disk():
            return False
        if not self.broker.looks_here():
            self._state = _ARMING
            self._again = False
            watch = functools.partial(self.queue.watch_if_idle, self._notice)
            self.broker.first_use(watch, self._watched)
            return True
        try:
            unsubscribe = self.broker.call_here(self.queue.watch_if_idle, self._notice)
        except Exception:  # the usual arming tells the waiters what is wrong
            return False
        if unsubscribe is None:
            return False
        self._watching(unsubscribe)
        return True

    def _watching(self, unsubscribe: Callable[[], None]) -> None:
        self._state = _QUIET
        self._unsubscribe = unsubscribe
        self.broker.watch_store()  # the store's inotify read here, so that `_notice` is called

    def _watched(self, unsubscribe: Callable[[], None] | None, error: BaseException | None) -> None:
        """The cold lane's `watch_if_idle` is done: quiet, or (not idle, or an error) armed as
        usual; undone if every waiter left meanwhile."""
        if self._state is not _ARMING:
            if unsubscribe is not None:
                unsubscribe()
            return
        if not self._live_waiters():
            if unsubscribe is not None:
                unsubscribe()
            self._retire_if_unwaited()
            return
        if error is not None or unsubscribe is None:
            self._arm_indexed()
            return
        self._watching(unsubscribe)
        if self._again:  # a change came while the watch was being set up: look now
            self._woken()

    def _armed(self, head: Waiter, armed: Armed | None, error: BaseException | None) -> None:
        if error is not None or armed is None:
            self._state = _IDLE
            self._fail(error or RuntimeError("arming a long poll line returned nothing"))
            return
        if self._state is not _ARMING:  # every waiter left (or the broker closed) meanwhile
            armed.unsubscribe()
            self.broker.give_back(self.queue, armed.got)
            return
        self._state = _ARMED
        self._unsubscribe = armed.unsubscribe
        self._polled = armed.polled
        self.broker.watch_store()  # the store's inotify read here, so that `_notice` is called
        if armed.got:
            self._hand_out(head, armed.got)
        if not self._live_waiters():
            self._retire_if_unwaited()
            return
        self._set_timer(armed.due_s)
        if armed.got or self._again:  # maybe more for the next waiters; or a change since
            self._woken()

    # -- waking: a change, or the timer ----------------------------------------------------------
    def _notice(self) -> None:
        """The queue may have changed (called by whichever thread pumps the store's inotify)."""
        if self._wake_pending:
            return  # a `_woken` is scheduled and has not begun: it will see this change too
        self._wake_pending = True
        if threading.get_ident() == self._loop_thread:
            # The usual caller: the loop's own pump of the store's inotify (or a call on the
            # loop that synced the index). `call_soon_threadsafe` would write the loop's wake-up
            # descriptor too, and the loop read it: two syscalls for nothing.
            self._loop.call_soon(self._woken)
            return
        try:
            self._loop.call_soon_threadsafe(self._woken)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _woken(self) -> None:
        self._wake_pending = False
        if self._state is _QUIET:  # something changed: now a look (and an index) is due
            assert self._unsubscribe is not None
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            unsubscribe()
            self._state = _IDLE
            if self._live_waiters():
                self._arm()
            else:
                self._retire_if_unwaited()
            return
        if self._state is not _ARMED or self._dispatch_task is not None:
            self._again = True
            return
        if not self._live_waiters():  # nobody to lease for (a lingering line): nothing to do
            self._retire_if_unwaited()
            return
        if self._looked_here():
            return
        self._dispatch_task = self._loop.create_task(self._dispatch())

    def _looked_here(self) -> bool:
        """A wake-up's first look, on the event loop without a task where a lease would run
        (most wake-ups are this worker's own renames echoed back: nothing to lease). True if
        there was nothing: the timer is set again and the wake-up is over; False (something
        leased and handed out, a failure, or a lease that runs on the pool) leaves the rest to
        the dispatch task, which looks again for the next waiters (or meets the failure). A
        waiter that wants more than `INLINE_MAX_MESSAGES` (a stream's credit) is leased that
        many at most here, as one lease call on the loop: else every echo of a stream's queue
        went to the pool, and the direct path could not take the stream while it was there."""
        if self._polled or not self._live_waiters():
            return False
        head = self._waiters[0]
        queue, broker = self.queue, self.broker
        ask = min(head.max_count, INLINE_MAX_MESSAGES)
        if not broker.runs_here(queue, ask):
            return False
        try:
            got = broker.call_here(
                queue.get,
                ask,
                visibility_s=head.visibility_s,
                max_per_group=head.max_per_group,
                consumer=head.consumer,
            )
            if got:
                self._hand_out(head, got)
                if len(got) == ask or head.side is None:
                    return False  # more may be ready, for it or the next waiters
            due_s = broker.call_here(queue.next_due_s)
        except Exception:
            return False
        self._set_timer(due_s)
        return True

    def _set_timer(self, due_s: float | None) -> None:
        if due_s is None and self._timer is not None and self._timer_idle:
            # An idle re-check is set already: kept rather than set again at each look (its
            # firing sooner than this look's would be costs one look that finds nothing).
            return
        idle = self.broker.store.poll_interval_s if self._polled else IDLE_RECHECK_S
        timeout = idle if due_s is None else min(due_s + 0.001, idle)
        timer = self._timer
        if timer is not None:
            if not self._timer_idle and timer.when() <= self._loop.time() + timeout:
                # Kept: it fires no later than this look wants (sooner costs one look that
                # finds nothing), and a look a message (each ack moves the earliest lease
                # on by a little) no longer makes and cancels a timer each.
                return
            timer.cancel()
        self._timer_idle = due_s is None
        self._timer = self._loop.call_later(timeout, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._woken()

    async def _dispatch(self) -> None:
        try:
            while self._state is _ARMED:
                self._again = False
                while self._live_waiters():
                    waiter = self._waiters[0]
                    got = await self._lease(waiter)
                    if not got:
                        break
                    self._hand_out(waiter, got)
                if not self._live_waiters():
                    self._retire_if_unwaited()
                    return
                if self._polled:
                    due_s = await self.broker.call(self.queue.next_due_s)
                else:
                    due_s = await self.broker.settle_call(self.queue, 1, self.queue.next_due_s)
                if self._state is _ARMED:
                    self._set_timer(due_s)
                if not self._again:
                    return
        except Exception as exc:  # e.g. the queue was deleted: every waiter learns why
            self._fail(exc)
        finally:
            self._dispatch_task = None

    async def _lease(self, waiter: Waiter) -> list[Message]:
        args = (waiter.max_count,)
        kwargs: dict[str, object] = {
            "visibility_s": waiter.visibility_s,
            "max_per_group": waiter.max_per_group,
            "consumer": waiter.consumer,
        }
        if self._polled:  # a look may list the queue's directories: never on the loop
            return await self.broker.call(self.queue.get, *args, **kwargs)
        return await self.broker.settle_call(
            self.queue, waiter.max_count, self.queue.get, *args, **kwargs
        )

    def _live_waiters(self) -> bool:
        while self._waiters and self._waiters[0].future.done():
            self._waiters.popleft()
        return bool(self._waiters)

    def _hand_out(self, waiter: Waiter, got: list[Message]) -> None:
        """`got` was leased for `waiter`. If its wait ended while the lease was under way, the
        next waiters that lease alike take the messages (a poll's deadline must not cost a
        parked stream its turn); only what none of them takes is given back."""
        rest = got
        served: list[Waiter] = []  # streams that stay in the line: to its back
        # (A poll whose wait ended has already left the line: `wait` forgets it.)
        for other in itertools.chain((waiter,), self._waiters):
            if not rest:
                break
            if other.future.done() or (
                other is not waiter
                and (other.visibility_s, other.max_per_group, other.consumer)
                != (waiter.visibility_s, waiter.max_per_group, waiter.consumer)
            ):
                continue
            if len(rest) > other.max_count and other.max_per_group != 1:
                continue  # a group's run (SQS FIFO) goes to one consumer whole, or back
            share, rest = rest[: other.max_count], rest[other.max_count :]
            side = other.side
            if side is not None and len(share) < other.max_count:
                # A stream with credit left stays in the line (SideDelivery): no new wait
                # between one delivery and the next, in which publishes could not take it.
                other.max_count -= len(share)
                side.taken()
                self._arrived_side(side, share)
                served.append(other)
            else:
                other.future.set_result(share)
        if served:
            self._to_the_back(served)
        self._live_waiters()
        self.broker.give_back(self.queue, rest)

    def _to_the_back(self, served: list[Waiter]) -> None:
        """The streams of `served` still in the line go to its back, in the order they were
        last served: one pass over the line (a scan and a removal each cost the line's length
        a stream, with many streams on a queue)."""
        last: dict[int, Waiter] = {}
        for waiter in served:
            last.pop(id(waiter), None)  # served again: its place is its last serving's
            last[id(waiter)] = waiter
        staying: deque[Waiter] = deque()
        moving: set[int] = set()
        for waiter in self._waiters:
            if id(waiter) in last:
                moving.add(id(waiter))
            else:
                staying.append(waiter)
        staying.extend(w for key, w in last.items() if key in moving)
        self._waiters = staying

    # -- ending ----------------------------------------------------------------------------------
    def _fail(self, error: BaseException) -> None:
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        self._waiters.clear()
        self._retire_if_unwaited(linger=False)

    def _retire_if_unwaited(self, linger: bool = True) -> None:
        """With no live waiter left: unsubscribe, stop the timer, and let the broker forget this
        line (a dispatch under way finds no waiter and ends; an arming under way undoes itself
        when it is done). An armed or quiet line (`linger`, the broker not closing) does so
        only once `LINGER_S` passed without a new waiter."""
        if self._live_waiters():
            return
        if linger and (self._state is _ARMED or self._state is _QUIET) and not self.broker.closing:
            if self._linger is None:
                self._linger = self._loop.call_later(LINGER_S, self._linger_over)
            return
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._unsubscribe is not None:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            unsubscribe()
        self._state = _IDLE
        self._ended(self)

    def _linger_over(self) -> None:
        self._linger = None
        self._retire_if_unwaited(linger=False)
