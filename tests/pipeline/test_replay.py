"""The replay (pipeline/replay.py) on hand-made timelines: the proxy's rules, in figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from floodwall.cli import main
from floodwall.control.policy import Mode, Overflow, Policy
from floodwall_pipeline.replay import FIGURES, Bucket, RecordedPolicy, replay, timeline

pytestmark = pytest.mark.load_tolerant

KIB = 1024
BODY = 1024


def _buckets(offered: list[int], depths: list[int], policy: RecordedPolicy | None = None
             ) -> list[Bucket]:
    """One-second buckets: ``offered`` KiB each, the recorded depth (KiB) at each end; all
    offered was forwarded (the recording held nothing)."""
    return [Bucket(i, o * KIB, o, o * KIB, o, 0, d * KIB, d, 0, 0, False, 1, policy)
            for i, (o, d) in enumerate(zip(offered, depths, strict=True))]


def _steady(seconds: int = 30, offered: int = 30, drain: int = 10) -> list[Bucket]:
    """A producer at ``offered`` KiB/s, consumers at ``drain``: the recorded depth grows by
    the difference (nothing limited it)."""
    return _buckets([offered] * seconds + [0] * 60,
                    [(offered - drain) * (i + 1) for i in range(seconds)]
                    + [max(0, (offered - drain) * seconds - drain * (i + 1)) for i in range(60)])


def _policy(**kw: object) -> Policy:
    return Policy(name="p", queue="q", **kw)  # type: ignore[arg-type]


def test_hold_trips_once_and_feeds_the_queue_at_its_drain() -> None:
    t = timeline("/", "q", 1.0, _steady())
    assert t.drain[5] == pytest.approx(10 * KIB)
    o = replay(t, _policy(capacity=64 * KIB, resume=32 * KIB, deadline=600))
    f = o.figures()
    assert set(FIGURES) <= set(f)
    # held from about 3 s on while the producer's 900 KiB wait for the consumers (its
    # publishers use every token: Admission.busy keeps the queue held, also at resume),
    # released when the held bytes are in and the queue is down to resume: at about
    # 90 - 6.4 + 3.2 s
    assert f["trips"] == 1
    assert 80 < f["tripped_seconds"] < 88
    assert 64 * KIB <= f["depth_max"] <= 64 * KIB + 2 * BODY + 10 * KIB / 10
    assert f["peak_overshoot"] <= 2 * BODY + KIB
    assert f["admitted_bytes"] > 0 and f["held_byte_seconds"] > 0
    assert f["deadline_expiries"] == 0 and f["rejects"] == 0
    assert f["wait_max_seconds"] > 10


def test_the_recorded_policy_replayed_and_a_looser_one_never_trips() -> None:
    rec = RecordedPolicy("p", 64 * KIB, 32 * KIB, 0, 0, "hold", 600.0, "enforce")
    t = timeline("/", "q", 1.0, [dataclasses.replace(b, policy=rec) for b in _steady()])
    assert replay(t).trips == 1  # the policy in each bucket
    # consumers that kept up (the queue never had a backlog): nothing to hold
    calm = timeline("/", "q", 1.0, _buckets([30] * 30 + [0] * 60, [0] * 90, rec))
    assert replay(calm).trips == 0 and calm.drain[3] == 30 * KIB
    assert replay(t, _policy(capacity=100 * 1024 * KIB)).trips == 0


def test_reject_deadline_shadow_and_count_limits() -> None:
    t = timeline("/", "q", 1.0, _steady())
    rejected = replay(t, _policy(capacity=64 * KIB, resume=32 * KIB,
                                 overflow=Overflow.REJECT)).figures()
    assert rejected["rejects"] > 300 and rejected["held_byte_seconds"] == 0
    assert rejected["trips"] > 1  # nothing held: released at resume, tripped again
    expired = replay(t, _policy(capacity=64 * KIB, resume=32 * KIB, deadline=2.0)).figures()
    assert expired["deadline_expiries"] > 100 and expired["wait_max_seconds"] <= 3.0
    shadow = replay(t, _policy(capacity=64 * KIB, resume=32 * KIB, mode=Mode.SHADOW))
    assert shadow.trips == 1 and shadow.depth_max > 500 * KIB and shadow.held_byte_seconds == 0
    counted = replay(t, _policy(max_messages=100, resume_messages=50, deadline=600)).figures()
    assert counted["trips"] == 1 and counted["depth_max"] <= 104 * KIB


def test_spool_takes_what_hold_would_keep() -> None:
    t = timeline("/", "q", 1.0, _steady())
    f = replay(t, _policy(capacity=64 * KIB, resume=32 * KIB,
                          overflow=Overflow.SPOOL)).figures()
    assert f["spooled_bytes_max"] > 300 * KIB and f["held_byte_seconds"] == 0


def test_gaps_and_the_offered_load_while_held() -> None:
    b = _buckets([10] * 8, [5] * 8)
    held = [Bucket(x.index, x.offered_bytes + 4 * KIB, 14, x.forwarded_bytes,
                   x.forwarded_messages, 4 * KIB * (x.index + 1), x.depth_bytes,
                   x.depth_messages, 0, 0, True, 1, None) for x in b]
    # bucket 2 missing (its sample fell into bucket 3: bucket 3 stands for both), then
    # buckets 4 to 6: a gap of three seconds
    t = timeline("/", "q", 1.0, [held[0], held[1], held[3], held[7]])
    assert t.spans == (1, 1, 2, 1)
    assert t.gap_seconds == 3.0 and t.held_share == 1.0
    assert t.offered[0] == 14 * KIB


def test_a_bad_candidate_file_is_refused_before_spark_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('version: 1\npolicies:\n  - {name: x, match: {queue: "a"}, '
                   "capacity: 10KiB, resume: 20KiB}\n")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path), "--out", str(tmp_path / "o"),
                                       "--what-if", str(bad), "--what-if",
                                       str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2, result.output
    assert f"{bad}:3:" in result.output and "resume" in result.output
    assert "missing.yaml: No such file" in result.output
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_the_replay_starts_where_the_first_bucket_started() -> None:
    # The first bucket's depth is its end: 20 KiB of its 22 KiB offered stayed. Replayed as
    # recorded (nothing limited), every bucket ends at its recorded depth; counting the first
    # bucket's load on top of its end would start 20 KiB high and drain late.
    offered = [22, 30, 30, 0, 0, 0, 0, 0, 0]
    depths = [20, 48, 76, 74, 72, 70, 68, 66, 64]
    t = timeline("/", "q", 1.0, _buckets(offered, depths))
    o = replay(t)
    assert [round(d / KIB) for _, d in o.depth] == depths
    assert o.depth_max == 76 * KIB


def test_a_burst_that_ends_inside_a_bucket_ends_at_its_own_rate() -> None:
    # 100 KiB/s for a second, then 50 KiB in the next (the burst's last half second), the
    # consumers taking 40 KiB/s throughout: the queue peaks at 90 KiB halfway through the
    # second bucket, not at the 70 KiB its end shows. Spread evenly over that bucket, the
    # burst would never reach an 80 KiB capacity.
    offered = [0, 100, 50, 0, 0, 0]
    depths = [0, 60, 70, 30, 0, 0]
    t = timeline("/", "q", 1.0, _buckets(offered, depths))
    assert list(t.drain[1:4]) == [40 * KIB] * 3
    o = replay(t, _policy(capacity=80 * KIB, resume=40 * KIB, deadline=600)).figures()
    assert o["trips"] == 1
    assert o["depth_max"] >= 80 * KIB
    # and a bucket that offers more than the one before is spread evenly: the same load
    # rising instead of falling stays under the capacity
    rising = timeline("/", "q", 1.0, _buckets([0, 50, 100, 0, 0], [0, 10, 70, 30, 0]))
    assert replay(rising, _policy(capacity=80 * KIB, resume=40 * KIB)).trips == 0
