"""The rows a read produces, and the columns a write accepts.

Read schema (batch and streaming alike):

    id            STRING     message id: publish time to the microsecond, unique, FIFO order
    body          BINARY     the message body, unchanged
    headers       MAP<STRING,STRING>  the publisher's headers (Content-Type, X-Attr-*, ...)
    content_type  STRING     the Content-Type header, if any
    published_at  TIMESTAMP  enqueue time (from the id)
    receive_count INT        how many times the message was leased, this delivery included
    state         STRING     ready | leased | delayed | dead (streaming rows: leased)
    group         STRING     the message group, if any
    priority      INT        its priority level (0 unless the queue has priority_levels)

Reads of the pub/sub retained log (`stream=retained`) produce `id`, `body`, `headers`,
`content_type` and `published_at` as above (publish time from the envelope), then

    seq           LONG       the entry's sequence number in the retained log (1, 2, 3...)
    channel       STRING     the channel it was published to
    subject       STRING     its subject ("" when none was given)

A read may declare fewer columns (`spark.read.format("dirmq").schema("id string, body
binary")`): any of the columns above, in any order, with the types above. Only those are built,
which saves the Python worker and the JVM the rest (the headers map most of all): a projection
Spark itself cannot push into a Python data source.

Rows leave as Arrow record batches built with the exact Arrow schema Spark derives from the
Spark schema, so Spark takes them without a per-row conversion.

Write columns: `body` (BINARY or STRING, required) and, optionally, `headers`
(MAP<STRING,STRING>), `content_type` (STRING), `delay_s` (a number of seconds), `group` and
`dedup_id` (STRING), `priority` (an integer: 0 to the queue's priority_levels - 1). Any other
column is refused, so a typo cannot silently drop data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from dirmq.errors import InvalidArgument
from dirmq.pubsub.transitions import Entry
from dirmq.store import Message, OutgoingMessage

READ_SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("body", BinaryType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("content_type", StringType()),
        StructField("published_at", TimestampType()),
        StructField("receive_count", IntegerType()),
        StructField("state", StringType()),
        StructField("group", StringType()),
        StructField("priority", IntegerType()),
    ]
)
ARROW_READ_SCHEMA: pa.Schema = to_arrow_schema(READ_SCHEMA, timezone="UTC")
RETAINED_SCHEMA = StructType(
    [
        *READ_SCHEMA.fields[:5],  # id, body, headers, content_type, published_at
        StructField("seq", LongType()),
        StructField("channel", StringType()),
        StructField("subject", StringType()),
    ]
)
ARROW_RETAINED_SCHEMA: pa.Schema = to_arrow_schema(RETAINED_SCHEMA, timezone="UTC")

_NUMBERS = (DoubleType, FloatType, IntegerType, LongType, ShortType, DecimalType)
WRITE_COLUMNS: dict[str, tuple[type[DataType], ...]] = {
    "body": (BinaryType, StringType),
    "headers": (MapType,),
    "content_type": (StringType,),
    "delay_s": _NUMBERS,
    "group": (StringType,),
    "dedup_id": (StringType,),
    "priority": (IntegerType, LongType, ShortType),
}


Columns = tuple[str, ...]
READ_COLUMNS: Columns = tuple(READ_SCHEMA.fieldNames())
RETAINED_COLUMNS: Columns = tuple(RETAINED_SCHEMA.fieldNames())


def read_columns(schema: StructType, ours: StructType = READ_SCHEMA) -> Columns:
    """The columns a user-given schema asks for: any of ours, each at most once, in any order,
    with our types, nullable. Anything else is refused: the source cannot make it."""
    types = {f.name: f.dataType for f in ours.fields}
    names = schema.fieldNames()
    if not names:
        raise InvalidArgument("a dirmq read needs at least one column")
    for field in schema.fields:
        expected = types.get(field.name)
        if expected is None:
            raise InvalidArgument(
                f"the dirmq source has no column {field.name!r}; its columns are "
                f"{', '.join(ours.fieldNames())} (declare a subset of them, or none)"
            )
        if field.dataType != expected:
            raise InvalidArgument(
                f"column {field.name!r} is {expected.simpleString()} in the dirmq source, "
                f"not {field.dataType.simpleString()}"
            )
        if not field.nullable:  # PySpark compares the Arrow schemas, nullability included
            raise InvalidArgument(
                f"column {field.name!r} is declared NOT NULL; the dirmq source's columns are "
                "nullable (declare it without NOT NULL)"
            )
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a column is declared twice in {', '.join(names)}")
    return tuple(names)


@cache
def arrow_schema(columns: Columns, full: pa.Schema = ARROW_READ_SCHEMA) -> pa.Schema:
    return pa.schema([full.field(name) for name in columns])


Builder = Callable[[Sequence[Message], str | None], pa.Array]
_MESSAGE_COLUMNS: dict[str, Builder] = {
    "id": lambda ms, _: pa.array([m.id for m in ms], pa.string()),
    "body": lambda ms, _: pa.array([m.body for m in ms], pa.binary()),
    "headers": lambda ms, _: pa.array(
        [list(m.headers.items()) for m in ms], ARROW_READ_SCHEMA.field("headers").type
    ),
    "content_type": lambda ms, _: pa.array([m.content_type for m in ms], pa.string()),
    "published_at": lambda ms, _: pa.array(
        [round(m.published_at_s * 1_000_000) for m in ms],
        ARROW_READ_SCHEMA.field("published_at").type,
    ),
    "receive_count": lambda ms, _: pa.array([m.receive_count for m in ms], pa.int32()),
    "state": lambda ms, state: pa.array([state or m.state for m in ms], pa.string()),
    "group": lambda ms, _: pa.array([m.group for m in ms], pa.string()),
    "priority": lambda ms, _: pa.array([m.priority for m in ms], pa.int32()),
}


def messages_batch(
    messages: Sequence[Message], state: str | None = None, columns: Columns = READ_COLUMNS
) -> pa.RecordBatch:
    """One Arrow record batch of `messages` with `columns` of the read schema (`state`
    overrides the messages' own)."""
    return pa.RecordBatch.from_arrays(
        [_MESSAGE_COLUMNS[name](messages, state) for name in columns],
        schema=arrow_schema(columns),
    )


def retained_batch(
    entries: Sequence[tuple[int, Entry]], columns: Columns = RETAINED_COLUMNS
) -> pa.RecordBatch:
    """One Arrow record batch of retained-log entries, (seq, entry) pairs, with `columns` of
    RETAINED_SCHEMA."""
    envelopes = [e.envelope for _, e in entries]
    headers = [e.headers for _, e in entries]
    build: dict[str, Callable[[], pa.Array]] = {
        "id": lambda: pa.array([env.id for env in envelopes], pa.string()),
        "body": lambda: pa.array([e.body for _, e in entries], pa.binary()),
        "headers": lambda: pa.array(
            [list(h.items()) for h in headers], ARROW_RETAINED_SCHEMA.field("headers").type
        ),
        "content_type": lambda: pa.array([_content_type(h) for h in headers], pa.string()),
        "published_at": lambda: pa.array(
            [env.published_us for env in envelopes],
            ARROW_RETAINED_SCHEMA.field("published_at").type,
        ),
        "seq": lambda: pa.array([seq for seq, _ in entries], pa.int64()),
        "channel": lambda: pa.array([env.channel for env in envelopes], pa.string()),
        "subject": lambda: pa.array([env.subject for env in envelopes], pa.string()),
    }
    return pa.RecordBatch.from_arrays(
        [build[name]() for name in columns], schema=arrow_schema(columns, ARROW_RETAINED_SCHEMA)
    )


def project(batch: pa.RecordBatch, columns: Columns) -> pa.RecordBatch:
    """`batch` (recorded with every column) cut down to `columns`, in their order."""
    return batch if tuple(batch.schema.names) == columns else batch.select(list(columns))


def _content_type(headers: Mapping[str, str]) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == "content-type"), None)


def check_write_schema(schema: StructType) -> None:
    """Refuse a DataFrame the writer cannot publish faithfully, before any task runs."""
    names = schema.fieldNames()
    if "body" not in names:
        raise InvalidArgument(
            "writing to dirmq needs a `body` column (BINARY or STRING); optional columns: "
            + ", ".join(n for n in WRITE_COLUMNS if n != "body")
        )
    for field in schema.fields:
        allowed = WRITE_COLUMNS.get(field.name)
        if allowed is None:
            raise InvalidArgument(
                f"column {field.name!r} cannot be written to dirmq; the columns are "
                f"{', '.join(WRITE_COLUMNS)} (select or rename before writing)"
            )
        if not isinstance(field.dataType, allowed):
            raise InvalidArgument(
                f"column {field.name!r} has type {field.dataType.simpleString()}; expected "
                + " or ".join(t.__name__.removesuffix("Type").lower() for t in allowed)
            )
        if isinstance(field.dataType, MapType) and not (
            isinstance(field.dataType.keyType, StringType)
            and isinstance(field.dataType.valueType, StringType)
        ):
            raise InvalidArgument("column 'headers' must be a MAP<STRING, STRING>")


def outgoing(table: pa.Table | pa.RecordBatch) -> list[OutgoingMessage]:
    """The messages of staged rows, in row order. A null body is refused (a message always has
    a body, possibly empty); null optional values mean "not given"."""
    columns: dict[str, list[Any]] = {
        name: table.column(name).to_pylist() for name in table.schema.names
    }
    count = table.num_rows
    bodies = columns["body"]
    headers = columns.get("headers") or [None] * count
    content_types = columns.get("content_type") or [None] * count
    delays = columns.get("delay_s") or [None] * count
    groups = columns.get("group") or [None] * count
    dedups = columns.get("dedup_id") or [None] * count
    priorities = columns.get("priority") or [None] * count
    result = []
    for i in range(count):
        body = bodies[i]
        if body is None:
            raise InvalidArgument(f"row {i} of a staged write has a null body")
        if isinstance(body, str):
            body = body.encode("utf-8")
        result.append(
            OutgoingMessage(
                body,
                _headers(headers[i], content_types[i]),
                None if delays[i] is None else float(delays[i]),
                dedups[i],
                groups[i],
                priority=priorities[i] or 0,
            )
        )
    return result


def _headers(
    pairs: Iterable[tuple[str, str]] | Mapping[str, str] | None, content_type: str | None
) -> dict[str, str]:
    result = dict(pairs.items() if isinstance(pairs, Mapping) else pairs or ())
    if content_type is not None:
        for name in [n for n in result if n.lower() == "content-type"]:
            del result[name]
        result["Content-Type"] = content_type
    return {k: v for k, v in result.items() if v is not None}
