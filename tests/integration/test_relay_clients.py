"""aio-pika, kombu (py-amqp) and python-qpid-proton (AMQP 1.0) through the relay."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aio_pika
import aio_pika.exceptions
import kombu
import pytest
from pamqp.commands import Basic
from proton import ConnectionException, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.integration.support import (
    delete_queue,
    payload,
    pika_connection,
    sha,
    temp_queue,
    unique,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120), pytest.mark.load_tolerant]

SIZES = [0, 1, 4096, 131072 - 8, 131072, 131073, 1 << 20, *range(100, 60_000, 997)]


# -- aio-pika ------------------------------------------------------------------------------
def test_aio_pika_confirms_integrity_tx_and_returns(floodwall: ProxyProcess) -> None:
    asyncio.run(asyncio.wait_for(_aio_pika_scenario(floodwall.port), 90))


async def _aio_pika_scenario(port: int) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    queue_name = unique("aiopika")
    async with await aio_pika.connect(url, timeout=10) as conn:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        queue = await ch.declare_queue(queue_name)
        try:
            for i, size in enumerate(SIZES):
                body = payload(size, seed=i)
                confirm = await ch.default_exchange.publish(
                    aio_pika.Message(body, message_id=str(i), headers={"sha256": sha(body)}),
                    routing_key=queue_name)
                assert isinstance(confirm, Basic.Ack), f"publish {i} not acked: {confirm!r}"
            got: list[aio_pika.abc.AbstractIncomingMessage] = []
            async with queue.iterator() as it:
                async for message in it:
                    await message.ack()
                    got.append(message)
                    if len(got) == len(SIZES):
                        break
            assert [m.message_id for m in got] == [str(i) for i in range(len(SIZES))]
            assert all(sha(m.body) == m.headers["sha256"] for m in got)

            # mandatory + confirms: the broker returns it, aio-pika raises DeliveryError
            with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
                await ch.default_exchange.publish(aio_pika.Message(b"lost"), mandatory=True,
                                                  routing_key=unique("nowhere"))
            assert info.value.message is not None and info.value.message.body == b"lost"

            # transactions on a channel without confirms
            tx_ch = await conn.channel(publisher_confirms=False)
            tx = tx_ch.transaction()
            await tx.select()
            await tx_ch.default_exchange.publish(aio_pika.Message(b"discard"), queue_name)
            await tx.rollback()
            await tx_ch.default_exchange.publish(aio_pika.Message(b"keep"), queue_name)
            await tx.commit()
            first = await queue.get(timeout=5, no_ack=True)
            assert first is not None and first.body == b"keep"
            assert await queue.get(fail=False, no_ack=True) is None, "rolled back publish arrived"
            await tx_ch.close()
        finally:
            await queue.delete(if_unused=False, if_empty=False)


# -- kombu / py-amqp -----------------------------------------------------------------------
def test_kombu_publish_consume_confirms(floodwall: ProxyProcess) -> None:
    name = unique("kombu")
    exchange = kombu.Exchange(unique("kombu-x"), type="direct", auto_delete=False)
    queue = kombu.Queue(name, exchange=exchange, routing_key="rk", auto_delete=False)
    rng = random.Random(11)
    bodies = [payload(rng.choice(SIZES), seed=i) for i in range(120)]
    received: list[tuple[dict[str, Any], bytes]] = []
    url = f"pyamqp://guest:guest@127.0.0.1:{floodwall.port}//"
    with kombu.Connection(url, transport_options={"confirm_publish": True},
                          connect_timeout=10) as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.transport.driver_name == "py-amqp"  # py-amqp, not librabbitmq
        channel = conn.channel()
        try:
            producer = kombu.Producer(channel, exchange=exchange, serializer=None)
            queue(channel).declare()
            for i, body in enumerate(bodies):
                # confirm_publish: publish() blocks until the broker acks
                producer.publish(body, routing_key="rk", content_type="application/octet-stream",
                                 content_encoding="binary", declare=[queue],
                                 headers={"n": i, "sha256": sha(body)})

            def on_message(body: Any, message: Any) -> None:
                raw = message.body  # py-amqp hands an empty body over as ''
                received.append((message.headers, raw.encode() if isinstance(raw, str) else raw))
                message.ack()

            with kombu.Consumer(channel, queues=[queue], callbacks=[on_message], accept=None):
                while len(received) < len(bodies):
                    conn.drain_events(timeout=10)  # socket.timeout fails the test
        finally:
            queue(channel).delete()
            exchange(channel).delete()
    assert [h["n"] for h, _ in received] == list(range(len(bodies)))
    for headers, body in received:
        assert sha(body) == headers["sha256"]


# -- python-qpid-proton, AMQP 1.0 ----------------------------------------------------------
def _proton(port: int, mechs: str | None) -> BlockingConnection:
    if mechs is None:
        return BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=15, sasl_enabled=False)
    if mechs == "ANONYMOUS":
        return BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=15,
                                  allowed_mechs="ANONYMOUS")
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=15,
                              allowed_mechs=mechs)


@pytest.mark.parametrize("mechs", ["PLAIN", "ANONYMOUS", None],
                         ids=["sasl-plain", "sasl-anonymous", "no-sasl"])
def test_proton_send_receive(floodwall: ProxyProcess, broker: BrokerEndpoint,
                             mechs: str | None) -> None:
    """RabbitMQ 3.10's amqp1_0 plugin: /queue/NAME, /amq/queue/NAME and a bare NAME are all
    targets on the default exchange; /amq/queue/NAME is a source for an existing queue.
    RabbitMQ 4 takes the same (deprecated v1) addresses, but no 1.0 client without SASL: it
    answers the bare header with its SASL header, which proton, relayed, reports."""
    if mechs is None and broker.version >= (4, 0):
        with pytest.raises(ConnectionException, match="SASL layer"):
            _proton(floodwall.port, mechs)
        return
    with temp_queue(floodwall.port) as queue:
        conn = _proton(floodwall.port, mechs)
        try:
            sent: list[bytes] = []
            for target in (f"/queue/{queue}", f"/amq/queue/{queue}", queue):
                sender = conn.create_sender(target)
                for i, size in enumerate(SIZES[:12]):
                    body = payload(size, seed=hash((target, i)) & 0xFFFF)
                    # BlockingSender.send waits for the broker's disposition (settled, accepted)
                    sender.send(Message(body=body, properties={"sha256": sha(body)},
                                        durable=False))
                    sent.append(body)
                sender.link.detach()  # RabbitMQ 3.10 answers detach, not close, for links
            receiver = conn.create_receiver(f"/amq/queue/{queue}", credit=50)
            got: list[bytes] = []
            for _ in sent:
                msg = receiver.receive(timeout=15)
                body = bytes(msg.body)
                assert sha(body) == msg.properties["sha256"]
                got.append(body)
                receiver.accept()
            receiver.link.detach()
            assert [sha(b) for b in got] == [sha(b) for b in sent]
        finally:
            conn.close()
        with pika_connection(floodwall.port) as pc:
            left = pc.channel().queue_declare(queue, passive=True).method.message_count
        assert left == 0, "accepted deliveries were not settled at the broker"


def test_proton_queue_source_declares_its_queue(floodwall: ProxyProcess,
                                                broker: BrokerEndpoint) -> None:
    """A /queue/NAME source makes the plugin declare NAME (durable); delivery then works."""
    queue = unique("amqp10-declared")
    conn = _proton(floodwall.port, "PLAIN")
    try:
        receiver = conn.create_receiver(f"/queue/{queue}", credit=5)
        sender = conn.create_sender(f"/queue/{queue}")
        body = payload(300_000, seed=5)  # larger than the negotiated max-frame-size
        sender.send(Message(body=body))
        msg = receiver.receive(timeout=15)
        receiver.accept()
        assert sha(bytes(msg.body)) == sha(body)
    finally:
        conn.close()
        delete_queue(broker, queue)


class _RefusedSource(MessagingHandler):
    """Reactor-API client: attaches a receiver to a queue that does not exist."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__()
        self.url, self.address = url, address
        self.condition: str | None = None
        self.description = ""
        self.timed_out = False

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN")
        event.container.create_receiver(self.conn, self.address)
        self.timer = event.container.schedule(15, self)

    def on_timer_task(self, _event: Any) -> None:
        self.timed_out = True
        self.conn.close()

    def _record(self, endpoint: Any) -> None:
        cond = endpoint.remote_condition
        if cond is not None and self.condition is None:
            self.condition, self.description = cond.name, cond.description or ""
            self.timer.cancel()
            self.conn.close()

    def on_session_error(self, event: Any) -> None:
        self._record(event.session)

    def on_link_error(self, event: Any) -> None:
        self._record(event.link)

    def on_connection_error(self, event: Any) -> None:
        self._record(event.connection)


def test_proton_refused_source_error_is_relayed(floodwall: ProxyProcess) -> None:
    """RabbitMQ 3.10 answers an attach to a missing /amq/queue/ by ending the session with
    amqp:not-found; the error must reach the client intact through the proxy."""
    missing = unique("missing")
    handler = _RefusedSource(f"amqp://guest:guest@127.0.0.1:{floodwall.port}",
                             f"/amq/queue/{missing}")
    Container(handler).run()
    assert not handler.timed_out, "no error came back within 15 s"
    assert handler.condition == "amqp:not-found"
    assert missing in handler.description
