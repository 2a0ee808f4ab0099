"""Where things live inside a queue directory, and how state is spelled in file names.

    <queue>/@queue.json        configuration (replaced atomically)
    <queue>/@tmp/              files being written: <id>.<process>.tmp
    <queue>/@ready/            <id>            never received
                               .<final name>.<process, dashes>  being written (shared filesystems)
                               <id>.<count>    received <count> times, then returned
    <queue>/@leased/           <id>.<count>.<deadline_ms>[+<holder token>]
    <queue>/@delayed/<minute>/ <id>.<count>.<due_ms>   in the bucket of its due minute,
                               due_ms // 60,000 (delays.py; flat in @delayed before format 5)
    <queue>/@dead/             <id>.<count>    dead-lettered here (no dead-letter queue set)
    Any of these may end in ^<level> for a message of priority level 1-9 (before a group's
    tag: level 0 names carry none), and in ~<group tag> for a message of a group.
    <queue>/@corrupt/          files that failed to decode, kept for inspection
    <queue>/@slots/            capacity tokens: symlink <n> -> <id>
    <queue>/@free/             retired message files kept for reuse (see pool.py): <id>
    <queue>/@dedup/            dedup records: symlink <sha256(dedup id)[:40]> -> <id>
    <queue>/@backlog/<epoch>/<second>/<ready name>   a deep queue's messages behind @ready,
                               in buckets of one second of ids (backlog.py)
    <queue>/@rate/<second>.<n>  delivery slots of a rate-limited queue (flow.py)

Everything a process needs to recover leases and delays is in the names: no file is opened.
`<process>` is the writer's identity (processes.py: host tag, pid namespace, pid, start time).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass

from dirmq.store import processes
from dirmq.store.bounds import AT_MS_DIGITS, COUNT_DIGITS
from dirmq.store.ids import ID_PATTERN
from dirmq.store.processes import ProcessIdentity, current, parse_token

CONFIG_FILE = "@queue.json"
TMP = "@tmp"
READY = "@ready"
LEASED = "@leased"
DELAYED = "@delayed"
DEAD = "@dead"
CORRUPT = "@corrupt"
FREE = "@free"
DEDUP = "@dedup"
SLOTS = "@slots"
BACKLOG = "@backlog"  # a deep queue's messages behind its head (backlog.py)
RATE = "@rate"  # delivery slots of a rate-limited queue, made on first use (flow.py)
STATE_DIRS = (TMP, READY, LEASED, DELAYED, DEAD, CORRUPT, SLOTS, FREE, DEDUP, BACKLOG)
ROOT_MARKER = "@dirmq.json"
ROOT_TRASH = "@trash"
# Root directories of the layers above the store (docs/FORMAT.md): pub/sub, the Spark source.
# Named here so fsck knows them without importing those layers; each layer checks its own.
PUBSUB_DIR = "@pubsub"
SPARK_DIR = "@spark"  # the Spark source's default state directory (spark/options.py)
SQS_DIR = "@sqs"  # the SQS layer's own files (sqs/deleted.py, attempts)
REDRIVE_DIR = "@redrive"  # redrive tasks (dirmq/redrive/records.py)
FSCK_DIR = "@fsck"  # the record of the last check (fsckrecord.py), the console's check's hold
SCHEDULES_DIR = "@schedules"  # recurring schedules and their ticks (dirmq/schedules/)
ROOT_UPPER_DIRS = frozenset({PUBSUB_DIR, SPARK_DIR, SQS_DIR, REDRIVE_DIR, FSCK_DIR, SCHEDULES_DIR})
JOURNAL_DIR = "@journal"  # the commit journals of writing processes (journal.py; format 6)
HOLDERS_DIR = "@holders"  # who holds leases: one record per process and label (holders.py)
GROUP_TAG_LENGTH = 12
HOLDER_LENGTH = 12  # a holder token: 12 hex digits, random per process and label

# Counts and times are bounded (bounds.py): every value the store accepts fits these digits.
_ENTRY_RE = re.compile(
    rf"({ID_PATTERN})(?:\.([0-9]{{1,{COUNT_DIGITS}}}))?(?:\.([0-9]{{1,{AT_MS_DIGITS}}}))?"
    rf"(?:\+([0-9a-f]{{{HOLDER_LENGTH}}}))?(?:\^([1-9]))?(?:~([0-9a-f]{{{GROUP_TAG_LENGTH}}}))?"
)

_BARE_ID_RE = re.compile(ID_PATTERN)
ID_LENGTH = 29  # 16 digits, a dash, 12 hex digits (ids.py)
_RECEIPT_RE = re.compile(rf"({ID_PATTERN})\.([0-9]{{1,{COUNT_DIGITS}}})")
_TMP_RE = re.compile(rf"({ID_PATTERN})\.([0-9a-f.]+)\.tmp")
_BESIDE_RE = re.compile(r"\.(.+)\.([0-9a-f-]+)")
HOST_TAG = processes.HOST_TAG  # its home is processes.py


def group_tag(group: str) -> str:
    """The short tag of a message group in file names (a hash: names stay portable)."""
    return hashlib.sha256(group.encode()).hexdigest()[:GROUP_TAG_LENGTH]


@dataclass(frozen=True, slots=True)
class Entry:
    """A parsed state-directory file name."""

    message_id: str
    count: int
    at_ms: int | None  # lease deadline or delivery due time
    group: str | None = None  # tag of the message group (leased by one get at a time)
    holder: str | None = None  # a lease's holder token (holders.py); None: unknown
    level: int = 0  # priority level (`^<level>` in the name; 0: none), delivered highest first

    @property
    def receipt(self) -> str:
        return f"{self.message_id}.{self.count}"


def is_bare_id(name: str) -> bool:
    """Whether `name` is a bare message id (a message never received: most of a backlog)."""
    return len(name) == ID_LENGTH and _BARE_ID_RE.fullmatch(name) is not None


def parse_entry(name: str) -> Entry | None:
    """Parse any state file name; None for names that are not ours (they are left alone).

    A bare id (a message never received: most of a backlog) takes one match; other names are
    cached: a name is parsed where it is made, again when inotify reports it, and once more
    when it leaves its directory; an `Entry` is immutable."""
    if len(name) == ID_LENGTH and _BARE_ID_RE.fullmatch(name):
        return Entry(name, 0, None)
    if name[:1] == ".":  # a temp (temp_beside) or a filesystem's own: kept out of the cache
        return None
    return _parse_entry(name)


@functools.lru_cache(maxsize=8192)
def _parse_entry(name: str) -> Entry | None:
    match = _ENTRY_RE.fullmatch(name)
    if match is None:
        return None
    count, at_ms = match.group(2), match.group(3)
    return Entry(
        match.group(1),
        int(count) if count else 0,
        int(at_ms) if at_ms else None,
        match.group(6),
        match.group(4),
        int(match.group(5) or 0),
    )


def level_of(name: str) -> int:
    """The priority level in a state name (0 when it carries none), without a full parse."""
    at = name.find("^")
    return 0 if at < 0 else int(name[at + 1])


def _tagged(name: str, group: str | None, level: int = 0) -> str:
    if level:
        name = f"{name}^{level}"
    return f"{name}~{group}" if group else name


def ready_name(message_id: str, count: int, group: str | None = None, level: int = 0) -> str:
    return _tagged(message_id if count == 0 else f"{message_id}.{count}", group, level)


def timed_name(
    message_id: str,
    count: int,
    at_ms: int,
    group: str | None = None,
    holder: str | None = None,
    level: int = 0,
) -> str:
    """Name in @leased (at_ms = deadline; `holder`: who holds the lease, a token of
    holders.py) or @delayed (at_ms = due time; never a holder)."""
    if holder:
        return _tagged(f"{message_id}.{count}.{at_ms}+{holder}", group, level)
    return _tagged(f"{message_id}.{count}.{at_ms}", group, level)


def lease_prefix(message_id: str, count: int) -> str:
    """What every `timed_name` of (`message_id`, `count`) starts with: a receipt's lease is
    recognised by it, without parsing the name."""
    return f"{message_id}.{count}."


def dead_name(message_id: str, count: int, group: str | None = None, level: int = 0) -> str:
    return _tagged(f"{message_id}.{count}", group, level)


def parse_receipt(receipt: str) -> tuple[str, int] | None:
    match = _RECEIPT_RE.fullmatch(receipt) if isinstance(receipt, str) else None
    return (match.group(1), int(match.group(2))) if match else None


_token = current().token()  # not rendered per message; a forked child takes its own
_dashed = current().token("-")


def _after_fork() -> None:
    global _token, _dashed
    _token, _dashed = current().token(), current().token("-")


os.register_at_fork(after_in_child=_after_fork)


def tmp_name(message_id: str) -> str:
    return f"{message_id}.{_token}.tmp"


def parse_tmp(name: str) -> tuple[str, ProcessIdentity] | None:
    """(id, writer) of a temp file name (an earlier version's `<id>.<host>.<pid>.tmp` too),
    or None."""
    match = _TMP_RE.fullmatch(name)
    writer = parse_token(match.group(2)) if match else None
    return (match.group(1), writer) if match and writer else None


def temp_beside(final_name: str) -> str:
    """The name of a file being written beside its final name, in the final directory: the
    shared-filesystem mode's temps (FORMAT.md, "Temps beside their final name"). Every listing
    skips it (`parse_entry` gives None: a leading dot). GlusterFS's DHT places a name of this
    shape (its default `rsync-hash-regex`, `^\\.(.+)\\.[^.]+$`) on the brick of `<final name>`,
    so the rename that publishes it stays on one brick and needs no link file: hence the
    writer's identity with dashes, no dot."""
    return f".{final_name}.{_dashed}"


def parse_temp_beside(name: str) -> tuple[str, ProcessIdentity] | None:
    """(final name, writer) of a `temp_beside` name (an earlier version's
    `.<final name>.<host>-<pid>` too), or None."""
    if not name.startswith("."):
        return None
    match = _BESIDE_RE.fullmatch(name)
    if match is None or parse_entry(match.group(1)) is None:
        return None
    writer = parse_token(match.group(2), "-")
    return (match.group(1), writer) if writer else None
