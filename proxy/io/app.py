"""The running proxy: listener, admin endpoint, upstream probe, flow control, signals, shutdown.

Shutdown (SIGTERM or SIGINT) is a drain: the listener closes (new connections are refused),
``/readyz`` answers 503 with ``"reason": "draining"``, and the connections already open keep
being relayed, with the gate still working (held publishes are released as their queues
drain), until none is left or ``--drain-timeout`` passes; then what is left is closed and
the last log line (``stopped``) says how much that was. A second signal ends the drain at
once.

With ``--policies``, ``Proxy.flow`` is the ``FlowSupervisor`` (proxy/io/flow.py): the relay
gets the ``FlowController`` as ``proxy.flow.controller`` and the routing model as
``proxy.flow.topology``; without policies ``Proxy.flow`` is None and nothing is policed.

With ``--spool-dir`` (and policies), ``Proxy.spool`` is the ``SpoolService``
(proxy/io/spool.py): the relay writes ``overflow: spool`` publishes to its manager; it is
recovered before the listener opens and stopped after the connections are closed.
``SpoolService.drain(deadline)`` is the spool's part of the SIGTERM drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.registry import Collector

from proxy import __version__
from proxy.config import ProxySettings
from proxy.gate import QueueKey
from proxy.io.admin import AdminEndpoints, serve_admin
from proxy.io.flow import FlowSettings, FlowSupervisor
from proxy.io.relay import RelayedConnection, RelaySettings
from proxy.io.spool import SpoolService, SpoolServiceSettings
from proxy.io.telemetry import Telemetry, TelemetrySettings
from proxy.logs import event
from proxy.metrics import RelayCollector, RelayStats, make_registry
from proxy.policy import set_spool_available
from proxy.routing import Topology
from proxy.spool.manager import SpoolLimits
from proxy.telemetry import RotationPolicy

log = logging.getLogger("floodwall")


class Proxy:
    """One floodwall process' worth of state; ``await run()`` until stopped."""

    def __init__(self, settings: ProxySettings) -> None:
        """Raises ``PolicyError`` (``FILE:LINE: reason``) for a bad policies file."""
        self.settings = settings
        self.stats = RelayStats()
        self.flow: FlowSupervisor | None = None
        if settings.policies is not None:
            self.flow = FlowSupervisor(FlowSettings.from_proxy_settings(settings), Topology())
        self.telemetry: Telemetry | None = None
        if settings.telemetry_dir is not None and self.flow is not None:
            self.telemetry = make_telemetry(settings, self.flow, self._spooled)
        self.spool: SpoolService | None = None
        if settings.spool_dir is not None and self.flow is not None:
            self.spool = make_spool(settings, self.flow)
        set_spool_available(self.spool is not None)
        collectors: list[Collector] = [RelayCollector(self.stats)]
        if self.flow is not None:
            collectors.append(self.flow.collector)
        if self.spool is not None:
            collectors.append(self.spool.collector)
        self.registry = make_registry(collectors)
        self.relay_settings = RelaySettings(
            upstream_host=settings.upstream[0],
            upstream_port=settings.upstream[1],
            connect_timeout=settings.connect_timeout,
            handshake_timeout=settings.handshake_timeout,
            flow=self.flow.controller if self.flow is not None else None,
            hold_budget=settings.hold_budget,
            on_topology=self.flow.topology_changed if self.flow is not None else None,
            spool=self.spool.manager if self.spool is not None else None,
        )
        self._ids = itertools.count(1)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self._drain_cut = asyncio.Event()  # a second SIGTERM/SIGINT: stop waiting
        self._drain_deadline: float | None = None  # loop.time() when the drain gives up
        self._listener: asyncio.Server | None = None
        self._started = time.time()
        self.listen_port: int | None = None
        self.admin_port: int | None = None
        self._last_probe_error = "not probed yet"

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.spool is not None:
            await self.spool.start()  # recovered before any client can publish
            await self._know_spooled_queues()
        elif self.settings.spool_dir is not None:
            event(log, "spool_off", logging.WARNING, reason="no --policies given: nothing "
                  "is policed, so nothing is spooled")
        host, port = self.settings.listen
        server = await loop.create_server(self._new_connection, host, port, backlog=1024)
        self._servers.append(server)
        self._listener = server
        self.listen_port = server.sockets[0].getsockname()[1]
        if self.settings.admin is not None:
            endpoints = AdminEndpoints(self.registry, self._readiness, self.state)
            admin = await serve_admin(endpoints, *self.settings.admin)
            self._servers.append(admin)
            self.admin_port = admin.sockets[0].getsockname()[1]
        self._spawn(self._probe_upstream_forever(), "upstream-probe")
        if self.flow is not None:
            await self.flow.start()
            self._spawn(self._expire_held_forever(), "deadlines")
        if self.telemetry is not None:
            await self.telemetry.start()
        elif self.settings.telemetry_dir is not None:
            event(log, "telemetry_off", logging.WARNING, reason="no --policies given: "
                  "nothing is policed, so there is nothing to record")
        event(log, "started", version=__version__, listen=f"{host}:{self.listen_port}",
              upstream="{}:{}".format(*self.settings.upstream),
              admin=(f"{self.settings.admin[0]}:{self.admin_port}" if self.settings.admin
                     else "off"), event_loop=type(loop).__module__.split(".")[0])

    def _spooled(self) -> Mapping[QueueKey, int]:
        """Bytes in each queue's spool not yet confirmed by the broker (for telemetry)."""
        if self.spool is None:
            return {}
        return {k: s.pending_bytes for k, s in self.spool.manager.spools.items()}

    async def _know_spooled_queues(self) -> None:
        """A queue with spooled backlog must be routed and policed before the first client
        publish, or that publish would overtake the backlog (FIFO per queue): declare the
        backlogged queues in the routing model (the default exchange reaches them at once)
        and load the topology once (every other route) before the listener opens."""
        if self.flow is None or self.spool is None:
            return
        backlogged = list(self.spool.manager.backlogged())
        if not backlogged:
            return
        for vhost, queue in backlogged:
            self.flow.queue_declared(vhost, queue)
        try:
            loaded = await asyncio.wait_for(self.flow.sync_topology(),
                                            2 * self.settings.connect_timeout)
        except TimeoutError:
            loaded = False
        if not loaded:
            event(log, "spool_routes_unknown", logging.WARNING, queues=len(backlogged),
                  reason="the topology could not be loaded before accepting clients",
                  action="publishes through other exchanges than the default one may "
                         "overtake the spooled backlog until it loads")

    async def run(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload_policies, "SIGHUP")
        await self._stopping.wait()
        await self.drain()
        await self.stop()

    def reload_policies(self, trigger: str = "SIGHUP") -> None:
        """SIGHUP: reload the policies file (connections are untouched)."""
        if self.flow is None:
            event(log, "reload_ignored", trigger=trigger, reason="no --policies given")
            return
        self.flow.reload(trigger)

    def request_stop(self, why: str = "requested") -> None:
        """First call: begin the drain (``run`` does it). Again: end the drain at once."""
        if self._stopping.is_set():
            if not self._drain_cut.is_set():
                event(log, "drain_cut_short", reason=why, connections=len(self.stats.live))
                self._drain_cut.set()
            return
        held_messages, held_bytes = self._held()
        event(log, "stopping", reason=why, action="draining",
              drain_timeout=self.settings.drain_timeout, connections=len(self.stats.live),
              held_messages=held_messages, held_bytes=held_bytes)
        self._stopping.set()

    async def drain(self) -> None:
        """Refuse new connections; relay the open ones until they are gone or the deadline.

        The admin endpoint keeps answering (``/readyz`` is 503, reason ``draining``), and
        the flow supervisor and deadline sweeps keep running, so held publishes are still
        released or refused as their queues drain while the drain waits.
        """
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        loop = asyncio.get_running_loop()
        self._drain_deadline = loop.time() + self.settings.drain_timeout
        # The spool takes no new records (publishes are held instead) and replays what it
        # has while the queues allow, until it is empty or the deadline.
        spool_drain = (loop.create_task(self.spool.drain(self._drain_deadline), name="spool-drain")
                       if self.spool is not None else None)
        while self.stats.live and not self._drain_cut.is_set():
            left = self._drain_deadline - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drain_cut.wait(), min(0.05, left))
        if spool_drain is not None:
            if self._drain_cut.is_set():
                spool_drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await spool_drain

    def _held(self) -> tuple[int, int]:
        """(messages, body bytes) of publishes held right now, on every connection."""
        if self.flow is None:
            return 0, 0
        return self.flow.controller.held_messages, self.flow.controller.held_bytes

    async def stop(self) -> None:
        connections_left = len(self.stats.live)
        held_messages, held_bytes = self._held()
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for conn in list(self.stats.live):
            if isinstance(conn, RelayedConnection):
                conn.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.spool is not None:
            await self.spool.stop()  # logs what stays on disk for the next start
        if self.telemetry is not None:
            await self.telemetry.stop()
        if self.flow is not None:
            await self.flow.stop()
        self._servers.clear()
        # The last line: what the drain could not finish (all zero after a clean drain).
        event(log, "stopped", logging.WARNING if connections_left else logging.INFO,
              drained=connections_left == 0, connections_left=connections_left,
              held_messages_left=held_messages, held_bytes_left=held_bytes)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections -------------------------------------------------------------------
    def _new_connection(self) -> RelayedConnection:
        return RelayedConnection(self.relay_settings, self.stats, next(self._ids))

    async def _expire_held_forever(self, interval: float = 0.25) -> None:
        """Refuse held publishes (nack or 406 close) and withheld 1.0 links (detach) whose
        policy deadline has passed."""
        assert self.flow is not None
        clock = self.flow.controller.clock
        while True:
            await asyncio.sleep(interval)
            controller = self.flow.controller
            if not controller.held_messages and not controller.blocked_count:
                continue
            now = clock()
            for conn in list(self.stats.live):
                if isinstance(conn, RelayedConnection):
                    conn.expire_held(now)

    # -- upstream probe ----------------------------------------------------------------
    async def probe_upstream(self) -> bool:
        host, port = self.settings.upstream
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                               self.settings.connect_timeout)
        except (OSError, TimeoutError) as exc:
            first_failure = self.stats.upstream_up or self._last_probe_error == "not probed yet"
            self.stats.upstream_up = False
            self._last_probe_error = str(exc) or type(exc).__name__
            if first_failure:  # once per outage, not every probe
                event(log, "upstream_probe_failed", logging.WARNING,
                      upstream=f"{host}:{port}", reason=self._last_probe_error)
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if not self.stats.upstream_up:
            event(log, "upstream_reachable", upstream=f"{host}:{port}")
        self.stats.upstream_up = True
        self._last_probe_error = ""
        return True

    async def _probe_upstream_forever(self) -> None:
        while True:
            await self.probe_upstream()
            self.stats.tasks = len(asyncio.all_tasks())
            await asyncio.sleep(self.settings.upstream_probe_interval)

    # -- admin views -------------------------------------------------------------------
    def _readiness(self) -> tuple[bool, dict[str, object]]:
        checks: dict[str, object] = {"upstream": self.stats.upstream_up}
        if not self.stats.upstream_up:
            checks["upstream_error"] = self._last_probe_error
        if self._stopping.is_set():
            checks["stopping"] = True
            checks["reason"] = "draining"
            held_messages, held_bytes = self._held()
            draining: dict[str, object] = {"connections": len(self.stats.live),
                                           "held_messages": held_messages,
                                           "held_bytes": held_bytes}
            if self._drain_deadline is not None:
                draining["seconds_left"] = round(
                    max(0.0, self._drain_deadline - asyncio.get_running_loop().time()), 1)
            checks["draining"] = draining
        ok = self.stats.upstream_up and not self._stopping.is_set()
        if self.flow is not None:
            flow_ok, checks["flow"] = self.flow.readiness()
            ok = ok and flow_ok
        return ok, checks

    def state(self) -> dict[str, object]:
        self.stats.tasks = len(asyncio.all_tasks())
        doc: dict[str, object] = {
            "version": __version__,
            "uptime_seconds": round(time.time() - self._started, 3),
            "upstream": "{}:{}".format(*self.settings.upstream),
            "upstream_up": self.stats.upstream_up,
            "connections": [
                {"id": c.conn_id, "peer": c.peer, "protocol": c.protocol}
                for c in sorted(self.stats.live, key=lambda c: getattr(c, "conn_id", 0))
                if isinstance(c, RelayedConnection)
            ],
            "tasks": self.stats.tasks,
        }
        if self.flow is not None:
            doc["flow"] = self.flow.state()
        if self.spool is not None:
            doc["spool"] = self.spool.state()
        return doc


def make_telemetry(settings: ProxySettings, flow: FlowSupervisor,
                   spooled: Callable[[], Mapping[QueueKey, int]] | None = None) -> Telemetry:
    """``--telemetry-dir``: the controller's samples and events, to rotated NDJSON files."""
    assert settings.telemetry_dir is not None
    rotation = RotationPolicy(settings.telemetry_file_bytes, settings.telemetry_file_age,
                              settings.telemetry_total_bytes)
    return Telemetry(TelemetrySettings(settings.telemetry_dir, settings.telemetry_interval,
                                       rotation),
                     flow.controller, depth_known=lambda: flow.stats.depth_known,
                     spooled=spooled)


def make_spool(settings: ProxySettings, flow: FlowSupervisor) -> SpoolService:
    """``--spool-dir``: the spool, replaying through its own connections to the upstream."""
    assert settings.spool_dir is not None
    return SpoolService(
        SpoolServiceSettings(settings.spool_dir, settings.upstream[0], settings.upstream[1],
                             settings.effective_amqp_credentials,
                             SpoolLimits(settings.spool_total_max, settings.spool_min_free),
                             connect_timeout=settings.connect_timeout),
        flow.controller, flow.topology, ready=lambda: flow.readiness()[0])


def run_proxy(settings: ProxySettings) -> None:
    """Run until SIGTERM/SIGINT, on uvloop when it is there and not turned off."""
    proxy = Proxy(settings)
    choice = settings.event_loop
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            uvloop.run(proxy.run())
            return
    asyncio.run(proxy.run())
