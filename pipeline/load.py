"""Reading telemetry: which files, the read schema, PERMISSIVE mode, an account of every bad line.

One pass over the files parses each line once into a narrow typed table, kept for the
aggregations (a local checkpoint): times in integer milliseconds (``ts_ms``, ``iv_ms``), so
that every sum the job makes is exact and the same whatever the partitioning
(docs/pipeline.md, "Deterministic"), and the 64-bit ids the samples are grouped by. A
second pass counts each ``Kind`` of line and keeps the lines other than samples apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from floodwall_pipeline.aggregate import keep, release
from floodwall_pipeline.files import TimeRange, list_files, select
from floodwall_pipeline.schema import CORRUPT, READ_SCHEMA, SUPPORTED_VERSIONS

#: Files read under a directory: the writer's ``*.ndjson``, and ``*.ndjson.gz`` when an
#: operator compressed old ones (Spark decompresses by extension).
FILE_GLOB = "*.ndjson*"
EXAMPLES = 5
REQUIRED = ("type", "ts", "sidecar", "vhost", "queue")


class Kind(enum.IntEnum):
    """What a line of the kept table is: a record used (its type), or why it is left out.
    One int, not the type and status as strings: every later pass filters on it."""

    SAMPLE = 0
    SIDECAR = 1
    EVENT = 2
    OUTSIDE = 3  # well-formed, outside --since/--until (counted apart, not bad)
    CORRUPT = 4  # from here on: bad lines, their file and text kept
    UNSUPPORTED_VERSION = 5
    INCOMPLETE = 6


#: The columns of the cached table, per record type (null where a type has no such field).
SAMPLE_COLUMNS = (
    "sq", "q", "sidecar", "vhost", "queue", "ts_ms", "seq", "iv_ms", "policy", "capacity", "resume",
    "max_messages", "resume_messages", "overflow", "deadline", "mode", "depth", "depth_msgs",
    "ingress_bytes", "ingress_messages", "tripped", "trips", "blocked_publishers",
    "held_bytes", "held_messages", "spooled_bytes", "drain_bps", "fleet_members",
    "fleet_share", "fleet_demand_bps")
SIDECAR_COLUMNS = (
    "sidecar", "ts_ms", "iv_ms", "held_bytes", "held_messages", "blocked_channels",
    "spooled_bytes", "alarm", "dropped_records")
EVENT_COLUMNS = ("sidecar", "vhost", "queue", "ts_ms", "event", "mode")
#: The columns kept apart for the lines that are not samples.
REST_COLUMNS = tuple(dict.fromkeys(("kind", *SIDECAR_COLUMNS, *EVENT_COLUMNS, "_file", "_line")))


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
    outside: int = 0  # well-formed records outside --since/--until (not counted in ``used``)

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
    files: list[str]  # the files read
    kept: list[DataFrame]  # the parsed lines, and those other than samples: ``unpersist()``
    interval: float = 0.0  # the longest telemetry interval of any sidecar (its records)

    def unpersist(self) -> None:
        """Drop the kept lines now, rather than when the JVM collects them."""
        for df in self.kept:
            release(df)


def _k(kind: Kind) -> Column:
    return F.lit(int(kind))


def _ms(c: Column) -> Column:
    """Seconds (the telemetry's ms-precision floats) as integer milliseconds, rounded half
    up (``floor(x + 0.5)``: Spark's ``round`` goes through BigDecimal, ten times slower)."""
    return F.floor(c * F.lit(1000.0) + F.lit(0.5)).cast("long")


def _shuffle_partitions(spark: SparkSession) -> int:
    return int(spark.conf.get("spark.sql.shuffle.partitions") or 0)


def read_raw(spark: SparkSession, paths: list[str]) -> DataFrame:
    """Every line of ``paths`` (files or directories, local or any Hadoop file system such as
    ``s3a://``), parsed with the read schema; bad lines keep their text in ``_corrupt_record``.
    """
    return (spark.read.schema(READ_SCHEMA)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", FILE_GLOB)
            .json(paths))


def resolve(spark: SparkSession, paths: list[str], rng: TimeRange) -> list[str]:
    """The paths to hand Spark: as given for an open range; else the files that can hold
    records in it (pipeline/files.py), listed only in the date partitions it needs."""
    if not rng.bounded:
        return list(paths)
    return select(list_files(spark, paths, rng.dates()), rng)


def load(spark: SparkSession, paths: list[str], rng: TimeRange | None = None) -> Telemetry:
    rng = rng or TimeRange()
    files = resolve(spark, paths, rng)
    if not files:
        raise FileNotFoundError(f"no telemetry files for {rng.describe()} in "
                                f"{', '.join(paths)}")
    raw = read_raw(spark, files)
    read = sorted(raw.inputFiles())
    has_required = F.lit(True)
    for name in REQUIRED:
        has_required = has_required & F.col(name).isNotNull()
    known_type = F.col("type").isin("sample", "sidecar", "event")
    sample_ok = (F.col("type") != "sample") | F.col("interval").isNotNull()
    ts_ms = _ms(F.col("ts"))
    inside = F.lit(True)
    if rng.since is not None:
        inside = inside & (ts_ms >= F.lit(round(rng.since * 1000)))
    if rng.until is not None:
        inside = inside & (ts_ms < F.lit(round(rng.until * 1000)))
    kind = (F.when(F.col(CORRUPT).isNotNull(), _k(Kind.CORRUPT))
            .when(F.col("v").isNull() | ~F.col("v").isin(*SUPPORTED_VERSIONS),
                  _k(Kind.UNSUPPORTED_VERSION))
            .when(~(has_required & known_type & sample_ok), _k(Kind.INCOMPLETE))
            .when(~inside, _k(Kind.OUTSIDE))
            .when(F.col("type") == "sample", _k(Kind.SAMPLE))
            .when(F.col("type") == "sidecar", _k(Kind.SIDECAR))
            .otherwise(_k(Kind.EVENT)))
    bad = F.col("kind") >= _k(Kind.CORRUPT)
    is_sample = F.col("kind") == _k(Kind.SAMPLE)
    line = F.coalesce(F.col(CORRUPT), F.to_json(F.struct("v", *REQUIRED)))
    table = (raw.withColumn("kind", kind)
             .select(
                 "kind", "sidecar", "vhost", "queue", ts_ms.alias("ts_ms"), "seq",
                 # 64-bit ids of (sidecar, vhost, queue) and (vhost, queue): the samples
                 # are grouped and sorted by these longs, not by three strings
                 F.when(is_sample, F.xxhash64("sidecar", "vhost", "queue")).alias("sq"),
                 F.when(is_sample, F.xxhash64("vhost", "queue")).alias("q"),
                 _ms(F.col("interval")).alias("iv_ms"), "policy", "capacity", "resume",
                 "max_messages", "resume_messages", "overflow", "deadline", "mode",
                 F.coalesce("depth_bytes", "broker_depth_bytes").alias("depth"),
                 F.coalesce("depth_messages", "broker_depth_messages").alias("depth_msgs"),
                 "ingress_bytes", "ingress_messages", "tripped", "trips",
                 "blocked_publishers", "held_bytes", "held_messages", "spooled_bytes",
                 F.col("drain_bytes_per_second").alias("drain_bps"), "fleet_members",
                 F.col("fleet_share_bytes").alias("fleet_share"),
                 F.col("fleet_demand_bytes_per_s").alias("fleet_demand_bps"), "blocked_channels",
                 "alarm", "dropped_records", "event",
                 F.when(bad, F.input_file_name()).alias("_file"),
                 F.when(bad, line).alias("_line"))
             # Parsed once, kept as rows for the job (Spark's columnar cache measured the
             # same here, 27 CPU seconds a job either way on the bench's input).
             .localCheckpoint(eager=True))
    # One pass over the kept lines counts every kind (an observation of the pass: no job of
    # its own) and keeps the lines other than samples (about a fifth) apart, so that the
    # passes over sidecar records, events and bad lines read them, not every sample again.
    seen = Observation()
    rest = keep(table.observe(
        seen, *[F.count(F.when(F.col("kind") == _k(k), 1)).alias(k.name) for k in Kind],
        F.max(F.when(F.col("kind") == _k(Kind.SIDECAR), F.col("iv_ms"))).alias("iv"))
        .filter(F.col("kind") != _k(Kind.SAMPLE)).select(*REST_COLUMNS), eager=True)
    got = seen.get
    counts = {k: int(got[k.name]) for k in Kind}
    examples: list[tuple[str, str]] = []
    if any(counts[k] for k in Kind if k >= Kind.CORRUPT):
        rows = (rest.filter(F.col("_file").isNotNull()).select("_file", "_line")
                .orderBy("_file", "_line").limit(EXAMPLES).collect())
        examples = [(str(r["_file"]).rsplit("/", 1)[-1], str(r["_line"])[:200].rstrip("\n"))
                    for r in rows]
    quality = InputQuality(
        lines=sum(counts.values()), corrupt=counts[Kind.CORRUPT],
        unsupported_version=counts[Kind.UNSUPPORTED_VERSION], incomplete=counts[Kind.INCOMPLETE],
        used=counts[Kind.SAMPLE] + counts[Kind.SIDECAR] + counts[Kind.EVENT],
        files=len(read), examples=examples, outside=counts[Kind.OUTSIDE])

    # With one shuffle partition (``local[1]``, a one-core worker) every later pass reads
    # the kept lines as one partition: its aggregations and its one sort then need no
    # exchange (a single partition is already grouped by any key), and a job fewer stages.
    # With more, as kept: the work divides.
    single = _shuffle_partitions(spark) == 1

    def of(df: DataFrame, kind: Kind) -> DataFrame:
        return (df.coalesce(1) if single else df).filter(F.col("kind") == _k(kind))

    samples = of(table, Kind.SAMPLE).select(*SAMPLE_COLUMNS)
    sidecars = of(rest, Kind.SIDECAR).select(*SIDECAR_COLUMNS)
    events = of(rest, Kind.EVENT).select(*EVENT_COLUMNS)
    return Telemetry(samples, sidecars, events, quality, read, [table, rest],
                     int(got["iv"] or 0) / 1000.0)
