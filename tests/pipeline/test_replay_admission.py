"""One model: the what-if replay's admission while held is the proxy's, for the same inputs
(a count of the queue, its drain, a fleet member's share), and a fleet's sidecars replayed
each with its share of the room."""

from __future__ import annotations

import dataclasses
import math

import pytest

from floodwall.control.admission import HOT_INTERVAL, allowance, credit_time
from floodwall.control.controller import FlowController
from floodwall.control.fleet import ShareRule
from floodwall.control.policy import Policy, parse_policies
from floodwall_pipeline.replay import Bucket, admission_room, replay, timeline
from tests.test_gate import Router

pytestmark = pytest.mark.load_tolerant

KEY = ("/", "orders.a")
RTT = 0.001
BODY = 1000
LIMITS = {
    "bytes": "capacity: 10000, resume: 5000",
    "messages": "max_messages: 10, resume_messages: 5",
    "both": "capacity: 12000, resume: 6000, max_messages: 8, resume_messages: 4",
}
SHARES = {
    "alone": None,
    "member": ShareRule("me", (("b", 1000.0), ("c", None), ("me", 3000.0))),
    "deaf": ShareRule("me", (("b", 9000.0), ("me", 9000.0)), fallback_size=3),
}


def held(limits: str, ready: int, share: ShareRule | None) -> tuple[FlowController, float]:
    """orders.a counted empty, 15 publishes of BODY forwarded (over every limit: tripped),
    counted full, then ``ready`` left 0.2 s later: nothing in flight at the last count."""
    policies = parse_policies(f"version: 1\npolicies:\n  - {{name: orders, match: "
                              f"{{queue: \"orders.*\"}}, {limits}}}\n")
    fc = FlowController(Router(), policies)
    t = 100.0
    fc.queue_seen(KEY, t)
    fc.sampled_ready_count(KEY, t, 0, RTT, t + RTT)
    for _ in range(15):
        fc.forwarded("/", frozenset({"orders.a"}), BODY, t + 0.5)
    assert KEY in fc.tripped
    fc.set_share(KEY, share, t + 0.6)
    for at, n in ((t + 1.0, 15), (t + 1.2, ready)):
        fc.sampled_ready_count(KEY, at, n, RTT, at + RTT)
    return fc, t + 1.2 + RTT


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("ready", [0, 3, 6, 9, 12, 15])
@pytest.mark.parametrize("limits", LIMITS)
def test_the_replay_admits_what_the_proxy_admits(limits: str, ready: int, share: str) -> None:
    fc, now = held(LIMITS[limits], ready, SHARES[share])
    q = fc.queues[KEY]
    depth = q.depth
    a = allowance(q, now, HOT_INTERVAL)
    assert a is not None
    # the proxy: the allowance less what the count holds (everything was forwarded before it)
    by_bytes = a.bytes - depth.forwarded_bytes_total
    by_messages = (a.messages - depth.forwarded_messages_total) * BODY
    proxy = max(0.0, min(by_bytes, by_messages))
    # the replay: the same count as a depth in bytes, the drain the proxy credits
    drained = (depth.drain_rate or 0.0) * credit_time(HOT_INTERVAL, depth.ready_rtt) * BODY
    replayed = admission_room(q.policy, ready * BODY, drained, BODY, q.share)
    assert replayed == pytest.approx(proxy, abs=1e-6)
    if ready == 15 or (limits != "bytes" and ready >= 10):
        assert replayed <= drained + 1e-6  # full: the drain only (a share of it in a fleet)
    if share == "alone" and ready == 0 and drained == 0:
        assert replayed == min(x for x in (q.policy.capacity or math.inf,
                                           (q.policy.max_messages or math.inf) * BODY))


# -- a fleet's sidecars --------------------------------------------------------------------
KIB = 1024


def _fleet(parts: dict[str, int], seconds: int = 20, drain: int = 10) -> list[Bucket]:
    """Sidecars offering ``parts`` KiB/s each for ``seconds``, nothing held in the record,
    the consumers at ``drain`` KiB/s: the recorded depth grows by the difference."""
    offered = sum(parts.values())
    out = []
    for i in range(seconds + 80):
        o = offered if i < seconds else 0
        peak = (offered - drain) * seconds
        d = (offered - drain) * (i + 1) if i < seconds else max(0, peak - drain * (i + 1 - seconds))
        members = tuple(sorted((n, (p if i < seconds else 0) * KIB) for n, p in parts.items()))
        out.append(Bucket(i, o * KIB, o, o * KIB, o, 0, d * KIB, d, 0, 0, False, len(parts),
                          None, 0, members))
    return out


def test_a_fleets_sidecars_share_what_the_queue_admits() -> None:
    policy = Policy(name="p", queue="q", capacity=64 * KIB, resume=32 * KIB, deadline=600)
    fleet = timeline("/", "q", 1.0, _fleet({"a": 24, "b": 6}))
    assert fleet.sidecars == ("a", "b") and fleet.parts[0] == (("a", 0.8), ("b", 0.2))
    alone = timeline("/", "q", 1.0, [_one(b) for b in _fleet({"a": 24, "b": 6})])
    f, one = replay(fleet, policy).figures(), replay(alone, policy).figures()
    assert "sidecars" not in one
    # the fleet trips when its first member passes its share of the room beyond the room
    # target R0 (fleet_rate: 0.3 s of the 10 KiB/s drain, 3 KiB), so its queue stays about
    # R0 below the capacity, which one sidecar fills: it trips a little earlier, once ...
    r0 = 0.3 * 10 * KIB
    assert f["trips"] == one["trips"] == 1
    assert one["depth_max"] == policy.capacity
    assert policy.capacity - r0 - 2 * KIB <= f["depth_max"] < policy.capacity
    assert one["tripped_seconds"] <= f["tripped_seconds"] <= one["tripped_seconds"] + 1
    # ... the sidecars share out what it admitted, about what one sidecar's queue admits ...
    assert f["admitted_bytes"] == pytest.approx(one["admitted_bytes"], rel=0.02)
    # ... and its publishers wait in each sidecar's queue (the fleet's held bytes are its
    # sidecars'): nothing expires, so about as much is held as in one sidecar's queue
    # (settled per bucket), only shared differently
    assert f["held_byte_seconds"] == pytest.approx(one["held_byte_seconds"], rel=0.03)
    assert f["held_byte_seconds"] == pytest.approx(
        sum(s["held_byte_seconds"] for s in f["sidecars"]), abs=1)
    a, b = f["sidecars"]
    assert (a["sidecar"], b["sidecar"]) == ("a", "b")
    assert a["admitted_bytes"] + b["admitted_bytes"] == pytest.approx(f["admitted_bytes"], abs=2)
    # both held, each admitted its share of the room: b, offering a quarter of a's load,
    # needs less than an equal share and is served first; its publishers wait less
    assert a["admitted_bytes"] > 3 * b["admitted_bytes"]
    assert b["wait_mean_seconds"] < a["wait_mean_seconds"] / 2
    assert b["held_byte_seconds"] < a["held_byte_seconds"] / 4
    assert a["deadline_expiries"] == b["deadline_expiries"] == 0


def _one(b: Bucket) -> Bucket:
    """``b`` as one sidecar's telemetry (no fleet)."""
    return dataclasses.replace(b, sidecars=1, members=(("only", b.offered_bytes),))



def test_a_fleets_equal_sidecars_are_admitted_equally_and_expire_their_own() -> None:
    t = timeline("/", "q", 1.0, _fleet({"a": 15, "b": 15}))
    f = replay(t, Policy(name="p", queue="q", capacity=64 * KIB, resume=32 * KIB,
                         deadline=5)).figures()
    a, b = f["sidecars"]
    assert f["deadline_expiries"] > 100
    assert a["admitted_bytes"] == pytest.approx(b["admitted_bytes"], rel=0.01)
    assert a["admitted_share"] == pytest.approx(0.5, abs=0.01)
    # each sidecar's held publishes expire at the deadline on their own (settled per
    # bucket: within a bucket's load of the queue's count)
    assert a["deadline_expiries"] + b["deadline_expiries"] == pytest.approx(
        f["deadline_expiries"], abs=1)
    # equal sidecars, served equally: as one queue, oldest first (within a bucket's load)
    one = replay(timeline("/", "q", 1.0, [_one(b) for b in _fleet({"a": 15, "b": 15})]),
                 Policy(name="p", queue="q", capacity=64 * KIB, resume=32 * KIB,
                        deadline=5)).figures()
    assert f["deadline_expiries"] == pytest.approx(one["deadline_expiries"], abs=30)
    assert a["wait_max_seconds"] <= 5 + 1 and b["wait_max_seconds"] <= 5 + 1


def test_a_member_past_its_share_trips_its_fleet_before_the_queue_is_full() -> None:
    """Two sidecars that forwarded alike (200 KiB/s each, the consumers keeping up: equal
    demands, equal shares of the room), then one sends 500 KiB in a second alone while the
    consumers take 400: at a count its step's forwarding passes its half of the room beyond
    R0 (0.3 s of the drain, at most half the band: 32 KiB) while the queue is far from full,
    and the fleet trips, as its ShareRule trips it in the proxy. One sidecar with the
    same load never trips: the queue peaks at 100 KiB, below its 128 KiB capacity."""
    policy = Policy(name="p", queue="q", capacity=128 * KIB, resume=64 * KIB, deadline=600)
    buckets = []
    for i in range(20):
        a, b = (200, 200) if i < 10 else (500, 0) if i == 10 else (0, 0)  # KiB in the bucket
        d = 0 if i < 10 else max(0, 100 - 100 * (i - 10))  # the depth at the bucket's end
        buckets.append(Bucket(i, (a + b) * KIB, a + b, (a + b) * KIB, a + b, 0, d * KIB, d,
                              0, 0, False, 2, None, 0, (("a", a * KIB), ("b", b * KIB))))
    fleet = replay(timeline("/", "q", 1.0, buckets), policy).figures()
    one = replay(timeline("/", "q", 1.0, [_one(b) for b in buckets]), policy).figures()
    assert one["trips"] == 0 and one["depth_max"] == 100 * KIB, one
    # (below its resume level, a trip by share releases as soon as its held bytes went:
    # the burst trips it again at the next counts)
    assert fleet["trips"] >= 1 and fleet["tripped_seconds"] > 0, fleet
    assert fleet["depth_max"] < one["depth_max"], fleet


def _ramp(estimate: float | None, seconds: int = 30) -> list[Bucket]:
    """Two sidecars offering 40 and 10 KiB/s to consumers taking 40: the depth grows
    10 KiB/s; the sidecars recorded a drain estimate of ``estimate`` bytes/s all along."""
    out, depth = [], 0
    for i in range(seconds + 20):
        a, b = (40, 10) if i < seconds else (0, 0)
        depth = max(0, depth + a + b - 40)
        out.append(Bucket(i, (a + b) * KIB, a + b, (a + b) * KIB, a + b, 0, depth * KIB,
                          depth, 0, 0, False, 2, None, 0, (("a", a * KIB), ("b", b * KIB)),
                          estimate))
    return out


def test_a_cold_fleet_trips_on_the_drain_it_estimated_then() -> None:
    """R0 (0.3 s of the drain: 12 KiB at 40 KiB/s) is of the drain the proxy estimated at
    the trip. A queue its 50 KiB/s ingress takes to the capacity within one slow count
    (200 ms: 10 KiB) is counted back to back, its estimate the consumers' take; before
    that it is counted every 200 ms and its estimate is what the sidecars recorded. With
    the recorded estimate at the consumers' take the fleet trips R0 below the capacity,
    while still cold; with one near 0 (after an idle spell) R0 is 0 while cold, and it
    trips only where it turns hot, 10 KiB below."""
    policy = Policy(name="p", queue="q", capacity=64 * KIB, resume=32 * KIB, deadline=600)
    took = replay(timeline("/", "q", 1.0, _ramp(40 * KIB)), policy).figures()
    idle = replay(timeline("/", "q", 1.0, _ramp(0.0)), policy).figures()
    unknown = replay(timeline("/", "q", 1.0, _ramp(None)), policy).figures()
    assert took["trips"] == idle["trips"] == 1
    assert took["depth_max"] <= policy.capacity - 12 * KIB < idle["depth_max"], (took, idle)
    assert policy.capacity - 10 * KIB <= idle["depth_max"] < policy.capacity, idle
    assert unknown == took  # no estimate recorded: the consumers' take


def _burst(split: int) -> list[Bucket]:
    """Two sidecars, 30 KiB in one second (24 and 6) into a queue at 30 KiB whose consumers
    then take 10 KiB/s, in buckets of 1/``split`` s (load and depth spread evenly)."""
    seconds = [(0, 0, 30)] * 3 + [(24, 6, 60)] + [(0, 0, max(0, 60 - 10 * k))
                                                    for k in range(1, 10)]
    out, prev = [], 30
    for a, b, d in seconds:
        for k in range(split):
            depth = round((prev + (d - prev) * (k + 1) / split) * KIB)
            pa, pb = round(a * KIB / split), round(b * KIB / split)
            out.append(Bucket(len(out), pa + pb, 0, pa + pb, 0, 0, depth, 0, 0, 0, False, 2,
                              None, 0, (("a", pa), ("b", pb))))
        prev = d
    return out


def test_a_fleet_trips_inside_a_bucket_that_stays_below_its_limits() -> None:
    """The burst takes the queue to 60 KiB, under its 64 KiB capacity, but the first
    sidecar passes its share of the room beyond R0 part way through the second: the fleet
    trips there, whatever the bucket size (a bucket under its limits played in one step
    would trip at its start and count the whole second as tripped)."""
    policy = Policy(name="p", queue="q", capacity=64 * KIB, resume=32 * KIB, deadline=600)
    coarse = replay(timeline("/", "q", 1.0, _burst(1)), policy).figures()
    fine = replay(timeline("/", "q", 0.25, _burst(4)), policy).figures()
    assert coarse["trips"] == fine["trips"] == 1
    assert coarse["depth_max"] < policy.capacity
    assert coarse["tripped_seconds"] == pytest.approx(fine["tripped_seconds"], abs=0.1)
