"""The record of the last check of a root, `<root>/@fsck/last.json`, so that every process
(the console of any worker or server, an operator's shell) can tell when the root was last
checked and what was found, without checking it again.

Whoever runs a check writes it (`dirmq fsck`, the console's "check now"): when, by what and
whom, read-only or repair, how long it took, and the findings summarised by kind (a count,
how many were repaired, the first few paths), not the whole report: a root with a million
damaged files must not make a million-line record. Written as a small file (smallfiles.py,
rename, durable); a reader takes a damaged or unknown record for an absent one.

A process that may not write the root (a read-only mount, another user's root) checks without
recording: `save` says why, and its caller warns. Only a root (a directory with its marker)
gets a record: a check of an arbitrary directory must not start making it look like one.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import read_marker, root_access
from dirmq.store.fsck import FsckReport

RECORD_FILE = "last.json"
RECORD_FORMAT = 1
SHOWN_PATHS = 5  # paths kept per kind


@dataclass(frozen=True, slots=True)
class Found:
    """One finding, as the record counts it: `owner` is the queue it is in ("" for the root
    and the upper layers' directories), `path` relative to the root."""

    kind: str
    owner: str
    path: str
    repaired: bool
    notice: bool


@dataclass(frozen=True, slots=True)
class KindSummary:
    """The findings of one kind: how many, how many repaired, the first `SHOWN_PATHS`
    (as [owner, path] pairs)."""

    kind: str
    count: int
    repaired: int
    notice: bool
    paths: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class FsckRecord:
    """What one check found; `clean` when nothing but notices is left."""

    at_s: float  # when the check started (Unix time)
    duration_s: float
    by: str  # what ran it: "dirmq fsck", "console"
    principal: str  # who asked, where the runner knows one (the console's session)
    user: str  # the OS user of the process
    host: str
    pid: int
    repair: bool
    clean: bool
    queues_checked: int
    messages_checked: int
    problems: int  # findings that are not notices
    repaired: int
    left: int  # problems not repaired
    notices: int
    kinds: tuple[KindSummary, ...] = field(default=())

    def to_json(self) -> bytes:
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, indent=1).encode() + b"\n"


def found_in(report: FsckReport) -> list[Found]:
    """The store's findings of `report` as the record counts them."""
    root = report.root
    return [
        Found(str(p.kind), p.queue, os.path.relpath(p.path, root), p.repaired, p.notice)
        for p in report.problems
    ]


def record_of(
    report: FsckReport,
    *,
    started_s: float,
    duration_s: float,
    by: str,
    repair: bool,
    principal: str = "",
    more: Iterable[Found] = (),
) -> FsckRecord:
    """The record of a check that gave `report` (plus `more` findings of the upper layers'
    checks, e.g. pub/sub's, their kinds prefixed by the caller)."""
    findings = [*found_in(report), *more]
    kinds: dict[str, list[Found]] = {}
    for finding in findings:
        kinds.setdefault(finding.kind, []).append(finding)
    problems = [f for f in findings if not f.notice]
    left = sum(1 for f in problems if not f.repaired)
    return FsckRecord(
        at_s=started_s,
        duration_s=duration_s,
        by=by,
        principal=principal,
        user=_user(),
        host=socket.gethostname(),
        pid=os.getpid(),
        repair=repair,
        clean=left == 0,
        queues_checked=report.queues_checked,
        messages_checked=report.messages_checked,
        problems=len(problems),
        repaired=sum(1 for f in problems if f.repaired),
        left=left,
        notices=len(findings) - len(problems),
        kinds=tuple(
            KindSummary(
                kind,
                len(found),
                sum(1 for f in found if f.repaired),
                all(f.notice for f in found),
                tuple((f.owner, f.path) for f in found[:SHOWN_PATHS]),
            )
            for kind, found in sorted(kinds.items(), key=lambda item: (-len(item[1]), item[0]))
        ),
    )


def record_dir(root: str) -> str:
    return os.path.join(root, layout.FSCK_DIR)


def save(root: str, record: FsckRecord) -> str | None:
    """Write `record` as the root's last check; None once written, else why it was not (the
    caller warns: a check that cannot record still reports)."""
    if not isinstance(read_marker(root), dict):
        return f"{root} has no readable {layout.ROOT_MARKER}: not recorded"
    path = os.path.join(record_dir(root), RECORD_FILE)
    try:
        smallfiles.replace_file(
            path, record.to_json(), durable=True, access=root_access(root), make_parents=True
        )
    except OSError as exc:
        return f"could not record the check in {path}: {exc.strerror or exc}"
    return None


def load(root: str) -> FsckRecord | None:
    """The root's last check, or None if none was recorded (or its record is damaged, or of
    a format this version does not know)."""
    try:
        raw = smallfiles.read_file(os.path.join(record_dir(root), RECORD_FILE))
    except OSError:
        return None
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.pop("format", None) != RECORD_FORMAT:
            return None
        kinds = tuple(
            KindSummary(
                str(k["kind"]),
                int(k["count"]),
                int(k["repaired"]),
                bool(k["notice"]),
                tuple((str(owner), str(path)) for owner, path in k["paths"]),
            )
            for k in data.pop("kinds")
        )
        return FsckRecord(**data, kinds=kinds)
    except (ValueError, KeyError, TypeError):
        return None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
