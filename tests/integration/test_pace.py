"""Pace against the real broker: a held queue's publishers are admitted at the rate its
consumers take (not released in capacity-sized bursts per sample), and when the consumers stop
dead the queue stays within 256 KiB of its capacity.

The producer publishes through ``floodwall run``; the consumer (pika, prefetch 200, an ack per
message) and the depth watch (passive declares every 50 ms) go straight to the broker.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.support import (
    DepthWatch,
    capped,
    direct_params,
    drain_direct,
    flow_with,
    numbered,
    seq_of,
)

KIB = 1024
CAPACITY = 256 * KIB
OVER = 256 * KIB  # the flow control's bound: broker-side depth never more than this over capacity
# (a capacity counts ready messages, not the consumer's 200 unacknowledged ones:
# docs/design/pace.md, "What capacity counts")
PREFETCH = 200


class Consumer(threading.Thread):
    """pika straight at the broker: prefetch 200, an ack per message; ``stop_after`` > 0 stops
    acking (and taking) after that many, the channel left open (a consumer stopped dead)."""

    def __init__(self, broker: BrokerEndpoint, queue: str, total: int, stop_after: int = 0
                 ) -> None:
        super().__init__(daemon=True)
        self.broker, self.queue, self.total, self.stop_after = broker, queue, total, stop_after
        self.seqs: list[int] = []
        self.stopped = threading.Event()
        self.finish = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.broker))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=PREFETCH)
            for method, _, body in ch.consume(self.queue, inactivity_timeout=0.2):
                if self.finish.is_set():
                    break
                if method is None or self.stopped.is_set():
                    continue
                self.seqs.append(seq_of(body))
                if self.stop_after and len(self.seqs) >= self.stop_after:
                    self.stopped.set()  # no ack: these stay unacknowledged
                    continue
                ch.basic_ack(method.delivery_tag)
                if len(self.seqs) >= self.total:
                    break
            conn.close()
        except BaseException as exc:
            self.error = exc


def produce(port: int, queue: str, count: int) -> threading.Thread:
    """pika through the proxy, no confirms, as fast as it goes (a thread)."""
    def run() -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, connection_attempts=1, socket_timeout=30))
        ch = conn.channel()
        for i in range(count):
            ch.basic_publish("", queue, numbered(i))
        conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def held_flow(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path, q: str) -> Any:
    flow = flow_with(start_floodwall, broker, tmp_path, capped("pace", q, "256KiB", "128KiB"))
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(q)
    wait_for(lambda: flow.policed(q), 20, what="policed")
    return flow


@pytest.mark.timeout(180)
def test_a_held_queue_admits_its_publishers_at_its_consumers_pace(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """5,000 x 1 KiB through the proxy into a 256 KiB queue with a live consumer: the queue
    trips and stays held while its publishers are admitted as it drains (a few trips, not
    one per 256 KiB released), counted at the hot interval, never more than 256 KiB over."""
    q = queues("pace")
    count = 5000
    flow = held_flow(start_floodwall, broker, tmp_path, q)
    consumer = Consumer(broker, q, count)
    consumer.start()
    watch = DepthWatch(broker, flow, q)
    watch.start()
    before = flow.metric("floodwall_queue_depth_samples_total", queue=q)
    started = time.monotonic()
    producer = produce(flow.port, q, count)
    try:
        consumer.join(150)
        producer.join(10)
    finally:
        consumer.finish.set()
        watch.stop()
    seconds = time.monotonic() - started
    assert consumer.error is None and watch.error is None
    assert consumer.seqs == list(range(count)), "lost or reordered"
    state = flow.queue_state(q)
    assert state is not None
    trips = state["trips"]
    counts = flow.metric("floodwall_queue_depth_samples_total", queue=q) - before
    print(f"pace: {trips} trips, {counts:.0f} counts in {seconds:.2f} s, "
          f"max ready {watch.max_ready}")
    assert trips >= 1
    # Released in bursts, a release would let at most capacity - resume + one
    # message go: 5,000 KiB through a 256 KiB queue with resume 128 KiB would take >= 39 trips.
    assert trips <= 5, f"{trips} trips: held publishers left in bursts, not admitted"
    # hot: counted far more often than every 200 ms (the cold interval) over the run
    assert counts > 10 * seconds / 0.2, f"{counts:.0f} counts in {seconds:.2f} s"
    assert watch.max_ready * KIB <= CAPACITY + OVER


@pytest.mark.timeout(180)
def test_a_consumer_that_stops_dead_leaves_the_queue_within_bound(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """The consumer stops dead (no more acks) after 1,000 messages while the producer goes on
    at full speed: the queue stays within 256 KiB of its capacity (ready: the 200 left
    unacknowledged are the consumer's), the rest is held at the proxy, and nothing is lost."""
    q = queues("stop")
    count = 3000
    flow = held_flow(start_floodwall, broker, tmp_path, q)
    consumer = Consumer(broker, q, count, stop_after=1000)
    consumer.start()
    watch = DepthWatch(broker, flow, q)
    watch.start()
    producer = produce(flow.port, q, count)
    try:
        assert consumer.stopped.wait(120), "the consumer never took 1,000"
        wait_for(lambda: flow.tripped(q) and flow.held()["messages"] > 0, 30,
                 what="held at the proxy")
        time.sleep(1.0)  # (the producer goes on; anything still on its way shows in the watch)
    finally:
        watch.stop()
        consumer.finish.set()
        consumer.join(10)
    assert consumer.error is None and watch.error is None
    print(f"stopped: max ready {watch.max_ready}, held {flow.held()}")
    assert watch.max_ready * KIB <= CAPACITY + OVER
    # the consumer's connection is closed: its unacknowledged ones are ready again; the rest
    # reaches the broker as the queue is drained
    landed = drain_direct(broker, q, count - 999, timeout=90)  # 999 were acked
    producer.join(30)
    assert sorted(set(seq_of(b) for b in landed) | set(consumer.seqs)) == list(range(count))
