"""The aggregations, each a DataFrame to DataFrame function (docs/pipeline.md defines them).

No Python UDFs: everything is Spark SQL, so executors need no floodwall code and a cluster
runs the job as fast as its JVMs can. Units out: bytes, messages, seconds, bytes per second.

Deterministic: the same records give the same figures, bit for bit, however Spark splits
them (``local[1]``, ``local[*]``, a cluster). Times are integer milliseconds (the telemetry's
precision) and every sum is a sum of integers, so its order does not matter; a ratio is
one division of two exact sums; "the latest" value is chosen by (ts, then sidecar, then
seq), never by whichever row came first; percentiles are exact nearest-rank percentiles
(``percentile_disc``), of values first rounded to ``SIGNIFICANT_BITS`` where the input is
per sample (``quantized``: exact below 2 KiB, within 0.1 % above, and a bounded count of
distinct values whatever the fleet's size).

- ``runs``: the one ordered pass (per sidecar and queue, by time): trips and their extent.
- ``per_sidecar_queue``: one row per (sidecar, vhost, queue), what that sidecar saw.
- ``queue_series``: the fleet's view of each queue in time buckets: ingress summed over
  sidecars, the latest depth, and egress derived from the two.
- ``episodes``: each trip of each (sidecar, queue): peak, release, time to drain.
- ``per_queue``: one row per (vhost, queue) over the fleet, from the above.
- ``per_sidecar``: one row per sidecar.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

SQ = ["sidecar", "vhost", "queue"]
Q = ["vhost", "queue"]
PERCENTILES = (0.5, 0.9, 0.99)
#: Per-sample values enter percentiles with this many significant bits (``quantized``).
SIGNIFICANT_BITS = 11
EVENT_COUNTS = ("deadline_expiries", "rejects", "holds", "signals")


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


def _latest(c: str, *order: str) -> Column:
    """The value of ``c`` in the row with the greatest (``order``...): ties never happen on
    (ts, sidecar, seq), and ``max_by`` on a struct key is exact."""
    return F.max_by(c, F.struct(*order))


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
    first trip). One row per (sidecar, vhost, queue, run): ``new_trips``, the growth of the
    sidecar's ``trips`` counter over the run's samples (it sees trips shorter than a sample
    interval; a counter that went down restarted from 0; the first sample counts 1 if
    tripped); ``start_ms`` (first tripped sample), ``end_ms`` (the first untripped sample
    after it: the release; null while still tripped at the end), the deepest tripped sample
    (``peak_depth``, ``peak_ms``: the earliest if several), most held while tripped.

    The only sort of the job; it carries the few columns it needs.
    """
    w = Window.partitionBy(*SQ).orderBy("ts_ms", "seq")
    tripped = F.coalesce(F.col("tripped"), F.lit(False))
    before = F.lag("trips").over(w)
    new_trips = (F.when(before.isNull(), F.when(tripped, 1).otherwise(0))
                 .when(F.col("trips") >= before, F.col("trips") - before)
                 .otherwise(F.col("trips")))
    start = tripped & ~F.coalesce(F.lag(tripped).over(w), F.lit(False))
    s = samples.select(*SQ, "ts_ms", "seq", tripped.alias("tripped"), "depth", "held_bytes",
                       "held_messages", F.coalesce(new_trips, F.lit(0)).alias("_new"),
                       start.cast("int").alias("_start"))
    running = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    s = s.withColumn("run", F.sum("_start").over(running))
    t = F.col("tripped")
    depth = F.coalesce(F.col("depth"), F.lit(0))
    return s.groupBy(*SQ, "run").agg(
        F.sum("_new").alias("new_trips"),
        F.min(F.when(t, F.col("ts_ms"))).alias("start_ms"),
        F.min(F.when(~t, F.col("ts_ms"))).alias("end_ms"),
        F.min(F.when(t, F.struct((-depth).alias("neg"), F.col("ts_ms").alias("ts"))))
        .alias("_peak"),
        F.max(F.when(t, F.col("held_bytes"))).alias("held_max"),
        F.max(F.when(t, F.col("held_messages"))).alias("held_messages_max"))


def episodes(run_rows: DataFrame) -> DataFrame:
    """One row per trip of each (sidecar, queue) (``runs`` without run 0).

    ``drain_seconds = end - peak`` (peak: the run's deepest sample, the earliest if
    several); ``duration = end - start``; ``held_max``: most held during the run.
    """
    e = run_rows.filter(F.col("run") > 0)
    return (e.select(
        *SQ, F.col("run").alias("episode"),
        _seconds(F.col("start_ms")).alias("start_ts"), _seconds(F.col("end_ms")).alias("end_ts"),
        _seconds(F.col("_peak.ts")).alias("peak_ts"), (-F.col("_peak.neg")).alias("peak_depth"),
        F.col("end_ms").isNotNull().alias("closed"),
        (F.col("end_ms") - F.col("_peak.ts")).alias("drain_ms"),
        (F.col("end_ms") - F.col("start_ms")).alias("duration_ms"),
        "held_max", "held_messages_max")
        .withColumn("drain_seconds", _seconds(F.col("drain_ms")))
        .withColumn("duration", _seconds(F.col("duration_ms"))))


def per_sidecar_queue(samples: DataFrame, run_rows: DataFrame, events: DataFrame) -> DataFrame:
    """One row per (sidecar, vhost, queue) (docs/pipeline.md, "Per sidecar and queue");
    ``events`` is ``event_counts``. ``ingress_share``: the sidecar's part of the fleet's
    ingress to the queue."""
    s = (samples
         .withColumn("_qd", quantized(F.col("depth")))
         .withColumn("_qr", quantized(F.expr("CASE WHEN iv_ms > 0 THEN "
                                             "ingress_bytes * 1000 div iv_ms END"))))
    iv = F.coalesce(F.col("iv_ms"), F.lit(0))
    agg = s.groupBy(*SQ).agg(
        F.count(F.lit(1)).alias("samples"),
        F.min("ts_ms").alias("_first"), F.max("ts_ms").alias("_last"),
        _sum0(iv).alias("observed_ms"),
        _latest("policy", "ts_ms", "seq").alias("policy"),
        _latest("capacity", "ts_ms", "seq").alias("capacity"),
        _latest("resume", "ts_ms", "seq").alias("resume"),
        _sum0(F.when(F.col("tripped"), iv)).alias("tripped_ms"),
        *[_pct("_qd", p).cast("long").alias(f"depth_p{round(p * 100)}") for p in PERCENTILES],
        F.max("depth").alias("depth_max"),
        F.max(F.when(F.col("capacity") > 0, F.greatest(F.col("depth") - F.col("capacity"),
                                                        F.lit(0)))).alias("peak_overshoot"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
        _sum0(F.col("ingress_messages")).alias("ingress_messages"),
        _pct("_qr", 0.99).cast("long").alias("ingress_rate_p99"),
        F.max("held_bytes").alias("held_bytes_max"),
        _sum0(F.col("held_bytes") * iv).alias("_held_bms"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        F.max("blocked_publishers").alias("blocked_publishers_max"))
    trips = run_rows.groupBy(*SQ).agg(F.sum("new_trips").alias("trips"))
    fleet = Window.partitionBy(*Q)
    out = (agg.join(trips, SQ, "left").join(events, SQ, "left")
           .withColumn("first_ts", _seconds(F.col("_first")))
           .withColumn("last_ts", _seconds(F.col("_last")))
           .withColumn("observed_seconds", _seconds(F.col("observed_ms")))
           .withColumn("tripped_seconds", _seconds(F.col("tripped_ms")))
           .withColumn("ingress_rate", _per_second("ingress_bytes", "observed_ms"))
           .withColumn("tripped_share", _ratio("tripped_ms", "observed_ms"))
           .withColumn("held_bytes_mean", _ratio("_held_bms", "observed_ms"))
           .withColumn("ingress_share", F.when(
               F.sum("ingress_bytes").over(fleet) > 0,
               F.col("ingress_bytes") / F.sum("ingress_bytes").over(fleet)))
           .drop("_first", "_last", "observed_ms", "tripped_ms", "_held_bms"))
    return _fill_events(out).fillna(0, ["trips"])


def queue_series(samples: DataFrame, resolution: float) -> DataFrame:
    """One row per (vhost, queue, bucket of ``resolution`` seconds), over all sidecars.

    ``observed_seconds`` and ``tripped_seconds``: the most any one sidecar's samples cover;
    ``depth_end`` is the newest depth of the bucket (any sidecar; the greatest sidecar name
    on a tie); ``ingress_*`` the sum of every sidecar's; ``held_bytes`` the sidecars' held
    bytes summed, time-averaged; ``egress_* = max(0, ingress - (depth_end - previous
    depth_end))`` when the previous bucket is there; ``backlog`` when the queue was not
    empty at its start. Buckets are ``floor(ts / resolution)`` on the integer milliseconds.
    """
    res_ms = round(float(resolution) * 1000)
    if res_ms <= 0:
        raise ValueError(f"resolution must be at least 1 ms, not {resolution!r}")
    iv = F.coalesce(F.col("iv_ms"), F.lit(0))
    per_sidecar = (samples.withColumn("bucket_index", F.expr(f"ts_ms div {res_ms}"))
                   .groupBy(*Q, "bucket_index", "sidecar").agg(
                       _sum0(iv).alias("observed_ms"),
                       _sum0(F.when(F.col("tripped"), iv)).alias("tripped_ms"),
                       _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
                       _sum0(F.col("ingress_messages")).alias("ingress_messages"),
                       _sum0(F.col("held_bytes") * iv).alias("held_bms"),
                       F.max(F.struct("ts_ms", "seq")).alias("last_key"),
                       F.max_by(F.struct("depth", "depth_msgs"), F.struct("ts_ms", "seq"))
                       .alias("last"),
                       F.max("depth").alias("depth_max"),
                       F.max("capacity").alias("capacity"), F.max("resume").alias("resume")))
    newest = F.struct(F.col("last_key.ts_ms"), F.col("sidecar"))
    series = per_sidecar.groupBy(*Q, "bucket_index").agg(
        F.max("observed_ms").alias("observed_ms"),
        F.max("tripped_ms").alias("tripped_ms"),
        F.sum("ingress_bytes").alias("ingress_bytes"),
        F.sum("ingress_messages").alias("ingress_messages"),
        F.sum("held_bms").alias("held_bms"),
        F.max_by(F.col("last.depth"), newest).alias("depth_end"),
        F.max_by(F.col("last.depth_msgs"), newest).alias("depth_msgs_end"),
        F.max("depth_max").alias("depth_max"),
        F.max("capacity").alias("capacity"), F.max("resume").alias("resume"),
        F.count(F.lit(1)).alias("sidecars"))
    w = Window.partitionBy(*Q).orderBy("bucket_index")
    contiguous = F.lag("bucket_index").over(w) == F.col("bucket_index") - 1
    prev_b, prev_m = F.lag("depth_end").over(w), F.lag("depth_msgs_end").over(w)
    egress_b = F.when(contiguous & prev_b.isNotNull() & F.col("depth_end").isNotNull(),
                      F.greatest(F.col("ingress_bytes") - (F.col("depth_end") - prev_b),
                                 F.lit(0)))
    egress_m = F.when(contiguous & prev_m.isNotNull() & F.col("depth_msgs_end").isNotNull(),
                      F.greatest(F.col("ingress_messages") - (F.col("depth_msgs_end") - prev_m),
                                 F.lit(0)))
    return (series
            .withColumn("bucket", F.col("bucket_index") * F.lit(res_ms) / F.lit(1000.0))
            .withColumn("observed_seconds", _seconds(F.col("observed_ms")))
            .withColumn("tripped_seconds", _seconds(F.col("tripped_ms")))
            .withColumn("held_bytes", _ratio("held_bms", "observed_ms"))
            .withColumn("egress_bytes", egress_b)
            .withColumn("egress_messages", egress_m)
            .withColumn("backlog", F.coalesce(contiguous & (prev_b > 0), F.lit(False))))


def per_queue(samples: DataFrame, series: DataFrame, eps: DataFrame, psq: DataFrame,
              events: DataFrame) -> DataFrame:
    """One row per (vhost, queue) over the fleet (docs/pipeline.md, "Per queue");
    ``series`` at the recommendations' resolution, ``events`` is ``event_counts``."""
    latest = ("ts_ms", "sidecar", "seq")
    from_samples = samples.withColumn("_qd", quantized(F.col("depth"))).groupBy(*Q).agg(
        F.countDistinct("sidecar").alias("sidecars"),
        F.count(F.lit(1)).alias("samples"),
        F.min("ts_ms").alias("_first"), F.max("ts_ms").alias("_last"),
        *[_latest(c, *latest).alias(c) for c in (
            "policy", "capacity", "resume", "max_messages", "resume_messages", "deadline",
            "overflow")],
        *[_pct("_qd", p).cast("long").alias(f"depth_p{round(p * 100)}") for p in PERCENTILES],
        F.max("depth").alias("depth_max"),
        F.max("depth_msgs").alias("depth_messages_max"),
        F.max(F.when(F.col("capacity") > 0, F.greatest(F.col("depth") - F.col("capacity"),
                                                        F.lit(0)))).alias("peak_overshoot"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
        _sum0(F.col("ingress_messages")).alias("ingress_messages"))
    has_egress = F.col("egress_bytes").isNotNull()
    drain = has_egress & F.col("backlog")
    obs = F.col("observed_ms")
    rated = (series.withColumn("_rate", _per_second("ingress_bytes", "observed_ms"))
             .withColumn("_rate_m", _per_second("ingress_messages", "observed_ms")))
    from_series = rated.groupBy(*Q).agg(
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
    from_series = (from_series
                   .withColumn("egress_rate", _per_second("_egress", "_egress_ms"))
                   .withColumn("drain_rate", _per_second("_drain", "backlog_ms"))
                   .withColumn("drain_rate_messages", _per_second("_drain_m", "backlog_ms"))
                   .withColumn("held_byte_seconds", _seconds(F.col("_held_bms")))
                   .drop("_egress", "_egress_ms", "_drain", "_drain_m", "_held_bms"))
    closed = F.col("closed")
    from_eps = (eps.withColumn("_drain_closed", F.when(closed, F.col("drain_ms")))
                .withColumn("_dur_closed", F.when(closed, F.col("duration_ms")))
                .groupBy(*Q).agg(
                    F.count(F.lit(1)).alias("episodes"),
                    F.count(F.when(~closed, 1)).alias("open_trips"),
                    F.countDistinct("sidecar").alias("sidecars_tripping"),
                    _pct("_drain_closed", 0.5).alias("_drain_p50"),
                    F.max("_drain_closed").alias("_drain_max"),
                    _pct("_dur_closed", 0.9).alias("_trip_p90"),
                    _pct("held_max", 0.9).alias("_held_p90"),
                    _pct("held_messages_max", 0.9).alias("_held_msgs_p90")))
    from_eps = (from_eps
                .withColumn("drain_seconds_p50", _seconds(F.col("_drain_p50")))
                .withColumn("drain_seconds_max", _seconds(F.col("_drain_max")))
                .withColumn("trip_seconds_p90", _seconds(F.col("_trip_p90")))
                .withColumn("held_at_release_p90",
                            (F.col("_held_p90") * F.col("sidecars_tripping")).cast("long"))
                .withColumn("held_messages_at_release_p90",
                            (F.col("_held_msgs_p90") * F.col("sidecars_tripping")).cast("long"))
                .drop("_drain_p50", "_drain_max", "_trip_p90", "_held_p90", "_held_msgs_p90"))
    trips = psq.groupBy(*Q).agg(F.max("trips").alias("trips"))
    out = (from_samples.join(from_series, Q, "left").join(from_eps, Q, "left")
           .join(trips, Q, "left").join(_events_by(events, Q), Q, "left"))
    out = (out.withColumn("first_ts", _seconds(F.col("_first")))
           .withColumn("last_ts", _seconds(F.col("_last")))
           .withColumn("observed_seconds", _seconds(F.col("observed_ms")))
           .withColumn("tripped_seconds", _seconds(F.col("tripped_ms")))
           .withColumn("backlog_seconds", _seconds(F.col("backlog_ms")))
           .withColumn("ingress_rate", _per_second("ingress_bytes", "observed_ms"))
           .withColumn("tripped_share", _ratio("tripped_ms", "observed_ms"))
           .drop("_first", "_last", "observed_ms", "tripped_ms", "backlog_ms"))
    return _fill_events(out).fillna(0, ["trips", "episodes", "open_trips",
                                        "sidecars_tripping"])


def per_sidecar(sidecars: DataFrame, psq: DataFrame, events: DataFrame) -> DataFrame:
    """One row per sidecar: its own records (held, alarms, drops) and its queues' totals."""
    alarm = F.col("alarm").isNotNull()
    iv = F.coalesce(F.col("iv_ms"), F.lit(0))
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
           .withColumn("first_ts", _seconds(F.col("_first")))
           .withColumn("last_ts", _seconds(F.col("_last")))
           .withColumn("observed_seconds", _seconds(F.col("observed_ms")))
           .withColumn("interval", _seconds(F.col("_interval_ms")))
           .withColumn("held_byte_seconds", _seconds(F.col("_held_bms")))
           .withColumn("alarm_seconds", _seconds(F.col("_alarm_ms")))
           .withColumn("tripped_queue_seconds", _seconds(F.col("_tripped_ms")))
           .withColumn("held_bytes_mean", _ratio("_held_bms", "observed_ms"))
           .drop("_first", "_last", "observed_ms", "_interval_ms", "_held_bms", "_alarm_ms",
                 "_tripped_ms"))
    return _fill_events(out).fillna(0, ["queues", "trips", "tripped_queue_seconds"])
