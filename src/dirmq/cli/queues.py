"""Commands on whole queues: ls, stats, create, configure, rm, purge, sweep."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from dirmq.cli import exits
from dirmq.cli.args import add_config_options, config_changes, open_store, queue_name
from dirmq.cli.maintenance import sweep_pubsub
from dirmq.cli.progress import progress_bar
from dirmq.errors import DirmqError
from dirmq.store import QueueConfig, QueueStats, Store


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add the queue commands to the subparsers action `sub`."""
    p = sub.add_parser("ls", parents=[common], help="list queues with their message counts")
    p.add_argument(
        "prefix",
        nargs="?",
        default="",
        metavar="PREFIX",
        help="only queues whose name starts with PREFIX",
    )
    p.set_defaults(handler=cmd_ls)

    p = sub.add_parser("stats", parents=[common], help="message counts of one queue or all")
    p.add_argument(
        "queue", nargs="?", type=queue_name, metavar="QUEUE", help="this queue only (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_stats)

    p = sub.add_parser("create", parents=[common], help="create a queue")
    p.add_argument(
        "queue", type=queue_name, metavar="QUEUE", help="its name (a/b/c nests it in a/b)"
    )
    p.add_argument(
        "--exist-ok",
        action="store_true",
        help="succeed if the queue exists (its settings are left unchanged)",
    )
    add_config_options(p)
    p.set_defaults(handler=cmd_create)

    p = sub.add_parser(
        "configure",
        parents=[common],
        help="change queue settings; without options, print them as JSON",
    )
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to configure")
    add_config_options(p)
    p.set_defaults(handler=cmd_configure)

    for verb, paused, what in (
        ("pause", True, "stop deliveries of a queue (publishes are still accepted)"),
        ("resume", False, "deliver again from a paused queue"),
    ):
        p = sub.add_parser(verb, parents=[common], help=what)
        p.add_argument("queue", type=queue_name, metavar="QUEUE", help=f"the queue to {verb}")
        p.set_defaults(handler=cmd_configure, paused=paused)

    p = sub.add_parser(
        "rm", parents=[common], help="delete a queue and all its messages (child queues stay)"
    )
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to delete")
    p.set_defaults(handler=cmd_rm)

    p = sub.add_parser(
        "purge",
        parents=[common],
        help="delete every message of a queue (ready, in flight, delayed), or its dead area",
    )
    p.add_argument("queue", type=queue_name, metavar="QUEUE", help="the queue to empty")
    p.add_argument(
        "--dead",
        action="store_true",
        help="delete the messages of the queue's own dead area instead (and nothing else)",
    )
    p.set_defaults(handler=cmd_purge)

    p = sub.add_parser(
        "sweep",
        parents=[common],
        help="recover expired leases, due delays, orphans (one queue, or all and pub/sub)",
    )
    p.add_argument(
        "queue", nargs="?", type=queue_name, metavar="QUEUE", help="this queue only (default: all)"
    )
    p.set_defaults(handler=cmd_sweep)


def _stats_of(store: Store, names: list[str]) -> tuple[list[tuple[str, QueueStats]], int]:
    """Stats of each queue; a queue that cannot be read is reported on stderr and skipped, and
    the exit code says so (the others are still listed)."""
    rows: list[tuple[str, QueueStats]] = []
    code = exits.OK
    for name in names:
        try:
            queue = store.queue(name)
            rows.append((name, queue.stats()))
            queue.close()  # one watcher at a time: a root may hold more queues than inotify allows
        except DirmqError as exc:
            exits.error(f"queue {name!r}: {exits.describe(exc)}")
            code = code or exits.exit_code_for(exc) or exits.UNEXPECTED
    return rows, code


def cmd_ls(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        rows, code = _stats_of(store, store.list_queues(args.prefix))
    if rows:
        width = max(5, *(len(name) for name, _ in rows))
        print(f"{'QUEUE':<{width}}  {'READY':>9}  {'IN_FLIGHT':>9}  {'DELAYED':>9}  {'DEAD':>9}")
        for name, s in rows:
            print(f"{name:<{width}}  {s.ready:>9}  {s.in_flight:>9}  {s.delayed:>9}  {s.dead:>9}")
        if any(s.dead for _, s in rows):
            print(DEAD_NOTE)
    return code


# What DEAD counts, and what to do about it: a dead area is easy to overlook.
DEAD_NOTE = (
    "DEAD: in the queue's own dead area; `dirmq peek --dead QUEUE` shows why each died, "
    "`dirmq redrive QUEUE` moves them back"
)


def stats_json(name: str, stats: QueueStats) -> dict[str, object]:
    age = stats.oldest_ready_age_s
    return {
        "queue": name,
        "ready": stats.ready,
        "in_flight": stats.in_flight,
        "delayed": stats.delayed,
        "dead": stats.dead,
        "total": stats.total,
        "oldest_ready_age_s": None if age is None else round(age, 3),
    }


def cmd_stats(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        if args.queue is not None:
            stats = store.queue(args.queue).stats()
            data = stats_json(args.queue, stats)
            if args.json:
                print(json.dumps(data))
            else:
                for key, value in data.items():
                    print(f"{key:<20} {'-' if value is None else value}")
            return exits.OK
        rows, code = _stats_of(store, store.list_queues())
    if args.json:
        print(json.dumps([stats_json(name, s) for name, s in rows]))
    elif rows:
        width = max(5, *(len(name) for name, _ in rows))
        print(
            f"{'QUEUE':<{width}}  {'READY':>9}  {'IN_FLIGHT':>9}  {'DELAYED':>9}  {'DEAD':>9}  "
            f"{'TOTAL':>9}  {'OLDEST_S':>9}"
        )
        for name, s in rows:
            age = "-" if s.oldest_ready_age_s is None else f"{s.oldest_ready_age_s:.1f}"
            print(
                f"{name:<{width}}  {s.ready:>9}  {s.in_flight:>9}  {s.delayed:>9}  {s.dead:>9}  "
                f"{s.total:>9}  {age:>9}"
            )
    return code


def cmd_create(args: argparse.Namespace) -> int:
    config = QueueConfig(**config_changes(args))
    with open_store(args, create=True) as store:
        store.create_queue(args.queue, config, exist_ok=args.exist_ok)
    return exits.OK


def cmd_configure(args: argparse.Namespace) -> int:
    changes = config_changes(args)
    with open_store(args) as store:
        if changes:
            store.configure(args.queue, **changes)
        else:
            config = store.queue(args.queue).config
            print(json.dumps(config.to_json(), indent=2, sort_keys=True))
    return exits.OK


def cmd_rm(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        store.delete_queue(args.queue)
    return exits.OK


def cmd_purge(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        queue = store.queue(args.queue)
        stats = queue.stats()
        total = stats.dead if args.dead else stats.total
        with progress_bar(f"purge {args.queue}", total) as advance:
            removed = queue.purge(advance, dead=args.dead)
    print(f"purged {removed} message(s)")
    return exits.OK


def cmd_sweep(args: argparse.Namespace) -> int:
    with open_store(args) as store:
        names = [args.queue] if args.queue is not None else store.list_queues()
        code = exits.OK
        for name in names:
            try:
                queue = store.queue(name)
                report = queue.sweep()
                queue.close()
            except DirmqError as exc:
                if args.queue is not None:
                    raise
                exits.error(f"queue {name!r}: {exits.describe(exc)}")
                code = code or exits.exit_code_for(exc) or exits.UNEXPECTED
                continue
            done = " ".join(f"{key}={value}" for key, value in asdict(report).items())
            print(f"{name}: {done}")
        if args.queue is None:
            swept = sweep_pubsub(store)
            if swept is not None:
                print(swept)
    return code
