"""`dirmq schedule put|list|show|pause|resume|delete|run`: recurring schedules of a local root
(docs/cli.md, "Schedules"). `run` runs them in the foreground, as every `dirmq serve` does."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from dataclasses import replace
from typing import Any

from dirmq.cli import exits
from dirmq.cli.args import duration, open_store, queue_name
from dirmq.cli.messages import header
from dirmq.errors import InvalidArgument, QueueNotFound
from dirmq.schedules import Schedules, ScheduleStatus, schedule
from dirmq.schedules.model import validate_schedule_name
from dirmq.schedules.runner import LATE_S


def schedule_name(text: str) -> str:
    try:
        return validate_schedule_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("schedule", help="recurring schedules: publish to a queue on a clock")
    actions = p.add_subparsers(
        dest="schedule_command",
        metavar="ACTION",
        required=True,
        help="put, list, show, pause, resume, delete or run",
    )
    put = actions.add_parser(
        "put", parents=[common], help="create or replace a schedule (the body from --body or stdin)"
    )
    put.add_argument("name", type=schedule_name, metavar="NAME", help="the schedule's name")
    put.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue it publishes to")
    when = put.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a cron expression ('*/5 * * * *')")
    when.add_argument(
        "--every", type=duration, metavar="DUR", help="a tick every DUR (at least 1s)"
    )
    put.add_argument(
        "--timezone", default="UTC", metavar="ZONE", help="--cron's IANA time zone (default UTC)"
    )
    put.add_argument("--body", metavar="TEXT", help="the message body (default: read stdin)")
    put.add_argument(
        "--header",
        action="append",
        type=header,
        default=[],
        metavar="NAME:VALUE",
        help="a header of each message (repeatable)",
    )
    put.add_argument(
        "--missed",
        choices=("skip", "once"),
        default="skip",
        help="ticks no runner published in time: skip them, or publish one message (default skip)",
    )
    put.add_argument("--paused", action="store_true", help="create it paused")
    put.set_defaults(handler=cmd_put)

    listing = actions.add_parser(
        "list", parents=[common], help="the schedules, with their last and next tick"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=cmd_list)
    show = actions.add_parser("show", parents=[common], help="one schedule as JSON")
    show.add_argument("name", type=schedule_name, metavar="NAME", help="the schedule's name")
    show.set_defaults(handler=cmd_show)
    for action, help_line in (
        ("pause", "stop publishing (its ticks while paused are skipped)"),
        ("resume", "publish again, from the next tick"),
        ("delete", "delete a schedule and its tick records"),
    ):
        p = actions.add_parser(action, parents=[common], help=help_line)
        p.add_argument("name", type=schedule_name, metavar="NAME", help="the schedule's name")
        p.set_defaults(handler=cmd_change, action=action)
    run = actions.add_parser(
        "run", parents=[common], help="run the root's schedules in the foreground until stopped"
    )
    run.add_argument(
        "--late",
        type=duration,
        default=LATE_S,
        metavar="DUR",
        help=f"a tick later than DUR counts as missed (default {LATE_S:g}s)",
    )
    run.set_defaults(handler=cmd_run)


def cmd_put(args: argparse.Namespace) -> int:
    headers = dict(args.header)
    if len(headers) != len(args.header):
        raise InvalidArgument("a header is given twice")
    spec = schedule(  # checked before stdin is read
        args.name,
        args.queue,
        cron=args.cron,
        every_s=args.every,
        timezone=args.timezone,
        headers=headers,
        missed=args.missed,
        paused=args.paused,
    )
    with open_store(args) as store:
        schedules = Schedules(store)
        if not store.exists(spec.queue):
            raise QueueNotFound(
                f"queue {spec.queue!r} does not exist: `dirmq create {spec.queue}` creates it",
                spec.queue,
            )
        body = args.body.encode() if args.body is not None else sys.stdin.buffer.read()
        stored = schedules.put(replace(spec, body=body))
        print(status_line(schedules.status(stored.name)))
    return exits.OK


def cmd_list(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        statuses = Schedules(store).statuses()
    for status in statuses:
        print(json.dumps(status.to_json()) if args.json else status_line(status))
    return exits.OK


def cmd_show(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        status = Schedules(store).status(args.name)
    print(json.dumps(status.to_json(), indent=1))
    return exits.OK


def cmd_change(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        schedules = Schedules(store)
        if args.action == "delete":
            schedules.delete(args.name)
            print(f"deleted {args.name}")
        else:
            getattr(schedules, args.action)(args.name)
            print(status_line(schedules.status(args.name)))
    return exits.OK


def cmd_run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open_store(args) as store, Schedules(store).scheduler(late_s=args.late):
        print("running schedules (SIGTERM or ^C stops)", file=sys.stderr, flush=True)
        stop.wait()
    return exits.OK


def status_line(status: ScheduleStatus) -> str:
    """`NAME QUEUE WHEN STATE last=... next=...`, one schedule on one line."""
    spec = status.schedule
    when = f"cron={spec.cron!r} tz={spec.timezone}" if spec.cron else f"every={spec.every_s:g}s"
    data = status.to_json()
    state = "paused" if spec.paused else "active"
    return (
        f"{spec.name} queue={spec.queue} {when} missed={spec.missed} {state} "
        f"last={data['last_tick'] or '-'} next={data['next_tick'] or '-'}"
    )
