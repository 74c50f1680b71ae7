"""The broker's management HTTP API: queue figures, node alarms, the routing topology."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from floodwall.control.depth import ManagementSample
from floodwall.io.tls import ManagementTlsContext, explain
from floodwall.ops.config import ManagementCredentials

QUEUE_COLUMNS = ",".join((
    "name", "vhost", "messages_ready", "messages_unacknowledged", "message_bytes",
    "message_bytes_ready", "message_bytes_unacknowledged", "consumers",
))


class ManagementError(RuntimeError):
    """The management API did not answer usefully; ``kind`` says how, for metrics."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # auth | not_found | unreachable | timeout | tls | http | bad_reply
        self.status = status


@dataclass(frozen=True)
class NodeAlarms:
    """Resource alarms raised on any node of the cluster."""

    memory: tuple[str, ...]  # node names with the memory alarm
    disk: tuple[str, ...]

    @property
    def any(self) -> bool:
        return bool(self.memory or self.disk)


class ManagementApi:
    """A client for the few endpoints floodwall reads; each call runs off the event loop."""

    def __init__(self, url: str, credentials: ManagementCredentials, timeout: float = 5.0,
                 tls: ManagementTlsContext | None = None) -> None:
        """``tls``: the https context, used when ``url`` is https."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.tls = tls if self.url.lower().startswith("https:") else None
        token = f"{credentials.username}:{credentials.password}".encode()
        self._auth = "Basic " + base64.b64encode(token).decode()
        self.requests = 0  # for metrics: load on the management API
        self.failures: dict[str, int] = {}

    def _get_blocking(self, path: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Authorization": self._auth})
        context = self.tls.context if self.tls is not None else None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise ManagementError("auth", f"{self.url}: 401 unauthorized (check "
                                      "FLOODWALL_MANAGEMENT_USERNAME/PASSWORD)", 401) from None
            if exc.code == 404:
                raise ManagementError("not_found", f"{path}: 404 not found", 404) from None
            raise ManagementError("http", f"{path}: HTTP {exc.code} {exc.reason}",
                                  exc.code) from None
        except TimeoutError:
            raise ManagementError("timeout", f"{self.url}{path}: no answer in "
                                  f"{self.timeout}s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLError):
                name = urllib.parse.urlsplit(self.url).hostname
                ca = self.tls.settings.ca if self.tls is not None else None
                raise ManagementError("tls", f"{self.url}: {explain(reason, name, ca)}"
                                      ) from None
            kind = "timeout" if isinstance(reason, TimeoutError) else "unreachable"
            raise ManagementError(kind, f"{self.url}: {reason}") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise ManagementError("bad_reply", f"{path}: reply is not JSON") from None

    async def get(self, path: str) -> Any:
        self.requests += 1
        try:
            return await asyncio.to_thread(self._get_blocking, path)
        except ManagementError as exc:
            self.failures[exc.kind] = self.failures.get(exc.kind, 0) + 1
            raise

    async def queue_sample(self, vhost: str, queue: str) -> ManagementSample | None:
        """One queue's figures; None when the queue does not exist."""
        taken_at = time.monotonic()
        path = (f"/api/queues/{urllib.parse.quote(vhost, safe='')}/"
                f"{urllib.parse.quote(queue, safe='')}?columns={QUEUE_COLUMNS}")
        try:
            doc = await self.get(path)
        except ManagementError as exc:
            if exc.kind == "not_found":
                return None
            raise
        return sample_from_queue_doc(doc, taken_at)

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


def sample_from_queue_doc(doc: Any, taken_at: float) -> ManagementSample:
    """Turn a /api/queues/VHOST/NAME document into a sample (missing figures count as 0).

    A queue whose statistics have not been emitted yet (just declared) has no figures at
    all; that is reported as zero, which the ledger then corrects upward. A stream has
    message counts but no byte figures: ``bytes_known`` is then False.
    """
    if not isinstance(doc, dict):
        raise ManagementError("bad_reply", "queue document is not an object")

    def n(key: str) -> int:
        value = doc.get(key, 0)
        return int(value) if isinstance(value, int | float) else 0

    return ManagementSample(
        taken_at=taken_at,
        messages_ready=n("messages_ready"),
        messages_unacknowledged=n("messages_unacknowledged"),
        message_bytes=n("message_bytes"),
        message_bytes_ready=n("message_bytes_ready"),
        message_bytes_unacknowledged=n("message_bytes_unacknowledged"),
        bytes_known=not ("message_bytes" not in doc and "messages_ready" in doc),
    )
