"""Each aggregation on small hand-made telemetry; every expected number is worked out below.

The main fixture: one sidecar ``s1``, queue ``q`` in ``/``, capacity 1000, resume 600, one
sample a second at ts 1..10:

    ts        1    2    3     4     5    6    7    8    9   10
    depth     0  500 1200  1500   900  500  300  100    0    0
    ingress   0  500  700   300     0    0    0    0    0    0
    tripped   .    .    T     T     T    .    .    .    .    .
    trips     0    0    1     1     1    1    1    1    1    1
    held      0    0    0   200   400    0    0    0    0    0

Depth sorted: 0 0 0 100 300 500 500 900 1200 1500. Percentiles are nearest-rank (the
ceil(p * n)-th value): p50 = 5th = 300, p90 = 9th = 1200, p99 = 10th = 1500.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from floodwall_pipeline import aggregate
from floodwall_pipeline.load import Telemetry, load
from floodwall_pipeline.synthetic import generate
from tests.pipeline.conftest import write_ndjson

pytestmark = pytest.mark.load_tolerant

DEPTH = [0, 500, 1200, 1500, 900, 500, 300, 100, 0, 0]
INGRESS = [0, 500, 700, 300, 0, 0, 0, 0, 0, 0]
TRIPPED = [False, False, True, True, True, False, False, False, False, False]
TRIPS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
HELD = [0, 0, 0, 200, 400, 0, 0, 0, 0, 0]


def sample(sidecar: str, ts: float, depth: int, ingress: int, tripped: bool, trips: int,
           held: int = 0, queue: str = "q", capacity: int = 1000, resume: int = 600,
           interval: float = 1.0) -> dict[str, object]:
    return {"v": 1, "type": "sample", "ts": ts, "mono": ts, "seq": int(ts * 10),
            "sidecar": sidecar, "vhost": "/", "queue": queue, "interval": interval,
            "policy": "p", "capacity": capacity, "resume": resume, "max_messages": 0,
            "resume_messages": 0, "overflow": "hold", "deadline": 30.0,
            "depth_bytes": depth, "depth_messages": depth // 100,
            "broker_depth_bytes": None, "broker_depth_messages": None, "ready_count": None,
            "depth_known": True, "ingress_bytes": ingress, "ingress_messages": ingress // 100,
            "delivered_messages": 0, "tripped": tripped, "trips": trips,
            "tripped_seconds": 0.0, "blocked_publishers": 1 if held else 0,
            "held_bytes": held, "held_messages": held // 100, "spooled_bytes": 0}


def ev(sidecar: str, ts: float, name: str, queue: str = "q") -> dict[str, object]:
    return {"v": 1, "type": "event", "ts": ts, "mono": ts, "seq": 1000 + int(ts * 10),
            "sidecar": sidecar, "vhost": "/", "queue": queue, "event": name}


def side(sidecar: str, ts: float, held: int, alarm: str | None = None,
         dropped: int = 0) -> dict[str, object]:
    return {"v": 1, "type": "sidecar", "ts": ts, "mono": ts, "seq": 2000 + int(ts * 10),
            "sidecar": sidecar, "vhost": "", "queue": "", "interval": 1.0,
            "held_bytes": held, "held_messages": held // 100, "blocked_channels": 1 if held else 0,
            "spooled_bytes": 0, "alarm": alarm, "dropped_records": dropped}


def tables(t: Telemetry, resolution: float = 5.0) -> aggregate.Tables:
    return aggregate.Tables.of(t.samples, t.events, resolution)


def psq(t: Telemetry) -> DataFrame:
    return tables(t).psq


def episodes(t: Telemetry) -> DataFrame:
    return tables(t).episodes


def per_queue(t: Telemetry, resolution: float) -> DataFrame:
    return tables(t, resolution).queues


def one(df: DataFrame, **where: Any) -> dict[str, Any]:
    rows = [r.asDict() for r in df.collect()]
    found = [r for r in rows if all(r[k] == v for k, v in where.items())]
    assert len(found) == 1, (where, rows)
    return found[0]


@pytest.fixture(scope="module")
def single(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Telemetry:
    records: list[dict[str, object]] = [
        sample("s1", float(i + 1), DEPTH[i], INGRESS[i], TRIPPED[i], TRIPS[i], HELD[i])
        for i in range(10)]
    records += [ev("s1", 3.0, "trip"), ev("s1", 3.1, "hold"), ev("s1", 3.2, "hold"),
                ev("s1", 4.5, "deadline"), ev("s1", 4.6, "reject"), ev("s1", 6.0, "release"),
                ev("s1", 4.7, "deadline", queue="not-policed")]
    path = write_ndjson(tmp_path_factory.mktemp("single") / "t.ndjson", records)
    return load(spark, [str(path)])


def test_per_sidecar_queue(single: Telemetry) -> None:
    r = one(psq(single), queue="q")
    assert (r["samples"], r["observed_seconds"], r["first_ts"], r["last_ts"]) == (10, 10, 1, 10)
    assert (r["tripped_seconds"], r["tripped_share"], r["trips"]) == (3.0, 0.3, 1)
    assert (r["depth_p50"], r["depth_p90"], r["depth_p99"], r["depth_max"]) == (
        300, 1200, 1500, 1500)
    assert r["peak_overshoot"] == 500  # 1500 - 1000
    assert (r["ingress_bytes"], r["ingress_rate"]) == (1500, 150.0)  # 1500 B / 10 s
    # p99 over 5-second buckets (the recommendations' resolution): ts 1-4 (1500 B in 4 s),
    # 5-9 (0 B), 10 (0 B): rates 375, 0, 0
    assert r["ingress_rate_p99"] == 375
    assert (r["held_bytes_max"], r["held_bytes_mean"]) == (400, 60.0)  # (200+400) / 10 s
    assert (r["deadline_expiries"], r["rejects"], r["holds"]) == (1, 1, 2)
    assert (r["capacity"], r["resume"], r["policy"]) == (1000, 600, "p")
    assert r["ingress_share"] == 1.0  # the only sidecar


def test_episodes(single: Telemetry) -> None:
    # One run: tripped at ts 3, 4, 5, closed by the untripped sample at ts 6. Deepest at
    # ts 4 (1500): time to drain 6 - 4 = 2 s; the trip lasted 6 - 3 = 3 s; most held 400.
    e = one(episodes(single), queue="q")
    assert (e["start_ts"], e["peak_ts"], e["peak_depth"], e["end_ts"]) == (3, 4, 1500, 6)
    assert (e["drain_seconds"], e["duration"], e["held_max"], e["closed"]) == (2, 3, 400, True)


def test_queue_series_derives_egress(single: Telemetry) -> None:
    # 2-second buckets (floor(ts / 2)): b0 = {1}, b1 = {2, 3}, b2 = {4, 5}, b3 = {6, 7},
    # b4 = {8, 9}, b5 = {10}. depth_end = newest depth; egress = ingress - (depth_end -
    # previous depth_end), at least 0: b1 1200 - 1200 = 0, b2 300 + 300 = 600, b3 0 + 600,
    # b4 0 + 300, b5 0. Backlog where the previous depth_end > 0: b2, b3, b4.
    rows = sorted((r.asDict() for r in tables(single, 2.0).series.collect()),
                  key=lambda r: r["bucket_index"])
    assert [r["bucket"] for r in rows] == [0, 2, 4, 6, 8, 10]
    assert [r["depth_end"] for r in rows] == [0, 1200, 900, 300, 0, 0]
    assert [r["ingress_bytes"] for r in rows] == [0, 1200, 300, 0, 0, 0]
    assert [r["egress_bytes"] for r in rows] == [None, 0, 600, 600, 300, 0]
    assert [r["backlog"] for r in rows] == [False, False, True, True, True, False]
    assert [r["observed_seconds"] for r in rows] == [1, 2, 2, 2, 2, 1]
    assert [r["tripped_seconds"] for r in rows] == [0, 1, 2, 0, 0, 0]
    assert [r["held_bytes"] for r in rows] == [0, 0, 300, 0, 0, 0]  # (200 + 400) / 2 s


def test_per_queue(single: Telemetry) -> None:
    r = one(per_queue(single, 2.0), queue="q")
    assert (r["sidecars"], r["observed_seconds"], r["tripped_seconds"]) == (1, 10, 3)
    assert (r["trips"], r["episodes"], r["open_trips"]) == (1, 1, 0)
    assert (r["depth_p50"], r["depth_p90"], r["depth_p99"], r["peak_overshoot"]) == (
        300, 1200, 1500, 500)
    assert r["ingress_rate"] == 150.0
    # egress 1500 B over the 9 s of buckets b1..b5; drain 1500 B over the 6 s of b2..b4
    assert r["egress_rate"] == pytest.approx(1500 / 9)
    assert (r["drain_rate"], r["backlog_seconds"]) == (250.0, 6)
    assert r["ingress_rate_p99"] == 600  # bucket rates 0, 600, 150, 0, 0, 0
    assert (r["drain_seconds_p50"], r["drain_seconds_max"], r["trip_seconds_p90"]) == (2, 2, 3)
    assert (r["held_bytes_max"], r["held_at_release_p90"]) == (300, 400)
    assert (r["deadline_expiries"], r["rejects"]) == (1, 1)


@pytest.fixture(scope="module")
def fleet(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Telemetry:
    """Two sidecars on one queue (capacity 320), samples at the same ts 1..4.

        ts           1    2    3    4
        depth        0  300  350    0     (both see it)
        ingress s1   0  100  100    0
        ingress s2   0  200    0    0
        tripped s1   .    .    T    .     (trips 0 0 1 1)
        tripped s2   .    .    .    .     (its estimate stayed under capacity)
        held s1      0    0  100    0     (sidecar records; an alarm at ts 2; s2 dropped 3)
    """
    recs: list[dict[str, object]] = []
    depth, in1, in2 = [0, 300, 350, 0], [0, 100, 100, 0], [0, 200, 0, 0]
    for i in range(4):
        ts = float(i + 1)
        recs.append(sample("s1", ts, depth[i], in1[i], i == 2, 1 if i >= 2 else 0,
                           100 if i == 2 else 0, capacity=320, resume=200))
        recs.append(sample("s2", ts, depth[i], in2[i], False, 0, capacity=320, resume=200))
        recs.append(side("s1", ts, 100 if i == 2 else 0, alarm="memory" if i == 1 else None))
        recs.append(side("s2", ts, 0, dropped=3 if i == 3 else 0))
    recs.append(ev("s1", 3.5, "deadline"))
    base = tmp_path_factory.mktemp("fleet")
    write_ndjson(base / "s1" / "a.ndjson", recs[::2])
    write_ndjson(base / "s2" / "b.ndjson", recs[1::2])
    return load(spark, [str(base)])  # a directory: read recursively


def test_fleet_per_queue_sums_ingress_and_derives_egress(fleet: Telemetry) -> None:
    # buckets of 1 s: ingress 0, 300, 100, 0; egress b2 = 300 - 300 = 0, b3 = 100 - 50 = 50,
    # b4 = 0 + 350 = 350; backlog at b3, b4: drain (50 + 350) / 2 s = 200 B/s.
    r = one(per_queue(fleet, 1.0), queue="q")
    assert (r["sidecars"], r["samples"], r["ingress_bytes"]) == (2, 8, 400)
    assert (r["observed_seconds"], r["ingress_rate"]) == (4, 100.0)
    assert (r["egress_rate"], r["drain_rate"]) == (400 / 3, 200.0)
    assert (r["tripped_seconds"], r["trips"], r["sidecars_tripping"]) == (1, 1, 1)
    assert (r["depth_max"], r["peak_overshoot"], r["deadline_expiries"]) == (350, 30, 1)
    # the episode of s1 is closed at ts 4: deepest at ts 3, so 1 s to drain
    assert (r["drain_seconds_max"], r["held_at_release_p90"]) == (1, 100)


def test_per_sidecar(fleet: Telemetry) -> None:
    tb = tables(fleet)
    df = aggregate.per_sidecar(fleet.sidecars, tb.psq, tb.events)
    s1, s2 = one(df, sidecar="s1"), one(df, sidecar="s2")
    assert (s1["records"], s1["observed_seconds"], s1["queues"]) == (4, 4, 1)
    assert (s1["held_bytes_max"], s1["held_bytes_mean"], s1["alarm_seconds"]) == (100, 25, 1)
    assert (s1["trips"], s1["tripped_queue_seconds"], s1["deadline_expiries"]) == (1, 1, 1)
    assert (s1["ingress_bytes"], s2["ingress_bytes"]) == (200, 200)
    assert (s2["trips"], s2["held_bytes_max"], s2["dropped_records"]) == (0, 0, 3)


def test_each_sidecars_share_of_the_fleets_ingress(fleet: Telemetry) -> None:
    df = psq(fleet)
    s1, s2 = one(df, sidecar="s1"), one(df, sidecar="s2")
    assert (s1["ingress_bytes"], s2["ingress_bytes"]) == (200, 200)  # of the queue's 400
    assert (s1["ingress_share"], s2["ingress_share"]) == (0.5, 0.5)


def test_trips_come_from_the_counter(spark: SparkSession, tmp_path: Path) -> None:
    # A trip and release inside one interval shows only in the counter (0 -> 2 at ts 2);
    # a restart (counter back to 0, then 1) counts the new trip.
    recs = [sample("s", 1.0, 0, 0, False, 0), sample("s", 2.0, 0, 0, False, 2),
            sample("s", 3.0, 0, 0, True, 3), sample("s", 4.0, 0, 0, False, 0),
            sample("s", 5.0, 0, 0, True, 1)]
    t = load(spark, [str(write_ndjson(tmp_path / "t.ndjson", recs))])
    r = one(psq(t), queue="q")
    assert r["trips"] == 2 + 1 + 0 + 1
    e = sorted((x.asDict() for x in episodes(t).collect()),
               key=lambda x: x["episode"])
    assert [(x["start_ts"], x["end_ts"], x["closed"]) for x in e] == [
        (3, 4, True), (5, None, False)]


def test_quantized_is_exact_below_2_kib_and_within_a_thousandth_above(
        spark: SparkSession) -> None:
    values = [0, 1, 2047, 2048, 2049, 4095, 4097, 123_456, 2**31 + 12_345, 2**40 - 1]
    df = spark.createDataFrame([(v,) for v in values], "v long")
    got = [r["q"] for r in df.select(F.expr(aggregate.quantized("v")).alias("q")).collect()]
    assert got[:4] == [0, 1, 2047, 2048]
    for v, q in zip(values, got, strict=True):
        assert q <= v and v - q < max(v / 1024, 1), (v, q)
    assert len({q for v, q in zip(values, got, strict=True) if 4096 <= v < 8192}) == 1


def test_percentiles_from_the_histogram_are_percentile_disc_over_the_samples(
        spark: SparkSession) -> None:
    # Groups of 1 to 120 samples and a few large ones, many ties (small values) and few
    # (large ones): hist_percentiles must pick what percentile_disc over every sample picks.
    rnd = random.Random(20)
    rows = []
    sizes = [*range(1, 121), 997, 1000, 1001]
    for g, n in enumerate(sizes):
        rows += [(g, g % 3, rnd.choice((rnd.randrange(40), rnd.randrange(1 << 30))))
                 for _ in range(n)]
    rows += [(0, 0, None)] * 3  # no depth: left out, as percentile_disc leaves out nulls
    samples = spark.createDataFrame(rows, "sq long, q long, depth long")
    hist = aggregate.depth_histogram(samples)
    for key in ("sq", "q"):
        qd = samples.select(key, F.expr(aggregate.quantized("depth")).alias("_qd"))
        pcts = [F.expr(aggregate._pct_sql("_qd", p)).cast("long") for p in aggregate.PERCENTILES]
        want = {r[key]: tuple(r)[1:] for r in qd.groupBy(key).agg(*pcts).collect()}
        got = {r[key]: tuple(r)[1:] for r in aggregate.hist_percentiles(hist, key).collect()}
        assert got == want
        assert len(got) == (len(sizes) if key == "sq" else 3)


def test_figures_do_not_depend_on_how_the_samples_are_split(spark: SparkSession,
                                                            tmp_path: Path) -> None:
    # Two splits of the same records, each aggregated by a different number of tasks in a
    # different order: every figure, to the last bit.
    generate(tmp_path, sidecars=3, hours=0.05, queues=2, seed=5, jitter=True)
    t = load(spark, [str(tmp_path)])
    outputs = []
    for parts, key in ((1, "ts_ms"), (7, "sidecar")):
        samples = t.samples.repartition(parts, key).sortWithinPartitions(F.desc("ts_ms"))
        tb = aggregate.Tables.of(samples, t.events.repartition(parts), 5.0)
        outputs.append((
            sorted(map(repr, (r.asDict() for r in tb.queues.collect()))),
            sorted(map(repr, (r.asDict() for r in tb.psq.collect()))),
            sorted(map(repr, (r.asDict() for r in tb.series.collect())))))
        tb.unpersist()
    t.unpersist()
    assert outputs[0] == outputs[1]
    assert any("'trips': 0" not in q for q in outputs[0][0])  # the queues did trip


def fleet_sample(sidecar: str, ts: float, ingress: int, tripped: bool, blocked: int,
                 share: int | None, demand: float | None, members: int = 3
                 ) -> dict[str, object]:
    rec = sample(sidecar, ts, 400 if tripped else 100, ingress, tripped, 1 if ts >= 2 else 0,
                 capacity=320, resume=200)
    rec.update(blocked_publishers=blocked, fleet_members=members, fleet_share_bytes=share,
               fleet_demand_bytes_per_s=demand)
    return rec


@pytest.fixture(scope="module")
def shared(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Telemetry:
    """Three sidecars of one fleet on queue ``q``, tripped at ts 2 and 3 (samples 1 s apart):

        ts                 1     2     3     4
        tripped            .     T     T     .
        ingress   s1     100   300   300   100    admitted (while tripped) 600
                  s2     100   100   100   100    admitted 200
                  s3       0     0     0    50    admitted 0, publishers waiting at ts 2, 3
        share     s1/s2/s3: 100 at every sample (the fleet's equal split), s3 none at ts 1
        demand    s1 1000 B/s, s2 200, s3 100 (s3 none at ts 1)

    Contended: all three (s3 had publishers waiting). Jain's index of (600, 200, 0):
    800**2 / (3 * (600**2 + 200**2)) = 640000 / 1200000 = 0.5333...
    """
    recs: list[dict[str, object]] = []
    ingress = {"s1": [100, 300, 300, 100], "s2": [100, 100, 100, 100], "s3": [0, 0, 0, 50]}
    demand = {"s1": 1000.0, "s2": 200.0, "s3": 100.0}
    for i in range(4):
        ts, tripped = float(i + 1), i in (1, 2)
        for s in ("s1", "s2", "s3"):
            first_of_s3 = s == "s3" and i == 0
            recs.append(fleet_sample(s, ts, ingress[s][i], tripped,
                                     1 if s == "s3" and tripped else 0,
                                     None if first_of_s3 else 100,
                                     None if first_of_s3 else demand[s]))
    path = write_ndjson(tmp_path_factory.mktemp("shared") / "t.ndjson", recs)
    return load(spark, [str(path)])


def test_a_fleets_shares_demands_and_fairness(shared: Telemetry) -> None:
    tb = tables(shared, 1.0)
    s1, s2, s3 = (one(tb.psq, sidecar=s) for s in ("s1", "s2", "s3"))
    assert [s["admitted_bytes"] for s in (s1, s2, s3)] == [600, 200, 0]
    assert [s["admitted_share"] for s in (s1, s2, s3)] == [0.75, 0.25, 0.0]
    assert [s["contended"] for s in (s1, s2, s3)] == [True, True, True]
    assert [s["fleet_members_max"] for s in (s1, s2, s3)] == [3, 3, 3]
    assert [s["fleet_share_bytes_mean"] for s in (s1, s2, s3)] == [100, 100, 100]
    assert [s["fleet_demand_rate_mean"] for s in (s1, s2, s3)] == [1000, 200, 100]
    q = one(tb.queues, queue="q")
    assert (q["fleet_members_max"], q["admitted_bytes"], q["contended_sidecars"]) == (3, 800, 3)
    assert q["admitted_fairness"] == pytest.approx(640000 / 1200000)


def test_fairness_is_one_for_an_equal_split_and_null_without_a_fleet(
        single: Telemetry, spark: SparkSession, tmp_path: Path) -> None:
    recs = [fleet_sample(s, float(ts), 100, ts in (2, 3), 1 if ts in (2, 3) else 0, 150, 50.0)
            for ts in range(1, 5) for s in ("a", "b")]
    t = load(spark, [str(write_ndjson(tmp_path / "t.ndjson", recs))])
    q = one(tables(t, 1.0).queues, queue="q")
    assert (q["contended_sidecars"], q["admitted_fairness"]) == (2, 1.0)
    # one sidecar, no fleet fields: nothing about a fleet is made up
    r = one(tables(single).queues, queue="q")
    assert r["fleet_members_max"] is None
    s = one(tables(single).psq, queue="q")
    assert s["fleet_share_bytes_mean"] is None and s["fleet_demand_rate_mean"] is None
