"""How full each policed queue is: broker samples reconciled with the proxy's own ledger.

Three sources, freshest first:
- the ledger: message-body bytes the proxy forwarded to a queue, each with the time it was
  forwarded, and deliveries/acks it relayed from/to the broker;
- a *ready count* (a passive ``queue.declare`` on the proxy's own connection): real time,
  messages ready only, no bytes;
- a *management sample* (the HTTP API): bytes and unacknowledged counts, but only as fresh as
  the broker's statistics interval (5 s by default).

The estimate starts from the newest sample and adds what the ledger forwarded since that
sample was taken, less a safety margin, so a publish still in flight inside the broker when
the sample was taken is counted rather than missed. For a ready count the margin follows
the broker's responsiveness: twice the probe's round trip, within [20 ms, 1 s]; a broker
slow to answer is slow to enqueue too. A management sample gets the fixed margin (and the
supervisor dates it back by the broker's statistics interval).

AMQP 1.0 deliveries the broker settles one by one (the credit gate tracks them: *tracked*)
need no margin: a delivery settled before a count was asked for is in that count (or
consumed already), one not settled may not be. When the count's asker noted the queue's
unsettled deliveries (``count_asked``), the count is taken to hold everything forwarded
before it less those unsettled and less the untracked publishes forwarded within the margin:
the margin's answer for a queue fed by untracked publishes alone. Up to the asker's
``allowance`` of the unsettled deliveries are taken to be in the count all the same (a
broker keeps a sender's whole credit unsettled at full speed: counted, they sat as a full
queue's worth in the estimate of an empty 256 KiB one), and as the broker settles them
those that can no longer be among the unsettled are counted back (``count_back``): the
estimate is short by at most what is unsettled now, within the allowance, which the 1.0
gate keeps what its links have in credit and in flight within. The settled estimate
likewise, with ``SETTLE`` for the untracked publishes.

A burst the proxy forwarded can take the broker longer to enqueue than the probe's round
trip says (the probe is answered on the proxy's own connection while the client's channel
is still working through the burst; ~50 ms for 1,000 1 KiB messages on a busy 2-core
machine). A count taken then is low, and releasing on it would let another burst go. So
the *release* decision uses the settled estimate (``estimate(settled=True)``): a ready
count covers only what was forwarded ``SETTLE`` (100 ms) before it was asked for. The trip
decision keeps the fast one. While a queue is tripped its held publishes are admitted
(``floodwall.control.admission``) on a margin that follows the lag the counts show
(``enqueue_lag``; ``SETTLE`` for the counts asked for within ``SETTLE`` of a trip:
``lag_at``). Consumption since the sample
is not subtracted: the estimate errs high, so a queue trips early rather than late, and the
next sample brings it back down. All times are the caller's monotonic clock, in seconds.
"""

from __future__ import annotations

import enum
import math
from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

# A publish forwarded this long before a sample was requested may still not be in it.
IN_FLIGHT_MARGIN = 0.25
MIN_MARGIN, MAX_MARGIN = 0.02, 1.0
# A ready count is trusted to hold what was forwarded this long before it, to release a
# tripped queue (see the module docstring).
SETTLE = 0.1
# Ledger entries this much older than the newest sample are dropped.
LEDGER_HORIZON = 5.0
# Publishes this close together share one ledger entry.
LEDGER_BUCKET = 0.005
# Weight of the newest interval in the drain-rate and sample-interval averages.
DRAIN_SMOOTHING = 0.3
# ... of a drain rate above the average measured up to a count that found the queue empty:
# its consumers took all there was, so the rate is a floor of what they can take, not an
# estimate of it. A held queue's drain estimate starts from nothing at the trip; with 0.3
# throughout it took some 400 ms to reach a 20,000 msg/s consumer's rate while the queue sat
# empty (bench.pace's admission trace), admitting half of it meanwhile.
DRAIN_RISE = 0.7
# The drain rate is measured between ready counts at least this far apart (seconds).
DRAIN_SPAN = 0.05
# The in-flight margin of a count for admission while held, at least (seconds): bench/pace.py
# on a loaded machine over-admitted by megabytes with a 2 ms floor (docs/design/pace.md).
HOT_MIN_MARGIN = MIN_MARGIN
# While the counts show no lag, the enqueue-lag estimate halves every this many seconds
# (docs/design/pace.md, "Enqueue lag").
LAG_HALF_LIFE = 5.0
# A run of falling counts longer than this (seconds; about three hot counts in a row) is
# taken as a possible stall (``QueueDepth.falling_for``); shorter ones are a consumer's
# prefetch refilling, and the least margin (20 ms) covers them anyway.
FALL_AFTER = 0.015
# The longest recent round trip of the counts (``rtt_high``) halves every this many seconds:
# a round trip is seen at every count, so a slow broker keeps it up (a hot queue is counted
# some 150-200 times a second), and one slow answer (the proxy's own loop or the OS: on the
# 2-core test machine a 30-130 ms outlier every second or so while the median was 0.55 ms)
# does not narrow admission for long. With 1 s the margin stands on the worst outlier of
# the last seconds (11-19 ms median rtt_high, so m >= 22 ms and m_lo >= m), and a 40 ms
# outlier a second holds a simulated 256 KiB queue at 0.43 of its consumer's rate (0.77
# with 0.1 s; tests/test_pace.py, docs/performance.md).
RTT_HALF_LIFE = 0.1


class RoomShare(Protocol):
    """The part of a queue's room this sidecar may fill (a fleet's ``ShareRule``)."""

    def fraction(self, room_bytes: float | None, room_messages: float | None,
                 body_bytes: float) -> float: ...


def shared(room: float, fraction: float) -> float:
    """``fraction`` of a room (a room <= 0, already overfull, stays what it is)."""
    return room * fraction if room > 0 else room


@dataclass(frozen=True, slots=True)
class Depth:
    """A queue's depth: message-body bytes and messages *ready* in it (waiting for a
    consumer). Delivered but unacknowledged messages are not counted: they are bounded by
    the consumers' prefetch, not by the producers, and no real-time count shows them (a
    passive declare counts ready messages only; the management API's unacknowledged
    figure is seconds old). docs/design/pace.md, "What capacity counts"."""

    bytes: int
    messages: int


class DepthSource(enum.Enum):
    """Where a queue's broker figures came from: the management API's ``/api/queues``, or,
    with the broker's statistics off, its Prometheus endpoint (``/metrics/detailed``)."""

    MANAGEMENT = "management"
    PROMETHEUS = "prometheus"


@dataclass(frozen=True, slots=True)
class ManagementSample:
    """The figures the management API (or the Prometheus endpoint) gave for one queue, and
    when we asked."""

    taken_at: float
    messages_ready: int
    messages_unacknowledged: int
    message_bytes: int
    message_bytes_ready: int
    message_bytes_unacknowledged: int
    # False when the broker gave counts but no byte figures (a stream): the bytes are then
    # the messages times the mean body size the proxy saw.
    bytes_known: bool = True
    source: DepthSource = DepthSource.MANAGEMENT


def ready_depth(m: ManagementSample, body_bytes: int) -> Depth:
    """The ready part of a management sample (what a capacity counts: ``Depth``); its
    bytes are the ready messages times ``body_bytes`` when the sample has no ready bytes
    for them (no byte figures, or a fresh queue's byte statistics not collected yet), and
    at least that in a Prometheus sample (``QueueDepth.average_body_bytes``)."""
    known = m.bytes_known and (m.message_bytes_ready > 0 or m.messages_ready == 0)
    ready_bytes = m.message_bytes_ready if known else m.messages_ready * body_bytes
    if m.source is DepthSource.PROMETHEUS:
        ready_bytes = max(ready_bytes, m.messages_ready * body_bytes)
    return Depth(ready_bytes, m.messages_ready)


@dataclass
class QueueDepth:
    """Depth estimate of one queue; O(1) per publish, O(log n) per sample."""

    # (forwarded_at, cumulative body bytes, cumulative messages), oldest first; publishes
    # within LEDGER_BUCKET of each other share an entry, so the ledger stays small.
    _ledger: deque[tuple[float, int, int]] = field(default_factory=deque)
    management: ManagementSample | None = None
    ready_count: int | None = None
    ready_count_at: float | None = None
    forwarded_bytes_total: int = 0
    forwarded_messages_total: int = 0
    delivered_messages_total: int = 0
    ready_margin: float = IN_FLIGHT_MARGIN
    ready_rtt: float | None = None  # the round trip of the newest ready count (None: unknown)
    # The longest round trip of the recent counts: the newest's, or the longest before it
    # halved per RTT_HALF_LIFE since (admission's margin: a broker slow to answer is slow to
    # enqueue, and a stall shows in one count's round trip before it shows as a lag).
    rtt_high: float = 0.0
    _base: Depth | None = None  # depth per the newest sample ...
    _base_bytes_mark: int = 0  # ... and the ledger totals it already includes
    _base_messages_mark: int = 0
    _settled_bytes_mark: int = 0  # the same, for the settled estimate (release decisions)
    _settled_messages_mark: int = 0
    rebases: int = 0  # goes up each time a sample moves the base: equal values, same base
    # Messages leaving the ready state per second between successive ready counts, and the
    # seconds between those counts, both averaged (DRAIN_SMOOTHING); None before two counts.
    drain_rate: float | None = None
    sample_interval: float | None = None
    # Since when the ready counts have not moved and nothing was forwarded (``still_since``):
    # (when, the forwarded total then); None before the first count.
    _still: tuple[float, int] | None = None
    _drain_anchor: tuple[int, float] | None = None  # (ready, at): where the drain span starts
    # How long a forwarded publish may take to show in a ready count, as the counts show it
    # (``_watch_lag``). ``lag_at`` adds what the controller assumes at each trip.
    enqueue_lag: float = 0.0
    # A lag assumed (``expect_lag``: SETTLE at a trip) for the counts asked for before
    # ``_assumed_until``: what was forwarded before the trip may be a flood on its way.
    _assumed_lag: float = 0.0
    _assumed_until: float = -math.inf
    # The request time of the first of a run of counts each below the one before it (None:
    # the newest count did not fall): ``falling_for``.
    _falling_since: float | None = None
    # A fleet: body bytes/s the other members forward into the queue, as they announce it
    # (``FlowController.set_share``): what the counts show of theirs is neither lag nor a
    # lack of drain.
    others_rate: float = 0.0
    # A fleet member (a share rule set): a lag seen is capped at SETTLE (``_watch_lag``),
    # also while the others' ingress is not announced yet (a fresh queue's first fill).
    in_fleet: bool = False
    # Tracked deliveries (the module docstring): how many were forwarded, and the ledger of
    # that total ((forwarded_at, cumulative messages), bucketed and trimmed as ``_ledger``).
    tracked_messages_total: int = 0
    _tracked: deque[tuple[float, int]] = field(default_factory=deque)
    # Counts asked for and not answered yet: asked at -> (messages forwarded, tracked
    # deliveries forwarded, tracked deliveries not settled and not taken to be in the count,
    # those taken to be: ``count_asked``), as they stood then.
    _asked: dict[float, tuple[int, int, int, int]] = field(default_factory=dict)
    # The base's count was taken to hold this many tracked deliveries the broker had not
    # settled when it was asked for (``count_asked``'s ``allowance``), at this mean size ...
    excluded: int = 0
    excluded_bytes: int = 0
    # ... of which this many are counted back, since fewer than that are unsettled now
    # (``count_back``): the estimate adds them.
    counted_back: int = 0

    # -- inputs --------------------------------------------------------------------------
    def forwarded(self, now: float, body_bytes: int, messages: int = 1,
                  tracked: int = 0) -> None:
        """The proxy forwarded one publish (or ``messages``, ``body_bytes`` in all, at once)
        to this queue; ``tracked`` of them are tracked deliveries."""
        total_bytes = self.forwarded_bytes_total = self.forwarded_bytes_total + body_bytes
        total_messages = self.forwarded_messages_total = self.forwarded_messages_total + messages
        ledger = self._ledger
        if ledger and now - (last := ledger[-1][0]) < LEDGER_BUCKET:
            ledger[-1] = (last, total_bytes, total_messages)
        else:
            ledger.append((now, total_bytes, total_messages))
        if tracked:
            total = self.tracked_messages_total = self.tracked_messages_total + tracked
            log = self._tracked
            if log and now - (last := log[-1][0]) < LEDGER_BUCKET:
                log[-1] = (last, total)
            else:
                log.append((now, total))

    def count_asked(self, at: float, unsettled: int, allowance: int = 0) -> None:
        """A ready count is asked for at ``at``, with ``unsettled`` tracked deliveries to
        the queue not settled by the broker, up to ``allowance`` of which the count is taken
        to hold (the module docstring)."""
        asked = self._asked
        if len(asked) >= 8:  # (counts that never came back)
            del asked[min(asked)]
        excluded = min(unsettled, max(allowance, 0))
        asked[at] = (self.forwarded_messages_total, self.tracked_messages_total,
                     unsettled - excluded, excluded)

    def count_back(self, unsettled: int) -> int:
        """The queue's tracked deliveries not settled by the broker are ``unsettled`` now:
        of those the base's count was taken to hold (``excluded``), at most that many can
        still be on their way to the queue, so the others are counted (the estimate adds
        them) until the next rebase. Returns how many more are counted than before."""
        back = self.excluded - unsettled
        more = back - self.counted_back
        if more <= 0:
            return 0
        self.counted_back = back
        return more

    def delivered(self, count: int = 1) -> None:
        """The broker delivered messages from this queue through the proxy (telemetry)."""
        self.delivered_messages_total += count

    def sampled_ready_count(self, requested_at: float, ready: int,
                            rtt: float | None = None, drains: bool = True) -> None:
        """A real-time count of ready messages, asked for at ``requested_at``.

        ``rtt``, the probe's round trip, sets the in-flight margin (fixed when None).
        ``drains``: False for a stream, which consumers read without taking anything away:
        its drain rate is 0 (a count that lags what was forwarded is a statistics figure
        not refreshed yet, not messages gone), so nothing is admitted while it is tripped.
        """
        if self.ready_count_at is not None and requested_at < self.ready_count_at:
            return  # an older answer overtaken by a newer one
        margin = (IN_FLIGHT_MARGIN if rtt is None else min(max(2 * rtt, MIN_MARGIN), MAX_MARGIN))
        if self.ready_count_at is not None and requested_at > self.ready_count_at:
            dt, a = requested_at - self.ready_count_at, DRAIN_SMOOTHING
            self.sample_interval = (dt if self.sample_interval is None
                                    else a * dt + (1 - a) * self.sample_interval)
            if self.ready_count is not None:
                self._watch_lag(self.ready_count, self.ready_count_at, ready, requested_at, rtt)
        anchor = self._drain_anchor
        if not drains:
            self.drain_rate, anchor = 0.0, None
        elif anchor is not None and requested_at - anchor[1] >= DRAIN_SPAN:
            self._drained(anchor[0], anchor[1], ready, requested_at,
                          max(margin, self.lag_at(anchor[1])))
        if anchor is None or requested_at - anchor[1] >= DRAIN_SPAN:
            self._drain_anchor = (ready, requested_at)
        if rtt is not None:
            since = 0.0 if self.ready_count_at is None else requested_at - self.ready_count_at
            self.rtt_high = max(rtt, self.rtt_high * 0.5 ** (since / RTT_HALF_LIFE))
        previous = self.ready_count
        if previous is None or ready >= previous:
            self._falling_since = None
        elif self._falling_since is None:
            self._falling_since = requested_at
        still = self._still
        if still is None or ready != self.ready_count \
                or still[1] != self.forwarded_messages_total:
            self._still = (requested_at, self.forwarded_messages_total)
        self.ready_count, self.ready_count_at = ready, requested_at
        self.ready_margin, self.ready_rtt = margin, rtt
        self._rebase()

    def still_since(self) -> float | None:
        """Since when every count has shown the same ready count with nothing forwarded in
        between (nobody takes from the queue, nobody is admitted to it), as of the newest
        count; None while the newest count moved or anything was forwarded since it."""
        still = self._still
        if still is None or still[1] != self.forwarded_messages_total \
                or still[0] == self.ready_count_at:
            return None
        return still[0]

    def expect_lag(self, lag: float, now: float) -> None:
        """Assume what was forwarded until ``now`` may take ``lag`` to show in a count (a
        trip: what went before it may be a flood on its way): counts asked for before
        ``now + lag`` are trusted with what was forwarded ``lag`` before them at most
        (``lag_at``); a count asked for later holds all of it, and its margin is the lag
        the counts show (``enqueue_lag``). (Halving it every second from the trip on instead,
        100 ms, 50 ms a second later, would admit a held queue at most about ``capacity /
        70 ms`` over the first second after a trip: docs/design/pace.md.)"""
        if now + lag > self._assumed_until:
            self._assumed_lag, self._assumed_until = lag, now + lag

    def lag_at(self, requested_at: float) -> float:
        """The lag a count asked for at ``requested_at`` is trusted with: the lag the counts
        show, or the one assumed at a trip while that count may not hold its flood."""
        if requested_at < self._assumed_until:
            return max(self.enqueue_lag, self._assumed_lag)
        return self.enqueue_lag

    def falling_for(self, requested_at: float) -> float:
        """How long the counts up to the one asked for at ``requested_at`` have fallen, each
        below the one before (from the first that fell), once that is longer than
        ``FALL_AFTER`` (0 before, and once a count does not fall).

        A fall that long is a stall or a consumer speeding up, and a count cannot tell
        which: what was forwarded meanwhile may not have landed (the broker's reader or
        channel stopped while its consumers went on), and taking it to be in the queue after
        the margin, as ``lag_at`` does, admits it again at every count, so a stall's
        overshoot would grow with its square (docs/design/pace.md, "Bounds"). The
        admission's margins reach back to the fall's start instead: while it lasts, a count
        admits what the queue fell by. A count that does not fall ends it (so does a second
        count that finds the queue empty: its consumers may be waiting for more)."""
        since = self._falling_since
        falling = 0.0 if since is None else requested_at - since
        return falling if falling > FALL_AFTER else 0.0

    def _watch_lag(self, before: int, before_at: float, ready: int, at: float,
                   rtt: float | None) -> None:
        """Update ``enqueue_lag`` from two successive counts: a rise beyond everything the
        ledger forwarded since the earlier count was asked for (up to now: any of it may be
        in the later count) means the earlier count missed publishes forwarded before it;
        how far back the ledger must go to hold that many is a lag seen. (Shifting both ends
        by the fast margin instead reads a lag wherever publishes land faster than that
        margin while the forwarding rate rises: a held queue's first admissions after a
        trip read as a lag of 1 s, ``MAX_MARGIN``, and its admission crawls in a
        simulation; docs/performance.md, "Held producers at their consumers' pace".)
        A fleet member reads it the same way
        (``floodwall.control.fleet_rate`` keeps the members' shares of a drain even per
        second whatever their margins). No rise beyond: the estimate
        halves per ``LAG_HALF_LIFE``. Consumers
        taking messages between the two counts hide a rise: the estimate errs low then, and
        ``SETTLE`` at each trip covers what went before it (docs/design/pace.md, "Enqueue lag").
        (Adding the drain estimate back was tried: a stale one, after consumers stop, reads
        as lag at every count.) In a fleet, what the other members forwarded between the
        two counts, at their announced rate (``others_rate``), is no lag; and as a rise
        beyond it may still be theirs (a burst, an announcement behind or not made yet),
        a lag seen is capped at ``SETTLE`` (what each trip assumes anyway) rather than
        ``MAX_MARGIN`` (``in_fleet``)."""
        earlier = self._totals_before(before_at)[1]
        arrived = self.forwarded_messages_total - earlier
        excess = ready - before - arrived - self._others_between(before_at, at)
        if excess < 1:
            self.enqueue_lag *= 0.5 ** (max(0.0, at - before_at) / LAG_HALF_LIFE)
            return
        ledger = self._ledger
        target = earlier - excess  # the first missing publish was this one (cumulative)
        i = bisect_left(ledger, target, key=lambda e: e[2])
        cap = SETTLE if self.in_fleet else MAX_MARGIN
        lag = (cap if i == len(ledger) or target <= self._trimmed_messages
               else before_at - ledger[i][0])
        self.enqueue_lag = min(cap, max(self.enqueue_lag, lag))

    def _drained(self, before: int, before_at: float, ready: int, at: float,
                 margin: float) -> None:
        """Update the drain rate from two ready counts: what was ready, plus what the ledger
        forwarded in between (each shifted by the in-flight margin), less what is ready now.
        The two are ``DRAIN_SPAN`` apart at least: hot counts come every few milliseconds,
        and over so short a span the in-flight margin's error would swamp the rate."""
        forwarded = self._totals_before(at - margin)[1] - self._totals_before(before_at - margin)[1]
        dt = at - before_at
        rate = max(0.0, before + forwarded + self._others_between(before_at, at) - ready) / dt
        a = DRAIN_RISE if ready == 0 and rate > (self.drain_rate or 0.0) else DRAIN_SMOOTHING
        self.drain_rate = rate if self.drain_rate is None else a * rate + (1 - a) * self.drain_rate

    def _others_between(self, before_at: float, at: float) -> float:
        """Messages the fleet's other members forwarded between two counts, at their
        announced rate (0 without a fleet)."""
        if self.others_rate <= 0:
            return 0.0
        return self.others_rate * (at - before_at) / max(1, self.average_body_bytes())

    def sampled_management(self, sample: ManagementSample) -> None:
        if self.management is not None and sample.taken_at < self.management.taken_at:
            return
        self.management = sample
        self._rebase()

    # -- output --------------------------------------------------------------------------
    def estimate(self, settled: bool = False) -> Depth | None:
        """Best estimate now, or None when no sample has arrived yet (depth unknown).

        ``settled``: the estimate a release is decided on, which does not trust a ready
        count with what was forwarded in the ``SETTLE`` before it (never lower).
        """
        base = self._base
        if base is None:
            return None
        back = self.counted_back
        back_bytes = back * self.excluded_bytes if back else 0
        if settled:
            return Depth(base.bytes + self.forwarded_bytes_total - self._settled_bytes_mark
                         + back_bytes,
                         base.messages + self.forwarded_messages_total
                         - self._settled_messages_mark + back)
        return Depth(base.bytes + self.forwarded_bytes_total - self._base_bytes_mark
                     + back_bytes,
                     base.messages + self.forwarded_messages_total - self._base_messages_mark
                     + back)

    def headroom(self, max_bytes: int | None, max_messages: int | None,
                 share: RoomShare | None = None) -> tuple[float, float] | None:
        """The ledger totals (bytes, messages) up to which the estimate stays within
        ``max_bytes`` / ``max_messages`` (None: no such limit, ``inf``), until the next
        rebase (``rebases``); None when the depth is unknown.

        ``estimate().bytes <= max_bytes`` exactly when ``forwarded_bytes_total`` is at most
        the first figure, and the same for messages: a caller can compare the running totals
        with these instead of making an estimate per publish.

        ``share`` (a fleet: ``floodwall.control.fleet.ShareRule``): only this sidecar's part
        of the room the base leaves (a room <= 0 is not shared).
        """
        base = self._base
        if base is None:
            return None
        room_bytes = None if max_bytes is None else float(max_bytes - base.bytes)
        room_messages = None if max_messages is None else float(max_messages - base.messages)
        if share is not None:
            f = share.fraction(room_bytes, room_messages, self.average_body_bytes())
            room_bytes = None if room_bytes is None else shared(room_bytes, f)
            room_messages = None if room_messages is None else shared(room_messages, f)
        back = self.counted_back
        return (math.inf if room_bytes is None
                else room_bytes + self._base_bytes_mark - back * self.excluded_bytes,
                math.inf if room_messages is None
                else room_messages + self._base_messages_mark - back)

    @property
    def counted_bytes_mark(self) -> int:
        """The ledger's byte total the base holds (what ``headroom``'s totals start from)."""
        return self._base_bytes_mark

    @property
    def base(self) -> Depth | None:
        """The depth per the newest sample (ready count or management), ledger aside."""
        return self._base

    @property
    def counted_base(self) -> Depth | None:
        """The base when it is the newest ready count's (real time), else None (a management
        figure, seconds old, or nothing yet): what admission while held starts from."""
        at, mgmt = self.ready_count_at, self.management
        if at is None or self._base is None or (mgmt is not None and mgmt.taken_at > at):
            return None
        return self._base

    def totals_before(self, t: float) -> tuple[int, int]:
        """Ledger totals (body bytes, messages) forwarded before time ``t``."""
        return self._totals_before(t)

    def broker_depth(self) -> Depth | None:
        """The broker's own last word (management API), unadjusted."""
        m = self.management
        return None if m is None else ready_depth(m, self.average_body_bytes())

    def average_body_bytes(self) -> int:
        """Mean body size: from the broker's figures when it has ready messages and their
        bytes, else our ledger. Figures with ready messages but no ready bytes (the API's
        counts and byte statistics are collected apart: a fresh queue can show the one
        before the other; see ``sample_from_queue_doc``) are not a mean of 0: a mean of 0
        made every count read as an empty queue in bytes, and a fleet member released on
        it (docs/performance.md, "Fleet"). A Prometheus sample's mean is believed no lower
        than the ledger's: its counts and its bytes are two metric families written apart,
        and a quorum queue's bytes family stops while a cluster node hangs (RabbitMQ 3.10:
        its statistics tick waits on the hung member after writing the counts), which is
        when the management API stalls and these samples are the depth's figures
        (docs/operations.md, "Depth sources: the management API not answering")."""
        m = self.management
        if m is not None and m.messages_ready > 0 and m.bytes_known and m.message_bytes_ready:
            mean = -(-m.message_bytes_ready // m.messages_ready)  # ceiling: err high
            if m.source is not DepthSource.PROMETHEUS:
                return mean
            return max(mean, self._ledger_mean())
        return self._ledger_mean()

    def _ledger_mean(self) -> int:
        """Mean body size of what the proxy forwarded (ceiling); 0 before any."""
        if not self.forwarded_messages_total:
            return 0
        return -(-self.forwarded_bytes_total // self.forwarded_messages_total)

    # -- reconciliation ------------------------------------------------------------------
    def _rebase(self) -> None:
        """Take the newest sample as the base; the ledger adds what came after it."""
        mgmt = self.management
        if self.ready_count is not None and self.ready_count_at is not None and (
            mgmt is None or self.ready_count_at >= mgmt.taken_at
        ):
            since = self.ready_count_at - self.ready_margin
            settled = self.ready_count_at - max(self.ready_margin, SETTLE)
            self._base = Depth(self.ready_count * self.average_body_bytes(), self.ready_count)
            noted = self._noted(self.ready_count_at)
        elif mgmt is not None:
            since = settled = mgmt.taken_at - IN_FLIGHT_MARGIN
            self._base = ready_depth(mgmt, self.average_body_bytes())
            noted = None
        else:
            return
        self.excluded = 0 if noted is None else noted[3]
        self.excluded_bytes = self.average_body_bytes() if self.excluded else 0
        self.counted_back = 0
        self._base_bytes_mark, self._base_messages_mark = self._counted(noted, since)
        self._settled_bytes_mark, self._settled_messages_mark = self._counted(noted, settled)
        self.rebases += 1
        self._trim(since - LEDGER_HORIZON)

    def _noted(self, at: float) -> tuple[int, int, int, int] | None:
        """What ``count_asked`` noted for the count asked for at ``at`` (None: nothing, or
        no tracked deliveries to this queue ever), forgetting it and any older."""
        asked = self._asked
        noted = asked.pop(at, None)
        for t in [t for t in asked if t < at]:
            del asked[t]
        return noted if self.tracked_messages_total else None

    def _counted(self, noted: tuple[int, int, int, int] | None,
                 since: float) -> tuple[int, int]:
        """Ledger totals (bytes, messages) a ready count holds: those forwarded before
        ``since`` (the count's time less its margin); with what its asker ``noted``,
        everything forwarded before the count but the tracked deliveries not settled and the
        untracked publishes forwarded after ``since`` (the module docstring)."""
        marks = self._totals_before(since)
        if noted is None:
            return marks
        forwarded, tracked, unsettled, _ = noted
        untracked = max(0, (forwarded - marks[1]) - (tracked - self._tracked_before(since)))
        counted = max(0, forwarded - unsettled - untracked)
        # its bytes: the ledger's, interpolated within the entry that holds the last of them
        ledger = self._ledger
        i = bisect_right(ledger, counted, key=lambda e: e[2])
        below_bytes, below = (ledger[i - 1][1], ledger[i - 1][2]) if i else (
            self._trimmed_bytes, self._trimmed_messages)
        if counted <= below or i == len(ledger):
            return (below_bytes if counted >= below
                    else below_bytes * counted // max(1, below)), counted
        _, above_bytes, above = ledger[i]
        return below_bytes + (above_bytes - below_bytes) * (counted - below) // (above - below), \
            counted

    def _tracked_before(self, t: float) -> int:
        """Tracked deliveries forwarded before time ``t``."""
        log = self._tracked
        i = bisect_left(log, t, key=lambda e: e[0])
        if i == 0:
            return self._trimmed_tracked if log else self.tracked_messages_total
        return log[i - 1][1]

    def _totals_before(self, t: float) -> tuple[int, int]:
        """Ledger totals as they stood just before time ``t``."""
        ledger = self._ledger
        i = bisect_left(ledger, t, key=lambda e: e[0])
        if i == 0:
            # Nothing recorded before t (or it was trimmed): count every known publish.
            first = ledger[0] if ledger else None
            if first is None:
                return self.forwarded_bytes_total, self.forwarded_messages_total
            return self._trimmed_bytes, self._trimmed_messages
        _, cum_bytes, cum_msgs = ledger[i - 1]
        return cum_bytes, cum_msgs

    _trimmed_bytes: int = 0
    _trimmed_messages: int = 0
    _trimmed_tracked: int = 0

    def _trim(self, before: float) -> None:
        ledger = self._ledger
        while len(ledger) > 1 and ledger[0][0] < before:
            _, self._trimmed_bytes, self._trimmed_messages = ledger.popleft()
        log = self._tracked
        while len(log) > 1 and log[0][0] < before:
            _, self._trimmed_tracked = log.popleft()
