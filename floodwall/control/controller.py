"""Who may publish: tripped queues, the channels blocked on them, and the broker alarm.

Per-queue flow control, moved out of the broker: a channel that publishes to a full queue is
blocked on that queue; a channel can be blocked on a *set* of queues and is released only
when the set is empty. Pure: the I/O layer feeds it depth samples, alarms and policies,
the gates ask it about each publish; every entry point that needs the time takes ``now``.
What happens (a queue trips or releases, the alarm, a channel whose blocking set emptied) is
appended to ``outbox`` as values (``floodwall.control.events``); the I/O layer takes them
(``take_output``) and hands each freed channel to its connection's gate.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from floodwall.control.admission import Admission
from floodwall.control.blocks import Blocked, BlockTable, Ref
from floodwall.control.depth import SETTLE, Depth, ManagementSample, QueueDepth
from floodwall.control.events import (
    AlarmCleared,
    AlarmRaised,
    ChannelFreed,
    ControlOutput,
    QueueReleased,
    QueueTripped,
)
from floodwall.control.fleet import ShareRule
from floodwall.control.fleet_rate import trip_share
from floodwall.control.histogram import HoldTimes
from floodwall.control.lookups import Lookup, LookupKind, LookupResult, LookupTable
from floodwall.control.policy import EMPTY_POLICIES, Policy, PolicySet, UnknownDepth, should_trip
from floodwall.control.routing.model import REPLY_TO_PREFIX
from floodwall.control.trips import StampedAnswers, Trips

QueueKey = tuple[str, str]  # (vhost, queue)
#: The pseudo-queue every publish is blocked on while the broker has a resource alarm.
ALARM: QueueKey = ("", "broker resource alarm")
_NOTHING: frozenset[QueueKey] = frozenset()
#: The hold-time label of a hold on the broker's alarm (it has no policy).
ALARM_LABEL = "broker-alarm"
#: Sets of queue names whose policed members ``FlowController.policed`` keeps.
POLICED_CACHE_SIZE = 4096
#: Message bytes of a queue's 1.0 deliveries in flight (forwarded unsettled, the broker's
#: settlement not come yet) a ready count is taken to hold already (``QueueDepth.count_asked``),
#: and the most this sidecar's links feeding the queue may have in credit and in flight
#: together (the 1.0 gate's in-flight bound): the estimate is short by at most what is in flight
#: now, so the depth stays within the capacity plus this. A fleet member's part of it is its
#: share (``PolicedQueue.allowance_bytes``). RabbitMQ 4.0 keeps a sender link's credit plus its
#: unsettled deliveries within 256 messages: a sender of 1 KiB messages at full speed needs all
#: of that pipeline out of the estimate (docs/performance.md, "AMQP 1.0 senders").
IN_FLIGHT_ALLOWANCE = 256 * 1024
#: A queue whose policy limits bytes only has an allowance of ``capacity / ALLOWANCE_PARTS``
#: when that is more (two of its 1.0 links' windows: ``floodwall.enforce.amqp10.links.
#: policy_window``), at most ``MAX_ALLOWANCE``; one of a smaller capacity than
#: ``IN_FLIGHT_ALLOWANCE``, that capacity: ``in_flight_allowance``.
ALLOWANCE_PARTS = 512
MAX_ALLOWANCE = 2 * 1024 * 1024
#: How long a 1.0 link given a window from a queue's room counts as one of the links that
#: share it (``PolicedQueue.room_sharers``): a link sending renews it at each top-up.
ROOM_LEASE_S = 1.0


@dataclass
class PolicedQueue:
    """One queue under a policy: its depth, whether it is tripped, and for how long."""

    key: QueueKey
    policy: Policy
    depth: QueueDepth = field(default_factory=QueueDepth)
    tripped: bool = False
    tripped_since: float | None = None
    tripped_seconds: float = 0.0  # closed trip intervals; see seconds_tripped()
    trips: int = 0
    exists: bool = True
    # Publishes forwarded while the queue was tripped (1.0: sent on credit granted before).
    overshoot_messages: int = 0
    overshoot_bytes: int = 0
    # 1.0 deliveries forwarded to it unsettled by windowed links, not yet settled by the
    # broker (so maybe not in a count yet): the 1.0 gate's in-flight allowance reads it.
    in_flight: int = 0
    # A fleet: this sidecar's part of the queue's headroom (``set_share``; None: all of it).
    share: ShareRule | None = None
    # The publish path's shortcut (``FlowController.forwarded``): while the queue is not
    # tripped, its policy and its depth's base are those of the last evaluation
    # (``armed_*``) and the ledger totals are at most ``quiet_*``, an evaluation would
    # decide "not tripped" again, so none is made. -1: evaluate (nothing armed yet).
    quiet_bytes: float = field(default=-1.0, compare=False, repr=False)
    quiet_messages: float = field(default=-1.0, compare=False, repr=False)
    armed_rebases: int = field(default=-1, compare=False, repr=False)
    armed_policy: Policy | None = field(default=None, compare=False, repr=False)
    # 1.0 links of this sidecar given a window from the queue's room (``room_sharers``):
    # (connection, link_ref) -> until when they count as sharing it.
    # (Oldest lease first: they all last as long, so the expired ones are at the front.)
    room_leases: OrderedDict[tuple[int, int], float] = field(default_factory=OrderedDict,
                                                             compare=False, repr=False)

    def room(self, size: int) -> float:
        """The bytes the queue may still take before an evaluation could trip it: the armed
        totals less the ledger's (``quiet_*``), its messages taken at ``size`` bytes each
        (inf: the depth not known; below 0 when unarmed)."""
        depth = self.depth
        return min(self.quiet_bytes - depth.forwarded_bytes_total,
                   (self.quiet_messages - depth.forwarded_messages_total) * size)

    def counted_room(self) -> float:
        """The bytes the queue may take by its last count alone: ``room`` without what was
        forwarded since that count (which a fast consumer has mostly taken); when that count
        found the queue empty, without the deliveries counted back since either
        (``QueueDepth.count_back``: in flight when it was asked for, they may have reached
        the queue after it, and consumers that keep up have taken them too)."""
        depth = self.depth
        room = self.quiet_bytes - depth.counted_bytes_mark
        base = depth.counted_base
        if base is not None and not base.messages:
            room += depth.counted_back * depth.excluded_bytes
        return room

    def allowance_bytes(self) -> float:
        """This sidecar's part of the queue's in-flight allowance (``in_flight_allowance``):
        all of it alone, its share in a fleet (``ShareRule.share``: the members' parts sum
        to at most the whole)."""
        whole = in_flight_allowance(self.policy)
        share = self.share
        return whole if share is None else share.share(whole)

    def allowance(self, size: int | None = None) -> int:
        """The allowance in messages: ``allowance_bytes`` in messages of ``size`` (None: the
        queue's mean; 0 before any is known), at most the policy's ``max_messages`` (a
        fleet member: its share of them)."""
        if size is None:
            size = self.depth.average_body_bytes()
        if not size:
            return 0
        messages = int(self.allowance_bytes() // size)
        limit = self.policy.max_messages
        if limit is not None:
            share = self.share
            messages = min(messages, int(limit if share is None else share.share(limit)))
        return messages

    def settled(self, n: int) -> None:
        """``n`` of the queue's tracked 1.0 deliveries in flight are settled by the broker
        (or will not be: aborted, their link or session gone). Those its base count was taken
        to hold that can no longer be in flight are counted back (``QueueDepth.count_back``),
        and the quiet totals lowered to match, as an evaluation would arm them."""
        self.in_flight = left = self.in_flight - n
        depth = self.depth
        if depth.excluded and (more := depth.count_back(left)):
            self.quiet_messages -= more
            self.quiet_bytes -= more * depth.excluded_bytes

    def room_sharers(self, holder: tuple[int, int], now: float) -> int:
        """How many of this sidecar's 1.0 links share the queue's room now, ``holder`` (a
        connection and link_ref about to be given a window from it) among them: those given
        one within the last ``ROOM_LEASE_S``. Its lease is renewed; the others' expire (O(1)
        a call, however many links a client attaches)."""
        leases = self.room_leases
        leases[holder] = now + ROOM_LEASE_S
        leases.move_to_end(holder)
        while leases:
            oldest = next(iter(leases))
            if leases[oldest] >= now:
                break
            del leases[oldest]
        return len(leases)

    def seconds_tripped(self, now: float) -> float:
        open_interval = now - self.tripped_since if self.tripped_since is not None else 0.0
        return self.tripped_seconds + open_interval


class Router(Protocol):
    """Destination to queues (floodwall.control.routing.Topology)."""

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]: ...

    def knows_exchange(self, vhost: str, name: str) -> bool: ...

    @property
    def generation(self) -> int:
        """Goes up on every change that can change a route."""


def in_flight_allowance(policy: Policy) -> int:
    """The in-flight allowance of a queue under ``policy`` (bytes): the policy's own
    (``in_flight_allowance``, the operator's trade of the bound for a sender's speed), else
    ``IN_FLIGHT_ALLOWANCE``, at most its byte capacity (a queue's depth stays within twice a
    small capacity), or ``capacity / ALLOWANCE_PARTS`` up to ``MAX_ALLOWANCE`` when that is
    more and the policy limits bytes only. A policy with ``max_messages`` allows at most that
    many messages too (``PolicedQueue.allowance``)."""
    if policy.in_flight_allowance is not None:
        return policy.in_flight_allowance
    capacity = policy.capacity
    allowance = IN_FLIGHT_ALLOWANCE if capacity <= 0 else min(IN_FLIGHT_ALLOWANCE, capacity)
    if policy.max_messages is not None:
        return allowance
    return max(allowance, min(capacity // ALLOWANCE_PARTS, MAX_ALLOWANCE))


class ChannelHolds:
    """The held channels and links: which wait, on what, since when (``BlockTable``), and
    where each hold's time goes when it ends (``HoldTimes``, by policy). The controller owns
    one and decides when a hold begins and ends; this keeps the books."""

    def __init__(self) -> None:
        self.table = BlockTable()
        self.times = HoldTimes()  # by policy (ALARM_LABEL); lookups alone are not holds

    def begin(self, ref: Ref, queues: set[QueueKey], policies: frozenset[str],
              now: float, wants: int = 0) -> bool:
        """``ref`` waits on ``queues`` as well (a hold under ``policies``); True if it did
        not wait before."""
        self.times.blocked(ref, policies)
        return self.table.add(ref, queues, now, wants)

    def end(self, ref: Ref, outcome: str, now: float) -> None:
        """``ref`` waits no more (``outcome``: released, closed); its time goes into
        ``times``."""
        since = self.table.remove(ref)
        self.times.ended(ref, None if since is None else now - since, outcome)

    def end_connection(self, conn: int, now: float) -> None:
        """Connection ``conn`` is gone: none of its channels waits any more."""
        for ref in self.table.of_connection(conn):
            self.end(ref, "closed", now)

    def drop_queue(self, key: QueueKey, now: float) -> list[Ref]:
        """``key`` drained: it leaves every wait; the refs whose waits ended (freed)."""
        freed = self.table.drop_queue(key)
        for ref in freed:
            self.end(ref, "released", now)
        return freed


class FlowController:
    """The shared state behind every gate decision."""

    def __init__(self, router: Router, policies: PolicySet = EMPTY_POLICIES) -> None:
        self.router = router
        self.policies = policies
        self._policy_vhosts = policies.enforcing_vhosts
        self._enforcing = bool(self._policy_vhosts)  # some policy holds (the alarm too)
        self._policy_loads = 0  # set_policies calls: part of ``generation``
        self.queues: dict[QueueKey, PolicedQueue] = {}
        # Names a publish needs the broker's word on before it may go
        # (floodwall/control/lookups.py), and the policed queues still waiting for their
        # first depth figure (a queue lookup: publishes to them wait, so the ledger starts
        # from the broker's figure).
        self.lookups = LookupTable()
        self._awaiting: dict[QueueKey, Lookup] = {}
        # policed(): the policed keys among a set of queue names, until ``queues`` changes.
        self._policed_among: dict[tuple[str, frozenset[str]], frozenset[QueueKey]] = {}
        # Tripped queues: enforced (what publishes wait on; ALARM too) and shadow (watched:
        # the gates count what they would have done; ``shadow_blocking``).
        self.trips = Trips()
        self._tripped = self.trips.enforced
        # Queues with spooled backlog: what cannot join the spool waits behind it (FIFO).
        self._backlogged: set[QueueKey] = set()
        self._blocking_among = StampedAnswers(POLICED_CACHE_SIZE)  # blocking()'s, stamped
        self._waits_version = 0  # a backlog or an awaited first figure changed
        self._holds = ChannelHolds()
        self.admission = Admission()  # held publishes leave at the drain rate (admission.py)
        # A fleet: a newly policed queue's share rule at once (``FleetService``), not at the
        # next fleet tick: its first figure may come first (a fresh queue's first fill).
        self.share_source: Callable[[QueueKey, float], ShareRule | None] | None = None
        self._now = 0.0  # the latest time given: a close (which has none) ends its hold there
        self.alarm_reason: str | None = None
        self.outbox: list[ControlOutput] = []  # for the I/O layer (``take_output``), in order

    # -- held channels (``ChannelHolds``) ------------------------------------------------
    @property
    def holds(self) -> HoldTimes:
        """How long holds lasted, by policy and outcome (``floodwall_hold_seconds``)."""
        return self._holds.times

    def connection_closed(self, conn: int, now: float | None = None) -> None:
        """Connection ``conn`` is gone: none of its channels is blocked any more.

        ``now`` ends their holds (None: the latest time the controller was given)."""
        self._holds.end_connection(conn, self._now if now is None else now)

    def channel_closed(self, conn: int, channel: int, now: float | None = None) -> None:
        """``channel`` is gone (closed, refused, its link detached): its hold ends at ``now``
        (None: the latest time the controller was given)."""
        self._holds.end((conn, channel), "closed", self._now if now is None else now)

    def is_blocked(self, conn: int, channel: int) -> bool:
        return (conn, channel) in self._holds.table

    def blocked_on(self, conn: int, channel: int) -> frozenset[QueueKey]:
        """The queues ``channel`` waits on (empty when it is not blocked)."""
        return self._holds.table.on((conn, channel))

    @property
    def blocked_count(self) -> int:
        return len(self._holds.table)

    def starved(self, conn: int, channel: int, since: float) -> None:
        """The blocked 1.0 link ``channel`` has had no credit since ``since`` (for /state)."""
        self._holds.table.starved((conn, channel), since)

    def blocked_channels(self) -> list[Blocked]:
        return self._holds.table.views()

    def take_output(self) -> list[ControlOutput]:
        """Everything that happened since the last call (events and freed channels), in
        order; the outbox is empty afterwards."""
        out, self.outbox = self.outbox, []
        return out

    # -- policies and queues -----------------------------------------------------------
    def set_policies(self, policies: PolicySet, known_queues: Iterable[QueueKey],
                     now: float) -> None:
        """Apply a (re)loaded policy file to the queues that exist now."""
        self.policies = policies
        self._policy_vhosts = policies.enforcing_vhosts
        self._enforcing = bool(self._policy_vhosts)
        self._policy_loads += 1
        self._policed_among.clear()
        for key in list(self.queues):
            if policies.for_queue(*key) is None:
                self._unpolice(key, now)
        for key in known_queues:
            self.queue_seen(key, now)
        for q in self.queues.values():
            new = policies.for_queue(*q.key)
            if new is not None and new != q.policy:
                q.policy = new
                if q.tripped and self.trips.file(q.key, not new.enforced):
                    self._released(q.key, now)
                self._evaluate(q, now)
        if self.alarm_reason is not None and self.trips.file(ALARM, not self._enforcing):
            self._released(ALARM, now)  # every policy is in shadow now

    def queue_seen(self, key: QueueKey, now: float) -> PolicedQueue | None:
        """A queue exists (declared, or found in the topology); police it if a policy says."""
        q = self.queues.get(key)
        if q is not None:
            q.exists = True
            return q
        policy = self.policies.for_queue(*key)
        if policy is None:
            return None
        q = self.queues[key] = PolicedQueue(key, policy)
        self._policed_among.clear()
        if self.share_source is not None:  # (no figure yet: nothing to evaluate)
            _take_share(q, self.share_source(key, now))
        if not policy.enforced:
            return q  # watched only: nothing waits for its first figure
        # Until the broker gives a first figure, publishes to it wait (a queue lookup).
        lookup = Lookup(key[0], LookupKind.QUEUE, key[1])
        self._awaiting[key] = lookup
        self._waits_version += 1
        self.lookups.forget(lookup)
        self.lookups.start(lookup, now)
        return q

    def set_share(self, key: QueueKey, share: ShareRule | None, now: float) -> None:
        """This sidecar's part of policed queue ``key``'s headroom changed (the fleet's
        tick; None: the whole headroom): it trips when what it forwarded since the last
        count passes its share of the room that count left, and while held it admits its
        share of the room each count shows (``floodwall.control.admission``)."""
        q = self.queues.get(key)
        if q is not None and q.share != share:
            _take_share(q, share)
            if q.tripped:  # its next count decides (a depth unknown stays as it was)
                _arm(q)
            else:
                self._evaluate(q, now)

    def queue_deleted(self, key: QueueKey, now: float) -> None:
        if key in self.queues:
            self._unpolice(key, now)

    def _unpolice(self, key: QueueKey, now: float) -> None:
        q = self.queues.pop(key)
        self._policed_among.clear()
        self.admission.forget(key)
        self._first_figure(key, now)
        if q.tripped:
            self._set_tripped(q, False, "no longer policed", now)

    # -- lookups -----------------------------------------------------------------------
    def lookup_for(self, vhost: str, exchange: str, routing_key: str,
                   queues: frozenset[str], now: float) -> QueueKey | None:
        """The pseudo-queue to hold a publish on until the broker was asked, or None.

        ``queues`` is where the model routes the publish. A lookup is needed when the
        publish names what the model does not know and a policy could match where it
        lands: the default exchange with a routing key that is no known queue but matches
        a policy, or an exchange the model has never seen, in a vhost with policies.
        Answers are remembered (floodwall/control/lookups.py), so a stream of publishes costs one.
        """
        if vhost not in self._policy_vhosts:
            return None
        if exchange:
            if queues or self.router.knows_exchange(vhost, exchange):
                return None
            lookup = Lookup(vhost, LookupKind.EXCHANGE, exchange)
        else:
            if routing_key in queues or not routing_key \
                    or routing_key.startswith(REPLY_TO_PREFIX) \
                    or not self.enforces(vhost, routing_key):
                return None
            lookup = Lookup(vhost, LookupKind.QUEUE, routing_key)
        return lookup.key if self.lookups.want(lookup, now) else None

    def polices_vhost(self, vhost: str) -> bool:
        """Whether an enforce-mode policy (or a vhost's limiting defaults) can police queues
        of ``vhost``."""
        return vhost in self._policy_vhosts

    def enforces(self, vhost: str, queue: str) -> bool:
        """Whether an enforce-mode policy polices ``queue`` (a shadow policy only watches)."""
        policy = self.policies.for_queue(vhost, queue)
        return policy is not None and policy.enforced

    def lookup_answered(self, lookup: Lookup, result: LookupResult, now: float) -> bool:
        """The I/O layer asked the broker (and, when found, taught the model and fed the
        queue's first figure). Releases what waited for it. Returns True when the lookup
        stays pending: the broker could not be asked and a policy says ``on_unknown_depth:
        block``; the caller asks again later (``lookups.retry``)."""
        if result is LookupResult.FAILED and self._failure_blocks(lookup):
            return True
        if lookup.kind is LookupKind.QUEUE:
            self._first_figure((lookup.vhost, lookup.name), now)
        if self.lookups.answered(lookup, result is not LookupResult.FOUND, now,
                                 failed=result is LookupResult.FAILED) is not None:
            self._released(lookup.key, now)
        return False

    def _failure_blocks(self, lookup: Lookup) -> bool:
        """Whether publishes keep waiting for a lookup the broker could not answer: the
        queue's policy (or, for an exchange, any limited policy of the vhost) says block."""
        if lookup.kind is LookupKind.QUEUE:
            policy = self.policies.for_queue(lookup.vhost, lookup.name)
            policies = [policy] if policy is not None else []
        else:
            policies = [p for p in self.policies
                        if p.vhost == lookup.vhost and p.is_limited]
            default = self.policies.defaults.get(lookup.vhost)
            if default is not None and default.is_limited:
                policies.append(default)
        return any(p.on_unknown_depth is UnknownDepth.BLOCK for p in policies)

    def _first_figure(self, key: QueueKey, now: float) -> None:
        """``key`` no longer waits for its first figure (it came, or it never will)."""
        lookup = self._awaiting.pop(key, None)
        self._waits_version += lookup is not None
        if lookup is not None and self.lookups.answered(lookup, False, now) is not None:
            self._released(lookup.key, now)

    def awaiting_first_figure(self, key: QueueKey) -> bool:
        return key in self._awaiting

    # -- the publish path --------------------------------------------------------------
    def destinations(self, vhost: str, exchange: str, routing_key: str,
                     headers: dict[str, object] | None = None) -> frozenset[str]:
        return self.router.route(vhost, exchange, routing_key, headers)

    @property
    def generation(self) -> int:
        """Goes up when the routing model or the policies change: a route (or what is
        policed along it) computed at another generation may differ."""
        return self.router.generation + self._policy_loads

    def policed(self, vhost: str, queues: frozenset[str]) -> frozenset[QueueKey]:
        """The queues among ``queues`` policed by an enforce-mode policy (the answer for a set
        is kept until a queue starts or stops being policed or the policies change: routes
        are the same frozensets publish after publish)."""
        known = self._policed_among
        found = known.get((vhost, queues))
        if found is None:
            policed = self.queues
            found = frozenset(k for name in queues if (q := policed.get(k := (vhost, name)))
                              is not None and q.policy.enforced)
            if len(known) >= POLICED_CACHE_SIZE:
                known.clear()
            known[(vhost, queues)] = found
        return found

    def blocking(self, vhost: str, queues: frozenset[str]) -> frozenset[QueueKey]:
        """The tripped queues among ``queues`` (plus ALARM while the broker has one, and the
        lookup pseudo-queue of each that waits for its first depth figure)."""
        tripped, backlogged, awaiting = self._tripped, self._backlogged, self._awaiting
        if not tripped and not backlogged and not awaiting:
            return _NOTHING
        known = self._blocking_among
        answer = known.get((self.trips.version, self._waits_version), (vhost, queues))
        if answer is not None:
            return answer
        found = {(vhost, q) for q in queues
                 if (vhost, q) in tripped or (vhost, q) in backlogged}
        if awaiting:
            found.update(lookup.key for q in queues
                         if (lookup := awaiting.get((vhost, q))) is not None)
        if ALARM in tripped:
            found.add(ALARM)
        return known.put((vhost, queues), frozenset(found))

    def shadow_blocking(self, vhost: str, queues: frozenset[str]) -> frozenset[QueueKey]:
        """What ``blocking`` would add were every shadow policy enforced (``Trips``)."""
        return self.trips.shadow_among(vhost, queues, ALARM)

    def forwarded(self, vhost: str, queues: frozenset[str], body_bytes: int, now: float,
                  tracked: int = 0) -> None:
        """A publish went to the broker; book it on each policed queue it lands in
        (``tracked``: 1 for a 1.0 delivery whose settlement the gate tracks).

        A queue that is not tripped is evaluated only when the publish takes its ledger past
        the totals at which the decision could change (``PolicedQueue.quiet_*``), or when
        its depth or policy changed since the last evaluation: the decisions are the ones
        an evaluation per publish makes.
        """
        policed = self.queues
        if not policed:
            return
        for name in queues:
            q = policed.get((vhost, name))
            if q is not None:
                depth = q.depth
                depth.forwarded(now, body_bytes, 1, tracked)
                if not q.tripped and (depth.forwarded_bytes_total > q.quiet_bytes
                                      or depth.forwarded_messages_total > q.quiet_messages
                                      or depth.rebases != q.armed_rebases
                                      or q.policy is not q.armed_policy):
                    self._evaluate(q, now)

    # -- blocking ----------------------------------------------------------------------
    def block(self, conn: int, channel: int, queues: frozenset[QueueKey], now: float,
              wants: int = 0) -> bool:
        """Block ``channel`` on ``queues``; True if it was not blocked before. ``wants``: a
        1.0 link's window in bytes (it holds nothing: what it would send is its demand).

        Re-checks at once (a release may race the block): a queue that released meanwhile is
        dropped from the set again, and if none is left the channel is not blocked.
        """
        ref = (conn, channel)
        self._now = now
        still = {k for k in queues if k in self._tripped or k in self._backlogged
                 or self.lookups.pending_key(k)}
        if not still:
            return False
        return self._holds.begin(ref, still, frozenset(
            {self.queues[k].policy.name for k in still if k in self.queues}
            | ({ALARM_LABEL} if ALARM in still else set())), now, wants)

    def admits(self, keys: frozenset[QueueKey], now: float) -> bool:
        """Whether a held publish blocked on ``keys`` may go now: each is a tripped queue
        with tokens (no alarm, lookup or spool backlog among them), less what held 1.0
        links were admitted and have not sent yet (``reserve``)."""
        if self._holds.table.reserving:
            room = self.admission_room(keys, now)
            return room is not None and room[0] > 0 and room[1] > 0
        return all(k in self.queues and k not in self._backlogged
                   and self.admission.admits(k, self.queues[k], now) for k in keys)

    def admission_room(self, keys: frozenset[QueueKey], now: float, conn: int = 0,
                  channel: int | None = None) -> tuple[float, float] | None:
        """The tokens (body bytes, publishes) the held queues ``keys`` have left for
        blocked ref ``(conn, channel)`` (None: for a publish), its own reservation left
        out: the least over them of what admission offers less every other held 1.0
        link's reservation; None when one of them admits nothing (an alarm, a lookup, a
        spool backlog, no figure)."""
        table = self._holds.table
        but = None if channel is None else (conn, channel)
        room_bytes = room_messages = math.inf
        for k in keys:
            q = self.queues.get(k)
            if q is None or k in self._backlogged:
                return None
            room = self.admission.room(k, q, now)
            if room is None:
                return None
            reserved_bytes, reserved_messages = table.reserved_on(k, but)
            room_bytes = min(room_bytes, room[0] - reserved_bytes)
            room_messages = min(room_messages, room[1] - reserved_messages)
        return room_bytes, room_messages

    def held_by_others(self, keys: frozenset[QueueKey]) -> bool:
        """Whether something besides held 1.0 links keeps one of ``keys`` held: a 0-9-1
        channel of this sidecar waits on it (its held publishes use the tokens, so the queue
        stays held: ``Admission.busy``), or other fleet members forward into it. Only then
        is a held 1.0 link admitted (``LinkCredit.channel_admitted``); alone, links wait for
        the release, their credit near capacity paced to the drain."""
        table = self._holds.table
        for k in keys:
            q = self.queues.get(k)
            if table.channels_waiting(k) or (q is not None and q.share is not None
                                             and q.share.others_ingress > 0):
                return True
        return False

    def reserve(self, conn: int, channel: int, messages: int, body_bytes: int) -> None:
        """Blocked 1.0 link ``channel`` has ``messages`` (``body_bytes``) of credit that
        its held queues' tokens admitted and it has not used yet: counted against their
        tokens (``admission_room``, ``admits``) until it says less or its block ends."""
        self._holds.table.reserve((conn, channel), messages, body_bytes)

    # -- depth and alarms --------------------------------------------------------------
    def count_asked(self, key: QueueKey, at: float) -> None:
        """A ready count of ``key`` is asked for now (``at``): its tracked deliveries not
        settled yet are noted with it, up to its ``allowance`` taken to be in the count
        (``QueueDepth.count_asked``)."""
        q = self.queues.get(key)
        if q is not None:
            q.depth.count_asked(at, q.in_flight, q.allowance() if q.in_flight else 0)

    def sampled_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                            rtt: float | None, now: float, drains: bool = True) -> None:
        """A ready count of ``key`` (``drains``: False for a stream, ``QueueDepth``)."""
        q = self.queues.get(key)
        if q is not None:
            depth = q.depth
            depth.sampled_ready_count(requested_at, ready, rtt, drains)
            if depth.excluded:  # (settled since it was asked for: counted back at once)
                depth.count_back(q.in_flight)
            self._evaluate(q, now)
            if q.tripped and key not in self._backlogged:  # its tokens, to those waiting
                waiting = self._holds.table.waiting_on(key)
                self.outbox.extend(self.admission.tick(key, q, waiting, now))
            if self._awaiting:
                self._first_figure(key, now)

    def sampled_management(self, key: QueueKey, sample: ManagementSample, now: float) -> None:
        q = self.queues.get(key)
        if q is not None:
            q.depth.sampled_management(sample)
            self._evaluate(q, now)
            if self._awaiting:
                self._first_figure(key, now)

    def depth_unknown(self, key: QueueKey, now: float) -> None:
        """The depth could not be read; the policy's on_unknown_depth decides."""
        q = self.queues.get(key)
        if q is not None:
            self.admission.forget(key)  # no counts, no admission: on_unknown_depth decides
            self._apply(q, should_trip(q.policy, None, None, q.tripped), now)

    def set_backlog(self, key: QueueKey, backlogged: bool, now: float | None = None) -> None:
        """The spool of ``key`` has records (True) or has drained (False).

        While it has, publishes to the queue that cannot join the spool are held, as if it
        were tripped, so none overtakes the backlog; the drain releases them.
        """
        self._waits_version += 1
        if backlogged:
            self._backlogged.add(key)
        elif key in self._backlogged:
            self._backlogged.discard(key)
            if key not in self._tripped:
                self._released(key, self._now if now is None else now)

    def set_alarm(self, reason: str | None, now: float | None = None) -> None:
        """The broker raised (reason) or cleared (None) a memory or disk alarm."""
        if now is not None:
            self._now = now
        if reason == self.alarm_reason:
            return
        self.alarm_reason = reason
        if reason is not None:  # held on while a policy enforces, else watched
            self.trips.trip(ALARM, not self._enforcing)
            self.outbox.append(AlarmRaised(reason))
        else:
            self.trips.release(ALARM)
            self.outbox.append(AlarmCleared())
            self._released(ALARM, self._now)

    def _evaluate(self, q: PolicedQueue, now: float) -> None:
        self._now = now
        # A tripped queue is released on the settled estimate (floodwall/control/depth.py: a ready
        # count taken while a burst is still reaching the queue must not release it).
        est = q.depth.estimate(settled=q.tripped)
        if est is not None and q.tripped and q.share is not None:
            est = _as_if_all_forwarded_alike(q, est)
        if est is None:
            self._apply(q, should_trip(q.policy, None, None, q.tripped), now)
        else:
            self._apply(q, should_trip(q.policy, est.bytes, est.messages, q.tripped)
                        or (not q.tripped and _over_share(q)), now, est.messages <= 0)
        _arm(q)

    def _apply(self, q: PolicedQueue, tripped: bool, now: float, empty: bool = False) -> None:
        if tripped != q.tripped and (tripped or not self._stays_held(q, empty)):
            self._set_tripped(q, tripped, "depth", now)

    def _stays_held(self, q: PolicedQueue, empty: bool) -> bool:
        """Whether held queue ``q``, which its depth would release, stays held: its held
        publishers used every token they were offered (``Admission.busy``), unless it is
        ``empty`` (its settled estimate) and only 1.0 links wait on it: they are offered no
        tokens (``held_by_others``), what they send while it is held is credit granted before
        the trip, and its consumers wait for more."""
        if not self.admission.busy(q.key, q.depth):
            return False
        return not empty or self.held_by_others(frozenset((q.key,)))

    def _set_tripped(self, q: PolicedQueue, tripped: bool, why: str, now: float) -> None:
        est = q.depth.estimate() or Depth(-1, -1)
        q.tripped = tripped
        policy = q.policy
        shadow = not policy.enforced
        if tripped:
            q.trips += 1
            q.tripped_since = now
            q.depth.expect_lag(SETTLE, now)  # a flood may precede a trip
            self.trips.trip(q.key, shadow)
            self.outbox.append(QueueTripped(
                q.key, policy.name, est.bytes, est.messages, policy.capacity,
                policy.max_messages, self._publishers_of(q.key), shadow,
                _share_limit(q)))
        else:
            if q.tripped_since is not None:
                q.tripped_seconds += now - q.tripped_since
            q.tripped_since = None
            self.trips.release(q.key)
            self.outbox.append(QueueReleased(
                q.key, policy.name, est.bytes, est.messages, policy.resume, why,
                self._publishers_of(q.key), shadow))
            if q.key not in self._backlogged:
                self._released(q.key, now)

    def _publishers_of(self, key: QueueKey) -> str:
        return ",".join(f"{c}/{ch}" for c, ch in self._holds.table.waiting_on(key))

    def _released(self, key: QueueKey, now: float) -> None:
        """Drop ``key`` from every blocked set; a channel whose set empties is freed."""
        for ref in self._holds.drop_queue(key, now):
            self.outbox.append(ChannelFreed(*ref))

    # -- views -------------------------------------------------------------------------
    @property
    def any_tripped(self) -> bool:
        """Whether any queue is tripped (``tripped`` without making the set: per message)."""
        return bool(self._tripped)

    @property
    def tripped(self) -> frozenset[QueueKey]:
        """The tripped queues publishes wait on (enforce mode; ALARM while it holds)."""
        return frozenset(self._tripped)


def _arm(q: PolicedQueue) -> None:
    """Set ``q.quiet_*`` for its policy and its depth's current base.

    Not tripped, with a known depth, ``should_trip`` trips only when bytes > capacity (if
    any) or messages > max_messages (if any): the ledger totals that keep both within
    are the depth's ``headroom``. With the depth unknown it ignores the ledger: an
    untripped queue stays so (on_unknown_depth keep or allow) or trips at once (block:
    evaluate every publish).
    """
    policy = q.policy
    limits = policy.limits
    depth = q.depth
    headroom = depth.headroom(limits.capacity if limits.capacity > 0 else None,
                              limits.max_messages, trip_share(q, q.share))
    if headroom is None:
        quiet = -1.0 if should_trip(limits, None, None, False) else math.inf
        headroom = (quiet, quiet)
    q.quiet_bytes, q.quiet_messages = headroom
    q.armed_rebases = depth.rebases
    q.armed_policy = policy


def _over_share(q: PolicedQueue) -> bool:
    """A fleet member forwarded more since its last count than its share of the room that
    count left (``ShareRule``): it trips, though the queue may not be full yet."""
    if q.share is None:
        return False
    limits = q.policy.limits
    depth = q.depth
    totals = depth.headroom(limits.capacity if limits.capacity > 0 else None,
                            limits.max_messages, trip_share(q, q.share))
    return totals is not None and (depth.forwarded_bytes_total > totals[0]
                                   or depth.forwarded_messages_total > totals[1])


def _as_if_all_forwarded_alike(q: PolicedQueue, est: Depth) -> Depth:
    """A fleet member's estimate for its release decision: the base, plus what it forwarded
    since divided by its part of the room (were every member forwarding alike), so that a
    member whose count is older than the others' does not release on its own small part."""
    depth, policy = q.depth, q.policy
    base = depth.base
    if base is None or q.share is None:
        return est
    f = q.share.fraction(
        None if policy.capacity <= 0 else float(policy.capacity - base.bytes),
        None if policy.max_messages is None else float(policy.max_messages - base.messages),
        depth.average_body_bytes())
    if f >= 1.0:
        return est
    if f <= 0.0:
        return Depth(max(est.bytes, policy.capacity + 1), est.messages)
    return Depth(base.bytes + round(max(0, est.bytes - base.bytes) / f),
                 base.messages + round(max(0, est.messages - base.messages) / f))


def _share_limit(q: PolicedQueue) -> int | None:
    """The depth (bytes) at which a fleet member's share of the room ran out: the base plus
    its share (None: no fleet, no byte capacity, or no base)."""
    base, capacity = q.depth.base, q.policy.capacity
    if q.share is None or base is None or capacity <= 0:
        return None
    room = capacity - base.bytes
    return base.bytes + int(room if room <= 0 else q.share.share(room))


def _take_share(q: PolicedQueue, share: ShareRule | None) -> None:
    """``q``'s part of its headroom, and the others' announced ingress its depth reads."""
    q.share = share
    q.depth.others_rate = 0.0 if share is None else share.others_ingress
    q.depth.in_fleet = share is not None


def quiet_room(policed: Mapping[QueueKey, PolicedQueue], vhost: str,
               queues: frozenset[str]) -> tuple[float, float] | None:
    """The body bytes and publishes ``FlowController.forwarded`` can book on ``queues``
    before it would evaluate any of them (``PolicedQueue.quiet_*``); None when the next
    publish would (a tripped queue, a depth or policy changed since its last evaluation)."""
    room_bytes = room_messages = math.inf
    for name in queues:
        q = policed.get((vhost, name))
        if q is not None:
            depth = q.depth
            if q.tripped or depth.rebases != q.armed_rebases or q.policy is not q.armed_policy:
                return None
            room_bytes = min(room_bytes, q.quiet_bytes - depth.forwarded_bytes_total)
            room_messages = min(room_messages, q.quiet_messages - depth.forwarded_messages_total)
    return room_bytes, room_messages


def forwarded_run(policed: Mapping[QueueKey, PolicedQueue], vhost: str, queues: frozenset[str],
                  body_bytes: int, messages: int, now: float, tracked: int = 0) -> None:
    """``messages`` publishes to ``queues``, ``body_bytes`` in all, within ``quiet_room``:
    booked as ``FlowController.forwarded`` books them one by one (none evaluates a queue)."""
    for name in queues:
        q = policed.get((vhost, name))
        if q is not None:
            q.depth.forwarded(now, body_bytes, messages, tracked)
