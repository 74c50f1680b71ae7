"""The admin HTTP endpoint: /metrics, /healthz, /readyz, /state; a tiny HTTP/1.1 server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from floodwall.ops.logs import event

log = logging.getLogger("floodwall.admin")

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable",
            400: "Bad Request"}


@dataclass
class AdminEndpoints:
    """What the admin server answers with; each callable is asked at request time."""

    registry: CollectorRegistry
    ready: Callable[[], tuple[bool, dict[str, object]]]
    state: Callable[[], dict[str, object]]
    extra: dict[str, Callable[[], tuple[int, str, bytes]]] = field(default_factory=dict)

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"only GET\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            ok, detail = self.ready()
            body = json.dumps({"ready": ok, **detail}, indent=1).encode() + b"\n"
            return (200 if ok else 503), "application/json", body
        if path == "/state":
            return 200, "application/json", json.dumps(self.state(), indent=1).encode() + b"\n"
        if path in self.extra:
            return self.extra[path]()
        return 404, "text/plain", b"unknown path; try /metrics /healthz /readyz /state\n"


async def serve_admin(endpoints: AdminEndpoints, host: str, port: int) -> asyncio.Server:
    """Start the admin server; the caller owns (and closes) the returned server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(line) != 3:
                status, ctype, body = 400, "text/plain", b"bad request line\n"
                method = "GET"
            else:
                method, path = line[0], line[1]
                status, ctype, body = endpoints.respond(method, path)
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except Exception as exc:  # an admin request must never take the proxy down
            event(log, "admin_request_failed", logging.ERROR, reason=repr(exc))
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    return server
