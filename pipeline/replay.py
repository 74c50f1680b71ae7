"""What if: one queue's recorded load replayed through a policy, by floodwall's own rules.

Pure Python, no Spark (pipeline/whatif.py runs ``replay`` per queue on the executors). The
input is the queue's recorded timeline in buckets of the telemetry interval (``Bucket``:
what the fleet's producers offered, what it forwarded and held, the depth, the rejects and
deadline expiries, the policy in force); the output the figures of ``summary.json``'s
per-queue entries as that policy would have made them (``Outcome``) and the depth over time.

The decisions are the proxy's, called as the proxy calls them (docs/pipeline.md, "What
if"): whether the queue trips or releases is ``floodwall.control.policy.should_trip`` (capacity,
resume, the count limits, ``on_unknown_depth``), held publishers keep a queue held at its
resume level as ``floodwall.control.admission.Admission.busy`` says (they use every token
they are offered), what happens to a publish to a tripped queue (hold, reject, spool, or
pass in shadow mode) is ``floodwall.enforce.decision.decide`` and how long a publish may
wait ``floodwall.enforce.decision.deadline_of``. What a held queue may take is the proxy's
admission rule, ``floodwall.control.admission.held_room`` (which the proxy's ``allowance``
calls at every count): the room a count of the queue leaves below its limits plus what
its consumers take until the next count. The proxy counts every few milliseconds, keeps a
ledger of what is in flight and credits the drain until its next count; the replay counts
at every step, its ledger has nothing in flight, and it credits the step's drain
(``admission_room``), so a held queue is fed at its drain rate and stays at about its
limit, as the proxy keeps it.

A fleet (the queue's buckets carry more than one sidecar) trips by its own rule: when the
first member passes its share of the room beyond the fleet's room target (each member's
``floodwall.control.fleet.ShareRule.share`` of it, ``fleet.fleet_shares``, as
``fleet_rate.trip_share`` trips a member at a count), and while it is held its members
admit together at most the fleet's feed (``fleet_rate.feed``) and the admission rule's
room. At each bucket's end its sidecars settle their parts (``_Fleet``): each holds its
part of what the bucket held (its part of the offered load), is admitted its share of what
the queue admitted from its held publishes by the fleet's own rule
(``floodwall.control.fleet.fleet_shares``: max-min fair on the demands the members
announce, ``fleet.demand_of`` of what each forwarded over the last bucket and what it
holds), oldest first, and expires its own at the deadline; so the outcome says, per
sidecar, what it was admitted and how long its publishers waited. The first member to trip
holds the whole fleet in the replay (docs/pipeline.md, "What if"). A fleet's held
publishes wait in each sidecar's own queue, served by the shares, not oldest first across
the fleet: the queue's held byte-seconds, waits and deadline expiries are its sidecars'
sums (``_Fleet.outcome``).

The replay steps through each bucket in ``SUBSTEPS`` parts while anything can happen in it,
in one step while the queue is calm: the drain spread evenly, the offered load too unless
the bucket offered less than the one before it, when it comes at the rate before until it
runs out (``_spread``: a burst that ends inside a bucket).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from floodwall.control.admission import HOT_INTERVAL, held_room
from floodwall.control.depth import MIN_MARGIN, Depth, RoomShare
from floodwall.control.fleet import demand_of, fleet_shares, max_min_shares
from floodwall.control.fleet_rate import feed, room_and_target
from floodwall.control.policy import Mode, Overflow, Policy, should_trip
from floodwall.control.schedule import DEPTH_INTERVAL, RATE_WINDOW
from floodwall.enforce.decision import Verdict, deadline_of
from floodwall.enforce.decision import decide as verdict_of
from floodwall.enforce.ports import SpoolPort

#: Parts of a bucket stepped through while the queue is near, at or over a limit.
SUBSTEPS = 10
#: A bucket this many steps after the one before stands for them all (missed samples);
#: further apart, the time between is a telemetry gap.
MAX_SPAN = 2
#: The figures of an outcome, each with the meaning of ``summary.json``'s per-queue entry.
FIGURES = ("trips", "tripped_seconds", "depth_max", "peak_overshoot", "held_byte_seconds",
           "spooled_bytes_max", "rejects", "deadline_expiries", "admitted_bytes")


@dataclass(frozen=True, slots=True)
class RecordedPolicy:
    """The policy fields of a sample (the policy in force then)."""

    name: str
    capacity: int
    resume: int
    max_messages: int
    resume_messages: int
    overflow: str
    deadline: float
    mode: str

    def policy(self) -> Policy | None:
        """As a ``Policy`` (None when the fields do not make one: not policed)."""
        try:
            return Policy(name=self.name, capacity=self.capacity, resume=self.resume,
                          max_messages=self.max_messages or None,
                          resume_messages=(self.resume_messages if self.max_messages
                                           else None),
                          overflow=Overflow(self.overflow), deadline=self.deadline,
                          mode=Mode(self.mode))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Bucket:
    """One bucket of a queue's recorded timeline, summed over the fleet's sidecars."""

    index: int  # the bucket's start is index x the step
    offered_bytes: int  # forwarded plus the growth of held publishes (``offered``)
    offered_messages: int
    forwarded_bytes: int
    forwarded_messages: int
    held_bytes: int  # at the bucket's end
    depth_bytes: int | None  # the newest depth in the bucket
    depth_messages: int | None
    rejects: int
    expiries: int
    tripped: bool
    sidecars: int
    policy: RecordedPolicy | None
    spooled_bytes: int = 0
    # Each sidecar's offered bytes in the bucket, (sidecar, bytes) sorted by name.
    members: tuple[tuple[str, int], ...] = ()
    # The sidecars' drain estimate (bytes/s, ``drain_bytes_per_second``; None: not known).
    drain_estimate: float | None = None


@dataclass(slots=True)
class Outcome:
    """What a policy did to a queue, in ``summary.json``'s terms, and the waits."""

    trips: int = 0
    tripped_seconds: float = 0.0
    depth_max: int = 0
    peak_overshoot: int = 0
    held_byte_seconds: float = 0.0
    spooled_bytes_max: int = 0
    rejects: int = 0
    deadline_expiries: int = 0
    admitted_bytes: int = 0
    wait_mean_seconds: float = 0.0  # of the bytes held and then admitted
    wait_max_seconds: float = 0.0
    depth: list[tuple[int, int]] = field(default_factory=list)  # (bucket end ms, bytes)
    # A fleet: per sidecar, what it was admitted and how its publishers waited.
    sidecars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        """The figures, rounded as ``summary.json`` rounds (whole bytes, ms)."""
        return {"trips": self.trips, "tripped_seconds": round(self.tripped_seconds, 3),
                "depth_max": self.depth_max, "peak_overshoot": self.peak_overshoot,
                "held_byte_seconds": round(self.held_byte_seconds, 1),
                "spooled_bytes_max": self.spooled_bytes_max, "rejects": self.rejects,
                "deadline_expiries": self.deadline_expiries,
                "admitted_bytes": self.admitted_bytes,
                "wait_mean_seconds": round(self.wait_mean_seconds, 3),
                "wait_max_seconds": round(self.wait_max_seconds, 3),
                **({"sidecars": [{"sidecar": name, **f} for name, f in self.sidecars.items()]}
                   if self.sidecars else {})}


@dataclass(frozen=True, slots=True)
class Timeline:
    """A queue's recorded buckets, prepared: what was offered and what could drain."""

    vhost: str
    queue: str
    step: float  # seconds
    buckets: tuple[Bucket, ...]  # in time order, gaps left out
    offered: tuple[float, ...]  # bytes offered per bucket (rejects and expiries included)
    drain: tuple[float, ...]  # bytes the consumers could take per bucket
    spans: tuple[int, ...]  # steps each bucket stands for (a missed sample: 2)
    body: float  # mean body bytes
    spooling: bool  # the recorded sidecars had a spool (--spool-dir)
    gap_seconds: float
    held_share: float  # of the offered bytes, the part offered while the queue was tripped
    sidecars: tuple[str, ...] = ()  # every sidecar that sampled the queue, by name
    # Per bucket, each sidecar's part of its offered load (a fleet: more than one sidecar).
    parts: tuple[tuple[tuple[str, float], ...], ...] = ()
    drain_rate: float = 0.0  # bytes/s: the consumers' take over backlogged buckets
    # bytes/s: the sidecars' drain estimate while their queue was held (None: never held)
    held_estimate: float | None = None


def timeline(vhost: str, queue: str, step: float, buckets: list[Bucket]) -> Timeline:
    """``buckets`` (any order) prepared for ``replay``.

    Offered load: what the sidecars forwarded, plus the growth of what they held, plus what
    they refused (rejects, deadline expiries at the mean body size). While held, that is what
    producers handed to the proxy, not what they would have sent unhindered
    (docs/pipeline.md, "What if", caveats). The drain: the consumers' take in a bucket
    (forwarded less the growth of the depth) when the queue had a backlog all through it;
    otherwise at least the queue's drain rate (its take over backlogged buckets), which
    they showed when there was work waiting. A bucket whose depth ends above 0 takes the
    recorded drain as it is (the proxy's estimate, which the trips were decided on, shows
    consumption only at its next count: a queue starting to fill drains little at first).
    A bucket following a missing one (a sample that fell into the bucket after: the
    sidecars' clocks jitter) stands for both; a longer run of missing buckets is a gap.
    """
    ordered = sorted(buckets, key=lambda b: b.index)
    fwd_b = sum(b.forwarded_bytes for b in ordered)
    fwd_m = sum(b.forwarded_messages for b in ordered)
    body = fwd_b / fwd_m if fwd_m else 1.0
    offered = [max(0.0, b.offered_bytes + (b.rejects + b.expiries) * body) for b in ordered]
    egress: list[float | None] = []
    backlog: list[bool] = []
    spans: list[int] = []
    prev: Bucket | None = None
    for b in ordered:
        span = 1 if prev is None else b.index - prev.index
        spans.append(span if span <= MAX_SPAN else 1)
        if span <= MAX_SPAN and prev is not None and prev.depth_bytes is not None \
                and b.depth_bytes is not None:
            egress.append(max(0.0, b.forwarded_bytes - (b.depth_bytes - prev.depth_bytes)))
            backlog.append(b.depth_bytes > 0)
        else:
            egress.append(None)
            backlog.append(False)
        prev = b
    taken = [(e, n) for e, k, n in zip(egress, backlog, spans, strict=True)
             if k and e is not None]
    rate = sum(e for e, _ in taken) / sum(n for _, n in taken) if taken else max(
        (e / n for e, n in zip(egress, spans, strict=True) if e is not None), default=0.0)
    drain = [(e if k else max(e, rate * n)) if e is not None else rate * n
             for e, k, n in zip(egress, backlog, spans, strict=True)]
    span = sum(spans)
    total = sum(offered)
    held = sum(o for o, b in zip(offered, ordered, strict=True) if b.tripped)
    gaps = (ordered[-1].index - ordered[0].index + 1 - span) if ordered else 0
    sidecars = tuple(sorted({name for b in ordered for name, _ in b.members}))
    estimates = [b.drain_estimate for b in ordered if b.tripped and b.drain_estimate is not None]
    return Timeline(vhost, queue, step, tuple(ordered), tuple(offered), tuple(drain),
                    tuple(spans), body, any(b.spooled_bytes > 0 for b in ordered), gaps * step,
                    held / total if total else 0.0, sidecars,
                    tuple(_parts(b) if len(sidecars) > 1 else () for b in ordered), rate / step,
                    sum(estimates) / len(estimates) if estimates else None)


def _parts(b: Bucket) -> tuple[tuple[str, float], ...]:
    """Each sidecar's part of the bucket's offered load (equal parts when none offered)."""
    total = sum(max(0, o) for _, o in b.members)
    if not b.members:
        return ()
    if total <= 0:
        return tuple((name, 1 / len(b.members)) for name, _ in b.members)
    return tuple((name, max(0, o) / total) for name, o in b.members)


class _Spool:
    """The spool as ``floodwall.enforce.decision`` reads it (the two views of ``SpoolPort``
    it calls; the replay never writes a record)."""

    def __init__(self, key: tuple[str, str], max_bytes: int) -> None:
        self.key = key
        self.bytes = 0.0
        self.max_bytes = max_bytes

    @property
    def accepting(self) -> bool:
        return self.bytes < self.max_bytes

    def has_backlog(self, key: tuple[str, str]) -> bool:
        return key == self.key and self.bytes > 0


@dataclass(frozen=True, slots=True)
class _Policed:
    policy: Policy


@dataclass(slots=True)
class _Member:
    """One sidecar of the queue's fleet while the timeline plays."""

    held: deque[list[float]] = field(default_factory=deque)  # [bytes, held at]
    held_bytes: float = 0.0
    rate: float = 0.0  # bytes/s it forwarded over the last bucket: its ingress (its demand)
    admitted: float = 0.0  # bytes that entered the queue from it while it was tripped
    held_byte_seconds: float = 0.0
    waited: float = 0.0  # byte-seconds of its held bytes that were admitted
    admitted_held: float = 0.0
    wait_max: float = 0.0
    expired: float = 0.0  # bytes of its held publishes that passed their deadline

    def figures(self, total_admitted: float, body: float) -> dict[str, Any]:
        return {"admitted_bytes": round(self.admitted),
                "admitted_share": (round(self.admitted / total_admitted, 4)
                                   if total_admitted > 0 else None),
                "held_byte_seconds": round(self.held_byte_seconds, 1),
                "wait_mean_seconds": round(self.waited / self.admitted_held, 3)
                if self.admitted_held > 0 else 0.0,
                "wait_max_seconds": round(self.wait_max, 3),
                "deadline_expiries": round(self.expired / body)}

    def admit(self, take: float, at: float) -> None:
        """``take`` bytes of its held publishes admitted at ``at``, oldest first."""
        self.admitted_held += take
        self.admitted += take
        while self.held and take > 0:
            chunk = self.held[0]
            went = min(chunk[0], take)
            chunk[0] -= went
            take -= went
            self.held_bytes -= went
            self.waited += went * max(0.0, at - chunk[1])
            self.wait_max = max(self.wait_max, at - chunk[1])
            if chunk[0] <= 1e-9:
                self.held.popleft()
        if not self.held:
            self.held_bytes = 0.0

    def expire(self, now: float, wait: float) -> None:
        while self.held and now - self.held[0][1] > wait:
            chunk = self.held.popleft()
            self.expired += chunk[0]
            self.held_bytes = self.held_bytes - chunk[0] if self.held else 0.0


@dataclass(slots=True)
class _BucketLoad:
    """What the queue did with its held publishes over one bucket (the fleet's sums)."""

    held: float = 0.0  # bytes newly held ...
    held_at: float = 0.0  # ... x the time they were held
    admitted: float = 0.0  # held bytes admitted ...
    admitted_at: float = 0.0  # ... x the time they were admitted
    passed: float = 0.0  # bytes that entered the queue while it was tripped, not held
    free: float = 0.0  # bytes forwarded while it was not tripped


class _Fleet:
    """A fleet's sidecars, each with its own held publishes, settled at each bucket's end:
    each sidecar's part of what the bucket held is its part of the offered load, and of
    what the queue admitted from its held publishes, its share by the fleet's rule
    (``floodwall.control.fleet.fleet_shares``, what each member's ``ShareRule.share``
    takes of a room, max-min fair on the demands the members announce,
    ``fleet.demand_of`` of what each forwarded over the last bucket and what it holds); a
    share beyond what a sidecar holds goes to those that still hold, as an unused share is
    room again at the proxy's next count, milliseconds later."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.members = {name: _Member() for name in names}
        self.busy = False  # a sidecar held publishes at the last bucket's end
        # the last bucket, when nothing was held: its parts and the bytes/s forwarded
        self.calm: tuple[tuple[tuple[str, float], ...], float] | None = None

    def settle(self, parts: tuple[tuple[str, float], ...], load: _BucketLoad, end: float,
               seconds: float, wait: float | None) -> None:
        """The bucket ending at ``end`` (``seconds`` long), its sidecars' ``parts``."""
        if not self.busy and load.held <= 0 and load.passed <= 0 and load.admitted <= 0:
            self.calm = (parts, load.free / seconds)  # nothing per sidecar to settle
            return
        members = self.members
        if self.calm is not None:  # the ingress each had over the calm bucket before
            calm_parts, rate = self.calm
            for m in members.values():
                m.rate = 0.0
            for name, f in calm_parts:
                members[name].rate = rate * f
            self.calm = None
        if load.held > 0:
            at = load.held_at / load.held
            for name, f in parts:
                if f > 0:
                    m = members[name]
                    m.held.append([load.held * f, at])
                    m.held_bytes += load.held * f
        forwarded = dict.fromkeys(members, 0.0)
        for name, f in parts:
            members[name].admitted += load.passed * f
            forwarded[name] += (load.passed + load.free) * f
        if load.admitted > 0:
            for name, take in self._takes(load.admitted).items():
                members[name].admit(take, load.admitted_at / load.admitted)
                forwarded[name] += take
        busy = False
        for name, m in members.items():
            if wait is not None and m.held:
                m.expire(end, wait)
            m.held_byte_seconds += m.held_bytes * seconds
            m.rate = forwarded[name] / seconds
            busy = busy or bool(m.held)
        self.busy = busy

    def demands(self) -> dict[str, float | None]:
        """Each sidecar's demand as the fleet announces it (``fleet.demand_of`` of what it
        forwarded over the last bucket and what it holds), by name."""
        rates = {n: m.rate for n, m in self.members.items()}
        if self.calm is not None:
            calm_parts, rate = self.calm
            rates = dict.fromkeys(self.members, 0.0) | {n: rate * f for n, f in calm_parts}
        return {n: demand_of(rates[n], round(m.held_bytes))
                for n, m in sorted(self.members.items())}

    def _takes(self, admitted: float) -> dict[str, float]:
        holding = {n: m for n, m in self.members.items() if m.held_bytes > 0}
        shares = fleet_shares(admitted, {n: demand_of(m.rate, round(m.held_bytes))
                                         for n, m in sorted(holding.items())})
        takes = {n: min(shares[n], m.held_bytes) for n, m in holding.items()}
        left = admitted - sum(takes.values())
        while left > 1e-6:  # what some could not use, to those that still hold
            rest = {n: m.held_bytes - takes[n] for n, m in holding.items()
                    if m.held_bytes - takes[n] > 1e-9}
            if not rest:
                break
            more = max_min_shares(left, rest)
            for n, x in more.items():
                takes[n] += min(x, rest[n])
            left = admitted - sum(takes.values())
        return takes

    def outcome(self, out: Outcome, body: float) -> None:
        """The sidecars' figures into ``out``, and the queue's waits as theirs: a fleet's
        held publishes wait in each sidecar's own queue, served by the shares, not in one
        queue oldest first (those that offer less than their share wait less, the others
        nearer the deadline), so the queue's held byte-seconds, waits and deadline
        expiries are the sums of its sidecars'."""
        members = self.members.values()
        admitted = sum(m.admitted for m in members)
        out.sidecars = {name: m.figures(admitted, body)
                        for name, m in sorted(self.members.items())}
        out.held_byte_seconds = sum(m.held_byte_seconds for m in members)
        out.deadline_expiries = round(sum(m.expired for m in members) / body)
        admitted_held = sum(m.admitted_held for m in members)
        out.wait_mean_seconds = (sum(m.waited for m in members) / admitted_held
                                 if admitted_held > 0 else 0.0)
        out.wait_max_seconds = max((m.wait_max for m in members), default=0.0)


def admission_room(policy: Policy, depth: float, drained: float, body: float,
                   share: RoomShare | None = None) -> float:
    """Bytes a held queue at ``depth`` bytes may take over a step whose consumers take
    ``drained`` bytes: the proxy's admission rule (``floodwall.control.admission.held_room``)
    on a count of that depth (messages at ``body`` bytes each, rounded up as the trip
    counts them), the step's drain credited, the smaller of its bytes and its messages;
    ``share``: a fleet member's part of it (``fleet.ShareRule``). The replay's ledger has
    nothing in flight, so that room is the allowance less what the count holds."""
    counted = Depth(round(depth), math.ceil(depth / body))
    room_bytes, room_messages = held_room(policy, counted, drained / body, body, share)
    return max(0.0, min(math.inf if room_bytes is None else room_bytes,
                        math.inf if room_messages is None else room_messages * body))


class _Replay:
    """The state of one queue under one policy while its timeline plays."""

    def __init__(self, t: Timeline, policy: Policy | None) -> None:
        self.t = t
        self.key = (t.vhost, t.queue)
        self.fixed = policy
        self.depth = 0.0
        self.tripped = False
        self.held: deque[list[float]] = deque()  # [bytes, enqueued at]
        self.held_total = 0.0
        self.waited = 0.0  # byte-seconds of the bytes held and admitted
        self.admitted_held = 0.0
        self.out = Outcome()
        self.spool: _Spool | None = None
        self.rejected_bytes = 0.0
        self.expired_bytes = 0.0
        self.admitted = 0.0
        self.fleet = _Fleet(t.sidecars) if len(t.sidecars) > 1 else None
        self.parts: tuple[tuple[str, float], ...] = ()  # a fleet's, of the bucket playing
        self.drain_estimate: float | None = None  # the recorded one, of the bucket playing
        self.ingress = 0.0  # bytes/s offered over the RATE_WINDOW to the bucket's end
        self.load = _BucketLoad()
        self.wait: float | None = None  # the deadline of the newest step's policy

    # -- one step --------------------------------------------------------------------
    def step(self, policy: Policy | None, now: float, h: float, o: float, d: float) -> None:
        """``h`` seconds from ``now``: ``o`` bytes offered, ``d`` the consumers can take."""
        if policy is None or not policy.is_limited:
            self._into_queue(o, d)
            self.load.free += o
            self.tripped = False
            self.out.held_byte_seconds += self.held_total * h
            self._watch(None)
            return
        queues = {self.key: _Policed(policy)}
        spool = self._spool_for(policy)
        o, d = self._before_trip(policy, h, o, d)
        if o > 0 or self.held or (spool is not None and spool.bytes > 0):
            self._tripped_step(policy, now, h, o, d, spool, queues)
        self._into_queue(0.0, d)
        self._expire(now + h, queues)
        self._decide(policy)
        if self.tripped:
            self.out.tripped_seconds += h
        self.out.held_byte_seconds += self.held_total * h
        if spool is not None:
            self.out.spooled_bytes_max = max(self.out.spooled_bytes_max, round(spool.bytes))
        self._watch(policy)

    def _before_trip(self, policy: Policy, h: float, o: float, d: float
                     ) -> tuple[float, float]:
        """An untripped queue takes the offered load, up to the publish that trips it; the
        load and drain left for the rest of the step."""
        if self.tripped:
            return o, d
        if policy.capacity > 0 and o > 0:
            # Publishes go until one takes the queue over its capacity: it trips then. The
            # proxy's estimate counts what it forwarded within the in-flight margin before a
            # count on top of the count (floodwall.control.depth): at least MIN_MARGIN of
            # the offered load. A fleet trips when the first member passes its share.
            lead = o / h * MIN_MARGIN
            room = policy.capacity - self.depth + d - lead
            limit = max(0.0, room)
            over_share = False
            if self.fleet is not None and self.parts:
                first = self._first_over_share(policy, room, o / h)
                if first < limit:
                    limit, over_share = first, True
            passed = min(o, limit + self.t.body)
            self._into_queue(passed, d * passed / o)
            self.load.free += passed
            d -= d * passed / o
            self._decide(policy, lead, over_share and passed < o)
            return o - passed, d
        self._into_queue(o, d)
        self.load.free += o
        self._decide(policy)
        return 0.0, 0.0

    def calm(self, policy: Policy | None, o: float, seconds: float) -> bool:
        """Whether a bucket offering ``o`` bytes over ``seconds`` can play in one step:
        nothing held or spooled, not tripped, its whole load under every limit and, in a
        fleet, no member past its share of the room with it (a fleet trips below its
        limits)."""
        if policy is None:
            return True
        if self.tripped or self.held or (self.spool is not None and self.spool.bytes > 0) \
                or not _far_below(policy, self.depth + o, self.t.body):
            return False
        if self.fleet is None or not self.parts or policy.capacity <= 0 or o <= 0:
            return True
        room = policy.capacity - self.depth - o / seconds * MIN_MARGIN
        return self._first_over_share(policy, room, o / seconds) >= o

    def _reserve(self, policy: Policy, drain_rate: float) -> tuple[float, float]:
        """(room, ``R0``) in bytes: what the queue has below its nearest limit, and the room
        a fleet keeps there (``floodwall.control.fleet_rate.room_and_target``) for a drain
        estimate of ``drain_rate`` bytes/s."""
        body = self.t.body
        counted = Depth(round(self.depth), math.ceil(self.depth / body))
        room = room_and_target(policy, counted, body, drain_rate / body)
        return (math.inf, 0.0) if room is None else (room[0] * body, room[1] * body)

    def _first_over_share(self, policy: Policy, room: float, rate: float) -> float:
        """A fleet: the bytes of the step's load (offered at ``rate`` bytes/s) forwarded
        when the first member passes its share of ``room`` beyond the fleet's room target:
        each member's ``ShareRule.share`` of it (``fleet.fleet_shares`` on the demands the
        members announce), as ``fleet_rate.trip_share`` trips a member at a count. The
        shares of one room are computed once for all members. A member of a hot queue has
        also forwarded, on top of the step's load, its part of the load since the count it
        runs on (``HOT_INTERVAL`` old at most) and within its in-flight margin
        (``MIN_MARGIN``); a cold member's counts are ``DEPTH_INTERVAL`` apart, and what it
        forwarded since the last depends on when they fell, which the telemetry cannot
        tell: the step's load alone (it may trip lower). ``R0`` is of the drain the proxy
        estimates then: a queue its ingress (over ``schedule.RATE_WINDOW``) takes to its
        capacity within a slow count (``floodwall.control.schedule``: hot) is counted back
        to back (``_hot_estimate``); a cold one is counted every ``DEPTH_INTERVAL`` and its
        estimate lags (after an idle spell it is near 0, so ``R0`` is too): the estimate
        the sidecars recorded then."""
        assert self.fleet is not None
        estimate = self.drain_estimate
        hot = policy.capacity > 0 \
            and self.depth + self.ingress * DEPTH_INTERVAL >= policy.capacity
        beyond = room - self._reserve(
            policy, self._hot_estimate() if hot or estimate is None else estimate)[1]
        if beyond <= 0:
            return 0.0
        since = HOT_INTERVAL + MIN_MARGIN if hot else 0.0
        shares = fleet_shares(beyond, self.fleet.demands())
        return min((max(0.0, shares.get(name, 0.0) - f * rate * since) / f
                    for name, f in self.parts if f > 0), default=math.inf)

    def _hot_estimate(self) -> float:
        """The drain (bytes/s) the proxy estimates for a queue it counts back to back:
        what the sidecars estimated while their queue was held, which is what their feed
        and ``R0`` ran on (a fleet member's estimate errs high by what it takes the
        others to forward, and the queue is held higher than the consumers' take would
        hold it); the consumers' take where the record never held the queue."""
        held = self.t.held_estimate
        return held if held is not None else self.t.drain_rate

    def _fleet_feed(self, policy: Policy, h: float) -> float:
        """A fleet: the bytes its members' rate buckets admit over ``h`` seconds, all shares
        together (``floodwall.control.fleet_rate``: the drain, corrected towards the room
        target), on the drain a held queue's counts estimate (``_hot_estimate``)."""
        d = self._hot_estimate()
        room, reserve = self._reserve(policy, d)
        return feed(d, room, reserve) * h if math.isfinite(room) else math.inf

    def _tripped_step(self, policy: Policy, now: float, h: float, o: float, d: float,
                      spool: _Spool | None, queues: dict[Any, _Policed]) -> None:
        """What ``decide`` makes of the load offered to a tripped queue, admission of the
        held publishes, and the spool's replay once released."""
        blocking = frozenset({self.key}) if self.tripped else frozenset()
        shadow = self.tripped and not policy.enforced
        verdict = verdict_of(self.key[0], frozenset({self.key[1]}),
                             frozenset() if shadow else blocking, queues,
                             cast(SpoolPort | None, spool)).verdict
        if o > 0:
            if verdict is Verdict.HOLD:
                self.held.append([o, now])
                self.held_total += o
                self.load.held += o
                self.load.held_at += o * now
            elif verdict is Verdict.REJECT:
                self.rejected_bytes += o
            elif verdict is Verdict.SPOOL and spool is not None:
                spool.bytes += o
            else:
                self._into_queue(o, 0.0)
                if self.tripped:
                    self.admitted += o
                    self.load.passed += o
                else:
                    self.load.free += o
        room = admission_room(policy, self.depth, d, self.t.body)
        if self.tripped and self.held:
            if self.fleet is not None:
                room = min(room, self._fleet_feed(policy, h))
            room -= self._admit(room, now + h)
        if not self.tripped and spool is not None and spool.bytes > 0:
            replayed = min(spool.bytes, room)
            spool.bytes -= replayed
            self._into_queue(replayed, 0.0)
            self.load.free += replayed

    def _spool_for(self, policy: Policy) -> _Spool | None:
        if policy.effective_overflow(self.t.spooling or self.fixed is not None) \
                is not Overflow.SPOOL:
            return self.spool if self.spool is not None and self.spool.bytes > 0 else None
        if self.spool is None:
            self.spool = _Spool(self.key, policy.spool.max_bytes)
        return self.spool

    def _into_queue(self, arrived: float, d: float) -> None:
        self.depth = max(0.0, self.depth + arrived - d)

    def _watch(self, policy: Policy | None) -> None:
        """The depth figures, at the end of a step (as the telemetry samples it)."""
        depth = round(self.depth)
        self.out.depth_max = max(self.out.depth_max, depth)
        if policy is not None and policy.capacity > 0:
            self.out.peak_overshoot = max(self.out.peak_overshoot, depth - policy.capacity)

    def _admit(self, room: float, now: float) -> float:
        """Held publishes into ``room`` bytes, oldest first; what went."""
        went = 0.0
        while self.held and room - went > 0:
            chunk = self.held[0]
            take = min(chunk[0], room - went)
            chunk[0] -= take
            went += take
            self.waited += take * (now - chunk[1])
            self.out.wait_max_seconds = max(self.out.wait_max_seconds, now - chunk[1])
            if chunk[0] <= 1e-9:
                self.held.popleft()
        # a running total (summing a held queue's chunks, thousands, at every step was
        # most of the replay's time)
        self.held_total = self.held_total - went if self.held else 0.0
        self.admitted_held += went
        self.admitted += went
        self.load.admitted += went
        self.load.admitted_at += went * now
        self._into_queue(went, 0.0)
        return went

    def _expire(self, now: float, queues: dict[Any, _Policed]) -> None:
        if not self.held:
            return
        wait = self.wait = deadline_of(queues, [self.key])
        while self.held and now - self.held[0][1] > wait:
            chunk = self.held.popleft()
            self.expired_bytes += chunk[0]
            self.held_total = self.held_total - chunk[0] if self.held else 0.0

    def _decide(self, policy: Policy, lead: float = 0.0, over_share: bool = False) -> None:
        """Trip or release on the depth (and ``lead``: what the estimate counts on top); a
        fleet member ``over_share`` trips its queue though the depth may not."""
        depth = round(self.depth + lead)
        now = should_trip(policy, depth, math.ceil(self.depth / self.t.body),
                          self.tripped) or (over_share and not self.tripped)
        # Held publishers that use every token they are offered keep their queue held
        # (Admission.busy): a release would let their backlog go at once.
        if now != self.tripped and (now or not self.held):
            self.tripped = now
            if now:
                self.out.trips += 1

    def end_bucket(self, parts: tuple[tuple[str, float], ...], end: float,
                   seconds: float) -> None:
        """A bucket played: a fleet's sidecars settle their parts of it."""
        if self.fleet is not None and parts:
            self.fleet.settle(parts, self.load, end, seconds, self.wait)
        self.load = _BucketLoad()

    def finish(self) -> Outcome:
        """The outcome, once every bucket has played."""
        out, t = self.out, self.t
        out.admitted_bytes = round(self.admitted)
        # publishes, at the mean body size (summed in bytes: a step's part of one rounds to 0)
        out.rejects = round(self.rejected_bytes / t.body)
        out.deadline_expiries = round(self.expired_bytes / t.body)
        if self.admitted_held > 0:
            out.wait_mean_seconds = self.waited / self.admitted_held
        if self.fleet is not None:
            self.fleet.outcome(out, t.body)
        return out


def replay(t: Timeline, policy: Policy | None = None) -> Outcome:
    """``t`` played through ``policy`` (None: through the policy recorded in each bucket)."""
    r = _Replay(t, policy)
    step_ms = round(t.step * 1000)
    if t.buckets:
        # The depth before the first bucket: its recorded depth at its end less what came
        # in and went out during it, so the first bucket's replay ends where the record does.
        r.depth = max(0.0, (t.buckets[0].depth_bytes or 0) - t.offered[0] + t.drain[0])
    recent: deque[tuple[float, float]] = deque()  # (bucket end, bytes offered)
    before = 0.0  # the bytes/s offered over the bucket before
    for b, o, d, n, parts in zip(t.buckets, t.offered, t.drain, t.spans, t.parts,
                                 strict=True):
        end = (b.index + 1) * t.step
        recent.append((end, o))
        while recent[0][0] <= end - RATE_WINDOW:
            recent.popleft()
        p = policy if policy is not None else (b.policy.policy() if b.policy else None)
        start = (b.index - n + 1) * t.step
        r.parts = parts
        r.drain_estimate = b.drain_estimate
        r.ingress = sum(x for _, x in recent) / RATE_WINDOW
        steps = n if r.calm(p, o, t.step * n) else SUBSTEPS * n
        h = t.step * n / steps
        for i, load in enumerate(_spread(o, before * h, steps)):
            r.step(p, start + i * h, h, load, d / steps)
        before = o / (t.step * n)
        r.end_bucket(parts, end, t.step * n)
        r.out.depth.append(((b.index + 1) * step_ms, round(r.depth)))
    return r.finish()


def _spread(o: float, step_before: float, steps: int) -> list[float]:
    """A bucket's offered bytes ``o`` over its ``steps`` steps: evenly, or, when it
    offered less than the bucket before it did in as long (``step_before`` bytes a step),
    at the rate before until ``o`` runs out: a burst that ends inside a bucket ends at
    its own rate, not spread thin over the bucket (which would hold its peak and what a
    fleet member forwards between two counts below what they were)."""
    even = o / steps
    if step_before <= even:
        return [even] * steps
    loads = []
    left = o
    for _ in range(steps):
        take = min(left, step_before)
        loads.append(take)
        left -= take
    return loads


def _far_below(p: Policy, depth: float, body: float) -> bool:
    """Whether ``depth`` bytes stay under every limit of ``p``, so a bucket needs no parts."""
    if p.capacity > 0 and depth > p.capacity:
        return False
    return p.max_messages is None or depth / body <= p.max_messages


# -- on the executors -----------------------------------------------------------------
#: The columns of a bucket row (pipeline/whatif.py, ``series``), in ``Bucket``'s terms.
ROW_FIELDS = ("vhost", "queue", "b", "offered", "offered_m", "fb", "fm", "held_end",
              "depth", "depth_msgs", "rejects", "expiries", "tripped", "sidecars", "pol",
              "spool_end", "member_names", "member_offered", "drain_est")


def keyed(row: Any) -> tuple[tuple[str, str], Any]:
    """A bucket row keyed by its queue (``RDD.groupByKey``)."""
    return (row["vhost"], row["queue"]), row


def bucket_of(row: Any) -> Bucket:
    pol = row["pol"]
    recorded = None if pol is None or pol["policy"] is None else RecordedPolicy(
        pol["policy"], pol["capacity"] or 0, pol["resume"] or 0, pol["max_messages"] or 0,
        pol["resume_messages"] or 0, pol["overflow"] or "hold",
        pol["deadline"] if pol["deadline"] is not None else 30.0, pol["mode"] or "enforce")
    return Bucket(row["b"], row["offered"] or 0, row["offered_m"] or 0, row["fb"] or 0,
                  row["fm"] or 0, row["held_end"] or 0, row["depth"], row["depth_msgs"],
                  row["rejects"] or 0, row["expiries"] or 0, bool(row["tripped"]),
                  row["sidecars"] or 0, recorded, row["spool_end"] or 0,
                  tuple(zip(row["member_names"] or (), row["member_offered"] or (), strict=True)),
                  row["drain_est"])


def replay_group(item: tuple[tuple[str, str], Any], step: float,
                 candidates: tuple[str, ...]) -> dict[str, Any]:
    """One queue's bucket rows replayed under the recorded policy and each candidate
    (policy files' text, ``parse_policies``): a plain dict the driver collects. A
    candidate whose policies do not match the queue gives None."""
    from floodwall.control.policy import parse_policies

    (vhost, queue), rows = item
    t = timeline(vhost, queue, step, [bucket_of(r) for r in rows])
    recorded = replay(t)
    out: dict[str, Any] = {
        "vhost": vhost, "queue": queue, "step": step, "gap_seconds": round(t.gap_seconds, 3),
        "held_share": round(t.held_share, 4), "body": round(t.body, 1),
        "sidecars_max": max((b.sidecars for b in t.buckets), default=0),
        "policy": _newest_policy(t), "replayed_recorded": recorded.figures(),
        "recorded_depth": [((b.index + 1) * round(step * 1000), b.depth_bytes)
                           for b in t.buckets],
        "replayed_depth": recorded.depth, "candidates": []}
    for text in candidates:
        policy = parse_policies(text).for_queue(vhost, queue)
        if policy is None:
            out["candidates"].append(None)
            continue
        o = replay(t, policy)
        out["candidates"].append({"policy": policy.name, "predicted": o.figures(),
                                  "depth": o.depth})
    return out


def _newest_policy(t: Timeline) -> str | None:
    names = [b.policy.name for b in t.buckets if b.policy is not None]
    return names[-1] if names else None
