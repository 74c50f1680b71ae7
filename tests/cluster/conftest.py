"""The cluster suite's fixtures: a three-node RabbitMQ cluster of its own (its nodes are
killed, frozen and restarted by the tests, so never the session broker), restored to three
running nodes after each test, and floodwall processes pointed at it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from floodwall.dev.devbroker import BrokerRelease
from floodwall.dev.devproxy import ProxyProcess
from floodwall.dev.rabbitcluster import LocalCluster


@pytest.fixture(scope="module")
def rabbit_cluster(broker_release: BrokerRelease) -> Iterator[LocalCluster]:
    """Three nodes of the release under test (3.10 and 4.0, as every broker-facing test)."""
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-cluster-"))
    cluster = LocalCluster(workdir, release=broker_release)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def cluster(rabbit_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The module's cluster, every node running (and thawed) before and after the test."""
    restore(rabbit_cluster)
    yield rabbit_cluster
    restore(rabbit_cluster)


def restore(cluster: LocalCluster) -> None:
    for node in cluster.nodes:
        if node.nodename in cluster.frozen:
            cluster.thaw(node)
        if node.process is None:
            node.start()
    cluster.wait_running(len(cluster.nodes))


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """``sidecar(upstream, *args)`` starts a floodwall; all are stopped after the test."""
    started: list[ProxyProcess] = []

    def start(upstream: str, *args: str, wait_ready: bool = True) -> ProxyProcess:
        proc = ProxyProcess(upstream, tmp_path / f"floodwall-{len(started)}.log", list(args))
        started.append(proc)
        return proc.start(wait_ready=wait_ready)

    yield start
    for proc in started:
        with contextlib.suppress(Exception):
            proc.stop()
    shutil.rmtree(tmp_path / "spool", ignore_errors=True)
