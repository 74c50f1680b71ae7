"""Flow control end to end: a real ``floodwall run --policies --management`` in front
of the real broker, real clients (pika, aio-pika, kombu, amqplib, the RabbitMQ Java client).

Depth at the broker is watched from a direct connection (passive declare every 50 ms, and
the management API's ``message_bytes``), never trusted from the proxy.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pytest
from pamqp.commands import Basic

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.support import (
    DepthWatch,
    FlowProxy,
    capped,
    direct_params,
    drain_direct,
    flow_with,
    metric_sum,
    numbered,
    pika_connection,
    ready_count,
    seq_of,
)

pytestmark = pytest.mark.broker

KIB = 1024
CAPACITY = 64 * KIB
TARGET = CAPACITY + 256 * KIB  # the bound: never more than 256 KiB over capacity


def declare(flow: FlowProxy, *names: str) -> None:
    """Declare through the proxy; wait for the first depth sample of the capped ones."""
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name)
    for name in names:
        if name.startswith("fw-it-cap-"):  # queues("cap-...") are the policed ones
            wait_for(lambda name=name: flow.policed(name), 15, what=f"{name} policed")


class Watch(DepthWatch):
    """Broker-side depth of one queue every 50 ms, and the proxy's view every 250 ms (from its
    metrics: the most publishes held, whether the queue tripped)."""

    def __init__(self, broker: BrokerEndpoint, flow: FlowProxy, queue: str) -> None:
        super().__init__(broker, flow, queue)
        self.max_held = 0

    def sample_proxy(self) -> None:
        text = self.flow.metrics()
        self.max_held = max(self.max_held, int(metric_sum(text, "floodwall_held_messages")))
        if metric_sum(text, "floodwall_queue_tripped", queue=self.queue) > 0:
            self.tripped_seen = True


class Worker(threading.Thread):
    """A function in a thread; ``result()`` re-raises what it raised."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        super().__init__(daemon=True, name=name)
        self._target_fn = target
        self.error: BaseException | None = None
        self.value: Any = None

    def run(self) -> None:
        try:
            self.value = self._target_fn()
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float) -> Any:
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still running after {timeout}s"
        if self.error is not None:
            raise AssertionError(f"{self.name} failed: {self.error!r}") from self.error
        return self.value


def paced(rate: float) -> Callable[[], None]:
    """Sleep to keep ``rate`` calls a second; after a hold-up, no burst to catch up."""
    due = time.monotonic()

    def wait() -> None:
        nonlocal due
        now = time.monotonic()
        if now - due > 0.1:
            due = now
        if due > now:
            time.sleep(due - now)  # pacing a producer at ``rate``, not a wait
        due += 1 / rate

    return wait


# -- 1. the founding scenario with pika ------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("confirm", [False, True], ids=["no-confirms", "confirms"])
def test_seed_scenario_pika(broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path,
                            queues: Any, confirm: bool) -> None:
    """Producer at 100 msg/s of 1 KiB, consumer at 15 msg/s, capacity 64 KiB / resume 32 KiB:
    the broker never holds more than capacity + 256 KiB, and every message arrives once."""
    queue = queues("cap-seed")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("seed", queue))
    declare(flow, queue)
    duration = 12.0
    sent: list[int] = []
    got: list[int] = []
    produced = threading.Event()
    fast = threading.Event()
    stop = threading.Event()

    def produce() -> None:
        with pika_connection(flow.port) as conn:
            ch = conn.channel()
            if confirm:
                ch.confirm_delivery()
            wait = paced(100)
            end = time.monotonic() + duration
            seq = 0
            while time.monotonic() < end:
                wait()
                ch.basic_publish("", queue, numbered(seq),
                                 pika.BasicProperties(message_id=str(seq)))
                sent.append(seq)
                seq += 1
            produced.set()
        # (closing waits for the held publishes: the channel close queues behind them)

    def consume() -> None:
        with pika_connection(flow.port) as conn:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=10)
            wait = paced(15)
            for method, _, body in ch.consume(queue, inactivity_timeout=0.05):
                if stop.is_set():
                    break
                if method is None:
                    continue
                if not fast.is_set():
                    wait()
                got.append(seq_of(body))
                ch.basic_ack(method.delivery_tag)
            ch.cancel()

    watch = Watch(broker, flow, queue)
    watch.start()
    consumer = Worker(consume, "consumer")
    producer = Worker(produce, "producer")
    consumer.start()
    producer.start()
    try:
        wait_for(produced.is_set, duration + 15, 0.1, "the producer's last publish")
        during = len(got)
        fast.set()
        wait_for(lambda: len(got) >= len(sent), 60, 0.1,
                 f"all {len(sent)} messages at the consumer")
        producer.result(30)
        # nothing more arrives: the queue is empty and nothing is held
        wait_for(lambda: flow.held()["messages"] == 0, 10, what="nothing held")
        assert ready_count(broker, queue) == 0
    finally:
        stop.set()
        watch.stop()
    consumer.result(10)

    print(f"seed(confirm={confirm}): sent {len(sent)}, consumed while producing {during}, "
          f"max ready {watch.max_ready}, max message_bytes {watch.max_message_bytes}, "
          f"max held {watch.max_held}")
    assert watch.samples > 100
    assert watch.max_ready * KIB <= TARGET, (
        f"broker held {watch.max_ready} KiB messages, over {TARGET // KIB} KiB")
    assert watch.max_message_bytes <= TARGET, watch.max_message_bytes
    assert flow.metric("floodwall_queue_trips_total", queue=queue) > 0
    assert watch.tripped_seen, "never saw floodwall_queue_tripped at 1"
    assert watch.max_held > 0, "never saw a held publish"
    assert 10 * 15 * 0.5 < during < 12 * 15 * 1.5 + 64, f"consumer pace off: {during}"
    assert len(got) == len(sent) and sorted(got) == sent, "lost or duplicated messages"
    if confirm:  # the producer waited for its confirms: slowed to the consumer's pace
        assert len(sent) < 0.5 * 100 * duration, len(sent)
    else:  # it never waited: the proxy held the difference
        assert len(sent) > 0.8 * 100 * duration, len(sent)
        assert watch.max_held > 300


# -- 2. one connection, a capped channel, a free channel and a consumer --------------------
@pytest.mark.timeout(90)
def test_held_channel_does_not_slow_its_neighbours(broker: BrokerEndpoint,
                                                   start_floodwall: Any, tmp_path: Path,
                                                   queues: Any) -> None:
    """Channel A held on a tripped queue; channel B (confirms) of the same connection keeps
    publishing to a free queue, every publish confirmed, and a consumer on the same
    connection keeps consuming. (B's rate against a free connection is a benchmark figure:
    bench/two_senders.py; it is printed here, not asserted.)"""
    qa, qb, qc = queues("cap-a"), queues("free-b"), queues("free-c")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("a", qa))
    declare(flow, qa, qb, qc)
    with pika.BlockingConnection(direct_params(broker)) as direct:
        ch = direct.channel()
        for i in range(12000):
            ch.basic_publish("", qc, numbered(i, 64))
    consumed: list[int] = []
    rounds, n_b = 4, 150
    seq = 0

    with pika_connection(flow.port) as conn, pika_connection(flow.port) as control:
        ch_a = conn.channel()
        ch_b = conn.channel()
        ch_b.confirm_delivery()
        ch_c = conn.channel()
        ch_c.basic_qos(prefetch_count=10)
        ch_control = control.channel()
        ch_control.confirm_delivery()

        def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
            consumed.append(seq_of(body))
            ch.basic_ack(method.delivery_tag)

        ch_c.basic_consume(qc, on_message)

        def one_round(channel: Any) -> float:
            """Confirmed publishes a second, one round; C's deliveries dispatched as we go."""
            nonlocal seq
            t0 = time.monotonic()
            for _ in range(n_b):
                channel.basic_publish("", qb, numbered(seq))  # raises unless acked
                seq += 1
                if seq % 10 == 0:
                    conn.process_data_events(0)
            return n_b / (time.monotonic() - t0)

        def compare() -> tuple[float, float]:
            """Best of alternating rounds on B and on the control connection (2 cores:
            noise hits both alike)."""
            b = [0.0]
            c = [0.0]
            for _ in range(rounds):
                b.append(one_round(ch_b))
                c.append(one_round(ch_control))
            return max(b), max(c)

        before_b, before_control = compare()
        try:
            # trip A: 100 KiB into a 64 KiB queue nobody consumes
            for i in range(100):
                ch_a.basic_publish("", qa, numbered(i))
            wait_for(lambda: flow.tripped(qa) and flow.held()["messages"] > 0, 10,
                     what="A tripped and held")
            held_before = flow.held()["messages"]
            consumed_before = len(consumed)
            blocked = flow.blocked_channels()
            assert [b["channel"] for b in blocked] == [ch_a.channel_number], blocked
            t0 = time.monotonic()
            held_b, held_control = compare()
            took = time.monotonic() - t0
            conn.process_data_events(0.2)
            print(f"B: {before_b:.0f}/s (control {before_control:.0f}/s) before A was held, "
                  f"{held_b:.0f}/s (control {held_control:.0f}/s) while A held")
            # A was held throughout (a few of its publishes may be admitted as the count
            # shows room below capacity); B's publishes all landed; C kept consuming
            assert 0 < flow.held()["messages"] <= held_before
            assert flow.tripped(qa)
            assert [b["channel"] for b in flow.blocked_channels()] == [ch_a.channel_number]
            assert ready_count(broker, qb) == seq
            published = 2 * rounds * n_b
            delivered = len(consumed) - consumed_before
            print(f"{published} confirmed publishes took {took:.1f}s; C got {delivered}")
            # C's deliveries are dispatched inside this loop's publishes (pika runs its
            # callbacks there), so a C that kept pace gets about one per publish (measured
            # 1.0-1.4); a connection stalled behind A's held publishes would get ~none.
            # (Not a rate against the phase before: pika's batching makes that one vary 3x.)
            assert delivered >= 0.5 * published, (published, delivered)
        finally:  # release A (its held publishes follow), whatever failed
            landed = drain_direct(broker, qa, 100, timeout=30)
        assert sorted(map(seq_of, landed)) == list(range(100)), "A's publishes lost or doubled"
        wait_for(lambda: flow.held()["messages"] == 0, 10, what="A's held publishes gone")
        # (admitted while held: the channel's hold ends at the queue's release, at
        # the first count that finds its tokens unused)
        wait_for(lambda: not flow.blocked_channels(), 10, what="A released")
        ch_a.basic_publish("", qa, numbered(100))  # A's channel works on
        conn.process_data_events(0.1)
    assert consumed == list(range(len(consumed)))
    assert len(drain_direct(broker, qa, 1, timeout=10)) == 1


# -- 3. clients that break on Channel.Flow, one that honours it, one that tolerates it ------
def _trip_by_broker(broker: BrokerEndpoint, flow: FlowProxy, queue: str) -> None:
    """Wait for ``queue`` to trip with some publishes held at the proxy."""
    wait_for(lambda: flow.tripped(queue) and flow.held()["messages"] > 0, 15,
             what=f"{queue} tripped with publishes held")
    assert ready_count(broker, queue) * KIB <= TARGET


@pytest.mark.timeout(60)
def test_aio_pika_is_held_not_signalled(broker: BrokerEndpoint, start_floodwall: Any,
                                        tmp_path: Path, queues: Any) -> None:
    queue, other = queues("cap-aio"), queues("free-aio")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("aio", queue))
    declare(flow, queue)

    async def scenario() -> None:
        url = f"amqp://guest:guest@127.0.0.1:{flow.port}/"
        async with await aio_pika.connect(url, timeout=10) as conn:
            ch = await conn.channel(publisher_confirms=True)
            tasks = [asyncio.ensure_future(ch.default_exchange.publish(
                aio_pika.Message(numbered(i), message_id=str(i)), routing_key=queue))
                for i in range(150)]
            deadline = time.monotonic() + 15
            while not (flow.tripped(queue) and flow.held()["messages"] > 0):
                assert time.monotonic() < deadline, "never tripped"
                await asyncio.sleep(0.05)
            # every publish either confirmed or waiting at the proxy: none lost in between
            deadline = time.monotonic() + 15
            while sum(1 for t in tasks if not t.done()) != flow.held()["messages"]:
                assert time.monotonic() < deadline, "pending confirms never matched held"
                await asyncio.sleep(0.05)
            pending = [t for t in tasks if not t.done()]
            assert 0 < len(pending) < 150  # waiting, not failed
            # the connection is healthy: an RPC on another channel answers at once
            ch2 = await conn.channel()
            await asyncio.wait_for(ch2.declare_queue(other), 5)
            await ch2.close()
            landed = await asyncio.to_thread(drain_direct, broker, queue, 150, 30)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 20)
            assert all(isinstance(r, Basic.Ack) for r in results), results
            assert sorted(map(seq_of, landed)) == list(range(150))
            await ch.close()

    asyncio.run(asyncio.wait_for(scenario(), 50))
    assert flow.metric("floodwall_flow_signals_total") == 0


@pytest.mark.timeout(60)
def test_amqplib_is_held_not_signalled(broker: BrokerEndpoint, start_floodwall: Any,
                                       tmp_path: Path, queues: Any,
                                       node_producer: Any) -> None:
    queue = queues("cap-node")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("node", queue))
    declare(flow, queue)
    client = node_producer("127.0.0.1", flow.port, queue, count=300, rate=0, body_size=1024,
                           confirm=True)
    client.wait_event("ready", timeout=20)
    _trip_by_broker(broker, flow, queue)
    # observation window for a negative claim, not a wait: 0.5 s is what a broken client
    # would need to fail, and nothing must happen in it
    time.sleep(0.5)
    assert not client.of("error") and client.returncode is None, client.describe()
    assert flow.tripped(queue)
    landed = drain_direct(broker, queue, 300, timeout=40)
    done = client.finish(timeout=20)
    assert done["published"] == 300 and done["confirmed"] is True
    assert sorted(map(seq_of, landed)) == list(range(300))
    assert flow.metric("floodwall_flow_signals_total") == 0


@pytest.mark.timeout(90)
def test_java_client_is_signalled_and_pauses(broker: BrokerEndpoint, start_floodwall: Any,
                                             tmp_path: Path, queues: Any,
                                             java_producer: Any) -> None:
    queue = queues("cap-java")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("java", queue))
    declare(flow, queue)
    count = 400
    client = java_producer("127.0.0.1", flow.port, queue, count=count, rate=200,
                           body_size=1024, confirm=True)
    client.wait_event("ready", timeout=30)
    off = client.wait_event("flow", active=False, timeout=20)
    assert flow.metric("floodwall_flow_signals_total", protocol="amqp091", active="false") >= 1
    assert flow.tripped(queue)
    # it really pauses: its published count stops growing while the queue stays tripped
    def stopped() -> Any:  # two progress reports under flow off, the count unchanged
        reports = client.of("progress")
        return (len(reports) >= 2 and reports[-2]["flow_active"] is False
                and reports[-1]["published"] == reports[-2]["published"] and reports[-1])

    before = wait_for(stopped, 10, what="the producer's count to stop under flow off"
                      )["published"]
    time.sleep(1.5)  # observation window for a negative claim: the count must not grow
    after = client.last("progress")
    assert after["published"] == before, (before, after)
    assert after["flow_active"] is False and after["published"] < count
    assert flow.tripped(queue)
    landed = drain_direct(broker, queue, count, timeout=40)
    client.wait_event("flow", active=True, timeout=10)
    done = client.finish(timeout=30)
    assert done["published"] == count
    assert done["blocked_ms"] >= 1000, done
    assert client.of("unblocked"), "no publish reported waiting on Channel.Flow"
    assert off["published"] < count
    assert sorted(map(seq_of, landed)) == list(range(count))
    assert flow.metric("floodwall_flow_signals_total", active="true") >= 1


@pytest.mark.timeout(60)
def test_kombu_is_signalled_and_held(broker: BrokerEndpoint, start_floodwall: Any,
                                     tmp_path: Path, queues: Any) -> None:
    queue = queues("cap-kombu")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("kombu", queue))
    declare(flow, queue)
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{flow.port}//",
                          connect_timeout=10) as conn:
        producer = conn.Producer(serializer="raw")
        for i in range(150):
            producer.publish(numbered(i), routing_key=queue, exchange="")
        _trip_by_broker(broker, flow, queue)
        wait_for(lambda: flow.metric("floodwall_flow_signals_total", active="false") >= 1, 5,
                 what="py-amqp signalled")
        held = flow.held()["messages"]
        assert 0 < held < 150
        landed = drain_direct(broker, queue, 150, timeout=30)
        assert sorted(map(seq_of, landed)) == list(range(150))
        # py-amqp answers the proxy's flow frames (absorbed); its channel works on
        wait_for(lambda: flow.metric("floodwall_flow_signals_total", active="true") >= 1, 5,
                 what="flow on again")
        channel = conn.default_channel
        channel.queue_declare(queue, passive=True)
        producer.publish(numbered(150), routing_key=queue, exchange="")
        channel.queue_declare(queue, passive=True)
    assert len(drain_direct(broker, queue, 1, timeout=10)) == 1
