"""The flow supervisor's decisions as pure functions, without a broker: unknown depth, the
broker alarm that holds everything, the first round, readiness."""

from __future__ import annotations

from floodwall.control.controller import QueueKey
from floodwall.ops.supervision import (
    LIST_LIMIT,
    SupervisorView,
    broker_alarm,
    depth_is_unknown,
    first_round_in,
    management_alarm,
    readiness,
)

A: QueueKey = ("/", "orders.a")
B: QueueKey = ("v", "orders.b")


def test_depth_is_unknown_only_after_asking_and_past_the_limit() -> None:
    assert not depth_is_unknown(False, None, 100.0, 3.0)  # not asked yet: the ledger decides
    assert depth_is_unknown(True, None, 100.0, 3.0)  # asked, never a figure
    assert not depth_is_unknown(True, 97.0, 100.0, 3.0)  # exactly at the limit: known
    assert depth_is_unknown(True, 96.9, 100.0, 3.0)


def test_the_management_alarm_wins_then_the_first_vhosts_blocked_notice() -> None:
    assert broker_alarm(None, {}) is None
    assert broker_alarm("disk alarm on rabbit@a", {"/": "connection.blocked: low"}) == \
        "disk alarm on rabbit@a"
    assert broker_alarm(None, {"z": "connection.blocked: z", "a": "connection.blocked: a"}) \
        == "connection.blocked: a"
    assert management_alarm([], []) is None
    assert management_alarm(["rabbit@a", "rabbit@b"], ["rabbit@c"]) == (
        "memory alarm on rabbit@a,rabbit@b; disk alarm on rabbit@c")


def test_the_first_round_needs_the_topology_and_every_policed_queue_asked() -> None:
    assert not first_round_in(False, [A], {A})
    assert not first_round_in(True, [A, B], {A})
    assert first_round_in(True, [A, B], {A, B})
    assert first_round_in(True, [], set())


def view(**changes: object) -> SupervisorView:
    base: dict[str, object] = dict(
        warm=True, policies={"source": "p.yaml", "generation": 1, "entries": 2},
        management={"ok": True}, policed=[A, B], asked={A, B}, unknown=[], topology_error=None,
        topology=None, own_connections={"/": "up"}, alarm=None)
    base.update(changes)
    return SupervisorView(**base)  # type: ignore[arg-type]


def test_readiness_when_warm_and_nothing_is_wrong() -> None:
    ok, detail = readiness(view())
    assert ok
    assert detail == {"policies": {"source": "p.yaml", "generation": 1, "entries": 2},
                      "management": {"ok": True}, "policed_queues": 2}


def test_readiness_while_warming_up_names_what_it_waits_for() -> None:
    ok, detail = readiness(view(warm=False, asked={A}))
    assert not ok and detail["warming_up"] == {"first_depth_sample": ["orders.b@v"]}
    ok, detail = readiness(view(warm=False))
    assert not ok and detail["warming_up"] == {"topology": "not loaded yet"}
    many = [("/", f"q{i:02d}") for i in range(LIST_LIMIT + 5)]
    _, detail = readiness(view(warm=False, policed=many, asked=set()))
    assert len(detail["warming_up"]["first_depth_sample"]) == LIST_LIMIT  # type: ignore[index]


def test_trouble_shows_in_the_detail_but_does_not_unready() -> None:
    ok, detail = readiness(view(unknown=[B], topology_error="sync failed: 401",
                                topology={"events": "down"},
                                own_connections={"/": "up", "v": "refused"},
                                alarm="memory alarm on rabbit@a"))
    assert ok
    assert detail["depth_unknown"] == ["orders.b@v"]
    assert detail["topology_error"] == "sync failed: 401"
    assert detail["topology"] == {"events": "down"}
    assert detail["own_connections_down"] == {"v": "refused"}
    assert detail["broker_alarm"] == "memory alarm on rabbit@a"
