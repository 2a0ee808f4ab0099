"""The options of the `dirmq` data source, parsed and checked once, where Spark hands them over.

Spark passes options as a case-insensitive mapping of strings. Every option has one meaning in
every mode it applies to; an option that makes no sense for the operation is ignored, a value
that is malformed is refused with `InvalidArgument` naming the option.

    path | url            where the queues are: a dirmq root on a filesystem every executor
                          mounts, or a `dirmq serve` URL (exactly one of the two)
    queue                 the queue name (required)
    consumer              streaming reads: the durable name of this reader (required)
    stateDir              where the Spark layer keeps its own files (batch ledgers, staging,
                          sink markers); default `<path>/@spark`; required for streaming reads
                          over `url`
    numPartitions         read parallelism (default: the driver's CPU count; streaming over
                          `url`: a partition per 25000 messages or 32 MiB, at most that)
    maxMessagesPerTrigger streaming reads: the default read limit per micro-batch
    maxMessagesPerBatch   streaming reads: a hard cap per micro-batch (default 200000 when
                          the read tasks lease by name through `path` on a local filesystem;
                          50000 on a network filesystem, where renewing leases is slow, and
                          when a batch's messages are held in memory: over `url`, or planned
                          as a count)
    leaseSeconds          streaming reads: lease length, kept alive while a batch runs (120)
    pollWaitSeconds       streaming reads over `url`: how long an idle poll waits (0.25)
    states                batch reads: which states to include (default ready,leased,delayed
                          through `path`; ready, the only choice, through `url`)
    createQueue           writes: create the queue if it is missing (default false)

Instead of `queue`, `stream=retained` reads the pub/sub retained log (the `future` messages,
by sequence number; see retained.py), batch or streaming, through `path` or `url`:

    stream                `retained` (the only stream so far)
    path | url            the root every executor mounts, or a `dirmq serve` URL (executors
                          then page through their ranges with `GET /@pubsub/retained`)
    channels / subjects   comma-separated prefixes, as in a pub/sub filter (empty: all)
    startingOffsets       earliest (default) | latest (streaming only) | a sequence number
                          (the first one to read) | {"seq": n}
    endingOffsets         batch reads: latest (default) | n (exclusive: reads up to n - 1)
    failOnDataLoss        fail when an entry of the range is missing or damaged (default
                          true); false: skip it with a warning
    numPartitions, maxMessagesPerTrigger   as above (the limit counts log entries)
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dirmq.errors import InvalidArgument
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.names import validate_queue_name

STATES = ("ready", "leased", "delayed", "dead")
DEFAULT_STATES = ("ready", "leased", "delayed")
# Messages per micro-batch. Each batch costs Spark ~0.25 s whatever its size, so batches that
# tasks stream a file at a time (path mode, planned by name) are large; a batch whose messages
# are held in memory until recorded (by the driver over `url`, by each task when planned as a
# count) stays smaller.
DEFAULT_MAX_BATCH = 200_000
DEFAULT_MAX_HELD_BATCH = 50_000
# Streaming over `url`, without `numPartitions`: a read partition per this many messages (or
# bytes of rows). Its task only decodes rows the driver leased and shipped inside it, so a task's
# fixed costs (a Python worker's round trip, one more output file downstream; on a cold executor
# its first parquet writes) outweigh splitting a smaller batch.
URL_PARTITION_MESSAGES = 25_000
URL_PARTITION_BYTES = 32 * 1024 * 1024
DEFAULT_LEASE_S = 120.0
DEFAULT_POLL_WAIT_S = 0.25
STATE_SUBDIR = "@spark"
_CONSUMER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RETAINED = "retained"
EARLIEST = "earliest"
LATEST = "latest"


def partitions_for(num_partitions: int | None, count: int) -> int:
    """How many read partitions `count` items get: `num_partitions`, or the CPU count, never
    more than one per 100 items (tiny batches are not worth splitting)."""
    wanted = num_partitions or os.cpu_count() or 1
    return max(1, min(wanted, math.ceil(count / 100)))


@dataclass(frozen=True, slots=True)
class Options:
    queue: str
    path: str | None = None
    url: str | None = None
    consumer: str | None = None
    state_dir: str | None = None
    num_partitions: int | None = None
    max_per_trigger: int | None = None
    max_per_batch: int | None = None  # None: `batch_cap` picks the default
    lease_s: float = DEFAULT_LEASE_S
    poll_wait_s: float = DEFAULT_POLL_WAIT_S
    states: tuple[str, ...] | None = None  # None: the mode's default (see snapshot.py)
    create_queue: bool = False

    @property
    def location(self) -> str:
        """The path or URL, for messages."""
        return self.path if self.path is not None else str(self.url)

    def partitions_for(self, count: int) -> int:
        return partitions_for(self.num_partitions, count)

    def rows_partitions_for(self, count: int, size: int) -> int:
        """Read partitions of a streaming batch of `count` rows (`size` bytes) leased by the
        driver (`url`): `numPartitions`, or else one per `URL_PARTITION_MESSAGES` rows or
        `URL_PARTITION_BYTES`, at most the CPU count."""
        if self.num_partitions is not None:
            return partitions_for(self.num_partitions, count)
        wanted = max(
            math.ceil(count / URL_PARTITION_MESSAGES), math.ceil(size / URL_PARTITION_BYTES)
        )
        return max(1, min(wanted, os.cpu_count() or 1))

    def batch_cap(self, *, held: bool) -> int:
        """The most messages one micro-batch may take: `maxMessagesPerBatch`, or the default
        for batches streamed by name on a local filesystem (`held` false, path mode) or for
        the others (held in memory, or with leases slow to renew)."""
        if self.max_per_batch is not None:
            return self.max_per_batch
        return DEFAULT_MAX_HELD_BATCH if held or self.path is None else DEFAULT_MAX_BATCH

    def state_root(self) -> str | None:
        """The Spark layer's own directory: `stateDir`, or `<path>/@spark` for a local root."""
        if self.state_dir is not None:
            return self.state_dir
        if self.path is not None:
            return os.path.join(self.path, STATE_SUBDIR)
        return None

    def consumer_dir(self) -> str:
        """The ledger directory of this streaming consumer (see `ledger.py`)."""
        root = self.state_root()
        if root is None:
            raise InvalidArgument(
                "a streaming read over `url` needs the `stateDir` option: a directory on the "
                "driver (or shared) where the consumer's batch ledger is kept across restarts"
            )
        if self.consumer is None:
            raise InvalidArgument(
                "a streaming read needs the `consumer` option: a durable name for this reader, "
                "unique per query (messages are leased and acknowledged under it)"
            )
        return os.path.join(root, "consumers", *self.queue.split("/"), "@" + self.consumer)

    def sink_dir(self) -> str | None:
        """Where streaming writes keep their per-query markers (None: no state directory)."""
        root = self.state_root()
        return None if root is None else os.path.join(root, "sinks", *self.queue.split("/"))

    def staging_dir(self) -> str | None:
        """Where writes stage rows until the job commits (None over `url`: rows travel in the
        commit messages instead)."""
        if self.path is None:
            return None
        root = self.state_root()
        assert root is not None
        return os.path.join(root, "staging")


@dataclass(frozen=True, slots=True)
class RetainedOptions:
    """The options of a read of the retained log (`stream=retained`)."""

    path: str | None = None  # exactly one of `path` and `url`
    url: str | None = None
    channels: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    starting: int | str = EARLIEST  # EARLIEST, LATEST or the first sequence number to read
    ending: int | str = LATEST  # LATEST or the sequence number to stop before (batch reads)
    fail_on_data_loss: bool = True
    num_partitions: int | None = None
    max_per_trigger: int | None = None

    @property
    def location(self) -> str:
        """The root or the server, for messages."""
        return self.path if self.path is not None else str(self.url)


def wants_retained(raw: Mapping[str, str]) -> bool:
    """Whether the options ask for the retained log (`stream`) rather than a queue."""
    return any(str(k).lower() == "stream" and str(v) for k, v in raw.items())


def parse_retained_options(raw: Mapping[str, str]) -> RetainedOptions:
    """Check the options of a retained-log read (keys in any case)."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    stream = options.get("stream", "").strip().lower()
    if stream != RETAINED:
        raise InvalidArgument(
            f"option stream: {options.get('stream')!r}; the only stream is `retained` (the "
            "pub/sub retained log); to read a queue, give `queue` instead"
        )
    if options.get("queue"):
        raise InvalidArgument("give either `queue` or `stream=retained`, not both")
    path = options.get("path") or None
    url = options.get("url") or None
    if (path is None) == (url is None):
        raise InvalidArgument(
            "reading the retained stream needs exactly one of the options `path` (the root, "
            "mounted by every executor) or `url` (a dirmq server)"
        )
    if url is not None and not url.startswith(("http://", "https://")):
        raise InvalidArgument(f"url {url!r} must start with http:// or https://")
    return RetainedOptions(
        path=os.path.abspath(path) if path is not None else None,
        url=url,
        channels=_prefixes(options.get("channels")),
        subjects=_prefixes(options.get("subjects")),
        starting=_offset_option(options, "startingoffsets", "startingOffsets", EARLIEST),
        ending=_offset_option(options, "endingoffsets", "endingOffsets", LATEST),
        fail_on_data_loss=_bool(options, "failondataloss", "failOnDataLoss", default=True),
        num_partitions=_int(options, "numpartitions", "numPartitions", None),
        max_per_trigger=_int(options, "maxmessagespertrigger", "maxMessagesPerTrigger", None),
    )


def _prefixes(text: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip() for p in (text or "").split(",") if p.strip()))


def _offset_option(options: dict[str, str], key: str, name: str, default: str) -> int | str:
    """`earliest`, `latest`, a sequence number, or Spark-style JSON `{"seq": n}`."""
    text = options.get(key, "").strip()
    if not text:
        return default
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    value: object = text
    if text.startswith("{"):
        try:
            value = json.loads(text).get("seq")
        except (ValueError, AttributeError):
            value = None
    try:
        seq = int(str(value))
    except ValueError:
        seq = 0
    if seq < 1:
        raise InvalidArgument(
            f"option {name}: {text!r}; expected earliest, latest, a sequence number (1 or "
            'more) or {"seq": n}'
        )
    return seq


def parse_options(raw: Mapping[str, str]) -> Options:
    """Check Spark's option mapping (keys in any case) and return the parsed `Options`."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    path = options.get("path") or None
    url = options.get("url") or None
    if (path is None) == (url is None):
        raise InvalidArgument(
            "give exactly one of the options `path` (a dirmq root reached through the "
            "filesystem) or `url` (a dirmq server)"
        )
    queue = options.get("queue")
    if not queue:
        raise InvalidArgument("the option `queue` (the queue name) is required")
    validate_queue_name(queue)
    consumer = options.get("consumer") or None
    if consumer is not None and not _CONSUMER_RE.fullmatch(consumer):
        raise InvalidArgument(
            f"consumer {consumer!r}: use 1-128 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    if url is not None and not url.startswith(("http://", "https://")):
        raise InvalidArgument(f"url {url!r} must start with http:// or https://")
    return Options(
        queue=queue,
        path=os.path.abspath(path) if path is not None else None,
        url=url,
        consumer=consumer,
        state_dir=os.path.abspath(options["statedir"]) if options.get("statedir") else None,
        num_partitions=_int(options, "numpartitions", "numPartitions", None),
        max_per_trigger=_int(options, "maxmessagespertrigger", "maxMessagesPerTrigger", None),
        max_per_batch=_int(options, "maxmessagesperbatch", "maxMessagesPerBatch", None),
        lease_s=_seconds(options, "leaseseconds", "leaseSeconds", DEFAULT_LEASE_S),
        poll_wait_s=_seconds(options, "pollwaitseconds", "pollWaitSeconds", DEFAULT_POLL_WAIT_S),
        states=_states(options.get("states")),
        create_queue=_bool(options, "createqueue", "createQueue"),
    )


def _int(options: dict[str, str], key: str, name: str, default: int | None) -> int | None:
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(f"option {name} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise InvalidArgument(f"option {name} must be a positive integer, got {text!r}")
    return value


def _seconds(options: dict[str, str], key: str, name: str, default: float) -> float:
    text = options.get(key)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_DURATION_S:  # refused here, before a query starts (NaN too)
        raise InvalidArgument(
            f"option {name} must be a positive number of seconds, at most {MAX_DURATION_S:.0f}"
            f" (a year), got {text!r}"
        )
    return value


def _bool(options: dict[str, str], key: str, name: str, default: bool = False) -> bool:
    text = (options.get(key) or str(default)).strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgument(f"option {name} must be true or false, got {text!r}")
    return text == "true"


def _states(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    if text.strip().lower() == "all":
        return STATES
    chosen = tuple(dict.fromkeys(s.strip().lower() for s in text.split(",") if s.strip()))
    unknown = [s for s in chosen if s not in STATES]
    if unknown or not chosen:
        raise InvalidArgument(
            f"option states: {text!r}; choose from {', '.join(STATES)} (comma-separated) or all"
        )
    return chosen
