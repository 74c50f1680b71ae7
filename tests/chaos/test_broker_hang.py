"""Chaos: the broker hangs (SIGSTOP) and wakes (SIGCONT).

A frozen broker's kernel still completes TCP handshakes, so a readiness probe that only
connects would call it up for as long as it hung. So the probe waits for the broker's
connection.start: /readyz is 503 within 10 s of the freeze (5 s interval + 3 s
answer wait) and 200 within 2 s of the thaw (the probe in flight gets its answer at once).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import LocalBroker
from tests.conftest import wait_for
from tests.integration.support import http_status

pytestmark = pytest.mark.broker

#: The targets: unready within 10 s of a hang, ready within 2 s of the recovery.
UNREADY_WITHIN = 10.0
READY_WITHIN = 2.0


def readyz(proc: Any) -> tuple[int, dict[str, Any]]:
    status, body = http_status(proc.admin_url + "/readyz", timeout=3)
    return status, json.loads(body)


@pytest.mark.timeout(120)
def test_readyz_follows_a_frozen_broker(spare: LocalBroker, start_floodwall: Any) -> None:
    ep = spare.endpoint
    proc = start_floodwall(upstream=f"{ep.host}:{ep.amqp_port}")
    assert readyz(proc)[0] == 200
    time.sleep(0.5)  # the freeze may come at any point of the probe's interval
    spare.freeze()
    frozen_at = time.monotonic()
    try:
        _, doc = wait_for(lambda: (s := readyz(proc))[0] == 503 and s, UNREADY_WITHIN,
                               what="/readyz 503 with the broker frozen")
        unready_after = time.monotonic() - frozen_at
        assert "no connection.start" in doc["upstream_error"], doc
        time.sleep(3)  # stays unready while it is frozen
        assert readyz(proc)[0] == 503
    finally:
        spare.thaw()
    thawed_at = time.monotonic()
    wait_for(lambda: readyz(proc)[0] == 200, READY_WITHIN, interval=0.05,
             what="/readyz 200 after the thaw")
    ready_after = time.monotonic() - thawed_at
    print(f"unready {unready_after:.1f}s after the freeze, ready {ready_after:.2f}s after "
          "the thaw")
    # and clients get through again
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, connection_attempts=1, socket_timeout=10)) as conn:
        conn.channel().queue_declare("", exclusive=True)
    lines = proc.logfile.read_text()
    assert "event=upstream_probe_failed" in lines and "event=upstream_reachable" in lines


@pytest.mark.timeout(120)
def test_a_publish_in_flight_to_a_frozen_broker_ends_by_the_clients_heartbeat(
        spare: LocalBroker, start_floodwall: Any) -> None:
    """A publish the broker has not answered stays unanswered through floodwall: the proxy
    neither confirms it nor times it out (the broker may still take it when it wakes, so a
    timeout would turn a delay into a duplicate), and it does not hide the hang either: the
    broker's heartbeats stop reaching the client, whose own heartbeat check ends the
    connection as it would without the proxy (pika: the negotiated timeout + 5 s)."""
    ep = spare.endpoint
    proc = start_floodwall(upstream=f"{ep.host}:{ep.amqp_port}")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", proc.port, heartbeat=2, connection_attempts=1, socket_timeout=10,
        blocked_connection_timeout=None))
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"before")  # confirmed
    spare.freeze()
    frozen_at = time.monotonic()
    try:
        with pytest.raises(pika.exceptions.AMQPError):
            ch.basic_publish("", queue, b"during")  # waits for a confirm that cannot come
        ended_after = time.monotonic() - frozen_at
    finally:
        spare.thaw()
    # pika checks every timeout + 5 s: the connection ends within two checks of the freeze
    assert ended_after <= 2 * (2 + 5) + 2, ended_after
    assert not conn.is_open
    # the proxy let the relayed connection go and serves the next client
    wait_for(lambda: proc.metric("floodwall_connections", protocol="amqp091") == 0, 30,
             what="the relayed connection closed")
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, connection_attempts=1, socket_timeout=10)) as again:
        again.channel().queue_declare("", exclusive=True)
    print(f"the client's heartbeat ended the connection {ended_after:.1f}s after the freeze")
