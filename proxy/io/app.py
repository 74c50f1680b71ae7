"""The running proxy: listener, admin endpoint, upstream probe, flow control, signals, shutdown.

With ``--policies``, ``Proxy.flow`` is the ``FlowSupervisor`` (proxy/io/flow.py): the relay
gets the ``FlowController`` as ``proxy.flow.controller`` and the routing model as
``proxy.flow.topology``; without policies ``Proxy.flow`` is None and nothing is policed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from typing import Any

from prometheus_client.registry import Collector

from proxy import __version__
from proxy.config import ProxySettings
from proxy.io.admin import AdminEndpoints, serve_admin
from proxy.io.flow import FlowSettings, FlowSupervisor
from proxy.io.relay import RelayedConnection, RelaySettings
from proxy.logs import event
from proxy.metrics import RelayCollector, RelayStats, make_registry
from proxy.routing import Topology

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
        collectors: list[Collector] = [RelayCollector(self.stats)]
        if self.flow is not None:
            collectors.append(self.flow.collector)
        self.registry = make_registry(collectors)
        self.relay_settings = RelaySettings(
            upstream_host=settings.upstream[0],
            upstream_port=settings.upstream[1],
            connect_timeout=settings.connect_timeout,
            handshake_timeout=settings.handshake_timeout,
            flow=self.flow.controller if self.flow is not None else None,
            hold_budget=settings.hold_budget,
            on_topology=self.flow.topology_changed if self.flow is not None else None,
        )
        self._ids = itertools.count(1)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        self._started = time.time()
        self.listen_port: int | None = None
        self.admin_port: int | None = None
        self._last_probe_error = "not probed yet"

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.settings.listen
        server = await loop.create_server(self._new_connection, host, port, backlog=1024)
        self._servers.append(server)
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
        event(log, "started", version=__version__, listen=f"{host}:{self.listen_port}",
              upstream="{}:{}".format(*self.settings.upstream),
              admin=(f"{self.settings.admin[0]}:{self.admin_port}" if self.settings.admin
                     else "off"), event_loop=type(loop).__module__.split(".")[0])

    async def run(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop, sig.name)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload_policies, "SIGHUP")
        await self._stopping.wait()
        await self.stop()

    def reload_policies(self, trigger: str = "SIGHUP") -> None:
        """SIGHUP: reload the policies file (connections are untouched)."""
        if self.flow is None:
            event(log, "reload_ignored", trigger=trigger, reason="no --policies given")
            return
        self.flow.reload(trigger)

    def request_stop(self, why: str = "requested") -> None:
        event(log, "stopping", reason=why, connections=len(self.stats.live))
        self._stopping.set()

    async def stop(self) -> None:
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
        if self.flow is not None:
            await self.flow.stop()
        self._servers.clear()
        event(log, "stopped")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections -------------------------------------------------------------------
    def _new_connection(self) -> RelayedConnection:
        return RelayedConnection(self.relay_settings, self.stats, next(self._ids))

    async def _expire_held_forever(self, interval: float = 0.25) -> None:
        """Refuse held publishes whose policy deadline has passed (nack or 406 close)."""
        assert self.flow is not None
        clock = self.flow.controller.clock
        while True:
            await asyncio.sleep(interval)
            if not self.flow.controller.held_messages:
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
        return doc


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
