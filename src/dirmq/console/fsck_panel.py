"""The fsck panel (`/ui/fsck`): the root's last check, as `dirmq fsck` or a console recorded it
(store/fsckrecord.py), and for a principal with `admin` on every name a read-only "check now".

A check from the browser never repairs: repairs stay with an operator's `dirmq fsck --repair`.
It runs on the broker's pool like every view, one at a time: per process by a lock, and per
root (every worker, every server on the root) by a hold in `@fsck/` (FORMAT.md, "Holds"),
renewed as the check advances; a second request while one runs is told so and waits for
nothing. A process that may not write the root still checks, and shows what it found without
recording it.

Seeing the result needs a session, as the overview's server facts do; a path is shown only
to a principal that may see the queue it is in (root-level and pub/sub paths: one that may
see every name), the counts to everyone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from dirmq.console.call import Call, Console
from dirmq.console.render import now_s
from dirmq.errors import AccessDenied
from dirmq.pubsub.check import check_pubsub
from dirmq.server.contract import Response
from dirmq.server.credentials import ADMIN, SEE
from dirmq.store import fsckrecord, holds
from dirmq.store.filemodes import read_marker, root_access
from dirmq.store.fsck import fsck
from dirmq.store.fsckrecord import FsckRecord

log = logging.getLogger("dirmq.console")

HOLD_PREFIX = "check."  # <root>/@fsck/check.<generation>: who runs the console's check
HOLD_TIMEOUT_S = 30.0
RENEW_EVERY_S = 5.0
_LOCK = threading.Lock()  # one check at a time in this process
_running: tuple[str, float] | None = None  # (principal, started) of this process's check


@dataclass(frozen=True, slots=True)
class Outcome:
    """A check that ran (`record`, and why it was not recorded, if it was not), or why none
    ran (`busy`)."""

    record: FsckRecord | None = None
    unrecorded: str | None = None
    busy: str | None = None


def may_check(console: Console, call: Call) -> bool:
    return console.access.covers(call.session.principal, ADMIN, "")


def status(console: Console) -> FsckRecord | None:
    """The last check, for the overview's line."""
    return fsckrecord.load(console.store.root)


def page(console: Console, call: Call) -> Response:
    return _render(console, call, fsckrecord.load(console.store.root))


def check_now(console: Console, call: Call) -> Response:
    if not may_check(console, call):
        principal = call.session.principal
        raise AccessDenied(f"principal {principal!r} has no admin permission on every name")
    outcome = run_check(console.store.root, call.session.principal)
    if outcome.busy is not None:
        return _back(outcome.busy)
    record = outcome.record
    assert record is not None
    if outcome.unrecorded is not None:  # the page could not read it back: shown from here
        return _render(console, call, record, note=f"checked; {outcome.unrecorded}")
    found = "clean" if record.clean else f"{record.left} problem(s) found"
    return _back(f"checked in {record.duration_s:.1f} s: {found}")


def run_check(root: str, principal: str) -> Outcome:
    """A read-only check of `root` (queues and pub/sub), recorded; or why it cannot run now."""
    global _running
    if not _LOCK.acquire(blocking=False):
        who, since = _running or ("", now_s())
        return Outcome(
            busy=f"a check is running already (asked by {who or 'anyone'}, since "
            f"{now_s() - since:.0f} s): its result shows here when it ends"
        )
    try:
        _running = (principal, now_s())
        hold, busy = _hold(root)
        if busy is not None:
            return Outcome(busy=busy)
        try:
            return _check(root, principal, hold)
        finally:
            if hold is not None:
                hold.release()
    finally:
        _running = None
        _LOCK.release()


def _hold(root: str) -> tuple[holds.Hold | None, str | None]:
    """The root's check hold, or why a check cannot run now. No hold but this process's lock
    where none can be taken: no marker (no @fsck is made in what may be no root), or a root
    this process may not write."""
    if not isinstance(read_marker(root), dict):
        return None, None
    try:
        taken = holds.take(
            fsckrecord.record_dir(root), HOLD_PREFIX, HOLD_TIMEOUT_S, access=root_access(root)
        )
    except OSError as exc:
        log.warning("console fsck: not held (%s): checking anyway", exc.strerror or exc)
        return None, None
    if isinstance(taken, holds.Busy):
        held = taken.record.describe(time.time())
        return None, f"a check is running already ({held}): its result shows here when it ends"
    if taken is None:
        return None, "other checks are starting at this moment: look again soon"
    return taken, None


def _check(root: str, principal: str, hold: holds.Hold | None) -> Outcome:
    started_s, started = time.time(), time.monotonic()
    renewed = [started]

    def advance(_: int) -> None:  # fsck's progress: the hold's heartbeat
        now = time.monotonic()
        if hold is not None and now - renewed[0] >= RENEW_EVERY_S:
            renewed[0] = now
            hold.renew()

    report = fsck(root, repair=False, progress=advance)
    pubsub = check_pubsub(root, repair=False)
    record = fsckrecord.record_of(
        report,
        started_s=started_s,
        duration_s=time.monotonic() - started,
        by="console",
        principal=principal,
        repair=False,
        more=pubsub.found(report.root) if pubsub is not None else (),
    )
    unrecorded = fsckrecord.save(report.root, record)
    if unrecorded is not None:
        log.warning("console fsck: %s", unrecorded)
    return Outcome(record, unrecorded)


def _render(console: Console, call: Call, record: FsckRecord | None, note: str = "") -> Response:
    principal = call.session.principal
    access = console.access
    sees_all = access.covers(principal, SEE, "")

    def shown(owner: str) -> bool:
        return sees_all if not owner else access.allows(principal, SEE, owner)

    context: dict[str, Any] = {
        "principal": principal,
        "signed_in": access.enabled,
        "csrf": call.csrf,
        "request_note": note or call.request.query.get("note", "")[:300],
        "record": record,
        "ago_s": now_s() - record.at_s if record is not None else None,
        "shown": shown,
        "may_check": may_check(console, call),
        "running": _running is not None,
    }
    return console.render.page("fsck.html", **context)


def _back(note: str) -> Response:
    location = "/ui/fsck?" + urlencode({"note": note})
    return Response(303, b"", [("Location", location), ("Cache-Control", "no-store")])
