"""Publishing a message straight into a consumer's lease: the shortest durable path from a
publisher to a consumer that is already waiting (issue 37).

Theory of operation. A message for a waiting consumer would normally be written, flushed and
renamed into @ready (its directory flushed too), then noticed through inotify and leased by a
second rename. Here its file is created once, durably, under its lease name in @leased
(`<id>.1.<deadline>[+<holder>][^<level>]`, as a get would have named it): one write, one fsync,
one link or rename, one directory fsync (or, through the commit journal, one append and
`fdatasync` of the journal instead of both fsyncs: journal.py), and the consumer holds it.
Other processes see an ordinary lease (an expiry returns it to @ready, an ack retires it);
`dirmq fsck` checks it as any lease.

Only when that keeps every promise the two-step path keeps (`admits`, under the queue's lock):
a writethrough publish on a local filesystem, the queue neither paused nor rate-limited nor
bounded by a capacity nor spreading its head (`peers`), the message not delayed, in no group,
with no dedup id, and nothing ready, in the backlog, or falling due in this process's index
(so nothing older, or of a higher priority, is passed over). Its receive count is 1, and a time
to live does not matter: it is delivered now. Anything else takes the usual path.

A crash at any instant leaves no message (before the link: the file is unnamed, in this
process's pool, or in @tmp, all reclaimed as after any publish) or a leased one, which returns
to @ready when its lease expires, like any other.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from dirmq.errors import DiskFull, QueueNotFound, storage_error
from dirmq.store import codec, flow, layout
from dirmq.store.clock import due_ms, now_ms, now_ns
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.expiry import EXPIRES, deadline_ms
from dirmq.store.fsio import PendingFile, create_pending, fsync_dir, syncfs
from dirmq.store.holders import token_of
from dirmq.store.ids import id_time_us, new_ids
from dirmq.store.message import Message, OutgoingMessage
from dirmq.store.publishing import Publisher
from dirmq.store.view import QueueView


class DirectLease(NamedTuple):
    """One message for `DirectLeases.put_leased`, and the lease it is to be stored as."""

    message: OutgoingMessage
    visibility_s: float | None  # None: the queue's visibility timeout
    consumer: str | None  # the holder's label (holders.py)


class DirectLeases:
    """The direct path of one queue (`Queue.direct`). Thread-safe."""

    def __init__(self, view: QueueView, publisher: Publisher, context: QueueContext) -> None:
        self._view = view
        self._publisher = publisher
        self._context = context

    def admits(self, message: OutgoingMessage, durability: Durability | str | None) -> bool:
        """Whether `message` (already passed by `Queue.validate`) may go straight into a
        lease now (see the module's docstring). True also takes over its validation: the
        caller then stores it by `put_leased`, never by `put_many`."""
        if self._context.shared or type(message.body) is not bytes:
            return False
        if message.group is not None or message.dedup_id is not None:
            return False
        view = self._view
        with view.lock:
            config = flow.current_config(view)
            level = Durability(durability) if durability is not None else config.durability
            delay_s = config.delay_s if message.delay_s is None else message.delay_s
            if (
                level is not Durability.WRITETHROUGH
                or delay_s > 0
                or config.paused
                or config.delivery_rate_per_s is not None
                or config.capacity is not None
                or config.peers
            ):
                return False
            index = view.synced()
            if index.ready or index.backlog or index.due_by(now_ms()):
                return False
            return self._publisher.forget_validated(message, config)

    def put_leased(
        self,
        leases: Sequence[DirectLease],
        linked: Callable[[list[Message]], None] | None = None,
    ) -> list[Message]:
        """Store each message of `leases` (which `admits` let through) as a lease of its
        `visibility_s` (None: the queue's visibility timeout) held by its `consumer`, all in
        one durable commit: the files flushed (one `syncfs` for several), linked into @leased,
        @leased fsynced. The messages as delivered, in order. `linked`, if given, is called
        with them once every file is linked, before the directory fsync: the consumers may have
        them then, as the usual path's consumer sees a message once its rename is visible.
        Raises as a publish does (`StorageError`, `DiskFull`, `QueueNotFound`): before the
        links, leaving nothing behind; after them (the directory fsync failed), leaving the
        leases to expire or be settled like any other."""
        view, files = self._view, self._view.files
        config = view.config
        ids = new_ids(len(leases))
        at_ns = now_ns()
        leased_dir = files.dir[layout.LEASED]
        pending: list[PendingFile] = []
        messages: list[Message] = []
        names: list[str] = []
        try:
            for message_id, (message, visibility_s, consumer) in zip(ids, leases, strict=True):
                visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
                lease_deadline_ms = due_ms(at_ns, visibility)
                holder = token_of(files.context.holders, consumer)
                lease = layout.timed_name(
                    message_id, 1, lease_deadline_ms, None, holder, message.priority
                )
                expires_ms = deadline_ms(message, config, at_ns)
                system = {} if expires_ms is None else {EXPIRES: str(expires_ms)}
                data = codec.encode(message.body, message.headers, system, message_id=message_id)
                pending.append(self._write(message_id, f"{leased_dir}/{lease}", data))
                names.append(lease)
                messages.append(_delivered(message_id, message, lease_deadline_ms, expires_ms))
            journaled = self._link(pending)
        except BaseException as exc:
            for f in pending:
                f.discard()
            if isinstance(exc, DiskFull):
                files.pool.release_space()  # recycled files are space the disk needs now
            raise
        with view.lock:
            # Known before inotify echoes them (the echo of a known lease is skipped): a
            # receipt may be acked at once.
            if view.index is not None:
                for delivered, lease in zip(messages, names, strict=True):
                    deadline = round((delivered.lease_deadline_s or 0) * 1000)
                    view.index.leased.add_ungrouped(delivered.id, deadline, lease)
        if linked is not None:
            linked(messages)
        if journaled:  # durable by its journal record already
            return messages
        try:
            fsync_dir(leased_dir)
        except OSError as exc:
            raise storage_error(exc, f"storing new messages in queue {view.name!r}") from exc
        return messages

    def _link(self, pending: list[PendingFile]) -> bool:
        """Flush `pending` and link each into place: all or none (a failure unlinks those
        linked already, and raises). True if they were committed through the journal
        (journal.py: one append and fdatasync, no directory fsync to follow)."""
        journal = self._context.journal
        if journal is not None and not self._context.group_commit.flush_each(
            pending[0].final_path.rpartition("/")[0]
        ):
            try:
                if journal.commit(pending):
                    return True
            except QueueNotFound as exc:
                raise QueueNotFound.missing(self._view.name) from exc
        done: list[str] = []
        try:
            if len(pending) == 1:
                os.fsync(pending[0].fd)
            else:
                syncfs(pending[0].fd)
            for f in pending:
                f.publish()
                done.append(f.final_path)
            return False
        except OSError as exc:
            for path in done:  # all or nothing: no consumer has any of them yet
                with contextlib.suppress(OSError):
                    os.unlink(path)
            if exc.errno == errno.ENOENT:
                raise QueueNotFound.missing(self._view.name) from exc
            raise storage_error(exc, f"storing new messages in queue {self._view.name!r}") from exc

    def _write(self, message_id: str, final: str, data: bytes) -> PendingFile:
        """The file, written (a recycled one where the pools have one), to be linked as
        `final`: the publish's own way (publishing.py `_write_tmp`)."""
        files = self._view.files
        pool, tmp_dir = files.pool, files.dir[layout.TMP]
        tmp_name = layout.tmp_name(message_id)
        try:
            pending = pool.overwrite_own(final, data)
            if pending is None:
                pending = pool.overwrite_shared(f"{tmp_dir}/{tmp_name}", final, data)
            if pending is None:
                pending = create_pending(tmp_dir, tmp_name, final, data, self._context.access)
            return pending
        except FileNotFoundError:
            raise QueueNotFound.missing(self._view.name) from None
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {self._view.name!r}") from exc


def _delivered(
    message_id: str, message: OutgoingMessage, lease_deadline_ms: int, expires_ms: int | None
) -> Message:
    """What the consumer of a direct lease receives: the message as a get would read it."""
    return Message(
        id=message_id,
        body=bytes(message.body),
        headers=dict(message.headers),
        receive_count=1,
        published_at_s=id_time_us(message_id) / 1e6,
        receipt=f"{message_id}.1",
        lease_deadline_s=lease_deadline_ms / 1000,
        state="leased",
        expires_at_s=None if expires_ms is None else expires_ms / 1000,
        priority=message.priority,
    )


def admissible_config(config: QueueConfig) -> bool:
    """Whether a queue so configured may ever take the direct path (a cheap first test)."""
    return (
        not config.paused
        and config.delivery_rate_per_s is None
        and config.capacity is None
        and not config.peers
        and config.delay_s <= 0
    )
