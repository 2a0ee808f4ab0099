"""`DirmqDataSource`: the PySpark data source named "dirmq".

    spark.dataSource.register(DirmqDataSource)
    df = spark.read.format("dirmq").option("path", root).option("queue", "events").load()
    df.write.format("dirmq").option("path", root).option("queue", "out").mode("append").save()
    stream = (spark.readStream.format("dirmq").option("path", root).option("queue", "events")
              .option("consumer", "etl").load())
    retained = (spark.readStream.format("dirmq").option("path", root)
                .option("stream", "retained").option("channels", "orders").load())

Spark creates the data source from its options in every process that needs it (driver,
planners, executors); each method below only builds the reader or writer for one operation.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from dirmq.errors import InvalidArgument
from dirmq.spark.options import (
    Options,
    RetainedOptions,
    parse_options,
    parse_retained_options,
    wants_retained,
)
from dirmq.spark.rows import READ_SCHEMA, RETAINED_SCHEMA, read_columns


class DirmqDataSource(DataSource):
    """Read (batch snapshot, streaming work queue) and write (batch, streaming) dirmq queues;
    read (batch, streaming) the pub/sub retained log with `stream=retained`."""

    @classmethod
    def name(cls) -> str:
        return "dirmq"

    def _options(self) -> Options:
        if wants_retained(self.options):
            raise InvalidArgument(
                "the retained log cannot be written through Spark: it holds what is published "
                "with mode `future` (dirmq.pubsub); write to a `queue` instead"
            )
        return parse_options(self.options)

    def _retained(self) -> RetainedOptions | None:
        return parse_retained_options(self.options) if wants_retained(self.options) else None

    def schema(self) -> StructType:
        # Parsing here reports a bad option at load(), before any reader exists.
        return READ_SCHEMA if self._retained() is None else RETAINED_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        retained = self._retained()
        if retained is not None:
            from dirmq.spark.retained import DirmqRetainedReader

            return DirmqRetainedReader(retained, read_columns(schema, RETAINED_SCHEMA))
        from dirmq.spark.snapshot import DirmqSnapshotReader

        return DirmqSnapshotReader(self._options(), read_columns(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        retained = self._retained()
        if retained is not None:
            from dirmq.spark.retained import DirmqRetainedStreamReader

            return DirmqRetainedStreamReader(retained, read_columns(schema, RETAINED_SCHEMA))
        from dirmq.spark.stream import DirmqStreamReader

        return DirmqStreamReader(self._options(), read_columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from dirmq.spark.writing import DirmqBatchWriter

        _refuse_overwrite(overwrite)
        return DirmqBatchWriter(self._options(), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        from dirmq.spark.writing import DirmqStreamWriter

        _refuse_overwrite(overwrite)
        return DirmqStreamWriter(self._options(), schema)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise InvalidArgument(
            "a dirmq queue can only be appended to: use mode('append') (overwrite would have "
            "to delete messages other consumers may hold)"
        )
