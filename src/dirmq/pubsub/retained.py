"""Reading a range of the retained log (`future` messages) by sequence number, consuming nothing.

The log (`retained/<seq>`, docs/FORMAT.md) is dense from 1 and never shrinks, so every number up
to the head names an entry: one that cannot be read inside a range is lost data, not a gap.
`read_retained` therefore yields a `LostEntry` for it (absent: its file was deleted; damaged: it
does not decode) where it would have yielded the entry, so a reader can tell loss from
filtering. The HTTP server's retained pages and the Spark source's local reads both read here;
`read_envelope` reads an entry's routing facts alone (the console counts channels with it).
Blocking file reads, no state, nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.errors import CorruptMessage, storage_error
from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Envelope, Filter
from dirmq.pubsub.transitions import Entry, read_entry
from dirmq.store.codec import RESERVED_PREFIX

ENVELOPE_BYTES = 8192  # of a file's head: its system headers, written before the user's
ABSENT = "absent"  # the entry's file is gone
DAMAGED = "damaged"  # the entry's file does not decode


@dataclass(frozen=True, slots=True)
class LostEntry:
    """An entry of the range that cannot be read."""

    seq: int
    why: str  # ABSENT or DAMAGED
    error: str | None = None  # what is wrong with a damaged one


RetainedItem = tuple[int, Entry] | LostEntry


def read_retained(
    paths: PubSubPaths, first: int, end: int, wanted: Filter, *, head: int | None = None
) -> Iterator[RetainedItem]:
    """(seq, entry) for each entry `first` .. `end - 1` (none past `head`, when given) that
    matches `wanted`, in sequence order, and a `LostEntry` for each one that is missing or
    damaged, matching or not (its filter fields cannot be known). Lazy: a reader that stops
    early reads no further. StorageError if the filesystem fails otherwise."""
    if head is not None:
        end = min(end, head + 1)
    for seq in range(first, end):
        try:
            entry = read_entry(paths.retained_entry(seq))
        except FileNotFoundError:
            yield LostEntry(seq, ABSENT)
            continue
        except CorruptMessage as exc:
            yield LostEntry(seq, DAMAGED, str(exc))
            continue
        except OSError as exc:
            raise storage_error(exc, f"reading retained entry {seq}") from exc
        if wanted.matches(entry.envelope.channel, entry.envelope.subject):
            yield seq, entry


def read_envelope(path: str) -> Envelope:
    """The envelope of the entry at `path`, from the first ENVELOPE_BYTES of its file: enough
    to count or route it, without reading a body of up to 16 MiB, and so not checked against
    the body's checksum (`read_entry` is). FileNotFoundError if it is gone, CorruptMessage if
    those bytes hold no envelope."""
    with open(path, "rb") as file:
        head = file.read(ENVELOPE_BYTES)
    end = head.find(b"\n\n")
    lines = head[:end].split(b"\n") if end >= 0 else head.split(b"\n")[:-1]  # the last: cut
    system = {}
    for line in lines:
        name, sep, value = line.decode("utf-8", "replace").partition(": ")
        if sep and name.lower().startswith(RESERVED_PREFIX):
            system[name[len(RESERVED_PREFIX) :]] = value
    return Envelope.from_system(system)
