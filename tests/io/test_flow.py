"""The flow supervisor: depth, management trouble, reloads, alarms, metrics and /state.

Tests marked ``broker`` drive a FlowSupervisor against a real RabbitMQ; queues are filled
with pika directly (not through the proxy), so only the broker-side sources can see them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from floodwall.cli import main
from floodwall.control.controller import ALARM, FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.events import ChannelFreed
from floodwall.control.policy import parse_policies
from floodwall.dev.devbroker import (
    BrokerEndpoint,
    BrokerError,
    BrokerRelease,
    LocalBroker,
    free_port,
    server_script,
)
from floodwall.dev.devproxy import ProxyProcess
from floodwall.enforce.counters import GateCounters
from floodwall.io.supervisor import FlowSettings, FlowSupervisor, describe_policy_changes
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials, ManagementCredentials
from floodwall.ops.flow_metrics import FlowCollector, FlowStats, ManagementStatus, flow_state
from floodwall.ops.metrics import make_registry
from tests.conftest import eventually, run, wait_for
from tests.fakes import NoRoutes

pika = pytest.importorskip("pika")

FAST = {
    "depth_interval": 0.05, "management_interval": 0.3, "alarm_interval": 0.2,
    "topology_interval": 1.0, "policy_poll_interval": 0.1, "holding_log_interval": 0.1,
    "management_timeout": 2.0, "connect_timeout": 2.0, "reconnect_min": 0.05,
    "reconnect_max": 0.2,
}


# --- helpers --------------------------------------------------------------------------

def write_policies(path: Path, text: str) -> Path:
    """Replace the file (new inode), as a ConfigMap swap or an editor's save would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def settings_for(ep: BrokerEndpoint, policies: Path, **overrides: Any) -> FlowSettings:
    base = FlowSettings(
        policies=policies,
        management_urls=(ep.management_url,),
        management_credentials=ManagementCredentials(ep.username, ep.password),
        upstreams=Upstreams([(ep.host, ep.amqp_port)]),
        amqp_credentials=AmqpCredentials(ep.username, ep.password),
        **FAST,  # type: ignore[arg-type]
    )
    return replace(base, **overrides)


def nowhere_settings(policies: Path, **overrides: Any) -> FlowSettings:
    """Management API and broker both on ports nothing listens on."""
    ep = BrokerEndpoint("127.0.0.1", free_port(), free_port())
    return settings_for(ep, policies, **overrides)


def metric_value(flow: FlowSupervisor, name: str, **labels: str) -> float | None:
    text = generate_latest(make_registry([flow.collector])).decode()
    return metric_in(text, name, **labels)


def metric_in(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        mname, _, lab = key.partition("{")
        got = ",".join(sorted(lab.rstrip("}").split(","))) if lab else ""
        if mname == name and got == want:
            return float(value)
    return None


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == name]


class Owner:
    """A protocol core as the gate sees it: records which channels were released."""

    def __init__(self, conn_id: int) -> None:
        self.conn_id = conn_id
        self.released: list[int] = []

    def channel_released(self, channel: int, now: float) -> None:
        self.released.append(channel)

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        pass


class AmqpAdmin:
    """Declare, fill, purge and delete queues with pika, straight at the broker."""

    def __init__(self, ep: BrokerEndpoint) -> None:
        params = pika.ConnectionParameters(
            ep.host, ep.amqp_port, credentials=pika.PlainCredentials(ep.username, ep.password))
        self.conn = pika.BlockingConnection(params)
        self.ch = self.conn.channel()
        self.declared: set[str] = set()

    def declare(self, name: str) -> None:
        self.ch.queue_declare(name, auto_delete=False)
        self.declared.add(name)

    def fill(self, name: str, count: int, size: int) -> None:
        body = b"x" * size
        for _ in range(count):
            self.ch.basic_publish("", name, body)
        self.conn.process_data_events(0)

    def purge(self, name: str) -> None:
        self.ch.queue_purge(name)

    def delete(self, name: str) -> None:
        self.ch.queue_delete(name)

    def close(self) -> None:
        """Delete what this test declared, then close."""
        for name in sorted(self.declared):
            self.ch.queue_delete(name)
        self.conn.close()


@pytest.fixture
def amqp(broker: BrokerEndpoint) -> Iterator[AmqpAdmin]:
    admin = AmqpAdmin(broker)
    yield admin
    admin.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- against the real broker ------------------------------------------------------------

@pytest.mark.broker
def test_filled_queue_trips_and_purge_releases(broker: BrokerEndpoint, amqp: AmqpAdmin,
                                               tmp_path: Path) -> None:
    counted, sized = unique("fw-count"), unique("fw-bytes")
    policies = write_policies(tmp_path / "p.yaml", f"""
version: 1
policies:
  - name: by-count
    match: {{queue: "{counted}"}}
    max_messages: 50
  - name: by-bytes
    match: {{queue: "{sized}"}}
    capacity: 64KiB
    resume: 32KiB
""")
    amqp.declare(counted)
    amqp.declare(sized)

    async def body() -> None:
        flow = FlowSupervisor(settings_for(broker, policies))
        await flow.start()
        c = flow.controller
        try:
            await eventually(lambda: flow.readiness()[0], 10, "the first round")
            assert set(c.queues) >= {("/", counted), ("/", sized)}
            assert not c.tripped
            await asyncio.to_thread(amqp.fill, counted, 100, 1024)
            await asyncio.to_thread(amqp.fill, sized, 100, 1024)
            filled = time.monotonic()
            # The ready count is real time: the count limit trips within a few probes.
            await eventually(lambda: ("/", counted) in c.tripped, 2, "the count limit")
            assert time.monotonic() - filled < 2
            # Bytes need the broker's statistics (refreshed every 5 s by default).
            await eventually(lambda: ("/", sized) in c.tripped, 20, "the byte limit")
            labels = {"vhost": "/", "queue": sized, "policy": "by-bytes"}
            assert metric_value(flow, "floodwall_queue_tripped", **labels) == 1
            assert (metric_value(flow, "floodwall_queue_depth_bytes", source="broker", **labels)
                    or 0) > 64 * 1024
            assert metric_value(flow, "floodwall_queue_trips_total", **labels) == 1

            await asyncio.to_thread(amqp.purge, counted)
            await asyncio.to_thread(amqp.purge, sized)
            await eventually(lambda: not c.tripped, 2, "both queues to release after purge")
            # No flapping between a fresh ready count and an older management figure.
            assert metric_value(flow, "floodwall_queue_trips_total", vhost="/", queue=counted,
                                policy="by-count") == 1
            state = flow.state()
            by_name = {q["queue"]: q for q in state["queues"]}  # type: ignore[attr-defined]
            assert by_name[sized]["trips"] == 1 and by_name[sized]["tripped"] is False
            assert by_name[sized]["tripped_seconds"] > 0
            assert state["own_connections"] == {"/": "up"}

            # A deleted queue is no longer policed (the passive declare sees the 404).
            await asyncio.to_thread(amqp.delete, counted)
            await eventually(lambda: ("/", counted) not in c.queues, 2, "the queue to go")
        finally:
            await flow.stop()

    run(body)


@pytest.mark.broker
@pytest.mark.parametrize("trouble", ["auth", "unreachable"])
def test_management_trouble_is_reported_once_and_unknown_depth_applies(
        broker: BrokerEndpoint, amqp: AmqpAdmin, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, trouble: str) -> None:
    caplog.set_level(logging.INFO, "floodwall")
    name = unique("fw-mgmt")
    policies = write_policies(tmp_path / "p.yaml", """
version: 1
policies:
  - name: guarded
    match: {queue: "fw-mgmt-*"}
    max_messages: 1000
    on_unknown_depth: block
""")
    amqp.declare(name)
    if trouble == "auth":
        overrides: dict[str, Any] = {
            "management_credentials": ManagementCredentials(broker.username, "wrong")}
    else:
        overrides = {"management_urls": (f"http://127.0.0.1:{free_port()}",)}
    settings = settings_for(broker, policies, **overrides)

    async def body() -> None:
        flow = FlowSupervisor(settings)
        await flow.start()
        try:
            # The topology cannot be read; the relay tells of the queue when a client
            # declares it.
            await eventually(lambda: flow.stats.management.ok is False, 5, "a failure")
            flow.queue_declared("/", name)
            key = ("/", name)
            await eventually(lambda: key in flow.controller.tripped, 5,
                             "on_unknown_depth: block to trip the queue")
            ready, detail = flow.readiness()
            assert ready, detail  # management trouble is reported, not fatal
            mgmt: Any = detail["management"]
            assert mgmt["ok"] is False and mgmt["kind"] == trouble
            assert detail["depth_unknown"] == [f"{name}@/"]
            assert flow.state()["queues"][0]["depth"]["known"] is False  # type: ignore[index]
            await eventually(lambda: flow.stats.management_requests >= 10, 10, "more polls")
            assert (metric_value(flow, "floodwall_management_errors_total", kind=trouble)
                    or 0) >= 10
            assert metric_value(flow, "floodwall_management_up") == 0
            assert len(events(caplog, "management_api_failed")) == 1  # once, not every poll
            assert flow.stats.own_connections == {"/": "up"}  # the AMQP side is fine
        finally:
            await flow.stop()

    run(body)


@pytest.mark.broker
def test_reload_through_a_running_proxy_keeps_connections(
        broker: BrokerEndpoint, start_floodwall: Callable[..., ProxyProcess],
        tmp_path: Path) -> None:
    good = """
version: 1
policies:
  - {name: orders, match: {queue: "orders.*"}, capacity: 1MiB}
"""
    policies = write_policies(tmp_path / "p.yaml", good)
    proxy = start_floodwall("--policies", str(policies), "--management",
                            broker.management_url, "--depth-interval", "50ms")
    ready = json.loads(proxy.get("/readyz"))
    assert ready["ready"] is True and ready["flow"]["management"]["ok"] is True
    name = unique("fw-reload")
    params = pika.ConnectionParameters("127.0.0.1", proxy.port)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.queue_declare(name, auto_delete=True)
        write_policies(policies, good.replace("1MiB", "2MiB"))
        proxy.signal(signal.SIGHUP)
        wait_for(lambda: proxy.metric("floodwall_policy_reloads_total", result="ok") >= 1, 10,
                 what="a good reload")
        write_policies(policies, "version: 1\npolicies:\n  - {name: x}\n")
        proxy.signal(signal.SIGHUP)
        wait_for(lambda: proxy.metric("floodwall_policy_reloads_total", result="error") == 1,
                 10, what="a bad reload to be counted")
        flow: Any = proxy.state()["flow"]
        assert flow["policies"]["last_reload_error"].startswith(f"{policies}:3:")
        assert proxy.metric("floodwall_policies_loaded") == 1  # the good set stays
        ch.basic_publish("", name, b"still here")  # the client never noticed
        wait_for(lambda: ch.basic_get(name, auto_ack=True)[2] == b"still here", 5,
                 what="the message through the same connection")
    finally:
        conn.close()
    log = proxy.log_tail(200)
    assert "event=policies_reloaded" in log and "changed=orders" in log
    assert "event=policy_reload_failed" in log


@pytest.fixture(scope="module")
def private_node(broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    """A node of our own: the alarm test must not block the shared broker's publishers."""
    try:
        server_script()
    except BrokerError as exc:
        pytest.skip(f"needs Debian's rabbitmq-server for rabbitmqctl: {exc}")
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-alarm-"))
    node = LocalBroker(workdir, config_extra="collect_statistics_interval = 500\n",
                       release=broker_release)
    node.start()
    try:
        yield node
    finally:
        node.remove()


@pytest.mark.broker
def test_broker_memory_alarm_holds_everything_until_cleared(
        private_node: LocalBroker, tmp_path: Path) -> None:
    ep = private_node.endpoint
    policies = write_policies(tmp_path / "p.yaml", """
version: 1
policies:
  - {name: any, match: {queue: "*"}, capacity: 1GiB}
""")
    owner = Owner(7)

    async def body() -> None:
        flow = FlowSupervisor(settings_for(ep, policies))
        c = flow.controller
        await flow.start()
        try:
            await eventually(lambda: flow.readiness()[0], 10, "the first round")
            await asyncio.to_thread(private_node.ctl, "set_vm_memory_high_watermark",
                                    "0.0000001")
            await eventually(lambda: c.alarm_reason is not None, 30, "the alarm")
            assert "memory alarm" in (c.alarm_reason or "")
            assert c.blocking("/", frozenset({"any-queue"})) == frozenset({ALARM})
            flow.board.attach(owner)
            assert c.block(owner.conn_id, 1, frozenset({ALARM}), flow.clock())
            assert metric_value(flow, "floodwall_broker_alarm") == 1
            assert flow.readiness()[1]["broker_alarm"] == c.alarm_reason
            await asyncio.to_thread(private_node.ctl, "set_vm_memory_high_watermark", "0.4")
            await eventually(lambda: c.alarm_reason is None, 30, "the alarm to clear")
            assert owner.released == [1]
            assert metric_value(flow, "floodwall_broker_alarm") == 0
        finally:
            await flow.stop()
            await asyncio.to_thread(private_node.ctl, "set_vm_memory_high_watermark", "0.4")

    run(body)


# --- without a broker -------------------------------------------------------------------

GOOD = """
version: 1
defaults:
  - {vhost: "/", capacity: 0}
policies:
  - name: orders
    match: {queue: "orders.*"}
    capacity: 1MiB
    resume: 512KiB
  - name: audit
    match: {queue: "audit"}
    max_messages: 10
"""


def test_bad_policies_refuse_to_start(tmp_path: Path) -> None:
    bad = write_policies(tmp_path / "bad.yaml", "version: 1\npolicies:\n  - name: x\n"
                                                "    match: {queue: a}\n    capacity: lots\n")
    result = CliRunner().invoke(main, ["run", "--policies", str(bad), "--admin", "off",
                                       "--listen", "127.0.0.1:0"])
    assert result.exit_code == 1
    assert f"{bad}:5:15: " in result.output and "capacity" in result.output


def test_reload_good_then_bad_keeps_the_old_set(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "floodwall")
    path = write_policies(tmp_path / "p.yaml", GOOD)

    async def body() -> None:
        flow = FlowSupervisor(nowhere_settings(path))
        flow.controller.queue_seen(("/", "orders.eu"), flow.clock())
        await flow.start()
        try:
            write_policies(path, GOOD.replace("capacity: 1MiB", "capacity: 2MiB"))
            await eventually(lambda: flow.stats.reloads["ok"] == 1, 5, "the file poll")
            assert flow.controller.queues[("/", "orders.eu")].policy.capacity == 2 * 1024**2
            (line,) = events(caplog, "policies_reloaded")
            assert line.__dict__["changed"] == "orders" and line.__dict__["trigger"] == (
                "file changed")

            write_policies(path, GOOD.replace("resume: 512KiB", "resume: 4MiB"))
            await eventually(lambda: flow.stats.reloads["error"] == 1, 5, "the bad file")
            (failed,) = events(caplog, "policy_reload_failed")
            assert failed.__dict__["reason"].startswith(f"{path}:9:")
            assert flow.controller.queues[("/", "orders.eu")].policy.capacity == 2 * 1024**2
            assert metric_value(flow, "floodwall_policy_reloads_total", result="error") == 1
            await asyncio.sleep(0.3)  # several polls of the unchanged bad file
            assert flow.stats.reloads["error"] == 1  # reported once per change

            result = flow.reload("SIGHUP")  # same bad file, asked for explicitly
            assert not result.ok and flow.stats.reloads["error"] == 2
        finally:
            await flow.stop()

    run(body)


def test_trouble_everywhere_is_logged_once_and_holding_repeats(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "floodwall")
    path = write_policies(tmp_path / "p.yaml", GOOD)

    async def body() -> None:
        flow = FlowSupervisor(nowhere_settings(path))
        c = flow.controller
        await flow.start()
        try:
            await eventually(lambda: flow.readiness()[0], 5, "readiness despite the trouble")
            flow.queue_declared("/", "audit")
            c.sampled_management(("/", "audit"), ManagementSample(time.monotonic(), 11, 0,
                                                                  1100, 1100, 0), flow.clock())
            flow.board.settle()
            assert ("/", "audit") in c.tripped
            owner = Owner(3)
            flow.board.attach(owner)
            assert c.block(owner.conn_id, 2, frozenset({("/", "audit")}), flow.clock())
            await eventually(lambda: len(events(caplog, "publishes_held")) >= 3, 5,
                             "repeated holding lines")
            held = events(caplog, "publishes_held")[-1].__dict__
            assert (held["conn"], held["channel"], held["queues"]) == (3, 2, "audit@/")
            assert held["seconds"] >= 0.1
            await eventually(lambda: flow.stats.own_connection_failures >= 3, 5, "retries")
            await eventually(lambda: flow.stats.management_requests >= 5, 5, "more polls")
            assert len(events(caplog, "own_connection_failed")) == 1
            assert len(events(caplog, "management_api_failed")) == 1
            ready, detail = flow.readiness()
            assert ready
            assert detail["management"]["kind"] == "unreachable"  # type: ignore[index]
            assert "/" in detail["own_connections_down"]  # type: ignore[operator]
        finally:
            await flow.stop()

    run(body)


def test_collector_output_and_state_shape() -> None:
    now = [100.0]
    policies = parse_policies(GOOD, "policies.yaml")
    c = FlowController(NoRoutes(), policies)
    g = GateCounters()
    orders: QueueKey = ("/", "orders.eu")
    c.queue_seen(orders, now[0])
    c.queue_seen(("/", "audit"), now[0])
    c.sampled_management(orders, ManagementSample(99.0, 3, 1, 2 * 1024**2, 1536 * 1024,
                                                  512 * 1024), now[0])
    now[0] = 104.5
    c.block(5, 1, frozenset({orders}), now[0])
    c.set_alarm("memory alarm on rabbit@a")
    g.held_bytes, g.held_messages, g.rejects, g.deadline_expiries = 300, 2, 4, 1
    g.signals["amqp091", "flow_off"] = 6
    g.signals["amqp10", "flow_off"] = 3
    g.signals["amqp10", "flow_on"] = 2
    stats = FlowStats(policies, management=ManagementStatus("http://mq:15672", False, "auth",
                                                            "401", 100.0))
    stats.management_requests = 12
    stats.management_errors["auth"] = 12
    stats.reloads["ok"] = 1
    text = generate_latest(make_registry([FlowCollector(c, g, stats, lambda: now[0])])).decode()
    q = {"vhost": "/", "queue": "orders.eu", "policy": "orders"}
    # what a capacity counts: the ready messages (1.5 MiB, 3), not the unacknowledged one
    assert metric_in(text, "floodwall_queue_depth_bytes", source="broker", **q) == 1536 * 1024
    assert metric_in(text, "floodwall_queue_depth_messages", source="estimate", **q) == 3
    assert metric_in(text, "floodwall_queue_capacity_bytes", **q) == 1024**2
    assert metric_in(text, "floodwall_queue_resume_bytes", **q) == 512 * 1024
    assert metric_in(text, "floodwall_queue_tripped", **q) == 1
    assert metric_in(text, "floodwall_queue_tripped_seconds_total", **q) == 4.5
    assert metric_in(text, "floodwall_queue_trips_total", **q) == 1
    audit = {"vhost": "/", "queue": "audit", "policy": "audit"}
    assert metric_in(text, "floodwall_queue_depth_bytes", source="broker", **audit) is None
    assert metric_in(text, "floodwall_queue_tripped", **audit) == 0
    assert metric_in(text, "floodwall_blocked_channels") == 1
    assert metric_in(text, "floodwall_held_bytes") == 300
    assert metric_in(text, "floodwall_held_messages") == 2
    signals = "floodwall_flow_signals_total"
    assert metric_in(text, signals, protocol="amqp091", active="false") == 6
    assert metric_in(text, signals, protocol="amqp091", active="true") == 0
    assert metric_in(text, signals, protocol="amqp10", active="false") == 3
    assert metric_in(text, signals, protocol="amqp10", active="true") == 2
    assert metric_in(text, signals, active="false") is None  # every sample names its protocol
    assert metric_in(text, "floodwall_rejected_publishes_total") == 4
    assert metric_in(text, "floodwall_deadline_expiries_total") == 1
    assert metric_in(text, "floodwall_broker_alarm") == 1
    assert metric_in(text, "floodwall_management_requests_total") == 12
    assert metric_in(text, "floodwall_management_errors_total", kind="auth") == 12
    assert metric_in(text, "floodwall_management_errors_total", kind="timeout") == 0
    assert metric_in(text, "floodwall_policy_reloads_total", result="ok") == 1
    assert metric_in(text, "floodwall_policy_reloads_total", result="error") == 0
    assert metric_in(text, "floodwall_policies_loaded") == 3  # 2 policies + 1 defaults entry

    state = json.loads(json.dumps(flow_state(c, g, stats, now[0])))
    assert state["policies"]["source"] == "policies.yaml"
    assert state["alarm"] == "memory alarm on rabbit@a"
    assert state["management"] == {"url": "http://mq:15672", "ok": False, "kind": "auth",
                                   "error": "401", "for_seconds": 4.5}
    (first, second) = state["queues"]
    assert first["queue"] == "audit" and first["depth"]["estimate"] is None
    assert second == {
        "vhost": "/", "queue": "orders.eu", "policy": "orders", "mode": "enforce",
        "capacity": 1024**2,
        "resume": 512 * 1024, "max_messages": None, "resume_messages": None,
        "in_flight_allowance": 256 * 1024,
        "depth": {"estimate": {"bytes": 1536 * 1024, "messages": 3},
                  "broker": {"bytes": 1536 * 1024, "messages": 3},
                  "ready_count": None, "known": True, "source": "management"},
        "tripped": True, "tripped_seconds": 4.5, "trips": 1,
        "overshoot": {"messages": 0, "bytes": 0}, "drain_rate": None,
        # the pace: not counted by the probes here; tripped 4.5 s ago, so the lag
        # assumed at the trip (SETTLE) is over; nothing forwarded over the last second
        "sampling_interval": None, "enqueue_lag": 0.0, "rtt_high": 0.0, "count_rtt": None,
        "drain_rate_bytes": None, "admitted_rate_bytes": 0.0, "unsettled": 0}
    assert state["blocked_channels"] == [
        {"conn": 5, "channel": 1, "queues": [{"vhost": "/", "queue": "orders.eu"}],
         "alarm": False, "lookups": [], "seconds": 0.0,
         "starved_seconds": None}]
    # "audit" has had no figure yet: publishes to it wait for its first one (a lookup).
    assert metric_in(text, "floodwall_topology_lookups_pending") == 1
    assert state["topology"]["lookups_pending"] == [
        {"vhost": "/", "kind": "queue", "name": "audit", "seconds": 4.5}]
    assert state["topology"]["events"] == "off"
    assert metric_in(text, "floodwall_topology_changes_total", source="event") == 0
    assert metric_in(text, "floodwall_topology_lookup_seconds_count") == 0


def test_policy_changes_are_named() -> None:
    old = parse_policies(GOOD)
    new = parse_policies(GOOD.replace("max_messages: 10", "max_messages: 20").replace(
        "capacity: 0", "capacity: 1GiB") + """  - name: fresh
    match: {queue: "fresh"}
    capacity: 1KiB
""")
    assert describe_policy_changes(old, new) == {
        "added": "fresh", "changed": "audit", "defaults_changed": "/"}
    assert describe_policy_changes(old, parse_policies(GOOD)) == {}


def test_collector_sample_ages_unknown_depth_hold_times_and_latency() -> None:
    """The operator's series: how old each broker figure is, whether depth is unknown, how long
    channels were held (by policy and outcome), the management API's latency."""
    now = [100.0]
    policies = parse_policies(GOOD, "policies.yaml")
    c = FlowController(NoRoutes(), policies)
    g = GateCounters()
    orders: QueueKey = ("/", "orders.eu")
    c.queue_seen(orders, now[0])
    c.sampled_management(orders, ManagementSample(99.0, 3, 1, 2 * 1024**2, 1536 * 1024,
                                                  512 * 1024), now[0])  # tripped: over 1 MiB
    assert c.block(5, 1, frozenset({orders}), now[0])
    stats = FlowStats(policies)
    now[0] = 104.5
    text = generate_latest(make_registry([FlowCollector(c, g, stats, lambda: now[0])])).decode()
    q = {"vhost": "/", "queue": "orders.eu", "policy": "orders"}
    assert metric_in(text, "floodwall_queue_depth_sample_age_seconds", source="management",
                     **q) == 5.5
    assert metric_in(text, "floodwall_queue_depth_sample_age_seconds", source="ready_count",
                     **q) is None  # no passive declare answered yet
    assert metric_in(text, "floodwall_queue_depth_unknown", **q) == 0
    assert metric_in(text, "floodwall_hold_seconds_count", policy="orders",
                     outcome="released") == 0
    assert metric_in(text, "floodwall_management_request_seconds_count",
                     endpoint="queues") == 0

    stats.observe_management("queues", 0.02)
    stats.depth_known[orders] = False
    now[0] = 106.5
    c.sampled_ready_count(orders, 106.0, 0, None, now[0])
    c.sampled_management(orders, ManagementSample(106.5, 0, 0, 0, 0, 0), now[0])  # released
    assert ChannelFreed(5, 1) in c.take_output()
    text = generate_latest(make_registry([FlowCollector(c, g, stats, lambda: now[0])])).decode()
    assert metric_in(text, "floodwall_queue_depth_sample_age_seconds", source="ready_count",
                     **q) == 0.5
    assert metric_in(text, "floodwall_queue_depth_unknown", **q) == 1
    assert metric_in(text, "floodwall_hold_seconds_count", policy="orders",
                     outcome="released") == 1
    assert metric_in(text, "floodwall_hold_seconds_sum", policy="orders",
                     outcome="released") == 6.5
    assert metric_in(text, "floodwall_hold_seconds_bucket", policy="orders",
                     outcome="released", le="5") == 0
    assert metric_in(text, "floodwall_hold_seconds_bucket", policy="orders",
                     outcome="released", le="10") == 1
    assert metric_in(text, "floodwall_management_request_seconds_count",
                     endpoint="queues") == 1
    assert metric_in(text, "floodwall_management_request_seconds_bucket", endpoint="queues",
                     le="0.025") == 1
