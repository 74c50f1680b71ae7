"""The aggregations, each a DataFrame to DataFrame function (docs/pipeline.md defines them).

No Python UDFs: everything is Spark SQL, so executors need no floodwall code and a cluster
runs the job as fast as its JVMs can. Units out: bytes, messages, seconds, bytes per second.

Deterministic: the same records give the same figures, bit for bit, however Spark splits
them (``local[1]``, ``local[*]``, a cluster). Times are integer milliseconds (the telemetry's
precision) and every sum is a sum of integers, so its order does not matter; a ratio is
one division of two exact sums; "the latest" value is chosen by a total order (time, then
seq, or time then the greater value), never by whichever row came first; percentiles are
exact nearest-rank percentiles (``percentile_disc``), of per-sample values first rounded to
``SIGNIFICANT_BITS`` (``quantized``: exact below 2 KiB, within 0.1 % above, and a bounded
count of distinct values whatever the fleet's size).

Fast: the samples are grouped and sorted by two 64-bit ids (``sq``: sidecar, vhost and
queue; ``q``: vhost and queue; pipeline/load.py) rather than by their strings, and every
aggregation over the samples keeps fixed-width buffers (packed longs, not structs), so
Spark aggregates them in hash maps instead of sorting every row. The names come back by
joining the small per-(sidecar, queue) table. Each pass over the samples is one of four,
each kept as a local checkpoint (``Tables.of``: later plans start from their rows):

- ``runs``: the one ordered pass (per sidecar and queue, by time): trips and their extent.
- ``sidecar_series``: each sidecar's view of each queue in time buckets.
- ``depth_histogram``: how many samples of each (sidecar, queue) had each (quantized)
  depth: the depth percentiles of ``per_sidecar_queue`` and ``per_queue``
  (``hist_percentiles``), without holding every sample's value per group.
- ``per_sidecar_queue``: one row per (sidecar, vhost, queue), from the three above and
  the names and policy of each one's latest sample (the fourth pass, a join).
- ``per_queue``: one row per (vhost, queue) over the fleet, from the small tables:
  ``queue_series`` (the fleet's buckets: ingress summed over sidecars, the latest depth,
  egress derived from the two) and ``episodes`` (each trip: peak, release, time to drain).
- ``per_sidecar``: one row per sidecar, from its own records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

SQ = ["sidecar", "vhost", "queue"]
Q = ["vhost", "queue"]
PERCENTILES = (0.5, 0.9, 0.99)
#: Per-sample values enter percentiles with this many significant bits (``quantized``).
SIGNIFICANT_BITS = 11
EVENT_COUNTS = ("deadline_expiries", "rejects", "holds", "signals")
#: The policy in force, as the samples carry it: the latest sample's.
POLICY_FIELDS = ("policy", "capacity", "resume", "max_messages", "resume_messages", "deadline",
                 "overflow", "mode")

#: ``_key``: milliseconds times 2**20 stays within a long until the year 2248.
_SEQ_BITS = 20
#: The peak of a trip is found exactly for depths under 32 GiB and trips under 37 hours;
#: beyond, among the samples at least that deep and that late, the earliest.
_DEPTH_MAX = (1 << 35) - 1
_OFFSET_MAX = (1 << 27) - 1
#: ``sidecar_series``: the newest depth of a bucket packed with its time in the bucket.
_VALUE_BITS = 40
_VALUE_MAX = (1 << _VALUE_BITS) - 1
MAX_RESOLUTION_MS = 1 << 23  # about 2.3 hours: offsets in a bucket take 23 bits


class FleetError(RuntimeError):
    """The telemetry cannot be aggregated exactly (two names with one 64-bit id)."""


def quantized(c: Column) -> Column:
    """``c`` (a non-negative integer) rounded down to ``SIGNIFICANT_BITS`` significant bits:
    exact below 2**11 = 2048, else within 2**-10 (0.1 %) below. Deterministic, and a
    percentile over it keeps at most 1,024 distinct values per doubling of the range."""
    shift = F.greatest(F.floor(F.log2(c)) - F.lit(SIGNIFICANT_BITS - 1), F.lit(0)).cast("int")
    return F.call_function("shiftleft", F.call_function("shiftright", c, shift), shift)


def _pct(column: str, p: float) -> Column:
    """The nearest-rank percentile: the smallest value with at least ``p`` of the rows at or
    below it (nulls left out)."""
    return F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})")


def _sum0(c: Column) -> Column:
    return F.coalesce(F.sum(c), F.lit(0))


def _seconds(c: Column) -> Column:
    return c / F.lit(1000.0)


def _per_second(num: str, ms: str) -> Column:
    """``num`` per second over ``ms`` milliseconds (null without time)."""
    return F.when(F.col(ms) > 0, F.col(num) * F.lit(1000.0) / F.col(ms))


def _ratio(num: str, den: str) -> Column:
    return F.when(F.col(den) > 0, F.col(num) / F.col(den))


def _iv() -> Column:
    return F.coalesce(F.col("iv_ms"), F.lit(0))


def _key() -> Column:
    """A sample's place in its sidecar's time order as one long: (ts, then seq). Two samples
    of one sidecar and queue in the same millisecond with seqs 2**20 apart would tie: one
    process writes far fewer than 2**20 records per millisecond."""
    return (F.col("ts_ms") * F.lit(1 << _SEQ_BITS)
            + F.col("seq").bitwiseAND(F.lit((1 << _SEQ_BITS) - 1)))


def _packed(offset: Column, value: Column) -> Column:
    return F.when(value.isNotNull(),
                  offset * F.lit(1 << _VALUE_BITS) + F.least(value, F.lit(_VALUE_MAX)))


def _unpacked(c: Column) -> Column:
    return c.bitwiseAND(F.lit(_VALUE_MAX))


def event_counts(events: DataFrame) -> DataFrame:
    """One row per (sidecar, vhost, queue) with events: deadline expiries, rejects, holds,
    signals (``signal`` names no queue: it counts under queue "")."""
    return events.groupBy(*SQ).agg(
        F.count(F.when(F.col("event") == "deadline", 1)).alias("deadline_expiries"),
        F.count(F.when(F.col("event") == "reject", 1)).alias("rejects"),
        F.count(F.when(F.col("event") == "hold", 1)).alias("holds"),
        F.count(F.when(F.col("event") == "signal", 1)).alias("signals"))


def _events_by(counts: DataFrame, keys: list[str]) -> DataFrame:
    return counts.groupBy(*keys).agg(*[F.sum(c).alias(c) for c in EVENT_COUNTS])


def _fill_events(df: DataFrame) -> DataFrame:
    return df.fillna(0, list(EVENT_COUNTS))


def runs(samples: DataFrame) -> DataFrame:
    """The samples of each (sidecar, queue) in time order (ts, then seq), cut into runs.

    A run starts at a tripped sample after one that was not (run 0: the samples before the
    first trip). One row per (``sq``, run): ``new_trips``, the growth of the sidecar's
    ``trips`` counter over the run's samples (it sees trips shorter than a sample interval;
    a counter that went down restarted from 0; the first sample counts 1 if tripped);
    ``start_ms`` (first tripped sample), ``end_ms`` (the first untripped sample after it:
    the release; null while still tripped at the end), the deepest tripped sample
    (``peak_depth``, ``peak_ms``: the earliest if several), most held while tripped.

    The only sort of the job; it carries the few columns it needs.
    """
    w = Window.partitionBy("sq").orderBy("_key")
    tripped = F.coalesce(F.col("tripped"), F.lit(False))
    before = F.lag("trips").over(w)
    new_trips = (F.when(before.isNull(), F.when(tripped, 1).otherwise(0))
                 .when(F.col("trips") >= before, F.col("trips") - before)
                 .otherwise(F.col("trips")))
    start = tripped & ~F.coalesce(F.lag(tripped).over(w), F.lit(False))
    s = samples.select("sq", "ts_ms", _key().alias("_key"), "tripped", "trips",
                       F.coalesce(F.col("depth"), F.lit(0)).alias("depth"), "held_bytes",
                       "held_messages")
    s = s.select("sq", "ts_ms", "_key", tripped.alias("tripped"), "depth", "held_bytes",
                 "held_messages", F.coalesce(new_trips, F.lit(0)).alias("_new"),
                 start.alias("_start"))
    running = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    s = s.select("*", F.sum(F.col("_start").cast("int")).over(running).alias("run"),
                 F.max(F.when(F.col("_start"), F.col("ts_ms"))).over(running).alias("_run_start"))
    t = F.col("tripped")
    # The deepest tripped sample, the earliest if several: the greatest (depth, -offset in
    # the run) packed in a long (a fixed-width buffer: hash aggregation, no second sort).
    offset = F.least(F.col("ts_ms") - F.col("_run_start"), F.lit(_OFFSET_MAX))
    peak_key = (F.least(F.col("depth"), F.lit(_DEPTH_MAX)) * F.lit(_OFFSET_MAX + 1)
                + (F.lit(_OFFSET_MAX) - offset))
    return s.groupBy("sq", "run").agg(
        F.sum("_new").alias("new_trips"),
        F.min(F.when(t, F.col("ts_ms"))).alias("start_ms"),
        F.min(F.when(~t, F.col("ts_ms"))).alias("end_ms"),
        F.max(F.when(t, F.col("depth"))).alias("peak_depth"),
        F.max_by(F.when(t, F.col("ts_ms")), F.when(t, peak_key)).alias("peak_ms"),
        F.max(F.when(t, F.col("held_bytes"))).alias("held_max"),
        F.max(F.when(t, F.col("held_messages"))).alias("held_messages_max"))


def depth_histogram(samples: DataFrame) -> DataFrame:
    """One row per (``sq``, ``q``, quantized depth ``_qd``) with its count of samples ``n``:
    the depth percentiles of a sidecar's queue and of the fleet's come from it
    (``hist_percentiles``). A hash aggregation of fixed-width rows (at most 1,024 values
    per doubling of the depth per group: ``quantized``), where a percentile over the samples
    would keep every value of a group in an object buffer."""
    return (samples.select("sq", "q", quantized(F.col("depth")).alias("_qd"))
            .where(F.col("_qd").isNotNull())
            .groupBy("sq", "q", "_qd").agg(F.count(F.lit(1)).alias("n")))


def hist_percentiles(hist: DataFrame, key: str) -> DataFrame:
    """``depth_p50``, ``depth_p90``, ``depth_p99`` per ``key`` (``sq`` or ``q``) from
    ``depth_histogram``: nearest-rank, the smallest value whose share of the values at or
    below it is at least p (the same as ``percentile_disc`` over the samples: checked in
    tests/pipeline/test_aggregate.py). Exact: counts are integers; one division each."""
    h = hist if key == "sq" else hist.groupBy(key, "_qd").agg(F.sum("n").alias("n"))
    ordered = Window.partitionBy(key).orderBy("_qd").rowsBetween(Window.unboundedPreceding,
                                                                  Window.currentRow)
    h = h.select(key, "_qd", (F.sum("n").over(ordered)
                              / F.sum("n").over(Window.partitionBy(key))).alias("_cume"))
    return h.groupBy(key).agg(*[F.min(F.when(F.col("_cume") >= F.lit(p), F.col("_qd")))
                                .alias(f"depth_p{round(p * 100)}") for p in PERCENTILES])


def _resolution_ms(resolution: float) -> int:
    res_ms = round(float(resolution) * 1000)
    if not 0 < res_ms <= MAX_RESOLUTION_MS:
        raise ValueError(f"resolution must be 1 ms to {MAX_RESOLUTION_MS / 1000:g} s, "
                         f"not {resolution!r}")
    return res_ms


def sidecar_series(samples: DataFrame, resolution: float) -> DataFrame:
    """One row per (``q``, ``sq``, bucket of ``resolution`` seconds): what one sidecar's
    samples of a queue say in it. Buckets are ``floor(ts / resolution)`` on the integer
    milliseconds. ``last_depth``/``last_msgs``: the newest sample's depth packed with its
    time in the bucket (``queue_series`` unpacks it), the greater on a tie."""
    res_ms = _resolution_ms(resolution)
    iv = _iv()
    bucket = F.expr(f"ts_ms div {res_ms}")
    offset = F.col("ts_ms") - bucket * F.lit(res_ms)
    check = F.hash(*SQ)  # a second hash of the names: see per_sidecar_queue's _clash
    return (samples.select("*", bucket.alias("bucket_index"))
            .groupBy("q", "sq", "bucket_index").agg(
                F.count(F.lit(1)).alias("samples"),
                F.min("ts_ms").alias("first_ms"), F.max("ts_ms").alias("last_ms"),
                F.max(_key()).alias("last_key"),
                _sum0(iv).alias("observed_ms"),
                _sum0(F.when(F.col("tripped"), iv)).alias("tripped_ms"),
                _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
                _sum0(F.col("ingress_messages")).alias("ingress_messages"),
                _sum0(F.col("held_bytes") * iv).alias("held_bms"),
                # issue 14: forwarded while held (admitted), and the drain estimate x time
                _sum0(F.when(F.col("tripped"), F.col("ingress_bytes"))).alias("admitted_bytes"),
                _sum0(F.col("drain_bps") * iv).alias("drain_bms"),
                # issue 15: the fleet as this sidecar saw it (null with --fleet off)
                F.max("fleet_members").alias("fleet_members"),
                F.sum(F.col("fleet_share") * iv).alias("share_bms"),
                F.sum(F.when(F.col("fleet_share").isNotNull(), iv)).alias("share_ms"),
                F.sum(F.round("fleet_demand_bps").cast("long") * iv).alias("demand_bms"),
                F.sum(F.when(F.col("fleet_demand_bps").isNotNull(), iv)).alias("demand_ms"),
                F.max(F.when(F.col("tripped"), F.col("blocked_publishers")))
                .alias("blocked_tripped_max"),
                F.max(_packed(offset, F.col("depth"))).alias("last_depth"),
                F.max(_packed(offset, F.col("depth_msgs"))).alias("last_msgs"),
                F.max("depth").alias("depth_max"),
                F.max("depth_msgs").alias("depth_msgs_max"),
                F.max(F.when(F.col("capacity") > 0,
                             F.greatest(F.col("depth") - F.col("capacity"), F.lit(0))))
                .alias("overshoot_max"),
                F.max("held_bytes").alias("held_max"),
                F.max("spooled_bytes").alias("spooled_max"),
                F.max("blocked_publishers").alias("blocked_max"),
                F.min(check).alias("_check_min"), F.max(check).alias("_check_max"),
                F.max("capacity").alias("capacity"), F.max("resume").alias("resume")))


def queue_series(level1: DataFrame, names: DataFrame, resolution: float) -> DataFrame:
    """One row per (vhost, queue, bucket of ``resolution`` seconds), over all sidecars, from
    ``sidecar_series`` at that resolution; ``names`` has ``q``, ``vhost``, ``queue``.

    ``observed_seconds`` and ``tripped_seconds``: the most any one sidecar's samples cover;
    ``depth_end`` is the newest depth of the bucket (any sidecar; the greatest on a tie);
    ``ingress_*`` the sum of every sidecar's; ``held_bytes`` the sidecars' held bytes
    summed, time-averaged; ``egress_* = max(0, ingress - (depth_end - previous
    depth_end))`` when the previous bucket is there; ``backlog`` when the queue was not
    empty at its start.
    """
    res_ms = _resolution_ms(resolution)
    series = level1.groupBy("q", "bucket_index").agg(
        F.max("observed_ms").alias("observed_ms"),
        F.max("tripped_ms").alias("tripped_ms"),
        F.sum("ingress_bytes").alias("ingress_bytes"),
        F.sum("ingress_messages").alias("ingress_messages"),
        F.sum("held_bms").alias("held_bms"),
        F.sum("admitted_bytes").alias("admitted_bytes"),
        F.max("drain_bms").alias("drain_bms"),  # one queue's drain: any sidecar's estimate
        _unpacked(F.max("last_depth")).alias("depth_end"),
        _unpacked(F.max("last_msgs")).alias("depth_msgs_end"),
        F.max("depth_max").alias("depth_max"),
        F.max("capacity").alias("capacity"), F.max("resume").alias("resume"),
        F.count(F.lit(1)).alias("sidecars"))
    w = Window.partitionBy("q").orderBy("bucket_index")
    contiguous = F.lag("bucket_index").over(w) == F.col("bucket_index") - 1
    prev_b, prev_m = F.lag("depth_end").over(w), F.lag("depth_msgs_end").over(w)
    egress_b = F.when(contiguous & prev_b.isNotNull() & F.col("depth_end").isNotNull(),
                      F.greatest(F.col("ingress_bytes") - (F.col("depth_end") - prev_b),
                                 F.lit(0)))
    egress_m = F.when(contiguous & prev_m.isNotNull() & F.col("depth_msgs_end").isNotNull(),
                      F.greatest(F.col("ingress_messages") - (F.col("depth_msgs_end") - prev_m),
                                 F.lit(0)))
    q_names = names.select("q", "vhost", "queue").dropDuplicates(["q"])
    return (series.select(
        "*", (F.col("bucket_index") * F.lit(res_ms) / F.lit(1000.0)).alias("bucket"),
        _seconds(F.col("observed_ms")).alias("observed_seconds"),
        _seconds(F.col("tripped_ms")).alias("tripped_seconds"),
        _ratio("held_bms", "observed_ms").alias("held_bytes"),
        (F.col("drain_bms") / F.lit(1000.0)).alias("drained_bytes"),
        egress_b.alias("egress_bytes"), egress_m.alias("egress_messages"),
        F.coalesce(contiguous & (prev_b > 0), F.lit(False)).alias("backlog"))
        .join(F.broadcast(q_names), "q"))


def per_sidecar_queue(samples: DataFrame, run_rows: DataFrame, level1: DataFrame,
                      hist: DataFrame, events: DataFrame) -> DataFrame:
    """One row per (sidecar, vhost, queue) (docs/pipeline.md, "Per sidecar and queue"), with
    its ids ``sq`` and ``q``: ``runs``, ``sidecar_series`` (the recommendations'
    resolution), ``depth_histogram`` and ``event_counts`` are the other inputs.
    ``ingress_share``: the sidecar's part of the fleet's ingress to the queue. ``_clash``:
    true if two names share an id (a second, independent hash of the names differs within
    one id).

    Sums and extremes come from ``sidecar_series`` (one row per bucket, not per sample),
    the depth percentiles from ``depth_histogram`` (``hist``); the samples are read once
    more, to fetch the names and the policy from each one's latest sample.
    """
    rated = level1.select("*", _per_second("ingress_bytes", "observed_ms").alias("_rate"))
    totals = rated.groupBy("sq").agg(
        F.max("q").alias("q"),
        F.sum("samples").alias("samples"),
        F.min("first_ms").alias("_first"), F.max("last_ms").alias("_last"),
        F.max("last_key").alias("_key"),
        F.sum("observed_ms").alias("observed_ms"), F.sum("tripped_ms").alias("tripped_ms"),
        F.max("depth_max").alias("depth_max"),
        F.max("depth_msgs_max").alias("depth_messages_max"),
        F.max("overshoot_max").alias("peak_overshoot"),
        F.sum("ingress_bytes").alias("ingress_bytes"),
        F.sum("ingress_messages").alias("ingress_messages"),
        _pct("_rate", 0.99).alias("ingress_rate_p99"),
        F.max("held_max").alias("held_bytes_max"),
        F.sum("held_bms").alias("_held_bms"),
        F.max("spooled_max").alias("spooled_bytes_max"),
        F.max("blocked_max").alias("blocked_publishers_max"),
        _sum0(F.col("admitted_bytes")).alias("admitted_bytes"),
        F.max("blocked_tripped_max").alias("_blocked_tripped"),
        F.max("fleet_members").alias("fleet_members_max"),
        F.sum("share_bms").alias("_share_bms"), F.sum("share_ms").alias("_share_ms"),
        F.sum("demand_bms").alias("_demand_bms"), F.sum("demand_ms").alias("_demand_ms"),
        (F.min("_check_min") != F.max("_check_max")).alias("_clash"))
    pct = hist_percentiles(hist, "sq")
    latest = (samples.select("sq", _key().alias("_key"), *SQ, *POLICY_FIELDS)
              .join(F.broadcast(totals.select("sq", "_key")), ["sq", "_key"])
              # one row per sq (two would be one sample written twice: take the greatest)
              .groupBy("sq").agg(*[F.max(c).alias(c) for c in (*SQ, *POLICY_FIELDS)]))
    trips = run_rows.groupBy("sq").agg(F.sum("new_trips").alias("trips"))
    fleet = Window.partitionBy("q")
    out = (latest.join(totals, "sq").join(pct, "sq", "left").join(trips, "sq", "left")
           .join(events, SQ, "left")
           .select("*",
                   _seconds(F.col("_first")).alias("first_ts"),
                   _seconds(F.col("_last")).alias("last_ts"),
                   _seconds(F.col("observed_ms")).alias("observed_seconds"),
                   _seconds(F.col("tripped_ms")).alias("tripped_seconds"),
                   _per_second("ingress_bytes", "observed_ms").alias("ingress_rate"),
                   _ratio("tripped_ms", "observed_ms").alias("tripped_share"),
                   _ratio("_held_bms", "observed_ms").alias("held_bytes_mean"),
                   F.when(F.sum("ingress_bytes").over(fleet) > 0,
                          F.col("ingress_bytes") / F.sum("ingress_bytes").over(fleet))
                   .alias("ingress_share"),
                   F.when(F.sum("admitted_bytes").over(fleet) > 0,
                          F.col("admitted_bytes") / F.sum("admitted_bytes").over(fleet))
                   .alias("admitted_share"),
                   # contended: it had publishers waiting while the queue was tripped, or
                   # was admitted some then (the sidecars a fair release splits among)
                   ((F.col("admitted_bytes") > 0) | (F.coalesce("_blocked_tripped", F.lit(0)) > 0))
                   .alias("contended"),
                   _ratio("_share_bms", "_share_ms").alias("fleet_share_bytes_mean"),
                   _ratio("_demand_bms", "_demand_ms").alias("fleet_demand_rate_mean"))
           .drop("_first", "_last", "_key", "observed_ms", "tripped_ms", "_held_bms",
                 "_blocked_tripped", "_share_bms", "_share_ms", "_demand_bms", "_demand_ms"))
    return _fill_events(out).fillna(0, ["trips"])


def episodes(run_rows: DataFrame, names: DataFrame) -> DataFrame:
    """One row per trip of each (sidecar, queue) (``runs`` without run 0; ``names``: ``sq``
    to ``q``, sidecar, vhost, queue).

    ``drain_seconds = end - peak`` (peak: the run's deepest sample, the earliest if
    several); ``duration = end - start``; ``held_max``: most held during the run.
    """
    e = run_rows.filter(F.col("run") > 0)
    ids = names.select("sq", "q", *SQ)
    drain_ms = F.col("end_ms") - F.col("peak_ms")
    duration_ms = F.col("end_ms") - F.col("start_ms")
    return e.join(F.broadcast(ids), "sq").select(
        "sq", "q", *SQ, F.col("run").alias("episode"),
        _seconds(F.col("start_ms")).alias("start_ts"), _seconds(F.col("end_ms")).alias("end_ts"),
        _seconds(F.col("peak_ms")).alias("peak_ts"), "peak_depth",
        F.col("end_ms").isNotNull().alias("closed"),
        drain_ms.alias("drain_ms"), duration_ms.alias("duration_ms"),
        _seconds(drain_ms).alias("drain_seconds"), _seconds(duration_ms).alias("duration"),
        "held_max", "held_messages_max")


def _fairness() -> list[Column]:
    """Jain's index of the bytes admitted while tripped, over the contended sidecars of a
    queue (``per_sidecar_queue``'s ``contended``): ``(sum a)**2 / (n * sum a**2)``, 1 when
    they got equal parts, 1/n when one got everything; null with none contended or nothing
    admitted. All of them had publishers waiting, so each wanted more than it got: an equal
    split is the max-min fair one."""
    a = F.when(F.col("contended"), F.col("admitted_bytes").cast("decimal(38,0)"))
    n = F.count(a)
    total, squares = F.sum(a), F.sum(a * a)  # exact (integers): the order cannot change them
    return [n.alias("contended_sidecars"),
            F.when((n > 0) & (squares > 0),
                   (total * total).cast("double") / (n * squares).cast("double"))
            .alias("admitted_fairness")]


def per_queue(hist: DataFrame, series: DataFrame, eps: DataFrame, psq: DataFrame,
              events: DataFrame) -> DataFrame:
    """One row per (vhost, queue) over the fleet (docs/pipeline.md, "Per queue");
    ``series`` at the recommendations' resolution, ``events`` is ``event_counts``."""
    from_samples = hist_percentiles(hist, "q")
    # From the sidecars' rows: sums and extremes, the most trips of any, and the policy of
    # the sidecar that sampled last (the greatest name on a tie).
    latest = F.struct("last_ts", "sidecar")
    from_psq = psq.groupBy("q").agg(
        F.max("vhost").alias("vhost"), F.max("queue").alias("queue"),
        F.count(F.lit(1)).alias("sidecars"), F.sum("samples").alias("samples"),
        F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts"),
        *[F.max_by(c, latest).alias(c) for c in POLICY_FIELDS],
        F.max("depth_max").alias("depth_max"),
        F.max("depth_messages_max").alias("depth_messages_max"),
        F.max("peak_overshoot").alias("peak_overshoot"),
        F.max("spooled_bytes_max").alias("spooled_bytes_max"),
        F.sum("ingress_bytes").alias("ingress_bytes"),
        F.sum("ingress_messages").alias("ingress_messages"),
        F.max("trips").alias("trips"),
        F.max("fleet_members_max").alias("fleet_members_max"),
        F.sum("admitted_bytes").alias("admitted_bytes"),
        *_fairness())
    has_egress = F.col("egress_bytes").isNotNull()
    drain = has_egress & F.col("backlog")
    obs = F.col("observed_ms")
    rated = series.select("*", _per_second("ingress_bytes", "observed_ms").alias("_rate"),
                          _per_second("ingress_messages", "observed_ms").alias("_rate_m"))
    from_series = rated.groupBy("q").agg(
        _sum0(obs).alias("observed_ms"),
        _sum0(F.col("tripped_ms")).alias("tripped_ms"),
        F.sum("egress_bytes").alias("_egress"),
        F.sum(F.when(has_egress, obs)).alias("_egress_ms"),
        F.sum(F.when(drain, F.col("egress_bytes"))).alias("_drain"),
        F.sum(F.when(drain, F.col("egress_messages"))).alias("_drain_m"),
        _sum0(F.when(drain, obs)).alias("backlog_ms"),
        _pct("_rate", 0.99).alias("ingress_rate_p99"),
        _pct("_rate_m", 0.99).alias("ingress_messages_rate_p99"),
        F.max("held_bytes").alias("held_bytes_max"),
        _sum0(F.col("held_bms")).alias("_held_bms"))
    from_series = (from_series.select(
        "*", _per_second("_egress", "_egress_ms").alias("egress_rate"),
        _per_second("_drain", "backlog_ms").alias("drain_rate"),
        _per_second("_drain_m", "backlog_ms").alias("drain_rate_messages"),
        _seconds(F.col("_held_bms")).alias("held_byte_seconds"))
        .drop("_egress", "_egress_ms", "_drain", "_drain_m", "_held_bms"))
    closed = F.col("closed")
    from_eps = (eps.select("*", F.when(closed, F.col("drain_ms")).alias("_drain_closed"),
                           F.when(closed, F.col("duration_ms")).alias("_dur_closed"))
                .groupBy("q").agg(
                    F.count(F.lit(1)).alias("episodes"),
                    F.count(F.when(~closed, 1)).alias("open_trips"),
                    F.countDistinct("sq").alias("sidecars_tripping"),
                    _pct("_drain_closed", 0.5).alias("_drain_p50"),
                    F.max("_drain_closed").alias("_drain_max"),
                    _pct("_dur_closed", 0.9).alias("_trip_p90"),
                    _pct("held_max", 0.9).alias("_held_p90"),
                    _pct("held_messages_max", 0.9).alias("_held_msgs_p90")))
    from_eps = (from_eps.select(
        "*", _seconds(F.col("_drain_p50")).alias("drain_seconds_p50"),
        _seconds(F.col("_drain_max")).alias("drain_seconds_max"),
        _seconds(F.col("_trip_p90")).alias("trip_seconds_p90"),
        (F.col("_held_p90") * F.col("sidecars_tripping")).cast("long")
        .alias("held_at_release_p90"),
        (F.col("_held_msgs_p90") * F.col("sidecars_tripping")).cast("long")
        .alias("held_messages_at_release_p90"))
        .drop("_drain_p50", "_drain_max", "_trip_p90", "_held_p90", "_held_msgs_p90"))
    out = (from_psq.join(from_samples, "q", "left").join(from_series, "q", "left")
           .join(from_eps, "q", "left").join(_events_by(events, Q), Q, "left"))
    out = (out.select(
        "*", _seconds(F.col("observed_ms")).alias("observed_seconds"),
        _seconds(F.col("tripped_ms")).alias("tripped_seconds"),
        _seconds(F.col("backlog_ms")).alias("backlog_seconds"),
        _per_second("ingress_bytes", "observed_ms").alias("ingress_rate"),
        _ratio("tripped_ms", "observed_ms").alias("tripped_share"))
        .drop("q", "observed_ms", "tripped_ms", "backlog_ms"))
    return _fill_events(out).fillna(0, ["trips", "episodes", "open_trips",
                                        "sidecars_tripping"])


def per_sidecar(sidecars: DataFrame, psq: DataFrame, events: DataFrame) -> DataFrame:
    """One row per sidecar: its own records (held, alarms, drops) and its queues' totals."""
    alarm = F.col("alarm").isNotNull()
    iv = _iv()
    own = sidecars.groupBy("sidecar").agg(
        F.count(F.lit(1)).alias("records"),
        F.min("ts_ms").alias("_first"), F.max("ts_ms").alias("_last"),
        _sum0(iv).alias("observed_ms"),
        F.max("iv_ms").alias("_interval_ms"),
        F.max("held_bytes").alias("held_bytes_max"),
        F.max("held_messages").alias("held_messages_max"),
        _sum0(F.col("held_bytes") * iv).alias("_held_bms"),
        F.max("blocked_channels").alias("blocked_channels_max"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        _sum0(F.when(alarm, iv)).alias("_alarm_ms"),
        F.max("dropped_records").alias("dropped_records"))
    queues = psq.groupBy("sidecar").agg(
        F.count(F.lit(1)).alias("queues"),
        _sum0(F.round(F.col("tripped_seconds") * 1000).cast("long")).alias("_tripped_ms"),
        _sum0(F.col("trips")).alias("trips"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"))
    out = (own.join(queues, "sidecar", "full")
           .join(_events_by(events, ["sidecar"]), "sidecar", "left")
           .select("*", _seconds(F.col("_first")).alias("first_ts"),
                   _seconds(F.col("_last")).alias("last_ts"),
                   _seconds(F.col("observed_ms")).alias("observed_seconds"),
                   _seconds(F.col("_interval_ms")).alias("interval"),
                   _seconds(F.col("_held_bms")).alias("held_byte_seconds"),
                   _seconds(F.col("_alarm_ms")).alias("alarm_seconds"),
                   _seconds(F.col("_tripped_ms")).alias("tripped_queue_seconds"),
                   _ratio("_held_bms", "observed_ms").alias("held_bytes_mean"))
           .drop("_first", "_last", "observed_ms", "_interval_ms", "_held_bms", "_alarm_ms",
                 "_tripped_ms"))
    return _fill_events(out).fillna(0, ["queues", "trips", "tripped_queue_seconds"])


def keep(df: DataFrame, eager: bool = False) -> DataFrame:
    """``df`` as a local checkpoint (its rows kept by the executors, MEMORY_AND_DISK): now
    (``eager``), else by the first job that computes it. ``release`` drops them."""
    return df.localCheckpoint(eager=eager)


def release(df: DataFrame) -> None:
    """Drop the rows of a ``keep``'s (or ``localCheckpoint``'s) table now, rather than when
    the JVM collects them; anything else is unpersisted."""
    plan = df._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)
    else:
        df.unpersist()


def check_ids(psq_rows: Sequence[Mapping[str, Any]]) -> None:
    """Stop (``FleetError``) if ``per_sidecar_queue``'s rows, as collected, say that two
    (sidecar, vhost, queue) share a 64-bit id (``_clash``), rather than mix them."""
    clashes = [(r["sidecar"], r["vhost"], r["queue"]) for r in psq_rows if r["_clash"]]
    if clashes:
        raise FleetError("two (sidecar, vhost, queue) share a 64-bit id (about one "
                         f"chance in 10**10 per pair), among {clashes[:3]}: "
                         "the job stops rather than mix them")


@dataclass
class Tables:
    """The job's tables over samples and events, at the recommendations' ``resolution``:
    the intermediate ones kept as local checkpoints (``unpersist()`` when done)."""

    resolution: float
    events: DataFrame
    level1: DataFrame
    runs: DataFrame
    hist: DataFrame
    psq: DataFrame
    episodes: DataFrame
    series: DataFrame
    queues: DataFrame

    @classmethod
    def of(cls, samples: DataFrame, events: DataFrame, resolution: float) -> Tables:
        # The intermediate tables are local checkpoints, not cached plans: each later plan
        # then starts from their rows instead of carrying (and re-optimizing, and matching
        # against the cache) every plan below them. Lazy ones are kept by the first job that
        # computes them: psq's.
        ev = keep(event_counts(events))
        level1 = keep(sidecar_series(samples, resolution))
        run_rows = keep(runs(samples))
        hist = keep(depth_histogram(samples))
        psq = keep(per_sidecar_queue(samples, run_rows, level1, hist, ev), eager=True)
        eps = episodes(run_rows, psq)
        series = keep(queue_series(level1, psq, resolution))
        queues = per_queue(hist, series, eps, psq, ev)
        return cls(resolution, ev, level1, run_rows, hist, psq, eps, series, queues)

    def unpersist(self) -> None:
        for df in (self.events, self.level1, self.runs, self.hist, self.psq, self.series):
            release(df)
