"""The foreign-client harness against the real broker, no proxy: each client does its job.

These prove the harness (toolchains, programs, JSON events, fixtures); flow-control tests
through floodwall build on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.enforce.amqp091.clients import FlowReaction, flow_reaction
from floodwall.wire.amqp091.hooks import ClientInfo
from tests.clients.harness import ForeignClient
from tests.conftest import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

Starter = Callable[..., ForeignClient]


def _connection(broker: BrokerEndpoint) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        broker.host, broker.amqp_port,
        credentials=pika.PlainCredentials(broker.username, broker.password)))


@pytest.fixture
def queue(broker: BrokerEndpoint) -> Iterator[str]:
    """A fresh non-durable queue, deleted afterwards."""
    name = f"clients-{uuid.uuid4().hex[:10]}"
    conn = _connection(broker)
    try:
        conn.channel().queue_declare(name)
    finally:
        conn.close()
    yield name
    conn = _connection(broker)
    try:
        conn.channel().queue_delete(name)
    finally:
        conn.close()


def ready_count(broker: BrokerEndpoint, queue: str) -> int:
    """Messages ready in ``queue`` now (passive declare: real time, unlike the stats)."""
    conn = _connection(broker)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def stats_messages(broker: BrokerEndpoint, queue: str) -> object:
    """``messages`` in the management API's queue stats (refreshed every 5 s)."""
    stats = broker.api("GET", f"/api/queues/%2F/{queue}")
    assert isinstance(stats, dict)
    return stats.get("messages")


def drain(broker: BrokerEndpoint, queue: str) -> list[bytes]:
    """Take every ready message off ``queue``."""
    conn = _connection(broker)
    bodies: list[bytes] = []
    try:
        ch = conn.channel()
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
    finally:
        conn.close()


def check_bodies(bodies: list[bytes], count: int, size: int) -> None:
    """Bodies 0..count-1 in order, each its sequence number in 10 digits, padded to size."""
    assert len(bodies) == count
    for seq, body in enumerate(bodies):
        assert body == f"{seq:010d}".encode().ljust(size, b"x"), f"message {seq}"


def test_java_producer_publishes_to_the_broker(broker: BrokerEndpoint, queue: str,
                                               java_producer: Starter) -> None:
    client = java_producer(broker.host, broker.amqp_port, queue, count=1000, body_size=64,
                           confirm=True)
    ready = client.wait_event("ready", timeout=60)
    assert ready["client"] == "java" and ready["version"].startswith("5.")
    assert ready["flow_observable"] is True, "the program cannot see Channel.Flow"
    done = client.finish(timeout=120)
    assert done["published"] == 1000 and done["confirmed"] is True
    assert done["blocked_ms"] == 0 and client.of("flow") == [], "no Channel.Flow from RabbitMQ"
    # Confirmed, so already enqueued; the management API agrees once its stats refresh (5 s).
    assert ready_count(broker, queue) == 1000
    wait_for(lambda: stats_messages(broker, queue) == 1000, timeout=20, interval=0.5,
             what="the management API to count 1000 messages")
    check_bodies(drain(broker, queue), 1000, 64)


def test_node_producer_publishes_to_the_broker(broker: BrokerEndpoint, queue: str,
                                               node_producer: Starter) -> None:
    client = node_producer(broker.host, broker.amqp_port, queue, count=1000, body_size=64)
    ready = client.wait_event("ready", timeout=30)
    assert ready["client"] == "amqplib"
    done = client.finish(timeout=60)
    assert done["published"] == 1000 and done["confirmed"] is False
    # Without confirms the last publishes may still be on their way when the client exits.
    wait_for(lambda: ready_count(broker, queue) == 1000, timeout=10,
             what="1000 messages from amqplib in the queue")
    check_bodies(drain(broker, queue), 1000, 64)


def test_node_producer_confirm_mode(broker: BrokerEndpoint, queue: str,
                                    node_producer: Starter) -> None:
    done = node_producer(broker.host, broker.amqp_port, queue, count=300, body_size=20,
                         confirm=True).finish(timeout=60)
    assert done["published"] == 300 and done["confirmed"] is True
    assert ready_count(broker, queue) == 300


@pytest.mark.load_tolerant(False)  # timed: the client's elapsed time is bounded
@pytest.mark.parametrize("kind", ["java", "amqplib"])
def test_producers_keep_to_their_rate(broker: BrokerEndpoint, queue: str, kind: str,
                                      java_producer: Starter, node_producer: Starter) -> None:
    start = java_producer if kind == "java" else node_producer
    client = start(broker.host, broker.amqp_port, queue, count=60, rate=200, body_size=10)
    done = client.finish(timeout=60)
    assert done["published"] == 60
    assert 0.25 <= done["elapsed_s"] <= 3.0, done  # 60 at 200/s: 0.3 s
    progress = client.of("progress")
    assert progress and all(0 <= p["published"] <= 60 for p in progress)


def test_rhea_sender_and_receiver(broker: BrokerEndpoint, queue: str,
                                  rhea_sender: Starter, rhea_receiver: Starter) -> None:
    address = f"/amq/queue/{queue}"
    receiver = rhea_receiver(broker.host, broker.amqp_port, address, count=500, prefetch=50)
    assert receiver.wait_event("ready", timeout=30)["client"] == "rhea"
    sender = rhea_sender(broker.host, broker.amqp_port, address, count=500, body_size=32)
    credit = sender.wait_for(lambda e: e.get("event") == "credit" and e["credit"] > 0,
                             timeout=30)
    assert credit["credit"] > 0
    sent = sender.finish(timeout=60)
    assert sent["sent"] == 500 and sent["accepted"] == 500
    assert sent["rejected"] == sent["released"] == sent["modified"] == 0
    got = receiver.finish(timeout=60)
    assert got["received"] == 500 and got["out_of_order"] == 0 and got["last_seq"] == 499
    assert ready_count(broker, queue) == 0


@pytest.mark.load_tolerant(False)  # timed: the client's elapsed time is bounded
def test_rhea_receiver_keeps_to_its_rate(broker: BrokerEndpoint, queue: str,
                                         rhea_sender: Starter, rhea_receiver: Starter) -> None:
    address = f"/amq/queue/{queue}"
    rhea_sender(broker.host, broker.amqp_port, address, count=100, body_size=16
                ).finish(timeout=60)
    assert ready_count(broker, queue) == 100
    got = rhea_receiver(broker.host, broker.amqp_port, address, count=40, prefetch=5,
                        rate=100).finish(timeout=60)
    assert got["received"] == 40 and got["out_of_order"] == 0
    assert 0.3 <= got["elapsed_s"] <= 3.0, got  # 40 at 100/s: 0.4 s
    # the rest stays queued (the few the broker sent past credit go back on close)
    wait_for(lambda: ready_count(broker, queue) == 60, timeout=10,
             what="the 60 messages not taken back in the queue")


def test_rhea_queue_address_declares_the_queue(broker: BrokerEndpoint,
                                               rhea_sender: Starter) -> None:
    """``/queue/NAME`` (RabbitMQ 3.10's plugin) declares NAME, non-durable, then sends."""
    name = f"clients-{uuid.uuid4().hex[:10]}"
    try:
        done = rhea_sender(broker.host, broker.amqp_port, f"/queue/{name}", count=50,
                           body_size=12).finish(timeout=60)
        assert done["accepted"] == 50
        assert ready_count(broker, name) == 50
    finally:
        conn = _connection(broker)
        try:
            conn.channel().queue_delete(name)
        finally:
            conn.close()


def test_a_failing_client_is_reported(broker: BrokerEndpoint, rhea_receiver: Starter) -> None:
    """The harness surfaces a client's error: a missing queue detaches the link."""
    client = rhea_receiver(broker.host, broker.amqp_port,
                           f"/amq/queue/missing-{uuid.uuid4().hex[:8]}", count=1)
    error = client.wait_event("error", timeout=30)
    assert error["code"] == "amqp:not-found"
    assert client.wait_exit(timeout=30) != 0


# -- the platform clients: amqp091-go, Bunny, php-amqplib, rabbitmq-c ----------------------
PLATFORM_KINDS = ("go", "ruby", "php", "c")


@pytest.fixture
def platform_producer(request: pytest.FixtureRequest) -> Callable[[str], Starter]:
    """``platform_producer(kind)``: the starter fixture of that client."""

    def starter(kind: str) -> Starter:
        start: Starter = request.getfixturevalue(f"{kind}_producer")
        return start

    return starter


@pytest.mark.parametrize("confirm", [False, True], ids=["no-confirms", "confirms"])
@pytest.mark.parametrize("kind", PLATFORM_KINDS)
def test_platform_producer_publishes_to_the_broker(
        broker: BrokerEndpoint, queue: str, platform_producer: Callable[[str], Starter],
        kind: str, confirm: bool) -> None:
    client = platform_producer(kind)(broker.host, broker.amqp_port, queue, count=500,
                                     body_size=64, confirm=confirm)
    done = client.finish(timeout=120)
    assert done["published"] == 500 and done["confirmed"] is confirm
    assert done["rpc_ok"] is True and done["nacked"] == 0
    assert client.of("flow") == [], "no Channel.Flow from RabbitMQ"
    # Without confirms the last publishes may still be on their way when the client exits.
    wait_for(lambda: ready_count(broker, queue) == 500, timeout=10,
             what=f"500 messages from {kind} in the queue")
    check_bodies(drain(broker, queue), 500, 64)


def _connections(broker: BrokerEndpoint) -> dict[str, dict[str, object]]:
    found = broker.api("GET", "/api/connections?columns=name,client_properties")
    assert isinstance(found, list)
    return {c["name"]: c["client_properties"] for c in found}


# What each client really sends in Connection.StartOk, as the broker recorded it, and how
# floodwall's rules (floodwall/enforce/amqp091/clients.py) classify it.
STARTOK = {
    "go": ({"product": "AMQP 0.9.1 Client", "version": "1.5.0", "platform": "golang"},
           FlowReaction.TOLERATES),
    "go-named": ({"connection_name": "floodwall-test go named"}, FlowReaction.UNKNOWN),
    "ruby": ({"product": "Bunny", "version": "2.19.0"}, FlowReaction.BREAKS),
    "php": ({"product": "AMQPLib", "version": "3.5.3", "platform": "PHP"},
            FlowReaction.TOLERATES),
    "c": ({"product": "rabbitmq-c", "version": "0.11.0", "platform": "Linux"},
          FlowReaction.LEFT_TO_APPLICATION),
}


@pytest.mark.parametrize("case", sorted(STARTOK))
def test_platform_clients_startok_and_their_classification(
        broker: BrokerEndpoint, queue: str, platform_producer: Callable[[str], Starter],
        case: str) -> None:
    kind, _, variant = case.partition("-")
    extra = {"connection_name": "floodwall-test go named"} if variant == "named" else {}
    before = set(_connections(broker))
    # slow (100 a second for 60 s): still connected while the management API lists it
    client = platform_producer(kind)(broker.host, broker.amqp_port, queue, count=6000,
                                     rate=100, body_size=16, **extra)
    client.wait_event("ready", timeout=60)

    def ours() -> dict[str, object] | None:
        new = [p for name, p in _connections(broker).items() if name not in before]
        return new[0] if len(new) == 1 else None

    sent = wait_for(ours, timeout=30, interval=0.5, what=f"{kind}'s connection listed")
    client.stop()
    assert isinstance(sent, dict)
    want, reaction = STARTOK[case]
    assert {k: sent.get(k) for k in want} == want, sent
    if variant == "named":
        assert not {"product", "version", "platform"} & set(sent), sent
    info = ClientInfo.from_properties({k: v for k, v in sent.items()
                                       if isinstance(v, str)})
    assert flow_reaction(info) is reaction
