"""Sans-IO: the fleet's shared budget enforced. Each member sizes its part of a
queue's headroom with a ``ShareRule`` (max-min fair on the announced demands); it trips when
it forwarded more than that part since its last count, and while held admits only that part
of each count's room. Then N members on one queue, their counts staggered, together stay
within ``capacity + R x max(0, W + L - m) + d x min(h + r, 10 ms) + N x M``
(docs/design/fleet.md, "The bound"), where one member alone would let N
capacities through; and members with equal demand are admitted equal parts of the drain."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from floodwall.control.admission import HOT_INTERVAL, allowance
from floodwall.control.controller import FlowController
from floodwall.control.depth import HOT_MIN_MARGIN, MAX_MARGIN, SETTLE
from floodwall.control.events import QueueTripped
from floodwall.control.fleet import (
    MIN_WANT,
    QueueReport,
    ShareRule,
    fleet_shares,
)
from floodwall.control.fleet_polls import fleet_count_interval
from floodwall.control.fleet_rate import CATCH_UP, RateShares
from floodwall.control.policy import parse_policies
from floodwall.control.schedule import fill_time
from floodwall.enforce.amqp10.credit import drain_part
from tests.test_gate import Router

CAPACITY = 1_000_000
M = 1000  # bytes per message
POLICIES = parse_policies("""
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders"}
    capacity: 1000000
    resume: 500000
""")
KEY = ("/", "orders")
NAMES = frozenset({"orders"})
RTT = 0.001
TICK_MS = 100


def rule(me: str, demands: dict[str, float | None], deaf_size: int = 0,
         others: float = 0.0) -> ShareRule:
    return ShareRule(me, tuple(sorted(demands.items())), deaf_size, others)


# -- the rule -------------------------------------------------------------------------------
demand_maps = st.dictionaries(st.sampled_from("abcdefgh"),
                              st.none() | st.floats(0, 1e7, allow_nan=False), min_size=1)


@given(demand_maps, st.floats(1, 1e7), st.floats(1, 1e7))
def test_shares_grow_with_the_headroom_and_never_sum_past_it(
        d: dict[str, float | None], h1: float, h2: float) -> None:
    lo, hi = sorted((h1, h2))
    for m in d:
        assert rule(m, d).share(lo) <= rule(m, d).share(hi) * (1 + 1e-9) + 1e-6
    assert sum(rule(m, d).share(lo) for m in d) <= lo * (1 + 1e-9) + 1e-6
    # members that sized their parts on different rooms take at most the largest room
    rooms = itertools.cycle((lo, hi))
    assert sum(rule(m, d).share(next(rooms)) for m in d) <= hi * (1 + 1e-9) + 1e-6


def test_an_idle_member_keeps_half_an_equal_share() -> None:
    d: dict[str, float | None] = {"busy": 1e9, "idle": 0.0, "new": None}
    shares = fleet_shares(900.0, d)
    assert shares["idle"] == pytest.approx(MIN_WANT * 300.0)
    assert shares["new"] == pytest.approx(300.0)
    assert shares["busy"] == pytest.approx(900.0 - 150.0 - 300.0)
    assert rule("idle", d).share(900.0) == pytest.approx(150.0)


def test_a_deaf_member_takes_at_most_the_room_over_the_last_known_size() -> None:
    assert rule("me", {"me": 1e9}, deaf_size=4).share(1000.0) == pytest.approx(250.0)
    # an overfull queue's negative room is not shared
    assert rule("me", {"me": 1.0, "b": 1.0}).share(-50.0) == -50.0


def test_the_table_gives_no_rule_to_a_member_alone_and_one_to_a_fleet() -> None:
    from tests.test_fleet import _ann, _table
    t = _table()
    t.heard(_ann("me", 1), 0.0)
    mine = QueueReport(0.0, 0, 5000.0)
    assert t.rule(KEY, mine, 0.01) is None
    t.heard(_ann("b", 1, demand=2000.0), 0.02)
    r = t.rule(KEY, mine, 0.03)
    assert r == ShareRule("me", (("b", 2000.0), ("me", 5000.0)), 0, 500.0)
    deaf = t.rule(KEY, mine, 10.0)  # not heard itself for the timeout: deaf, size 2 kept
    assert deaf is not None and deaf.fallback_size == 2


# -- one member: the trip and admission on its share ------------------------------------------
def member(share: ShareRule | None) -> FlowController:
    fc = FlowController(Router(), POLICIES)
    fc.queue_seen(KEY, 0.0)
    fc.sampled_ready_count(KEY, 0.0, 0, RTT, RTT)
    fc.set_share(KEY, share, RTT)
    return fc


def test_a_member_trips_when_its_share_of_the_room_is_used() -> None:
    fc = member(rule("me", {"me": None, "b": None, "c": None, "d": None}))
    t = 1.0
    for _ in range(CAPACITY // 4 // M):  # a quarter of the room: 25 messages
        fc.forwarded("/", NAMES, M, t)
    assert KEY not in fc.tripped
    fc.forwarded("/", NAMES, M, t)
    assert KEY in fc.tripped
    tripped = [e for e in fc.take_output() if isinstance(e, QueueTripped)]
    assert tripped and tripped[0].share_limit_bytes == CAPACITY // 4
    # alone (no rule), the same member forwards the whole capacity
    alone = member(None)
    for _ in range(CAPACITY // M):
        alone.forwarded("/", NAMES, M, t)
    assert KEY not in alone.tripped


def test_held_a_member_admits_its_share_of_the_room_each_count_shows() -> None:
    # b forwards 29 messages a second: its announced ingress
    fc = member(rule("me", {"me": 1e9, "b": 1e9}, others=29.0 * M))
    t = 1.0
    for _ in range(CAPACITY // 2 // M + 1):
        fc.forwarded("/", NAMES, M, t)
    assert KEY in fc.tripped
    # a count a second later: the queue holds its 501 messages and b's 29
    fc.sampled_ready_count(KEY, t + 1.0, 530, RTT, t + 1.0 + RTT)
    q = fc.queues[KEY]
    a = allowance(q, t + 1.0 + RTT, HOT_INTERVAL)
    assert a is not None
    forwarded = q.depth.forwarded_bytes_total
    # half of the 470 messages' room (no drain); b's 29 messages in the count were its
    # announced ingress, not an enqueue lag
    assert a.bytes == pytest.approx(forwarded + (CAPACITY - 530 * M) / 2, abs=M / 10)
    assert q.depth.enqueue_lag < 0.1


def test_a_fall_in_the_counts_reaches_back_for_a_sidecar_alone_not_for_a_member() -> None:
    """While the counts fall, each below the one before, a sidecar alone takes what was
    forwarded since the fall began to be still on its way (``QueueDepth.falling_for``: an
    enqueue stall); a member does not: its rate share holds what it is admitted near the
    drain through a stall, and a margin longer than the fleet's room target would let the
    room decide instead, unevenly among members (docs/design/fleet.md)."""
    margins = {}
    for name, share in (("alone", None), ("member", rule("me", {"me": 1e9, "b": 1e9}))):
        fc = member(share)
        for _ in range(CAPACITY // M + 1):
            fc.forwarded("/", NAMES, M, 1.0)
        assert KEY in fc.tripped
        at = 1.3  # past SETTLE: the trip's own margin is over
        for i in range(10):  # a count every 8 ms, each 12 messages below the one before
            at = 1.3 + i * 0.008
            fc.sampled_ready_count(KEY, at, 900 - 12 * i, RTT, at + RTT)
        a = allowance(fc.queues[KEY], at + RTT, HOT_INTERVAL)
        assert a is not None
        margins[name] = a.margin
    assert margins["alone"] == pytest.approx(0.064)  # since the first count that fell
    assert margins["member"] == pytest.approx(0.04)  # the floor for 1 MB (margin_floor)


def test_without_the_others_ingress_their_messages_read_as_lag() -> None:
    """Read as one sidecar reads it (a rise beyond all it forwarded since the earlier count),
    but capped at SETTLE in a fleet (it may be the others' publishes, not announced yet:
    a fresh queue's first fill) where one sidecar alone takes it up to MAX_MARGIN."""
    for share, lag in ((rule("me", {"me": 1e9, "b": 1e9}), SETTLE), (None, MAX_MARGIN)):
        fc = member(share)
        for _ in range(CAPACITY // 2 // M + 1):
            fc.forwarded("/", NAMES, M, 1.0)
        fc.sampled_ready_count(KEY, 2.0, 530, RTT, 2.0 + RTT)
        assert fc.queues[KEY].depth.enqueue_lag == lag


def test_the_fleets_ingress_makes_a_queue_hot_before_its_own_would() -> None:
    fc = member(None)
    q = fc.queues[KEY]
    for i in range(10):  # 10 KB/s of its own over the last second
        fc.forwarded("/", NAMES, M, 0.1 * i + 0.05)
    assert fill_time(q.depth, q.policy, 1.0) > 0.2  # not predicted to fill: cold
    busy = ShareRule("me", (("b", 5e6), ("me", 1e4)), 0, 5e6)  # b forwards 5 MB/s
    assert fill_time(q.depth, q.policy, 1.0, busy) <= 0.2


# -- N members on one queue -----------------------------------------------------------------
def simulate(n: int, shared: bool, seconds: float, drain_per_ms: float = 0.0,
             speed_per_ms: int = 5, hot: float = 0.005, lag_ms: int = 0,
             demands_per_ms: list[float] | None = None) -> tuple[int, list[int]]:
    """``n`` members, each with a producer publishing ``speed_per_ms`` messages a ms (or its
    own ``demands_per_ms``), counting the queue every ``hot`` seconds, the counts staggered
    evenly; the consumers take ``drain_per_ms``; a publish reaches the queue ``lag_ms``
    after it is forwarded. Returns the queue's peak (messages) and what each member
    forwarded."""
    names = [f"m{i}" for i in range(n)]
    members = [member(rule(m, dict.fromkeys(names)) if shared else None) for m in names]
    ticked = [0] * n  # what each had sent at the last tick
    depth, drained, peak = 0, 0.0, 0
    landing: list[int] = [0] * (lag_ms + 1)
    sent = [0] * n
    credit = [0.0] * n
    every = max(1, round(hot * 1000))
    for ms in range(int(seconds * 1000)):
        now = ms / 1000
        if shared and ms % TICK_MS == 0 and ms:  # the fleet's tick: announced ingress
            rates = [(sent[i] - ticked[i]) * M / (TICK_MS / 1000) for i in range(n)]
            demands: dict[str, float | None] = (
                dict.fromkeys(names) if demands_per_ms is None
                else {m: d * M * 1000 for m, d in zip(names, demands_per_ms, strict=True)})
            for i, fc in enumerate(members):
                fc.set_share(KEY, rule(names[i], demands,
                                       others=sum(rates) - rates[i]), now)
            ticked = list(sent)
        for i, fc in enumerate(members):  # counts, staggered
            if (ms + i * every // n) % every == 0:
                fc.sampled_ready_count(KEY, now, depth, RTT, now + RTT)
        order = list(range(n))[ms % n:] + list(range(n))[:ms % n]
        for i in order:
            fc = members[i]
            credit[i] += speed_per_ms if demands_per_ms is None else demands_per_ms[i]
            while credit[i] >= 1:
                if KEY in fc.tripped and not fc.admits(frozenset({KEY}), now + RTT):
                    break
                credit[i] -= 1
                fc.forwarded("/", NAMES, M, now + RTT)
                fc.take_output()
                sent[i] += 1
                landing[-1] += 1
        depth += landing.pop(0)
        landing.append(0)
        drained += drain_per_ms
        take = min(depth, int(drained))
        depth -= take
        drained -= take
        peak = max(peak, depth)
        for fc in members:
            fc.take_output()
    return peak, sent


@pytest.mark.parametrize("n", [2, 4, 8])
def test_n_members_stay_within_the_bound_where_alone_each_lets_a_capacity_through(n: int
                                                                                   ) -> None:
    cap = CAPACITY // M
    fast = 20  # messages a ms per producer: the room fills in 50 / n ms
    # counted every 200 ms (the slow interval), staggered: alone, each member fills the
    # whole room it saw before its next count shows it the others' work
    alone, _ = simulate(n, shared=False, seconds=0.3, hot=0.2, speed_per_ms=fast)
    assert alone >= 0.9 * n * cap
    # sharing, the first fill is each member's share of the same empty queue: capacity,
    # plus one message per member, plus a few (the stagger W = 200 ms is past the margin
    # here, so the formula allows R x (W + L - m); observed: at most 2 N messages)
    peak, _ = simulate(n, shared=True, seconds=0.3, hot=0.2, speed_per_ms=fast)
    assert peak <= cap + 2 * n
    # counted every 5 ms: the stagger W (< 5 ms) and the lag L (0 or 2 ms) are inside the
    # margin m (>= HOT_MIN_MARGIN = 20 ms), so the bound is capacity + N x M (d = 0) ...
    for lag in (0, 2):
        assert 0.005 + lag / 1000 <= HOT_MIN_MARGIN
        peak, _ = simulate(n, shared=True, seconds=0.3, lag_ms=lag, speed_per_ms=fast)
        assert peak <= cap + n
        # ... and with consumers taking 2 messages a ms, + d x min(h + r, 10 ms) = 20
        peak, _ = simulate(n, shared=True, seconds=1.0, lag_ms=lag, drain_per_ms=2.0,
                           speed_per_ms=fast)
        assert peak <= cap + n + 20


@pytest.mark.parametrize("n", [2, 4, 8])
def test_members_counting_every_n_hot_intervals_stay_within_the_bound(n: int) -> None:
    """Item 2: in a fleet each member counts a hot queue every N x h
    (``fleet_count_interval``), the fleet about once per h together (the broker's passive
    declares per hot queue flat in N). The stagger W reaches (N - 1) x h, past the margin
    m (20 ms) for N = 8: the formula allows R x (W + L - m) more; observed within 3 N
    messages of the capacity with an enqueue lag of up to 2 ms."""
    names = [f"m{i}" for i in range(n)]
    every = fleet_count_interval(HOT_INTERVAL, rule("m0", dict.fromkeys(names)), 0.2)
    assert every == pytest.approx(n * HOT_INTERVAL)
    assert fleet_count_interval(HOT_INTERVAL, None, 0.2) == HOT_INTERVAL
    # only the active members share the count rate; an idle one counts at the slow interval
    busy = {m: (1e6 if i < 2 else 0.0) for i, m in enumerate(names)}
    assert fleet_count_interval(HOT_INTERVAL, rule("m0", busy), 0.2) == \
        pytest.approx(2 * HOT_INTERVAL)
    if n > 2:
        assert fleet_count_interval(HOT_INTERVAL, rule("m2", busy), 0.2) == 0.2
    cap = CAPACITY // M
    for lag in (0, 2):
        peak, _ = simulate(n, shared=True, seconds=0.3, lag_ms=lag, speed_per_ms=20,
                           hot=every)
        assert peak <= cap + 3 * n
        peak, _ = simulate(n, shared=True, seconds=1.0, lag_ms=lag, drain_per_ms=2.0,
                           speed_per_ms=20, hot=every)
        assert peak <= cap + 3 * n + 20
    # a 5 ms lag: over the formula's N x M in both ways of counting (capped: up to 20
    # messages with 4 or 8 members; every member every h: up to 29 with 8)
    capped, _ = simulate(n, shared=True, seconds=0.3, lag_ms=5, speed_per_ms=20, hot=every)
    each, _ = simulate(n, shared=True, seconds=0.3, lag_ms=5, speed_per_ms=20)
    assert capped <= cap + 6 * n and each <= cap + 6 * n
    # held, equal demands: as even, and as much admitted, as counting every h
    peak, sent = simulate(n, shared=True, seconds=3.0, drain_per_ms=2.0, hot=every)
    assert peak <= cap + 3 * n + 20
    assert sum(sent) ** 2 / (n * sum(x * x for x in sent)) >= 0.99
    assert sum(sent) >= 0.95 * (3000 * 2.0 + 0.85 * cap)


def test_members_with_equal_demand_share_the_drain_evenly() -> None:
    # 8 members at 5 msg/ms each into a queue drained at 2 msg/ms: held at capacity
    peak, sent = simulate(8, shared=True, seconds=3.0, drain_per_ms=2.0)
    assert peak <= CAPACITY // M + 8 + 20
    jain = sum(sent) ** 2 / (len(sent) * sum(x * x for x in sent))
    assert jain >= 0.99
    # together they are admitted the drain: what left (6,000), plus what the queue holds
    assert sum(sent) >= 0.95 * (3000 * 2.0 + 0.85 * CAPACITY // M)


def test_a_modest_member_gets_its_demand_and_the_greedy_one_the_rest() -> None:
    # 0.3 msg/ms (300/s) and 20 msg/ms into a queue drained at 2 msg/ms (2,000/s)
    _, sent = simulate(2, shared=True, seconds=3.0, drain_per_ms=2.0,
                       demands_per_ms=[0.3, 20.0])
    assert sent[0] >= 0.95 * 0.3 * 3000  # all it asked for
    assert sent[1] >= 0.9 * (3000 * 2.0 - sent[0])


def test_a_fresh_queue_counts_the_members_that_have_not_reported_it_yet() -> None:
    """A queue declared for the whole fleet at once: each member polices it before it hears
    the others report it. Until they announce after it began policing the queue, the
    members of its vhost that have not reported it count as newcomers (an equal share
    each), not as absent (the whole room: N members each taking it was bench.fleet's first
    fill, 8 x 1 MiB; with a fixed 1.2 s grace, 4 x 1 MiB where announcements took longer on
    a loaded machine)."""
    from tests.test_fleet import _ann, _table
    t = _table()
    t.heard(_ann("me", 1), 0.0)
    for m in ("b", "c", "d"):
        t.heard(_ann(m, 1, queue="other"), 0.01)  # on the vhost, not (yet) reporting KEY
    mine = QueueReport(0.0, 0, None)
    assert t.rule(KEY, mine, 0.02) is None  # policed for long: they do not police it
    fresh = t.rule(KEY, mine, 2.0, since=0.02)  # however long their next one takes
    assert fresh is not None
    assert fresh.share(1000.0) == pytest.approx(250.0)
    # b announces since, still without it: it does not police it; c now reports it.
    t.heard(_ann("b", 2, queue="other"), 2.1)
    t.heard(_ann("c", 2, demand=None), 2.1)
    later = t.rule(KEY, mine, 2.2, since=0.02)
    assert later is not None
    assert dict(later.demands) == {"c": None, "d": None, "me": None}


# -- fair in bytes per second: members that are late, slow or far ----------------------------
@dataclass(frozen=True)
class Uneven:
    """One member of ``simulate_uneven``: its count's round trip (ms: its margin is
    ``max(2 x rtt, 20 ms, lag)``), its offset (ms: when its loop first runs), a stall of its
    event loop (``stall_ms`` out of every ``period_ms``, from ``offset_ms`` on: no counts,
    no admissions, no fleet tick) and its producer's refill speed (messages a ms)."""

    rtt_ms: int = 1
    offset_ms: int = 0
    stall_ms: int = 0
    period_ms: int = 1000
    speed_per_ms: float = 5.0


def _stalled(u: Uneven, ms: int) -> bool:
    return ms < u.offset_ms or (u.stall_ms > 0
                                and (ms - u.offset_ms) % u.period_ms < u.stall_ms)


def simulate_uneven(us: list[Uneven], seconds: float, drain_per_ms: float,
                    hold_messages: int = 2000, from_s: float = 1.0,
                    stall: tuple[float, float] | None = None) -> tuple[int, list[int]]:
    """Members ``us`` on one queue drained at ``drain_per_ms``, each counting it back to back
    (one count in flight, answered ``rtt_ms`` later, the next asked 5 ms after the answer),
    admitting its held publishes only when its loop runs, its producer refilling a hold of
    ``hold_messages`` at its own speed. ``stall``: (at, for) seconds in which the broker
    enqueues nothing while the consumers go on (what is forwarded meanwhile lands when it
    ends). Returns the queue's peak (messages) and what each forwarded after ``from_s``."""
    names = [f"m{i}" for i in range(len(us))]
    members = [member(rule(m, dict.fromkeys(names))) for m in names]
    sent, ticked, after = [0] * len(us), [0] * len(us), [0] * len(us)
    rates = [0.0] * len(us)  # what each announced it forwards (bytes/s)
    held = [0.0] * len(us)
    asked: list[tuple[int, float, int] | None] = [None] * len(us)  # (answer ms, at, ready)
    next_ask = [u.offset_ms for u in us]
    depth, drained, peak, landing = 0, 0.0, 0, 0
    stall_ms = (-1, -1) if stall is None else (int(stall[0] * 1000),
                                               int((stall[0] + stall[1]) * 1000))
    for ms in range(int(seconds * 1000)):
        now = ms / 1000
        stalled = stall_ms[0] <= ms < stall_ms[1]
        if not stalled:
            depth, landing = depth + landing, 0
        if ms % TICK_MS == 0:
            rates = [(sent[i] - ticked[i]) * M / (TICK_MS / 1000) for i in range(len(us))]
            ticked = list(sent)
        for i, (u, fc) in enumerate(zip(us, members, strict=True)):
            held[i] = min(hold_messages, held[i] + u.speed_per_ms)
            if _stalled(u, ms):
                continue
            if (ms - u.offset_ms) % TICK_MS == 0:  # its fleet tick: the announced ingress
                fc.set_share(KEY, rule(names[i], dict.fromkeys(names),
                                       others=sum(rates) - rates[i]), now)
            a = asked[i]
            if a is not None and ms >= a[0]:  # the answer: its count, its admissions
                fc.sampled_ready_count(KEY, a[1], a[2], u.rtt_ms / 1000, now)
                asked[i], next_ask[i] = None, ms + 5
            if asked[i] is None and ms >= next_ask[i]:
                asked[i] = (ms + u.rtt_ms, now, depth)
            while held[i] >= 1 and not (KEY in fc.tripped
                                        and not fc.admits(frozenset({KEY}), now)):
                fc.forwarded("/", NAMES, M, now)
                held[i] -= 1
                sent[i] += 1
                if stalled:
                    landing += 1
                else:
                    depth += 1
                after[i] += ms >= from_s * 1000
            fc.take_output()
        drained += drain_per_ms
        take = min(depth, int(drained))
        peak = max(peak, depth)
        depth, drained = depth - take, drained - take
    return peak, after


def jain(xs: list[int]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


UNEVEN = [Uneven(rtt_ms=1), Uneven(rtt_ms=5, offset_ms=7), Uneven(rtt_ms=20, offset_ms=13),
          Uneven(rtt_ms=40, offset_ms=29),
          Uneven(rtt_ms=1, stall_ms=500, period_ms=1200, offset_ms=41),
          Uneven(rtt_ms=2, stall_ms=300, period_ms=700, offset_ms=53),
          Uneven(rtt_ms=1, speed_per_ms=0.5), Uneven(rtt_ms=4, speed_per_ms=0.35, offset_ms=61)]


def test_late_far_and_slow_members_are_admitted_equal_bytes_per_second() -> None:
    """8 members of equal demand (every producer faster than its part of the drain, 0.25
    messages a ms) on a queue held at capacity: margins of 20 to 80 ms, loops that start
    late or stall for 300-500 ms, producers that refill at 0.35 to 5 messages a ms. Their
    rate shares (``floodwall.control.fleet_rate``) make the bytes each is admitted per second
    even (Jain >= 0.95, each within 10 % of the mean), where shares of each count's room
    alone gave each about ``share x room / margin`` a second (one member a quarter below the
    mean); and the queue stays within the fleet's bound."""
    peak, got = simulate_uneven(UNEVEN, seconds=5.0, drain_per_ms=2.0)
    assert jain(got) >= 0.95, got
    mean = sum(got) / len(got)
    assert all(abs(x - mean) <= 0.1 * mean for x in got), got
    assert sum(got) >= 0.9 * 4000 * 2.0  # together, about the drain (the pace)
    assert peak <= CAPACITY // M + 8 + 20


def test_without_rate_shares_the_same_members_are_not_as_even(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The same fleet, each member admitted its share of each count's room only."""
    monkeypatch.setattr(RateShares, "ceiling", lambda *_: (math.inf, math.inf))
    _, got = simulate_uneven(UNEVEN, seconds=5.0, drain_per_ms=2.0)
    mean = sum(got) / len(got)
    assert min(got) < 0.8 * mean, got


@pytest.mark.parametrize("stall_s", [0.05, 0.15])
def test_a_fleet_through_an_enqueue_stall_stays_within_the_bound(stall_s: float) -> None:
    """8 members held at 2 messages a ms; the broker enqueues nothing for 50 or 150 ms while
    its consumers go on. Their rate shares hold what they are admitted near the drain, so
    what the stall held back lands in the room the queue fell by and the room the fleet
    keeps (``R0``): within 256 KiB of the capacity (one sidecar alone would take what it
    forwarded meanwhile as drained and admit it again at every count, but for
    ``QueueDepth.falling_for``: tests/test_pace.py)."""
    us = [Uneven(rtt_ms=1 + i, offset_ms=7 * i) for i in range(8)]
    peak, got = simulate_uneven(us, seconds=3.0, drain_per_ms=2.0, stall=(1.5, stall_s))
    assert peak <= (CAPACITY + 256 * 1024) // M, peak
    assert jain(got) >= 0.95, got


@settings(max_examples=6, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.generate))  # each example simulates 4 s
@given(st.lists(st.builds(Uneven, rtt_ms=st.integers(1, 30), offset_ms=st.integers(0, 99),
                          stall_ms=st.sampled_from([0, 0, 100, 300, 450]),
                          period_ms=st.integers(600, 1500),
                          speed_per_ms=st.sampled_from([0.3, 0.5, 1.0, 5.0])),
                min_size=4, max_size=8))
def test_any_such_fleet_is_admitted_evenly_per_second(us: list[Uneven]) -> None:
    """Equal demand: each producer refills faster than its part of the drain (0.25 a ms)."""
    peak, got = simulate_uneven(us, seconds=4.0, drain_per_ms=0.25 * len(us))
    assert jain(got) >= 0.95, got
    assert peak <= CAPACITY // M + len(us) + 20


class _Flat:
    """A rate rule that gives this member ``rate`` bytes/s, whatever the feed."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def rate_share(self, rate: float) -> float:
        return self.rate

    def fraction(self, room_bytes: float | None, room_messages: float | None,
                 body_bytes: int) -> float:
        return 1.0


@given(st.lists(st.tuples(st.floats(0, 0.3), st.floats(0, 1)), min_size=1, max_size=60),
       st.floats(1e4, 1e7))
def test_a_rate_share_admits_its_rate_plus_at_most_its_bank(
        steps: list[tuple[float, float]], rate: float) -> None:
    """Fed at ``rate``: over any run of feeds, what a member may forward is at most its rate
    times the time plus ``CATCH_UP`` seconds of it and one message; and after a gap of up to
    ``CATCH_UP`` in which it forwarded nothing, it may forward the whole gap's worth."""
    q = member(None).queues[KEY]
    q.tripped_since = 0.0
    shares, flat, now = RateShares(), _Flat(rate), 0.0
    assert shares.ceiling(KEY, q, flat, now) == (0.0, 0.0)  # no tokens at the trip
    for dt, use in steps:
        now += dt
        top, _ = shares.ceiling(KEY, q, flat, now)
        forwarded = q.depth.forwarded_bytes_total
        assert top - forwarded <= rate * CATCH_UP + M + 1e-6 * rate  # the bank
        assert top - forwarded >= min(dt, CATCH_UP) * rate - 1e-6 * rate
        for _ in range(int((top - forwarded) * use // M)):
            q.depth.forwarded(now, M)
        assert q.depth.forwarded_bytes_total <= rate * (now + CATCH_UP) + M


def test_a_members_1_0_links_pace_to_its_rate_share_of_the_drain() -> None:
    """Near capacity a 1.0 link's window is the drain per probe interval; in a fleet, this
    member's part of it (``drain_part``: its rate share, as held 0-9-1 admission has it), so
    N members pacing their links feed the queue at its drain together, not N times it."""
    fc = member(rule("me", {"me": 5e6, "b": 5e6, "c": 5e6, "d": 5e6}))
    q = fc.queues[KEY]
    q.depth.drain_rate = 100.0  # messages/s
    assert drain_part(q) == pytest.approx(0.25)
    modest = member(rule("me", {"me": 1.0, "b": 5e6}))  # it needs 1 B/s of the drain
    modest.queues[KEY].depth.drain_rate = 100.0
    assert 0 < drain_part(modest.queues[KEY]) < 0.01
    alone = member(None)
    alone.queues[KEY].depth.drain_rate = 100.0
    assert drain_part(alone.queues[KEY]) == 1.0
    q.depth.drain_rate = 0.0  # nothing drains: nothing to share (the window is paced to 0)
    assert drain_part(q) == 1.0
