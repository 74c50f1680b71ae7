"""Reading telemetry: explicit schema, PERMISSIVE mode, and an account of every bad line."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from floodwall_pipeline.schema import CORRUPT, SUPPORTED_VERSIONS, TELEMETRY_SCHEMA

#: Files read under a directory: the writer's ``*.ndjson``, and ``*.ndjson.gz`` when an
#: operator compressed old ones (Spark decompresses by extension).
FILE_GLOB = "*.ndjson*"
EXAMPLES = 5


@dataclass(frozen=True)
class InputQuality:
    """What was read and what was left out, and why (shown in the report)."""

    lines: int
    corrupt: int  # not JSON, truncated, or a value of the wrong type
    unsupported_version: int  # well-formed, but a schema version this reader does not know
    incomplete: int  # well-formed, but without a field every record must have
    used: int
    files: int
    examples: list[tuple[str, str]] = field(default_factory=list)  # (file, line) of bad lines

    @property
    def bad(self) -> int:
        return self.corrupt + self.unsupported_version + self.incomplete


@dataclass
class Telemetry:
    """The valid records, split by type, and the input account."""

    samples: DataFrame
    sidecars: DataFrame
    events: DataFrame
    quality: InputQuality
    raw: DataFrame  # the parsed lines, cached: ``unpersist()`` when done

    def unpersist(self) -> None:
        self.raw.unpersist()


def read_raw(spark: SparkSession, paths: list[str]) -> DataFrame:
    """Every line of ``paths`` (files or directories, local or any Hadoop file system such as
    ``s3a://``), parsed with the explicit schema; bad lines keep their text in ``_corrupt_record``.
    """
    return (spark.read.schema(TELEMETRY_SCHEMA)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", FILE_GLOB)
            .json(paths)
            .withColumn("_file", F.input_file_name()))


def load(spark: SparkSession, paths: list[str]) -> Telemetry:
    raw = read_raw(spark, paths).persist(StorageLevel.MEMORY_AND_DISK)
    required = ["type", "ts", "sidecar", "vhost", "queue"]
    has_required = F.lit(True)
    for name in required:
        has_required = has_required & F.col(name).isNotNull()
    known_type = F.col("type").isin("sample", "sidecar", "event")
    sample_ok = (F.col("type") != "sample") | F.col("interval").isNotNull()
    status = (F.when(F.col(CORRUPT).isNotNull(), "corrupt")
              .when(F.col("v").isNull() | ~F.col("v").isin(*SUPPORTED_VERSIONS),
                    "unsupported_version")
              .when(~(has_required & known_type & sample_ok), "incomplete")
              .otherwise("ok"))
    tagged = raw.withColumn("_status", status)
    by_file = (tagged.groupBy("_status", "_file").agg(F.count(F.lit(1)).alias("n")).collect())
    counts: dict[str, int] = {}
    for r in by_file:
        counts[r["_status"]] = counts.get(r["_status"], 0) + int(r["n"])
    files = len({r["_file"] for r in by_file})
    examples: list[tuple[str, str]] = []
    if any(k != "ok" for k in counts):
        bad_rows = (tagged.filter(F.col("_status") != "ok")
                    .select("_file", F.coalesce(F.col(CORRUPT),
                                                F.to_json(F.struct("v", *required))).alias("line"))
                    .limit(EXAMPLES).collect())
        examples = [(str(r["_file"]).rsplit("/", 1)[-1], str(r["line"])[:200].rstrip("\n"))
                    for r in bad_rows]
    quality = InputQuality(
        lines=sum(counts.values()), corrupt=counts.get("corrupt", 0),
        unsupported_version=counts.get("unsupported_version", 0),
        incomplete=counts.get("incomplete", 0), used=counts.get("ok", 0), files=files,
        examples=examples)
    # The parsed lines stay cached (``raw``); the three types are filters over them.
    ok = tagged.filter(F.col("_status") == "ok").drop(CORRUPT, "_status", "_file")
    samples = (ok.filter(F.col("type") == "sample")
               .withColumn("depth", F.coalesce("depth_bytes", "broker_depth_bytes"))
               .withColumn("depth_msgs", F.coalesce("depth_messages", "broker_depth_messages")))
    sidecars = ok.filter(F.col("type") == "sidecar")
    events = ok.filter(F.col("type") == "event")
    return Telemetry(samples, sidecars, events, quality, raw)
