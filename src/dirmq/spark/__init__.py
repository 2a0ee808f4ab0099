"""The PySpark data source for dirmq queues (needs the `spark` extra: pyspark 4.x and pyarrow).

    from dirmq.spark import DirmqDataSource
    spark.dataSource.register(DirmqDataSource)   # format name: "dirmq"

Batch reads are snapshots that consume nothing; streaming reads lease messages to a named
consumer and acknowledge them once Spark has committed each micro-batch; writes publish a job's
(or a micro-batch's) rows only when it commits. With `stream=retained` it reads the pub/sub
retained log instead, batch or streaming, by sequence number. See docs/spark.md.
"""

from dirmq.spark.source import DirmqDataSource

__all__ = ["DirmqDataSource"]
