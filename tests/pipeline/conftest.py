"""One SparkSession for every pipeline test (local[2], no UI, few shuffle partitions)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from floodwall_pipeline.analyze import spark_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = spark_session("local[2]", app="floodwall-tests", shuffle_partitions=2,
                            jvm_log=log)
    yield session
    session.stop()


def write_ndjson(path: Path, records: Sequence[dict[str, object] | str]) -> Path:
    """Records as NDJSON lines (a str is written as it is: for bad lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path
