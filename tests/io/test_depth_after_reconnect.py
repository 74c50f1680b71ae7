"""After a reconnect of the own connection or of the management API, a queue's
depth is unknown until a figure asked for after the reconnect arrives. After a broker
restart its management API answers "empty" while the queues recover, and the own
connection came back seconds later: the gate released on that zero and the spool replay
pushed the queue to 165% of its capacity. Now neither a management figure nor a ready
count asked for before the reconnect moves the queue; the first fresh ready count does.

No broker: a FlowSupervisor that is not started, fed figures by hand.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from floodwall.control.depth import ManagementSample
from floodwall.io.supervisor import FlowSettings, FlowSupervisor
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials, ManagementCredentials
from tests.conftest import run

KIB = 1024
KEY = ("/", "orders")


def sample(taken_at: float, ready_bytes: int, messages: int) -> ManagementSample:
    return ManagementSample(taken_at, messages, 0, ready_bytes, ready_bytes, 0)


def supervisor(tmp_path: Path) -> FlowSupervisor:
    policies = tmp_path / "p.yaml"
    policies.write_text("version: 1\npolicies:\n  - {name: orders, match: {queue: orders}, "
                        "capacity: 64KiB, resume: 32KiB, on_unknown_depth: keep}\n")
    flow = FlowSupervisor(FlowSettings(
        policies=policies, management_urls=("http://127.0.0.1:1",),
        management_credentials=ManagementCredentials(), upstreams=Upstreams([("127.0.0.1", 1)]),
        amqp_credentials=AmqpCredentials()))
    flow.queue_declared(*KEY)
    return flow


def test_figures_from_before_a_reconnect_do_not_release(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "floodwall")

    async def body() -> None:
        flow = supervisor(tmp_path)
        try:
            before = time.monotonic()
            flow.feed_management(KEY, sample(before, 100 * KIB, 100))
            assert KEY in flow.controller.tripped
            asked_before_restart = time.monotonic()
            flow.depth.mark_stale([KEY], "own connection to vhost / lost: broker restart")
            assert flow.depth.depth_unknown_now(KEY)
            assert flow.stats.depth_known[KEY] is False
            assert flow.readiness()[1]["depth_unknown"] == ["orders@/"]
            # the restarted broker's management API: "empty" while the queue recovers
            flow.feed_management(KEY, sample(time.monotonic(), 0, 0))
            # a ready count asked for before the restart, answered late
            flow.feed_ready_count(KEY, asked_before_restart, 0, 0.001)
            assert KEY in flow.controller.tripped, "released on a figure from before"
            assert flow.depth.depth_unknown_now(KEY)
            # the first ready count asked for after the reconnect: the real figure
            flow.feed_ready_count(KEY, time.monotonic(), 90, 0.001)
            assert not flow.depth.depth_unknown_now(KEY)
            assert KEY in flow.controller.tripped  # 90 messages: still full
            flow.feed_ready_count(KEY, time.monotonic() + 1, 0, 0.001)
            assert KEY not in flow.controller.tripped  # and now really empty: released
        finally:
            await flow.stop()

    run(body)
    lines = [r.getMessage() for r in caplog.records]
    assert "depth_unknown_until_fresh" in lines and "depth_known_again" in lines


def test_management_back_makes_depth_unknown_until_a_fresh_ready_count(tmp_path: Path) -> None:
    async def body() -> None:
        flow = supervisor(tmp_path)
        try:
            flow.feed_management(KEY, sample(time.monotonic(), 100 * KIB, 100))
            flow.stats.management.ok = False  # it had failed
            flow.sampling._management_ok()  # and answers again
            assert flow.depth.depth_unknown_now(KEY)
            flow.feed_management(KEY, sample(time.monotonic(), 0, 0))
            assert KEY in flow.controller.tripped
            # a queue the passive declare cannot read: a fresh management figure will do
            flow.depth.probe_refused[KEY] = "exclusive"
            flow.feed_management(KEY, sample(time.monotonic(), 0, 0))
            assert not flow.depth.depth_unknown_now(KEY)
            assert KEY not in flow.controller.tripped
        finally:
            await flow.stop()

    run(body)
