"""Spark fixtures: one local[2] SparkSession for the whole test session (starting one costs
seconds), with the dirmq data source registered. Test modules import the fixtures from here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_session: Any = None


def spark_session() -> Any:
    """The test session's SparkSession, created on first use."""
    global _session
    if _session is None:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        from pyspark.sql import SparkSession

        from dirmq.spark import DirmqDataSource

        _session = (
            SparkSession.builder.master("local[2]")
            .appName("dirmq-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate()
        )
        _session.sparkContext.setLogLevel("ERROR")
        _session.dataSource.register(DirmqDataSource)
    return _session


@pytest.fixture(scope="session", name="spark")
def spark_fixture() -> Iterator[Any]:
    session = spark_session()
    yield session
    global _session
    session.stop()
    _session = None


def run_available_now(df: Any, out: Path, checkpoint: Path) -> Any:
    """Run the streaming `df` into parquet at `out` with Trigger.AvailableNow; the finished
    query."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query
