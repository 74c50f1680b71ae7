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

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

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


_VIEWS = itertools.count()


def sql(query: str, **frames: DataFrame) -> DataFrame:
    """``query``, Spark SQL reading each of ``frames`` as ``{name}``, as a DataFrame.

    The job's plans are written as SQL text: the JVM parses and analyses each in one call,
    where a plan built a Column function at a time costs three py4j round trips a function
    (about 5,000 a job). Each frame is a temporary view while the query is analysed (the
    plan keeps what it read; the view is dropped).
    """
    spark = next(iter(frames.values())).sparkSession
    names = {key: f"floodwall_{key}_{next(_VIEWS)}" for key in frames}
    for key, df in frames.items():
        df.createOrReplaceTempView(names[key])
        query = query.replace("{" + key + "}", names[key])
    try:
        return spark.sql(query)
    finally:
        for name in names.values():
            spark.catalog.dropTempView(name)


def quantized(c: str) -> str:
    """Column ``c`` (a non-negative integer) rounded down to ``SIGNIFICANT_BITS`` significant
    bits, as SQL: exact below 2**11 = 2048, else within 2**-10 (0.1 %) below. Deterministic,
    and a percentile over it keeps at most 1,024 distinct values per doubling of the range."""
    shift = f"CAST(greatest(floor(log2({c})) - {SIGNIFICANT_BITS - 1}, 0) AS INT)"
    return f"shiftleft(shiftright({c}, {shift}), {shift})"


def _pct_sql(column: str, p: float) -> str:
    """The nearest-rank percentile, as SQL: the smallest value with at least ``p`` of the
    rows at or below it (nulls left out)."""
    return f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})"


# SQL text of the expressions the plans share (doubles written as ``1000.0D``: a bare
# ``1000.0`` is a decimal in Spark SQL).
def _seconds(c: str) -> str:
    return f"{c} / 1000.0D"


def _per_second(num: str, ms: str) -> str:
    """``num`` per second over ``ms`` milliseconds (null without time)."""
    return f"CASE WHEN {ms} > 0 THEN {num} * 1000.0D / {ms} END"


def _ratio(num: str, den: str) -> str:
    return f"CASE WHEN {den} > 0 THEN {num} / {den} END"


_IV = "coalesce(iv_ms, 0)"
#: A sample's place in its sidecar's time order as one long: (ts, then seq). Two samples
#: of one sidecar and queue in the same millisecond with seqs 2**20 apart would tie: one
#: process writes far fewer than 2**20 records per millisecond.
_KEY = f"(ts_ms * {1 << _SEQ_BITS} + (seq & {(1 << _SEQ_BITS) - 1}))"


def _packed(offset: str, value: str) -> str:
    return (f"CASE WHEN {value} IS NOT NULL THEN {offset} * {1 << _VALUE_BITS} "
            f"+ least({value}, {_VALUE_MAX}) END")


def _cols(*names: str) -> str:
    return ", ".join(names)


_EVENT_SUMS = ", ".join(f"sum({c}) AS {c}" for c in EVENT_COUNTS)
_EVENTS_FILLED = ", ".join(f"coalesce({c}, 0) AS {c}" for c in EVENT_COUNTS)


def event_counts(events: DataFrame) -> DataFrame:
    """One row per (sidecar, vhost, queue) with events: deadline expiries, rejects, holds,
    signals (``signal`` names no queue: it counts under queue "")."""
    return sql("""
        SELECT sidecar, vhost, queue,
               count(CASE WHEN event = 'deadline' THEN 1 END) AS deadline_expiries,
               count(CASE WHEN event = 'reject' THEN 1 END) AS rejects,
               count(CASE WHEN event = 'hold' THEN 1 END) AS holds,
               count(CASE WHEN event = 'signal' THEN 1 END) AS signals
        FROM {events} GROUP BY sidecar, vhost, queue""", events=events)


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
    tripped = "coalesce(tripped, false)"
    before = "lag(trips) OVER w"
    # The deepest tripped sample, the earliest if several: the greatest (depth, -offset in
    # the run) packed in a long (a fixed-width buffer: hash aggregation, no second sort).
    offset = f"least(ts_ms - _run_start, {_OFFSET_MAX})"
    peak_key = f"least(depth, {_DEPTH_MAX}) * {_OFFSET_MAX + 1} + ({_OFFSET_MAX} - {offset})"
    return sql(f"""
        WITH s AS (
          SELECT sq, ts_ms, {_KEY} AS _key, tripped, trips, coalesce(depth, 0) AS depth,
                 held_bytes, held_messages
          FROM {{samples}}),
        t AS (
          SELECT sq, ts_ms, _key, {tripped} AS tripped, depth, held_bytes, held_messages,
                 coalesce(CASE WHEN {before} IS NULL THEN CASE WHEN {tripped} THEN 1 ELSE 0 END
                               WHEN trips >= {before} THEN trips - {before}
                               ELSE trips END, 0) AS _new,
                 {tripped} AND NOT coalesce(lag({tripped}) OVER w, false) AS _start
          FROM s WINDOW w AS (PARTITION BY sq ORDER BY _key)),
        r AS (
          SELECT *, sum(CAST(_start AS INT)) OVER running AS run,
                 max(CASE WHEN _start THEN ts_ms END) OVER running AS _run_start
          FROM t WINDOW running AS (PARTITION BY sq ORDER BY _key
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))
        SELECT sq, run, sum(_new) AS new_trips,
               min(CASE WHEN tripped THEN ts_ms END) AS start_ms,
               min(CASE WHEN NOT tripped THEN ts_ms END) AS end_ms,
               max(CASE WHEN tripped THEN depth END) AS peak_depth,
               max_by(CASE WHEN tripped THEN ts_ms END,
                      CASE WHEN tripped THEN {peak_key} END) AS peak_ms,
               max(CASE WHEN tripped THEN held_bytes END) AS held_max,
               max(CASE WHEN tripped THEN held_messages END) AS held_messages_max
        FROM r GROUP BY sq, run""", samples=samples)


def depth_histogram(samples: DataFrame) -> DataFrame:
    """One row per (``sq``, ``q``, quantized depth ``_qd``) with its count of samples ``n``:
    the depth percentiles of a sidecar's queue and of the fleet's come from it
    (``hist_percentiles``). A hash aggregation of fixed-width rows (at most 1,024 values
    per doubling of the depth per group: ``quantized``), where a percentile over the samples
    would keep every value of a group in an object buffer."""
    return sql(f"""
        SELECT sq, q, _qd, count(1) AS n
        FROM (SELECT sq, q, {quantized('depth')} AS _qd FROM {{samples}})
        WHERE _qd IS NOT NULL GROUP BY sq, q, _qd""", samples=samples)


def _hist_percentiles_sql(hist: str, key: str) -> str:
    h = hist if key == "sq" else f"(SELECT {key}, _qd, sum(n) AS n FROM {hist} GROUP BY {key}, _qd)"
    picks = ", ".join(f"min(CASE WHEN _cume >= {p}D THEN _qd END) AS depth_p{round(p * 100)}"
                      for p in PERCENTILES)
    return f"""
        SELECT {key}, {picks}
        FROM (SELECT {key}, _qd,
                     sum(n) OVER (PARTITION BY {key} ORDER BY _qd
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
                     / sum(n) OVER (PARTITION BY {key}) AS _cume
              FROM {h})
        GROUP BY {key}"""


def hist_percentiles(hist: DataFrame, key: str) -> DataFrame:
    """``depth_p50``, ``depth_p90``, ``depth_p99`` per ``key`` (``sq`` or ``q``) from
    ``depth_histogram``: nearest-rank, the smallest value whose share of the values at or
    below it is at least p (the same as ``percentile_disc`` over the samples: checked in
    tests/pipeline/test_aggregate.py). Exact: counts are integers; one division each."""
    return sql(_hist_percentiles_sql("{hist}", key), hist=hist)


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
    iv = _IV
    offset = f"(ts_ms - bucket_index * {res_ms})"
    check = "hash(sidecar, vhost, queue)"  # a second hash of the names: see per_sidecar_queue
    return sql(f"""
        SELECT q, sq, bucket_index,
               count(1) AS samples,
               min(ts_ms) AS first_ms, max(ts_ms) AS last_ms,
               max({_KEY}) AS last_key,
               coalesce(sum({iv}), 0) AS observed_ms,
               coalesce(sum(CASE WHEN tripped THEN {iv} END), 0) AS tripped_ms,
               coalesce(sum(ingress_bytes), 0) AS ingress_bytes,
               coalesce(sum(ingress_messages), 0) AS ingress_messages,
               coalesce(sum(held_bytes * {iv}), 0) AS held_bms,
               -- the pace: forwarded while held (admitted), and the drain estimate x time
               coalesce(sum(CASE WHEN tripped THEN ingress_bytes END), 0) AS admitted_bytes,
               coalesce(sum(drain_bps * {iv}), 0) AS drain_bms,
               -- the fleet as this sidecar saw it (null with --fleet off)
               max(fleet_members) AS fleet_members,
               sum(fleet_share * {iv}) AS share_bms,
               sum(CASE WHEN fleet_share IS NOT NULL THEN {iv} END) AS share_ms,
               sum(CAST(round(fleet_demand_bps) AS BIGINT) * {iv}) AS demand_bms,
               sum(CASE WHEN fleet_demand_bps IS NOT NULL THEN {iv} END) AS demand_ms,
               max(CASE WHEN tripped THEN blocked_publishers END) AS blocked_tripped_max,
               max({_packed(offset, 'depth')}) AS last_depth,
               max({_packed(offset, 'depth_msgs')}) AS last_msgs,
               max(depth) AS depth_max,
               max(depth_msgs) AS depth_msgs_max,
               max(CASE WHEN capacity > 0 THEN greatest(depth - capacity, 0) END)
                 AS overshoot_max,
               max(held_bytes) AS held_max,
               max(spooled_bytes) AS spooled_max,
               max(blocked_publishers) AS blocked_max,
               min({check}) AS _check_min, max({check}) AS _check_max,
               max(capacity) AS capacity, max(resume) AS resume
        FROM (SELECT *, ts_ms div {res_ms} AS bucket_index FROM {{samples}})
        GROUP BY q, sq, bucket_index""", samples=samples)


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
    contiguous = "lag(bucket_index) OVER w = bucket_index - 1"
    prev_b, prev_m = "lag(depth_end) OVER w", "lag(depth_msgs_end) OVER w"
    egress_b = (f"CASE WHEN {contiguous} AND {prev_b} IS NOT NULL AND depth_end IS NOT NULL "
                f"THEN greatest(ingress_bytes - (depth_end - {prev_b}), 0) END")
    egress_m = (f"CASE WHEN {contiguous} AND {prev_m} IS NOT NULL "
                f"AND depth_msgs_end IS NOT NULL "
                f"THEN greatest(ingress_messages - (depth_msgs_end - {prev_m}), 0) END")
    return sql(f"""
        WITH series AS (
          SELECT q, bucket_index,
                 max(observed_ms) AS observed_ms, max(tripped_ms) AS tripped_ms,
                 sum(ingress_bytes) AS ingress_bytes, sum(ingress_messages) AS ingress_messages,
                 sum(held_bms) AS held_bms, sum(admitted_bytes) AS admitted_bytes,
                 max(drain_bms) AS drain_bms,  -- one queue's drain: any sidecar's estimate
                 max(last_depth) & {_VALUE_MAX} AS depth_end,
                 max(last_msgs) & {_VALUE_MAX} AS depth_msgs_end,
                 max(depth_max) AS depth_max, max(capacity) AS capacity,
                 max(resume) AS resume, count(1) AS sidecars
          FROM {{level1}} GROUP BY q, bucket_index),
        buckets AS (
          SELECT *, bucket_index * {res_ms} / 1000.0D AS bucket,
                 {_seconds('observed_ms')} AS observed_seconds,
                 {_seconds('tripped_ms')} AS tripped_seconds,
                 {_ratio('held_bms', 'observed_ms')} AS held_bytes,
                 drain_bms / 1000.0D AS drained_bytes,
                 {egress_b} AS egress_bytes, {egress_m} AS egress_messages,
                 coalesce(({contiguous}) AND ({prev_b} > 0), false) AS backlog
          FROM series WINDOW w AS (PARTITION BY q ORDER BY bucket_index))
        SELECT /*+ BROADCAST(n) */ *
        FROM buckets JOIN (SELECT q, first(vhost) AS vhost, first(queue) AS queue
                           FROM {{names}} GROUP BY q) n USING (q)""",
               level1=level1, names=names)


#: per_sidecar_queue's columns, in the order of its rows (summary.json keeps it).
_PSQ_COLUMNS = (
    *SQ, "sq", *POLICY_FIELDS, "q", "samples", "depth_max", "depth_messages_max",
    "peak_overshoot", "ingress_bytes", "ingress_messages", "ingress_rate_p99", "held_bytes_max",
    "spooled_bytes_max", "blocked_publishers_max", "admitted_bytes", "fleet_members_max",
    "_clash", "depth_p50", "depth_p90", "depth_p99")


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
    named = (*SQ, *POLICY_FIELDS)
    fleet = "OVER (PARTITION BY q)"
    return sql(f"""
        WITH totals AS (
          SELECT sq, max(q) AS q, sum(samples) AS samples,
                 min(first_ms) AS _first, max(last_ms) AS _last, max(last_key) AS _key,
                 sum(observed_ms) AS observed_ms, sum(tripped_ms) AS tripped_ms,
                 max(depth_max) AS depth_max, max(depth_msgs_max) AS depth_messages_max,
                 max(overshoot_max) AS peak_overshoot,
                 sum(ingress_bytes) AS ingress_bytes, sum(ingress_messages) AS ingress_messages,
                 {_pct_sql('_rate', 0.99)} AS ingress_rate_p99,
                 max(held_max) AS held_bytes_max, sum(held_bms) AS _held_bms,
                 max(spooled_max) AS spooled_bytes_max,
                 max(blocked_max) AS blocked_publishers_max,
                 coalesce(sum(admitted_bytes), 0) AS admitted_bytes,
                 max(blocked_tripped_max) AS _blocked_tripped,
                 max(fleet_members) AS fleet_members_max,
                 sum(share_bms) AS _share_bms, sum(share_ms) AS _share_ms,
                 sum(demand_bms) AS _demand_bms, sum(demand_ms) AS _demand_ms,
                 min(_check_min) != max(_check_max) AS _clash
          FROM (SELECT *, {_per_second('ingress_bytes', 'observed_ms')} AS _rate
                FROM {{level1}})
          GROUP BY sq),
        latest AS (
          -- one row per sq (two would be one sample written twice: take the greatest)
          SELECT /*+ BROADCAST(k) */ s.sq, {', '.join(f'max(s.{c}) AS {c}' for c in named)}
          FROM (SELECT sq, {_KEY} AS _key, {_cols(*named)} FROM {{samples}}) s
          JOIN (SELECT sq, _key FROM totals) k ON s.sq = k.sq AND s._key = k._key
          GROUP BY s.sq),
        pct AS ({_hist_percentiles_sql('{hist}', 'sq')}),
        trips AS (SELECT sq, sum(new_trips) AS trips FROM {{run_rows}} GROUP BY sq),
        joined AS (
          SELECT * FROM latest JOIN totals USING (sq) LEFT JOIN pct USING (sq)
          LEFT JOIN trips USING (sq) LEFT JOIN {{events}} USING (sidecar, vhost, queue))
        SELECT {_cols(*_PSQ_COLUMNS)}, coalesce(trips, 0) AS trips, {_EVENTS_FILLED},
               {_seconds('_first')} AS first_ts, {_seconds('_last')} AS last_ts,
               {_seconds('observed_ms')} AS observed_seconds,
               {_seconds('tripped_ms')} AS tripped_seconds,
               {_per_second('ingress_bytes', 'observed_ms')} AS ingress_rate,
               {_ratio('tripped_ms', 'observed_ms')} AS tripped_share,
               {_ratio('_held_bms', 'observed_ms')} AS held_bytes_mean,
               CASE WHEN sum(ingress_bytes) {fleet} > 0
                    THEN ingress_bytes / sum(ingress_bytes) {fleet} END AS ingress_share,
               CASE WHEN sum(admitted_bytes) {fleet} > 0
                    THEN admitted_bytes / sum(admitted_bytes) {fleet} END AS admitted_share,
               -- contended: it had publishers waiting while the queue was tripped, or was
               -- admitted some then (the sidecars a fair release splits among)
               admitted_bytes > 0 OR coalesce(_blocked_tripped, 0) > 0 AS contended,
               {_ratio('_share_bms', '_share_ms')} AS fleet_share_bytes_mean,
               {_ratio('_demand_bms', '_demand_ms')} AS fleet_demand_rate_mean
        FROM joined""", samples=samples, run_rows=run_rows, level1=level1, hist=hist,
               events=events)


def episodes(run_rows: DataFrame, names: DataFrame) -> DataFrame:
    """One row per trip of each (sidecar, queue) (``runs`` without run 0; ``names``: ``sq``
    to ``q``, sidecar, vhost, queue).

    ``drain_seconds = end - peak`` (peak: the run's deepest sample, the earliest if
    several); ``duration = end - start``; ``held_max``: most held during the run.
    """
    drain_ms, duration_ms = "(end_ms - peak_ms)", "(end_ms - start_ms)"
    return sql(f"""
        SELECT /*+ BROADCAST(n) */ sq, q, sidecar, vhost, queue, run AS episode,
               {_seconds('start_ms')} AS start_ts, {_seconds('end_ms')} AS end_ts,
               {_seconds('peak_ms')} AS peak_ts, peak_depth, end_ms IS NOT NULL AS closed,
               {drain_ms} AS drain_ms, {duration_ms} AS duration_ms,
               {_seconds(drain_ms)} AS drain_seconds, {_seconds(duration_ms)} AS duration,
               held_max, held_messages_max
        FROM (SELECT * FROM {{run_rows}} WHERE run > 0)
        JOIN (SELECT sq, q, sidecar, vhost, queue FROM {{names}}) n USING (sq)""",
               run_rows=run_rows, names=names)


def _fairness() -> str:
    """Jain's index of the bytes admitted while tripped, over the contended sidecars of a
    queue (``per_sidecar_queue``'s ``contended``): ``(sum a)**2 / (n * sum a**2)``, 1 when
    they got equal parts, 1/n when one got everything; null with none contended or nothing
    admitted. All of them had publishers waiting, so each wanted more than it got: an equal
    split is the max-min fair one."""
    a = "CASE WHEN contended THEN CAST(admitted_bytes AS DECIMAL(38,0)) END"
    n = f"count({a})"
    # exact (integers): the order cannot change them
    total, squares = f"sum({a})", f"sum({a} * {a})"
    return (f"{n} AS contended_sidecars, "
            f"CASE WHEN {n} > 0 AND {squares} > 0 THEN CAST({total} * {total} AS DOUBLE) "
            f"/ CAST({n} * {squares} AS DOUBLE) END AS admitted_fairness")


def per_queue(hist: DataFrame, series: DataFrame, eps: DataFrame, psq: DataFrame,
              events: DataFrame) -> DataFrame:
    """One row per (vhost, queue) over the fleet (docs/pipeline.md, "Per queue");
    ``series`` at the recommendations' resolution, ``events`` is ``event_counts``."""
    # From the sidecars' rows: sums and extremes, the most trips of any, and the policy of
    # the sidecar that sampled last (the greatest name on a tie).
    policy = ", ".join(f"max_by({c}, struct(last_ts, sidecar)) AS {c}" for c in POLICY_FIELDS)
    has_egress = "egress_bytes IS NOT NULL"
    drain = f"({has_egress} AND backlog)"
    return sql(f"""
        WITH from_psq AS (
          SELECT q, max(vhost) AS vhost, max(queue) AS queue, count(1) AS sidecars,
                 sum(samples) AS samples, min(first_ts) AS first_ts, max(last_ts) AS last_ts,
                 {policy},
                 max(depth_max) AS depth_max, max(depth_messages_max) AS depth_messages_max,
                 max(peak_overshoot) AS peak_overshoot,
                 max(spooled_bytes_max) AS spooled_bytes_max,
                 sum(ingress_bytes) AS ingress_bytes, sum(ingress_messages) AS ingress_messages,
                 max(trips) AS trips, max(fleet_members_max) AS fleet_members_max,
                 sum(admitted_bytes) AS admitted_bytes, {_fairness()}
          FROM {{psq}} GROUP BY q),
        from_samples AS ({_hist_percentiles_sql('{hist}', 'q')}),
        from_series AS (
          SELECT q, observed_ms, tripped_ms, backlog_ms, ingress_rate_p99,
                 ingress_messages_rate_p99, held_bytes_max,
                 {_per_second('_egress', '_egress_ms')} AS egress_rate,
                 {_per_second('_drain', 'backlog_ms')} AS drain_rate,
                 {_per_second('_drain_m', 'backlog_ms')} AS drain_rate_messages,
                 {_seconds('_held_bms')} AS held_byte_seconds
          FROM (
            SELECT q, coalesce(sum(observed_ms), 0) AS observed_ms,
                   coalesce(sum(tripped_ms), 0) AS tripped_ms,
                   sum(egress_bytes) AS _egress,
                   sum(CASE WHEN {has_egress} THEN observed_ms END) AS _egress_ms,
                   sum(CASE WHEN {drain} THEN egress_bytes END) AS _drain,
                   sum(CASE WHEN {drain} THEN egress_messages END) AS _drain_m,
                   coalesce(sum(CASE WHEN {drain} THEN observed_ms END), 0) AS backlog_ms,
                   {_pct_sql('_rate', 0.99)} AS ingress_rate_p99,
                   {_pct_sql('_rate_m', 0.99)} AS ingress_messages_rate_p99,
                   max(held_bytes) AS held_bytes_max,
                   coalesce(sum(held_bms), 0) AS _held_bms
            FROM (SELECT *, {_per_second('ingress_bytes', 'observed_ms')} AS _rate,
                         {_per_second('ingress_messages', 'observed_ms')} AS _rate_m
                  FROM {{series}})
            GROUP BY q)),
        from_eps AS (
          SELECT q, episodes, open_trips, sidecars_tripping,
                 {_seconds('_drain_p50')} AS drain_seconds_p50,
                 {_seconds('_drain_max')} AS drain_seconds_max,
                 {_seconds('_trip_p90')} AS trip_seconds_p90,
                 CAST(_held_p90 * sidecars_tripping AS BIGINT) AS held_at_release_p90,
                 CAST(_held_msgs_p90 * sidecars_tripping AS BIGINT)
                   AS held_messages_at_release_p90
          FROM (
            SELECT q, count(1) AS episodes, count(CASE WHEN NOT closed THEN 1 END) AS open_trips,
                   count(DISTINCT sq) AS sidecars_tripping,
                   {_pct_sql('_drain_closed', 0.5)} AS _drain_p50,
                   max(_drain_closed) AS _drain_max,
                   {_pct_sql('_dur_closed', 0.9)} AS _trip_p90,
                   {_pct_sql('held_max', 0.9)} AS _held_p90,
                   {_pct_sql('held_messages_max', 0.9)} AS _held_msgs_p90
            FROM (SELECT *, CASE WHEN closed THEN drain_ms END AS _drain_closed,
                         CASE WHEN closed THEN duration_ms END AS _dur_closed FROM {{eps}})
            GROUP BY q)),
        ev AS (SELECT vhost, queue, {_EVENT_SUMS} FROM {{events}} GROUP BY vhost, queue),
        joined AS (
          SELECT * FROM from_psq LEFT JOIN from_samples USING (q)
          LEFT JOIN from_series USING (q) LEFT JOIN from_eps USING (q)
          LEFT JOIN ev USING (vhost, queue))
        SELECT {_PER_QUEUE_SELECT}
        FROM joined""", psq=psq, hist=hist, series=series, eps=eps, events=events)


_PER_QUEUE_FILLED = ("trips", "episodes", "open_trips", "sidecars_tripping", *EVENT_COUNTS)
#: per_queue's columns, in the order of its rows (summary.json keeps it).
_PER_QUEUE_COLUMNS = (
    "vhost", "queue", "sidecars", "samples", "first_ts", "last_ts", *POLICY_FIELDS,
    "depth_max", "depth_messages_max", "peak_overshoot", "spooled_bytes_max", "ingress_bytes",
    "ingress_messages", "trips", "fleet_members_max", "admitted_bytes", "contended_sidecars",
    "admitted_fairness", "depth_p50", "depth_p90", "depth_p99", "ingress_rate_p99",
    "ingress_messages_rate_p99", "held_bytes_max", "egress_rate", "drain_rate",
    "drain_rate_messages", "held_byte_seconds", "episodes", "open_trips", "sidecars_tripping",
    "drain_seconds_p50", "drain_seconds_max", "trip_seconds_p90", "held_at_release_p90",
    "held_messages_at_release_p90", *EVENT_COUNTS)
_PER_QUEUE_SELECT = ", ".join(
    [f"coalesce({c}, 0) AS {c}" if c in _PER_QUEUE_FILLED else c for c in _PER_QUEUE_COLUMNS]
    + [f"{_seconds('observed_ms')} AS observed_seconds",
       f"{_seconds('tripped_ms')} AS tripped_seconds",
       f"{_seconds('backlog_ms')} AS backlog_seconds",
       f"{_per_second('ingress_bytes', 'observed_ms')} AS ingress_rate",
       f"{_ratio('tripped_ms', 'observed_ms')} AS tripped_share"])


def per_sidecar(sidecars: DataFrame, psq: DataFrame, events: DataFrame) -> DataFrame:
    """One row per sidecar: its own records (held, alarms, drops) and its queues' totals."""
    iv = _IV
    return sql(f"""
        WITH own AS (
          SELECT sidecar, count(1) AS records, min(ts_ms) AS _first, max(ts_ms) AS _last,
                 coalesce(sum({iv}), 0) AS observed_ms, max(iv_ms) AS _interval_ms,
                 max(held_bytes) AS held_bytes_max, max(held_messages) AS held_messages_max,
                 coalesce(sum(held_bytes * {iv}), 0) AS _held_bms,
                 max(blocked_channels) AS blocked_channels_max,
                 max(spooled_bytes) AS spooled_bytes_max,
                 coalesce(sum(CASE WHEN alarm IS NOT NULL THEN {iv} END), 0) AS _alarm_ms,
                 max(dropped_records) AS dropped_records
          FROM {{sidecars}} GROUP BY sidecar),
        queues AS (
          SELECT sidecar, count(1) AS queues,
                 coalesce(sum(CAST(round(tripped_seconds * 1000) AS BIGINT)), 0) AS _tripped_ms,
                 coalesce(sum(trips), 0) AS trips,
                 coalesce(sum(ingress_bytes), 0) AS ingress_bytes
          FROM {{psq}} GROUP BY sidecar),
        ev AS (SELECT sidecar, {_EVENT_SUMS} FROM {{events}} GROUP BY sidecar)
        SELECT sidecar, records, held_bytes_max, held_messages_max, blocked_channels_max,
               spooled_bytes_max, dropped_records, coalesce(queues, 0) AS queues,
               coalesce(trips, 0) AS trips, ingress_bytes, {_EVENTS_FILLED},
               {_seconds('_first')} AS first_ts, {_seconds('_last')} AS last_ts,
               {_seconds('observed_ms')} AS observed_seconds,
               {_seconds("_interval_ms")} AS `interval`,
               {_seconds('_held_bms')} AS held_byte_seconds,
               {_seconds('_alarm_ms')} AS alarm_seconds,
               coalesce({_seconds('_tripped_ms')}, 0) AS tripped_queue_seconds,
               {_ratio('_held_bms', 'observed_ms')} AS held_bytes_mean
        FROM own FULL JOIN queues USING (sidecar) LEFT JOIN ev USING (sidecar)""",
               sidecars=sidecars, psq=psq, events=events)


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
    psq_rows: list[dict[str, Any]]  # psq's rows, collected by the job that keeps them

    @classmethod
    def of(cls, samples: DataFrame, events: DataFrame, resolution: float) -> Tables:
        # The intermediate tables are local checkpoints, not cached plans: each later plan
        # then starts from their rows instead of carrying (and re-optimizing, and matching
        # against the cache) every plan below them. They are kept by the first job that
        # computes them: the one that collects psq's rows keeps all five.
        ev = keep(event_counts(events))
        level1 = keep(sidecar_series(samples, resolution))
        run_rows = keep(runs(samples))
        hist = keep(depth_histogram(samples))
        psq = keep(per_sidecar_queue(samples, run_rows, level1, hist, ev))
        psq_rows = [r.asDict() for r in psq.collect()]
        eps = episodes(run_rows, psq)
        series = keep(queue_series(level1, psq, resolution))
        queues = per_queue(hist, series, eps, psq, ev)
        return cls(resolution, ev, level1, run_rows, hist, psq, eps, series, queues, psq_rows)

    def unpersist(self) -> None:
        for df in (self.events, self.level1, self.runs, self.hist, self.psq, self.series):
            release(df)
