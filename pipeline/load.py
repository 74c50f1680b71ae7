"""Reading telemetry: which files, the read schema, PERMISSIVE mode, an account of every bad line.

One pass over the files parses each line once into a narrow typed table, kept for the
aggregations (a local checkpoint): times in integer milliseconds (``ts_ms``, ``iv_ms``), so
that every sum the job makes is exact and the same whatever the partitioning
(docs/pipeline.md, "Deterministic"), and the 64-bit ids the samples are grouped by. The
same job counts each ``Kind`` of line and keeps the lines other than samples apart.

That pass is strict first (``load``): Spark's FAILFAST mode, without the corrupt-record
column, which fails on the first line that PERMISSIVE mode would set aside as malformed and
spares every other line Spark's copy into the corrupt-record layout (0.5 s of the 4.7 s
read of the benchmark's hour, git log -p -- bench/RESULTS.md). Only telemetry with a
malformed line is read a second time, in PERMISSIVE mode, to count and show each one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from floodwall.ops.telemetry import ZERO_WHEN_ABSENT
from floodwall_pipeline.aggregate import keep, release, sql
from floodwall_pipeline.files import TimeRange, list_files, select
from floodwall_pipeline.schema import CORRUPT, READ_SCHEMA, STRICT_SCHEMA, SUPPORTED_VERSIONS

#: Files read under a directory: the writer's ``*.ndjson``, and ``*.ndjson.gz`` when an
#: operator compressed old ones (Spark decompresses by extension).
FILE_GLOB = "*.ndjson*"
EXAMPLES = 5
REQUIRED = ("type", "ts", "sidecar", "vhost", "queue")
#: The error condition of Spark's FAILFAST reader on a malformed line (Spark 3.4 on).
MALFORMED = "MALFORMED_RECORD_IN_PARSING"


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
    reads: int = 1  # 2: a malformed line failed the strict read (``load``)

    def unpersist(self) -> None:
        """Drop the kept lines now, rather than when the JVM collects them."""
        for df in self.kept:
            release(df)


def _k(kind: Kind) -> Column:
    return F.lit(int(kind))


def _ms(c: str) -> str:
    """Seconds (the telemetry's ms-precision floats) as integer milliseconds, rounded half
    up (``floor(x + 0.5)``: Spark's ``round`` goes through BigDecimal, ten times slower)."""
    return f"CAST(floor({c} * 1000.0D + 0.5D) AS BIGINT)"


def _z(c: str) -> str:
    """A field of ``ZERO_WHEN_ABSENT`` as SQL: 0 (``tripped``: false) where a line leaves it
    out (version 3). Versions 1 and 2 write every one of them on the records that carry
    them, so the same records read the same from any version."""
    if c not in ZERO_WHEN_ABSENT:
        raise ValueError(f"{c} is not a field that version 3 leaves out when 0")
    zero = "false" if READ_SCHEMA[c].dataType == BooleanType() else "0"
    return f"coalesce(`{c}`, {zero}) AS `{c}`"


def _shuffle_partitions(spark: SparkSession) -> int:
    return int(spark.conf.get("spark.sql.shuffle.partitions") or 0)


def read_raw(spark: SparkSession, paths: list[str], *, strict: bool = False) -> DataFrame:
    """Every line of ``paths`` (files or directories, local or any Hadoop file system such as
    ``s3a://``), parsed with the read schema; bad lines keep their text in ``_corrupt_record``.
    ``strict``: without that column, and a job that reads a malformed line fails
    (``malformed`` says so).
    """
    reader = (spark.read.schema(STRICT_SCHEMA).option("mode", "FAILFAST") if strict else
              spark.read.schema(READ_SCHEMA).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT))
    return (reader
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", FILE_GLOB)
            .json(paths))


def resolve(spark: SparkSession, paths: list[str], rng: TimeRange) -> list[str]:
    """The paths to hand Spark: as given for an open range; else the files that can hold
    records in it (pipeline/files.py), listed only in the date partitions it needs."""
    if not rng.bounded:
        return list(paths)
    return select(list_files(spark, paths, rng.dates()), rng)


def malformed(exc: BaseException) -> bool:
    """Whether ``exc`` (a job's error, as py4j raised it) is a strict read's malformed line:
    Spark's error condition, found in the JVM exception's chain of causes."""
    java = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    for _ in range(16):  # a cause chain is a few deep; a cycle must not hang the job
        if java is None:
            return False
        for getter in ("getCondition", "getErrorClass"):  # Spark 4, then 3.x
            try:
                condition = getattr(java, getter)()
            except Exception:  # not a SparkThrowable (Jackson's, the JDK's), or older
                continue
            if condition and str(condition).startswith(MALFORMED):
                return True
            break
        java = java.getCause()
    return False


def load(spark: SparkSession, paths: list[str], rng: TimeRange | None = None) -> Telemetry:
    """The telemetry of ``paths`` in ``rng``: strict first, and read again with an account of
    each bad line only when a line is malformed (the module's docstring). The same lines give
    the same tables and counts either way (tests/pipeline/test_load.py)."""
    rng = rng or TimeRange()
    files = resolve(spark, paths, rng)
    if not files:
        raise FileNotFoundError(f"no telemetry files for {rng.describe()} in "
                                f"{', '.join(paths)}")
    try:
        return _load(spark, files, rng, strict=True)
    except Exception as exc:
        if not malformed(exc):
            raise
    return replace(_load(spark, files, rng, strict=False), reads=2)


def _load(spark: SparkSession, files: list[str], rng: TimeRange, *, strict: bool) -> Telemetry:
    raw = read_raw(spark, files, strict=strict)
    read = sorted(raw.inputFiles())
    # The plan as SQL text: one py4j call, where Column functions cost three round trips
    # each (pipeline/aggregate.py, ``sql``).
    has_required = " AND ".join(f"`{name}` IS NOT NULL" for name in REQUIRED)
    sample_ok = "(`type` != 'sample' OR `interval` IS NOT NULL)"
    ts_ms = _ms("ts")
    bounds = []
    if rng.since is not None:
        bounds.append(f"{ts_ms} >= {round(rng.since * 1000)}")
    if rng.until is not None:
        bounds.append(f"{ts_ms} < {round(rng.until * 1000)}")
    inside = " AND ".join(bounds) or "true"
    versions = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
    # strict: a malformed line fails the job, so none is left to mark
    corrupt = "false" if strict else f"{CORRUPT} IS NOT NULL"
    kind = f"""CASE WHEN {corrupt} THEN {int(Kind.CORRUPT)}
        WHEN v IS NULL OR NOT v IN ({versions}) THEN {int(Kind.UNSUPPORTED_VERSION)}
        WHEN NOT ({has_required} AND `type` IN ('sample', 'sidecar', 'event') AND {sample_ok})
          THEN {int(Kind.INCOMPLETE)}
        WHEN NOT ({inside}) THEN {int(Kind.OUTSIDE)}
        WHEN `type` = 'sample' THEN {int(Kind.SAMPLE)}
        WHEN `type` = 'sidecar' THEN {int(Kind.SIDECAR)}
        ELSE {int(Kind.EVENT)} END"""
    bad, is_sample = f"kind >= {int(Kind.CORRUPT)}", f"kind = {int(Kind.SAMPLE)}"
    line = f"to_json(struct(v, {', '.join(f'`{c}`' for c in REQUIRED)}))"
    if not strict:
        line = f"coalesce({CORRUPT}, {line})"
    table = (sql(f"""
        SELECT kind, sidecar, vhost, queue, {ts_ms} AS ts_ms, seq,
               -- 64-bit ids of (sidecar, vhost, queue) and (vhost, queue): the samples are
               -- grouped and sorted by these longs, not by three strings
               CASE WHEN {is_sample} THEN xxhash64(sidecar, vhost, queue) END AS sq,
               CASE WHEN {is_sample} THEN xxhash64(vhost, queue) END AS q,
               {_ms("`interval`")} AS iv_ms, policy, capacity, resume, {_z("max_messages")},
               {_z("resume_messages")}, overflow, deadline, mode,
               coalesce(depth_bytes, broker_depth_bytes) AS depth,
               coalesce(depth_messages, broker_depth_messages) AS depth_msgs,
               {_z("ingress_bytes")}, {_z("ingress_messages")}, {_z("tripped")},
               {_z("trips")}, {_z("blocked_publishers")}, {_z("held_bytes")},
               {_z("held_messages")}, {_z("spooled_bytes")},
               drain_bytes_per_second AS drain_bps,
               fleet_members, fleet_share_bytes AS fleet_share,
               fleet_demand_bytes_per_s AS fleet_demand_bps, {_z("blocked_channels")}, alarm,
               {_z("dropped_records")}, event,
               CASE WHEN {bad} THEN input_file_name() END AS _file,
               CASE WHEN {bad} THEN {line} END AS _line
        FROM (SELECT *, {kind} AS kind FROM {{raw}})""", raw=raw)
             # Parsed once, kept as rows for the job (Spark's columnar cache measured the
             # same here, 27 CPU seconds a job either way on the bench's input): by the job
             # below, which parses every line.
             .localCheckpoint(eager=False))
    # The parse's one job keeps the lines (``table``), counts every kind (an observation of
    # the pass) and keeps the lines other than samples (about a fifth) apart, so that the
    # passes over sidecar records, events and bad lines read them, not every sample again.
    seen = Observation()
    try:
        rest = keep(table.observe(
            seen, *[F.expr(f"count(CASE WHEN kind = {int(k)} THEN 1 END) AS {k.name}")
                    for k in Kind],
            F.expr(f"max(CASE WHEN kind = {int(Kind.SIDECAR)} THEN iv_ms END) AS iv"))
            .filter(f"kind != {int(Kind.SAMPLE)}").select(*REST_COLUMNS), eager=True)
    except Exception:
        release(table)  # what the failed job kept of it
        raise
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
