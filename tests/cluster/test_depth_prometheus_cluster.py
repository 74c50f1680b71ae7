"""Depth without management statistics, in a cluster: each RabbitMQ 4.0 node's Prometheus
endpoint reports only the queues that node runs, so floodwall, connected to the first node,
reads a queue that lives on the third from the third node's page (every node's endpoint is
asked and the pages merged), and holds its cap."""

from __future__ import annotations

import json
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from floodwall.dev.devbroker import BrokerRelease, rabbitmq4_root
from floodwall.dev.devproxy import ProxyProcess
from floodwall.dev.rabbitcluster import LocalCluster
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
DIRECT = 50  # x 10 KiB published straight at the queue's node


@pytest.fixture(scope="module")
def stats_off_cluster() -> Iterator[LocalCluster]:
    """Three RabbitMQ 4.0 nodes with management statistics off."""
    release = BrokerRelease(rabbitmq4_root())
    release.lib_dir()  # says how to make the root when it is missing
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-cluster-nostats-"))
    cluster = LocalCluster(workdir, release=release, config_extra=(
        "cluster_partition_handling = autoheal\n"
        "management_agent.disable_metrics_collector = true\n"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


def _reported_by(port: int, queue: str) -> bool:
    """Whether the node's detailed Prometheus page names ``queue``."""
    url = (f"http://127.0.0.1:{port}/metrics/detailed?vhost=%2F"
           "&family=queue_coarse_metrics")
    with urllib.request.urlopen(url, timeout=10) as resp:
        return f'queue="{queue}"' in resp.read().decode()


def test_a_queue_on_another_node_is_read_from_that_nodes_endpoint(
        stats_off_cluster: LocalCluster, tmp_path: Path) -> None:
    first, _, third = stats_off_cluster.nodes
    queue = unique("nostats-cluster")
    direct = pika.BlockingConnection(direct_params(third.endpoint))
    try:
        ch = direct.channel()
        ch.queue_declare(queue)  # a classic queue: it lives on the node that declared it
        for _ in range(DIRECT):
            ch.basic_publish("", queue, b"d" * (10 * KIB))
        doc = first.endpoint.api("GET", f"/api/queues/%2F/{queue}")
        assert isinstance(doc, dict) and "message_bytes" not in doc, \
            "the management API has byte figures: statistics are not off"
        wait_for(lambda: _reported_by(third.prometheus_port, queue), 30, 0.2,
                 "the queue on its node's Prometheus page")
        assert not _reported_by(first.prometheus_port, queue)  # (the first node has none)

        policies = policy_file(tmp_path / "p.yaml",
                               capped("nostats", queue, "1MiB", "512KiB"))
        proc = ProxyProcess(first.endpoint.upstream, tmp_path / "floodwall.log", [
            "--policies", str(policies), "--management", first.endpoint.management_url,
            "--prometheus", ",".join(f"http://127.0.0.1:{node.prometheus_port}"
                                     for node in stats_off_cluster.nodes),
            "--management-interval", "1s"]).start()
        flow = FlowProxy(proc, policies)
        try:
            wait_for(lambda: from_prometheus(flow, queue, DIRECT * 10 * KIB), 60, 0.1,
                     "the queue's depth from its node's endpoint")
            assert flow.metric("floodwall_prometheus_errors_total") == 0, json.dumps(
                flow.queue_state(queue))
        finally:
            assert proc.stop() == 0
    finally:
        direct.channel().queue_delete(queue)
        direct.close()
