"""How often each policed queue's depth is sampled: hot or cold.

A queue is *hot* while it is tripped (its held publishers are admitted at each count:
``floodwall.control.admission``), or while it is predicted to reach a limit before the next
slow sample: ``estimate + ingress x slow_interval >= capacity`` (bytes, and messages with
``max_messages``), ``ingress`` being what the proxy forwarded to it per second over the last
``RATE_WINDOW``, or over the last ``RISE_WINDOW`` when that is more (``fill_rate``: a sender
that starts at full speed is predicted at its rate within a tenth of a second, not a
second). A hot queue is sampled back to back, one passive declare in flight: a
tripped one every ``hot_interval``, an untripped one ``COUNTS_PER_FILL`` times in the time its
ingress would take to fill the room its estimate leaves (``fill_time``), never more often than
every ``hot_interval`` (in a fleet every ``hot_interval``: the fleet's bound counts on it);
a cold one every ``slow_interval`` (the depth interval, 200 ms).

Why an untripped queue need not be counted every ``hot_interval``: its estimate is the last
count plus what the proxy forwarded since, so it trips exactly when that crosses a limit,
whatever the count interval; a count only takes back out what the consumers took meanwhile.
Counted ``COUNTS_PER_FILL`` times per fill, the estimate crosses a limit the queue does not
reach only when that many counts in a row are late. The trip wakes the queue's counts at once
(``floodwall.io.own_connections``), so the held publishers' first admission is within one
``hot_interval`` of it, as before.

Broker load: each tripped queue costs at most ``1 / hot_interval`` passive declares a
second, an untripped hot one ``COUNTS_PER_FILL / fill_time`` (bench/pace.py measures the
broker's CPU for them: docs/performance.md).

The trip itself needs no prediction for the proxy's own publishes: the ledger books each one
as it is forwarded, so the estimate crosses the capacity exactly at the publish that crosses
it. Prediction makes the queue hot before that, so its first held publishes are admitted
within one hot interval rather than one slow interval.

Pure: every entry point takes ``now``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from floodwall.control.depth import QueueDepth
from floodwall.control.fleet import ShareRule
from floodwall.control.policy import Policy

#: Seconds over which the ingress (and, while held, admitted) rate is measured.
RATE_WINDOW = 1.0
#: ... and, for the prediction of a fill (``fill_time``), over this too, the higher of the
#: two: a sender that starts at full speed shows at its rate within this, where over
#: ``RATE_WINDOW`` alone it shows at a tenth of it for the first tenth of a second.
RISE_WINDOW = 0.1
#: How often a cold queue is counted (``slow``; ``--depth-interval``'s default).
DEPTH_INTERVAL = 0.2
#: A held queue whose counts have not moved for this long, nothing forwarded to it (its
#: consumers stopped), is counted every ``STILL_INTERVAL`` instead of every hot interval.
STILL_AFTER = 0.2
#: ... at most this much later than hot: a consumer's restart shows within it.
STILL_INTERVAL = 0.05
#: A held queue alone on its sidecar is counted at most as often as its consumers take this
#: part of its limit (``held_interval``), at least every ``STILL_INTERVAL``.
HELD_COUNT_PART = 1 / 32
#: ... and only while its newest count shows it at least this full (of each limit).
HELD_FULL = 0.75
#: An untripped queue predicted to fill is counted this many times in the time its ingress
#: would take to fill the room its estimate leaves (``fill_time``).
COUNTS_PER_FILL = 8


@dataclass(frozen=True, slots=True)
class Rate:
    """Body bytes and messages per second."""

    bytes: float
    messages: float


def ingress_rate(depth: QueueDepth, now: float, window: float = RATE_WINDOW) -> Rate:
    """What the proxy forwarded to the queue per second over the last ``window`` (while the
    queue is held: the rate its publishers were admitted at)."""
    before_bytes, before_messages = depth.totals_before(now - window)
    return Rate((depth.forwarded_bytes_total - before_bytes) / window,
                (depth.forwarded_messages_total - before_messages) / window)


def fill_rate(depth: QueueDepth, now: float) -> Rate:
    """The ingress a fill is predicted at: the higher of the rates over ``RATE_WINDOW`` and
    over ``RISE_WINDOW`` (a rise counts at once, a fall only as the long window forgets)."""
    steady = ingress_rate(depth, now)
    rising = ingress_rate(depth, now, RISE_WINDOW)
    return Rate(max(steady.bytes, rising.bytes), max(steady.messages, rising.messages))


def drain_bytes_rate(depth: QueueDepth) -> float | None:
    """The drain rate in body bytes per second (messages x mean body size), None before
    two ready counts."""
    rate = depth.drain_rate
    return None if rate is None else rate * depth.average_body_bytes()


def fill_time(depth: QueueDepth, policy: Policy, now: float,
              share: ShareRule | None = None) -> float:
    """Seconds until the queue's estimate reaches a limit at its ingress (``fill_rate``; 0:
    at or past one already; ``inf``: no ingress, or the depth unknown). In a fleet (``share``):
    at the fleet's ingress (the others' as announced), or sooner when this sidecar's own
    share of the room runs out at its own ingress."""
    estimate = depth.estimate()
    if estimate is None:
        return math.inf
    ingress = fill_rate(depth, now)
    fleet = 1.0
    soonest = math.inf
    if share is not None:
        totals = depth.headroom(policy.capacity if policy.capacity > 0 else None,
                                policy.max_messages, share)
        if totals is not None:
            soonest = min(_until(totals[0] - depth.forwarded_bytes_total, ingress.bytes),
                          _until(totals[1] - depth.forwarded_messages_total,
                                 ingress.messages))
        if ingress.bytes > 0:
            fleet = (ingress.bytes + share.others_ingress) / ingress.bytes
        elif share.others_ingress > 0 and policy.capacity > 0:
            return min(soonest, _until(policy.capacity - estimate.bytes, share.others_ingress))
    if policy.capacity > 0:
        soonest = min(soonest, _until(policy.capacity - estimate.bytes, fleet * ingress.bytes))
    if policy.max_messages is not None:
        soonest = min(soonest, _until(policy.max_messages - estimate.messages,
                                      fleet * ingress.messages))
    return soonest


def _until(room: float, rate: float) -> float:
    """Seconds until ``room`` is used up at ``rate`` a second (0: none left)."""
    if room <= 0:
        return 0.0
    return room / rate if rate > 0 else math.inf


def still_interval(depth: QueueDepth, tripped: bool, now: float, hot: float) -> float:
    """How often a hot queue is counted: ``hot``, or ``STILL_INTERVAL`` for a tripped queue
    whose counts have shown the same ready count, with nothing forwarded to it, for
    ``STILL_AFTER`` (``QueueDepth.still_since``). Its admission loses nothing: what a
    count admits is the room it shows (none while nothing moves) plus the drain until the
    next count (0); the first count that moves makes it hot again. A stopped consumer's
    queue then costs the broker ``1 / STILL_INTERVAL`` passive declares a second, not
    ``1 / hot``; its restart shows within ``STILL_INTERVAL`` plus one round trip."""
    if not tripped:
        return hot
    since = depth.still_since()
    if since is None or now - since < STILL_AFTER:
        return hot
    return max(hot, STILL_INTERVAL)


def held_interval(depth: QueueDepth, policy: Policy, now: float, hot: float,
                  alone: bool = True) -> float:
    """How often a tripped queue is counted: ``still_interval``, and for a queue alone on
    this sidecar (not a fleet's: its bound is derived with ``hot``, docs/design/fleet.md)
    no more often than its consumers take ``HELD_COUNT_PART`` of its limit (the tighter of
    capacity and ``max_messages``), within ``[hot, STILL_INTERVAL]``.

    The rate is the greater of the drain and what was forwarded to it over the last
    ``RATE_WINDOW``: the drain estimate starts low after a trip and climbs over a few
    counts, and the flood that tripped the queue keeps it hot meanwhile. Only while the
    newest count shows the queue at least ``HELD_FULL`` of each limit: one further below
    has consumers taking faster than it is admitted, its drain estimate behind them.

    Why: a count of a held queue admits what its consumers took since the last one;
    counted every ``hot`` while they take one message in four intervals, each count admits
    about one and costs the broker a passive declare (``1 / hot`` a second for each such
    queue). What it costs: held publishes leave in offers up to ``STILL_INTERVAL`` apart,
    so the queue swings by ``HELD_COUNT_PART`` of its limit below it; a consumer that
    speeds up shows within one such interval plus a round trip; the stopped-consumer bound
    is unchanged (each count credits at most ``min(hot + r, MAX_CREDIT_TIME)`` of the
    drain: ``floodwall.control.admission.credit_time``)."""
    every = still_interval(depth, True, now, hot)
    if not alone or every >= STILL_INTERVAL:
        return every
    ready = depth.ready_count
    if depth.drain_rate is None or ready is None:
        return every
    rate = max(depth.drain_rate, ingress_rate(depth, now).messages)
    if rate <= 0:
        return every
    take = math.inf
    body = max(1.0, depth.average_body_bytes())
    if policy.capacity > 0:
        if ready * body < HELD_FULL * policy.capacity:
            return every
        take = policy.capacity / (rate * body)
    if policy.max_messages is not None:
        if ready < HELD_FULL * policy.max_messages:
            return every
        take = min(take, policy.max_messages / rate)
    if math.isinf(take):
        return every
    return min(STILL_INTERVAL, max(every, take * HELD_COUNT_PART))


def sampling_interval(depth: QueueDepth, policy: Policy, tripped: bool, now: float,
                      slow: float, hot: float, share: ShareRule | None = None) -> float:
    """The interval in force for a queue: ``hot`` while it is tripped; while it is predicted
    to fill before the next slow sample (``fill_time`` at most ``slow``), that time over
    ``COUNTS_PER_FILL``, at least ``hot`` (in a fleet, ``share``: ``hot``, as the fleet's
    bound has it: docs/design/fleet.md); else ``slow``."""
    if tripped:
        return hot
    fill = fill_time(depth, policy, now, share)
    if fill > slow:
        return slow
    if share is not None:
        return hot
    return min(max(hot, fill / COUNTS_PER_FILL), slow)
