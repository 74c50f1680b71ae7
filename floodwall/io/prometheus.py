"""The broker's Prometheus endpoint as a depth source: each policed queue's ready bytes and
messages when the management API has no figures (statistics off), or does not answer (a
cluster with a hung node: every node's API waits on it for queue figures, while each live
node's Prometheus endpoint answers from its own tables).

RabbitMQ with ``management_agent.disable_metrics_collector = true`` (or
``management.disable_stats``) answers ``/api/queues`` with names only. Its Prometheus
plugin's detailed endpoint still has the figures; floodwall asks every node's (each reports
the queues it runs) for one vhost and the two families it needs
(``/metrics/detailed?vhost=V&family=queue_coarse_metrics&family=queue_metrics``: RabbitMQ
4.0 filters by vhost and family, not by queue), all at once, and reads each page as it
arrives with the sans-IO ``floodwall.wire.prometheus.ExpositionParser``, keeping
only the queue metrics; each node's figures are handed on as its page ends, merged with the
pages before (``PagesMerged``). The figures are the ones the queue emitted at its last statistics
tick, as old as the management API's would be: they are dated back the same way.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Sequence

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
    """A client of the broker's ``/metrics/detailed``, on the event loop: one URL per node
    (each node reports the queues it runs: a classic queue's node, a quorum queue's leader),
    all asked at once, each page handed on as it arrives; one pooled session, each request
    bounded by ``timeout``; https verified as the management API is."""

    def __init__(self, urls: Sequence[str], timeout: float = 5.0,
                 tls: ManagementTlsContext | None = None,
                 observe: Callable[[str, float], None] | None = None) -> None:
        if not urls:
            raise ValueError("a Prometheus endpoint needs a URL")
        self.urls = tuple(url.rstrip("/") for url in urls)
        self.timeout = timeout
        self.tls = tls
        self._observe = observe
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.requests = 0

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=2 * len(self.urls),
                                               keepalive_timeout=KEEPALIVE_SECONDS),
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

    async def vhost_pages(self, vhost: str
                          ) -> AsyncGenerator[dict[str, ManagementSample] | ManagementError, None]:
        """Every node's depth samples of ``vhost``'s queues (the queues it runs), each as
        its page arrives, or why that node did not answer (``ManagementError``, kinds as the
        management API's): a node that answers is not kept waiting behind one that does
        not (a hung node costs only its own page)."""
        self.requests += 1
        started = time.monotonic()
        asks = [asyncio.ensure_future(self._figures(url, vhost)) for url in self.urls]
        try:
            for arrived in asyncio.as_completed(asks):
                try:
                    figures = await arrived
                except ManagementError as exc:
                    yield exc
                    continue
                page: dict[str, ManagementSample] = {}
                for queue, found in figures.items():
                    sample = sample_of(found, started)
                    if sample is not None:
                        page[queue] = sample
                yield page
        finally:
            for ask in asks:
                ask.cancel()
            if self._observe is not None:
                self._observe("prometheus", time.monotonic() - started)

    async def _figures(self, url: str, vhost: str) -> dict[str, QueueFigures]:
        path = self.path_for(vhost)
        tls = self.tls if url.lower().startswith("https:") else None
        context: ssl.SSLContext | bool = tls.context if tls is not None else True
        parser = ExpositionParser(QUEUE_METRICS)
        samples = []
        try:
            async with self._client().get(url + path, ssl=context) as resp:
                if resp.status >= 400:
                    kind = "not_found" if resp.status == 404 else "http"
                    raise ManagementError(kind, f"{url}{path}: HTTP {resp.status}",
                                          resp.status)
                async for chunk in resp.content.iter_chunked(CHUNK):
                    samples += parser.feed(chunk)
            samples += parser.close()
        except ExpositionError as exc:
            raise ManagementError("bad_reply", f"{url}{path}: not the Prometheus "
                                  f"text format ({exc})") from None
        except TimeoutError:
            raise ManagementError("timeout", f"{url}{path}: no answer in "
                                  f"{self.timeout:g}s") from None
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientConnectorSSLError,
                ssl.SSLError) as exc:
            name = urllib.parse.urlsplit(url).hostname
            ca = tls.settings.ca if tls is not None else None
            raise ManagementError("tls", f"{url}: {explain(exc, name, ca)}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ManagementError("unreachable", f"{url}: {type(exc).__name__}: "
                                  f"{exc}") from None
        return queue_figures(samples, vhost)


class PagesMerged:
    """One round's pages, merged as they arrive (each queue is reported by the node that runs
    it; should two report it, during a leader change, the higher ready bytes err on the side
    of a trip): ``take(page)`` returns what the page adds, the queues it reports first or
    higher than the pages before it."""

    def __init__(self) -> None:
        self.samples: dict[str, ManagementSample] = {}

    def take(self, page: dict[str, ManagementSample]) -> dict[str, ManagementSample]:
        news: dict[str, ManagementSample] = {}
        for queue, found in page.items():
            had = self.samples.get(queue)
            if had is None or found.message_bytes_ready > had.message_bytes_ready:
                self.samples[queue] = news[queue] = found
        return news
