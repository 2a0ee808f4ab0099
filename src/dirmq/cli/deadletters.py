"""Commands for messages that failed: dead-letter (a consumer's verdict) and redrive.

`dirmq redrive QUEUE` runs a redrive task (dirmq/redrive/tasks.py) in the foreground: the same
task, recorded in the same files, that `POST /{queue}/redrive` starts on a server, so a server
serving the root lists it, and would resume it if this command were killed. Ctrl-C cancels it
after the chunk in progress; what was moved stays moved.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from dirmq.cli import exits
from dirmq.cli.args import open_store, queue_name
from dirmq.cli.progress import progress_bar
from dirmq.errors import InvalidArgument
from dirmq.store.events import DEAD_REASONS

if TYPE_CHECKING:
    from dirmq.redrive.model import RedriveTask
    from dirmq.redrive.tasks import Redrives


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the dead-letter commands to the subparsers action `sub`."""
    description = (
        "dead-letter a received message: a consumer's verdict, kept with the message "
        "(X-Dead-Reason rejected or unreadable, X-Dead-Detail your words)"
    )
    p = sub.add_parser("dead-letter", parents=[common], help=description, description=description)
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue it was received from")
    p.add_argument("receipt", metavar="RECEIPT", help="the receipt `dirmq get` printed")
    p.add_argument("--reason", metavar="TEXT", help="why, in a line (kept as X-Dead-Detail)")
    p.add_argument(
        "--unreadable",
        action="store_true",
        help="the message could not be decoded (reason 'unreadable'; default 'rejected')",
    )
    p.set_defaults(handler=cmd_dead_letter)

    description = (
        "move a queue's dead messages back where they died (its own dead area back to it; "
        "a dead-letter queue's messages each to its source), or to --to; ids and headers kept"
    )
    p = sub.add_parser("redrive", parents=[common], help=description, description=description)
    p.add_argument(
        "queue",
        type=queue_name,
        metavar="QUEUE",
        help="the queue whose dead messages move (a queue with a dead area, or a DLQ)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--ids", nargs="+", metavar="ID", help="only these messages")
    which.add_argument(
        "--reason", choices=DEAD_REASONS, help="only the messages that died for this reason"
    )
    p.add_argument("--to", type=queue_name, metavar="QUEUE", help="move them all to this queue")
    p.add_argument("--rate", type=int, metavar="N", help="at most N messages a second")
    p.add_argument("--json", action="store_true", help="print the task as JSON when it ends")
    p.add_argument(
        "--list", action="store_true", help="list the queue's redrive tasks instead, newest first"
    )
    p.add_argument("--cancel", metavar="TASK", help="cancel this running task instead")
    p.set_defaults(handler=cmd_redrive)


def cmd_dead_letter(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        reason = "unreadable" if args.unreadable else "rejected"
        store.queue(args.queue).dead_letter(args.receipt, args.reason, reason=reason)
    return exits.OK


def cmd_redrive(args: argparse.Namespace) -> int:
    # Imported here: only this command needs the redrive tasks (cli/__init__.py says why).
    from dirmq.redrive.tasks import Redrives

    with open_store(args) as store:
        tasks = Redrives(store, resume=False)
        if args.list:
            _print_tasks(tasks.list(args.queue), args.json)
            return exits.OK
        if args.cancel is not None:
            task = tasks.cancel(args.queue, args.cancel)
            _print_task(task, args.json)
            return exits.OK
        task = tasks.start(
            args.queue,
            ids=args.ids,
            reason=args.reason,
            to=args.to,
            rate_per_s=args.rate,
            origin="cli",
            background=False,
        )
        with (
            _cancel_on_interrupt(tasks, task),
            progress_bar(f"redrive {args.queue}", task.to_move) as advance,
        ):
            seen = 0

            def progress(running: RedriveTask) -> None:
                nonlocal seen
                advance(running.moved - seen)
                seen = running.moved

            tasks.run(task, progress=progress)
    if args.json:
        print(json.dumps(task.to_json()), flush=True)
    else:
        print(f"redrove {task.moved} message(s) ({task.status.lower()})")
        for message_id, why in task.left.items():
            exits.error(f"left {message_id}: {why}")
    if task.status == "FAILED":
        raise InvalidArgument(task.failure or "the redrive failed")
    return exits.OK


class _cancel_on_interrupt:  # noqa: N801 (a context manager used like a function)
    """Ctrl-C (SIGINT) asks the task to stop after its chunk, rather than killing it midway:
    the command then prints what it moved."""

    def __init__(self, tasks: Redrives, task: RedriveTask) -> None:
        self.tasks, self.task = tasks, task
        self._previous: Any = None

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._interrupted)

    def __exit__(self, *_exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _interrupted(self, _signum: int, _frame: FrameType | None) -> None:
        self.tasks.files.request_cancel(self.task)
        self.task.cancel_requested = True


def _print_task(task: RedriveTask, as_json: bool) -> None:
    if as_json:
        print(json.dumps(task.to_json()), flush=True)
    else:
        _print_tasks([task], False)


def _print_tasks(found: list[RedriveTask], as_json: bool) -> None:
    if as_json:
        for task in found:
            print(json.dumps(task.to_json()), flush=True)
        return
    if not found:
        return
    print(f"{'TASK':<32}  {'STATUS':<10}  {'MOVED':>7}  {'TO_MOVE':>7}  STARTED")
    for task in found:
        data = task.to_json()
        print(
            f"{task.task_id:<32}  {task.status_shown.lower():<10}  {task.moved:>7}  "
            f"{task.to_move:>7}  {data['started_at']}"
        )
