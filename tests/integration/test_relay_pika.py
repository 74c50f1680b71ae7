"""pika (blocking and SelectConnection) through the relay: integrity, confirms, tx, get, returns,
big bodies across frame_max, heartbeats."""

from __future__ import annotations

import functools
import random
from typing import Any

import pika
import pika.exceptions
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    broker_connection_named,
    delete_queue,
    payload,
    pika_connection,
    pika_params,
    sha,
    temp_queue,
    unique,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120), pytest.mark.load_tolerant]


def _drain(channel: Any, queue: str, count: int, timeout: float = 30.0
           ) -> list[tuple[Any, bytes]]:
    """Consume exactly ``count`` messages from ``queue`` (acking each) within ``timeout``."""
    got: list[tuple[Any, bytes]] = []
    for method, props, body in channel.consume(queue, inactivity_timeout=timeout):
        assert method is not None, f"only {len(got)} of {count} messages within {timeout}s"
        got.append((props, body))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_blocking_publish_consume_integrity(floodwall: ProxyProcess) -> None:
    rng = random.Random(7)
    sizes = [0, 1, 7, 4096, 131072 - 8, 131072 - 7, 131072, 131073, 300_000]
    sizes += [rng.randrange(0, 70_000) for _ in range(300)]
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        for i, size in enumerate(sizes):
            body = payload(size, seed=i)
            ch.basic_publish("", queue, body, pika.BasicProperties(
                message_id=str(i), headers={"sha256": sha(body), "size": size}))
        got = _drain(ch, queue, len(sizes))
    assert [int(p.message_id) for p, _ in got] == list(range(len(sizes))), "order changed"
    for props, body in got:
        assert len(body) == props.headers["size"]
        assert sha(body) == props.headers["sha256"], f"message {props.message_id} corrupted"


def test_publisher_confirms_and_mandatory_return(floodwall: ProxyProcess) -> None:
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(200):
            # raises NackError/UnroutableError unless the broker acked it
            ch.basic_publish("", queue, payload(100, i), mandatory=True)
        assert ch.queue_declare(queue, passive=True).method.message_count == 200

        nowhere = unique("no-such-queue")
        body = payload(5000, seed=99)
        with pytest.raises(pika.exceptions.UnroutableError) as info:
            ch.basic_publish("", nowhere, body, mandatory=True)
        (returned,) = info.value.messages
        assert returned.method.reply_code == 312  # NO_ROUTE
        assert returned.method.routing_key == nowhere
        assert sha(returned.body) == sha(body)


def test_mandatory_return_without_confirms(floodwall: ProxyProcess) -> None:
    returned: list[tuple[Any, bytes]] = []
    with pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        ch.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method, body)))
        nowhere = unique("unroutable")
        body = payload(200_000, seed=3)  # spans several body frames on the way back
        ch.basic_publish("", nowhere, body, mandatory=True)

        def came_back() -> bool:
            conn.process_data_events(time_limit=0.05)
            return bool(returned)

        wait_for(came_back, 10, what="basic.return of an unroutable mandatory publish")
    method, back = returned[0]
    assert method.reply_code == 312 and method.routing_key == nowhere
    assert sha(back) == sha(body)


def test_transactions_commit_and_rollback(floodwall: ProxyProcess) -> None:
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        ch.tx_select()
        ch.basic_publish("", queue, b"rolled back")
        ch.tx_rollback()
        ch.basic_publish("", queue, b"committed")
        ch.tx_commit()
        ch.basic_publish("", queue, b"rolled back too")
        ch.tx_rollback()

        probe = conn.channel()
        method, _props, body = probe.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"committed"
        assert probe.basic_get(queue, auto_ack=True) == (None, None, None), \
            "a rolled-back publish reached the queue"

        # An ack inside a rolled-back transaction is undone: the message stays in the queue.
        ch.basic_publish("", queue, b"ack me")
        ch.tx_commit()
        method, _props, body = ch.basic_get(queue)
        assert method is not None and body == b"ack me"
        ch.basic_ack(method.delivery_tag)
        ch.tx_rollback()
        ch.basic_recover(requeue=True)
        method, _props, body = probe.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"ack me", "a rolled-back ack was applied"


def test_basic_get(floodwall: ProxyProcess) -> None:
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        bodies = [payload(n, seed=n) for n in (0, 10, 150_000)]
        for body in bodies:
            ch.basic_publish("", queue, body)
        ch.basic_publish("", queue, b"last")
        for expected_left, body in zip((3, 2, 1), bodies, strict=True):
            method, _props, got = ch.basic_get(queue)
            assert method is not None and sha(got) == sha(body)
            assert method.message_count == expected_left
            ch.basic_ack(method.delivery_tag)
        method, _props, got = ch.basic_get(queue, auto_ack=True)
        assert got == b"last" and method.message_count == 0
        assert ch.basic_get(queue) == (None, None, None)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("frame_max", [None, 4096, 10_000])
def test_bodies_larger_than_frame_max(floodwall: ProxyProcess, frame_max: int | None) -> None:
    """Up to 16 MiB, at the broker's frame_max (128 KiB) and at small client-set ones."""
    kwargs = {} if frame_max is None else {"frame_max": frame_max}
    sizes = [131072 * 2 + 1, 1 << 20, 16 << 20]
    if frame_max:
        sizes = [frame_max - 8, frame_max - 7, frame_max, frame_max * 3 + 1, *sizes]
    with temp_queue(floodwall.port) as queue, \
            pika_connection(floodwall.port, socket_timeout=30, **kwargs) as conn:
        negotiated = conn._impl.params.frame_max
        assert negotiated == (frame_max or 131072)
        ch = conn.channel()
        ch.confirm_delivery()
        frames_before = floodwall.metric("floodwall_frames_total", protocol="amqp091",
                                         direction="client_to_server")
        for i, size in enumerate(sizes):
            body = payload(size, seed=size)
            ch.basic_publish("", queue, body, pika.BasicProperties(
                message_id=str(i), headers={"sha256": sha(body)}))
        got = _drain(ch, queue, len(sizes), timeout=60)
        sent_frames = floodwall.metric("floodwall_frames_total", protocol="amqp091",
                                       direction="client_to_server") - frames_before
    assert [len(b) for _, b in got] == sizes
    # every body was cut at the negotiated frame_max and the proxy relayed each piece
    assert sent_frames >= sum(-(-size // (negotiated - 8)) for size in sizes)
    for props, body in got:
        assert sha(body) == props.headers["sha256"]


class _SelectClient:
    """Publishes with confirms, then consumes everything back, on pika's own ioloop."""

    def __init__(self, port: int, queue: str, bodies: list[bytes]) -> None:
        self.queue = queue
        self.bodies = bodies
        self.acked = 0
        self.received: list[bytes] = []
        self.error: str | None = None
        self.closed_cleanly = False
        self.conn = pika.SelectConnection(
            pika_params(port), on_open_callback=self.on_open,
            on_open_error_callback=self.on_error, on_close_callback=self.on_close)

    def on_error(self, _conn: Any, exc: Exception) -> None:
        self.error = repr(exc)
        self.conn.ioloop.stop()

    def on_close(self, _conn: Any, reason: Exception) -> None:
        self.closed_cleanly = isinstance(reason, pika.exceptions.ConnectionClosedByClient)
        self.conn.ioloop.stop()

    def on_open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self.on_channel)

    def on_channel(self, ch: Any) -> None:
        self.ch = ch
        ch.queue_declare(self.queue, callback=self.on_declared)

    def on_declared(self, _frame: Any) -> None:
        self.ch.confirm_delivery(self.on_confirm, callback=lambda _f: self.publish_all())

    def publish_all(self) -> None:
        for body in self.bodies:
            self.ch.basic_publish("", self.queue, body)

    def on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self.error = f"nack {method.delivery_tag}"
            self.conn.close()
            return
        self.acked = method.delivery_tag if method.multiple else self.acked + 1
        if self.acked == len(self.bodies):
            self.ch.basic_consume(self.queue, self.on_message)

    def on_message(self, ch: Any, method: Any, _props: Any, body: bytes) -> None:
        self.received.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(self.received) == len(self.bodies):
            ch.queue_delete(self.queue, callback=lambda _f: self.conn.close())


def test_select_connection(floodwall: ProxyProcess, broker: BrokerEndpoint) -> None:
    bodies = [payload(n * 997 % 200_000, seed=n) for n in range(150)]
    queue = unique("select")
    client = _SelectClient(floodwall.port, queue, bodies)
    deadline = client.conn.ioloop.call_later(60, functools.partial(
        setattr, client, "error", "deadline passed"))
    client.conn.ioloop.call_later(60.1, client.conn.ioloop.stop)
    try:
        client.conn.ioloop.start()
    finally:
        client.conn.ioloop.remove_timeout(deadline)
        delete_queue(broker, queue)  # the client deletes it on success; this is for failures
    assert client.error is None, client.error
    assert client.acked == len(bodies)
    assert [sha(b) for b in client.received] == [sha(b) for b in bodies]
    assert client.closed_cleanly


@pytest.mark.timeout(60)
def test_heartbeats_keep_an_idle_connection_open(start_floodwall: Any,
                                                  broker: BrokerEndpoint) -> None:
    """heartbeat=2: RabbitMQ drops a client silent for 2 intervals (4 s) and pika checks for
    broker silence every 7 s, so 10 s idle proves heartbeats crossed the proxy both ways."""
    proxy = start_floodwall()
    name = unique("heartbeat")

    def frames(direction: str) -> float:
        return proxy.metric("floodwall_frames_total", protocol="amqp091", direction=direction)

    with pika_connection(proxy.port, heartbeat=2, client_properties={
            "connection_name": name}) as conn:
        def listed() -> Any:
            conn.process_data_events(time_limit=0.1)  # keep heartbeating while we look
            return broker_connection_named(broker, name)

        record = wait_for(listed, 15, what="the broker to list the connection")
        assert record["timeout"] == 2, "heartbeat was not negotiated to 2 s"
        up, down = frames("client_to_server"), frames("server_to_client")
        conn.sleep(10)  # idle: only pika's I/O loop runs, sending and reading heartbeats
        assert conn.is_open
        # ~10 heartbeat frames each way (both peers send every 1 s), nothing else
        assert frames("client_to_server") - up >= 5, "client heartbeats did not cross"
        assert frames("server_to_client") - down >= 5, "broker heartbeats did not cross"
        assert conn.channel().queue_declare("", exclusive=True).method.queue  # still usable
