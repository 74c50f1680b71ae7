"""The spool end to end: ``floodwall run --spool-dir`` with ``overflow: spool`` in front of the
real broker; pika producers in confirm mode keep going while their queue is tripped (acked
from the spool), and every message reaches the broker in order per queue -- also across
repeated ``kill -9`` of the proxy (at least once: duplicates are counted and printed)."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    direct_params,
    drain_direct,
    metric_sum,
    numbered,
    pika_params,
    policy_file,
    ready_count,
    seq_of,
    start_flow,
)

pytestmark = pytest.mark.broker

KIB = 1024
FAST = ("--depth-interval", "50ms", "--management-interval", "1s")


def spooled(name: str, queue: str, capacity: str = "32KiB", resume: str = "16KiB",
            group_ms: int = 2) -> str:
    return (f'{{name: {name}, match: {{queue: "{queue}"}}, capacity: {capacity}, '
            f"resume: {resume}, overflow: spool, deadline: 60s, "
            f"spool: {{max_bytes: 256MiB, fsync: group, group_commit_ms: {group_ms}}}}}")


def spool_state(proc: ProxyProcess) -> dict[str, Any]:
    doc = proc.state().get("spool")
    assert isinstance(doc, dict), "no spool section in /state"
    return doc


def declare_through(port: int, *names: str) -> None:
    conn = pika.BlockingConnection(pika_params(port))
    ch = conn.channel()
    for name in names:
        ch.queue_declare(name)
    conn.close()


def test_tripped_queue_spools_acks_and_replays_in_order(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    qa, qb = queues("spool-a"), queues("spool-b")
    flow = start_flow(start_floodwall, broker, policy_file(
        tmp_path / "p.yaml", spooled("a", qa), spooled("b", qb)),
        "--spool-dir", str(tmp_path / "spool"), *FAST)
    declare_through(flow.port, qa, qb)
    wait_for(lambda: flow.policed(qa) and flow.policed(qb), 15, what="queues policed")

    per_queue = 600
    conn = pika.BlockingConnection(pika_params(flow.port))
    ch = conn.channel()
    ch.confirm_delivery()
    started = time.monotonic()
    for i in range(per_queue):
        for q in (qa, qb):
            ch.basic_publish("", q, numbered(i, KIB))  # returns once acked (or raises)
    produced_in = time.monotonic() - started
    # the producer went on: the queues tripped, the rest was spooled and acked from disk
    assert flow.tripped(qa) and flow.tripped(qb)
    text = flow.metrics()
    appended = metric_sum(text, "floodwall_spool_appended_records_total")
    assert appended > per_queue, text
    assert metric_sum(text, "floodwall_spool_records", queue=qa) > 0
    # the broker was protected: about capacity, not 600 KiB, is in each queue
    in_queue = ready_count(broker, qa)
    assert in_queue * KIB < 64 * KIB, (in_queue, flow.log("queue_released"),
                                       flow.log("spool_replay_started"))
    state = spool_state(flow.proc)
    assert state["records"] > 0 and {q["queue"] for q in state["queues"]} >= {qa, qb}

    # consumers drain; the spool replays behind them, in order
    got: dict[str, list[bytes]] = {}

    def drain(q: str) -> None:
        got[q] = drain_direct(broker, q, per_queue, timeout=90)

    threads = [threading.Thread(target=drain, args=(q,)) for q in (qa, qb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for q in (qa, qb):
        assert [seq_of(b) for b in got[q]] == list(range(per_queue)), q
    wait_for(lambda: spool_state(flow.proc)["records"] == 0, 10, what="an empty spool")
    text = flow.metrics()
    assert metric_sum(text, "floodwall_spool_replayed_records_total") == appended
    assert flow.log("spool_replay_started") and flow.log("spool_replay_stopped")
    # once the backlog is gone, publishes go straight to the broker again
    ch.basic_publish("", qa, numbered(per_queue, KIB))
    assert metric_sum(flow.metrics(), "floodwall_spool_appended_records_total") == appended
    conn.close()
    print(f"\n{2 * per_queue} confirmed publishes in {produced_in:.1f}s, "
          f"{int(appended)} of them spooled and replayed")


class Producer(threading.Thread):
    """pika in confirm mode, publishing numbered messages to one queue, reconnecting when
    the proxy dies; a publish that was not acked is published again (the client's part of
    at least once). ``acked`` are the sequence numbers the proxy acknowledged."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True, name="spool-producer")
        self.port, self.queue = port, queue
        self.acked: list[int] = []
        self.reconnects = 0
        self.stop_at: int | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        seq = 0
        deadline = time.monotonic() + 240
        try:
            while not self.done.is_set() and time.monotonic() < deadline:
                try:
                    conn = pika.BlockingConnection(pika_params(self.port, heartbeat=0))
                except pika.exceptions.AMQPError:
                    time.sleep(0.05)  # retry pacing while the proxy restarts
                    continue
                try:
                    ch = conn.channel()
                    ch.confirm_delivery()
                    while not self.done.is_set():
                        ch.basic_publish("", self.queue, numbered(seq, KIB))
                        self.acked.append(seq)
                        seq += 1
                except (pika.exceptions.AMQPError, OSError):
                    self.reconnects += 1  # the proxy died under us: `seq` was not acked
                finally:
                    if conn.is_open:
                        try:
                            conn.close()
                        except Exception:
                            pass
        except BaseException as exc:
            self.error = exc


class Consumer(threading.Thread):
    """Drains the queue at the broker itself, slowly, so trips and replays alternate."""

    def __init__(self, broker: BrokerEndpoint, queue: str) -> None:
        super().__init__(daemon=True, name="spool-consumer")
        self.broker, self.queue = broker, queue
        self.bodies: list[bytes] = []
        self.pause = 0.05  # seconds per message: slower than the producer, the spool grows
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.broker))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            for method, _, body in ch.consume(self.queue, auto_ack=True,
                                              inactivity_timeout=0.1):
                if method is not None:
                    self.bodies.append(body)
                    if self.pause:
                        time.sleep(self.pause)  # pacing: a slow consumer, not a wait
                if self.done.is_set():
                    break
            ch.cancel()
            conn.close()
        except BaseException as exc:
            self.error = exc


@pytest.mark.load_tolerant  # it counts what was lost and reordered, not time or depth
def test_kill_9_mid_spool_loses_nothing_that_was_acked(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    q = queues("spool-kill")
    spool_dir = tmp_path / "spool"
    flow: FlowProxy = start_flow(start_floodwall, broker, policy_file(
        tmp_path / "p.yaml", spooled("k", q, group_ms=5)),
        "--spool-dir", str(spool_dir), *FAST)
    proc = flow.proc
    declare_through(flow.port, q)
    wait_for(lambda: flow.policed(q), 15, what="queue policed")

    producer = Producer(flow.port, q)
    consumer = Consumer(broker, q)
    producer.start()
    consumer.start()
    kills = 4
    rng = random.Random(5)
    spooled_at_kill: list[int] = []
    for kill in range(kills):
        # let this process spool (and replay some) before pulling the plug, with records
        # still in the spool: a kill mid-spool, whatever the producer's and consumer's pace

        def spooling() -> bool:
            text = proc.get("/metrics").decode()
            return (metric_sum(text, "floodwall_spool_appended_records_total") >= 100
                    and metric_sum(text, "floodwall_spool_records") >= 20)

        wait_for(spooling, 60, what=f"100 records spooled and 20 pending before kill "
                                    f"{kill + 1}")
        time.sleep(rng.uniform(0.0, 0.5))  # a random kill moment, not a wait
        # ... with a backlog still there at that moment: a slow consumer may have let the
        # replay drain it meanwhile (then wait for the next backlog).
        def backlog() -> int:
            records = int(spool_state(proc)["records"])
            return records if records >= 20 else 0

        spooled_at_kill.append(int(wait_for(backlog, 60,  # type: ignore[arg-type]
                                            what=f"20 records pending at kill {kill + 1}")))
        assert proc.process is not None
        proc.process.kill()  # SIGKILL: no drain, no flush, no cursor write
        proc.process.wait(10)
        proc.process = None
        time.sleep(rng.uniform(0.0, 0.3))  # a random time down, not a wait
        proc.start()  # same port, same spool directory: recovers and goes on
    # the producer has seen the last kill and publishes through the last proxy again
    acked_at_last_kill = len(producer.acked)
    wait_for(lambda: producer.reconnects >= kills
             and len(producer.acked) >= acked_at_last_kill + 50, 60,
             what="the producer acked through the last proxy")
    producer.done.set()
    producer.join(30)
    consumer.pause = 0.0
    assert producer.error is None, producer.error
    acked = producer.acked
    assert len(acked) > 200 and producer.reconnects >= kills
    # the last proxy replays everything left; the consumer takes it all
    wait_for(lambda: spool_state(proc)["records"] == 0, 120, what="the spool to empty")
    wait_for(lambda: ready_count(broker, q) == 0 and len(consumer.bodies) >= len(acked),
             60, what="the consumer to catch up")
    wait_for(lambda: set(producer.acked) <= {seq_of(b) for b in list(consumer.bodies)}, 60,
             what="every acked publish delivered to the consumer")
    consumer.done.set()
    consumer.join(30)
    assert consumer.error is None, consumer.error
    seqs = [seq_of(b) for b in consumer.bodies]
    counts = Counter(seqs)
    missing = sorted(set(acked) - set(counts))
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    first_seen = list(dict.fromkeys(seqs))
    print(f"\nkill -9 x{kills}: {len(acked)} publishes acked, {len(seqs)} delivered, "
          f"{duplicates} duplicates ({sum(1 for n in counts.values() if n > 1)} messages), "
          f"{len(set(counts) - set(acked))} delivered but never acked (retried by the "
          f"client), spool records at each kill: {spooled_at_kill}")
    assert not missing, f"acked but never delivered: {missing[:20]} ({len(missing)})"
    inversions = [(a, b) for a, b in itertools.pairwise(first_seen) if b < a]
    assert not inversions, f"first deliveries out of order: {inversions[:10]}"
    recovered = flow.log("spool_recovered")
    assert len(recovered) >= kills  # each restart found a spool to recover
    assert min(spooled_at_kill) >= 20  # every kill hit a spool with a backlog


@pytest.mark.timeout(180)
def test_a_message_over_the_brokers_max_message_size_is_held_not_spooled(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    """With the queue tripped, a message larger than ``--spool-max-message`` (the broker's
    max_message_size) is not spooled and acked (the broker would refuse it at replay): it is
    held, counted, and goes to the broker when the queue is released; the small ones around
    it are spooled as before, and every message arrives."""
    q = queues("spool-big")
    flow = start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml", spooled("b", q)),
                      "--spool-dir", str(tmp_path / "spool"), "--spool-max-message", "64KiB",
                      *FAST)
    declare_through(flow.port, q)
    wait_for(lambda: flow.policed(q), 15, what="queue policed")
    big = numbered(10_000, 96 * KIB)
    acked: list[int] = []

    def produce() -> None:
        conn = pika.BlockingConnection(pika_params(flow.port, heartbeat=0))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(100):  # 100 KiB into a 32 KiB queue: tripped, the rest spooled
            ch.basic_publish("", q, numbered(i, KIB))
            acked.append(i)
        ch.basic_publish("", q, big)  # held: answered once the broker has it
        acked.append(10_000)
        conn.close()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_for(lambda: metric_sum(flow.metrics(), "floodwall_spool_full_total",
                                reason="message_size") == 1, 60,
             what="the big message refused by the spool")
    assert 10_000 not in acked  # not acked from the spool
    assert flow.held()["messages"] == 1
    got = drain_direct(broker, q, 101, timeout=90)
    producer.join(30)
    assert acked[-1] == 10_000
    assert sorted(seq_of(b) for b in got) == [*range(100), 10_000]
    assert big in got
