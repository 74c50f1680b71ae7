"""Traffic that lives through a node's loss: a publisher with confirms through floodwall, a
paced consumer and a depth watch straight at the cluster, each reconnecting to whichever
node answers, each recording what it saw for the assertions."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

import pika
import pika.exceptions

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.rabbitcluster import LocalCluster
from tests.integration.support import direct_params, numbered, seq_of

SIZE = 1024
PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: What a client of these threads waits before it connects again after a failure.
RECONNECT_PAUSE = 0.2


def close_quietly(conn: pika.BlockingConnection) -> None:
    """Close ``conn`` if it is open; a node gone meanwhile is no error here."""
    if conn.is_open:
        try:
            conn.close()
        except (pika.exceptions.AMQPError, OSError):
            pass


def live_endpoints(cluster: LocalCluster) -> list[BrokerEndpoint]:
    """The endpoints of the nodes that are running and not frozen by the test."""
    return [n.endpoint for n in cluster.answering]


class ConfirmedPublisher(threading.Thread):
    """Publishes numbered persistent messages through floodwall (``port``), each confirmed
    before the next, reconnecting at once when the connection ends. ``confirmed`` holds
    each confirmed number with the time of its confirm."""

    def __init__(self, port: int, queue: str, producer: int = 0) -> None:
        super().__init__(daemon=True, name=f"publisher-{queue}-{producer}")
        self.port, self.queue, self.producer = port, queue, producer
        self.confirmed: dict[int, float] = {}
        self.failures: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self._next = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._session()
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                self.stop.wait(RECONNECT_PAUSE)

    def _session(self) -> None:
        params = pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=1, socket_timeout=5,
            blocked_connection_timeout=60, heartbeat=30)
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            while not self.stop.is_set():
                seq = self._next
                self._next += 1
                ch.basic_publish("", self.queue, numbered(self.tag(seq), SIZE), PERSISTENT)
                self.confirmed[seq] = time.monotonic()
        finally:
            close_quietly(conn)

    def tag(self, seq: int) -> int:
        """The number a message carries: the producer's in its top digits."""
        return self.producer * 10**8 + seq

    def tagged(self) -> set[int]:
        return {self.tag(seq) for seq in self.confirmed}

    def last_confirm_before(self, moment: float) -> float:
        return max((t for t in self.confirmed.values() if t <= moment), default=0.0)

    def first_confirm_after(self, moment: float) -> float | None:
        return min((t for t in self.confirmed.values() if t > moment), default=None)

    def longest_pause_after(self, moment: float) -> float:
        """The longest time without a confirm from ``moment`` to the last confirm."""
        times = [moment, *sorted(t for t in self.confirmed.values() if t > moment)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


class PacedConsumer(threading.Thread):
    """Consumes ``queue`` straight from the cluster at about ``rate`` messages a second,
    acking each, reconnecting to the next running node when its node is lost. ``seen`` is
    every number received (duplicates after a failover included once)."""

    def __init__(self, cluster: LocalCluster, queue: str, rate: float,
                 prefetch: int = 20, first: int = 0) -> None:
        super().__init__(daemon=True, name=f"consumer-{queue}")
        self.cluster, self.queue, self.rate, self.prefetch = cluster, queue, rate, prefetch
        self.first = first  # the node (its index among those running) tried first
        self.seen: set[int] = set()
        self.unacked_max = prefetch
        self.stop = threading.Event()
        self.drain = threading.Event()  # consume as fast as it can from now on
        self.idle_since = time.monotonic()

    def run(self) -> None:
        turn = self.first
        while not self.stop.is_set():
            endpoints = live_endpoints(self.cluster)
            if not endpoints:
                self.stop.wait(RECONNECT_PAUSE)
                continue
            ep = endpoints[turn % len(endpoints)]
            turn += 1
            try:
                self._session(ep)
            except (pika.exceptions.AMQPError, OSError):
                self.stop.wait(RECONNECT_PAUSE)

    def _session(self, ep: BrokerEndpoint) -> None:
        conn = pika.BlockingConnection(direct_params(ep, heartbeat=5))
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=self.prefetch)
            for method, _, body in ch.consume(self.queue, inactivity_timeout=0.1):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                self.seen.add(seq_of(body))
                self.idle_since = time.monotonic()
                ch.basic_ack(method.delivery_tag)
                if not self.drain.is_set():
                    time.sleep(1 / self.rate)
        finally:
            close_quietly(conn)


class DepthMax(threading.Thread):
    """The queue's ready messages, by a passive declare on a running node every 50 ms,
    converted to bytes (every body is ``SIZE``) plus what the consumer may hold unacked:
    the largest seen, and how many samples failed (a node lost, a leader elected)."""

    def __init__(self, cluster: LocalCluster, queue: str, unacked: int, first: int = 0) -> None:
        super().__init__(daemon=True, name=f"depth-{queue}")
        self.cluster, self.queue, self.unacked = cluster, queue, unacked
        self.first = first  # the node (its index among those running) tried first
        self.max_bytes = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            live = live_endpoints(self.cluster)
            for ep in live[self.first:] + live[:self.first]:
                try:
                    self._watch(ep)
                except (pika.exceptions.AMQPError, OSError):
                    continue
                if self.stop.is_set():
                    return
            self.stop.wait(RECONNECT_PAUSE)

    def _watch(self, ep: BrokerEndpoint) -> None:
        conn = pika.BlockingConnection(direct_params(ep, heartbeat=5))
        try:
            while not self.stop.is_set():
                ch = conn.channel()
                ready = ch.queue_declare(self.queue, passive=True).method.message_count
                ch.close()
                self.samples += 1
                self.max_bytes = max(self.max_bytes, (ready + self.unacked) * SIZE)
                self.stop.wait(0.05)
        finally:
            close_quietly(conn)


def stop_all(threads: Sequence[threading.Thread]) -> None:
    for thread in threads:
        stop = getattr(thread, "stop", None)
        if isinstance(stop, threading.Event):
            stop.set()
    for thread in threads:
        thread.join(30)
