"""The clients a platform team runs, through floodwall: amqp091-go (Go), Bunny (Ruby),
php-amqplib (PHP) and rabbitmq-c (C), each a real program from tests/clients/.

1. Held within the bound: each publishes 1,500 x 1 KiB as fast as it can (with and without
   publisher confirms) through floodwall into a queue capped at 256 KiB that a slow consumer
   drains from the broker itself. The broker never holds more than capacity + 256 KiB (the
   project's promise; the peak is printed), every message arrives once and in order, the
   client ends cleanly. Under ``signal: auto`` the clients that tolerate Channel.Flow (Go,
   PHP) are signalled and the others (Bunny breaks on it; rabbitmq-c leaves it to the
   application) are only held.
2. The Channel.Flow trial (docs/design/clients.md, the client table): a policy with ``signal:
   flow`` sends each client a Channel.Flow(active=false) when the queue trips, and the test
   checks what the client does with it while the queue stays full for 1.5 s.

Depth at the broker is watched from a direct connection (tests/integration/support.py's
DepthWatch), never trusted from the proxy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from tests.clients.harness import ForeignClient
from tests.conftest import wait_for
from tests.integration.support import (
    DepthWatch,
    FlowProxy,
    capped,
    direct_params,
    flow_with,
    pika_connection,
    ready_count,
    seq_of,
)

pytestmark = pytest.mark.broker

KIB = 1024
CAPACITY = 256 * KIB
TARGET = CAPACITY + 256 * KIB  # the promise: never more than 256 KiB over capacity
COUNT = 1500
CONSUMER_RATE = 400  # messages a second: the producers are far faster

# Which clients floodwall signals under ``signal: auto`` (floodwall/enforce/amqp091/clients.py).
SIGNALLED = {"go": True, "php": True, "ruby": False, "c": False}
KINDS = sorted(SIGNALLED)

Starter = Callable[..., ForeignClient]


@pytest.fixture
def producer(request: pytest.FixtureRequest) -> Callable[[str], Starter]:
    """``producer(kind)``: the starter fixture of that client (go, ruby, php or c)."""

    def starter(kind: str) -> Starter:
        start: Starter = request.getfixturevalue(f"{kind}_producer")
        return start

    return starter


class SlowConsumer(threading.Thread):
    """Consumes ``queue`` on the broker itself at ``rate`` a second (prefetch 20, manual
    acks) until ``count`` messages came or it is stopped; ``seqs`` in arrival order."""

    def __init__(self, broker: BrokerEndpoint, queue: str, count: int, rate: float) -> None:
        super().__init__(daemon=True, name=f"consumer-{queue}")
        self.broker, self.queue, self.count, self.rate = broker, queue, count, rate
        self.seqs: list[int] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.broker))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)
            due = time.monotonic()
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=0.05):
                if self.stopping.is_set() or len(self.seqs) >= self.count:
                    break
                if method is None:
                    continue
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)  # pacing the consumer at its rate, not a wait
                due = max(due, now) + 1 / self.rate
                self.seqs.append(seq_of(body))
                ch.basic_ack(method.delivery_tag)
            ch.cancel()
            conn.close()
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self, timeout: float) -> list[int]:
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} still running after {timeout}s"
        if self.error is not None:
            raise AssertionError(f"consumer failed: {self.error!r}") from self.error
        return self.seqs


def _capped_flow(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path, queue: str,
                 **fields: str) -> FlowProxy:
    flow = flow_with(start_floodwall, broker, tmp_path,
                     capped("platform", queue, capacity="256KiB", resume="128KiB", **fields))
    with pika_connection(flow.port) as conn:
        conn.channel().queue_declare(queue)
    wait_for(lambda: flow.policed(queue), 15, what=f"{queue} policed")
    return flow


@pytest.fixture
def consumers() -> Iterator[Callable[..., SlowConsumer]]:
    """``consumer(broker, queue, count, rate)``: a started SlowConsumer, stopped afterwards."""
    started: list[SlowConsumer] = []

    def start(broker: BrokerEndpoint, queue: str, count: int, rate: float) -> SlowConsumer:
        started.append(SlowConsumer(broker, queue, count, rate))
        started[-1].start()
        return started[-1]

    yield start
    for consumer in started:
        consumer.stopping.set()
        consumer.join(10)


# -- 1. held within the bound, nothing lost, no client error ----------------------------------
@pytest.mark.timeout(150)
@pytest.mark.parametrize("confirm", [False, True], ids=["no-confirms", "confirms"])
@pytest.mark.parametrize("kind", KINDS)
def test_held_within_the_bound(broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path,
                               queues: Any, producer: Callable[[str], Starter],
                               consumers: Callable[..., SlowConsumer], kind: str,
                               confirm: bool) -> None:
    queue = queues(f"cap-{kind}")
    flow = _capped_flow(start_floodwall, broker, tmp_path, queue)
    watch = DepthWatch(broker, flow, queue)
    watch.start()
    consumer = consumers(broker, queue, COUNT, CONSUMER_RATE)
    client = producer(kind)("127.0.0.1", flow.port, queue, count=COUNT, body_size=KIB,
                            confirm=confirm)
    try:
        client.wait_event("ready", timeout=60)
        done = client.finish(timeout=120)
        wait_for(lambda: len(consumer.seqs) >= COUNT or not consumer.is_alive(), 90, 0.1,
                 f"all {COUNT} messages at the consumer")
        wait_for(lambda: flow.held()["messages"] == 0, 10, what="nothing held")
    finally:
        watch.stop()
    got = consumer.result(10)
    signals = flow.metric("floodwall_flow_signals_total", protocol="amqp091", active="false")
    print(f"{kind} (confirm={confirm}): peak ready {watch.max_ready} KiB messages, peak "
          f"message_bytes {watch.max_message_bytes // KIB} KiB (capacity "
          f"{CAPACITY // KIB} KiB), {signals:.0f} Channel.Flow(false), "
          f"client flow events {len(client.of('flow'))}, elapsed {done['elapsed_s']:.2f}s")
    assert done["published"] == COUNT and done["confirmed"] is confirm
    assert done["rpc_ok"] is True and done.get("nacked", 0) == 0, done
    assert got == list(range(COUNT)), "lost, duplicated or reordered messages"
    assert ready_count(broker, queue) == 0
    assert watch.tripped_seen and flow.metric("floodwall_queue_trips_total", queue=queue) > 0
    assert watch.samples > 20
    assert watch.max_ready * KIB <= TARGET, f"broker held {watch.max_ready} KiB messages"
    assert watch.max_message_bytes <= TARGET, watch.max_message_bytes
    if SIGNALLED[kind]:
        assert signals >= 1, f"{kind} tolerates Channel.Flow: it should have been signalled"
    else:
        assert signals == 0, f"{kind} must not get Channel.Flow under signal: auto"
        assert client.of("flow") == []


# -- 2. the Channel.Flow trial: what each client does with one ----------------------------
def _flow_trial(broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queue: str,
                start: Starter, consumers: Callable[..., SlowConsumer], count: int,
                confirm: bool) -> tuple[ForeignClient, FlowProxy, SlowConsumer]:
    """A ``signal: flow`` policy, the client publishing ``count`` at 300 a second; the
    consumer starts 1.5 s after floodwall sent Channel.Flow(active=false), so the queue stays
    tripped, and flow off, for that long."""
    flow = _capped_flow(start_floodwall, broker, tmp_path, queue, signal="flow")
    client = start("127.0.0.1", flow.port, queue, count=count, rate=300, body_size=KIB,
                   confirm=confirm)
    client.wait_event("ready", timeout=60)
    wait_for(lambda: flow.metric("floodwall_flow_signals_total", protocol="amqp091",
                                 active="false") >= 1, 60, 0.1, "Channel.Flow(active=false)")
    time.sleep(1.5)  # observation window: what the client does while flow is off
    return client, flow, consumers(broker, queue, count, 2000)


@pytest.mark.timeout(120)
def test_channel_flow_trial_amqp091_go(broker: BrokerEndpoint, start_floodwall: Any,
                                       tmp_path: Path, queues: Any, go_producer: Starter,
                                       consumers: Callable[..., SlowConsumer]) -> None:
    """amqp091-go replies FlowOk itself, tells NotifyFlow listeners and keeps publishing."""
    queue, count = queues("flow-go"), 900
    client, _flow, consumer = _flow_trial(broker, start_floodwall, tmp_path, queue,
                                          go_producer, consumers, count, confirm=False)
    off = client.wait_event("flow", timeout=10, active=False)
    later = max(e["published"] for e in client.of("progress") if e["_rx"] > off["_rx"])
    assert later - off["published"] >= 200, (off, later)  # 1.5 s at 300/s: it did not stop
    done = client.finish(timeout=60)
    assert done["published"] == count and done["rpc_ok"] is True
    wait_for(lambda: len(consumer.seqs) >= count, 60, 0.1, f"{count} at the consumer")
    assert consumer.result(10) == list(range(count))


@pytest.mark.timeout(120)
def test_channel_flow_trial_bunny(broker: BrokerEndpoint, start_floodwall: Any,
                                  tmp_path: Path, queues: Any, ruby_producer: Starter,
                                  consumers: Callable[..., SlowConsumer]) -> None:
    """Bunny breaks: its reader thread dies on the Channel.Flow ("Do not know how to handle"),
    publishes go on unanswered and the next RPC times out."""
    queue = queues("flow-ruby")
    client, _flow, _consumer = _flow_trial(broker, start_floodwall, tmp_path, queue,
                                           ruby_producer, consumers, 900, confirm=False)
    error = client.wait_event("error", timeout=60)
    assert client.wait_exit(timeout=30) == 1
    assert error["kind"] == "Timeout::Error", error  # the passive declare after publishing
    assert any("Do not know how to handle #<AMQ::Protocol::Channel::Flow" in line
               for line in client.stderr_lines), client.describe()


@pytest.mark.timeout(120)
def test_channel_flow_trial_php_amqplib(broker: BrokerEndpoint, start_floodwall: Any,
                                        tmp_path: Path, queues: Any, php_producer: Starter,
                                        consumers: Callable[..., SlowConsumer]) -> None:
    """php-amqplib puts the Channel.Flow aside while it waits for confirms (no reply, no
    change); dispatched later by an unfiltered wait(), it answers with a Channel.Flow. It
    never stops publishing nor fails; every publish lands."""
    queue, count = queues("flow-php"), 900
    client, flow, consumer = _flow_trial(broker, start_floodwall, tmp_path, queue,
                                         php_producer, consumers, count, confirm=True)
    assert not client.of("error") and client.returncode is None, client.describe()
    assert client.of("flow") == [], "dispatched while only publishing"
    done = client.finish(timeout=90)
    assert done["published"] == count and done["rpc_ok"] is True and done["nacked"] == 0
    assert done["deferred"] >= 1 and done["flows"] >= 1, done
    assert client.of("flow")[0]["active"] is False
    wait_for(lambda: len(consumer.seqs) >= count, 60, 0.1, f"{count} at the consumer")
    assert consumer.result(10) == list(range(count))
    wait_for(lambda: flow.held()["messages"] == 0, 10, what="nothing held")


@pytest.mark.timeout(120)
def test_channel_flow_trial_rabbitmq_c(broker: BrokerEndpoint, start_floodwall: Any,
                                       tmp_path: Path, queues: Any, c_producer: Starter,
                                       consumers: Callable[..., SlowConsumer]) -> None:
    """rabbitmq-c hands the Channel.Flow to the application's frame loop (here: waiting for
    confirms) and sends nothing; the program goes on, every publish lands."""
    queue, count = queues("flow-c"), 900
    client, flow, consumer = _flow_trial(broker, start_floodwall, tmp_path, queue,
                                         c_producer, consumers, count, confirm=True)
    assert not client.of("error") and client.returncode is None, client.describe()
    assert client.wait_event("flow", timeout=10)["active"] is False
    done = client.finish(timeout=90)
    assert done["published"] == count and done["rpc_ok"] is True and done["nacked"] == 0
    wait_for(lambda: len(consumer.seqs) >= count, 60, 0.1, f"{count} at the consumer")
    assert consumer.result(10) == list(range(count))
    wait_for(lambda: flow.held()["messages"] == 0, 10, what="nothing held")
