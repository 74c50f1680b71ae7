"""A fleet member's rate share while a queue is held: a token bucket per held queue, fed
at this member's max-min share of the queue's drain, so the fleet's members are admitted
equal bytes per second, not equal parts of each count's room.

Why: each count lets a member admit its share of the room that count shows
(``floodwall.control.admission``, ``F(t - m) + share(room)``): what it forwarded within its
in-flight margin ``m`` is at most its share of the room, so it is admitted about
``share x room / m`` a second, and members whose margin is longer (a slower round trip, a
longer enqueue lag), whose counts come later or whose event loop stalls were admitted less
than the others with the same share (bench.fleet: Jain 0.60-0.91 for 8 equal members). The
room stays the safety bound (the allowance is never raised); the bucket only takes from a
member what a member with a short margin would take beyond its rate share.

The bucket is a ledger ceiling (bytes, and messages): held publishes may go while the
ledger total is below it (and below the allowance). Between two feeds ``dt`` apart it grows
by ``rate x dt`` and is kept within ``F(now) + rate x CATCH_UP + one message``: a member that
was late (its loop or its counts stalled) banks up to ``CATCH_UP`` seconds of its rate and
catches up as soon as the room lets it; one that was early takes no more than its rate plus
that bank. ``rate`` is this member's max-min share (on the members' announced demands,
``ShareRule.rate_share``) of

    feed = max(0, d + (room - R0) / REFILL_TIME)

``d`` the queue's drain (``QueueDepth.drain_rate``), ``room`` what the newest count leaves
below the limit, ``R0 = min(d x ROOM_TARGET, (limit - resume) x ROOM_PART)`` (a held queue
kept between its resume level and its limit: below it, members whose publishers leave
tokens unused would release and trip again, and their buckets start empty each time):
the fleet aims to keep
that much room, so that a member whose margin is up to ``ROOM_TARGET`` is held by its bucket,
not by its share of the room; the second term brings the queue back to it (a drain
estimate that errs low would otherwise run the queue dry, one that errs high would fill it
until the room rules again). Over any ``T`` seconds held, a member is admitted at most
``integral of rate + rate x CATCH_UP + M``; and at least ``integral of rate - rate x
CATCH_UP`` while it has publishes waiting and its share of the room is not what binds
(``share x room >= rate x (m + r)``: docs/design/fleet.md, "Fair per second").

Pure: every entry point takes ``now``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from floodwall.control.depth import Depth, QueueDepth, RoomShare
from floodwall.control.policy import Policy

#: Seconds of its rate a member may bank while it cannot admit (late loop, late counts).
CATCH_UP = 0.5
#: The room the fleet aims to leave in a held queue, in seconds of its drain ...
ROOM_TARGET = 0.3
#: ... and at most this part of the band between the limit and its resume level.
ROOM_PART = 0.5
#: Seconds over which the feed brings the room back to its target.
REFILL_TIME = 0.5

QueueKey = tuple[str, str]


class RateRule(RoomShare, Protocol):
    """This member's part of a room and of a rate (``floodwall.control.fleet.ShareRule``)."""

    def rate_share(self, rate: float) -> float: ...


class HeldShare(Protocol):
    """What the bucket reads of a held queue (``floodwall.control.controller.PolicedQueue``)."""

    depth: QueueDepth
    policy: Policy
    tripped_since: float | None


@dataclass(slots=True)
class _Bucket:
    since: float  # the trip it belongs to
    at: float  # when it was last fed
    bytes: float  # ledger ceilings
    messages: float


def room_and_target(policy: Policy, counted: Depth, body: float, drain_rate: float
                    ) -> tuple[float, float] | None:
    """(room, target) in messages: what a count of ``counted`` leaves below the nearest limit
    of ``policy``, and ``R0`` for a queue that drains ``drain_rate`` messages a second
    (messages of ``body`` bytes; None: no limit)."""
    body = max(1.0, body)
    limits = []  # (limit - resume, room), in messages
    if policy.capacity > 0:
        limits.append(((policy.capacity - policy.resume) / body,
                       (policy.capacity - counted.bytes) / body))
    if policy.max_messages is not None:
        limits.append((float(policy.max_messages - (policy.resume_messages or 0)),
                       float(policy.max_messages - counted.messages)))
    if not limits:
        return None
    band, room = min(limits, key=lambda lr: lr[1])
    return room, min(max(0.0, drain_rate) * ROOM_TARGET, band * ROOM_PART)


def feed(drain_rate: float, room: float, target: float) -> float:
    """The fleet's feed (a rate, in the units of its arguments): the drain, corrected
    towards the room target."""
    return max(0.0, drain_rate + (room - target) / REFILL_TIME)


def _room(depth: QueueDepth, policy: Policy) -> tuple[float, float] | None:
    """``room_and_target`` of the newest count (None: no count, or no limit)."""
    base = depth.counted_base
    if base is None:
        return None
    return room_and_target(policy, base, depth.average_body_bytes(), depth.drain_rate or 0.0)


def feed_rate(depth: QueueDepth, policy: Policy) -> float:
    """The fleet's feed (messages/s): the drain, corrected towards the room target."""
    d = depth.drain_rate or 0.0
    room = _room(depth, policy)
    if room is None:
        return d
    return feed(d, *room)


@dataclass(frozen=True, slots=True)
class _ShareBeyondTarget:
    """A member's part of the room beyond the room target ``R0`` (``reserve``, bytes)."""

    rule: RateRule
    reserve: float

    def fraction(self, room_bytes: float | None, room_messages: float | None,
                 body_bytes: float) -> float:
        h = room_bytes if room_bytes is not None else (
            None if room_messages is None else room_messages * max(1, body_bytes))
        if h is None or h <= 0 or not math.isfinite(h):
            return 1.0
        return self.rule.fraction(h - self.reserve, None, body_bytes) * max(
            0.0, h - self.reserve) / h


def trip_share(q: HeldShare, rule: RateRule | None) -> RoomShare | None:
    """The share a fleet member that is not held trips on: its part of the room beyond the
    room target (``R0``), so that, while the others hold the queue about ``R0`` below its
    limit, a member that forwards steadily (a producer slower than the others', never
    over its share of one count's room) is held too, and admitted its rate share, not its
    producer's rate. Before a drain is measured ``R0`` is 0: the room's share as before."""
    if rule is None:
        return None
    room = _room(q.depth, q.policy)
    if room is None or room[1] <= 0:
        return rule
    return _ShareBeyondTarget(rule, room[1] * max(1, q.depth.average_body_bytes()))


class RateShares:
    """The buckets of one controller's held queues (one per queue, per trip)."""

    def __init__(self) -> None:
        self._buckets: dict[QueueKey, _Bucket] = {}

    def forget(self, key: QueueKey) -> None:
        self._buckets.pop(key, None)

    def ceiling(self, key: QueueKey, q: HeldShare, rule: RateRule | None, now: float
                ) -> tuple[float, float]:
        """The ledger totals (bytes, messages) up to which held queue ``q`` may take
        publishes by its rate share now (``inf``: no fleet, the room alone rules)."""
        since = q.tripped_since
        if rule is None or since is None:
            self._buckets.pop(key, None)
            return math.inf, math.inf
        depth = q.depth
        fb, fm = depth.forwarded_bytes_total, depth.forwarded_messages_total
        b = self._buckets.get(key)
        if b is None or b.since != since:
            b = self._buckets[key] = _Bucket(since, now, float(fb), float(fm))
        body = max(1, depth.average_body_bytes())
        rate_bytes = rule.rate_share(feed_rate(depth, q.policy) * body)
        rate_messages = rate_bytes / body
        dt = max(0.0, now - b.at)
        b.at = max(b.at, now)
        b.bytes = min(b.bytes + rate_bytes * dt, fb + rate_bytes * CATCH_UP + body)
        b.messages = min(b.messages + rate_messages * dt, fm + rate_messages * CATCH_UP + 1)
        return b.bytes, b.messages
