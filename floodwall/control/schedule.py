"""How often each policed queue's depth is sampled: hot or cold.

A queue is *hot* while it is tripped (its held publishers are admitted at each count:
``floodwall.control.admission``), or while it is predicted to reach a limit before the next
slow sample: ``estimate + ingress x slow_interval >= capacity`` (bytes, and messages with
``max_messages``), ``ingress`` being what the proxy forwarded to it over the last
``RATE_WINDOW``. A hot queue is sampled back to back, one passive declare in flight, at most
one every ``hot_interval``; a cold one every ``slow_interval`` (the depth interval, 200 ms).

Broker load: each hot queue costs at most ``1 / hot_interval`` passive declares a second
(bench/pace.py measures the broker's CPU for them: docs/performance.md).

The trip itself needs no prediction for the proxy's own publishes: the ledger books each one
as it is forwarded, so the estimate crosses the capacity exactly at the publish that crosses
it. Prediction makes the queue hot before that, so its first held publishes are admitted
within one hot interval rather than one slow interval.

Pure: every entry point takes ``now``.
"""

from __future__ import annotations

from dataclasses import dataclass

from floodwall.control.depth import QueueDepth
from floodwall.control.fleet import ShareRule
from floodwall.control.policy import Policy

#: Seconds over which the ingress (and, while held, admitted) rate is measured.
RATE_WINDOW = 1.0
#: How often a cold queue is counted (``slow``; ``--depth-interval``'s default).
DEPTH_INTERVAL = 0.2
#: A held queue whose counts have not moved for this long, nothing forwarded to it (its
#: consumers stopped), is counted every ``STILL_INTERVAL`` instead of every hot interval.
STILL_AFTER = 0.2
#: ... at most this much later than hot: a consumer's restart shows within it.
STILL_INTERVAL = 0.05


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


def drain_bytes_rate(depth: QueueDepth) -> float | None:
    """The drain rate in body bytes per second (messages x mean body size), None before
    two ready counts."""
    rate = depth.drain_rate
    return None if rate is None else rate * depth.average_body_bytes()


def predicted_full(depth: QueueDepth, policy: Policy, now: float, horizon: float,
                   share: ShareRule | None = None) -> bool:
    """Whether the queue reaches a limit within ``horizon`` seconds at its ingress rate
    (an unknown depth is not predicted). In a fleet (``share``): at the fleet's ingress
    (the others' as announced), or this sidecar's own share of the room at its own."""
    estimate = depth.estimate()
    if estimate is None:
        return False
    ingress = ingress_rate(depth, now)
    fleet = 1.0
    if share is not None:
        totals = depth.headroom(policy.capacity if policy.capacity > 0 else None,
                                policy.max_messages, share)
        if totals is not None and (
                depth.forwarded_bytes_total + ingress.bytes * horizon >= totals[0]
                or depth.forwarded_messages_total + ingress.messages * horizon >= totals[1]):
            return True
        if ingress.bytes > 0:
            fleet = (ingress.bytes + share.others_ingress) / ingress.bytes
        elif share.others_ingress > 0 and policy.capacity > 0:
            return estimate.bytes + share.others_ingress * horizon >= policy.capacity
    if policy.capacity > 0 \
            and estimate.bytes + fleet * ingress.bytes * horizon >= policy.capacity:
        return True
    return policy.max_messages is not None \
        and estimate.messages + fleet * ingress.messages * horizon >= policy.max_messages


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


def sampling_interval(depth: QueueDepth, policy: Policy, tripped: bool, now: float,
                      slow: float, hot: float, share: ShareRule | None = None) -> float:
    """The interval in force for a queue: ``hot`` while it is tripped or predicted to fill
    before the next slow sample (``predicted_full``), else ``slow``."""
    if tripped or predicted_full(depth, policy, now, slow, share):
        return hot
    return slow
