"""The process-wide memory budget, through a real ``floodwall run --policies``:
many producers without confirms publishing 64 KiB messages to a tripped queue
(``overflow: hold``) stop being read once held bytes of all of them reach
``--memory-budget``, while another connection keeps publishing and consuming; the clients
leave, their held publishes are still delivered, and the memory is given back.

Before the budget each connection stopped only at its own hold budget, so together they
held (producers x hold budget) and the RSS followed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pika
import psutil
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.support import (
    Raw091,
    capped,
    direct_params,
    flow_with,
    pika_connection,
    ready_count,
)

pytestmark = pytest.mark.broker

KIB, MIB = 1024, 1024 * 1024
SIZE = 64 * KIB
PRODUCERS = 12
BUDGET = 8 * MIB
HOLD_BUDGET = 8 * MIB  # per connection: 12 x 8 MiB = 96 MiB without the process budget
#: One read (256 KiB) and one frame (128 KiB) per holding connection past the budget.
BOUND = BUDGET + PRODUCERS * (256 + 128) * KIB


def body(producer: int, seq: int) -> bytes:
    return f"{producer:03d}{seq:010d}".encode().ljust(SIZE, b"m")


def produce(port: int, queue: str, producer: int, stop: threading.Event,
            sent: list[int]) -> None:
    """Publish numbered 64 KiB messages without confirms until ``stop``, then leave."""
    raw = Raw091.connect(port)
    try:
        raw.handshake(name=f"mem-{producer}")
        raw.send_frame(commands.Channel.Open(), 1)
        raw.expect(commands.Channel.OpenOk)
        raw.sock.settimeout(0.2)
        seq = 0
        while not stop.is_set():
            data = body(producer, seq)
            one = memoryview(
                frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                + frame.marshal(pamqp_header.ContentHeader(0, len(data),
                                                           commands.Basic.Properties()), 1)
                + frame.marshal(pamqp_body.ContentBody(data), 1))
            offset = 0
            while offset < len(one) and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    offset += raw.sock.send(one[offset:])
            if offset == len(one):
                seq += 1
                sent[producer] = seq
    finally:
        raw.close()


def drain_all(broker: BrokerEndpoint, flow: Any, queue: str, timeout: float = 120
              ) -> list[bytes]:
    """Consume (acking each) straight from the broker until the proxy holds nothing and the
    queue is empty: the proxy releases what it held as the queue drains."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        for method, _, data in ch.consume(queue, inactivity_timeout=0.5):
            if method is not None:
                got.append(data)
                ch.basic_ack(method.delivery_tag)
                continue
            if not flow.held()["bytes"] and not ready_count(broker, queue):
                break
            assert time.monotonic() < deadline, f"still held: {flow.held()}"
        ch.cancel()  # nothing is lost: unacked deliveries go back
    return got


def rss(proc: Any) -> int:
    return int(psutil.Process(proc.proc.process.pid).memory_info().rss)


@pytest.mark.timeout(180)
def test_memory_budget_bounds_held_bytes_of_all_connections(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q, free = queues("membudget"), queues("memfree")
    with pika_connection(broker.amqp_port) as conn:  # straight to the broker
        ch = conn.channel()
        ch.queue_declare(q)
        ch.queue_declare(free)
    flow = flow_with(start_floodwall, broker, tmp_path,
                     capped("mem", q, capacity="1MiB", resume="512KiB", deadline="10m"),
                     args=("--memory-budget", "8MiB", "--hold-budget", "8MiB"))
    started = flow.log("started")[0]
    assert f"memory_budget={BUDGET}" in started and "memory_budget_from=--memory-budget" \
        in started
    with pika_connection(broker.amqp_port) as conn:  # trip it at the broker: 2 MiB
        ch = conn.channel()
        for i in range(32):
            ch.basic_publish("", q, body(999, i))
    wait_for(lambda: flow.tripped(q), 20, what=f"{q} tripped")
    rss_before = rss(flow)

    stop = threading.Event()
    sent = [0] * PRODUCERS
    threads = [threading.Thread(target=produce, args=(flow.port, q, i, stop, sent),
                                daemon=True) for i in range(PRODUCERS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: flow.metric("floodwall_memory_budget_reached") == 1, 30,
                 what="the memory budget reached")
        peak_held = peak_rss = 0
        for _ in range(20):  # an observation window: the bound must hold throughout
            peak_held = max(peak_held, flow.held()["bytes"])
            peak_rss = max(peak_rss, rss(flow))
            time.sleep(0.1)
        print(f"budget {BUDGET}: held peak {peak_held}, bound {BOUND}; RSS "
              f"{rss_before / MIB:.1f} -> {peak_rss / MIB:.1f} MiB")
        assert BUDGET <= peak_held <= BOUND
        assert peak_rss - rss_before < BOUND + 24 * MIB  # without the budget: + 96 MiB
        assert flow.metric("floodwall_memory_budget_paused_connections") >= 1
        assert flow.log("memory_budget_reached")
        # connections that hold nothing keep being read: publish with confirms, consume
        with pika_connection(flow.port) as other:
            ch = other.channel()
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish("", free, body(500, i))
            got = [ch.basic_get(free, auto_ack=True)[2] for _ in range(20)]
        assert got == [body(500, i) for i in range(20)]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    # the clients left: what the proxy held for them stays held, counted, and is delivered
    time.sleep(0.5)
    held_when_gone = flow.held()
    assert held_when_gone["bytes"] >= BUDGET * 7 // 8
    assert flow.metric("floodwall_memory_budget_reached") == 1
    got_bodies = drain_all(broker, flow, q)
    seqs: dict[int, list[int]] = {}
    for b in got_bodies:
        seqs.setdefault(int(b[:3]), []).append(int(b[3:13]))
    assert seqs.pop(999) == list(range(32))
    for producer, numbers in seqs.items():  # in order, none missing in between
        assert numbers == list(range(len(numbers))), producer
        assert sent[producer] - 2 <= len(numbers) <= sent[producer] + 1
    assert sum(len(n) for n in seqs.values()) >= held_when_gone["messages"]
    wait_for(lambda: flow.metric("floodwall_memory_budget_reached") == 0, 10,
             what="the budget let go")
    assert flow.metric("floodwall_memory_budget_paused_connections") == 0
    # the memory is given back (malloc_trim after the held bytes fell)
    wait_for(lambda: rss(flow) < rss_before + 8 * MIB, 10,
             what=f"RSS back near {rss_before / MIB:.1f} MiB")
