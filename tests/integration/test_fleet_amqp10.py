"""AMQP 1.0 senders in the fleet's shares and beside 0-9-1 publishers, end to end: real
floodwall processes, the real broker (3.10 and 4.0), python-qpid-proton senders and pika.

- Two sidecars of one fleet, a proton sender at full speed through each into one queue
  capped at 256 KiB, a slow consumer: the broker-side depth stays within capacity + 256 KiB
  (the 1.0 target: docs/design/fleet.md, "The bound", with one credit window per member) and
  every message each sender had accepted is delivered.
- One sidecar, a bare 0-9-1 publisher and a proton sender into one held queue: the held
  queue admits both (the 1.0 link in the round robin with the 0-9-1 channel): each gets at
  least a quarter of the deliveries while held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import capped, direct_params, policy_file, unique
from tests.integration.test_amqp10_flow import LinkStats, ProtonSenders
from tests.integration.test_fleet import (
    KIB,
    PREFETCH,
    QueueWatch,
    bare_producer,
    fleet_doc,
    policed,
    sidecar,
)

pytestmark = pytest.mark.broker

CAPACITY = 256 * KIB
#: The 1.0 target's bound on the broker-side depth (capacity + 256 KiB).
OVER = 256 * KIB


def address(broker: BrokerEndpoint, queue: str) -> str:
    """A v2 address on RabbitMQ 4, the 3.10 plugin's otherwise (both name the queue)."""
    return f"/queues/{queue}" if broker.version >= (4, 0) else f"/amq/queue/{queue}"


class TaggedSenders(ProtonSenders):
    """``ProtonSenders`` whose bodies start with a two-digit producer tag (``tag``)."""

    def __init__(self, port: int, links: list[LinkStats], tag: int) -> None:
        super().__init__(port, links)
        self.bodies = [f"{tag:02d}{i:08d}".encode().ljust(KIB, b"x") for i in range(256)]


def holding_kinds(proc: ProxyProcess) -> int:
    """How many channels and links the sidecar holds now."""
    flow = proc.state()["flow"]
    assert isinstance(flow, dict)
    return len(flow["blocked_channels"])


def consume(conn: pika.BlockingConnection, queue: str, got: list[bytes], enough: int,
            pause: float = 0.0) -> None:
    """Straight from the broker, prefetch 20, ``pause`` seconds per ack, until ``enough``."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    for method, _, b in ch.consume(queue, inactivity_timeout=20):
        assert method is not None, f"nothing delivered for 20 s ({len(got)} so far)"
        got.append(b)
        ch.basic_ack(method.delivery_tag)
        if pause:
            threading.Event().wait(pause)
        if len(got) >= enough:
            break
    ch.cancel()


def _one_fleet(start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint,
               tmp_path: Path, kind: str, n: int) -> tuple[str, pika.BlockingConnection,
                                                        list[ProxyProcess]]:
    name, queue = unique(kind), unique(f"amqp10-{kind}")
    policies = policy_file(tmp_path / "p.yaml",
                           capped("amqp10", f"fw-it-amqp10-{kind}-*", "256KiB", "128KiB"))
    conn = pika.BlockingConnection(direct_params(broker))
    conn.channel().queue_declare(queue)
    fleet = [sidecar(start_floodwall, broker, policies, name) for _ in range(n)]
    for proc in fleet:
        wait_for(lambda p=proc: fleet_doc(p)["size"] == n and not fleet_doc(p)["deaf"]
                 and policed(p, queue), 15, what=f"{n} members, the queue policed")
    return queue, conn, fleet


@pytest.mark.timeout(120)
def test_two_sidecars_1_0_senders_share_one_queue_within_the_bound(
        broker: BrokerEndpoint, start_floodwall: Callable[..., ProxyProcess],
        tmp_path: Path) -> None:
    queue, conn, fleet = _one_fleet(start_floodwall, broker, tmp_path, "ten", 2)
    watch = QueueWatch(broker, queue)
    watch.start()
    per = 1200  # x 1 KiB: 4.7 capacities each
    links = [LinkStats(f"s{i}", address(broker, queue), 0, per) for i in range(2)]
    senders = [TaggedSenders(p.port, [s], i) for i, (p, s) in enumerate(zip(fleet, links,
                                                                          strict=True))]
    got: list[bytes] = []
    try:
        for s in senders:
            s.start()
        # A slow consumer (about 500 msg/s) while both send, then as fast as it goes.
        consume(conn, queue, got, 800, pause=0.002)
        consume(conn, queue, got, 2 * per)
        wait_for(lambda: all(s.accepted + len(s.rejected) >= per for s in links), 20,
                 what="both senders' deliveries settled")
    finally:
        for s in senders:
            s.finish()
        watch.done.set()
        watch.join(10)
        conn.channel().queue_delete(queue)
        conn.close()
    assert watch.error is None
    errors = [e for s in senders for e in s.errors]
    assert not errors, errors
    peak = watch.max_ready * KIB
    by_sender = [sum(1 for b in got if int(b[-KIB:][:2]) == i) for i in range(2)]
    print(f"1.0 fleet: peak {peak // KIB} KiB (capacity {CAPACITY // KIB}), delivered "
          f"{by_sender}, accepted {[s.accepted for s in links]}")
    assert peak <= CAPACITY + OVER
    assert [s.rejected for s in links] == [[], []]
    assert by_sender == [s.accepted for s in links] == [per, per]


@pytest.mark.timeout(120)
def test_a_0_9_1_publisher_and_a_1_0_sender_both_progress_in_one_held_queue(
        broker: BrokerEndpoint, start_floodwall: Callable[..., ProxyProcess],
        tmp_path: Path) -> None:
    queue, conn, (proc,) = _one_fleet(start_floodwall, broker, tmp_path, "mixed", 1)
    done = threading.Event()
    per = 1500
    link = LinkStats("s1", address(broker, queue), 0, per)
    sender = TaggedSenders(proc.port, [link], 1)
    got: list[bytes] = []
    try:
        publisher = bare_producer(proc.port, queue, 0, per, done)
        sender.start()
        # The fill: both are held (the channel with its publishes, the link without credit).
        wait_for(lambda: holding_kinds(proc) == 2, 30, what="the channel and the link held")
        consume(conn, queue, got, 1000, pause=0.002)  # the fill's ~256, then held
    finally:
        done.set()
        sender.finish()
        publisher.join(10)
        conn.channel().queue_delete(queue)
        conn.close()
    assert not sender.errors, sender.errors
    held = [int(b[-KIB:][:2]) for b in got[400:]]
    counts = [held.count(0), held.count(1)]
    print(f"0-9-1 and 1.0 while held: {counts} of {len(held)}")
    assert min(counts) >= len(held) / 4, counts
