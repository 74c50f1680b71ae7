"""Depth without management statistics: a RabbitMQ 4.0 node with
``management_agent.disable_metrics_collector = true`` answers ``/api/queues`` with names only;
floodwall reads the policed queue's ready bytes and messages from the broker's Prometheus
endpoint instead (``/metrics/detailed``; of each node listed, one of them not answering),
says so in ``/state`` and a metric, and holds the cap although 600 KiB of large messages
were published straight at the broker first (the ledger's own message size would have
counted them a tenth of what they are)."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from floodwall.dev.devbroker import BrokerRelease, LocalBroker, free_port, rabbitmq4_root
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    capped,
    direct_params,
    from_prometheus,
    policy_file,
    unique,
)

pytestmark = pytest.mark.broker

KIB = 1024
CAPACITY = 1024 * KIB
BOUND = CAPACITY + 256 * KIB  # the flow control's bound at the broker
DIRECT = 60  # x 10 KiB published straight at the broker: 600 KiB
FLOOD = 3072  # x 1 KiB through floodwall: 3 MiB


@pytest.fixture(scope="module")
def stats_off() -> Iterator[LocalBroker]:
    """A RabbitMQ 4.0 node with management statistics off."""
    release = BrokerRelease(rabbitmq4_root())
    release.lib_dir()  # says how to make the root when it is missing
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-rabbit4-nostats-"))
    node = LocalBroker(workdir, release=release,
                       config_extra="management_agent.disable_metrics_collector = true\n")
    node.start(timeout=240)
    try:
        yield node
    finally:
        node.remove()


def test_depth_from_prometheus_when_statistics_are_off(stats_off: LocalBroker,
                                                       tmp_path: Path) -> None:
    ep = stats_off.endpoint
    queue = unique("nostats")
    direct = pika.BlockingConnection(direct_params(ep))
    ch = direct.channel()
    ch.queue_declare(queue)
    for _ in range(DIRECT):
        ch.basic_publish("", queue, b"d" * (10 * KIB))
    doc = ep.api("GET", f"/api/queues/%2F/{queue}")
    assert isinstance(doc, dict) and "message_bytes" not in doc, \
        "the management API has byte figures: statistics are not off"
    policies = policy_file(tmp_path / "p.yaml", capped("nostats", queue, "1MiB", "512KiB"))
    proc = ProxyProcess(ep.upstream, tmp_path / "floodwall.log", [
        "--policies", str(policies), "--management", ep.management_url,
        # Two nodes' endpoints, the first one's port closed: the other's figures serve.
        "--prometheus", f"http://127.0.0.1:{free_port()},"
                        f"http://127.0.0.1:{stats_off.prometheus_port}",
        "--management-interval", "1s"]).start()
    flow = FlowProxy(proc, policies)
    try:
        wait_for(lambda: from_prometheus(flow, queue, 1), 60, 0.1,
                 "the queue's depth from the Prometheus endpoint")
        state = flow.queue_state(queue)
        assert state is not None
        assert state["depth"]["broker"]["bytes"] >= DIRECT * 10 * KIB
        assert flow.metric("floodwall_queue_depth_source", queue=queue,
                           source="prometheus") == 1
        assert flow.metric("floodwall_prometheus_requests_total") >= 1
        assert flow.log("prometheus_depth_failed"), "the closed node's failure not logged"

        most = {"bytes": 0}
        stop = threading.Event()

        def watch() -> None:
            conn = pika.BlockingConnection(direct_params(ep))
            wch = conn.channel()
            while not stop.is_set():
                ready = wch.queue_declare(queue, passive=True).method.message_count
                most["bytes"] = max(most["bytes"], DIRECT * 10 * KIB + (ready - DIRECT) * KIB)
                stop.wait(0.02)
            conn.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        producer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", flow.port))
        pch = producer.channel()
        for _ in range(FLOOD):
            pch.basic_publish("", queue, b"f" * KIB)

        def settled() -> bool:
            ready = ch.queue_declare(queue, passive=True).method.message_count
            return ready - DIRECT + int(flow.held()["messages"]) >= FLOOD
        wait_for(settled, 90, 0.2, "every flood publish forwarded or held")
        stop.set()
        watcher.join(10)
        # (the producer is not closed: its close would wait behind its held publishes; the
        # proxy's stop ends it)
        over = most["bytes"] - CAPACITY
        print(f"statistics off, depth from Prometheus: at most {most['bytes'] // KIB} KiB at "
              f"the broker ({over // KIB:+d} KiB over the 1 MiB capacity)")
        assert flow.tripped(queue)
        assert most["bytes"] <= BOUND, f"{most['bytes'] // KIB} KiB at the broker"
    finally:
        proc.stop()
        ch.queue_delete(queue)
        direct.close()
