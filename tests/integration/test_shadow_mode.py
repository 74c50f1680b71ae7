"""Shadow mode end to end: a real ``floodwall run`` in front of the real RabbitMQ 3.10, pika
(0-9-1) and python-qpid-proton (1.0) as clients.

One proxy polices two queues with the same limits: one under a ``mode: shadow`` policy, one
under ``mode: enforce``; both get the same traffic. The shadow client's connection runs
through a recording relay on each side of the proxy (client to proxy, proxy to broker): what
the broker received is byte for byte what the client sent and the other way round (no
Channel.Flow, no credit withheld or rewritten, nothing held), the broker has every message,
and the proxy's shadow metrics say what it did to the enforced queue's identical traffic.

The depth probes are slowed down (30 s) so that both queues trip on the ledger alone, at the
same publish: the comparison is exact.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.recording import Recorded, RecordingRelay
from tests.integration.support import (
    FlowProxy,
    capped,
    drain_direct,
    numbered,
    pika_connection,
    policy_file,
    start_flow,
)
from tests.integration.test_amqp10_flow import LinkStats, ProtonSenders

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

MESSAGES = 40
BODY = 1024  # 40 KiB in all: a 16 KiB capacity trips at the 17th


@pytest.fixture
def relays(broker: BrokerEndpoint) -> Iterator[list[RecordingRelay]]:
    made: list[RecordingRelay] = []
    yield made
    for relay in made:
        relay.close()


def _proxy(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path,
           relays: list[RecordingRelay], shadow_q: str, enforce_q: str
           ) -> tuple[FlowProxy, RecordingRelay]:
    """The proxy, its upstream through a recording relay; the shadow and enforce policies."""
    to_broker = RecordingRelay(broker.host, broker.amqp_port)
    relays.append(to_broker)
    policies = policy_file(tmp_path / "p.yaml",
                           capped("watched", shadow_q, "16KiB", "8KiB", mode="shadow"),
                           capped("enforced", enforce_q, "16KiB", "8KiB", mode="enforce",
                                  deadline="3s"))
    flow = start_flow(start_floodwall, broker, policies, "--depth-interval", "30s",
                      "--management-interval", "30s", upstream=f"127.0.0.1:{to_broker.port}")
    return flow, to_broker


def _through_proxy(flow: FlowProxy, relays: list[RecordingRelay]) -> RecordingRelay:
    relay = RecordingRelay("127.0.0.1", flow.port)
    relays.append(relay)
    return relay


def _byte_exact(client_side: RecordingRelay, broker_side: RecordingRelay) -> Recorded:
    """The shadow client's one connection, closed: the broker side carried the same bytes."""
    (rec,) = client_side.connections
    wait_for(lambda: rec.closed, 15, what="the client's connection closed")
    assert len(rec.up) > MESSAGES * BODY
    found = wait_for(lambda: broker_side.find(bytes(rec.up), bytes(rec.down)), 15,
                     what="an upstream connection with exactly the client's bytes")
    assert isinstance(found, Recorded)
    return rec


def _publish_091(port: int, queue: str, flow: FlowProxy, then: Any) -> list[bytes]:
    """Declare ``queue``, publish MESSAGES to it, call ``then(channel)``, close."""
    bodies = [numbered(i, BODY) for i in range(MESSAGES)]
    with pika_connection(port) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        wait_for(functools.partial(flow.policed, queue), 15, what=f"{queue} policed")
        for body in bodies:
            ch.basic_publish("", queue, body)
        then(ch)
    return bodies


@pytest.mark.timeout(120)
def test_a_shadow_policy_changes_no_byte_for_pika_and_counts_what_enforce_does(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        relays: list[RecordingRelay]) -> None:
    shadow_q, enforce_q = queues("shadow-cap-091"), queues("enforce-cap-091")
    flow, to_broker = _proxy(start_floodwall, broker, tmp_path, relays, shadow_q, enforce_q)
    watched = _through_proxy(flow, relays)
    # A round trip behind the publishes: the proxy has seen them all.
    bodies = _publish_091(watched.port, shadow_q, flow,
                          lambda ch: ch.queue_declare(shadow_q, passive=True))
    _byte_exact(watched, to_broker)
    assert drain_direct(broker, shadow_q, MESSAGES, timeout=30) == bodies
    held = flow.metric("floodwall_shadow_actions_total", protocol="amqp091", action="held")
    assert 0 < held < MESSAGES

    def enforce_holds_as_many(ch: Any) -> None:
        wait_for(lambda: flow.metric("floodwall_held_publishes_total") == held, 15,
                 what="enforce mode to hold as many publishes as shadow mode counted")

        def closed_by_the_deadline() -> bool:  # 406 after 3 s: the channel is done
            ch.connection.process_data_events(time_limit=0.1)
            return not ch.is_open

        wait_for(closed_by_the_deadline, 15, what="the held channel refused at its deadline")

    _publish_091(flow.port, enforce_q, flow, enforce_holds_as_many)
    assert flow.metric("floodwall_shadow_queue_trips_total", queue=shadow_q) == 1
    assert flow.metric("floodwall_queue_trips_total", queue=enforce_q) == 1
    assert flow.metric("floodwall_queue_trips_total", queue=shadow_q) == 0
    # Drained (above), the shadow queue is released as an enforced one would be.
    wait_for(lambda: flow.metric("floodwall_shadow_queue_tripped", queue=shadow_q) == 0, 15,
             what="the drained shadow queue released")
    # pika is not sent Channel.Flow (signal: auto): neither mode signalled.
    assert flow.metric("floodwall_shadow_actions_total", action="flow_off") == 0
    assert flow.metric("floodwall_flow_signals_total", active="false") == 0
    assert flow.log("shadow_held") and any("mode=shadow" in line
                                           for line in flow.log("queue_tripped"))


def _send_10(port: int, queue: str, until: Any) -> LinkStats:
    stats = LinkStats("s", f"/amq/queue/{queue}", 0, MESSAGES)
    senders = ProtonSenders(port, [stats], body_size=BODY)
    senders.start()
    try:
        wait_for(lambda: until(stats), 30, what=f"the sender to {queue}")
    finally:
        senders.finish()
    assert not senders.errors, senders.errors
    return stats


@pytest.mark.timeout(120)
def test_a_shadow_policy_changes_no_byte_for_proton_and_counts_what_enforce_does(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        relays: list[RecordingRelay]) -> None:
    shadow_q, enforce_q = queues("shadow-cap-10"), queues("enforce-cap-10")
    flow, to_broker = _proxy(start_floodwall, broker, tmp_path, relays, shadow_q, enforce_q)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        for q in (shadow_q, enforce_q):
            ch.queue_declare(q)
    for q in (shadow_q, enforce_q):
        wait_for(functools.partial(flow.policed, q), 15, what=f"{q} policed")
    watched = _through_proxy(flow, relays)
    _send_10(watched.port, shadow_q, lambda s: s.accepted == MESSAGES)
    _byte_exact(watched, to_broker)
    assert len(drain_direct(broker, shadow_q, MESSAGES, timeout=30)) == MESSAGES

    withheld = functools.partial(flow.metric, "floodwall_flow_signals_total",
                                 protocol="amqp10", active="false")
    _send_10(flow.port, enforce_q, lambda s: withheld() >= 1 and s.starved)
    assert flow.metric("floodwall_queue_trips_total", queue=enforce_q) == 1
    assert flow.metric("floodwall_shadow_queue_trips_total", queue=shadow_q) == 1
    assert flow.metric("floodwall_shadow_actions_total", protocol="amqp10",
                       action="credit_withheld") == withheld() == 1
