"""Move the messages of a VSQS 0.3 queue directory into a dirmq queue, in order, resumably.

Theory of operation. A VSQS queue is one flat directory:

    <micros>                    ready
    <micros>.<expiry_micros>    being consumed (in flight); the expiry may be a float, e.g.
                                `1716000000300000.0`, which vsqs itself never read back
    <micros>.new                a publish that never finished (skipped: vsqs never delivered it)

Every other entry is ignored, so a dirmq queue directory that still holds its vsqs files can be
imported in place. In-flight messages are imported as ready: their consumers hold vsqs ids, which
cannot delete anything in dirmq, so they would never be acknowledged.

Each message becomes `@ready/<id>` with `id = <micros:016d>-<node>`: the time part is the vsqs
timestamp (so FIFO order is kept, also relative to messages published later in dirmq), and the
node is a hash of the body. The id is thus a function of the message alone, unlike
`ids.new_id`, whose node is random per process: a second run computes the same ids and recognises
what is already there. Files are written through the store's group commit, up to `BATCH_SIZE` per
flush; a batch becomes visible only once durable.

Resumability: before anything is written, the ids already in the queue (in any state) are listed
once, and a journal in the source directory (`.dirmq-import-<hex>`, one vsqs timestamp per line,
fsynced after each batch is durable) records what was imported into this queue. A rerun skips both,
so it neither duplicates messages still in the queue nor brings back ones consumed since. With
`remove=True` each source file is unlinked only after its batch is durable and journaled, and the
journal itself goes once the run completes.

Run one import of a directory at a time, with the vsqs processes stopped: a vsqs consumer renaming
files meanwhile can make a message look vanished (counted; a rerun picks it up).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from dirmq.errors import InvalidArgument, MessageTooLarge, storage_error
from dirmq.store import Store, backlog, codec, delays, layout
from dirmq.store.filemodes import Access
from dirmq.store.fsio import PendingFile, create_pending, fsync_dir
from dirmq.store.names import RESERVED_PREFIX

__all__ = ["BATCH_SIZE", "JOURNAL_PREFIX", "ImportReport", "import_vsqs", "vsqs_message_id"]

BATCH_SIZE = 256
JOURNAL_PREFIX = ".dirmq-import-"
_VSQS_NAME = re.compile(r"([0-9]{1,16})(?:\.(new|[0-9][0-9.eE+-]*))?")
# vsqs 0.3 names files in microseconds; its README says milliseconds. Below 10**13, a name read as
# microseconds would date from April 1970, and read as milliseconds from before 2286: milliseconds.
_MILLIS_BELOW = 10**13
_STATE_DIRS = (layout.READY, layout.LEASED, layout.DELAYED, layout.DEAD)


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What one `import_vsqs` run did. Every vsqs message file counts in exactly one of
    `imported`, `skipped_incomplete`, `skipped_existing` or `vanished`."""

    imported: int = 0  # messages written to the queue by this run
    imported_in_flight: int = 0  # of which vsqs had in flight: ready again now
    skipped_incomplete: int = 0  # `.new` files: publishes that never completed (left in place)
    skipped_existing: int = 0  # imported by an earlier run (still in the queue, or journaled)
    vanished: int = 0  # listed, then gone before it could be read (a live vsqs process?)
    removed: int = 0  # source files unlinked (remove=True): imported or already imported
    ignored: int = 0  # foreign entries: neither vsqs messages nor dirmq's own `@...` entries
    journal_path: str | None = None  # the journal left in the source directory, if any


@dataclass(slots=True)
class _Source:
    micros: int
    names: list[str]  # normally one; two if a listing raced a vsqs rename of the same message


@dataclass(slots=True)
class _Tally:
    imported: int = 0
    imported_in_flight: int = 0
    skipped_incomplete: int = 0
    skipped_existing: int = 0
    vanished: int = 0
    removed: int = 0
    ignored: int = 0


def import_vsqs(
    source_dir: str,
    store: Store,
    queue_name: str,
    *,
    remove: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import every message of the VSQS 0.3 queue directory `source_dir` into queue `queue_name`
    of `store` (created with default settings if absent), oldest first.

    Idempotent and resumable (see the module docstring): rerunning after a crash or a completed
    run imports only what is not imported yet. With `remove`, source files are deleted once their
    messages are durable in dirmq; `.new` files and foreign entries are always left alone.
    `progress(n)` reports `n` more vsqs message files settled: once for the `.new` files, then
    after each batch.

    Imported messages take no capacity tokens, so they do not count against the queue's capacity.
    Raises `InvalidArgument` if `source_dir` is not a directory, `MessageTooLarge` if a message
    exceeds the queue's `max_message_bytes` (nothing of its batch is written), and `StorageError`
    if the filesystem fails; whatever earlier batches stored stays stored, and a rerun resumes.
    """
    queue = store.create_queue(queue_name, exist_ok=True)
    tally = _Tally()
    sources, incomplete = _list_sources(source_dir, tally)
    tally.skipped_incomplete = len(incomplete)
    if progress is not None and incomplete:
        progress(len(incomplete))
    present = _ids_in_queue(queue.path)
    journal = _Journal.load(source_dir, store.root, queue_name)
    max_bytes = queue.config.max_message_bytes
    try:
        for start in range(0, len(sources), BATCH_SIZE):
            batch = sources[start : start + BATCH_SIZE]
            _import_batch(batch, source_dir, queue.path, store, journal, present, max_bytes, tally)
            if remove:
                tally.removed += _remove_sources(source_dir, batch)
            if progress is not None:
                progress(len(batch))
    finally:
        journal.close()
    if remove and journal.exists and not tally.vanished:
        # Every journaled source file is gone, so the journal has nothing left to protect. (A
        # vanished file may just have been renamed by a live vsqs process: keep the journal.)
        journal.discard()
    return ImportReport(
        imported=tally.imported,
        imported_in_flight=tally.imported_in_flight,
        skipped_incomplete=tally.skipped_incomplete,
        skipped_existing=tally.skipped_existing,
        vanished=tally.vanished,
        removed=tally.removed,
        ignored=tally.ignored,
        journal_path=journal.path if journal.exists else None,
    )


def vsqs_message_id(micros: int, body: bytes) -> str:
    """The dirmq id an imported vsqs message gets: its vsqs timestamp, and a hash of its body."""
    node = hashlib.blake2b(body, digest_size=6, person=b"dirmq-vsqs-0.3").hexdigest()
    return f"{micros:016d}-{node}"


def _list_sources(source_dir: str, tally: _Tally) -> tuple[list[_Source], list[str]]:
    """The vsqs messages of `source_dir`, oldest first, and the names of its `.new` files."""
    try:
        names = os.listdir(source_dir)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise InvalidArgument(f"{source_dir!r} is not a vsqs queue directory") from exc
    except OSError as exc:
        raise storage_error(exc, f"listing {source_dir}") from exc
    by_micros: dict[int, _Source] = {}
    incomplete: list[str] = []
    for name in names:
        if name.startswith((RESERVED_PREFIX, JOURNAL_PREFIX)):
            continue  # dirmq's own entries, when a queue directory is imported in place
        match = _VSQS_NAME.fullmatch(name)
        if match is None or (match.group(2) not in (None, "new") and not _is_number(match[2])):
            tally.ignored += 1
            continue
        if match.group(2) == "new":
            incomplete.append(name)
            continue
        micros = int(match.group(1))
        if micros < _MILLIS_BELOW:
            micros *= 1000
        source = by_micros.setdefault(micros, _Source(micros, []))
        if match.group(2) is None:
            # The ready name first: if a listing caught both spellings, it is the current one.
            source.names.insert(0, name)
        else:
            source.names.append(name)
    return [by_micros[m] for m in sorted(by_micros)], incomplete


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _ids_in_queue(queue_path: str) -> set[str]:
    """Every message id in the queue's state directories (one listing per run, not per message)."""
    ids: set[str] = set()
    for directory in _STATE_DIRS:
        try:
            names = os.listdir(os.path.join(queue_path, directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(exc, f"listing {queue_path}") from exc
        ids.update(e.message_id for n in names if (e := layout.parse_entry(n)) is not None)
    # Those in buckets: delays by due minute, and a deep queue's backlog.
    for _bucket, name in itertools.chain(delays.names(queue_path), backlog.names(queue_path)):
        ids.add(name[: layout.ID_LENGTH])
    return ids


def _import_batch(
    batch: list[_Source],
    source_dir: str,
    queue_path: str,
    store: Store,
    journal: _Journal,
    present: set[str],
    max_bytes: int,
    tally: _Tally,
) -> None:
    """Write the batch's new messages with one group commit, then journal the whole batch."""
    pending: list[PendingFile] = []
    written: list[str] = []
    settled: list[int] = []
    in_flight = 0
    try:
        for source in batch:
            if source.micros in journal.done:
                tally.skipped_existing += 1
                settled.append(source.micros)
                continue
            read = _read_source(source_dir, source)
            if read is None:
                tally.vanished += 1
                continue
            name, body = read
            if len(body) > max_bytes:
                raise MessageTooLarge(
                    f"{os.path.join(source_dir, name)} is {len(body)} bytes; the queue accepts at "
                    f"most {max_bytes} (raise its max_message_bytes, then import again)"
                )
            message_id = vsqs_message_id(source.micros, body)
            settled.append(source.micros)
            if message_id in present:
                tally.skipped_existing += 1
                continue
            pending.append(_write_tmp(queue_path, message_id, body, store.access))
            written.append(message_id)
            in_flight += "." in name
    except BaseException:
        for f in pending:
            f.discard()
        raise
    if pending:
        store.group_commit.commit(pending)  # closes every fd; on failure, removes the temps
    present.update(written)
    tally.imported += len(written)
    tally.imported_in_flight += in_flight
    journal.record(settled)


def _read_source(source_dir: str, source: _Source) -> tuple[str, bytes] | None:
    """(name, bytes) of the first of the message's names still there; None if all are gone."""
    for name in source.names:
        path = os.path.join(source_dir, name)
        try:
            with open(path, "rb") as f:
                return name, f.read()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(exc, f"reading {path}") from exc
    return None


def _write_tmp(queue_path: str, message_id: str, body: bytes, access: Access) -> PendingFile:
    final = os.path.join(queue_path, layout.READY, message_id)
    tmp_dir = os.path.join(queue_path, layout.TMP)
    data = codec.encode(body, {}, message_id=message_id)
    try:
        return create_pending(tmp_dir, layout.tmp_name(message_id), final, data, access)
    except OSError as exc:
        raise storage_error(exc, f"writing a message into {tmp_dir}") from exc


def _remove_sources(source_dir: str, batch: list[_Source]) -> int:
    """Unlink the batch's source files (their messages are durable and journaled by now)."""
    removed = 0
    for source in batch:
        for name in source.names:
            path = os.path.join(source_dir, name)
            try:
                os.unlink(path)
                removed += 1
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise storage_error(exc, f"removing {path}") from exc
    if removed:
        try:
            fsync_dir(source_dir)
        except OSError as exc:
            raise storage_error(exc, f"flushing {source_dir}") from exc
    return removed


class _Journal:
    """The vsqs timestamps already imported from one directory into one queue (append-only).

    The file is created by the first batch that has something to record, so a run that imports
    nothing leaves no trace; in a read-only directory the journal is silently off.
    """

    def __init__(self, path: str, done: set[int]) -> None:
        self.path = path
        self.done = done
        self.exists = bool(done)
        self._fd: int | None = None
        self._writable = True

    @classmethod
    def load(cls, source_dir: str, root: str, queue_name: str) -> _Journal:
        key = zlib.crc32(f"{os.path.abspath(root)}\0{queue_name}".encode())
        path = os.path.join(source_dir, f"{JOURNAL_PREFIX}{key:08x}")
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return cls(path, set())
        except OSError as exc:
            raise storage_error(exc, f"reading {path}") from exc
        # Only whole lines count: a crash mid-append leaves a torn last line without its newline.
        done = {int(line) for line in raw.split(b"\n")[:-1] if line.isdigit()}
        journal = cls(path, done)
        journal.exists = True
        return journal

    def record(self, micros: list[int]) -> None:
        """Append `micros` durably (they are in the queue, durable, by now)."""
        fresh = [m for m in micros if m not in self.done]
        if not fresh or not self._writable:
            return
        try:
            if self._fd is None:
                try:
                    self._fd = os.open(
                        self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
                    )
                except OSError as exc:
                    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                        self._writable = False
                        return
                    raise
                self.exists = True
                # The journal must survive a crash only if its entry does: flush it once.
                fsync_dir(os.path.dirname(self.path) or ".")
            view = memoryview(b"".join(b"%d\n" % m for m in fresh))
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except OSError as exc:
            raise storage_error(exc, f"writing {self.path}") from exc
        self.done.update(fresh)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise storage_error(exc, f"removing {self.path}") from exc
        self.exists = False
