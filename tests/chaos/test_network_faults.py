"""Chaos between floodwall and the broker, through a fault-injecting TCP relay
(tests/chaos/faults.py): the network goes silent, slow, or cuts every connection (the
proxy's own connection with them); the management API stops answering or answers 500.

Each test asserts: nothing confirmed is lost, readiness says the truth, and the proxy
recovers within the stated time once the fault ends.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from tests.chaos.faults import FaultyRelay, Mode
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    capped,
    direct_params,
    drain_direct,
    http_status,
    numbered,
    policy_file,
    ready_count,
    seq_of,
    start_flow,
)

pytestmark = pytest.mark.broker

FAST = ("--depth-interval", "50ms", "--management-interval", "1s",
        "--management-timeout", "1s")
UNREADY_WITHIN = 10.0  # a broker that does not answer: /readyz 503 within 10 s
READY_WITHIN = 2.0  # ... and 200 within 2 s of its answers coming back
RECONNECT_WITHIN = 5.0  # the own connection is back and the depth known again


def readyz(proc: Any) -> int:
    return http_status(proc.admin_url + "/readyz", timeout=3)[0]


def through(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path, queue: str,
            upstream: FaultyRelay | None = None, management: FaultyRelay | None = None,
            **policy: str) -> FlowProxy:
    up = upstream.address if upstream is not None else f"{broker.host}:{broker.amqp_port}"
    mgmt = (f"http://{management.address}" if management is not None
            else broker.management_url)
    return start_flow(start_floodwall, broker,
                      policy_file(tmp_path / "p.yaml", capped("chaos", queue, **policy)),
                      *FAST, upstream=up, management=mgmt)


def publish_confirmed(port: int, queue: str, seqs: range) -> list[int]:
    """Publish with confirms; the sequence numbers the broker confirmed (stops at an error)."""
    confirmed: list[int] = []
    try:
        with pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, connection_attempts=1, socket_timeout=10,
                blocked_connection_timeout=30)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in seqs:
                ch.basic_publish("", queue, numbered(i), pika.BasicProperties(delivery_mode=2))
                confirmed.append(i)
    except pika.exceptions.AMQPError:
        pass
    return confirmed


@pytest.mark.timeout(120)
def test_network_silent_then_back(broker: BrokerEndpoint, start_floodwall: Any,
                                  tmp_path: Path, queues: Any, relay: Any) -> None:
    """The path to the broker goes silent (a black hole) for a while: /readyz turns 503
    within 10 s, and 200 within 2 s of the path coming back; what was confirmed before
    is in the queue, and publishing works again."""
    q = queues("silent")
    up = relay(broker.host, broker.amqp_port)
    flow = through(start_floodwall, broker, tmp_path, q, upstream=up,
                   capacity="16MiB", resume="8MiB")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(q, durable=True)
    assert publish_confirmed(flow.port, q, range(100)) == list(range(100))
    up.set(Mode.SILENT)
    silent_at = time.monotonic()
    try:
        wait_for(lambda: readyz(flow.proc) == 503, UNREADY_WITHIN, interval=0.1,
                 what="/readyz 503 with the path silent")
        print(f"unready {time.monotonic() - silent_at:.1f}s after the path went silent")
        doc = json.loads(http_status(flow.proc.admin_url + "/readyz")[1])
        assert "no connection.start" in doc["upstream_error"], doc
    finally:
        up.set(Mode.PASS)
    back_at = time.monotonic()
    wait_for(lambda: readyz(flow.proc) == 200, READY_WITHIN, interval=0.05,
             what="/readyz 200 after the path came back")
    print(f"ready {time.monotonic() - back_at:.2f}s after the path came back")
    assert publish_confirmed(flow.port, q, range(100, 200)) == list(range(100, 200))
    assert sorted(seq_of(b) for b in drain_direct(broker, q, 200, timeout=20)) == list(
        range(200))


@pytest.mark.timeout(120)
@pytest.mark.load_tolerant  # it counts what was lost and reordered, not time or depth
def test_slow_network_loses_nothing(broker: BrokerEndpoint, start_floodwall: Any,
                                    tmp_path: Path, queues: Any, relay: Any) -> None:
    """50 ms added to every chunk both ways: slower, but every confirmed publish arrives
    once, in order, and the proxy stays ready."""
    q = queues("slow")
    up = relay(broker.host, broker.amqp_port)
    flow = through(start_floodwall, broker, tmp_path, q, upstream=up,
                   capacity="16MiB", resume="8MiB")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(q, durable=True)
    up.set(Mode.PASS, delay=0.05)
    assert publish_confirmed(flow.port, q, range(300)) == list(range(300))
    assert readyz(flow.proc) == 200
    assert [seq_of(b) for b in drain_direct(broker, q, 300, timeout=30)] == list(range(300))


@pytest.mark.timeout(120)
def test_connections_cut_own_connection_comes_back_and_depth_is_fresh(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        relay: Any) -> None:
    """Every connection through the path is reset (the proxy's own connection with the
    clients'): the own connection is back within a few seconds, the queue's depth is
    unknown until a ready count asked for afterwards arrives, and a tripped queue stays
    tripped meanwhile (it is still full)."""
    q = queues("cut")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        ch.queue_declare(q)
        for i in range(80):
            ch.basic_publish("", q, numbered(1_000_000 + i))
    up = relay(broker.host, broker.amqp_port)
    flow = through(start_floodwall, broker, tmp_path, q, upstream=up,
                   capacity="64KiB", resume="32KiB")
    wait_for(lambda: flow.tripped(q), 20, what=f"{q} tripped")
    up.cut()
    cut_at = time.monotonic()
    wait_for(lambda: flow.log("depth_unknown_until_fresh"), RECONNECT_WITHIN,
             what="depth unknown after the cut")
    wait_for(lambda: flow.log("depth_known_again"), RECONNECT_WITHIN,
             what="a fresh ready count")
    print(f"depth known again {time.monotonic() - cut_at:.2f}s after the cut")
    assert flow.tripped(q)  # 80 KiB in a 64 KiB queue: still full
    assert flow.proc.state()["flow"]["own_connections"] == {"/": "up"}  # type: ignore[index]
    assert readyz(flow.proc) == 200
    drain_direct(broker, q, 80, timeout=20)
    wait_for(lambda: not flow.tripped(q), 10, what="released once really drained")
    assert ready_count(broker, q) == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", [Mode.HTTP_500, Mode.REFUSE])
def test_management_api_failing_then_back(broker: BrokerEndpoint, start_floodwall: Any,
                                          tmp_path: Path, queues: Any, relay: Any,
                                          fault: Mode) -> None:
    """The management API answers 500 (or refuses connections): reported, the depth goes
    unknown after 3 intervals + the timeout (the policy says block: the queue trips), the
    proxy stays ready (the relay works); when it answers again the depth is unknown until
    a fresh ready count, then known, and the queue is released on real figures."""
    q = queues("mgmt")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(q)
    mgmt = relay(broker.host, broker.management_port)
    flow = through(start_floodwall, broker, tmp_path, q, management=mgmt,
                   on_unknown_depth="block")
    wait_for(lambda: flow.policed(q), 15, what=f"{q} policed")
    assert not flow.tripped(q)
    mgmt.set(fault)
    mgmt.cut()  # the pooled keep-alive connections too
    wait_for(lambda: flow.metric("floodwall_management_up") == 0, 10, what="API down")
    wait_for(lambda: flow.tripped(q), 15, what="unknown depth: block trips it")
    wait_for(lambda: flow.metric("floodwall_queue_depth_unknown") == 1, 5,
             what="the depth reported unknown")
    assert readyz(flow.proc) == 200  # management trouble is not the relay's
    mgmt.set(Mode.PASS)
    back_at = time.monotonic()
    wait_for(lambda: flow.log("management_api_recovered"), 10, what="the API back")
    wait_for(lambda: not flow.tripped(q), RECONNECT_WITHIN + 5, what="released on fresh figures")
    print(f"released {time.monotonic() - back_at:.1f}s after the API came back")
    assert flow.log("depth_known_again")
    wait_for(lambda: flow.metric("floodwall_queue_depth_unknown") == 0, 5,
             what="the depth reported known")


def prometheus_url(broker: BrokerEndpoint) -> str:
    """The broker's Prometheus endpoint, from the listeners its management API names."""
    overview = broker.api("GET", "/api/overview")
    assert isinstance(overview, dict)
    ports = [item["port"] for item in overview.get("listeners", [])
             if item.get("protocol") == "http/prometheus"]
    assert ports, "the broker has no Prometheus listener"
    return f"http://{broker.host}:{ports[0]}"


@pytest.mark.timeout(120)
def test_management_api_silent_depth_from_prometheus_then_back(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        relay: Any) -> None:
    """The management API goes silent (as every node's does in a cluster with a hung
    node): within its timeout the depth rounds read the broker's Prometheus endpoint
    instead (said once, in /state and a metric), the depth stays known (the policy keeps a
    tripped queue tripped while it is unknown), so the queue tripped then is released on
    those figures when it drains; when the API answers again the rounds go back to it."""
    q = queues("mgmt-silent")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        ch.queue_declare(q)
        for _ in range(40):
            ch.basic_publish("", q, b"x" * 1024)
    mgmt = relay(broker.host, broker.management_port)
    flow = start_flow(start_floodwall, broker,
                      policy_file(tmp_path / "p.yaml",
                                  capped("chaos", q, "16KiB", "8KiB")),
                      *FAST, "--prometheus", prometheus_url(broker),
                      management=f"http://{mgmt.address}")
    wait_for(lambda: flow.tripped(q), 20, what="the 40 KiB queue tripped")
    mgmt.set(Mode.SILENT)
    silent_at = time.monotonic()
    wait_for(lambda: flow.log("depth_source_switched"), 10, what="the rounds on Prometheus")
    print(f"depth from Prometheus {time.monotonic() - silent_at:.1f}s after the API went "
          "silent")
    assert "source=prometheus" in flow.log("depth_source_switched")[0]
    state = flow.proc.state()["flow"]
    assert state["depth_source"]["source"] == "prometheus", state["depth_source"]
    assert flow.metric("floodwall_depth_source", source="prometheus") == 1
    # Longer than the depth would take to go unknown without figures (3 x 1 s + 1 s).
    until = time.monotonic() + 6
    while time.monotonic() < until:
        assert flow.metric("floodwall_queue_depth_unknown") == 0, flow.queue_state(q)
        time.sleep(0.2)
    assert flow.tripped(q)  # (the queue is as full as before)
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_purge(q)
    wait_for(lambda: not flow.tripped(q), 15, what="released on Prometheus figures")
    depth = (flow.queue_state(q) or {})["depth"]
    assert depth["source"] == "prometheus" and depth["known"], depth
    assert len(flow.log("depth_source_switched")) == 1  # once, not every round
    mgmt.set(Mode.PASS)
    wait_for(lambda: len(flow.log("depth_source_switched")) == 2, 20,
             what="the rounds back on the management API")
    assert "source=management" in flow.log("depth_source_switched")[1]
    wait_for(lambda: (flow.queue_state(q) or {})["depth"]["source"] == "management", 15,
             what="figures from the management API again")
    assert flow.metric("floodwall_depth_source", source="management") == 1
    assert flow.metric("floodwall_depth_source_switches_total") == 2
