"""The broker's nodes (``--upstream a:5672,b:5672,c:5672``, or one name with several
addresses), which of them answer AMQP, and where the next connection goes (``Upstreams``).

The rule is *first that answers*: every connection, the clients' and floodwall's own, goes
to the first node in the order given (a name's addresses in the resolver's order) that the
readiness probe last found answering AMQP; nodes not probed yet come next, and a node that
did not answer (refused, reset, or connected but silent: a hung node still completes TCP
handshakes in the kernel) only after every other. So a healthy cluster sees floodwall's
connections on one node, as behind a load balancer's ``balance first``, and a lost or hung
node is left within one probe round.

When the probe finds a node that answered no longer answering, the connections on it are
told (``watch``): a killed node's connections end by themselves, a hung node's would wait
for heartbeats, so they are closed at once and their clients reconnect to the next node.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from floodwall.io.tls import TlsFailure, UpstreamTlsContext, open_upstream
from floodwall.io.upstream_address import UpstreamAddresses


class NodeState(enum.Enum):
    """What the readiness probe last found at one of the broker's addresses."""

    UP = "up"  # answered the AMQP protocol header with connection.start
    UNKNOWN = "unknown"  # not probed yet
    DOWN = "down"  # refused, reset, or no connection.start in time

    @property
    def rank(self) -> int:
        """Connections try lower ranks first."""
        return _RANK[self]


_RANK = {NodeState.UP: 0, NodeState.UNKNOWN: 1, NodeState.DOWN: 2}


@dataclass(frozen=True)
class Endpoint:
    """One address of one node: ``host`` as given (the TLS name, labels), ``address`` what
    is connected to (``host`` itself, or one of its DNS addresses)."""

    host: str
    address: str
    port: int

    def __str__(self) -> str:
        if self.address == self.host:
            return f"{self.host}:{self.port}"
        return f"{self.host}({self.address}):{self.port}"


Watcher = Callable[[str], None]


class Upstreams:
    """The nodes in the order given; ``endpoints()`` in the order to try them."""

    def __init__(self, nodes: Sequence[tuple[str, int]],
                 names: Sequence[UpstreamAddresses] | None = None) -> None:
        if not nodes:
            raise ValueError("no upstream node")
        self.nodes = tuple(nodes)
        self._names = list(names) if names is not None else [
            UpstreamAddresses(host, port) for host, port in self.nodes]
        self._states: dict[Endpoint, NodeState] = {}
        self._watchers: dict[Endpoint, dict[int, Watcher]] = {}
        self._watch_ids = 0

    @property
    def first(self) -> tuple[str, int]:
        return self.nodes[0]

    def host(self, endpoint: Endpoint | None) -> str:
        """The name a connection to ``endpoint`` verifies (the first node's before one)."""
        return endpoint.host if endpoint is not None else self.nodes[0][0]

    @property
    def label(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.nodes)

    async def endpoints(self) -> list[Endpoint]:
        """Every node's addresses, those that answer first (in the order given), then the
        unprobed, then those that did not answer. A name that does not resolve is left out;
        OSError when none does."""
        found: list[Endpoint] = []
        errors: list[str] = []
        for names in self._names:
            try:
                addresses = await names.resolve()
            except OSError as exc:
                errors.append(f"{names.host}: {exc.strerror or exc}")
                continue
            found += [Endpoint(names.host, address, names.port) for address in addresses]
        if not found:
            raise OSError(f"no address for {self.label}: {'; '.join(errors)}")
        return sorted(found, key=lambda ep: self.state(ep).rank)

    def state(self, endpoint: Endpoint) -> NodeState:
        return self._states.get(endpoint, NodeState.UNKNOWN)

    @property
    def any_up(self) -> bool:
        return NodeState.UP in self._states.values()

    def answered(self, endpoint: Endpoint) -> bool:
        """The node at ``endpoint`` answered AMQP; True when that is news."""
        before = self.state(endpoint)
        self._states[endpoint] = NodeState.UP
        return before is not NodeState.UP

    def failed(self, endpoint: Endpoint, reason: str, *, probed: bool = False) -> bool:
        """The node at ``endpoint`` did not answer; True when that is news. A DNS name is
        looked up again for the next connection. ``probed``: the readiness probe found it
        so (connected or not, no connection.start in time), and the connections on it are
        told (``watch``) if another node may take them: with one node, or every other found
        down, they stay (their reconnects could only come back to it; a broker slow to
        answer through a burst of handshakes is not hung, and a hung one's connections end
        by their heartbeats). A connect that one client's relay saw fail tells nobody."""
        before = self.state(endpoint)
        self._states[endpoint] = NodeState.DOWN
        for names in self._names:
            if names.host == endpoint.host and names.port == endpoint.port:
                names.failed()
        if probed and self._elsewhere(endpoint):
            for watcher in list(self._watchers.pop(endpoint, {}).values()):
                watcher(reason)
        return before is not NodeState.DOWN

    def _elsewhere(self, endpoint: Endpoint) -> bool:
        """Whether another node may take connections: an address the probe did not find down,
        or a node given that it has not probed yet."""
        probed = {(ep.host, ep.port) for ep in self._states}
        return any(state is not NodeState.DOWN for ep, state in self._states.items()
                   if ep != endpoint) or any(node not in probed for node in self.nodes)

    def states(self) -> dict[str, str]:
        """Each address probed and what was found (for /state)."""
        return {str(ep): state.value for ep, state in self._states.items()}

    def watch(self, endpoint: Endpoint, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(reason)`` once when ``endpoint`` stops answering; the function
        returned forgets it (the connection ended first)."""
        self._watch_ids += 1
        key = self._watch_ids
        self._watchers.setdefault(endpoint, {})[key] = watcher

        def forget() -> None:
            watchers = self._watchers.get(endpoint)
            if watchers is not None:
                watchers.pop(key, None)
                if not watchers:
                    del self._watchers[endpoint]
        return forget

    async def open(self, tls: UpstreamTlsContext | None, timeout: float
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Endpoint]:
        """A stream to the first node that takes it (floodwall's own connections); a TLS
        failure is raised at once (the next node has the same certificate settings)."""
        errors: list[str] = []
        for endpoint in await self.endpoints():
            try:
                async with asyncio.timeout(timeout):
                    reader, writer = await open_upstream(endpoint.address, endpoint.port, tls,
                                                          name=endpoint.host)
            except TlsFailure:
                raise
            except (OSError, TimeoutError) as exc:
                reason = str(exc) or f"no connection within {timeout:g}s"
                self.failed(endpoint, reason)
                errors.append(f"{endpoint}: {reason}")
                continue
            return reader, writer, endpoint
        raise ConnectionError("no broker node takes a connection: " + "; ".join(errors))

    def close(self) -> None:
        for names in self._names:
            names.close()


__all__ = ["Endpoint", "NodeState", "Upstreams"]
