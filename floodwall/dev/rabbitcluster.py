"""A throwaway RabbitMQ cluster on one host: several ``LocalBroker`` nodes, each with its own
ports, data directory and node name, sharing one Erlang cookie, joined at start.

For the tests and benchmarks that lose, hang and restart a node. The nodes are the same
package's server as ``LocalBroker`` runs; the first node is started, the others are started
on their own and then joined to it (``rabbitmqctl join_cluster``), the way an operator forms
a cluster by hand.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from floodwall.dev.devbroker import (
    HOST_RELEASE,
    BrokerEndpoint,
    BrokerError,
    BrokerRelease,
    LocalBroker,
)

#: Seconds a node has to show every member running after the joins.
JOIN_TIMEOUT = 120.0


@dataclass
class LocalCluster:
    """``size`` nodes under ``workdir``; ``start()`` then ``stop()``."""

    workdir: Path
    size: int = 3
    # A node frozen long enough to be thought gone comes back into a partition: heal it.
    config_extra: str = "cluster_partition_handling = autoheal\n"
    release: BrokerRelease = HOST_RELEASE  # the host's RabbitMQ, or a root's (devbroker)
    nodes: list[LocalBroker] = field(init=False)
    frozen: set[str] = field(default_factory=set, init=False)  # node names SIGSTOPped

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.nodes = [LocalBroker(self.workdir / f"node{i}", self.config_extra,
                                  release=self.release) for i in range(self.size)]

    @property
    def endpoints(self) -> list[BrokerEndpoint]:
        return [node.endpoint for node in self.nodes]

    @property
    def upstream(self) -> str:
        """What ``floodwall run --upstream`` takes for the whole cluster."""
        return ",".join(node.endpoint.upstream for node in self.nodes)

    @property
    def management(self) -> str:
        """What ``floodwall run --management`` takes for the whole cluster."""
        return ",".join(node.endpoint.management_url for node in self.nodes)

    @property
    def prometheus(self) -> str:
        """What ``floodwall run --prometheus`` takes for the whole cluster (each node's
        endpoint is on a port of its own here, not the default 15692)."""
        return ",".join(f"http://{node.endpoint.host}:{node.prometheus_port}"
                        for node in self.nodes)

    def start(self) -> LocalCluster:
        cookie = secrets.token_hex(20).upper()
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            path = node.workdir / ".erlang.cookie"  # the node's HOME is its workdir
            path.write_text(cookie)
            path.chmod(0o400)
        first, *others = self.nodes
        try:
            first.start()
            for node in others:
                node.start()
                node.ctl("stop_app")
                node.ctl("join_cluster", first.nodename)
                node.ctl("start_app")
            self.wait_running(len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def running_nodes(self, via: LocalBroker | None = None) -> set[str]:
        """The members that ``via`` (else any live node) sees running."""
        candidates = [via] if via is not None else [n for n in self.nodes if n.process]
        for node in candidates:
            try:
                status = json.loads(node.ctl("cluster_status", "--formatter", "json",
                                             timeout=30))
            except (BrokerError, ValueError):
                continue
            return set(status.get("running_nodes", []))
        return set()

    def wait_running(self, count: int, timeout: float = JOIN_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            seen = self.running_nodes()
            if len(seen) >= count:
                return
            time.sleep(0.5)
        raise BrokerError(f"cluster: {len(seen)} of {count} nodes running after "
                          f"{timeout:.0f}s: {sorted(seen)}")

    @property
    def answering(self) -> list[LocalBroker]:
        """The nodes running and not frozen."""
        return [n for n in self.nodes if n.process is not None and n.nodename not in self.frozen]

    def freeze(self, node: LocalBroker) -> None:
        """SIGSTOP ``node``: a hung node (its ports still accept TCP connections)."""
        node.freeze()
        self.frozen.add(node.nodename)

    def thaw(self, node: LocalBroker) -> None:
        node.thaw()
        self.frozen.discard(node.nodename)

    def node_named(self, nodename: str) -> LocalBroker:
        for node in self.nodes:
            if node.nodename == nodename:
                return node
        raise KeyError(nodename)

    def stop(self) -> None:
        for node in self.nodes:
            if node.nodename in self.frozen:
                self.thaw(node)
            node.stop()

    def remove(self) -> None:
        """kill -9 every node and delete the cluster's directory (``LocalBroker.remove``)."""
        for node in self.nodes:
            node.remove()
        self.frozen.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


__all__ = ["LocalCluster"]
