"""The topology feed (floodwall/io/topology.py) with the management API and the proxy's own
connection played by fakes: syncs never undo newer changes, differences are judged after
the grace period, events and lookups reach the model with their source."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.lookups import Lookup, LookupKind, LookupResult
from floodwall.control.policy import parse_policies
from floodwall.control.routing import ChangeKind, Topology, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.enforce.shared import Enforcement
from floodwall.io.amqp_client import Delivery, QueueCounts, QueueLocked
from floodwall.io.management import ManagementError, api_path
from floodwall.io.supervisor import FlowSettings
from floodwall.io.switchboard import Switchboard
from floodwall.io.topology import TopologyFeed
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials, ManagementCredentials
from floodwall.ops.flow_metrics import FlowStats
from tests.conftest import run

T = TypeVar("T")
POLICIES = parse_policies("""
version: 1
policies:
  - {name: orders, match: {queue: "orders.*"}, capacity: 1000}
""")


def _exchanges() -> list[dict[str, Any]]:
    return [{"name": n, "vhost": "/", "type": t, "internal": i, "durable": True,
             "auto_delete": False, "arguments": {}}
            for n, t, i in (("", "direct", False), ("amq.direct", "direct", False),
                            ("amq.fanout", "fanout", False), ("amq.headers", "headers", False),
                            ("amq.match", "headers", False),
                            ("amq.rabbitmq.trace", "topic", True),
                            ("amq.topic", "topic", False))]


class Broker:
    """What the fakes answer: the management API's listing and the AMQP side."""

    def __init__(self) -> None:
        self.exchanges = _exchanges()
        self.queues: list[dict[str, Any]] = [{"name": "orders.a", "vhost": "/"}]
        self.bindings: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self.during: dict[str, Callable[[], None]] = {}  # path prefix -> run while asked
        self.counts: dict[str, int] = {"orders.a": 3}
        self.locked: set[str] = set()
        self.management_down = False

    async def get(self, path: str) -> Any:
        self.requests.append(path)
        for prefix, action in list(self.during.items()):
            if path.startswith(prefix):
                del self.during[prefix]
                action()
        if self.management_down:
            raise ManagementError("unreachable", "down")
        await asyncio.sleep(0)
        if path.startswith("/api/exchanges?"):
            return copy.deepcopy(self.exchanges)
        if path.startswith("/api/queues?"):
            return copy.deepcopy(self.queues)
        if path == "/api/bindings":
            return copy.deepcopy(self.bindings)
        if path == "/api/policies":
            return []
        if path.startswith("/api/exchanges/%2F/"):
            rest = path[len("/api/exchanges/%2F/"):]
            name, _, tail = rest.partition("/")
            found = [x for x in self.exchanges if x["name"] == name]
            if not found:
                raise ManagementError("not_found", f"{path}: 404", 404)
            if tail == "bindings/source":
                return [b for b in self.bindings if b["source"] == name]
            return found[0]
        raise AssertionError(path)

    async def item(self, endpoint: str, vhost: str, name: str, query: str = "") -> Any:
        try:
            return await self.get(api_path(endpoint, vhost, name, query=query))
        except ManagementError as exc:
            if exc.kind == "not_found":
                return None
            raise

    async def bindings_from(self, vhost: str, exchange: str) -> Any:
        return await self.get(api_path("exchanges", vhost, exchange) + "/bindings/source")

    async def queue_sample(self, vhost: str, queue: str) -> ManagementSample | None:
        self.requests.append(f"sample {queue}")
        if queue not in self.counts:
            return None
        n = self.counts[queue]
        return ManagementSample(0.0, n, 0, n * 100, n * 100, 0)


class Client:
    """The vhost's own connection."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connected = True

    async def queue_counts(self, queue: str, timeout: float = 5.0,
                           lane: str = "probe") -> QueueCounts | None:
        if queue in self.broker.locked:
            raise QueueLocked(f"queue.declare {queue!r}: 405 RESOURCE_LOCKED")
        n = self.broker.counts.get(queue)
        return None if n is None else QueueCounts(n, 0)

    async def exchange_exists(self, exchange: str, timeout: float = 5.0,
                              lane: str = "probe") -> bool:
        return any(x["name"] == exchange for x in self.broker.exchanges)


class Policing:
    """The flow supervisor's part, recorded."""

    def __init__(self, broker: Broker, controller: FlowController,
                 now: list[float]) -> None:
        self.broker = broker
        self.controller = controller
        self.now = now
        self.applied: list[tuple[ChangeKind, str, ChangeSource]] = []
        self.listed: list[set[QueueKey]] = []
        self.counts: list[tuple[QueueKey, int]] = []
        self.samples: list[QueueKey] = []

    def topology_applied(self, change: TopologyChange, source: ChangeSource) -> None:
        self.applied.append((change.kind, change.name, source))
        if change.kind in (ChangeKind.DECLARE_QUEUE, ChangeKind.BIND_QUEUE):
            self.controller.queue_seen((change.vhost, change.name), self.now[0])

    async def queues_listed(self, listed: set[QueueKey]) -> None:
        self.listed.append(listed)

    def topology_covered(self) -> bool:
        return False  # no fleet: every periodic sync is its own

    async def client_for(self, vhost: str) -> Any:
        return Client(self.broker)

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        self.counts.append((key, ready))
        self.controller.sampled_ready_count(key, requested_at, ready, rtt, self.now[0])

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        self.samples.append(key)
        self.controller.sampled_management(key, sample, self.now[0])

    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
        return await call()


class Setup:
    def __init__(self) -> None:
        self.now = [100.0]
        self.broker = Broker()
        self.topology = Topology()
        self.controller = FlowController(self.topology, POLICIES)
        self.board = Switchboard(Enforcement(self.controller), lambda: self.now[0])
        self.settings = FlowSettings(
            policies=Path("unused.yaml"), management_urls=("http://mq:15672",),
            management_credentials=ManagementCredentials(), upstreams=Upstreams([("mq", 5672)]),
            amqp_credentials=AmqpCredentials(), sync_grace=0.05, lookup_timeout=1.0)
        self.stats = FlowStats(POLICIES)
        self.policing = Policing(self.broker, self.controller, self.now)
        self.feed = TopologyFeed(self.settings, self.topology, self.board,
                                 self.broker,  # type: ignore[arg-type]
                                 self.stats, self.policing, lambda: self.now[0])


def test_a_sync_never_undoes_a_change_that_arrived_while_it_listed() -> None:
    async def body() -> None:
        s = Setup()
        assert await s.feed.sync()
        assert s.topology.knows_queue("/", "orders.a")
        # While the bindings are being listed, an event says orders.b was declared (the
        # queue listing, already read, does not have it).
        s.broker.during["/api/bindings"] = lambda: s.feed.apply(
            TopologyChange(ChangeKind.DECLARE_QUEUE, "/", "orders.b"), ChangeSource.EVENT)
        assert await s.feed.sync()
        assert s.topology.knows_queue("/", "orders.b")
        assert s.stats.changes["event"] == 1 and s.stats.syncs["ok"] == 2
        assert s.policing.listed[-1] >= {("/", "orders.a"), ("/", "orders.b")}

    run(body)


def test_a_difference_with_events_up_is_a_warning_with_how_long(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        s = Setup()
        s.feed._events_up()  # the events were up before the first sync, and stay so
        s.now[0] = 101.0
        await s.feed.sync()
        s.broker.queues.append({"name": "orders.missed", "vhost": "/"})  # no event for it
        s.now[0] = 131.0
        await s.feed.sync()
        await asyncio.sleep(0.2)  # the grace period
        assert s.stats.sync_differences == 1
        assert s.stats.out_of_step_seconds == 30.0
        assert s.stats.changes["sync"] == 1
        await s.feed.stop()

    with caplog.at_level(logging.INFO, logger="floodwall.topology"):
        run(body)
    (line,) = [r for r in caplog.records if r.getMessage() == "topology_out_of_step"]
    assert line.levelno == logging.WARNING
    fields = line.__dict__
    assert fields["missing"] == "queue orders.missed@/" and fields["extra"] == "-"
    assert fields["out_of_step_seconds_at_most"] == 30.0


def test_a_difference_a_late_event_explains_is_not_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        s = Setup()
        s.feed._events_up()
        await s.feed.sync()
        s.broker.queues.append({"name": "orders.late", "vhost": "/"})
        await s.feed.sync()
        # Its event was emitted before the listing was read and arrives just after.
        s.feed.apply(TopologyChange(ChangeKind.DECLARE_QUEUE, "/", "orders.late"),
                     ChangeSource.EVENT)
        await asyncio.sleep(0.2)
        assert s.stats.sync_differences == 0
        await s.feed.stop()

    with caplog.at_level(logging.INFO, logger="floodwall.topology"):
        run(body)
    assert not [r for r in caplog.records if r.getMessage().startswith("topology_")
                and "step" in r.getMessage()]


def test_without_events_a_sync_that_learns_is_information_not_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        s = Setup()
        await s.feed.sync()
        s.broker.queues.append({"name": "orders.new", "vhost": "/"})
        await s.feed.sync()
        await asyncio.sleep(0.2)
        assert s.stats.sync_differences == 0 and s.stats.changes["sync"] == 1
        await s.feed.stop()

    with caplog.at_level(logging.INFO, logger="floodwall.topology"):
        run(body)
    (line,) = [r for r in caplog.records if r.getMessage() == "topology_sync_learned"]
    assert line.levelno == logging.INFO


def test_events_reach_the_model_and_odd_ones_ask_for_a_sync(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        s = Setup()

        def deliver(key: str, headers: dict[str, object]) -> None:
            props = type("P", (), {"headers": headers})()
            s.feed._on_event(Delivery("amq.rabbitmq.event", key, props, b""))

        deliver("queue.created", {"name": "orders.e", "vhost": "/", "arguments": [],
                                  "timestamp_in_ms": 1})
        assert s.topology.knows_queue("/", "orders.e")
        assert s.policing.applied[-1] == (ChangeKind.DECLARE_QUEUE, "orders.e",
                                          ChangeSource.EVENT)
        assert s.stats.events_received == 1 and s.stats.event_lag_seconds is not None
        assert not s.feed._sync_wake.is_set()
        for _ in range(2):
            deliver("binding.created", {"vhost": "/", "source_name": "x",
                                        "destination_kind": "queue", "destination_name": "q",
                                        "routing_key": "", "arguments": ["{garbage"]})
        assert s.feed._sync_wake.is_set()
        s.feed._sync_wake.clear()
        deliver("policy.set", {"name": "ae", "vhost": "/"})
        assert s.feed._sync_wake.is_set()
        deliver("connection.created", {"name": "c"})
        assert s.stats.events_received == 5

    with caplog.at_level(logging.INFO, logger="floodwall.topology"):
        run(body)
    assert len([r for r in caplog.records
                if r.getMessage() == "topology_event_unreadable"]) == 1


def test_queue_lookups_found_absent_and_locked() -> None:
    async def body() -> None:
        s = Setup()
        s.broker.counts["orders.f"] = 7
        s.broker.locked.add("orders.x")
        s.broker.counts["orders.x"] = 2
        found = Lookup("/", LookupKind.QUEUE, "orders.f")
        assert await s.feed.lookup(found) is LookupResult.FOUND
        assert s.topology.knows_queue("/", "orders.f")
        assert s.policing.counts == [(("/", "orders.f"), 7)]
        assert ("/", "orders.f") in s.controller.queues
        assert not s.controller.awaiting_first_figure(("/", "orders.f"))
        # 7 messages nobody has seen the size of: their bytes came from the management API.
        estimate = s.controller.queues[("/", "orders.f")].depth.estimate()
        assert estimate is not None and estimate.bytes == 700
        absent = Lookup("/", LookupKind.QUEUE, "orders.none")
        assert await s.feed.lookup(absent) is LookupResult.ABSENT
        locked = Lookup("/", LookupKind.QUEUE, "orders.x")
        assert await s.feed.lookup(locked) is LookupResult.FOUND
        assert s.policing.samples == [("/", "orders.f"), ("/", "orders.x")]
        assert s.stats.lookups[("queue", "found")] == 2
        assert s.stats.lookups[("queue", "absent")] == 1
        assert s.stats.lookup_seconds.count == 3
        assert s.stats.changes["lookup"] == 2

    run(body)


def test_exchange_lookups_follow_bindings_and_fall_back_to_a_passive_declare() -> None:
    async def body() -> None:
        s = Setup()
        s.broker.exchanges += [
            {"name": "front", "vhost": "/", "type": "fanout", "durable": True,
             "auto_delete": False, "internal": False, "arguments": {}},
            {"name": "back", "vhost": "/", "type": "topic", "durable": True,
             "auto_delete": False, "internal": False,
             "arguments": {"alternate-exchange": "spill"}},
            {"name": "spill", "vhost": "/", "type": "fanout", "durable": True,
             "auto_delete": False, "internal": False, "arguments": {}}]
        s.broker.bindings += [
            {"source": "front", "vhost": "/", "destination": "back",
             "destination_type": "exchange", "routing_key": "", "arguments": {}},
            {"source": "back", "vhost": "/", "destination": "orders.t",
             "destination_type": "queue", "routing_key": "a.*", "arguments": {}},
            {"source": "spill", "vhost": "/", "destination": "orders.s",
             "destination_type": "queue", "routing_key": "", "arguments": {}}]
        result = await s.feed.lookup(Lookup("/", LookupKind.EXCHANGE, "front"))
        assert result is LookupResult.FOUND
        assert s.topology.route("/", "front", "a.b") == frozenset({"orders.t"})
        assert s.topology.route("/", "front", "zzz") == frozenset({"orders.s"})
        assert {("/", "orders.t"), ("/", "orders.s")} <= set(s.controller.queues)
        missing = Lookup("/", LookupKind.EXCHANGE, "nowhere")
        assert await s.feed.lookup(missing) is LookupResult.ABSENT
        s.broker.management_down = True
        assert await s.feed.lookup(missing) is LookupResult.ABSENT  # the passive declare
        s.controller.lookups.want(Lookup("/", LookupKind.EXCHANGE, "amq.fanout"), 0.0)
        result = await s.feed.lookup(Lookup("/", LookupKind.EXCHANGE, "amq.fanout"))
        assert result is LookupResult.FAILED  # exists, but its bindings cannot be read
        assert s.stats.lookups[("exchange", "failed")] == 1

    run(body)
