"""The fleet service's decisions without a broker (floodwall/io/fleet.py): what it does with an
announcement it hears, which queues the fleet's poller spares it, what it announces."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.fleet import (
    ALARMS_KEY,
    TOPOLOGY_QUEUE,
    Announcement,
    QueueReport,
    SharedAlarms,
    SharedSample,
    SharedTopology,
    encode,
    member_queue,
    poller_of,
)
from floodwall.control.fleet_polls import topology_digests
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from floodwall.enforce.shared import Enforcement
from floodwall.io.amqp_client import AmqpClient, Delivery, QueueCounts, QueueLocked
from floodwall.io.fleet import FleetService, FleetSettings, member_id
from tests.fakes import Clock

POLICIES = parse_policies("""
version: 1
policies:
  - {name: orders, match: {vhost: "/", queue: "orders.*"}, capacity: 10000}
""")


class Router:
    generation = 0

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset({routing_key})

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


class Host:
    """What the fleet needs of the supervisor: the controller, and where shared samples go."""

    def __init__(self) -> None:
        self.controller = FlowController(Router(), POLICIES)
        self.enforcement = Enforcement(self.controller)
        self.fed: list[tuple[QueueKey, ManagementSample]] = []
        self.topology = Topology()
        self.alarms: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self.sync_age: float | None = 3.0
        self.syncs_asked: list[str] = []

    def new_client(self, vhost: str) -> AmqpClient:
        raise AssertionError("no connections in these tests")

    def feed_shared_management(self, key: QueueKey, sample: ManagementSample) -> None:
        self.fed.append((key, sample))

    def feed_shared_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        self.alarms.append((memory, disk))

    def topology_sync_age(self) -> float | None:
        return self.sync_age

    def request_topology_sync(self, why: str) -> None:
        self.syncs_asked.append(why)


def _delivery(a: Announcement) -> Delivery:
    return Delivery("floodwall.fleet.t", "", None, encode(a))


def _service(me: str) -> tuple[FleetService, Host, Clock]:
    host, clock = Host(), Clock(100.0)
    svc = FleetService(FleetSettings("t", member=me, sample_stale_after=15.0,
                                     alarm_stale_after=9.0, topology_stale_after=65.0,
                                     sync_grace=2.0, sync_spacing=30.0), host, clock)
    svc.table.expect(["/"])
    return svc, host, clock


def _keys_polled_by(member: str, members: list[str], n: int = 50) -> list[QueueKey]:
    return [k for k in (("/", f"orders.{i}") for i in range(n))
            if poller_of(k, members) == member]


def test_member_ids_are_unique_and_safe_in_a_queue_name() -> None:
    a, b = member_id("pod/\u00e9 1"), member_id("pod/\u00e9 1")
    assert a != b and a.startswith("pod___1-")


def test_a_pollers_sample_is_fed_once_and_spares_asking_while_fresh() -> None:
    svc, host, clock = _service("me")
    key = _keys_polled_by("b", ["me", "b"])[0]
    host.controller.queue_seen(key, clock.t)
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))  # hears itself
    assert not svc.covered(key)  # b is not heard yet: poll it oneself
    shared = SharedSample(3, 0, 300, 300, 0, True, 0.5, 7)
    report: dict[str, Any] = {key[1]: QueueReport(0.0, 0, 0.0, None, None, shared)}
    svc._on_message(_delivery(Announcement("b", 1.0, 1, "/", report)))
    svc._on_message(_delivery(Announcement("b", 1.0, 2, "/", report)))  # same sample again
    assert host.fed == [(key, ManagementSample(99.5, 3, 0, 300, 300, 0))]
    assert svc.covered(key)
    clock.t += 14.0
    svc._on_message(_delivery(Announcement("me", 1.0, 2, "/", {})))
    older = SharedSample(3, 0, 300, 300, 0, True, 14.5, 7)  # the same sample, re-announced
    svc._on_message(_delivery(Announcement("b", 1.0, 3, "/", {
        key[1]: QueueReport(0.0, 0, 0.0, None, None, older)})))
    assert len(host.fed) == 1
    clock.t += 1.0
    assert not svc.covered(key)  # 15.5 s old: ask the API again


def test_the_queues_this_sidecar_polls_carry_its_samples() -> None:
    svc, host, clock = _service("me")
    mine_key = _keys_polled_by("me", ["me", "b"])[0]
    theirs = _keys_polled_by("b", ["me", "b"])[0]
    for key in (mine_key, theirs):
        host.controller.queue_seen(key, clock.t)
        svc.own_sample(key, ManagementSample(clock.t - 1.0, 1, 0, 100, 100, 0))
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    both = {k[1]: QueueReport(0.0, 0, 0.0) for k in (mine_key, theirs)}
    svc._on_message(_delivery(Announcement("b", 1.0, 1, "/", both)))
    reports = {k: QueueReport(0.0, 0, None) for k in (mine_key, theirs)}
    out = svc._with_samples(reports, clock.t)
    m = out[mine_key].management
    assert m is not None and m.age == 1.0 and m.messages_ready == 1
    assert out[theirs].management is None


def test_undecodable_announcements_are_counted_not_raised() -> None:
    svc, _, _ = _service("me")
    svc._on_message(Delivery("x", "", None, b"{not json"))
    assert svc.counters.undecodable == 1 and svc.table.ignored_total == 1


class CheckClient:
    """The fleet connection's passive declare of a silent member's queue: it is there
    (another connection's exclusive queue: 405) or gone (404: None)."""

    def __init__(self, there: bool) -> None:
        self.there = there
        self.asked: list[str] = []

    async def queue_counts(self, queue: str, timeout: float = 5.0,
                           lane: str = "probe") -> QueueCounts | None:
        self.asked.append(queue)
        if self.there:
            raise QueueLocked(f"queue.declare {queue!r}: 405 RESOURCE_LOCKED")
        return None


def _silent_b(there: bool) -> tuple[FleetService, CheckClient]:
    """b heard once, then unheard for 3 s while this sidecar hears itself: b is silent; the
    service checks its queue on the broker."""
    async def run() -> tuple[FleetService, CheckClient]:
        svc, _, clock = _service("me")
        client = CheckClient(there)
        svc._live["/"] = (cast(AmqpClient, client), 1)
        svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
        svc._on_message(_delivery(Announcement("b", 1.0, 1, "/", {})))
        for seq, dt in enumerate([1.0, 1.0, 1.0], start=2):
            clock.t += dt
            svc._on_message(_delivery(Announcement("me", 1.0, seq, "/", {})))
        assert svc.table.silent_members(clock.t) == {"b": 100.0}
        svc._check_silent(clock.t)
        svc._check_silent(clock.t)  # once per timeout, not per tick
        await asyncio.gather(*svc._tasks)
        return svc, client

    return asyncio.run(run())


def test_a_silent_member_whose_queue_is_there_keeps_counting() -> None:
    svc, client = _silent_b(there=True)
    assert client.asked == [member_queue("t", "b")]
    assert svc.table.members(svc.clock()) == ["b"] and svc.table.is_silent("b")


def test_a_silent_member_whose_queue_is_gone_leaves(caplog: pytest.LogCaptureFixture
                                                     ) -> None:
    caplog.set_level(logging.INFO, "floodwall.fleet")
    svc, client = _silent_b(there=False)
    assert client.asked == [member_queue("t", "b")]
    assert svc.table.members(svc.clock()) == []
    left = [(r.__dict__["member"], r.__dict__["reason"]) for r in caplog.records
            if r.getMessage() == "fleet_member_left"]
    assert left == [("b", "queue deleted")]


def test_its_own_echo_measures_the_broker_round_trip() -> None:
    svc, _, clock = _service("me")
    svc._published[7] = clock.t
    clock.t += 0.25
    svc._on_message(_delivery(Announcement("me", 1.0, 7, "/", {})))
    assert svc.counters.echo_delay_last == 0.25 == svc.counters.echo_delay_max


def test_a_newly_policed_queue_has_its_share_before_its_first_figure() -> None:
    """The first fill: a queue the whole fleet begins to police at once gets its
    share rule when it is first seen, the vhost's other members counted as newcomers, not at
    the next fleet tick: its first figure (which lets publishes go) can come before that
    tick, and each member would forward the whole room."""
    svc, host, clock = _service("me")
    for member in ("me", "b", "c", "d"):
        svc._on_message(_delivery(Announcement(member, 1.0, 1, "/", {})))
    clock.t += 0.05
    q = host.controller.queue_seen(("/", "orders.new"), clock.t)
    assert q is not None and q.share is not None
    assert q.share.fraction(10_000, None, 100) == pytest.approx(0.25)
    alone, alone_host, alone_clock = _service("me")
    alone._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    q = alone_host.controller.queue_seen(("/", "orders.new"), alone_clock.t)
    assert q is not None and q.share is None  # alone and hearing the fleet: all of it


def _other_polls(key: QueueKey) -> str:
    """A member name that wins ``key``'s rendezvous over "me"."""
    return next(m for m in (f"b{i}" for i in range(100)) if poller_of(key, ["me", m]) == m)


def test_the_alarm_pollers_answer_is_fed_and_spares_asking_while_fresh() -> None:
    """Item 4: one member asks the API for node alarms for the fleet; the others feed its
    answer (once per answer) and ask themselves only when it is stale or gone."""
    svc, host, clock = _service("me")
    b = _other_polls(ALARMS_KEY)
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    assert not svc.polls.alarms_covered()  # b not heard: ask oneself
    svc.own_alarms((), ())
    assert svc.polls.announced_alarms(clock.t) is not None  # the poller, alone
    alarm = SharedAlarms(("rabbit@a",), (), 0.4, 5)
    for seq in (1, 2):  # the same answer twice: fed once
        svc._on_message(_delivery(Announcement(b, 1.0, seq, "/", {}, alarms=alarm)))
    assert host.alarms == [(("rabbit@a",), ())]
    assert svc.polls.alarms_covered()
    assert svc.polls.announced_alarms(clock.t) is None  # b polls them now, not this one
    clock.t += 8.0  # 8.4 s old: still fresh (9 s)
    svc._on_message(_delivery(Announcement("me", 1.0, 2, "/", {})))
    assert svc.polls.alarms_covered()
    clock.t += 1.0
    assert not svc.polls.alarms_covered()  # stale: ask the API again


def test_an_alarm_poller_announces_a_changed_answer_at_once() -> None:
    svc, _, clock = _service("me")
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    svc._announced["/"] = clock.t
    svc.own_alarms((), ())
    assert "/" not in svc._announced  # the first answer
    svc._announced["/"] = clock.t
    svc.own_alarms((), ())
    assert "/" in svc._announced  # unchanged: the usual cadence
    svc.own_alarms(("rabbit@a",), ())
    assert "/" not in svc._announced  # changed: announced at the next tick


def test_an_alarm_from_a_member_that_is_not_the_poller_is_not_fed() -> None:
    svc, host, _ = _service("me")
    other = next(m for m in (f"c{i}" for i in range(100))
                 if poller_of(ALARMS_KEY, ["me", m]) == "me")
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    svc._on_message(_delivery(Announcement(other, 1.0, 1, "/", {},
                                           alarms=SharedAlarms((), ("x",), 0.0, 1))))
    assert host.alarms == [] and not svc.polls.alarms_covered()


def _topology_service() -> tuple[FleetService, Host, Clock, str, str]:
    svc, host, clock = _service("me")
    b = _other_polls(("/", TOPOLOGY_QUEUE))
    host.topology.declare_queue("/", "orders.1")
    mine = topology_digests(host.topology.items())["/"]
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    return svc, host, clock, b, mine


def test_a_topology_pollers_equal_digest_spares_the_periodic_sync() -> None:
    svc, host, clock, b, mine = _topology_service()
    svc.polls.check_topology(["/"], clock.t)
    assert not svc.polls.topology_covered()  # b not heard
    svc._on_message(_delivery(Announcement(b, 1.0, 1, "/", {},
                                           topology=SharedTopology(mine, 2.0))))
    svc.polls.check_topology(["/"], clock.t)
    assert svc.polls.topology_covered()
    assert svc.polls.announced_topology("/", clock.t) is None  # b announces it, not me
    svc._on_message(_delivery(Announcement(b, 1.0, 2, "/", {},
                                           topology=SharedTopology(mine, 64.0))))
    clock.t += 1.5  # its last sync 65.5 s old: stale
    svc._on_message(_delivery(Announcement("me", 1.0, 2, "/", {})))
    svc.polls.check_topology(["/"], clock.t)
    assert not svc.polls.topology_covered() and host.syncs_asked == []


def test_a_digest_that_differs_past_the_grace_asks_one_sync() -> None:
    svc, host, clock, b, _ = _topology_service()
    host.sync_age = 40.0  # its own last sync: more than a topology interval (30 s) ago
    other = SharedTopology("0123456789abcdef", 1.0)
    for seq, dt in enumerate([0.0, 1.0, 1.5, 0.5], start=1):
        clock.t += dt
        svc._on_message(_delivery(Announcement("me", 1.0, seq + 1, "/", {})))
        svc._on_message(_delivery(Announcement(b, 1.0, seq, "/", {}, topology=other)))
        svc.polls.check_topology(["/"], clock.t)
        if seq <= 2:  # within the grace (changes in flight): still covered
            assert svc.polls.topology_covered() and host.syncs_asked == []
    assert not svc.polls.topology_covered()
    assert len(host.syncs_asked) == 1  # once per difference, then its own periodic syncs
    host.topology.declare_queue("/", "orders.2")  # its model moves to the poller's...
    same = SharedTopology(topology_digests(host.topology.items())["/"], 1.0)
    svc._on_message(_delivery(Announcement(b, 1.0, 9, "/", {}, topology=same)))
    svc.polls.check_topology(["/"], clock.t)
    assert svc.polls.topology_covered()  # ...covered again


def test_the_topology_poller_announces_its_digest_and_sync_age() -> None:
    svc, host, clock = _service("me")
    host.topology.declare_queue("/", "orders.1")
    svc._on_message(_delivery(Announcement("me", 1.0, 1, "/", {})))
    t = svc.polls.announced_topology("/", clock.t)
    assert t == SharedTopology(topology_digests(host.topology.items())["/"], 3.0)
    svc.polls.check_topology(["/"], clock.t)
    assert not svc.polls.topology_covered()  # it syncs for the fleet: never skips


def test_a_digest_asks_no_sync_within_a_topology_interval_of_the_last() -> None:
    svc, host, clock, b, _ = _topology_service()
    host.sync_age = 10.0
    other = SharedTopology("0123456789abcdef", 1.0)
    for seq in range(1, 6):
        clock.t += 1.0
        svc._on_message(_delivery(Announcement("me", 1.0, seq + 1, "/", {})))
        svc._on_message(_delivery(Announcement(b, 1.0, seq, "/", {}, topology=other)))
        svc.polls.check_topology(["/"], clock.t)
    assert host.syncs_asked == [] and not svc.polls.topology_covered()
    host.sync_age = 30.0  # now it may
    svc.polls.check_topology(["/"], clock.t)
    assert len(host.syncs_asked) == 1 and svc.polls.watch.differences == 1
