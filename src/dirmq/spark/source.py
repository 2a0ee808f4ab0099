"""`DirmqDataSource`: the PySpark data source named "dirmq".

    spark.dataSource.register(DirmqDataSource)
    df = spark.read.format("dirmq").option("path", root).option("queue", "events").load()
    df.write.format("dirmq").option("path", root).option("queue", "out").mode("append").save()
    stream = (spark.readStream.format("dirmq").option("path", root).option("queue", "events")
              .option("consumer", "etl").load())

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
from dirmq.spark.options import Options, parse_options
from dirmq.spark.rows import READ_SCHEMA, check_read_schema


class DirmqDataSource(DataSource):
    """Read (batch snapshot, streaming work queue) and write (batch, streaming) dirmq queues."""

    @classmethod
    def name(cls) -> str:
        return "dirmq"

    def _options(self) -> Options:
        return parse_options(self.options)

    def schema(self) -> StructType:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from dirmq.spark.snapshot import DirmqSnapshotReader

        check_read_schema(schema)
        return DirmqSnapshotReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        from dirmq.spark.stream import DirmqStreamReader

        check_read_schema(schema)
        return DirmqStreamReader(self._options())

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
