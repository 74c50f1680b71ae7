"""The admin HTTP endpoint: /metrics, /healthz, /readyz, /state; a tiny HTTP/1.1 server with a
cap on connections and a deadline on each (``AdminLimits``)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from floodwall.ops.config import AdminLimits
from floodwall.ops.logs import event, event_limited
from floodwall.ops.metrics import AdminStats

log = logging.getLogger("floodwall.admin")

#: Longest a refused client's request is read after the 503 (so the close is not a reset).
REFUSAL_LINGER = 1.0

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


async def serve_admin(endpoints: AdminEndpoints, host: str, port: int,
                      limits: AdminLimits | None = None,
                      stats: AdminStats | None = None) -> asyncio.Server:
    """Start the admin server; the caller owns (and closes) the returned server.

    At most ``limits.max_connections`` (default ``AdminLimits()``) are served at once: one
    more is answered 503 and closed at once. A client has ``limits.timeout`` to send its
    request, and as long again to take the whole answer; one that does not is cut off (its
    handler and socket freed).
    """
    limits = limits if limits is not None else AdminLimits()
    counts = stats if stats is not None else AdminStats()
    loop = asyncio.get_running_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if counts.open >= limits.max_connections:
            counts.refused += 1
            event_limited(counts.log_limits, loop.time(), log, "admin_connection_refused",
                          logging.WARNING, peer=_peer(writer), open=counts.open,
                          max_connections=limits.max_connections,
                          action="answered 503 and closed (--admin-max-connections)")
            if counts.refusing >= limits.max_connections:  # a flood: no courtesy
                writer.transport.abort()
                return
            counts.refusing += 1
            try:
                await _refuse(reader, writer, min(limits.timeout, REFUSAL_LINGER))
            finally:
                counts.refusing -= 1
            return
        counts.open += 1
        try:
            await _serve(endpoints, reader, writer, limits.timeout)
        except TimeoutError:
            counts.timed_out += 1
            event_limited(counts.log_limits, loop.time(), log, "admin_client_too_slow",
                          peer=_peer(writer), timeout=limits.timeout,
                          action="connection cut (--admin-timeout)")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception as exc:  # an admin request must never take the proxy down
            event(log, "admin_request_failed", logging.ERROR, reason=repr(exc))
        finally:
            counts.open -= 1
            if not writer.is_closing():
                writer.transport.abort()  # a failure or a timeout: drop what is unsent

    return await asyncio.start_server(handle, host, port)


async def _serve(endpoints: AdminEndpoints, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, timeout: float) -> None:
    """Read one request, answer it, close; TimeoutError when the client is too slow."""
    try:
        async with asyncio.timeout(timeout):
            request = await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        writer.close()  # nothing unsent: an orderly close
        raise
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
    async with asyncio.timeout(timeout):  # all of it taken (not only buffered) in time
        await writer.drain()
        writer.close()
        await writer.wait_closed()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  linger: float) -> None:
    """Answer 503 and close. The request is read (and dropped) for at most ``linger``
    seconds after the answer, so that closing does not reset the connection under an
    answer the client has not read yet."""
    body = b"too many admin connections; try again\n"
    writer.write(f"HTTP/1.1 503 {_REASONS[503]}\r\nContent-Type: text/plain\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    try:
        async with asyncio.timeout(linger):
            writer.write_eof()
            while await reader.read(65536):
                pass
            await writer.drain()
        writer.close()
    except (TimeoutError, OSError):
        pass
    finally:
        if not writer.is_closing():
            writer.transport.abort()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"
