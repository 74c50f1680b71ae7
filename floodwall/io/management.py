"""The broker's management HTTP API: queue figures, node alarms, the routing topology.

One ``aiohttp`` session on the event loop, its connections kept alive and pooled (at most
``connections`` open to the API at once), each request bounded by ``timeout``; https is
verified with the ``ManagementTlsContext`` (its newest context at each request, so a
rotated CA file takes over for new connections).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import json
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import yarl

from floodwall.control.depth import ManagementSample
from floodwall.io.tls import ManagementTlsContext, explain
from floodwall.ops.config import ManagementCredentials

QUEUE_COLUMNS = ",".join((
    "name", "vhost", "messages_ready", "messages_unacknowledged", "message_bytes",
    "message_bytes_ready", "message_bytes_unacknowledged", "consumers",
))
#: Seconds an idle pooled connection is kept open (below the API's own idle timeout, 60 s
#: in RabbitMQ's cowboy, so the proxy closes it first).
KEEPALIVE_SECONDS = 30.0
#: The endpoints the proxy reads, as the latency histogram labels them.
ENDPOINTS = ("queues", "nodes", "exchanges", "bindings", "policies")


class ManagementError(RuntimeError):
    """The management API did not answer usefully; ``kind`` says how, for metrics."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # auth | not_found | unreachable | timeout | tls | http | bad_reply
        self.status = status

    @property
    def node_down(self) -> bool:
        """Failed as a node that is down (or hung) fails: unreachable, silent, or 5xx."""
        return self.kind in ("unreachable", "timeout") or (
            self.status is not None and self.status >= 500)


@dataclass(frozen=True)
class NodeAlarms:
    """Resource alarms raised on any node of the cluster."""

    memory: tuple[str, ...]  # node names with the memory alarm
    disk: tuple[str, ...]

    @property
    def any(self) -> bool:
        return bool(self.memory or self.disk)


def _dots_only(name: str) -> bool:
    return bool(name) and name.strip(".") == ""


def path_segment(name: str) -> str:
    """A vhost or queue name as one path segment of an API URL: every byte but
    ``A-Z a-z 0-9 _ . - ~`` percent-encoded, and the dots too of a name made only of dots
    (``..`` must not be taken for "the level above" on the way)."""
    if _dots_only(name):
        return "%2E" * len(name)
    return urllib.parse.quote(name, safe="")


def api_path(endpoint: str, *names: str, query: str = "") -> str:
    """``/api/ENDPOINT/NAME/...?QUERY``, each name one encoded segment (``path_segment``)."""
    path = "/api/" + "/".join((endpoint, *(path_segment(n) for n in names)))
    return f"{path}?{query}" if query else path


def addressable(*names: str) -> bool:
    """Whether these names can be path segments of an API URL at all. RabbitMQ's HTTP
    router decodes each segment and then drops ``.`` and ``..`` segments (with the one
    before), so ``/api/queues/%2F/%2E%2E`` answers with the list of every queue: a
    dot-only name is read from a filtered listing instead (``ManagementApi.item``)."""
    return not any(_dots_only(n) for n in names)


#: Items per page when a dot-only name is looked up in a filtered listing, and pages at most.
LISTING_PAGE_SIZE = 500
LISTING_PAGES_MAX = 20


def endpoint_of(path: str) -> str:
    """The label of a request's latency: ``/api/queues/%2F/q?...`` is ``queues``."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    name = parts[1] if len(parts) > 1 and parts[0] == "api" else parts[0]
    return name if name in ENDPOINTS else "other"


class ManagementApi:
    """A client for the few endpoints floodwall reads, on the event loop.

    ``observe(endpoint, seconds)`` is told every request's latency, good or bad; ``close``
    ends the pooled connections (the session is made at the first request, on the loop
    that makes it).
    """

    def __init__(self, url: str | Sequence[str], credentials: ManagementCredentials,
                 timeout: float = 5.0, tls: ManagementTlsContext | None = None,
                 connections: int = 4,
                 observe: Callable[[str, float], None] | None = None) -> None:
        """``url``: one, or each node's of a cluster; a request that finds one unreachable,
        silent or unavailable (5xx) is asked of the next, which is used from then on.
        ``tls``: the https context, used for https URLs."""
        urls = (url,) if isinstance(url, str) else tuple(url)
        if not urls:
            raise ValueError("no management API URL")
        self.urls = tuple(u.rstrip("/") for u in urls)
        # each encoded once; paths are added encoded
        self._bases = tuple(str(yarl.URL(u)) for u in self.urls)
        self._current = 0  # the one that answered last
        self.timeout = timeout
        self.connections = connections
        self._tls = tls
        token = f"{credentials.username}:{credentials.password}".encode()
        self._auth = "Basic " + base64.b64encode(token).decode()
        self._observe = observe
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the session's
        self.requests = 0  # for metrics: load on the management API
        self.failures: dict[str, int] = {}
        self.opened = 0  # TCP connections opened to the API (the pool's reuse shows here)

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            trace = aiohttp.TraceConfig()
            trace.on_connection_create_end.append(self._connection_opened)
            connector = aiohttp.TCPConnector(limit=self.connections,
                                             keepalive_timeout=KEEPALIVE_SECONDS)
            session = aiohttp.ClientSession(
                connector=connector, trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                headers={"Authorization": self._auth}, raise_for_status=False)
            self._session, self._loop = session, loop
        return session

    async def _connection_opened(self, *_: object) -> None:
        self.opened += 1

    async def close(self) -> None:
        """Close the pooled connections (the next request opens new ones)."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    @property
    def url(self) -> str:
        """The URL requests go to now."""
        return self.urls[self._current]

    @property
    def tls(self) -> ManagementTlsContext | None:
        return self._tls if self.url.lower().startswith("https:") else None

    async def _fetch(self, path: str) -> Any:
        """``_fetch_one`` of the current URL; while it fails as a node that is down fails
        (unreachable, timeout, 5xx), of the next one, each at most once."""
        for attempt in range(len(self.urls)):
            try:
                return await self._fetch_one(path)
            except ManagementError as exc:
                if not exc.node_down or attempt == len(self.urls) - 1:
                    raise
                self._current = (self._current + 1) % len(self.urls)
        raise AssertionError("unreachable")  # pragma: no cover: the loop returns or raises

    async def _fetch_one(self, path: str) -> Any:
        context: ssl.SSLContext | bool = self.tls.context if self.tls is not None else True
        try:
            # encoded=True: the path is sent as built, %2E%2E and %2F included (yarl would
            # otherwise decode and normalise it: /api/queues/%2F/.. is /api/queues/).
            url = yarl.URL(self._bases[self._current] + path, encoded=True)
            async with self._client().get(url, ssl=context) as resp:
                status, reason = resp.status, resp.reason
                raw = await resp.read()
        except aiohttp.ClientConnectorCertificateError as exc:
            raise self._tls_error(exc.certificate_error) from None
        except aiohttp.ClientConnectorSSLError as exc:
            raise self._tls_error(exc.os_error) from None
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors too
            raise ManagementError("timeout", f"{self.url}{path}: no answer in "
                                  f"{self.timeout:g}s") from None
        except ssl.SSLError as exc:  # a TLS failure after the handshake
            raise self._tls_error(exc) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ManagementError("unreachable", f"{self.url}: {_reason(exc)}") from None
        if status == 401:
            raise ManagementError("auth", f"{self.url}: 401 unauthorized (check "
                                  "FLOODWALL_MANAGEMENT_USERNAME/PASSWORD)", 401)
        if status == 404:
            raise ManagementError("not_found", f"{path}: 404 not found", 404)
        if status >= 400:
            raise ManagementError("http", f"{path}: HTTP {status} {reason or ''}".rstrip(),
                                  status)
        try:
            return json.loads(raw)
        except ValueError:
            raise ManagementError("bad_reply", f"{path}: reply is not JSON") from None

    def _tls_error(self, exc: BaseException) -> ManagementError:
        name = urllib.parse.urlsplit(self.url).hostname
        ca = self.tls.settings.ca if self.tls is not None else None
        return ManagementError("tls", f"{self.url}: {explain(exc, name, ca)}")

    async def get(self, path: str) -> Any:
        """The JSON document at ``path``; ``ManagementError`` says why not."""
        self.requests += 1
        started = time.monotonic()
        try:
            return await self._fetch(path)
        except ManagementError as exc:
            self.failures[exc.kind] = self.failures.get(exc.kind, 0) + 1
            raise
        finally:
            if self._observe is not None:
                self._observe(endpoint_of(path), time.monotonic() - started)

    async def item(self, endpoint: str, vhost: str, name: str, query: str = "") -> Any:
        """The document of the queue or exchange ``name`` in ``vhost`` (``endpoint``:
        ``queues`` or ``exchanges``); None when there is none. By its own URL, or, for a
        name that cannot be a path segment (``addressable``), from the listing filtered on
        its name (``query`` must then keep the ``name`` and ``vhost`` columns)."""
        if addressable(vhost, name):
            try:
                return await self.get(api_path(endpoint, vhost, name, query=query))
            except ManagementError as exc:
                if exc.kind == "not_found":
                    return None
                raise
        where = api_path(endpoint, vhost) if addressable(vhost) else api_path(endpoint)
        pattern = urllib.parse.quote("^" + re.escape(name) + "$", safe="")
        for page in range(1, LISTING_PAGES_MAX + 1):
            doc = await self.get(f"{where}?page={page}&page_size={LISTING_PAGE_SIZE}"
                                 f"&use_regex=true&name={pattern}"
                                 + (f"&{query}" if query else ""))
            items = doc.get("items") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise ManagementError("bad_reply", f"{where}: expected a page of items")
            for found in items:
                if isinstance(found, dict) and found.get("name") == name \
                        and found.get("vhost") == vhost:
                    return found
            if page >= int(doc.get("page_count") or 1):
                break
        return None

    async def bindings_from(self, vhost: str, exchange: str) -> Any:
        """The bindings whose source is ``exchange`` (a list); for a name that cannot be a
        path segment, the vhost's bindings (or all) filtered here."""
        if addressable(vhost, exchange):
            return await self.get(api_path("exchanges", vhost, exchange) + "/bindings/source")
        listed = await self.get(api_path("bindings", vhost) if addressable(vhost)
                                else api_path("bindings"))
        if not isinstance(listed, list):
            raise ManagementError("bad_reply", "bindings: expected a list")
        return [b for b in listed if isinstance(b, dict) and b.get("source") == exchange
                and b.get("vhost") == vhost]

    async def queue_sample(self, vhost: str, queue: str
                           ) -> ManagementSample | NoStatistics | None:
        """One queue's figures; None when the queue does not exist; ``NO_STATISTICS`` when
        it has no figures yet (``sample_from_queue_doc``)."""
        taken_at = time.monotonic()
        doc = await self.item("queues", vhost, queue, query=f"columns={QUEUE_COLUMNS}")
        if doc is None:
            return None
        sample = sample_from_queue_doc(doc, taken_at)
        return NO_STATISTICS if sample is None else sample

    async def alarms(self) -> NodeAlarms:
        nodes = await self.get("/api/nodes?columns=name,mem_alarm,disk_free_alarm")
        if not isinstance(nodes, list):
            raise ManagementError("bad_reply", "/api/nodes: expected a list")
        return NodeAlarms(
            memory=tuple(n.get("name", "?") for n in nodes if n.get("mem_alarm")),
            disk=tuple(n.get("name", "?") for n in nodes if n.get("disk_free_alarm")),
        )

    async def topology(self) -> tuple[Any, Any, Any]:
        """The exchanges, queues and bindings documents, for the routing model."""
        exchanges = await self.get("/api/exchanges?columns=name,vhost,type,internal,arguments")
        queues = await self.get("/api/queues?columns=name,vhost,type")
        bindings = await self.get("/api/bindings")
        return exchanges, queues, bindings


class NoStatistics(enum.Enum):
    """The queue exists but the broker has no statistics for it yet."""

    NO_STATISTICS = "no statistics"


NO_STATISTICS: Final = NoStatistics.NO_STATISTICS


def sample_from_queue_doc(doc: Any, taken_at: float) -> ManagementSample | None:
    """Turn a /api/queues/VHOST/NAME document into a sample (missing figures count as 0).

    A queue whose statistics have not been emitted yet has no message figures at all: None,
    no sample. That is a queue just declared, but also every queue of a broker that has
    just restarted, recovering its persistent messages: taking that for "empty" would release
    tripped queues into a full broker; the passive declare's ready count decides
    until the statistics are in. A stream has message counts but no byte figures:
    ``bytes_known`` is then False.
    """
    if not isinstance(doc, dict):
        raise ManagementError("bad_reply", "queue document is not an object")
    if "messages_ready" not in doc and "messages_unacknowledged" not in doc:
        return None

    def n(key: str) -> int:
        value = doc.get(key, 0)
        return int(value) if isinstance(value, int | float) else 0

    ready, unacked, nbytes = n("messages_ready"), n("messages_unacknowledged"), n("message_bytes")
    return ManagementSample(
        taken_at=taken_at,
        messages_ready=ready,
        messages_unacknowledged=unacked,
        message_bytes=nbytes,
        message_bytes_ready=n("message_bytes_ready"),
        message_bytes_unacknowledged=n("message_bytes_unacknowledged"),
        # Messages without bytes: a stream (no byte figures at all), or counts newer than
        # the byte figures. The broker emits both with each statistics tick, but the
        # management plugin collects the counts (queue_coarse_metrics) and the byte figures
        # (queue_metrics) in separate passes, so a loaded broker can answer 33 messages and
        # 0 bytes for a queue that has just filled: taken as bytes, that read as empty and
        # released a full queue (the spool end-to-end test's 192-222 KiB in a 32 KiB queue).
        bytes_known="message_bytes" in doc and not (ready + unacked > 0 and nbytes == 0),
    )


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
