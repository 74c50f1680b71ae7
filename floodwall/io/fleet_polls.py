"""The node alarms and the topology polled by one member for the fleet (``FleetPolls``, owned
by ``floodwall.io.fleet.FleetService``; the rules: ``floodwall.control.fleet_polls``).

Alarms: the fleet's alarm poller announces its last answer from the management API with
each announcement (and announces at once when it changes); the others feed it
(``feed_shared_alarms``) and skip their own alarm polls while it is fresh
(``alarms_covered``). Topology: each vhost's topology poller announces a digest of its
model of the vhost and the age of its last good sync; the others compare digests at each
tick (``check_topology``) and skip their periodic syncs while every vhost they announce on
is covered (``topology_covered``). A poller that dies, falls silent or whose figures age
past their limit is replaced by the next one (rendezvous hashing over the members that
speak) or, while none has a fresh figure, each member polls itself; deaf, a member polls
everything itself, as one sidecar does."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from floodwall.control.fleet import Announcement, FleetTable, SharedAlarms, SharedTopology
from floodwall.control.fleet_polls import DigestWatch, TopologyDigests, fresh
from floodwall.control.routing import Topology


class PollsHost(Protocol):
    """What the fleet's polls need of the flow supervisor."""

    topology: Topology

    def feed_shared_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """The fleet's alarm poller's answer: as good as one of this sidecar's own."""

    def topology_sync_age(self) -> float | None:
        """Seconds since this sidecar's last good full sync (None: none yet)."""

    def request_topology_sync(self, why: str) -> None:
        """Run a full sync of the topology now."""


class FleetPolls:
    """This member's side of the shared alarm and topology polls."""

    def __init__(self, table: FleetTable, host: PollsHost, clock: Callable[[], float], *,
                 alarm_stale_after: float, topology_stale_after: float,
                 sync_grace: float, sync_spacing: float) -> None:
        self.table = table
        self.host = host
        self.clock = clock
        self.alarm_stale_after = alarm_stale_after
        self.topology_stale_after = topology_stale_after
        self.sync_spacing = sync_spacing  # a digest asks a sync at most once per this
        self.digests = TopologyDigests(host.topology)
        self.watch = DigestWatch(sync_grace)
        self._alarms: tuple[tuple[str, ...], tuple[str, ...], float] | None = None
        self._alarm_sid = 0
        self._alarms_fed: tuple[str, int] | None = None  # (member, sid) last fed
        self._covered: dict[str, bool] = {}  # vhost -> the poller's syncs stand for ours
        self.alarms_fed = 0
        self.syncs_asked = 0

    # -- node alarms -----------------------------------------------------------------
    def own_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...], taken_at: float
                   ) -> bool:
        """This sidecar's answer from the API; True when it is the fleet's alarm poller and
        the answer changed (the service then announces at once)."""
        changed = self._alarms is None or self._alarms[:2] != (memory, disk)
        self._alarm_sid += 1
        self._alarms = (memory, disk, taken_at)
        return changed and self.table.alarm_poller(self.clock()) == self.table.me

    def announced_alarms(self, now: float) -> SharedAlarms | None:
        """What this sidecar announces of the alarms: its last answer, while it polls them
        for the fleet."""
        if self._alarms is None or self.table.alarm_poller(now) != self.table.me:
            return None
        memory, disk, taken_at = self._alarms
        return SharedAlarms(memory, disk, max(0.0, now - taken_at), self._alarm_sid)

    def alarms_covered(self) -> bool:
        """Whether the fleet's alarm poller is another member whose last answer is fresh
        (``alarm_stale_after``): this sidecar need not ask the API itself."""
        now = self.clock()
        poller = self.table.alarm_poller(now)
        if poller == self.table.me:
            return False
        shared = self.table.shared_alarms(poller, now)
        return shared is not None and fresh(shared[1], shared[0].age, now,
                                            self.alarm_stale_after)

    def feed(self, a: Announcement, now: float) -> None:
        """An announcement of another member: its alarms fed if it is the alarm poller and
        they are new."""
        al = a.alarms
        if al is None or a.member == self.table.me \
                or self._alarms_fed == (a.member, al.sid) \
                or self.table.alarm_poller(now) != a.member:
            return
        self._alarms_fed = (a.member, al.sid)
        self.alarms_fed += 1
        self.host.feed_shared_alarms(al.memory, al.disk)

    # -- topology --------------------------------------------------------------------
    def announced_topology(self, vhost: str, now: float) -> SharedTopology | None:
        """What this sidecar announces of its model of ``vhost``: while it is its topology
        poller, the digest and its last sync's age."""
        if self.table.topology_poller(vhost, now) != self.table.me:
            return None
        return SharedTopology(self.digests.of(vhost), self.host.topology_sync_age())

    def check_topology(self, vhosts: Iterable[str], now: float) -> None:
        """Compare this sidecar's digest of each vhost with its poller's (at each tick)."""
        wanted = set(vhosts)
        self.watch.forget(wanted)
        self._covered = {}
        for vhost in sorted(wanted):
            poller = self.table.topology_poller(vhost, now)
            shared = (None if poller == self.table.me
                      else self.table.shared_topology(vhost, poller, now))
            theirs = (shared[0].digest if shared is not None
                      and fresh(shared[1], shared[0].sync_age, now, self.topology_stale_after)
                      else None)
            mine = self.digests.of(vhost) if theirs is not None else ""
            verdict = self.watch.compare(vhost, mine, theirs, now)
            self._covered[vhost] = verdict.covered
            age = self.host.topology_sync_age()
            if verdict.sync_now and age is not None and age < self.sync_spacing:
                self.watch.later(vhost)  # its own last sync is recent: not again yet
            elif verdict.sync_now:
                self.syncs_asked += 1
                self.host.request_topology_sync(
                    f"the routing model of vhost {vhost} differs from the fleet's topology "
                    f"poller's ({poller})")

    def topology_covered(self) -> bool:
        """Whether this sidecar may skip its periodic sync: on every vhost it announces on,
        another member's sync stands for it (as of the last tick)."""
        return bool(self._covered) and all(self._covered.values())

    def state(self, now: float, vhosts: Iterable[str]) -> dict[str, object]:
        return {
            "alarm_poller": self.table.alarm_poller(now),
            "alarms_covered": self.alarms_covered(),
            "alarms_fed": self.alarms_fed,
            "topology_pollers": {v: self.table.topology_poller(v, now) for v in sorted(vhosts)},
            "topology_covered": dict(sorted(self._covered.items())),
            "topology_digest_differences": self.watch.differences,
            "topology_syncs_asked": self.syncs_asked,
        }
