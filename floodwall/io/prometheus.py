"""The broker's Prometheus endpoint as a depth source: each policed queue's ready bytes and
messages when the management API has no figures (statistics off).

RabbitMQ with ``management_agent.disable_metrics_collector = true`` (or
``management.disable_stats``) answers ``/api/queues`` with names only. Its Prometheus
plugin's detailed endpoint still has the figures; floodwall asks it for one vhost and the two
families it needs (``/metrics/detailed?vhost=V&family=queue_coarse_metrics&
family=queue_metrics``: RabbitMQ 4.0 filters by vhost and family, not by queue) and reads the
page as it arrives with the sans-IO ``floodwall.wire.prometheus.ExpositionParser``, keeping
only the queue metrics. The figures are the ones the queue emitted at its last statistics
tick, as old as the management API's would be: they are dated back the same way.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import Callable

import aiohttp

from floodwall.control.depth import DepthSource, ManagementSample
from floodwall.io.management import KEEPALIVE_SECONDS, ManagementError
from floodwall.io.tls import ManagementTlsContext, explain
from floodwall.wire.prometheus import (
    FAMILIES,
    QUEUE_METRICS,
    ExpositionError,
    ExpositionParser,
    QueueFigures,
    queue_figures,
)

CHUNK = 64 * 1024


def sample_of(figures: QueueFigures, taken_at: float) -> ManagementSample | None:
    """A depth sample from one queue's Prometheus figures; None without ready bytes and
    messages."""
    if figures.ready_messages is None or figures.ready_bytes is None:
        return None
    unacked = figures.unacked_messages or 0
    unacked_bytes = figures.unacked_bytes or 0
    return ManagementSample(
        taken_at=taken_at, messages_ready=figures.ready_messages,
        messages_unacknowledged=unacked,
        message_bytes=figures.ready_bytes + unacked_bytes,
        message_bytes_ready=figures.ready_bytes, message_bytes_unacknowledged=unacked_bytes,
        bytes_known=True, source=DepthSource.PROMETHEUS)


class PrometheusEndpoint:
    """A client of the broker's ``/metrics/detailed``, on the event loop (one pooled
    session, each request bounded by ``timeout``; https verified as the management API is)."""

    def __init__(self, url: str, timeout: float = 5.0, tls: ManagementTlsContext | None = None,
                 observe: Callable[[str, float], None] | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.tls = tls if self.url.lower().startswith("https:") else None
        self._observe = observe
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0
        self.failures: dict[str, int] = {}

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2, keepalive_timeout=KEEPALIVE_SECONDS),
                timeout=aiohttp.ClientTimeout(total=self.timeout), raise_for_status=False)
            self._session, self._loop = session, loop
        return session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    def path_for(self, vhost: str) -> str:
        families = "".join(f"&family={f}" for f in FAMILIES)
        return f"/metrics/detailed?vhost={urllib.parse.quote(vhost, safe='')}{families}"

    async def vhost_samples(self, vhost: str) -> dict[str, ManagementSample]:
        """The depth samples of ``vhost``'s queues the endpoint has figures for;
        ``ManagementError`` (kinds as the management API's) says why not."""
        self.requests += 1
        started = time.monotonic()
        try:
            figures = await self._figures(vhost)
        except ManagementError as exc:
            self.failures[exc.kind] = self.failures.get(exc.kind, 0) + 1
            raise
        finally:
            if self._observe is not None:
                self._observe("prometheus", time.monotonic() - started)
        out: dict[str, ManagementSample] = {}
        for queue, found in figures.items():
            sample = sample_of(found, started)
            if sample is not None:
                out[queue] = sample
        return out

    async def _figures(self, vhost: str) -> dict[str, QueueFigures]:
        path = self.path_for(vhost)
        context: ssl.SSLContext | bool = self.tls.context if self.tls is not None else True
        parser = ExpositionParser(QUEUE_METRICS)
        samples = []
        try:
            async with self._client().get(self.url + path, ssl=context) as resp:
                if resp.status >= 400:
                    kind = "not_found" if resp.status == 404 else "http"
                    raise ManagementError(kind, f"{self.url}{path}: HTTP {resp.status}",
                                          resp.status)
                async for chunk in resp.content.iter_chunked(CHUNK):
                    samples += parser.feed(chunk)
            samples += parser.close()
        except ExpositionError as exc:
            raise ManagementError("bad_reply", f"{self.url}{path}: not the Prometheus "
                                  f"text format ({exc})") from None
        except TimeoutError:
            raise ManagementError("timeout", f"{self.url}{path}: no answer in "
                                  f"{self.timeout:g}s") from None
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientConnectorSSLError,
                ssl.SSLError) as exc:
            name = urllib.parse.urlsplit(self.url).hostname
            ca = self.tls.settings.ca if self.tls is not None else None
            raise ManagementError("tls", f"{self.url}: {explain(exc, name, ca)}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ManagementError("unreachable", f"{self.url}: {type(exc).__name__}: "
                                  f"{exc}") from None
        return queue_figures(samples, vhost)
