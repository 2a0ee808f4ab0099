"""`dirmq fsck` for pub/sub: check every invariant of `@pubsub/` (FORMAT.md, "Pub/sub").

Checked: every entry's name parses and its file decodes as a pub/sub message whose key matches
its name; the logs have no holes (the broadcast log above its floor); subscription records and
positions parse; no temp file of a small-file write (smallfiles.py) was left for an hour.
Repaired with `repair=True`: a damaged or foreign file in an entry directory is moved to
`@pubsub/@corrupt/` (kept for inspection, never delivered), such temp files are removed, and due
work (timeouts, aborts, unreported outcomes, half-finished publishes) is done by a sweep. A hole
in a log cannot be repaired (readers skip it); it is reported.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from dirmq.errors import CorruptMessage
from dirmq.pubsub.layout import SEQ_DIGITS, PubSubPaths, split_outbox, split_timed
from dirmq.pubsub.model import check_name
from dirmq.pubsub.seqlogs import is_tombstone
from dirmq.pubsub.transitions import read_entry
from dirmq.store import smallfiles
from dirmq.store.filemodes import root_access
from dirmq.store.fsckrecord import Found
from dirmq.store.recovery import older_than

CORRUPT_DIR = "@corrupt"
TMP_GRACE_S = 60.0


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    kind: str  # corrupt | foreign | hole | bad-record | due
    detail: str
    repaired: bool = False
    notice: bool = False  # reported, breaks no invariant (work a sweep does anyway)


@dataclass(slots=True)
class PubSubReport:
    findings: list[Finding] = field(default_factory=list)
    entries_checked: int = 0

    @property
    def ok(self) -> bool:
        return all(f.repaired or f.notice for f in self.findings)

    def found(self, root: str) -> list[Found]:
        """The findings as the record of a check counts them (store/fsckrecord.py): kinds
        prefixed `pubsub-`, paths relative to `root`."""
        root = os.path.abspath(root)
        return [
            Found(f"pubsub-{f.kind}", "", os.path.relpath(f.path, root), f.repaired, f.notice)
            for f in self.findings
        ]


def check_pubsub(root: str, *, repair: bool = False) -> PubSubReport | None:
    """Check `<root>/@pubsub` (None if the root has none)."""
    paths = PubSubPaths.under(os.path.abspath(root))
    if not os.path.isdir(paths.base):
        return None
    return _Checker(paths, repair).run()


class _Checker:
    def __init__(self, paths: PubSubPaths, repair: bool) -> None:
        self.paths = paths
        self.repair = repair
        self.report = PubSubReport()

    def run(self) -> PubSubReport:
        paths = self.paths
        self._entries(paths.messages, _canonical_key)
        self._entries(paths.anyone, _timed_key)
        self._entries(paths.outbox, _outbox_key)
        for log_dir, floor_file in (
            (paths.retained, None),
            (paths.broadcast, paths.broadcast + ".floor"),
        ):
            self._log(log_dir, floor_file)
        for name in _listdir(paths.subs):
            self._subscription(name)
            self._small_temps(paths.sub(name))
        self._temps()
        self._small_temps(paths.base)
        if self.repair:
            from dirmq.pubsub.hub import PubSub
            from dirmq.store.root import Store

            with Store(os.path.dirname(paths.base), create=False) as store:
                swept = PubSub(store).sweep()
            done = swept.timed_out + swept.aborted + swept.reported + swept.recovered
            if done:
                self._add(paths.base, "due", f"sweep: {swept}", repaired=True)
        return self.report

    def _add(
        self, path: str, kind: str, detail: str, *, repaired: bool = False, notice: bool = False
    ) -> None:
        self.report.findings.append(Finding(path, kind, detail, repaired, notice))

    def _quarantine(self, path: str, kind: str, detail: str) -> None:
        if not self.repair:
            self._add(path, kind, detail)
            return
        target_dir = os.path.join(self.paths.base, CORRUPT_DIR)
        root_access(os.path.dirname(self.paths.base)).makedirs(target_dir)
        target = os.path.join(target_dir, f"{os.path.basename(path)}.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return  # moved on meanwhile: nothing to repair
        self._add(path, kind, f"{detail}; moved to {CORRUPT_DIR}/", repaired=True)

    def _entries(self, directory: str, key_of: Callable[[str], str | None]) -> None:
        for name in _listdir(directory):
            path = os.path.join(directory, name)
            key = key_of(name)
            if key is None:
                self._quarantine(path, "foreign", "not a pub/sub entry name")
                continue
            self._message(path, key)

    def _message(self, path: str, key: str) -> None:
        self.report.entries_checked += 1
        if path.endswith(".end") and _is_empty(path):
            return  # a finished message: emptied, kept by its name alone for the dedup window
        try:
            envelope = read_entry(path).envelope
        except FileNotFoundError:
            return
        except CorruptMessage as exc:
            self._quarantine(path, "corrupt", str(exc))
            return
        if key not in (envelope.key, envelope.id):
            self._quarantine(path, "corrupt", f"its name says {key} but it holds {envelope.key}")

    def _log(self, directory: str, floor_file: str | None) -> None:
        seqs = []
        for name in _listdir(directory):
            path = os.path.join(directory, name)
            if len(name) != SEQ_DIGITS or not name.isdigit():
                self._quarantine(path, "foreign", "not a sequence number")
                continue
            seqs.append(int(name))
            self.report.entries_checked += 1
            try:
                read_entry(path)
            except FileNotFoundError:
                continue
            except CorruptMessage as exc:
                if floor_file is not None and is_tombstone(path):
                    continue  # the broadcast log's newest entry, buried once past its time
                # Moving it away would leave a hole; readers skip damaged entries themselves.
                self._add(path, "corrupt", f"{exc} (readers skip it)")
        if not seqs:
            return
        floor = 1
        if floor_file is not None:
            try:
                with open(floor_file, "rb") as f:
                    floor = int(f.read().strip() or b"1")
            except (FileNotFoundError, ValueError):
                floor = 1
        present = set(seqs)
        missing = [s for s in range(max(floor, 1), max(seqs)) if s not in present]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            self._add(directory, "hole", f"{len(missing)} missing entr(ies): {shown}")

    def _temps(self) -> None:
        """Named temp files of publishers that died (where O_TMPFILE is unavailable)."""
        now = time.time()
        for name in _listdir(self.paths.tmp):
            path = os.path.join(self.paths.tmp, name)
            try:
                if now - os.stat(path).st_mtime < TMP_GRACE_S:
                    continue  # a live publisher's
                if self.repair:
                    os.unlink(path)
            except FileNotFoundError:
                continue
            self._add(path, "orphan-tmp", "a dead publisher's temp file", repaired=self.repair)

    def _small_temps(self, directory: str) -> None:
        """Temp files of small-file writes (cursors, records, the broadcast floor) that a crash
        left: old ones only (a young one may be a write in progress)."""
        for path in smallfiles.find_temps(directory):
            if not older_than(path, smallfiles.STALE_TEMP_S):
                continue
            if self.repair:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
            target = smallfiles.temp_target(os.path.basename(path))
            detail = f"temp file of an unfinished write of {target}"
            self._add(path, "orphan-tmp", detail, repaired=self.repair)

    def _subscription(self, name: str) -> None:
        sub = self.paths.sub(name)
        try:
            check_name("subscription name", name)
        except ValueError:
            self._add(sub, "bad-record", "not a valid subscription name")
            return
        for record in (self.paths.subscription_file(name), self.paths.cursor(name)):
            try:
                with open(record, "rb") as f:
                    data = json.load(f)
            except FileNotFoundError:
                continue
            except ValueError as exc:
                self._add(record, "bad-record", f"not JSON ({exc}); re-attaching rewrites it")
                continue
            if not isinstance(data, dict | int):
                self._add(record, "bad-record", "not a JSON object")
        taken = self.paths.taken(name)
        self._entries(taken, _timed_key)


def _canonical_key(name: str) -> str | None:
    base, _dot, state = name.partition(".")
    if state not in ("", "live", "end"):
        return None
    try:
        return check_name("message id", base)
    except ValueError:
        return None


def _timed_key(name: str) -> str | None:
    timed = split_timed(name)
    return None if timed is None else timed[0]


def _outbox_key(name: str) -> str | None:
    parsed = split_outbox(name)
    return None if parsed is None else parsed[0].split("+", 1)[0]


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _is_empty(path: str) -> bool:
    try:
        return os.stat(path).st_size == 0
    except FileNotFoundError:
        return True
