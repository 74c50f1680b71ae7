"""The admin endpoint of a proxy in front of a reachable broker: health, readiness, metrics."""

from __future__ import annotations

import json

import pytest
from proton import Message
from proton.utils import BlockingConnection

from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import http_status, payload, pika_connection, temp_queue

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60), pytest.mark.load_tolerant]

DIRECTIONS = ("client_to_server", "server_to_client")


def test_healthz_and_readyz_with_a_reachable_broker(floodwall: ProxyProcess) -> None:
    status, body = http_status(floodwall.admin_url + "/healthz")
    assert status == 200 and body.strip() == b"ok"
    status, body = http_status(floodwall.admin_url + "/readyz")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["ready"] is True and doc["upstream"] is True
    assert floodwall.metric("floodwall_upstream_up") == 1


def _sample(proxy: ProxyProcess) -> dict[tuple[str, str, str], float]:
    return {(name, proto, d): proxy.metric(name, protocol=proto, direction=d)
            for name in ("floodwall_frames_total", "floodwall_relayed_bytes_total")
            for proto in ("amqp091", "amqp10") for d in DIRECTIONS}


def test_metrics_count_connections_frames_and_bytes_by_direction(
        floodwall: ProxyProcess) -> None:
    text = floodwall.get("/metrics").decode()
    for family in ("floodwall_connections", "floodwall_frames_total",
                   "floodwall_relayed_bytes_total", "floodwall_protocol_errors_total",
                   "floodwall_unsupported_headers_total", "floodwall_event_loop_tasks"):
        assert f"\n{family}" in text, f"{family} missing from /metrics"

    before = _sample(floodwall)
    big = payload(300_000, seed=1)
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as pc:
        open_091 = floodwall.metric("floodwall_connections", protocol="amqp091")
        assert open_091 >= 1
        ch = pc.channel()
        ch.basic_publish("", queue, big)
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None and body == big

        conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{floodwall.port}",
                                  timeout=15, allowed_mechs="PLAIN")
        try:
            assert floodwall.metric("floodwall_connections", protocol="amqp10") >= 1
            state = floodwall.state()
            assert isinstance(state["connections"], list)
            assert {c["protocol"] for c in state["connections"]} >= {"amqp091", "amqp10"}
            sender = conn.create_sender(f"/amq/queue/{queue}")
            sender.send(Message(body=big))
            sender.link.detach()
            receiver = conn.create_receiver(f"/amq/queue/{queue}", credit=1)
            msg = receiver.receive(timeout=15)
            receiver.accept()
            receiver.link.detach()
            assert bytes(msg.body) == big
        finally:
            conn.close()

    after = _sample(floodwall)
    for proto in ("amqp091", "amqp10"):
        for d in DIRECTIONS:
            frames = after[("floodwall_frames_total", proto, d)] - \
                before[("floodwall_frames_total", proto, d)]
            nbytes = after[("floodwall_relayed_bytes_total", proto, d)] - \
                before[("floodwall_relayed_bytes_total", proto, d)]
            assert frames >= 3, (proto, d, frames)
            # the big message crossed the proxy once each way, for each protocol
            assert nbytes > len(big), (proto, d, nbytes)
            assert nbytes >= frames * 8, "fewer bytes than the frames' headers"
    # closed connections leave the gauge but keep their counts in the totals
    wait_for(lambda: floodwall.metric("floodwall_connections", protocol="amqp10") == 0, 10,
             what="the 1.0 connection to leave the gauge")
    assert floodwall.metric("floodwall_frames_total", protocol="amqp10",
                            direction="client_to_server") >= \
        after[("floodwall_frames_total", "amqp10", "client_to_server")]
