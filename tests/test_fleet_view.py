"""What a sidecar tells its fleet and shows of it (floodwall/ops/fleet_view.py), from a real
FlowController: its reports, the figures, /state's fleet section, the metrics, telemetry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.fleet import Announcement, FleetTable, IngressMeter, QueueReport
from floodwall.control.policy import parse_policies
from floodwall.enforce.counters import GateCounters
from floodwall.ops.fleet_view import (
    FleetCollector,
    FleetCounters,
    fleet_figures,
    fleet_state,
    hot_queues,
    my_reports,
)
from floodwall.ops.telemetry import Sampler

POLICIES = parse_policies("""
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.*"}
    capacity: 10000
    resume: 5000
""")
Q = ("/", "orders.a")


class Router:
    generation = 0

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset({routing_key})

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


def _controller() -> FlowController:
    fc = FlowController(Router(), POLICIES)
    fc.queue_seen(Q, 0.0)
    fc.sampled_management(Q, ManagementSample(0.0, 10, 0, 1000, 1000, 0), 0.0)
    return fc


def test_my_report_measures_ingress_and_a_newcomer_has_no_demand() -> None:
    fc, meter = _controller(), IngressMeter()
    first = my_reports(fc, GateCounters(), meter, 1.0)
    assert first[Q].demand is None and first[Q].ingress == 0.0
    for i in range(10):
        fc.forwarded("/", frozenset({"orders.a"}), 100, 1.0 + i * 0.01)
    then = my_reports(fc, GateCounters(), meter, 1.1)
    assert then[Q].ingress == pytest.approx(10_000.0)
    assert then[Q].demand == pytest.approx(10_000.0)


def test_held_bytes_are_demand() -> None:
    fc, meter = _controller(), IngressMeter()
    fc.forwarded("/", frozenset({"orders.a"}), 10_000, 0.5)  # over capacity: tripped
    assert fc.block(1, 1, frozenset({Q}), 1.0)
    counters = GateCounters(held_bytes=3000)
    my_reports(fc, counters, meter, 1.0)
    r = my_reports(fc, counters, meter, 1.1)
    assert r[Q].held == 3000 and r[Q].demand == pytest.approx(3000.0)


def test_a_withheld_links_window_is_demand_and_takes_no_part_of_the_held_bytes() -> None:
    """A 1.0 sender link holds no publishes while its credit is withheld: its window (what
    it would send) is its demand, so a member whose links wait is not sized on its ingress
    alone; the 0-9-1 held bytes stay the 0-9-1 channels'."""
    fc, meter = _controller(), IngressMeter()
    other = ("/", "orders.b")
    fc.queue_seen(other, 0.0)
    fc.sampled_management(other, ManagementSample(0.0, 10, 0, 1000, 1000, 0), 0.0)
    fc.forwarded("/", frozenset({"orders.a", "orders.b"}), 20_000, 0.5)  # both tripped
    assert fc.block(1, 1, frozenset({Q}), 1.0)  # a 0-9-1 channel
    assert fc.block(2, 1 << 32, frozenset({Q, other}), 1.0, wants=65_536)  # a 1.0 link
    counters = GateCounters(held_bytes=3000)
    my_reports(fc, counters, meter, 1.0)
    r = my_reports(fc, counters, meter, 1.1)
    assert r[Q].held == 3000 + 32_768 and r[Q].demand == pytest.approx(35_768.0)
    assert r[other].held == 32_768
    fc.connection_closed(2, 1.2)  # the link's hold ends with it: its window is demand no more
    assert my_reports(fc, counters, meter, 1.3)[other].held == 0


def test_figures_state_and_metrics_show_every_member() -> None:
    fc = _controller()
    table = FleetTable("me")
    table.expect(["/"])
    table.heard(Announcement("me", 1.0, 1, "/", {}), 1.0)
    table.heard(Announcement("b", 1.0, 1, "/", {"orders.a": QueueReport(0, 0, 3000.0)}), 1.0)
    mine = {Q: QueueReport(0.0, 0, 50_000.0)}
    fig = fleet_figures("default", table, fc, mine, 1.0)
    assert fig.size == 2 and not fig.deaf and fig.members == ("b",)
    q = fig.queues[Q]
    assert q.headroom == 9000.0  # 10,000 capacity - 1,000 deep
    # b needs 3,000 (more than half an equal share, MIN_WANT x 4,500), me the rest
    assert q.shares == pytest.approx({"b": 3000.0, "me": 6000.0})
    assert fig.share(Q) == pytest.approx(6000.0)
    doc = fleet_state(fig, table, FleetCounters(sent=3), 1.5)
    assert doc["members"] == [{"id": "b", "heard_seconds_ago": 0.5, "silent": False}]
    entry = doc["queues"][0]  # type: ignore[index]
    assert entry["members"]["b"] == {"demand_bytes_per_second": 3000.0, "share_bytes": 3000.0}
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: fig, FleetCounters(sent=3)))
    text = generate_latest(registry).decode()
    assert "floodwall_fleet_members 2.0" in text
    assert 'floodwall_fleet_share_bytes{member="me",queue="orders.a",vhost="/"} 6000.0' in text
    assert 'floodwall_fleet_announcements_total{direction="sent"} 3.0' in text
    records = Sampler("me").snapshot(fc, GateCounters(), 1.0, 1.0, fleet=fig)
    sample = next(r for r in records if r["type"] == "sample")
    assert sample["fleet_members"] == 2 and sample["fleet_share_bytes"] == 6000
    side = next(r for r in records if r["type"] == "sidecar")
    assert side["fleet_members"] == 2


def test_without_a_fleet_the_records_have_no_fleet_fields() -> None:
    records = Sampler("me").snapshot(_controller(), GateCounters(), 1.0, 1.0)
    assert not any(k.startswith("fleet_") for r in records for k in r)


def test_a_queue_is_hot_from_half_its_capacity_or_tripped_or_unknown() -> None:
    fc = _controller()  # 1,000 of 10,000 bytes
    assert hot_queues(fc) == set()
    fc.forwarded("/", frozenset({"orders.a"}), 4000, 1.0)
    assert hot_queues(fc) == {Q}  # 5,000: half
    fc.queue_seen(("/", "orders.b"), 0.0)  # no figure yet: unknown
    assert ("/", "orders.b") in hot_queues(fc)
