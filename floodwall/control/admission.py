"""Admission while a queue is held: a token bucket per tripped queue.

A tripped queue's publishes are held (0-9-1) as before; what changes is how they leave. Not
all at once when the queue falls to its ``resume`` level, but continuously, at the rate the
queue drains: after every ready count of a tripped queue the controller hands its waiting
channels a ``ChannelAdmitted`` (round robin: the first one served moves on each time), and
each gate lets its held publishes go while ``admits`` says the queue has tokens.

The tokens are a ledger total (``allowance``): held publishes may go while the queue's
``forwarded_bytes_total`` (and ``forwarded_messages_total``) are below it. With ``t`` the
time the newest ready count ``c`` was asked for, ``B`` the depth it gives (``c`` x mean body
size: ready messages only, what a capacity counts, ``floodwall.control.depth.Depth``),
``F(x)`` the ledger total forwarded before ``x``, ``m`` the in-flight margin, ``d`` the drain
rate (bytes/s, ``QueueDepth.drain_rate`` x mean body size), ``h`` the hot sampling interval
and ``r`` the count's round trip:

    allowance = capacity - (B + F(now) - F(t - m)) + F(now) + d x min(h + r, MAX_CREDIT_TIME)
              = capacity - B + F(t - m) + d x min(h + r, MAX_CREDIT_TIME)

that is, the headroom the count shows (what was forwarded in the last ``m`` before it is
counted on top of it, as the trip estimate does) plus what the consumers take until the next
count (``credit_time``: credited at once, as publishes are admitted only at counts): if the
consumers stop dead at the count, the queue receives at most ``d x min(h + r, 10 ms)`` plus
one message beyond its capacity before the next count (which shows no drain, and no
headroom), plus ``min(S, A x (h + r) x ceil((L - m_lo) / (h + r)))`` for a true lag ``L``
beyond ``m_lo`` (the trust budget below: held publishes leave in one offer per count). Each
count's allowance stands on its own (it is not added to the last one's), so a drain
estimate that lags behind a stop does not add up: the bound holds at every count.

The trust budget (one sidecar). What was forwarded within ``m`` of a
count is counted on top of it even when it is in it, and that double count, not the drain,
capped a held queue's admitted rate at about ``capacity / (m + r)`` (0.69 of an 18,000 msg/s
consumer at 256 KiB). So a count is trusted with part of it: with ``m_lo = max(2 x r,
lag, TRUST_FLOOR)`` (``trusted_margin``: the lag the counts show, ``SETTLE`` within
``SETTLE`` of a trip, 10 ms at least) and ``S`` = half the limit, at most 128 KiB
(``trust_budget``), ``F(t - m)`` above becomes

    min(F(t - m_lo), F(t - m) + S)

that is, of what was forwarded between ``m_lo`` and ``m`` before the count, at most ``S`` is
taken to be in it. If the true lag ``L`` is within ``m_lo`` that is exact; if it is not (a lag
the counts cannot see: consumers hide it), the count holds ``S`` less than it is credited
with, so the overshoot bound grows by at most ``S`` (and by no more than the offers of the
counts within ``L - m_lo``), however long the lag. (A lower margin floor alone, 2 ms,
over-admits by megabytes on a loaded machine: the budget is what bounds the
cost of trusting the counts.)

Steady state, admitting ``A`` = ``d``: ``A x (m + r) <= capacity + S - B + d x (h + r)``,
so the admitted rate can keep up with consumers while ``d x (m - h) <= capacity + S - B``:
21 MB/s for 256 KiB with ``m`` = 20 ms and ``h`` = 5 ms (17 MB/s without the budget);
counts being discrete (what one admits is counted by whole intervals), 0.87 of an
18,000 msg/s consumer in tests/test_pace.py's simulation (0.69 without).

In a fleet (``floodwall.control.fleet.ShareRule``) each sidecar admits only its share of
that room, with no trust budget (each member's would add up): ``F(t - m) + share(capacity -
B + d x min(h + r, 10 ms))``; the members' shares of
one room sum to at most that room, and a share never shrinks as the room grows, so the fleet
together admits at most the largest room any member's count showed; and no more than its
rate share (``floodwall.control.fleet_rate``: a token bucket fed at its share of the drain),
so members are admitted equal bytes per second, not equal parts of each count's room.

The margin ``m`` is ``max(2 x r_high, floor, lag)`` (``margin_floor``: 20 ms for a small
capacity, up to 40 ms for 1 MiB and more, the longest that keeps the steady-state ceiling
above at ``CEILING_BYTES_PER_S``): ``r_high`` the longest round
trip of the recent counts (``QueueDepth.rtt_high``, halving every 0.1 s, ``RTT_HALF_LIFE``), ``lag``
the lag the counts show (``QueueDepth.enqueue_lag``), and ``SETTLE`` for the counts asked
for within ``SETTLE`` of a trip (``QueueDepth.lag_at``: what went before the trip may be a
flood still on its way into the queue), so the first admissions wait until the
counts can hold it; and, for one sidecar, while the counts have fallen one below the other
for longer than ``FALL_AFTER`` (15 ms), how long (``QueueDepth.falling_for``: a stall, whose
forwarded publishes taken to have landed would be admitted again at every count, or a
consumer speeding up). ``m_lo`` (``trusted_margin``) reaches back as far. Not in a fleet: a
member's rate share already holds what it is admitted near the drain through a stall, and a
margin past the fleet's room target would let each count's room decide what each member
gets, unevenly (docs/design/fleet.md, "Fair per second").

Pure: every entry point takes ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from floodwall.control.depth import (
    HOT_MIN_MARGIN,
    LEDGER_BUCKET,
    Depth,
    QueueDepth,
    RoomShare,
    shared,
)
from floodwall.control.events import ChannelAdmitted
from floodwall.control.fleet_rate import RateRule, RateShares
from floodwall.control.policy import Policy

#: Default least seconds between two ready counts of one hot queue (a passive declare each):
#: bench/pace.py measured the broker's CPU for 1, 2 and 5 ms (docs/performance.md).
HOT_INTERVAL = 0.005
#: Longest the drain is credited after a count (seconds): the bound below holds with it.
MAX_CREDIT_TIME = 0.01
#: The trust budget ``S`` (module docstring): half the limit, at most 128 KiB, of what was
#: forwarded between ``m_lo`` and ``m`` before a count. A quarter and 64 KiB would hold a
#: 256 KiB queue near empty to 0.68 of a 20,000 msg/s consumer over the first second after
#: a trip (0.81 with this budget; tests/test_pace.py's simulation), while the
#: stopped-consumer bound it adds to stays within 256 KiB.
TRUST_PART = 0.5
TRUST_BYTES = 128 * 1024
#: ``m_lo`` is at least this (seconds): publishes within ``LEDGER_BUCKET`` (5 ms) of each
#: other share one ledger entry, stamped with the first, so ``F(x)`` may hold publishes
#: forwarded up to 5 ms after ``x``.
TRUST_FLOOR = 2 * LEDGER_BUCKET
#: The margin ``m``'s floor (``margin_floor``) is the largest, up to ``MAX_MARGIN_FLOOR``, that
#: keeps the admission's steady-state ceiling ``(capacity + S) / (m - h)`` at this rate at
#: least (bytes a second: about twice the consumers bench/pace.py measures on this machine).
CEILING_BYTES_PER_S = 32e6
#: The highest floor (seconds): with 40 ms a 1 MiB queue held on RabbitMQ 4.0 under CPU
#: contention stayed within its bound in six runs of six, against four of six beyond it with
#: 20 ms (docs/performance.md, "Held producers at their consumers' pace").
MAX_MARGIN_FLOOR = 0.04

Ref = tuple[int, int]  # (connection id, channel)
QueueKey = tuple[str, str]  # (vhost, queue)


class HeldQueue(Protocol):
    """What admission reads of a policed queue (``floodwall.control.controller.PolicedQueue``)."""

    depth: QueueDepth
    policy: Policy
    tripped_since: float | None

    @property
    def share(self) -> RateRule | None: ...


@dataclass(frozen=True, slots=True)
class Allowance:
    """Ledger totals up to which a held queue may take publishes, until its next count."""

    bytes: float
    messages: float
    margin: float  # the in-flight margin used (seconds)
    count_at: float  # when the count it stands on was asked for


def allowance(q: HeldQueue, now: float, hot_interval: float) -> Allowance | None:
    """The queue's allowance now (module docstring), or None: nothing may be admitted (the
    depth is unknown, or its newest figure is a management sample, seconds old). It is the
    newest count's: it does not grow while the next count is late."""
    depth = q.depth
    base = depth.counted_base
    at = depth.ready_count_at
    if base is None or at is None:
        return None
    rtt = depth.ready_rtt
    policy = q.policy
    alone = q.share is None
    margin = max(depth.ready_margin if rtt is None
                 else max(2 * max(rtt, depth.rtt_high), margin_floor(policy, hot_interval)),
                 depth.lag_at(at), depth.falling_for(at) if alone else 0.0)
    before: tuple[float, float] = depth.totals_before(at - margin)
    if rtt is not None and alone:  # one sidecar: the trust budget
        before = _trusted(depth, policy, at, rtt, before)
    before_bytes, before_messages = before
    credit = (depth.drain_rate or 0.0) * credit_time(hot_interval, rtt)
    room_bytes, room_messages = held_room(policy, base, credit, depth.average_body_bytes(),
                                          q.share)
    return Allowance(math.inf if room_bytes is None else before_bytes + room_bytes,
                     math.inf if room_messages is None else before_messages + room_messages,
                     margin, at)


def held_room(policy: Policy, counted: Depth, drained: float, body: float,
              share: RoomShare | None = None) -> tuple[float | None, float | None]:
    """The admission rule: what a held queue may take (bytes, messages) on top of what a
    count of ``counted`` already holds, until its next count: the room the count leaves
    below ``policy``'s limits plus what its consumers take meanwhile (``drained``
    messages, at ``body`` bytes each), and in a fleet (``share``: ``fleet.ShareRule``)
    only this sidecar's part of that room. None: the policy sets no such limit.

    The proxy counts every few milliseconds and credits the drain over ``credit_time``
    (``allowance`` adds the ledger total the count holds); the what-if replay
    (``floodwall_pipeline.replay``) counts at every step of its telemetry's buckets, with a
    ledger that has nothing in flight, and credits that step's drain."""
    room_bytes = (None if policy.capacity <= 0
                  else policy.capacity - counted.bytes + drained * body)
    room_messages = (None if policy.max_messages is None
                     else policy.max_messages - counted.messages + drained)
    if share is not None:  # a fleet: this sidecar's part of the room (fleet.ShareRule)
        f = share.fraction(room_bytes, room_messages, body)
        room_bytes = None if room_bytes is None else shared(room_bytes, f)
        room_messages = None if room_messages is None else shared(room_messages, f)
    return room_bytes, room_messages


def margin_floor(policy: Policy, hot_interval: float) -> float:
    """The least margin ``m`` for a queue under ``policy``: a lag the counts do not show
    (consumers taking messages between two counts hide it) puts ``A x (L - m)`` over the
    capacity, so ``m`` should be long; but a held queue's admitted rate cannot pass ``(capacity
    + S) / (m - h)`` (``h`` the hot interval), so it may not be long for a small capacity.
    The floor is the longest that keeps that ceiling at ``CEILING_BYTES_PER_S``, within
    ``[HOT_MIN_MARGIN, MAX_MARGIN_FLOOR]``: 20 ms for 256 KiB, 40 ms for 1 MiB and more;
    ``HOT_MIN_MARGIN`` for a policy without a byte capacity."""
    if policy.capacity <= 0:
        return HOT_MIN_MARGIN
    room = policy.capacity + trust_budget(policy)[0]
    return min(MAX_MARGIN_FLOOR,
               max(HOT_MIN_MARGIN, room / CEILING_BYTES_PER_S + hot_interval))


def trusted_margin(depth: QueueDepth, at: float, rtt: float) -> float:
    """``m_lo``: how long before a count asked for at ``at`` a publish is trusted to be in
    it, as far as the trust budget goes: twice this count's round trip, the lag the counts
    show (``SETTLE`` for the counts within ``SETTLE`` of a trip), how long they have fallen
    (``QueueDepth.falling_for``: a stall's publishes are not in them) and ``TRUST_FLOOR`` at
    least. This count's round trip, not the longest recent one (``rtt_high``, which the
    margin ``m`` keeps): ``rtt_high`` is a decaying maximum over some 200 counts a second,
    so one count delayed by the proxy's own loop or the OS (docs/performance.md, "Held producers
    at their consumers' pace":
    median 0.55 ms, but a 30-130 ms outlier every second or so on a 2-core
    machine) held ``m_lo`` at ``m`` and the budget never engaged; what trusting a fast
    count too much can cost is the budget ``S`` whatever ``m_lo`` is."""
    return max(2 * rtt, depth.lag_at(at), depth.falling_for(at), TRUST_FLOOR)


def trust_budget(policy: Policy) -> tuple[float, float]:
    """``S`` (bytes, messages): what one count may be trusted with of what was forwarded
    between ``m`` and ``m_lo`` before it: half the limit, at most ``TRUST_BYTES``
    (``inf`` for a limit the policy does not set)."""
    return (math.inf if policy.capacity <= 0
            else min(policy.capacity * TRUST_PART, TRUST_BYTES),
            math.inf if policy.max_messages is None else policy.max_messages * TRUST_PART)


def _trusted(depth: QueueDepth, policy: Policy, at: float, rtt: float,
             before: tuple[float, float]) -> tuple[float, float]:
    """The ledger totals a count at ``at`` is trusted to hold: ``min(F(at - m_lo),
    F(at - m) + S)`` (module docstring, "The trust budget")."""
    low = trusted_margin(depth, at, rtt)
    near_bytes, near_messages = depth.totals_before(at - low)
    budget_bytes, budget_messages = trust_budget(policy)
    return (min(near_bytes, before[0] + budget_bytes),
            min(near_messages, before[1] + budget_messages))


def paced(a: Allowance, depth: QueueDepth, hot_interval: float) -> Allowance:
    """What one count offers of allowance ``a``: the drain until the next count, and of the
    headroom beyond it the part two count intervals take of the margin's window
    (``2c / (m + r)``, ``c = credit_time``: one interval's part rang less but, counts being
    discrete, left the admitted rate 8 % lower in a simulation at 18,000 msg/s). Never
    more than ``a``, so every bound of ``a`` holds. Why: what a count admits stays counted
    on top of the following counts for ``m``; taking all the headroom at one count left
    none for the next few, and the queue was fed in capacity-sized bursts every ``m`` that
    its consumer ate in less (docs/design/pace.md, "Admission"); paced, the window fills evenly
    and the admitted rate settles at the drain."""
    c = credit_time(hot_interval, depth.ready_rtt)
    part = min(1.0, 2 * c / (a.margin + (depth.ready_rtt or 0.0)))
    drain = (depth.drain_rate or 0.0) * c
    return Allowance(_paced(a.bytes, depth.forwarded_bytes_total,
                            drain * depth.average_body_bytes(), part),
                     _paced(a.messages, depth.forwarded_messages_total, drain, part),
                     a.margin, a.count_at)


def _paced(total: float, forwarded: int, drain: float, part: float) -> float:
    """A ledger total ``total`` paced from ``forwarded`` on (``paced``)."""
    room = total - forwarded
    if math.isinf(total) or room <= drain:
        return total
    return forwarded + drain + (room - drain) * part


def credit_time(hot_interval: float, rtt: float | None) -> float:
    """Seconds of drain a count credits: until the next count (one hot interval and round
    trip), at most ``MAX_CREDIT_TIME``. Credited at once: held publishes are admitted only
    at counts (``Admission.tick``), so a credit that grew with the time since the count
    gave only ``d x r`` at the tick and held the admitted rate to ``(capacity - B) / m``."""
    return min(hot_interval + (rtt or 0.0), MAX_CREDIT_TIME)


class Admission:
    """Admission for every tripped queue of one controller: the setting, the round robin."""

    def __init__(self, hot_interval: float = HOT_INTERVAL) -> None:
        self.hot_interval = hot_interval
        self._turn = 0  # where the next round robin starts
        # What each held queue's last tick offered (``paced``), while channels waited on it:
        # what its held publishes may take until the next count.
        self._offered: dict[QueueKey, Allowance] = {}
        # A fleet: each held queue's rate share (``floodwall.control.fleet_rate``).
        self._rates = RateShares()

    def busy(self, key: QueueKey, depth: QueueDepth) -> bool:
        """Whether the publishers waiting on held queue ``key`` used up what its last tick
        offered: they want more than it drains, so it stays held (its release would let
        their backlog go at once) even at its resume level. A queue whose waiting publishers
        leave tokens unused (they have little left, or were told to stop: Channel.Flow) is
        released as the policy's resume level says."""
        offered = self._offered.get(key)  # less than one message's tokens left: all used
        return offered is not None and (
            depth.forwarded_bytes_total + depth.average_body_bytes() > offered.bytes
            or depth.forwarded_messages_total + 1 > offered.messages)

    def forget(self, key: QueueKey) -> None:
        self._offered.pop(key, None)
        self._rates.forget(key)

    def _allowance(self, key: QueueKey, q: HeldQueue, now: float) -> Allowance | None:
        """``allowance``, and in a fleet at most this member's rate share
        (``floodwall.control.fleet_rate``: equal bytes per second, not per count)."""
        a = allowance(q, now, self.hot_interval)
        if a is None or q.share is None:
            return a
        top_bytes, top_messages = self._rates.ceiling(key, q, q.share, now)
        return Allowance(min(a.bytes, top_bytes), min(a.messages, top_messages),
                         a.margin, a.count_at)

    def admits(self, key: QueueKey, q: HeldQueue, now: float) -> bool:
        """Whether one more publish may go to held queue ``q`` now (it has tokens left):
        within what its newest count's tick offered, or without one (no tick yet, nobody
        waited then), within the count's allowance."""
        room = self.room(key, q, now)
        return room is not None and room[0] > 0 and room[1] > 0

    def room(self, key: QueueKey, q: HeldQueue, now: float) -> tuple[float, float] | None:
        """The tokens ``admits`` reads, as room on the ledger: the body bytes and publishes
        below them (publishes go while both are above 0); None: none at all."""
        depth = q.depth
        a = self._offered.get(key)
        if a is None or a.count_at != depth.ready_count_at or depth.counted_base is None:
            a = self._allowance(key, q, now)
        if a is None:
            return None
        return a.bytes - depth.forwarded_bytes_total, a.messages - depth.forwarded_messages_total

    def tick(self, key: QueueKey, q: HeldQueue, waiting: Iterable[Ref], now: float
             ) -> list[ChannelAdmitted]:
        """A new count of held queue ``q``: the channels waiting on it, to be offered its
        tokens in turn (round robin: the first served moves on by one each tick); none
        when it has no tokens."""
        refs = list(waiting)
        a = self._allowance(key, q, now) if refs else None
        if a is None:
            self._offered.pop(key, None)
            return []
        self._offered[key] = paced(a, q.depth, self.hot_interval)
        if not self.admits(key, q, now):
            return []
        self._turn += 1
        start = self._turn % len(refs)
        return [ChannelAdmitted(*ref) for ref in refs[start:] + refs[:start]]
