"""Prometheus metrics: counters kept as plain ints on the hot path, read at scrape time."""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from floodwall import __version__
from floodwall.control.memory import MemoryBudget
from floodwall.enforce.amqp10.links import LinkView
from floodwall.ops.logs import LogLimiter
from floodwall.wire.relaycore import FrameCounts

PROTOCOLS = ("amqp091", "amqp10")


class LiveConnection(Protocol):
    """What the collector reads off a connection that is still open."""

    protocol: str
    from_client: FrameCounts
    from_server: FrameCounts

    @property
    def held_bytes(self) -> int:
        """Bytes of publishes the connection holds now (its hold budget's measure)."""

    def sender_links(self) -> tuple[str, list[LinkView]] | None:
        """Its vhost and its AMQP 1.0 sender links (None: not through the 1.0 credit gate)."""


@dataclass
class RelayStats:
    """Everything the relay counts; live connections are summed in when scraped."""

    live: set[LiveConnection] = field(default_factory=set)
    accepted: Counter[str] = field(default_factory=Counter)  # by protocol
    rejected_headers: int = 0
    closed_frames: Counter[tuple[str, str]] = field(default_factory=Counter)
    closed_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    protocol_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # protocol, side
    internal_errors: Counter[str] = field(default_factory=Counter)  # by protocol (relay.py)
    # body bytes moved with splice(2), by the side they came from (io/splice.py)
    spliced_bytes: Counter[str] = field(default_factory=Counter)
    # bytes of large reads the core was given as views of the read buffer, not copies, by
    # the side they came from (io/read_buffers.py)
    lent_read_bytes: Counter[str] = field(default_factory=Counter)
    upstream_connect_failures: int = 0
    upstream_tls_failures: int = 0  # of those, TLS handshakes that failed (or were refused)
    client_tls_failures: int = 0  # clients whose TLS handshake with the listener failed
    upstream_up: bool = False
    tasks: int = 0
    hold_budget: int = 0  # bytes held per connection before the relay stops reading it
    log_limits: LogLimiter = field(default_factory=LogLimiter)  # repeated relay lines

    def retire(self, conn: LiveConnection) -> None:
        """Move a closing connection's counts into the totals."""
        self.live.discard(conn)
        for direction, counts in (("client_to_server", conn.from_client),
                                  ("server_to_client", conn.from_server)):
            self.closed_frames[(conn.protocol, direction)] += counts.frames
            self.closed_bytes[(conn.protocol, direction)] += counts.bytes


class RelayCollector(Collector):
    """Turns a RelayStats into ``floodwall_*`` metric families."""

    def __init__(self, stats: RelayStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        active = GaugeMetricFamily(
            "floodwall_connections", "Client connections open now", labels=["protocol"]
        )
        live_by_protocol = Counter(c.protocol for c in s.live)
        for proto in PROTOCOLS:
            active.add_metric([proto], live_by_protocol[proto])
        yield active

        accepted = CounterMetricFamily(
            "floodwall_connections_accepted", "Client connections accepted, by protocol",
            labels=["protocol"],
        )
        for proto in PROTOCOLS:
            accepted.add_metric([proto], s.accepted[proto])
        yield accepted

        yield CounterMetricFamily(
            "floodwall_unsupported_headers",
            "Connections refused for a protocol header the proxy does not speak",
            value=s.rejected_headers,
        )

        frames = Counter(s.closed_frames)
        nbytes = Counter(s.closed_bytes)
        for c in list(s.live):
            frames[(c.protocol, "client_to_server")] += c.from_client.frames
            frames[(c.protocol, "server_to_client")] += c.from_server.frames
            nbytes[(c.protocol, "client_to_server")] += c.from_client.bytes
            nbytes[(c.protocol, "server_to_client")] += c.from_server.bytes
        yield _by_direction("floodwall_frames", "Frames relayed", frames)
        yield _by_direction("floodwall_relayed_bytes", "Bytes of frames relayed", nbytes)

        errors = CounterMetricFamily(
            "floodwall_protocol_errors",
            "Connections closed for malformed input, by protocol and the side that sent it",
            labels=["protocol", "side"],
        )
        for proto in PROTOCOLS:
            for side in ("client", "server"):
                errors.add_metric([proto, side], s.protocol_errors[(proto, side)])
        yield errors
        internal = CounterMetricFamily(
            "floodwall_relay_internal_errors",
            "Connections closed because the proxy itself failed on them (a bug: the log's "
            "relay_internal_error lines say where), by protocol", labels=["protocol"])
        for proto in PROTOCOLS:
            internal.add_metric([proto], s.internal_errors[proto])
        yield internal
        yield _by_side(
            "floodwall_spliced_bytes",
            "Body bytes moved socket to socket with splice(2), never read by the proxy (also "
            "counted in floodwall_relayed_bytes)", s.spliced_bytes)
        yield _by_side(
            "floodwall_lent_read_bytes",
            "Bytes of large reads the protocol core was handed as views of the read buffer, "
            "not copied (also counted in floodwall_relayed_bytes)", s.lent_read_bytes)

        yield from self._upstream()

    def _upstream(self) -> Iterator[Metric]:
        """The broker's side and the TLS listener; the event loop."""
        s = self.stats
        yield CounterMetricFamily(
            "floodwall_upstream_connect_failures",
            "Upstream (broker) connections that could not be opened",
            value=s.upstream_connect_failures,
        )
        yield CounterMetricFamily(
            "floodwall_upstream_tls_failures",
            "Upstream connections whose TLS handshake failed (verification, refused "
            "certificate): also counted in floodwall_upstream_connect_failures",
            value=s.upstream_tls_failures,
        )
        yield CounterMetricFamily(
            "floodwall_client_tls_failures",
            "Client connections to the TLS listener whose handshake failed",
            value=s.client_tls_failures,
        )
        yield GaugeMetricFamily(
            "floodwall_upstream_up", "1 if the broker answered the last probe",
            value=1 if s.upstream_up else 0,
        )
        yield GaugeMetricFamily(
            "floodwall_event_loop_tasks", "asyncio tasks alive in the proxy", value=s.tasks
        )
        yield from _hold_budget(s)


def _hold_budget(s: RelayStats) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "floodwall_hold_budget_bytes",
        "Bytes of held publishes per connection before the proxy stops reading it "
        "(--hold-budget)", value=s.hold_budget)
    yield GaugeMetricFamily(
        "floodwall_connection_held_bytes_max",
        "Bytes of publishes held now by the connection that holds the most",
        value=max((c.held_bytes for c in list(s.live)), default=0))


@dataclass
class AdminStats:
    """The admin server's own figures: connections served now, refused past the cap, cut
    for being too slow."""

    open: int = 0
    refused: int = 0
    timed_out: int = 0
    refusing: int = 0  # refused connections still being closed
    log_limits: LogLimiter = field(default_factory=LogLimiter)

    def as_dict(self) -> dict[str, int]:
        return {"connections": self.open, "refused": self.refused,
                "timed_out": self.timed_out}


class AdminCollector(Collector):
    """``floodwall_admin_*``: the admin server's connections, refusals and timeouts."""

    def __init__(self, stats: AdminStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily("floodwall_admin_connections",
                                "Admin connections being served now", value=s.open)
        yield CounterMetricFamily(
            "floodwall_admin_refused_connections",
            "Admin connections answered 503 because --admin-max-connections were being "
            "served", value=s.refused)
        yield CounterMetricFamily(
            "floodwall_admin_timeouts",
            "Admin connections cut because the client took longer than --admin-timeout to "
            "send its request or to take the answer", value=s.timed_out)


def _by_direction(name: str, doc: str, values: Counter[tuple[str, str]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["protocol", "direction"])
    for proto in PROTOCOLS:
        for direction in ("client_to_server", "server_to_client"):
            family.add_metric([proto, direction], values[(proto, direction)])
    return family


def _by_side(name: str, doc: str, values: Counter[str]) -> CounterMetricFamily:
    """A counter by the side the bytes came from: the client's or the broker's."""
    family = CounterMetricFamily(name, f"{doc}, by the side they came from", labels=["side"])
    for side in ("client", "server"):
        family.add_metric([side], values[side])
    return family


class MemoryBudgetCollector(Collector):
    """``floodwall_memory_budget_*``: the process-wide budget of held publishes (with
    ``--policies``), whether it is reached, and the connections it stopped reading."""

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        b = self.budget
        yield GaugeMetricFamily(
            "floodwall_memory_budget_bytes",
            "Bytes of held publishes of all connections together before the proxy stops "
            "reading the connections that hold publishes (--memory-budget)", value=b.limit)
        yield GaugeMetricFamily(
            "floodwall_memory_budget_reached",
            "1 while the memory budget is reached (until held bytes are back at 7/8 of it)",
            value=1 if b.engaged else 0)
        yield GaugeMetricFamily(
            "floodwall_memory_budget_paused_connections",
            "Connections not read now because the memory budget is reached",
            value=len(b.paused))
        yield CounterMetricFamily(
            "floodwall_memory_budget_pauses",
            "Connections paused by the memory budget, since the start", value=b.pauses_total)


class BuildInfoCollector(Collector):
    """``floodwall_build_info{version,python}``: always 1, for joins and upgrade dashboards."""

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("floodwall_build_info",
                                 "Always 1: the floodwall version and the Python running it",
                                 labels=["version", "python"])
        info.add_metric([__version__, platform.python_version()], 1)
        yield info


def standard_collectors() -> list[Collector]:
    """What every process exports besides its own figures: ``process_*`` (CPU, memory,
    file descriptors, start time), ``python_info`` and ``floodwall_build_info``."""
    return [ProcessCollector(registry=None), PlatformCollector(registry=None),
            BuildInfoCollector()]


def make_registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    """A registry of our own (not the process-global one) holding ``collectors``."""
    registry = CollectorRegistry(auto_describe=True)
    for c in collectors:
        registry.register(c)
    return registry
