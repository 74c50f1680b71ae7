"""The gate: trips with hysteresis, channels blocked on sets of queues, broker alarms."""

from __future__ import annotations

from proxy.depth import ManagementSample
from proxy.gate import ALARM, FlowController
from proxy.policy import parse_policies

POLICIES = parse_policies("""
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.*"}
    capacity: 1000
    resume: 500
""")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Router:
    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset(routing_key.split("+")) if exchange == "" else frozenset()


class Owner:
    def __init__(self, conn_id: int) -> None:
        self.conn_id = conn_id
        self.released: list[int] = []

    def channel_released(self, channel: int) -> None:
        self.released.append(channel)


def _empty(at: float) -> ManagementSample:
    return ManagementSample(at, 0, 0, 0, 0, 0)


def _controller() -> tuple[FlowController, Clock]:
    clock = Clock()
    fc = FlowController(Router(), clock, POLICIES)
    for q in ("orders.a", "orders.b", "free"):
        fc.queue_seen(("/", q))
    fc.sampled_management(("/", "orders.a"), _empty(clock.t))
    fc.sampled_management(("/", "orders.b"), _empty(clock.t))
    return fc, clock


def test_only_matching_queues_are_policed() -> None:
    fc, _ = _controller()
    assert set(fc.queues) == {("/", "orders.a"), ("/", "orders.b")}


def test_the_publish_that_crosses_capacity_trips_the_queue_at_once() -> None:
    fc, clock = _controller()
    clock.t += 1
    for _ in range(10):
        fc.forwarded("/", frozenset({"orders.a"}), 100)
    assert fc.tripped == frozenset()  # exactly at capacity: not over
    fc.forwarded("/", frozenset({"orders.a", "free"}), 1)
    assert fc.tripped == {("/", "orders.a")}
    assert fc.blocking("/", frozenset({"orders.a", "free"})) == {("/", "orders.a")}
    assert fc.blocking("/", frozenset({"free", "orders.b"})) == frozenset()


def test_release_at_resume_only_and_only_when_every_queue_of_the_set_drained() -> None:
    fc, clock = _controller()
    owner = Owner(7)
    fc.register(owner)
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a", "orders.b"}), 2000)
    assert fc.tripped == {("/", "orders.a"), ("/", "orders.b")}
    assert fc.block(owner, 1, frozenset({("/", "orders.a"), ("/", "orders.b")}))
    assert not fc.block(owner, 1, frozenset({("/", "orders.a")}))  # already blocked

    clock.t += 1
    fc.sampled_management(("/", "orders.a"), ManagementSample(clock.t, 6, 0, 600, 600, 0))
    assert ("/", "orders.a") in fc.tripped  # 600 > resume 500: hysteresis holds
    fc.sampled_management(("/", "orders.a"), ManagementSample(clock.t, 5, 0, 500, 500, 0))
    assert ("/", "orders.a") not in fc.tripped
    assert owner.released == []  # still blocked on orders.b
    assert fc.is_blocked(owner, 1)
    fc.sampled_management(("/", "orders.b"), _empty(clock.t))
    assert owner.released == [1]
    assert not fc.is_blocked(owner, 1)


def test_block_rechecks_so_a_drain_that_raced_cannot_leave_a_channel_stuck() -> None:
    fc, clock = _controller()
    owner = Owner(1)
    fc.register(owner)
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 2000)
    tripped = fc.blocking("/", frozenset({"orders.a"}))
    clock.t += 1
    fc.sampled_management(("/", "orders.a"), _empty(clock.t))  # drains before block()
    assert not fc.block(owner, 3, tripped)
    assert not fc.is_blocked(owner, 3)


def test_broker_alarm_blocks_every_publish_and_clearing_releases() -> None:
    fc, _ = _controller()
    owner = Owner(2)
    fc.register(owner)
    fc.set_alarm("memory alarm on rabbit@a")
    assert fc.blocking("/", frozenset({"free"})) == {ALARM}
    assert fc.block(owner, 5, frozenset({ALARM}))
    fc.set_alarm(None)
    assert owner.released == [5]
    assert fc.blocking("/", frozenset({"free"})) == frozenset()


def test_time_tripped_accumulates() -> None:
    fc, clock = _controller()
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 2000)
    q = fc.queues[("/", "orders.a")]
    clock.t += 4
    assert q.seconds_tripped(clock.t) == 4
    fc.sampled_management(("/", "orders.a"), _empty(clock.t))
    clock.t += 10
    assert q.seconds_tripped(clock.t) == 4 and q.trips == 1


def test_unknown_depth_keeps_the_last_decision_by_default() -> None:
    fc, clock = _controller()
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 2000)
    fc.depth_unknown(("/", "orders.a"))
    assert ("/", "orders.a") in fc.tripped


def test_closing_a_connection_forgets_its_channels() -> None:
    fc, clock = _controller()
    owner = Owner(9)
    fc.register(owner)
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 2000)
    fc.block(owner, 1, frozenset({("/", "orders.a")}))
    fc.unregister(owner)
    assert fc.blocked_channels() == []
    fc.sampled_management(("/", "orders.a"), _empty(clock.t))
    assert owner.released == []
