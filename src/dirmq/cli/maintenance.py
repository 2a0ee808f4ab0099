"""Maintenance commands: init (a root's access), fsck (check and repair the format) and
import-vsqs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from dirmq.cli import exits
from dirmq.cli.args import open_store, queue_name
from dirmq.cli.progress import progress_bar
from dirmq.store import Store, default_root, init_root

if TYPE_CHECKING:
    from dirmq.pubsub.check import Finding, PubSubReport
    from dirmq.schedules.check import Finding as ScheduleFinding
    from dirmq.schedules.check import SchedulesReport
    from dirmq.store.fsck import FsckReport, Problem


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the maintenance commands to the subparsers action `sub`."""
    p = sub.add_parser(
        "init",
        parents=[common],
        help="make the root private (the default), or shared by --group; converts an existing one",
    )
    p.add_argument(
        "--group",
        metavar="GROUP",
        help="share the root with this group (a name or a number): files 0660, directories 2770",
    )
    p.set_defaults(handler=cmd_init)

    p = sub.add_parser(
        "fsck",
        parents=[common],
        help="check every invariant of the root; --repair fixes what it can",
    )
    p.add_argument("--repair", action="store_true", help="repair what can be repaired safely")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=cmd_fsck)

    p = sub.add_parser(
        "import-vsqs",
        parents=[common],
        help="move a VSQS 0.3 queue directory into a queue (resumable)",
    )
    p.add_argument("source", metavar="DIR", help="the VSQS queue directory")
    p.add_argument(
        "queue", type=queue_name, metavar="QUEUE", help="the dirmq queue (created if absent)"
    )
    p.add_argument(
        "--remove",
        action="store_true",
        help="delete each source file once its message is durable in dirmq",
    )
    p.set_defaults(handler=cmd_import_vsqs)


def sweep_pubsub(store: Store) -> str | None:
    """`dirmq sweep`'s pub/sub part: one sweep of `@pubsub` (deliveries past their deadline
    given back or given up on, `anyone` messages timed out, broadcast entries pruned, outcomes a
    crash left unreported, half-finished publishes, dead sessions' presence), as a line of
    counts; None for a root that never used pub/sub."""
    # Imported here, as every command's heavier parts are: a `dirmq get` should not pay for
    # the modules of the commands it is not (a CLI call's time is mostly imports).
    from dirmq.pubsub.layout import PubSubPaths

    if not os.path.isdir(PubSubPaths.under(store.root).base):
        return None
    from dirmq.pubsub.hub import PubSub

    report = PubSub(store).sweep()
    return "@pubsub: " + " ".join(f"{key}={value}" for key, value in asdict(report).items())


def cmd_init(args: argparse.Namespace) -> int:
    root: str = args.root or default_root()
    changed = init_root(root, group=args.group)
    if args.group is None:
        print(f"private: files 0600, directories 0700; {changed} existing entries changed")
    else:
        print(
            f"shared by group {args.group}: files 0660, directories 2770; "
            f"{changed} existing entries changed"
        )
    return exits.OK


def cmd_fsck(args: argparse.Namespace) -> int:
    from dirmq.pubsub.check import check_pubsub
    from dirmq.schedules.check import check_schedules
    from dirmq.store import fsckrecord
    from dirmq.store.fsck import fsck

    root: str = args.root or default_root()
    started_s, started = time.time(), time.monotonic()
    with progress_bar("fsck", unit="files") as advance:
        report = fsck(root, repair=args.repair, progress=advance)
    pubsub = check_pubsub(root, repair=args.repair)
    schedules = check_schedules(root, repair=args.repair)
    more = pubsub.found(report.root) if pubsub is not None else []
    if schedules is not None:
        more = [*more, *schedules.found(report.root)]
    record = fsckrecord.record_of(
        report,
        started_s=started_s,
        duration_s=time.monotonic() - started,
        by="dirmq fsck",
        repair=args.repair,
        more=more,
    )
    unrecorded = fsckrecord.save(report.root, record)
    if unrecorded is not None:  # the check itself is done: say so, never fail for it
        print(f"dirmq: warning: {unrecorded}", file=sys.stderr)
    if args.json:
        data = report_json(report)
        if pubsub is not None:
            data["pubsub"] = {
                "findings": [asdict(f) for f in pubsub.findings],
                "entries_checked": pubsub.entries_checked,
                "ok": pubsub.ok,
            }
        if schedules is not None:
            data["schedules"] = {
                "findings": [asdict(f) for f in schedules.findings],
                "schedules_checked": schedules.schedules_checked,
                "records_checked": schedules.records_checked,
                "ok": schedules.ok,
            }
        data["ok"] = report.ok and (pubsub is None or pubsub.ok)
        data["ok"] = data["ok"] and (schedules is None or schedules.ok)
        print(json.dumps(data))
    else:
        for problem in report.problems:
            print(problem_line(problem, report.root))
        if pubsub is not None:
            for finding in pubsub.findings:
                print(finding_line(finding, report.root))
        if schedules is not None:
            for found in schedules.findings:
                print(finding_line(found, report.root))
        print(summary(report))
        if pubsub is not None:
            print(pubsub_summary(pubsub))
        if schedules is not None:
            print(schedules_summary(schedules))
    ok = report.ok and (pubsub is None or pubsub.ok) and (schedules is None or schedules.ok)
    return exits.OK if ok else exits.FSCK_UNREPAIRED


def finding_line(finding: Finding | ScheduleFinding, root: str) -> str:
    status = "repaired" if finding.repaired else "notice" if finding.notice else "PROBLEM"
    where = os.path.relpath(finding.path, root)
    return f"{status:<8}  {finding.kind:<14}  {where}: {finding.detail}"


def pubsub_summary(report: PubSubReport) -> str:
    found = [f for f in report.findings if not f.notice]
    left = [f for f in found if not f.repaired]
    return (
        f"pub/sub: {report.entries_checked} entr(ies) checked: {len(found)} problem(s), "
        f"{len(found) - len(left)} repaired, {len(left)} left"
    )


def schedules_summary(report: SchedulesReport) -> str:
    found = [f for f in report.findings if not f.notice]
    left = [f for f in found if not f.repaired]
    return (
        f"schedules: {report.schedules_checked} schedule(s), {report.records_checked} tick "
        f"record(s) checked: {len(found)} problem(s), {len(found) - len(left)} repaired, "
        f"{len(left)} left"
    )


def problem_line(problem: Problem, root: str) -> str:
    status = "repaired" if problem.repaired else "notice" if problem.notice else "PROBLEM"
    where = os.path.relpath(problem.path, root)
    return f"{status:<8}  {problem.kind:<14}  {where}: {problem.detail}"


def summary(report: FsckReport) -> str:
    found = [p for p in report.problems if not p.notice]
    notices = len(report.problems) - len(found)
    return (
        f"{report.queues_checked} queue(s), {report.messages_checked} message(s) checked: "
        f"{len(found)} problem(s), {len(report.repaired)} repaired, "
        f"{len(report.unrepaired)} left, {notices} notice(s); "
        f"{report.expired_leases} expired lease(s) and {report.due_delayed} due delay(s) "
        "wait for a sweep"
    )


def report_json(report: FsckReport) -> dict[str, object]:
    data = asdict(report)
    data["problems"] = [{**asdict(p), "notice": p.notice} for p in report.problems]
    data["ok"] = report.ok
    return data


def cmd_import_vsqs(args: argparse.Namespace) -> int:
    # Imported here: the compat layer is only needed by this one command.
    from dirmq.compat.vsqs_import import import_vsqs

    with open_store(args, create=True) as store, progress_bar("import") as advance:
        report = import_vsqs(args.source, store, args.queue, remove=args.remove, progress=advance)
    for key, value in asdict(report).items():
        print(f"{key:<20} {'-' if value is None else value}")
    return exits.OK
