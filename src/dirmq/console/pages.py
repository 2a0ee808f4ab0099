"""The console's pages, each a view run on the broker's thread pool: the overview, a queue,
its messages by state, one message (and its raw file), a redrive task.

Messages are shown only through `Queue.browse` and `Queue.peek`, which lease nothing; every
page asks `server/access.py` what the API would ask (`permissions.py`) before it looks.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from dirmq.console.call import Call, Console, queue_of, ref_of
from dirmq.console.disk import disk_of, free_space
from dirmq.console.fsck_panel import status as fsck_status
from dirmq.console.permissions import permission
from dirmq.console.preview import Preview, preview
from dirmq.console.pubsub_view import pubsub_summary
from dirmq.console.render import now_s
from dirmq.console.schedules_page import schedules_of
from dirmq.errors import InvalidArgument, MessageNotFound
from dirmq.redrive.tasks import redrives_of
from dirmq.server.contract import Response
from dirmq.server.credentials import SEE
from dirmq.store import delays, layout
from dirmq.store.ids import is_id
from dirmq.store.message import Message

PAGE_SIZE = 100  # queues of the overview, messages of a browse page
SORTS = {
    "name": lambda d: d.name,
    "ready": lambda d: d.stats.ready,
    "in_flight": lambda d: d.stats.in_flight,
    "delayed": lambda d: d.stats.delayed,
    "dead": lambda d: d.stats.dead,
    "age": lambda d: d.stats.oldest_ready_age_s or 0.0,
}
STATES = ("ready", "leased", "delayed", "dead", "corrupt")
_CRC = re.compile(rb"\nBody-CRC32: ([0-9a-f]{8})\n")


def _common(console: Console, call: Call) -> dict[str, Any]:
    return {
        "principal": call.session.principal,
        "signed_in": console.access.enabled,
        "csrf": call.csrf,
        "request_note": call.request.query.get("note", "")[:300],
    }


# -- overview ------------------------------------------------------------------------------------
def overview(console: Console, call: Call) -> Response:
    query = call.request.query
    prefix = query.get("prefix", "")
    sort = query.get("sort", "name")
    if sort not in SORTS:
        raise InvalidArgument(f"sort by one of {', '.join(SORTS)}, not {sort[:40]!r}")
    descending = query.get("desc") == "1"
    page = _int(query.get("page", "1"), "page")
    principal = call.session.principal
    access = console.access
    paused_only = query.get("paused") == "1"
    depths = [
        d
        for d in console.census.depths()
        if d.name.startswith(prefix) and access.allows(principal, SEE, d.name)
    ]
    flags = {d.name: console.flags.flags(d.name) for d in depths}  # a stat each (queue_flags)
    if not prefix:
        console.flags.forget_except(set(flags))
    paused = sum(1 for f in flags.values() if f.paused)
    if paused_only:
        depths = [d for d in depths if flags[d.name].paused]
    depths.sort(key=SORTS[sort], reverse=descending)
    pages = max(1, -(-len(depths) // PAGE_SIZE))
    page = min(page, pages)
    shown = depths[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    state = {
        "prefix": prefix,
        "paused": "1" if paused_only else "",
        "sort": sort,
        "desc": "1" if descending else "",
        "page": page,
    }
    context = {
        **_common(console, call),
        "queues": shown,
        "flags": flags,
        "paused_count": paused,
        "total": len(depths),
        "page": page,
        "pages": pages,
        "state": state,
        "link": lambda **changes: (
            "/ui/?"
            + urlencode({k: v for k, v in (state | changes).items() if v not in ("", None, 1)})
        ),
    }
    if query.get("part") == "table":
        return _conditional(call, console.render.page("overview_table.html", **context))
    facts = console.facts
    context |= {
        "facts": facts,
        "uptime_s": now_s() - facts.started_s,
        "pid": os.getpid(),
        "disk": free_space(facts.root),
        "pubsub": pubsub_summary(console, principal),
        "fsck": fsck_status(console),
        "now": now_s(),
    }
    return console.render.page("overview.html", **context)


def _conditional(call: Call, response: Response) -> Response:
    """`response` with an ETag of its body; 304 when the browser has that one already."""
    etag = '"' + hashlib.sha256(response.body).hexdigest()[:32] + '"'
    response.headers.append(("ETag", etag))
    if call.request.headers.get("if-none-match") == etag:
        return Response(304, b"", [("ETag", etag), ("Cache-Control", "no-cache")])
    response.headers[:] = [(k, v) for k, v in response.headers if k != "Cache-Control"]
    response.headers.append(("Cache-Control", "no-cache"))
    return response


# -- a queue -------------------------------------------------------------------------------------
def queue_page(console: Console, call: Call) -> Response:
    name = _queue_name(console, call, "queue")
    queue = console.store.queue(name)
    stats = queue.stats()
    settings = queue.config
    allowed = _allowed(console, call, name)
    levels = queue.ready_by_level() if settings.priority_levels > 1 else {}
    return console.render.page(
        "queue.html",
        **_common(console, call),
        **allowed,
        name=name,
        stats=stats,
        settings=settings,
        levels=sorted(levels.items(), reverse=True),  # highest first: the order of delivery
        config=settings.to_json(),
        disk=disk_of(queue.path, stats.ready),
        tasks=redrives_of(console.store).list(name)[:5],
        schedules=schedules_of(console, name) if allowed["may_browse"] else [],
    )


def _allowed(console: Console, call: Call, name: str) -> dict[str, Any]:
    """What the principal may do here: only those buttons are drawn."""
    actions = (
        "browse",
        "configure",
        "pause",
        "publish",
        "purge",
        "delete",
        "lease",
        "redrive",
        "cancel",
    )
    return {f"may_{a}": console.may(call, permission(a), name) for a in actions}


@dataclass(frozen=True, slots=True)
class Row:
    message: Message
    preview: Preview
    due_s: float | None  # a delayed message's due time


def browse(console: Console, call: Call) -> Response:
    name = _queue_name(console, call, "browse")
    query = call.request.query
    state = query.get("state", "ready")
    if state not in STATES:
        raise InvalidArgument(f"state is one of {', '.join(STATES)}, not {state[:40]!r}")
    after = query.get("after") or None
    if after is not None and not is_id(after):
        raise InvalidArgument(f"after= takes a message id, not {after[:80]!r}")
    queue = console.store.queue(name)
    corrupt: list[tuple[str, int]] = []
    rows: list[Row] = []
    more = False
    if state == "corrupt":
        corrupt = _corrupt_files(queue.path)
    else:
        got = list(queue.browse(PAGE_SIZE + 1, after=after, state=state))
        more = len(got) > PAGE_SIZE
        got = got[:PAGE_SIZE]
        due = _due_times(queue.path) if state == "delayed" else {}
        rows = [Row(m, preview(m.body), due.get(m.id)) for m in got]
    return console.render.page(
        "browse.html",
        **_common(console, call),
        **_allowed(console, call, name),
        name=name,
        state=state,
        states=STATES,
        rows=rows,
        levels=queue.config.priority_levels,
        expiring=any(r.message.expires_at_s is not None for r in rows),
        corrupt=corrupt,
        after=after,
        next_after=rows[-1].message.id if more and rows else None,
        newest=max((r.message.id for r in rows), default=""),
        drawn=f"{now_s():.3f}",
    )


def _due_times(path: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for _bucket, name in delays.names(path):  # @delayed's buckets (store/delays.py)
        entry = layout.parse_entry(name)
        if entry is not None and entry.at_ms is not None:
            found[entry.message_id] = entry.at_ms / 1000
    return found


def _corrupt_files(path: str) -> list[tuple[str, int]]:
    found = []
    directory = os.path.join(path, layout.CORRUPT)
    for name in sorted(_listdir(directory))[:1000]:
        try:
            found.append((name, os.lstat(os.path.join(directory, name)).st_size))
        except FileNotFoundError:
            continue
    return found


# -- a message -----------------------------------------------------------------------------------
def message(console: Console, call: Call) -> Response:
    name = _queue_name(console, call, "message")
    queue = console.store.queue(name)
    found = queue.peek(_message_id(call))
    path = _file_of(queue.path, found)
    raw = (_read(path) if path else None) or b""
    crc = _CRC.search(raw)
    return console.render.page(
        "message.html",
        **_common(console, call),
        **_allowed(console, call, name),
        name=name,
        m=found,
        levels=queue.config.priority_levels,
        now=now_s(),
        body=preview(found.body, None),
        file=os.path.relpath(path, console.store.root) if path else None,
        file_bytes=len(raw),
        checksum=crc.group(1).decode() if crc else None,
    )


def raw(console: Console, call: Call) -> Response:
    name = _queue_name(console, call, "message")
    queue = console.store.queue(name)
    message_id = _message_id(call)
    path = _file_of(queue.path, queue.peek(message_id))
    data = _read(path) if path else None
    if data is None:
        raise MessageNotFound(f"no message {message_id} in queue {name!r} (it moved)")
    return Response(
        200,
        data,
        [
            ("Content-Type", "application/octet-stream"),
            ("Content-Disposition", f'attachment; filename="{message_id}.msg"'),
            ("Cache-Control", "no-store"),
        ],
    )


def _file_of(queue_path: str, found: Message) -> str | None:
    """Where `found` is on disk now: its name is known from its state but for a delay's due
    time, which a listing of @delayed tells."""
    tag = layout.group_tag(found.group) if found.group else None
    directory = os.path.join(queue_path, "@" + found.state)
    if found.state == "ready":
        candidates = [layout.ready_name(found.id, found.receive_count, tag, found.priority)]
    elif found.state == "dead":
        candidates = [layout.dead_name(found.id, found.receive_count, tag, found.priority)]
    elif found.state == "leased" and found.lease_deadline_s is not None:
        at_ms = round(found.lease_deadline_s * 1000)
        holder = found.holder.token if found.holder else None
        name = layout.timed_name(found.id, found.receive_count, at_ms, tag, holder, found.priority)
        candidates = [name]
    elif found.state == "delayed":  # in the bucket of its due minute: found by listing them
        prefix = layout.lease_prefix(found.id, found.receive_count)
        places = [(b, n) for b, n in delays.names(queue_path) if n.startswith(prefix)]
        return next((os.path.join(queue_path, b, n) for b, n in places), None)
    else:
        prefix = layout.lease_prefix(found.id, found.receive_count)
        candidates = [n for n in _listdir(directory) if n.startswith(prefix)]
    for candidate in candidates:
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    return None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


# -- a redrive task ------------------------------------------------------------------------------
def task(console: Console, call: Call) -> Response:
    name = _queue_name(console, call, "task")
    found = redrives_of(console.store).get(name, ref_of(call.request.path))
    return console.render.page(
        "task.html",
        **_common(console, call),
        **_allowed(console, call, name),
        name=name,
        task=found,
    )


def not_found(console: Console, call: Call) -> Response:
    return console.render.page(
        "error.html", 404, message="There is no such page in the console.", principal=""
    )


# -- helpers -------------------------------------------------------------------------------------
def _queue_name(console: Console, call: Call, action: str) -> str:
    """The queue of the path, once the principal may do `action` there (judged by its name,
    before it is looked up: a refusal says nothing of whether it exists)."""
    try:
        name = queue_of(call.request.path)
    except UnicodeDecodeError:
        raise InvalidArgument("the queue name in the path is not UTF-8") from None
    console.require(call, permission(action), name)
    return name


def _message_id(call: Call) -> str:
    message_id = ref_of(call.request.path)
    if not is_id(message_id):
        raise MessageNotFound(f"{message_id[:80]!r} is not a message id")
    return message_id


def _int(text: str, what: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 10**9:
        raise InvalidArgument(f"{what} is a positive number, not {text[:40]!r}")
    return int(text)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
