"""Large bodies without a copy, end to end: a real ``floodwall run`` in front of a real
RabbitMQ, pika publishing and consuming 1 MiB messages: moved with splice(2)
(``--splice-threshold``), or, without it, read into buffers lent to the core
(``floodwall.io.read_buffers``).

The proxy's connection to the broker and the client's to the proxy each run through a
recording relay: what the broker got is byte for byte what the client sent and the other way
round; the bodies come back intact and in order; and the proxy's metrics say the body bytes
went the way meant, both ways (publish and deliver paths). Spliced once as a plain relay,
once with policies (a gate that reads every publish; the queue is policed and not tripped);
lent as a plain relay (a gate's reads are copied).
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
    capped,
    payload,
    pika_connection,
    policy_file,
    start_flow,
    unique,
)
from tests.integration.tls_fixtures import Pki, amqps, upstream_args

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180), pytest.mark.load_tolerant]

MIB = 1 << 20
MESSAGES = 8


@pytest.fixture
def relays() -> Iterator[list[RecordingRelay]]:
    made: list[RecordingRelay] = []
    yield made
    for relay in made:
        relay.close()


def _publish_and_consume(port: int, queue: str, bodies: list[bytes], flow: Any) -> list[bytes]:
    got: list[bytes] = []
    with pika_connection(port) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        if flow is not None:
            wait_for(functools.partial(flow.policed, queue), 15, what=f"{queue} policed")
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body)
        for method, _, body in ch.consume(queue, inactivity_timeout=60):
            assert method is not None, f"only {len(got)} of {len(bodies)} within 60 s"
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == len(bodies):
                break
        ch.cancel()
        ch.queue_delete(queue)
    return got


@pytest.mark.parametrize(("policed", "way"), [(False, "spliced"), (True, "spliced"),
                                              (False, "lent")],
                         ids=["relay", "policed", "lent"])
def test_1mib_messages_move_without_a_copy_both_ways_and_the_relay_stays_byte_exact(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        relays: list[RecordingRelay], policed: bool, way: str) -> None:
    queue = queues("splice")
    to_broker = RecordingRelay(broker.host, broker.amqp_port)
    relays.append(to_broker)
    upstream = f"127.0.0.1:{to_broker.port}"
    args = ("--splice-threshold", "16KiB" if way == "spliced" else "0")
    flow = None
    if policed:
        policies = policy_file(tmp_path / "p.yaml", capped("big", queue, "64MiB", "32MiB"))
        flow = start_flow(start_floodwall, broker, policies, *args, upstream=upstream)
        proxy = flow
    else:
        proxy = start_floodwall(*args, upstream=upstream)
    client_side = RecordingRelay("127.0.0.1", proxy.port)
    relays.append(client_side)
    bodies = [payload(MIB, seed=i) for i in range(MESSAGES)]

    got = _publish_and_consume(client_side.port, queue, bodies, flow)

    assert got == bodies
    (rec,) = client_side.connections
    wait_for(lambda: rec.closed, 30, what="the client's connection closed")
    found = wait_for(lambda: to_broker.find(bytes(rec.up), bytes(rec.down)), 30,
                     what="an upstream connection with exactly the client's bytes")
    assert isinstance(found, Recorded)
    total = MESSAGES * MIB
    if way == "lent":
        # Only reads of 256 KiB or more are lent, and the recording relays hand the bytes on
        # 64 KiB at a time: how many reads were that large is the scheduler's; some were.
        lent = [proxy.metric("floodwall_lent_read_bytes_total", side=side)
                for side in ("client", "server")]
        assert sum(lent) > 0, f"no read lent of {2 * total} bytes"
        assert all(proxy.metric("floodwall_spliced_bytes_total", side=side) == 0
                   for side in ("client", "server"))
        return
    for side in ("client", "server"):  # publish path, deliver path
        spliced = proxy.metric("floodwall_spliced_bytes_total", side=side)
        # (policed, the first publishes can wait for the routing lookup: held, so copied)
        least = total // 8 if policed and side == "client" else total // 2
        assert spliced > least, f"{side}: {spliced} of {total} body bytes spliced"
        assert proxy.metric("floodwall_lent_read_bytes_total", side=side) == 0


def test_a_threshold_of_zero_splices_nothing_and_large_reads_are_lent(
        broker: BrokerEndpoint, start_floodwall: Any, queues: Any) -> None:
    """Nothing in between the client, the proxy and the broker: 1 MiB publishes and
    deliveries come in reads of 256 KiB and more, lent to the core, and arrive intact."""
    proxy = start_floodwall("--splice-threshold", "0")
    bodies = [payload(MIB, seed=i) for i in range(MESSAGES)]
    assert _publish_and_consume(proxy.port, queues("nosplice"), bodies, None) == bodies
    for side in ("client", "server"):
        assert proxy.metric("floodwall_spliced_bytes_total", side=side) == 0
        lent = proxy.metric("floodwall_lent_read_bytes_total", side=side)
        assert lent > MIB, f"{side}: {lent} bytes lent"


def test_a_tls_upstream_keeps_the_copy(start_floodwall: Any, tls_broker: BrokerEndpoint,
                                       pki: Pki) -> None:
    """TLS to the broker: the bytes on the socket are not the frames; nothing is spliced
    whatever the threshold, and the messages come back intact."""
    proxy = start_floodwall(*upstream_args(tls_broker, pki), "--splice-threshold", "16KiB",
                            upstream=amqps(tls_broker))
    bodies = [payload(MIB, seed=i) for i in range(2)]
    assert _publish_and_consume(proxy.port, unique("tls-splice"), bodies, None) == bodies
    for side in ("client", "server"):
        assert proxy.metric("floodwall_spliced_bytes_total", side=side) == 0
