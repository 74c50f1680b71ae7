"""The aggregations, each a DataFrame to DataFrame function (docs/pipeline.md defines them).

No Python UDFs: everything is Spark SQL, so executors need no floodwall code and a cluster
runs the job as fast as its JVMs can. Units: bytes, messages, seconds, bytes per second.

- ``per_sidecar_queue``: one row per (sidecar, vhost, queue), what that sidecar saw.
- ``queue_series``: the fleet's view of each queue in time buckets of ``resolution`` seconds:
  ingress summed over sidecars, the latest depth, and egress derived from the two.
- ``episodes``: each trip of each (sidecar, queue): peak, release, time to drain.
- ``per_queue``: one row per (vhost, queue) over the fleet, from the three above.
- ``per_sidecar``: one row per sidecar.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

SQ = ["sidecar", "vhost", "queue"]
Q = ["vhost", "queue"]
PERCENTILES = [0.5, 0.9, 0.99]
ACCURACY = 10_000  # percentile_approx: rank error at most 1/ACCURACY of the row count


def _sum0(c: Column) -> Column:
    return F.coalesce(F.sum(c), F.lit(0))


def _count_events(events: DataFrame, keys: list[str]) -> DataFrame:
    return events.groupBy(*keys).agg(
        F.count(F.when(F.col("event") == "deadline", 1)).alias("deadline_expiries"),
        F.count(F.when(F.col("event") == "reject", 1)).alias("rejects"),
        F.count(F.when(F.col("event") == "hold", 1)).alias("holds"),
        F.count(F.when(F.col("event") == "signal", 1)).alias("signals"))


def _fill_events(df: DataFrame) -> DataFrame:
    return df.fillna(0, ["deadline_expiries", "rejects", "holds", "signals"])


def _with_runs(samples: DataFrame) -> DataFrame:
    """Adds ``_start`` (a sample that is tripped after one that was not) and ``_run`` (how many
    trips began up to this sample, per sidecar and queue)."""
    w = Window.partitionBy(*SQ).orderBy("ts")
    running = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    start = F.col("tripped") & ~F.coalesce(F.lag("tripped").over(w), F.lit(False))
    # Trips from the sidecar's own counter (it sees trips shorter than a sample interval):
    # its growth since the previous sample; a counter that went down restarted from 0; the
    # first sample counts 1 if tripped.
    before = F.lag("trips").over(w)
    new_trips = (F.when(before.isNull(), F.when(F.col("tripped"), 1).otherwise(0))
                 .when(F.col("trips") >= before, F.col("trips") - before)
                 .otherwise(F.col("trips")))
    return (samples.withColumn("_start", start)
            .withColumn("_new_trips", F.coalesce(new_trips, F.lit(0)))
            .withColumn("_run", F.sum(F.when(F.col("_start"), 1).otherwise(0)).over(running)))


def per_sidecar_queue(samples: DataFrame, events: DataFrame) -> DataFrame:
    s = _with_runs(samples)
    pct = F.percentile_approx("depth", PERCENTILES, ACCURACY)
    rate = F.when(F.col("interval") > 0, F.col("ingress_bytes") / F.col("interval"))
    agg = s.groupBy(*SQ).agg(
        F.count(F.lit(1)).alias("samples"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
        _sum0(F.col("interval")).alias("observed_seconds"),
        F.max_by("policy", "ts").alias("policy"),
        F.max_by("capacity", "ts").alias("capacity"),
        F.max_by("resume", "ts").alias("resume"),
        _sum0(F.when(F.col("tripped"), F.col("interval"))).alias("tripped_seconds"),
        _sum0(F.col("_new_trips")).alias("trips"),
        pct.alias("_pct"), F.max("depth").alias("depth_max"),
        F.max(F.when(F.col("capacity") > 0, F.greatest(F.col("depth") - F.col("capacity"),
                                                        F.lit(0)))).alias("peak_overshoot"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
        _sum0(F.col("ingress_messages")).alias("ingress_messages"),
        F.percentile_approx(rate, 0.99, ACCURACY).alias("ingress_rate_p99"),
        F.max("held_bytes").alias("held_bytes_max"),
        _sum0(F.col("held_bytes") * F.col("interval")).alias("_held_byte_seconds"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        F.max("blocked_publishers").alias("blocked_publishers_max"))
    out = (agg
           .withColumn("depth_p50", F.col("_pct")[0]).withColumn("depth_p90", F.col("_pct")[1])
           .withColumn("depth_p99", F.col("_pct")[2])
           .withColumn("ingress_rate", _ratio("ingress_bytes", "observed_seconds"))
           .withColumn("tripped_share", _ratio("tripped_seconds", "observed_seconds"))
           .withColumn("held_bytes_mean", _ratio("_held_byte_seconds", "observed_seconds"))
           .drop("_pct", "_held_byte_seconds"))
    return _fill_events(out.join(_count_events(events, SQ), SQ, "left"))


def _ratio(num: str, den: str) -> Column:
    return F.when(F.col(den) > 0, F.col(num) / F.col(den))


def queue_series(samples: DataFrame, resolution: float) -> DataFrame:
    """One row per (vhost, queue, bucket of ``resolution`` seconds), over all sidecars.

    ``observed_seconds`` and ``tripped_seconds``: the most any one sidecar's samples cover;
    ``depth_end`` is the newest depth of the bucket (any sidecar); ``ingress_*`` the sum of
    every sidecar's; ``held_bytes`` the sidecars' held bytes summed, time-averaged;
    ``egress_* = max(0, ingress - (depth_end - previous depth_end))`` when the previous
    bucket is there; ``backlog`` when the queue was not empty at its start.
    """
    res = float(resolution)
    per_sidecar = (samples.withColumn("bucket_index", F.floor(F.col("ts") / res))
                   .groupBy(*Q, "bucket_index", "sidecar").agg(
                       _sum0(F.col("interval")).alias("observed_s"),
                       _sum0(F.when(F.col("tripped"), F.col("interval"))).alias("tripped_s"),
                       _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
                       _sum0(F.col("ingress_messages")).alias("ingress_messages"),
                       _sum0(F.col("held_bytes") * F.col("interval")).alias("held_bs"),
                       F.max("ts").alias("last_ts"),
                       F.max_by(F.struct("depth", "depth_msgs"), "ts").alias("last"),
                       F.max("depth").alias("depth_max"),
                       F.max("capacity").alias("capacity"), F.max("resume").alias("resume")))
    series = per_sidecar.groupBy(*Q, "bucket_index").agg(
        F.max("observed_s").alias("observed_seconds"),
        F.max("tripped_s").alias("tripped_seconds"),
        F.sum("ingress_bytes").alias("ingress_bytes"),
        F.sum("ingress_messages").alias("ingress_messages"),
        F.sum("held_bs").alias("held_byte_seconds"),
        F.max_by(F.col("last.depth"), "last_ts").alias("depth_end"),
        F.max_by(F.col("last.depth_msgs"), "last_ts").alias("depth_msgs_end"),
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
    return (series.withColumn("bucket", F.col("bucket_index") * F.lit(res))
            .withColumn("held_bytes", _ratio("held_byte_seconds", "observed_seconds"))
            .withColumn("egress_bytes", egress_b)
            .withColumn("egress_messages", egress_m)
            .withColumn("backlog", F.coalesce(contiguous & (prev_b > 0), F.lit(False))))


def episodes(samples: DataFrame) -> DataFrame:
    """One row per trip of each (sidecar, queue): a run of tripped samples and the first
    untripped sample after it (``end_ts``; null while still tripped at the end of the data).

    ``drain_seconds = end_ts - peak_ts`` (peak: the run's deepest sample, the earliest if
    several); ``duration = end_ts - start_ts``; ``held_max``: most held during the run.
    """
    s = _with_runs(samples).filter(F.col("_run") > 0)
    tripped = F.col("tripped")
    depth = F.coalesce(F.col("depth"), F.lit(0))
    e = s.groupBy(*SQ, "_run").agg(
        F.min(F.when(tripped, F.col("ts"))).alias("start_ts"),
        F.min(F.when(~tripped, F.col("ts"))).alias("end_ts"),
        F.min(F.when(tripped, F.struct((-depth).alias("neg"), F.col("ts").alias("ts"))))
        .alias("_peak"),
        F.max(F.when(tripped, F.col("held_bytes"))).alias("held_max"),
        F.max(F.when(tripped, F.col("held_messages"))).alias("held_messages_max"))
    return (e.withColumn("peak_ts", F.col("_peak.ts"))
            .withColumn("peak_depth", -F.col("_peak.neg"))
            .withColumn("closed", F.col("end_ts").isNotNull())
            .withColumn("drain_seconds", F.col("end_ts") - F.col("peak_ts"))
            .withColumn("duration", F.col("end_ts") - F.col("start_ts"))
            .withColumnRenamed("_run", "episode")
            .drop("_peak"))


def per_queue(samples: DataFrame, series: DataFrame, eps: DataFrame, psq: DataFrame,
              events: DataFrame) -> DataFrame:
    """One row per (vhost, queue) over the fleet (docs/pipeline.md, "Per queue")."""
    from_samples = samples.groupBy(*Q).agg(
        F.countDistinct("sidecar").alias("sidecars"),
        F.count(F.lit(1)).alias("samples"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
        F.max_by("policy", "ts").alias("policy"),
        F.max_by("capacity", "ts").alias("capacity"),
        F.max_by("resume", "ts").alias("resume"),
        F.max_by("max_messages", "ts").alias("max_messages"),
        F.max_by("resume_messages", "ts").alias("resume_messages"),
        F.max_by("deadline", "ts").alias("deadline"),
        F.max_by("overflow", "ts").alias("overflow"),
        F.percentile_approx("depth", PERCENTILES, ACCURACY).alias("_pct"),
        F.max("depth").alias("depth_max"),
        F.max("depth_msgs").alias("depth_messages_max"),
        F.max(F.when(F.col("capacity") > 0, F.greatest(F.col("depth") - F.col("capacity"),
                                                        F.lit(0)))).alias("peak_overshoot"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"),
        _sum0(F.col("ingress_messages")).alias("ingress_messages"))
    has_egress = F.col("egress_bytes").isNotNull()
    drain = has_egress & F.col("backlog")
    obs = F.col("observed_seconds")
    from_series = series.groupBy(*Q).agg(
        _sum0(obs).alias("observed_seconds"),
        _sum0(F.col("tripped_seconds")).alias("tripped_seconds"),
        (F.sum("egress_bytes") / F.sum(F.when(has_egress, obs))).alias("egress_rate"),
        (F.sum(F.when(drain, F.col("egress_bytes"))) / F.sum(F.when(drain, obs)))
        .alias("drain_rate"),
        (F.sum(F.when(drain, F.col("egress_messages"))) / F.sum(F.when(drain, obs)))
        .alias("drain_rate_messages"),
        _sum0(F.when(drain, obs)).alias("backlog_seconds"),
        F.percentile_approx(F.col("ingress_bytes") / obs, 0.99, ACCURACY)
        .alias("ingress_rate_p99"),
        F.percentile_approx(F.col("ingress_messages") / obs, 0.99, ACCURACY)
        .alias("ingress_messages_rate_p99"),
        F.max("held_bytes").alias("held_bytes_max"),
        _sum0(F.col("held_byte_seconds")).alias("held_byte_seconds"))
    trips = psq.groupBy(*Q).agg(F.max("trips").alias("trips"))
    closed = F.col("closed")
    from_eps = eps.groupBy(*Q).agg(
        F.count(F.lit(1)).alias("episodes"),
        F.count(F.when(~closed, 1)).alias("open_trips"),
        F.countDistinct("sidecar").alias("sidecars_tripping"),
        F.percentile_approx(F.when(closed, F.col("drain_seconds")), 0.5, ACCURACY)
        .alias("drain_seconds_p50"),
        F.max(F.when(closed, F.col("drain_seconds"))).alias("drain_seconds_max"),
        F.percentile_approx(F.when(closed, F.col("duration")), 0.9, ACCURACY)
        .alias("trip_seconds_p90"),
        F.percentile_approx("held_max", 0.9, ACCURACY).alias("_held_p90"),
        F.percentile_approx("held_messages_max", 0.9, ACCURACY).alias("_held_msgs_p90"))
    from_eps = (from_eps
                .withColumn("held_at_release_p90", F.col("_held_p90") * F.col("sidecars_tripping"))
                .withColumn("held_messages_at_release_p90",
                            F.col("_held_msgs_p90") * F.col("sidecars_tripping"))
                .drop("_held_p90", "_held_msgs_p90"))
    out = (from_samples.join(from_series, Q, "left").join(from_eps, Q, "left")
           .join(trips, Q, "left")
           .join(_count_events(events, Q), Q, "left"))
    out = (out.withColumn("depth_p50", F.col("_pct")[0]).withColumn("depth_p90", F.col("_pct")[1])
           .withColumn("depth_p99", F.col("_pct")[2]).drop("_pct")
           .withColumn("ingress_rate", _ratio("ingress_bytes", "observed_seconds"))
           .withColumn("tripped_share", _ratio("tripped_seconds", "observed_seconds")))
    return _fill_events(out).fillna(0, ["trips", "episodes", "open_trips",
                                        "sidecars_tripping"])


def per_sidecar(sidecars: DataFrame, psq: DataFrame, events: DataFrame) -> DataFrame:
    """One row per sidecar: its own records (held, alarms, drops) and its queues' totals."""
    alarm = F.col("alarm").isNotNull()
    own = sidecars.groupBy("sidecar").agg(
        F.count(F.lit(1)).alias("records"),
        F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"),
        _sum0(F.col("interval")).alias("observed_seconds"),
        F.max("held_bytes").alias("held_bytes_max"),
        F.max("held_messages").alias("held_messages_max"),
        _sum0(F.col("held_bytes") * F.col("interval")).alias("held_byte_seconds"),
        F.max("blocked_channels").alias("blocked_channels_max"),
        F.max("spooled_bytes").alias("spooled_bytes_max"),
        _sum0(F.when(alarm, F.col("interval"))).alias("alarm_seconds"),
        F.max("dropped_records").alias("dropped_records"))
    queues = psq.groupBy("sidecar").agg(
        F.count(F.lit(1)).alias("queues"),
        _sum0(F.col("tripped_seconds")).alias("tripped_queue_seconds"),
        _sum0(F.col("trips")).alias("trips"),
        _sum0(F.col("ingress_bytes")).alias("ingress_bytes"))
    out = (own.join(queues, "sidecar", "full")
           .join(_count_events(events, ["sidecar"]), "sidecar", "left")
           .withColumn("held_bytes_mean", _ratio("held_byte_seconds", "observed_seconds")))
    return _fill_events(out).fillna(0, ["queues", "trips"])
