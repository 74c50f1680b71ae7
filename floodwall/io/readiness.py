"""Whether the broker answers: the readiness probe behind ``/readyz`` and
``floodwall_upstream_up`` (``UpstreamProbe``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from floodwall.io.tls import (
    UpstreamTlsContext,
    ended_after_handshake,
    open_upstream,
    tls_error,
)
from floodwall.io.upstreams import Endpoint, Upstreams
from floodwall.ops.config import ProxySettings
from floodwall.ops.logs import event
from floodwall.ops.metrics import RelayStats

log = logging.getLogger("floodwall")

#: What the readiness probe sends: the AMQP 0-9-1 protocol header (the broker answers with
#: connection.start).
AMQP091_PROBE_HEADER = b"AMQP\x00\x00\x09\x01"
#: Seconds the probe waits for the broker's connection.start once connected. With the
#: default 5 s interval a broker that hangs is reported within 5 + 3 = 8 s.
PROBE_ANSWER_WAIT = 3.0
#: Seconds between probes while the broker does not answer (a refused connection fails at
#: once; a hung broker's probe waits ``PROBE_ANSWER_WAIT`` and answers the moment it wakes).
PROBE_RETRY_WHILE_DOWN = 0.5


class BrokerHung(OSError):
    """The broker accepted the TCP connection but did not answer the protocol header."""


class UpstreamProbe:
    """Probes every node of the upstream every ``--upstream-probe-interval`` (at once again
    while none answers); ``stats.upstream_up`` says whether one answers, ``upstreams``
    which, and ``last_error`` why none does."""

    def __init__(self, settings: ProxySettings, upstreams: Upstreams,
                 upstream_tls: UpstreamTlsContext | None, stats: RelayStats) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.upstream_tls = upstream_tls
        self.stats = stats
        self.last_error = "not probed yet"

    @property
    def label(self) -> str:
        return f"{'amqps://' if self.upstream_tls is not None else ''}{self.upstreams.label}"

    async def probe(self) -> bool:
        """Does a node of the broker answer at the AMQP level? Every node's addresses are
        probed side by side (``probe_node``); each finding goes to ``upstreams``, which
        orders the connections by it and ends those on a node that stopped answering."""
        try:
            endpoints = await self.upstreams.endpoints()
        except OSError as exc:
            self._probe_failed(str(exc))
            return False
        found = await asyncio.gather(*(self.probe_node(ep) for ep in endpoints))
        errors = []
        for endpoint, error in zip(endpoints, found, strict=True):
            if error is None:
                if self.upstreams.answered(endpoint) and len(endpoints) > 1:
                    event(log, "upstream_node_answers", upstream=str(endpoint))
            else:
                errors.append(f"{endpoint}: {error}" if len(endpoints) > 1 else error)
                if self.upstreams.failed(endpoint, error, probed=True) and len(endpoints) > 1:
                    event(log, "upstream_node_down", logging.WARNING, upstream=str(endpoint),
                          reason=error, action="connections go to the other nodes")
        if len(errors) == len(endpoints):
            self._probe_failed("; ".join(errors))
            return False
        if not self.stats.upstream_up:
            event(log, "upstream_reachable", upstream=self.label)
        self.stats.upstream_up = True
        self.last_error = ""
        return True

    async def probe_node(self, endpoint: Endpoint) -> str | None:
        """Does the node at ``endpoint`` answer? None, or why not. TCP (with amqps the TLS
        handshake, the certificate verified as for a client), then the 0-9-1 protocol
        header, and the broker's first bytes (its connection.start) within
        ``PROBE_ANSWER_WAIT``: a hung (frozen, overloaded) broker still completes TCP
        handshakes in the kernel, so a probe that only connects calls it up. With TLS 1.3 a
        broker that refuses our client certificate says so on that first read."""
        tls = self.upstream_tls
        host = endpoint.host
        try:
            async with asyncio.timeout(self.settings.connect_timeout):
                reader, writer = await open_upstream(endpoint.address, endpoint.port, tls,
                                                     name=host)
            try:
                await self._await_connection_start(reader, writer)
            except OSError as after:  # after the TLS handshake: a reset is a refusal
                raise tls_error(after, tls, host) from None
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        except (OSError, TimeoutError) as raised:
            exc = tls_error(raised, tls, host, greeted=True)  # the handshake's own errors
            if isinstance(exc, TimeoutError):
                return f"no answer within {self.settings.connect_timeout}s"
            return str(exc) or type(exc).__name__
        return None

    async def _await_connection_start(self, reader: asyncio.StreamReader,
                                      writer: asyncio.StreamWriter) -> None:
        """Send the protocol header; the broker's first bytes must come within
        ``PROBE_ANSWER_WAIT`` (``BrokerHung``, an OSError, if not)."""
        writer.write(AMQP091_PROBE_HEADER)
        try:
            async with asyncio.timeout(PROBE_ANSWER_WAIT):
                first = await reader.read(7)
        except TimeoutError:
            raise BrokerHung(f"connected, but no connection.start within "
                             f"{PROBE_ANSWER_WAIT:g}s: the broker does not answer") from None
        if not first:
            if self.upstream_tls is not None:
                raise ended_after_handshake(self.upstream_tls, "EOF")
            raise ConnectionResetError("the broker closed the connection before "
                                       "connection.start")

    def _probe_failed(self, reason: str) -> None:
        first_failure = self.stats.upstream_up or self.last_error == "not probed yet"
        self.stats.upstream_up = False
        changed = reason != self.last_error
        self.last_error = reason
        if first_failure or changed:  # once per outage (and per new reason)
            event(log, "upstream_probe_failed", logging.WARNING,
                  upstream=self.label, reason=reason)

    async def forever(self) -> None:
        """Every ``--upstream-probe-interval`` while the broker answers; while it does not,
        probe again at once (each probe waits for the answer), so readiness comes back as
        soon as the broker does."""
        while True:
            up = await self.probe()
            self.stats.tasks = len(asyncio.all_tasks())
            await asyncio.sleep(self.settings.upstream_probe_interval if up
                                else PROBE_RETRY_WHILE_DOWN)
