"""The gate: trips with hysteresis, channels blocked on sets of queues, broker alarms."""

from __future__ import annotations

from floodwall.control.controller import ALARM, FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies

POLICIES_TEXT = """
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.*"}
    capacity: 1000
    resume: 500
"""
POLICIES = parse_policies(POLICIES_TEXT)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Router:
    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset(routing_key.split("+")) if exchange == "" else frozenset()

    generation = 0

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


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


class EveryPublish(FlowController):
    """The gate as it was before the publish path's shortcut: an evaluation per publish."""

    def forwarded(self, vhost: str, queues: frozenset[str], body_bytes: int) -> None:
        if not self.queues:
            return
        now = self.clock()
        for name in queues:
            q = self.queues.get((vhost, name))
            if q is not None:
                q.depth.forwarded(now, body_bytes)
                if not q.tripped:
                    self._evaluate(q)


MIXED = """
version: 1
policies:
  - {name: bytes, match: {vhost: "/", queue: "b"}, capacity: 3000, resume: 1000}
  - {name: count, match: {vhost: "/", queue: "m"}, max_messages: 20, resume_messages: 5}
  - {name: both, match: {vhost: "/", queue: "bm"}, capacity: 4000, max_messages: 30,
     on_unknown_depth: block}
  - {name: open, match: {vhost: "/", queue: "u"}, capacity: 2000, on_unknown_depth: allow}
"""
TIGHTER = MIXED.replace("capacity: 3000, resume: 1000", "capacity: 1500, resume: 700")


def test_the_publish_shortcut_decides_as_an_evaluation_per_publish_does() -> None:
    import random

    rng = random.Random(4)
    queues = ["b", "m", "bm", "u", "free"]
    policy_files = [parse_policies(MIXED), parse_policies(TIGHTER)]
    trips = 0
    for trial in range(40):
        clocks = Clock(), Clock()
        gates = (FlowController(Router(), clocks[0], policy_files[0]),
                 EveryPublish(Router(), clocks[1], policy_files[0]))
        for fc in gates:
            for name in queues:
                fc.queue_seen(("/", name))
        seen: list[list[frozenset[tuple[str, str]]]] = [[], []]
        for _ in range(300):
            step = rng.random()
            key = ("/", rng.choice(queues))
            names = frozenset(rng.sample(queues, rng.randint(1, 3)))
            size = rng.choice([0, 1, 50, 200, 999])
            ready, rtt = rng.randint(0, 30), rng.choice([None, 0.001, 0.1])
            sample = ManagementSample(clocks[0].t - rng.random(), ready, rng.randint(0, 3),
                                      ready * 100, ready * 90, rng.randint(0, 300))
            policies = rng.choice(policy_files)
            for i, fc in enumerate(gates):
                clocks[i].t += 0.003
                if step < 0.80:
                    fc.forwarded("/", names, size)
                elif step < 0.88:
                    fc.sampled_ready_count(key, clocks[i].t - 0.01, ready, rtt)
                elif step < 0.95:
                    fc.sampled_management(key, sample)
                elif step < 0.97:
                    fc.depth_unknown(key)
                elif step < 0.98 and key in fc.queues:  # behind the controller's back
                    fc.queues[key].depth.sampled_management(sample)
                else:
                    fc.set_policies(policies, [("/", q) for q in queues])
                seen[i].append(fc.tripped)
        assert seen[0] == seen[1], f"trial {trial}"
        trips += sum(q.trips for q in gates[0].queues.values())
        assert [q.trips for q in gates[0].queues.values()] == \
            [q.trips for q in gates[1].queues.values()]
    assert trips > 100  # the runs did cross limits, many times


def test_a_sample_or_a_new_policy_is_taken_into_account_by_the_next_publish() -> None:
    fc, clock = _controller()
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 900)
    clock.t += 1
    # the broker has 999 bytes: one more is at capacity, the next one over it
    fc.sampled_management(("/", "orders.a"), ManagementSample(clock.t, 9, 0, 999, 999, 0))
    fc.forwarded("/", frozenset({"orders.a"}), 1)
    assert fc.tripped == frozenset()
    fc.forwarded("/", frozenset({"orders.a"}), 1)
    assert fc.tripped == {("/", "orders.a")}
    clock.t += 1
    fc.sampled_management(("/", "orders.a"), _empty(clock.t))
    assert fc.tripped == frozenset()
    clock.t += 1
    fc.forwarded("/", frozenset({"orders.a"}), 300)
    assert fc.tripped == frozenset()
    tighter = parse_policies(POLICIES_TEXT.replace("capacity: 1000", "capacity: 200")
                             .replace("resume: 500", "resume: 100"))
    fc.set_policies(tighter, [])
    assert fc.tripped == {("/", "orders.a")}  # 300 > 200


def test_policed_answers_follow_the_queues_that_are_policed() -> None:
    fc, _ = _controller()
    names = frozenset({"orders.a", "orders.c", "free"})
    assert fc.policed("/", names) == {("/", "orders.a")}
    fc.queue_seen(("/", "orders.c"))
    assert fc.policed("/", names) == {("/", "orders.a"), ("/", "orders.c")}
    fc.queue_deleted(("/", "orders.a"))
    assert fc.policed("/", names) == {("/", "orders.c")}
    assert fc.policed("other", names) == frozenset()
