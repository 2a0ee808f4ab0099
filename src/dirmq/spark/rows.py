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

Reads of the pub/sub retained log (`stream=retained`) produce `id`, `body`, `headers`,
`content_type` and `published_at` as above (publish time from the envelope), then

    seq           LONG       the entry's sequence number in the retained log (1, 2, 3...)
    channel       STRING     the channel it was published to
    subject       STRING     its subject ("" when none was given)

Rows leave as Arrow record batches built with the exact Arrow schema Spark derives from the
Spark schema, so Spark takes them without a per-row conversion.

Write columns: `body` (BINARY or STRING, required) and, optionally, `headers`
(MAP<STRING,STRING>), `content_type` (STRING), `delay_s` (a number of seconds), `group` and
`dedup_id` (STRING). Any other column is refused, so a typo cannot silently drop data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
}


def check_read_schema(schema: StructType, ours: StructType = READ_SCHEMA) -> None:
    """Refuse a user-given schema other than ours (the source cannot produce other columns)."""
    if schema.fieldNames() != ours.fieldNames():
        raise InvalidArgument(
            f"the dirmq source produces the columns {', '.join(ours.fieldNames())}; "
            f"got a schema with {', '.join(schema.fieldNames())} (select columns after load())"
        )


def messages_batch(messages: Sequence[Message], state: str | None = None) -> pa.RecordBatch:
    """One Arrow record batch of `messages` in the read schema (`state` overrides theirs)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.id for m in messages], pa.string()),
            pa.array([m.body for m in messages], pa.binary()),
            pa.array([list(m.headers.items()) for m in messages], ARROW_READ_SCHEMA[2].type),
            pa.array([m.content_type for m in messages], pa.string()),
            pa.array(
                [round(m.published_at_s * 1_000_000) for m in messages],
                ARROW_READ_SCHEMA[4].type,
            ),
            pa.array([m.receive_count for m in messages], pa.int32()),
            pa.array([state or m.state for m in messages], pa.string()),
            pa.array([m.group for m in messages], pa.string()),
        ],
        schema=ARROW_READ_SCHEMA,
    )


def retained_batch(entries: Sequence[tuple[int, Entry]]) -> pa.RecordBatch:
    """One Arrow record batch of retained-log entries, (seq, entry) pairs, in RETAINED_SCHEMA."""
    envelopes = [e.envelope for _, e in entries]
    headers = [e.headers for _, e in entries]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([env.id for env in envelopes], pa.string()),
            pa.array([e.body for _, e in entries], pa.binary()),
            pa.array([list(h.items()) for h in headers], ARROW_RETAINED_SCHEMA[2].type),
            pa.array([_content_type(h) for h in headers], pa.string()),
            pa.array([env.published_us for env in envelopes], ARROW_RETAINED_SCHEMA[4].type),
            pa.array([seq for seq, _ in entries], pa.int64()),
            pa.array([env.channel for env in envelopes], pa.string()),
            pa.array([env.subject for env in envelopes], pa.string()),
        ],
        schema=ARROW_RETAINED_SCHEMA,
    )


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
