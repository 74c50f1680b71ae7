"""Pace, sans-IO: the sampling schedule, the enqueue lag, admission while held (the token
bucket, its cap when the consumers stop dead, the round robin) and the release it defers."""

from __future__ import annotations

import dataclasses
import math

import pytest

from floodwall.control import admission
from floodwall.control.admission import (
    CEILING_BYTES_PER_S,
    HOT_INTERVAL,
    MAX_CREDIT_TIME,
    MAX_MARGIN_FLOOR,
    TRUST_BYTES,
    TRUST_FLOOR,
    TRUST_PART,
    Admission,
    allowance,
    margin_floor,
    paced,
    trust_budget,
    trusted_margin,
)
from floodwall.control.controller import FlowController
from floodwall.control.depth import (
    HOT_MIN_MARGIN,
    LAG_HALF_LIFE,
    RTT_HALF_LIFE,
    SETTLE,
    QueueDepth,
)
from floodwall.control.events import ChannelAdmitted
from floodwall.control.fleet import ShareRule
from floodwall.control.policy import Policy, PolicySet, parse_policies
from floodwall.control.schedule import (
    COUNTS_PER_FILL,
    HELD_COUNT_PART,
    RISE_WINDOW,
    STILL_AFTER,
    STILL_INTERVAL,
    fill_rate,
    fill_time,
    held_interval,
    ingress_rate,
    sampling_interval,
    still_interval,
)
from tests.test_gate import Router

POLICIES = parse_policies("""
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.*"}
    capacity: 10000
    resume: 5000
""")
KEY = ("/", "orders.a")
RTT = 0.001


def held_queue() -> tuple[FlowController, float]:
    """orders.a counted empty at t=100, then 11 x 1000 bytes forwarded at once: tripped."""
    fc = FlowController(Router(), POLICIES)
    t = 100.0
    fc.queue_seen(KEY, t)
    fc.sampled_ready_count(KEY, t, 0, RTT, t)
    for _ in range(11):
        fc.forwarded("/", frozenset({"orders.a"}), 1000, t + 0.5)
    assert KEY in fc.tripped
    return fc, t + 1.0


def count(fc: FlowController, at: float, ready: int) -> None:
    fc.sampled_ready_count(KEY, at, ready, RTT, at + RTT)


# -- the margin's floor ---------------------------------------------------------------------
def policies_of(capacity: str | int, queue: str = "q") -> PolicySet:
    """One policy, ``queue`` capped at ``capacity``."""
    return parse_policies(f"""
version: 1
policies:
  - name: {queue}
    match: {{vhost: "/", queue: "{queue}"}}
    capacity: {capacity}
""")


def policy_of(capacity: str) -> Policy:
    return policies_of(capacity).policies[0]


def test_the_margin_floor_follows_the_capacity_within_its_limits() -> None:
    """20 ms for a small queue, 40 ms from about 1 MiB on, and in between the longest that
    keeps the admitted rate's ceiling ``(capacity + S) / (m - h)`` at CEILING_BYTES_PER_S."""
    assert margin_floor(policy_of("256KiB"), HOT_INTERVAL) == HOT_MIN_MARGIN
    assert margin_floor(policy_of("1MiB"), HOT_INTERVAL) == MAX_MARGIN_FLOOR
    assert margin_floor(policy_of("1GiB"), HOT_INTERVAL) == MAX_MARGIN_FLOOR
    mid = policy_of("512KiB")
    m = margin_floor(mid, HOT_INTERVAL)
    assert HOT_MIN_MARGIN < m < MAX_MARGIN_FLOOR
    s_bytes = trust_budget(mid)[0]
    assert (mid.capacity + s_bytes) / (m - HOT_INTERVAL) == pytest.approx(CEILING_BYTES_PER_S)
    # a longer hot interval lengthens it as much (the ceiling's ``m - h`` stays)
    assert margin_floor(mid, 0.006) == pytest.approx(m + 0.001)


def test_a_large_queues_allowance_trusts_a_count_with_less_of_what_went_just_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Held at 1 MiB, 200 KB forwarded 30 ms before a count: with the 40 ms floor the count
    is trusted with the budget ``S`` of it (it went between ``m_lo`` and ``m``); with a
    20 ms floor it would be trusted with all of it, and admit 68,928 bytes more."""
    key = ("/", "big")
    fc = FlowController(Router(), policies_of("1MiB", "big"))
    fc.queue_seen(key, 0.0)
    fc.sampled_ready_count(key, 0.0, 0, RTT, RTT)
    for _ in range(1100):  # over 1 MiB at t=1.0: tripped
        fc.forwarded("/", frozenset({"big"}), 1000, 1.0)
    assert key in fc.tripped
    for _ in range(200):
        fc.forwarded("/", frozenset({"big"}), 1000, 1.97)
    fc.sampled_ready_count(key, 2.0, 1100, RTT, 2.0 + RTT)
    q = fc.queues[key]
    floored = allowance(q, 2.0 + RTT, HOT_INTERVAL)
    assert floored is not None and floored.margin == MAX_MARGIN_FLOOR
    monkeypatch.setattr(admission, "margin_floor", lambda policy, hot: HOT_MIN_MARGIN)
    short = allowance(q, 2.0 + RTT, HOT_INTERVAL)
    assert short is not None and short.margin == HOT_MIN_MARGIN
    budget = trust_budget(q.policy)[0]
    assert short.bytes - floored.bytes == pytest.approx(200 * 1000 - budget)


# -- the token bucket -----------------------------------------------------------------------
def test_no_tokens_while_the_count_shows_the_queue_full() -> None:
    fc, t = held_queue()
    count(fc, t, 11)
    assert not fc.admits(frozenset({KEY}), t + RTT)


def test_tokens_are_the_headroom_the_count_shows() -> None:
    fc, t = held_queue()
    count(fc, t, 11)
    count(fc, t + 0.2, 6)  # consumers took 5
    q = fc.queues[KEY]
    a = allowance(q, t + 0.2, HOT_INTERVAL)
    assert a is not None
    depth = q.depth
    assert depth.drain_rate is not None and depth.drain_rate > 0  # 5 taken in 0.2 s
    # capacity - count x mean size + everything forwarded before the count (11000) + the
    # drain until the next count (one hot interval and round trip)
    credit = depth.drain_rate * (HOT_INTERVAL + RTT) * 1000
    assert a.bytes == pytest.approx(10000 - 6000 + 11000 + credit)
    for _ in range(4):
        assert fc.admits(frozenset({KEY}), t + 0.2)
        fc.queues[KEY].depth.forwarded(t + 0.2, 1000)
    assert depth.forwarded_bytes_total == 15000
    # at most one message past capacity + the drain credited: the last 1000 used it up
    assert depth.forwarded_bytes_total + 1000 > a.bytes


def test_a_consumer_that_stops_dead_is_credited_for_one_hot_interval_and_round_trip() -> None:
    fc, t = held_queue()
    count(fc, t, 11)
    q = fc.queues[KEY]
    q.depth.drain_rate = 5000.0  # messages/s, as the counts said before the stop
    at = q.depth.ready_count_at
    assert at is not None
    without = allowance(q, at, HOT_INTERVAL)
    assert without is not None
    q.depth.drain_rate = 0.0
    no_drain = allowance(q, at, HOT_INTERVAL)
    q.depth.drain_rate = 5000.0
    late = allowance(q, at + 5.0, HOT_INTERVAL)  # no count for 5 s: it does not grow
    assert no_drain is not None and late is not None
    cap = min(HOT_INTERVAL + RTT, MAX_CREDIT_TIME)
    # the drain until the next count, credited at the count (admission happens at counts)
    assert without.bytes - no_drain.bytes == pytest.approx(5000.0 * cap * 1000)
    assert late.bytes == without.bytes
    # overshoot bound: capacity + drain x min(hot interval + rtt, MAX_CREDIT_TIME) + 1 message
    est = q.depth.estimate()
    assert est is not None
    assert late.bytes - q.depth.forwarded_bytes_total + est.bytes <= 10000 + 5000 * cap * 1000


def test_a_stale_drain_does_not_add_up_over_counts_after_consumers_stop() -> None:
    """The consumers stop dead; the drain estimate stays high (as it does for a while),
    the producer uses every token, its publishes land 15 ms after they were forwarded
    (within the margin): at every count what is in the queue or on its way to it is at
    most capacity + d x min(h + r, 10 ms) + one message, however many counts come."""
    fc, t = held_queue()
    assert fc.block(1, 1, frozenset({KEY}), t)  # a publisher waits: the queue stays held
    depth = fc.queues[KEY].depth
    lag, gap = 0.015, HOT_INTERVAL + RTT
    count(fc, t, 0)  # consumers took everything; they stop now
    consumed = depth.forwarded_messages_total
    credit = 5000 * min(HOT_INTERVAL + RTT, MAX_CREDIT_TIME) * 1000
    admitted = 0
    for i in range(1, 300):
        now = t + i * gap
        depth.drain_rate = 5000.0  # stale: nobody consumes any more
        while fc.admits(frozenset({KEY}), now):
            depth.forwarded(now, 1000)
            admitted += 1
        ready = depth.totals_before(now - lag)[1] - consumed  # landed, none taken
        in_flight = depth.forwarded_messages_total - consumed - ready
        assert (ready + in_flight) * 1000 <= 10000 + credit + 1000
        count(fc, now + RTT, ready)
    assert admitted >= 10  # the room the first count showed was used
    assert KEY in fc.tripped


def test_nothing_is_admitted_on_a_management_figure_alone() -> None:
    d = QueueDepth()
    d.forwarded(1.0, 100)
    admission = Admission()

    class Q:
        depth = d
        policy = POLICIES.policies[0]
        tripped_since: float | None = 1.0

    assert allowance(Q(), 2.0, HOT_INTERVAL) is None
    assert not admission.admits(KEY, Q(), 2.0)


# -- the enqueue lag ------------------------------------------------------------------------
def test_a_count_that_missed_a_burst_shows_the_lag() -> None:
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    for _ in range(100):
        d.forwarded(0.01, 1000)  # one burst at 10 ms
    d.sampled_ready_count(0.06, 20, RTT)  # 50 ms later only 20 are in
    assert d.enqueue_lag == 0.0  # a low count alone proves nothing (consumers)
    d.sampled_ready_count(0.062, 100, RTT)  # ... and now all of them: 80 were missing
    assert d.enqueue_lag == pytest.approx(0.06 - 0.01)
    d.sampled_ready_count(0.064, 100, RTT)  # consistent: it shrinks
    assert d.enqueue_lag == pytest.approx(0.05 * 0.5 ** (0.002 / LAG_HALF_LIFE))


def test_a_trip_assumes_a_flood_on_its_way_for_the_counts_within_settle_of_it() -> None:
    fc, t = held_queue()  # tripped at t - 0.5
    trip = t - 0.5
    depth = fc.queues[KEY].depth
    assert depth.lag_at(trip) == SETTLE and depth.enqueue_lag == 0.0
    count(fc, trip + 0.05, 11)  # 50 ms after the trip: the flood may not all be in it
    a = allowance(fc.queues[KEY], trip + 0.05, HOT_INTERVAL)
    assert a is not None and a.margin == SETTLE
    # the count is trusted with nothing forwarded in the 100 ms before it: the flood
    # (11 x 1000, forwarded at the trip) is counted on top of its 11 ready
    assert a.bytes == pytest.approx(10000 - 11000 + 0)
    count(fc, trip + SETTLE, 11)  # SETTLE after the trip: it holds the flood
    a = allowance(fc.queues[KEY], trip + SETTLE, HOT_INTERVAL)
    assert a is not None and a.margin == pytest.approx(HOT_MIN_MARGIN)  # the floor at once
    assert depth.lag_at(trip + SETTLE) == 0.0


def test_a_trip_keeps_a_longer_lag_the_counts_show() -> None:
    """A flood that takes longer than SETTLE to land shows as a rise beyond the ledger: the
    margin follows what the counts show (halving each second), not the assumed step."""
    fc, t = held_queue()  # 11 x 1000 forwarded at t - 0.5: the trip
    trip = t - 0.5
    depth = fc.queues[KEY].depth
    count(fc, trip + 0.05, 0)  # none of the flood in yet
    count(fc, trip + 0.15, 0)  # nor 150 ms after it
    count(fc, trip + 0.16, 11)  # now all of it: the counts before it missed it
    assert depth.enqueue_lag > SETTLE
    assert depth.lag_at(trip + 1.0) == depth.enqueue_lag  # past the step: what they show
    a = allowance(fc.queues[KEY], trip + 0.16, HOT_INTERVAL)
    assert a is not None and a.margin == depth.enqueue_lag


def test_publishes_that_land_faster_than_the_margin_are_no_lag() -> None:
    """Admission ramps up after a trip: each count finds in the queue what was forwarded
    just before it (a 2 ms lag, well inside the 20 ms margin). No lag may be read from
    that (it was read as one until the pace work: up to MAX_MARGIN, and admission crawled)."""
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    landed, t = 0, 0.0
    for i in range(1, 60):  # counts every 6 ms, each after a bigger burst than the last
        t = i * 0.006
        for _ in range(i):
            d.forwarded(t - 0.004, 1000)
        landed += i  # all in by the count (2 ms later); no consumer
        d.sampled_ready_count(t, landed, RTT)
    assert d.enqueue_lag == 0.0


def test_a_count_that_missed_publishes_forwarded_well_before_it_shows_the_lag() -> None:
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    for _ in range(50):
        d.forwarded(0.01, 1000)
    d.sampled_ready_count(0.05, 10, RTT)  # 40 ms after: 40 of the 50 still on their way
    d.sampled_ready_count(0.056, 50, RTT)  # all in: the count before missed 40 of them
    assert d.enqueue_lag == pytest.approx(0.05 - 0.01)


def test_a_slow_round_trip_widens_the_margin_for_a_while() -> None:
    """One count that took 60 ms to answer (a broker stalling) sets the margin to twice
    that, and it halves each RTT_HALF_LIFE after; the newest round trip alone would have let the
    next fast count shrink it back to 20 ms at once."""
    fc, t = held_queue()
    q = fc.queues[KEY]
    fc.sampled_ready_count(KEY, t, 11, 0.06, t + 0.06)
    fc.sampled_ready_count(KEY, t + 0.07, 11, RTT, t + 0.07 + RTT)
    a = allowance(q, t + 0.07, HOT_INTERVAL)
    assert a is not None
    assert a.margin == pytest.approx(2 * 0.06 * 0.5 ** (0.07 / RTT_HALF_LIFE))
    for i in range(1, 1001):  # 20 s (4 half-lives) of fast counts
        count(fc, t + 0.07 + 0.02 * i, 11)
    a = allowance(q, t + 20.07, HOT_INTERVAL)
    assert a is not None and a.margin == pytest.approx(HOT_MIN_MARGIN)


# -- the trust budget -----------------------------------------------------------------------
def trusted_queue() -> tuple[FlowController, float]:
    """orders.a held, counted at 11 (its flood in) well after the trip; then one publish of
    1000 bytes 15 ms before the next count (between m_lo and m) and one 3 ms before it
    (within m_lo); the count shows the first of them (12), no drain."""
    fc, t = held_queue()
    count(fc, t, 11)
    depth = fc.queues[KEY].depth
    depth.forwarded(t + 0.185, 1000)
    depth.forwarded(t + 0.197, 1000)
    count(fc, t + 0.2, 12)
    assert depth.drain_rate == 0.0 and depth.enqueue_lag == 0.0
    return fc, t + 0.2


def test_a_count_is_trusted_with_what_went_before_m_lo_up_to_the_budget() -> None:
    """allowance = capacity - B + min(F(t - m_lo), F(t - m) + S) + d x c: of what was
    forwarded between m_lo (10 ms) and m (20 ms) before the count, at most S (half the
    capacity here: 5,000 bytes) is taken to be in it; what went within m_lo never is."""
    fc, t = trusted_queue()
    q = fc.queues[KEY]
    a = allowance(q, t, HOT_INTERVAL)
    assert a is not None and a.margin == pytest.approx(HOT_MIN_MARGIN)
    assert trust_budget(q.policy) == (5000, math.inf)  # no max_messages: no message budget
    # B = 12000; F(t - m) = 11000; F(t - m_lo) = 12000 (the publish 15 ms before: within S);
    # without the budget it would be 10000 - 12000 + 11000
    assert a.bytes == pytest.approx(10000 - 12000 + 12000)
    q.policy = dataclasses.replace(q.policy, capacity=1000, resume=1000)
    assert trust_budget(q.policy)[0] == 500  # a smaller budget caps the trust: F(t - m) + S
    small = allowance(q, t, HOT_INTERVAL)
    assert small is not None and small.bytes == pytest.approx(1000 - 12000 + 11000 + 500)
    # a messages limit has its own budget, half of it: 4 of 8 here, so the publish
    # 15 ms before the count (11 -> 12 messages) is trusted
    q.policy = dataclasses.replace(q.policy, max_messages=8, resume_messages=8)
    assert trust_budget(q.policy)[1] == 4
    by_count = allowance(q, t, HOT_INTERVAL)
    assert by_count is not None and by_count.messages == pytest.approx(8 - 12 + 12)
    assert TRUST_BYTES == 128 * 1024 and TRUST_FLOOR >= 0.01


def test_no_trust_where_the_counts_show_a_lag_or_a_trip_assumes_one() -> None:
    """m_lo follows the lag in force: a lag the counts show as long as m, or SETTLE for a
    count within SETTLE of a trip, leaves nothing between m_lo and m to trust."""
    fc, t = trusted_queue()
    q = fc.queues[KEY]
    depth = q.depth
    depth.enqueue_lag = HOT_MIN_MARGIN  # a lag seen as long as the margin
    a = allowance(q, t, HOT_INTERVAL)
    assert a is not None and a.bytes == pytest.approx(10000 - 12000 + 11000)
    depth.enqueue_lag = 0.0
    depth.expect_lag(SETTLE, t - 0.05)  # a trip 50 ms before the count
    a = allowance(q, t, HOT_INTERVAL)
    assert a is not None and a.margin == SETTLE
    assert a.bytes == pytest.approx(10000 - 12000 + 11000)  # F(t - SETTLE): the flood


def test_m_lo_stands_on_this_counts_round_trip_m_on_the_recent_longest() -> None:
    """A count read 60 ms late (the proxy's loop or the OS), then fast ones: the margin m
    keeps twice the decaying longest round trip (rtt_high), but m_lo is twice this count's
    own (1 ms) or the 10 ms floor, so the trust budget engages at once; with rtt_high in
    m_lo too, m_lo >= m and nothing would be trusted."""
    fc, t = held_queue()
    q = fc.queues[KEY]
    depth = q.depth
    count(fc, t, 11)
    fc.sampled_ready_count(KEY, t + 0.1, 11, 0.06, t + 0.16)  # read 60 ms late
    depth.forwarded(t + 0.17, 1000)  # 15 ms before the next count: between m_lo and m
    count(fc, t + 0.185, 12)
    assert depth.rtt_high > 0.02  # 60 ms halved over 85 ms: ~33 ms
    assert trusted_margin(depth, t + 0.185, RTT) == TRUST_FLOOR
    a = allowance(q, t + 0.185, HOT_INTERVAL)
    assert a is not None and a.margin == pytest.approx(2 * depth.rtt_high)
    assert a.margin > 0.015  # the publish 15 ms before is within m: not in F(t - m)
    assert a.bytes == pytest.approx(10000 - 12000 + 12000)  # but trusted (within S)


@pytest.mark.parametrize(("capacity_kib", "at_least"), [(1024, 0.9), (256, 0.7)])
def test_a_held_queue_keeps_up_though_some_counts_are_read_late(capacity_kib: int,
                                                               at_least: float) -> None:
    """The fast consumer of the next test, and one count in 150 (about one a second) read
    40 ms late, as the test machine's loop and scheduler did (bench/RESULTS.md's
    history): 256 KiB keeps 0.89 of the consumer's rate in this simulation, 1 MiB 0.98
    (0.77 with the 64 KiB trust budget; with rtt_high halving per second: 0.43 and 0.93)."""
    rate, _, _ = simulate_held(capacity_kib, 0.002, 18000.0, 3.0, slow_every=150)
    assert rate >= at_least * 18000


@pytest.mark.parametrize("lag", [0.002, 0.015, 0.03])
def test_late_counts_keep_a_stopped_consumers_queue_within_256_kib(lag: float) -> None:
    """The same late counts, the consumer stopped dead at 1.5 s: within the bound of
    test_a_consumer_that_stops_dead_leaves_the_queue_within_256_kib."""
    d = 18000 * 1024
    _, peak, _ = simulate_held(256, lag, 18000.0, 3.0, stop_at=1.5, slow_every=150)
    over = peak * 1024 - 256 * 1024
    assert over <= min(stopped_bound(d, lag, 256 * 1024 * TRUST_PART), 256 * 1024)


def test_a_fleet_member_has_no_trust_budget() -> None:
    """Each member's budget would add up over the fleet: a shared queue keeps F(t - m)."""
    fc, t = trusted_queue()
    q = fc.queues[KEY]

    class Whole:
        def fraction(self, room_bytes: float | None, room_messages: float | None,
                     body_bytes: int) -> float:
            return 1.0

    one = allowance(q, t, HOT_INTERVAL)
    q.share = Whole()  # type: ignore[assignment]
    fleet = allowance(q, t, HOT_INTERVAL)
    assert one is not None and fleet is not None
    assert one.bytes - fleet.bytes == pytest.approx(1000)  # the 1000 trusted, one sidecar


# -- pacing: what one count offers -------------------------------------------------------------
def test_a_count_offers_the_drain_and_part_of_the_room_not_all_of_it() -> None:
    """A count showing the whole room free offers the drain until the next count and
    2c / (m + r) of the rest: taking all of it at once left nothing for the next few
    counts (capacity-sized bursts every m); never more than the allowance."""
    fc, t = held_queue()
    assert fc.block(1, 1, frozenset({KEY}), t)
    count(fc, t, 11)
    count(fc, t + 0.2, 0)  # drained: 10000 bytes of room
    q = fc.queues[KEY]
    depth = q.depth
    a = allowance(q, t + 0.2, HOT_INTERVAL)
    assert a is not None
    p = paced(a, depth, HOT_INTERVAL)
    c = min(HOT_INTERVAL + RTT, MAX_CREDIT_TIME)
    drain = (depth.drain_rate or 0.0) * c * 1000
    room = a.bytes - depth.forwarded_bytes_total
    part = 2 * c / (a.margin + RTT)
    assert 0 < part < 1
    assert p.bytes == pytest.approx(depth.forwarded_bytes_total + drain + (room - drain) * part)
    assert p.bytes < a.bytes
    sent = 0
    while fc.admits(frozenset({KEY}), t + 0.2 + RTT):
        depth.forwarded(t + 0.2 + RTT, 1000)
        sent += 1
    assert sent == math.ceil((p.bytes - 11000) / 1000)  # what the tick offered, not the room
    assert sent < 10


# -- the schedule ---------------------------------------------------------------------------
def test_tripped_queues_are_hot_and_quiet_ones_cold() -> None:
    policy = POLICIES.policies[0]
    d = QueueDepth()
    d.sampled_ready_count(0.0, 1, RTT)
    assert sampling_interval(d, policy, True, 1.0, 0.2, 0.002) == 0.002
    assert sampling_interval(d, policy, False, 1.0, 0.2, 0.002) == 0.2


def test_a_held_queue_nothing_moves_in_is_counted_less_often_until_a_count_moves() -> None:
    hot = 0.005
    d = QueueDepth()
    t = 0.0
    for _ in range(10):  # a consumer taking one message every count
        d.sampled_ready_count(t, 300 - round(t / hot), RTT)
        t += hot
    assert d.still_since() is None and still_interval(d, True, t, hot) == hot
    ready = d.ready_count
    assert ready is not None
    while t < 1.0:  # the consumer stopped: every count the same, nothing admitted
        d.sampled_ready_count(t, ready, RTT)
        t += hot
    assert still_interval(d, True, t, hot) == STILL_INTERVAL
    assert still_interval(d, False, t, hot) == hot  # (not held: the schedule's own rule)
    # not yet STILL_AFTER since it last moved: hot
    since = d.still_since()
    assert since is not None
    assert still_interval(d, True, since + STILL_AFTER / 2, hot) == hot
    # a publish admitted: something moves, hot at once (before the next count)
    d.forwarded(t, 1000)
    assert d.still_since() is None and still_interval(d, True, t, hot) == hot
    d.sampled_ready_count(t + 0.01, ready + 1, RTT)
    assert still_interval(d, True, t + 0.01 + STILL_AFTER / 2, hot) == hot
    # the consumer restarts: the first count that moves makes it hot again
    t += 1.0
    d.sampled_ready_count(t, ready + 1, RTT)
    assert still_interval(d, True, t + 0.3, hot) == STILL_INTERVAL
    d.sampled_ready_count(t + 0.05, ready - 5, RTT)
    assert still_interval(d, True, t + 0.3, hot) == hot


def test_a_held_queue_is_counted_as_often_as_its_consumers_take_a_part_of_its_limit() -> None:
    hot = 0.005
    policy = policy_of("512KiB")
    d = QueueDepth()
    t = 0.0
    for _ in range(40):  # 500 x 1 KiB ready, 1,000 msg/s admitted and taken
        d.sampled_ready_count(t, 500, RTT)
        for _ in range(100):
            d.forwarded(t + 0.01, 1024)
        t += 0.1
    rate = d.drain_rate
    assert rate == pytest.approx(1000, rel=0.01)
    take = 512 * 1024 / (rate * d.average_body_bytes())
    assert held_interval(d, policy, t, hot) == pytest.approx(
        max(hot, min(STILL_INTERVAL, take * HELD_COUNT_PART)))
    assert hot < held_interval(d, policy, t, hot) < STILL_INTERVAL
    assert held_interval(d, policy, t, hot, alone=False) == hot  # a fleet's: its bound's hot
    # a limit in messages that its consumers take sooner decides
    tight = parse_policies("""
version: 1
policies:
  - {name: q, match: {vhost: "/", queue: q}, capacity: 512KiB, max_messages: 500}
""").policies[0]
    assert held_interval(d, tight, t, hot) == pytest.approx(
        max(hot, min(take, 500 / rate) * HELD_COUNT_PART))
    # a queue well below its limit: its consumers outrun its admission, counted hot
    d.sampled_ready_count(t, 300, RTT)
    assert held_interval(d, policy, t, hot) == hot
    # a fast consumer for the limit: hot
    fast = policy_of("64KiB")
    d.sampled_ready_count(t + 0.05, 60, RTT)
    assert held_interval(d, fast, t + 0.05, hot) == hot


def test_a_held_queue_with_a_slow_consumer_is_counted_less_and_keeps_its_pace() -> None:
    """A 512 KiB queue held for a consumer at 250 msg/s is counted some 21 times a second,
    not 158 (one count per hot interval and round trip), admitted at its consumer's pace
    within its capacity; when the consumer speeds up to 18,000 msg/s the admissions follow
    it as fast as with hot counts (the first half second: 17,400/s here, 17,500 hot)."""
    trace: list[tuple[float, int]] = []
    _, peak, idle = simulate_held(512, 0.002, 250.0, 6.0, trace=trace)
    steady = [(t, a) for t, a in trace if t >= 3.0]
    assert len(steady) / 3.0 <= 25
    assert (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) >= 0.95 * 250
    assert peak <= 512 + 64
    assert idle < 0.01
    trace = []
    _, peak, _ = simulate_held(512, 0.002, 250.0, 4.0, speed_up=(3.0, 18000.0), trace=trace)
    before = max(a for t, a in trace if t <= 3.0)
    after = max(a for t, a in trace if t <= 3.5)
    assert (after - before) / 0.5 >= 0.9 * 18000
    assert peak <= 512 + 64


def test_a_queue_predicted_to_fill_before_the_next_slow_count_is_hot() -> None:
    policy = POLICIES.policies[0]
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    for i in range(80):  # 8000 bytes in the last second: 8000 B/s
        d.forwarded(0.1 + i * 0.01, 100)
    assert ingress_rate(d, 1.0).bytes == pytest.approx(8000)
    # estimate 8000 + 8000 B/s x 0.2 s = 9600 < 10000: cold; x 0.3 s: hot
    assert fill_time(d, policy, 1.0) > 0.2  # cold at a 0.2 s slow interval
    assert fill_time(d, policy, 1.0) <= 0.3  # hot at 0.3 s
    # hot: counted eight times in the 0.25 s the ingress takes to fill the 2000 bytes left
    assert fill_time(d, policy, 1.0) == pytest.approx(0.25)
    assert sampling_interval(d, policy, False, 1.0, 0.3, 0.002) \
        == pytest.approx(0.25 / COUNTS_PER_FILL)


def test_a_sender_that_starts_at_full_speed_is_predicted_at_its_rate_within_a_tenth_of_a_second(
) -> None:
    policy = POLICIES.policies[0]  # 10000 bytes
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    d.forwarded(0.5, 100)  # a trickle, then nothing for seconds
    t = 5.0
    while t < 5.0 + RISE_WINDOW:  # then 50 bytes every ms: 50,000 B/s
        d.forwarded(t, 50)
        t += 0.001
    d.sampled_ready_count(t, 0, RTT)  # the consumers keep up: counted empty
    # over the last second the sender shows at a tenth of its rate: cold at a 0.2 s slow
    # interval, and an estimate that crosses the capacity between two slow counts
    assert ingress_rate(d, t).bytes == pytest.approx(5000, rel=0.05)
    assert fill_rate(d, t).bytes == pytest.approx(50000, rel=0.05)
    left = 10000 - d.estimate().bytes  # type: ignore[union-attr]
    assert fill_time(d, policy, t) == pytest.approx(left / fill_rate(d, t).bytes)
    assert sampling_interval(d, policy, False, t, 0.2, 0.002) \
        == pytest.approx(left / fill_rate(d, t).bytes / COUNTS_PER_FILL)
    assert left / ingress_rate(d, t).bytes > 0.2  # (cold on the second's rate alone)
    # it stops: the prediction falls back to the second's rate, not below it
    assert fill_rate(d, t + RISE_WINDOW).bytes == pytest.approx(
        ingress_rate(d, t + RISE_WINDOW).bytes)


def test_an_untripped_queue_is_counted_as_often_as_its_ingress_fills_its_room() -> None:
    policy = POLICIES.policies[0]  # 10000 bytes
    d = QueueDepth()
    assert fill_time(d, policy, 0.0) == math.inf  # depth unknown: not predicted
    d.sampled_ready_count(0.0, 0, RTT)
    assert fill_time(d, policy, 0.5) == math.inf  # nothing forwarded: never fills
    assert sampling_interval(d, policy, False, 0.5, 0.2, 0.002) == 0.2
    t = 0.0
    intervals = []
    while d.estimate().bytes < 10000:  # type: ignore[union-attr]
        d.forwarded(t, 100)  # 100 bytes every ms: 100,000 B/s, no count meanwhile
        t += 0.001
        intervals.append(sampling_interval(d, policy, False, t, 0.2, 0.002))
    # cold (the slow interval) until the ingress would fill the room before the next slow
    # count; then a quarter of that time, shrinking with the room, down to the hot interval
    assert intervals == sorted(intervals, reverse=True)
    hot = [i for i in intervals if i < 0.2]
    assert hot and max(hot) <= 0.2 / COUNTS_PER_FILL
    assert len(set(hot)) > 10 and hot[-1] == 0.002
    assert fill_time(d, policy, t) == 0.0  # at capacity
    d.sampled_ready_count(t, 0, RTT)  # a count: the consumers took it all, the room is back
    left = 10000 - d.estimate().bytes  # type: ignore[union-attr]
    assert left > 5000
    assert fill_time(d, policy, t) == pytest.approx(left / fill_rate(d, t).bytes)
    # tripped: hot whatever the room
    assert sampling_interval(d, policy, True, t, 0.2, 0.002) == 0.002


# -- ticks, the round robin, the deferred release -------------------------------------------
def test_each_count_offers_the_tokens_to_the_waiting_channels_in_turn() -> None:
    fc, t = held_queue()
    for ref in ((1, 1), (1, 2), (2, 1)):
        assert fc.block(*ref, frozenset({KEY}), t)
    count(fc, t, 11)
    assert [o for o in fc.take_output() if isinstance(o, ChannelAdmitted)] == []  # no room
    orders = []
    for i in range(1, 4):
        count(fc, t + 0.2 * i, 6)
        orders.append([(o.conn, o.channel) for o in fc.take_output()
                       if isinstance(o, ChannelAdmitted)])
    assert [o[0] for o in orders] == [(1, 2), (2, 1), (1, 1)]  # the first served moves on
    assert all(sorted(o) == [(1, 1), (1, 2), (2, 1)] for o in orders)
    assert fc.is_blocked(1, 1)  # admitted, still held


def test_publishers_using_every_token_keep_their_queue_held_below_resume() -> None:
    fc, t = held_queue()
    assert fc.block(1, 1, frozenset({KEY}), t)
    count(fc, t, 8)  # 2000 bytes of tokens offered to channel 1 ...
    depth = fc.queues[KEY].depth
    while fc.admits(frozenset({KEY}), t):
        depth.forwarded(t, 1000)  # ... and it uses every one
    count(fc, t + 0.2, 4)  # 4000 + what was admitted <= resume 5000 ...
    assert KEY in fc.tripped and fc.is_blocked(1, 1)  # ... but it wants more: held
    # the next tick's tokens go unused (the publisher has nothing more): released
    count(fc, t + 0.6, 4)
    count(fc, t + 0.8, 4)
    assert KEY not in fc.tripped and not fc.is_blocked(1, 1)


@pytest.mark.parametrize("link", [True, False], ids=["1.0 link", "0-9-1 channel"])
def test_an_empty_queue_only_1_0_links_wait_on_is_released_whatever_they_send(
        link: bool) -> None:
    """A held queue whose waiting publishers send more than its tokens stays held at its
    resume level; when a count finds it empty and only 1.0 links wait on it (they are offered
    no tokens: what they send is credit granted before the trip, and a release gives each a
    window), it is released; a 0-9-1 channel's backlog keeps it held (its release would let
    all of it go at once)."""
    fc, t = held_queue()
    assert fc.block(1, 1, frozenset({KEY}), t, wants=4000 if link else 0)
    depth = fc.queues[KEY].depth
    for i, ready in enumerate((8, 4)):
        count(fc, t + 0.2 * i, ready)
        assert KEY in fc.tripped  # above resume; then at it, busy: held
        for _ in range(6):  # more than any tick offers
            depth.forwarded(t + 0.2 * i + 0.01, 1000)
        assert fc.admission.busy(KEY, depth)
    count(fc, t + 0.4, 0)
    assert (KEY in fc.tripped) is not link  # empty: released for the link alone
    assert fc.is_blocked(1, 1) is not link


# -- the whole loop, simulated: a held queue, its consumer, the counts ------------------------
STEP = 0.0005  # simulate_held's time step (seconds)


def simulate_held(capacity_kib: int, lag: float, consume_per_s: float, seconds: float,
                  stop_at: float | None = None, slow_every: int = 0,
                  slow_rtt: float = 0.04, hot: float = HOT_INTERVAL,
                  stall: tuple[float, float] | None = None,
                  speed_up: tuple[float, float] | None = None,
                  trace: list[tuple[float, int]] | None = None) -> tuple[float, int, float]:
    """A queue held at ``capacity_kib`` (1 KiB messages): a flood of capacity + 50 at the
    start, then held publishes admitted at each count (every 6 ms, 1 ms round trip); each
    lands ``lag`` after it is forwarded; a consumer with prefetch 200 takes up to
    ``consume_per_s``, and nothing from ``stop_at`` on (stopped dead, its 200 unacknowledged
    kept). With ``slow_every``, every so many counts one is read ``slow_rtt`` late (the
    proxy's loop or the OS: the broker counted at once, the answer waited). Returns (admitted
    per second, the most ever ready, the share of counts that found the consumer with
    nothing to take). ``hot``: the hot interval (``--hot-interval``). ``stall``: (at, for)
    nothing lands in that time (the broker's reader or channel stalled; what was due lands
    at its end) while the consumer goes on and the counts answer. ``speed_up``: (at, rate)
    the consumer takes up to ``rate`` a second from then on. A held queue is counted as the
    proxy counts it (``schedule.held_interval``). ``trace`` gets (time, admitted so far)
    at each count."""
    key, names = ("/", "q"), frozenset({"q"})
    fc = FlowController(Router(), policies_of(capacity_kib * 1024))
    fc.admission.hot_interval = hot
    fc.queue_seen(key, 0.0)
    fc.sampled_ready_count(key, 0.0, 0, RTT, RTT)
    on_way: list[float] = []  # landing times, in order
    ready = unacked = admitted = idle = counts = peak = 0
    taken, t, step, next_count = 0.0, 0.01, STEP, 0.01
    late: tuple[float, int] | None = None  # a count answered, not read yet

    def lands(at: float) -> float:
        if stall is not None and stall[0] <= at + lag < stall[0] + stall[1]:
            return stall[0] + stall[1]
        return at + lag
    for _ in range(capacity_kib + 50):
        fc.forwarded("/", names, 1024, t)
        on_way.append(lands(t))
    fc.block(1, 1, frozenset({key}), t)
    while t < seconds:
        t += step
        landed = sum(1 for x in on_way if x <= t)
        del on_way[:landed]
        ready += landed
        moved = min(ready, 200 - unacked)  # the broker fills the prefetch window
        ready, unacked = ready - moved, unacked + moved
        if speed_up is not None and t >= speed_up[0]:
            consume_per_s = speed_up[1]
        if stop_at is None or t < stop_at:
            taken += min(unacked, consume_per_s * step)
        done = int(taken)
        taken, unacked = taken - done, unacked - done
        peak = max(peak, ready)
        if slow_every and t >= next_count and counts % slow_every == slow_every - 1 \
                and late is None:
            late, next_count = (t - RTT, ready), t + slow_rtt  # counted now, read late
            continue
        if t >= next_count:
            if late is None:
                fc.sampled_ready_count(key, t - RTT, ready, RTT, t)
            else:
                fc.sampled_ready_count(key, late[0], late[1], t - late[0], t)
                late = None
            fc.take_output()
            while key in fc.tripped and fc.admits(frozenset({key}), t):
                fc.forwarded("/", names, 1024, t)
                on_way.append(lands(t))
                admitted += 1
            counts += 1
            idle += ready == 0 and unacked == 0
            if trace is not None:
                trace.append((t, admitted))
            q = fc.queues[key]
            every = held_interval(q.depth, q.policy, t, hot) if key in fc.tripped else hot
            next_count = t + every + RTT
    return admitted / (seconds - 0.01), peak, idle / counts


def stopped_bound(d: float, lag: float, budget: float, hot: float = HOT_INTERVAL) -> float:
    """The stopped-consumer bound (docs/design/pace.md, "Bounds"): ``d x min(h + r, 10 ms)``
    + what trusting the counts can cost for a true lag ``L`` beyond ``m_lo`` (at most ``S``,
    and at most the admissions of the counts within ``L - m_lo``: held publishes leave in
    one offer per count, ``h + r`` apart) + ``A x (L - m)`` + one message, ``A = d``."""
    c = min(hot + RTT, MAX_CREDIT_TIME)
    spacing = hot + RTT + STEP  # a count is read at the simulation's first step past it
    beyond = max(0.0, lag - TRUST_FLOOR)
    trusted = min(budget, d * spacing * math.ceil(beyond / spacing - 1e-9))
    return d * c + trusted + d * max(0.0, lag - HOT_MIN_MARGIN) + 1024


@pytest.mark.parametrize(("capacity_kib", "at_least"), [(1024, 0.9), (256, 0.8)])
def test_a_held_queue_keeps_up_with_a_fast_consumer(capacity_kib: int, at_least: float
                                                    ) -> None:
    """The pace scenario without the machine's noise: a consumer that takes 18,000 msg/s,
    a 2 ms enqueue lag. The held producer is admitted >= 0.9 of the consumer's rate at
    1 MiB and >= 0.8 at 256 KiB (the targets; 0.98 and 0.97 here). At 256 KiB it is the
    trust budget that does it: without it the 20 ms margin and counts 6 ms apart capped it
    at ~capacity / (m + r) (0.69; with the 64 KiB budget 0.87; docs/design/pace.md,
    "Bounds"). Before the pace fixes: 863/s and 3,102/s (0.05 and 0.17)."""
    rate, peak, _ = simulate_held(capacity_kib, 0.002, 18000.0, 3.0)
    assert rate >= at_least * 18000
    assert peak * 1024 <= capacity_kib * 1024 + 64 * 1024  # the goal: 64 KiB over at most


@pytest.mark.parametrize(("capacity_kib", "at_least"), [(1024, 0.9), (256, 0.8)])
def test_a_held_queue_reaches_its_consumers_pace_soon_after_its_trip(capacity_kib: int,
                                                                      at_least: float) -> None:
    """``bench.pace``'s run as it is on a quiet machine: 20,000 x 1 KiB in about 1.1 s to a
    consumer taking 20,000 msg/s, the trip and the drain estimate starting from nothing
    included: 0.86 at 256 KiB, 0.93 at 1 MiB (0.95 with a 20 ms margin floor; 0.67 and 0.95 with
    the drain estimate climbing at 0.3 a span and the trust budget 64 KiB)."""
    rate, _, _ = simulate_held(capacity_kib, 0.002, 20000.0, 1.1)
    assert rate >= at_least * 20000


@pytest.mark.parametrize("capacity_kib", [256, 1024])
@pytest.mark.parametrize("lag", [0.002, 0.015, 0.03])
def test_a_consumer_that_stops_dead_leaves_the_queue_within_256_kib(capacity_kib: int,
                                                                     lag: float) -> None:
    """The same, the consumer stopped dead after 1.5 s while the producer wants more: the
    queue stays within 256 KiB of its capacity, for a lag within m_lo (2 ms), one the
    counts hide between m_lo and m (15 ms: the trust budget's worst case) and one beyond m
    (30 ms). Bound (docs/design/pace.md, "Bounds"): d x min(h + r, 10 ms) + min(S, A x (L -
    m_lo) in whole count intervals) + A x (L - m) + one message, d = A = 18,000 x 1 KiB/s
    here (``stopped_bound``). At a 6 ms hot interval each count admits more: the bound grows
    with ``h`` and holds, and the 256 KiB is the default's (at 6 ms a 30 ms lag hidden from
    the counts took a 1 MiB queue 262 KiB over)."""
    d = 18000 * 1024
    budget = min(capacity_kib * 1024 * TRUST_PART, TRUST_BYTES)
    for hot in (HOT_INTERVAL, 0.006):
        rate, peak, _ = simulate_held(capacity_kib, lag, 18000.0, 3.0, stop_at=1.5, hot=hot)
        assert rate > 0
        over = peak * 1024 - capacity_kib * 1024
        assert over <= stopped_bound(d, lag, budget, hot)
        assert over <= 256 * 1024 or hot != HOT_INTERVAL


def test_a_steady_lag_the_counts_cannot_see_stays_within_the_bound() -> None:
    """A 100 ms enqueue lag (a loaded machine), a consumer at 3,000 msg/s that hides it:
    the queue stays within 256 KiB of its capacity (with the 1 s half-life and no false
    lag readings it reached 259 KiB over), and the consumer is kept busy."""
    rate, peak, idle = simulate_held(256, 0.1, 3000.0, 3.0)
    assert peak * 1024 <= 256 * 1024 + 256 * 1024
    assert rate >= 0.9 * 3000
    assert idle < 0.1


def stall_bound(d: float, stall: float, margin: float, c: float = 0.01) -> float:
    """What a stall of ``stall`` seconds (nothing lands, the consumer taking ``d`` messages a
    second goes on, the counts answer) can put over the capacity, in messages, where the
    counts do not show it falling (docs/design/pace.md, "Bounds"): every count takes what was
    forwarded more than ``m`` before it to be in the queue, finds it missing and admits it
    again, so each ``m`` of the stall admits up to what the margin holds (``d x m``), the
    consumer's take so far and the drain until the next count: ``d x L x (L - m) / (2m) +
    (L/m + 1) x d x (m + c)``."""
    return d * stall * max(0.0, stall - margin) / (2 * margin) \
        + (stall / margin + 1) * d * (margin + c)


def test_an_enqueue_stall_is_admitted_what_the_queue_fell_by() -> None:
    """Nothing lands for a while, the consumer goes on and the counts answer (the broker's
    reader or channel stalled: bench.pace on RabbitMQ 3.10 showed ~90 ms ones, the queue
    falling at its consumer's pace, then the held publishes landing at once). Taken to have
    landed after the margin, the missing publishes were admitted again at every count and
    the overshoot grew with the square of the stall (1 MiB, 4,600 msg/s: 30, 108, 422 and
    1,175 KiB over for 30, 50, 90 and 150 ms). While the counts fall one below the other the
    margins reach back to the fall's start (``falling_for``), a count admits what the queue
    fell by, and the queue stays near its capacity. At 256 KiB a stall longer than its
    content lasts (~45 ms here) empties it, a second count of 0 ends the fall (its consumer
    may be waiting) and the rest compounds as before, within ``stall_bound``."""
    for capacity_kib in (1024, 256):
        margin = margin_floor(policies_of(capacity_kib * 1024).policies[0], HOT_INTERVAL)
        for stall in (0.03, 0.05, 0.09, 0.15):
            _, peak, _ = simulate_held(capacity_kib, 0.002, 4600.0, 3.0, stall=(2.0, stall))
            over = peak - capacity_kib
            assert over <= stall_bound(4600.0, stall, margin)
            if capacity_kib == 1024 or stall <= 0.05:
                assert over <= 96  # KiB (the flood at the start: 50 over)


def test_in_a_fleet_an_untripped_queue_about_to_fill_is_counted_every_hot_interval() -> None:
    policy = POLICIES.policies[0]
    d = QueueDepth()
    d.sampled_ready_count(0.0, 0, RTT)
    for i in range(80):  # 8000 B/s: 2000 bytes left fill in 0.25 s
        d.forwarded(0.1 + i * 0.01, 100)
    share = ShareRule("me", (("me", None), ("other", None)))
    assert fill_time(d, policy, 1.0, share) <= 0.3
    assert sampling_interval(d, policy, False, 1.0, 0.3, 0.002) > 0.002  # alone
    assert sampling_interval(d, policy, False, 1.0, 0.3, 0.002, share) == 0.002
