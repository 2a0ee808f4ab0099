"""The console's actions (POST, and PUT for a configuration), each gated by the permission
the API asks for the same thing (`permissions.py`), each answered by a redirect to the page
that shows its outcome (`?note=`).

Bulk actions reach only what the page showed: a delete or redrive names its ids, and a
redrive of "all that match" is bounded by the newest id the page had (`newest`) and the time
it was drawn (`drawn`), so a dead letter that arrived after the page was drawn is not touched.
"""

from __future__ import annotations

from urllib.parse import urlencode

from dirmq.console.call import Call, Console, View, queue_of
from dirmq.console.permissions import permission
from dirmq.console.render import queue_url
from dirmq.errors import InvalidArgument, MessageNotFound, StaleReceipt
from dirmq.redrive.tasks import MAX_IDS, redrives_of
from dirmq.server.contract import Response
from dirmq.server.credentials import WRITE
from dirmq.store import OutgoingMessage, Queue, QueueConfig
from dirmq.store.ids import is_id
from dirmq.wire import jsondoc
from dirmq.wire.durations import parse_duration
from dirmq.wire.messages import stored_headers

MAX_SELECTED = 1000  # ids one form may name


def _queue(console: Console, call: Call, action: str) -> str:
    name = queue_of(call.request.path)
    console.require(call, permission(action), name)
    return name


def _back(name: str, note: str, *rest: str, **query: str) -> Response:
    location = queue_url(name, *rest) + "?" + urlencode({**query, "note": note})
    return Response(303, b"", [("Location", location), ("Cache-Control", "no-store")])


def _ids(call: Call) -> list[str]:
    ids = list(dict.fromkeys(call.form.get("id", [])))
    if len(ids) > MAX_SELECTED:
        raise InvalidArgument(f"{len(ids)} messages selected; at most {MAX_SELECTED} at once")
    for message_id in ids:
        if not is_id(message_id):
            raise InvalidArgument(f"not a message id: {message_id[:80]!r}")
    return ids


def publish(console: Console, call: Call) -> Response:
    name = _queue(console, call, "publish")
    pairs = []
    for line in call.arg("headers").splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise InvalidArgument(f"a header line is 'Name: value', not {line[:80]!r}")
        pairs.append((key.strip(), value.strip()))
    headers = stored_headers(pairs)
    if len(headers) != len(pairs):
        raise InvalidArgument(
            "a message keeps Content-Type, Content-Encoding and X-Attr-* headers only"
        )
    delay = call.arg("delay").strip()
    message = OutgoingMessage(
        call.arg("body").encode(),
        headers,
        delay_s=parse_duration(delay, "delay") if delay else None,
        group=call.arg("group").strip() or None,
    )
    [message_id] = console.store.queue(name).put_many([message])
    return _back(name, f"published {message_id}")


def purge(console: Console, call: Call) -> Response:
    name = _queue(console, call, "purge")
    dead = call.arg("dead") == "1"
    if call.arg("confirm") != name:
        raise InvalidArgument(
            f"type the queue's name ({name!r}) to confirm the purge; nothing was removed"
        )
    removed = console.store.queue(name).purge(dead=dead)
    what = "dead letters" if dead else "messages"
    return _back(name, f"purged {removed} {what}")


def configure(console: Console, call: Call) -> Response:
    name = _queue(console, call, "configure")
    known = QueueConfig().to_json().keys()
    changes = jsondoc.load_object(
        call.arg("config").encode(),
        "queue configuration must be a JSON object",
        known,
        "a queue takes " + ", ".join(sorted(known)),
        "configuration key",
    )
    target = changes.get("dead_letter_queue")
    if isinstance(target, str):  # its dead letters are written there, as the API asks
        console.require(call, WRITE, target)
    QueueConfig().updated(**changes)  # refused before anything changes
    console.store.configure(name, **changes)
    return _back(name, "configuration saved")


def pause(console: Console, call: Call) -> Response:
    """Pause or resume a queue's deliveries (`op`): its `paused` key, as `PUT /{queue}`
    writes it; every process and server sees it within a second (store/flow.py)."""
    name = _queue(console, call, "pause")
    op = call.arg("op")
    if op not in ("pause", "resume"):
        raise InvalidArgument(f"op is pause or resume, not {op[:40]!r}")
    console.store.configure(name, paused=op == "pause")
    if op == "pause":
        return _back(name, "paused: nothing is delivered until it is resumed; publishes go on")
    return _back(name, "resumed: deliveries go on")


def delete(console: Console, call: Call) -> Response:
    name = _queue(console, call, "delete")
    queue = console.store.queue(name)
    deleted = sum(1 for message_id in _ids(call) if queue.delete(message_id))
    state = call.arg("state", "ready")
    return _back(name, f"deleted {deleted} messages", "browse", state=state)


def lease(console: Console, call: Call) -> Response:
    """Extend or release an in-flight message's lease, found by its id (its receipt is its id
    and receive count: the store knows both)."""
    name = _queue(console, call, "lease")
    queue = console.store.queue(name)
    message_id = call.arg("lease") or call.arg("id")  # a row's button, or the release form
    if not is_id(message_id):
        raise InvalidArgument(f"not a message id: {message_id[:80]!r}")
    found = queue.peek(message_id)
    if found.state != "leased":
        raise MessageNotFound(f"message {message_id} is not in flight (it is {found.state})")
    receipt = f"{found.id}.{found.receive_count}"
    try:
        if call.arg("op") == "release":
            outcome = queue.nack(receipt)
            note = f"released {message_id}: {outcome}"
        else:
            seconds = parse_duration(call.arg("seconds", "30") or "30", "seconds")
            queue.extend(receipt, seconds)
            note = f"extended the lease of {message_id} by {seconds:g} s"
    except StaleReceipt:
        note = f"the lease of {message_id} ended meanwhile: nothing changed"
    return _back(name, note, "browse", state="leased")


def redrive(console: Console, call: Call) -> Response:
    name = _queue(console, call, "redrive")
    queue = console.store.queue(name)
    if call.arg("all") == "1":
        ids = _shown_then(queue, call.arg("newest"), call.arg("drawn"))
    else:
        ids = _ids(call)
    if not ids:
        raise InvalidArgument("no dead letter selected: nothing to redrive")
    rate = call.arg("rate").strip()
    if rate and not rate.isdigit():
        raise InvalidArgument(f"rate is messages per second, a whole number, not {rate[:40]!r}")
    task = redrives_of(console.store).start(
        name, ids=ids, rate_per_s=int(rate) if rate else None, origin="console"
    )
    return _back(name, f"redriving {task.to_move} dead letters", "redrive", task.task_id)


def _shown_then(queue: Queue, newest: str, drawn: str) -> list[str]:
    """The dead letters "all that match" may reach: none newer than the newest id the page
    showed, and none that died after the page was drawn (an older message redriven and
    dead again since then was not what the page showed)."""
    if not is_id(newest):
        raise InvalidArgument("'all that match' needs the newest id the page showed")
    try:
        drawn_s = float(drawn)
    except ValueError:
        raise InvalidArgument("'all that match' needs the time the page was drawn") from None
    planned = [p.message_id for p in queue.redrive_plan(until=newest)]
    if len(planned) > MAX_IDS:
        raise InvalidArgument(f"{len(planned)} dead letters match; one redrive takes {MAX_IDS}")
    return [m.id for m in queue.read_ids(planned) if m.dead is None or m.dead.at_s <= drawn_s]


def cancel(console: Console, call: Call) -> Response:
    name = _queue(console, call, "cancel")
    task_id = call.arg("task")
    redrives_of(console.store).cancel(name, task_id)
    return _back(name, "cancel requested", "redrive", task_id)


ACTIONS: dict[str, View] = {
    "publish": publish,
    "purge": purge,
    "configure": configure,
    "pause": pause,
    "delete": delete,
    "lease": lease,
    "redrive": redrive,
    "cancel": cancel,
}
