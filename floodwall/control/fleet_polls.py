"""What one member polls for the whole fleet besides queue samples: the
broker's node alarms and a vhost's topology.

- *Node alarms*: the fleet's alarm poller (``FleetTable.alarm_poller``) asks the management
  API every ``alarm_interval`` and announces the answer (``SharedAlarms``); the others take
  it while it is fresh (``fresh``) and ask the API themselves otherwise.
- *Depth counts* (item 2): each active member counts a hot queue itself, every ``A x h``
  rather than every ``h`` (``fleet_count_interval``, ``A`` the members that police it with
  a demand), an idle one at the slow interval, so the fleet passive-declares a hot queue
  about ``1 / h`` times a second whatever its size, as one sidecar does. Shared through the
  fanout instead, each count would cost the broker one publish and N deliveries
  (measured: a passive declare ~120 us of broker CPU, a publish ~17 us, a delivery
  ~19 us: bench/broker_costs.py), N x 19 us more per count as the fleet grows, and reach
  the others a delivery late.
- *Topology*: a vhost's topology poller (``FleetTable.topology_poller``) runs its full syncs
  as one sidecar does and announces a digest of its routing model of the vhost
  (``topology_digests``) with the age of its last good sync (``SharedTopology``). Every
  other member keeps its model by the broker's topology events (and lookups) as before,
  compares its own digest with the poller's, and skips its periodic sync while they agree
  (``DigestWatch``). A digest that differs for longer than ``grace`` (changes in flight on
  one side) asks for one sync at once, once per difference and at most one per sync
  interval (``sync_spacing``); one that still differs after
  it, or a poller that is silent, stale or unheard, leaves the member to its own periodic
  syncs. Digests, not listings, travel: a listing is as big as the broker's topology and
  would be delivered to all N members; a digest is 16 characters.

Pure: every entry point takes ``now``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from floodwall.control.fleet import ShareRule
from floodwall.control.routing import Topology

#: Characters of a topology digest (64 bits: two different models agree by chance with
#: probability 2^-64).
DIGEST_CHARS = 16


def topology_digests(items: Iterable[tuple[object, ...]]) -> dict[str, str]:
    """Per vhost, a digest of the routing model's items of it (``Topology.items``: its
    queues, exchanges and bindings as comparable tuples, each with the vhost as its second
    field): equal models of a vhost give equal digests."""
    per: dict[str, list[str]] = defaultdict(list)
    for item in items:
        per[str(item[1])].append(repr(item))
    out: dict[str, str] = {}
    for vhost, reprs in per.items():
        h = hashlib.blake2b(digest_size=DIGEST_CHARS // 2)
        for r in sorted(reprs):
            h.update(r.encode())
            h.update(b"\0")
        out[vhost] = h.hexdigest()
    return out


@dataclass
class TopologyDigests:
    """The digests of one ``Topology``, computed again only when it changed (its
    ``generation``)."""

    topology: Topology
    _generation: int = -1
    _digests: dict[str, str] = field(default_factory=dict)
    computed: int = 0

    def of(self, vhost: str) -> str:
        if self.topology.generation != self._generation:
            self._digests = topology_digests(self.topology.items())
            self._generation = self.topology.generation
            self.computed += 1
        return self._digests.get(vhost, "")


def fresh(heard_at: float, age: float | None, now: float, stale_after: float) -> bool:
    """Whether a shared figure asked for ``age`` seconds before an announcement that
    arrived at ``heard_at`` is at most ``stale_after`` old now."""
    return age is not None and now - heard_at + age <= stale_after


@dataclass(frozen=True, slots=True)
class DigestVerdict:
    covered: bool  # the poller's syncs stand for this member's on the vhost
    sync_now: bool  # ask for one sync at once (a difference outlived the grace)


@dataclass
class DigestWatch:
    """This member's digest of each vhost against its topology poller's."""

    grace: float
    _since: dict[str, float] = field(default_factory=dict)  # vhost -> differs since
    _asked: set[str] = field(default_factory=set)  # vhosts whose difference asked a sync
    differences: int = 0  # differences that outlived the grace

    def compare(self, vhost: str, mine: str, theirs: str | None, now: float) -> DigestVerdict:
        """``theirs`` None: no fresh word from another poller (it is this member, silent,
        or its sync is stale): not covered, and the difference forgotten."""
        if theirs is None:
            self._since.pop(vhost, None)
            self._asked.discard(vhost)
            return DigestVerdict(False, False)
        if mine == theirs:
            self._since.pop(vhost, None)
            self._asked.discard(vhost)
            return DigestVerdict(True, False)
        since = self._since.setdefault(vhost, now)
        if now - since <= self.grace:
            return DigestVerdict(True, False)
        if vhost in self._asked:
            return DigestVerdict(False, False)
        self._asked.add(vhost)
        self.differences += 1
        return DigestVerdict(False, True)

    def later(self, vhost: str) -> None:
        """The sync ``compare`` asked for could not be run now (too soon after the last):
        ask again at a later comparison."""
        if vhost in self._asked:
            self._asked.discard(vhost)
            self.differences -= 1

    def forget(self, vhosts: Iterable[str]) -> None:
        """Keep only ``vhosts``."""
        keep = set(vhosts)
        for vhost in self._since.keys() - keep:
            del self._since[vhost]
        self._asked &= keep


def fleet_count_interval(hot: float, share: ShareRule | None, slow: float) -> float:
    """How often this member counts a hot queue itself: ``hot`` alone (no share rule, or
    the only member); ``A x hot`` with ``A`` active members (the rule's demands: those with
    a demand, or none measured yet), so the active ones count it about once per ``hot``
    together (docs/design/fleet.md, "The bound": the bound with the stagger ``W``
    up to ``A x hot``); ``slow`` for a member that forwards and holds nothing for it (demand
    0: its counts are of no use until it publishes, and then its demand makes it active at
    the next fleet tick)."""
    if share is None:
        return hot
    active = 0
    for member, demand in share.demands:
        if demand is None or demand > 0:
            active += 1
        elif member == share.me:
            return max(hot, slow)
    return hot * max(1, active)
