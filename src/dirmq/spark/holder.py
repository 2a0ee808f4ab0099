"""Who holds a streaming consumer name: one running query at a time.

    <stateDir>/consumers/<queue>/@<consumer>/
      holder.<generation, 20 digits>   {"host", "pid", "started", "token", "timeout_s"}

Two queries sharing a consumer share its ledger, and would replay each other's batches: each
would deliver every message. So the name is held with the store's hold (`store/holds.py`: a
record created with `link(2)`, an mtime heartbeat, takeover once the holder is dead or stopped
renewing; no file locks), renewed by the driver's upkeep thread (`upkeep.py`) every quarter of
`timeout_s` (the query's `leaseSeconds`).

- **Taking the name**: refused with `ConsumerBusy`, naming the live holder, unless the holder
  is gone (released by `stop()`, not renewed for its `timeout_s`, or its process is gone from
  this host). A live holder on this host is first given a few seconds to go: Spark returns
  from `stop()` before the source's Python worker has exited.
- **Losing it**: a holder whose record was superseded (another query judged it dead: it did
  not renew for `timeout_s`) or removed (the consumer's directory was deleted, which resets the
  consumer) no longer holds the name; its next planning fails rather than deliver beside the
  new holder.
"""

from __future__ import annotations

import time

from dirmq.errors import ConsumerBusy, storage_error
from dirmq.store import holds, smallfiles
from dirmq.store.filemodes import Access
from dirmq.store.holds import Busy, Hold, HoldRecord, Lost

PREFIX = "holder."


def record_path(consumer_dir: str, generation: int) -> str:
    return holds.record_path(consumer_dir, PREFIX, generation)


def read_record(path: str) -> HoldRecord | None:
    """The holder record at `path`, or None if it is gone (a damaged one counts as released)."""
    try:
        return holds.read_record(path)
    except OSError as exc:
        raise storage_error(exc, f"reading {path}") from exc


class ConsumerHold:
    """This query's hold on a consumer name (see the module docstring)."""

    def __init__(self, hold: Hold, label: str) -> None:
        self._hold = hold
        self._label = label
        self.path = hold.path

    def renew(self) -> bool:
        """Refresh the heartbeat; False (and remembered) once the name is lost."""
        try:
            return self._hold.renew()
        except OSError as exc:
            raise storage_error(exc, f"renewing {self.path}") from exc

    def check(self) -> None:
        """Raise `ConsumerBusy` if the name was lost."""
        lost = self._hold.lost
        if lost is None:
            return
        if lost is Lost.SUPERSEDED:
            why = (
                f"{self._label} was taken over by another query (this one did not renew its "
                "hold in time)"
            )
        elif lost is Lost.REMOVED:
            why = f"{self._label} was reset: its record {self.path} is gone"
        else:
            why = "released"
        raise ConsumerBusy(f"{self._label}: {why}; stopping rather than deliver twice")

    def release(self) -> None:
        """Give the name back (it stays with whoever took it over, if someone did)."""
        try:
            self._hold.release()
        except OSError:
            pass  # not renewed any more: it lapses after its timeout


def take(
    consumer_dir: str,
    label: str,
    timeout_s: float,
    access: Access,
    attempts: int = 10,
    grace_s: float = 3.0,
) -> ConsumerHold:
    """Take the consumer name whose ledger is `consumer_dir` for this process, or raise
    `ConsumerBusy` naming the live holder. `label` names the consumer in messages. A live
    holder on this host is given `grace_s` to go: a query stopped just now may still be ending
    (Spark returns from `stop()` before the source's Python worker has exited)."""
    try:
        taken = holds.take(
            consumer_dir, PREFIX, timeout_s, access=access, attempts=attempts, grace_s=grace_s
        )
        smallfiles.remove_stale_temps(consumer_dir)  # of writes a crashed driver left
    except OSError as exc:
        raise storage_error(exc, f"taking {label} in {consumer_dir}") from exc
    if isinstance(taken, Hold):
        return ConsumerHold(taken, label)
    if isinstance(taken, Busy):
        holder = taken.record
        raise ConsumerBusy(
            f"{label} is held by a running query ({holder.describe(time.time())}; "
            f"{taken.path}): stop that query first, or give this one another `consumer` name. "
            f"A holder that stops renewing is taken over {holder.timeout_s:g} s after its "
            "last renewal"
        )
    raise ConsumerBusy(f"{label}: other queries keep taking the name; try again")
