"""The admin endpoint's answers, and the metrics it exposes."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

from prometheus_client import generate_latest

from floodwall.io.admin import AdminEndpoints, serve_admin
from floodwall.ops.config import AdminLimits
from floodwall.ops.metrics import (
    AdminCollector,
    AdminStats,
    RelayCollector,
    RelayStats,
    make_registry,
)
from floodwall.wire.relaycore import FrameCounts
from tests.conftest import run


class _Conn:
    def __init__(self, protocol: str, frames: int, nbytes: int, held: int = 0) -> None:
        self.protocol = protocol
        self.from_client = FrameCounts(frames, nbytes)
        self.from_server = FrameCounts(1, 10)
        self.held_bytes = held

    def sender_links(self) -> None:
        return None


def _endpoints(stats: RelayStats, ready: bool = True) -> AdminEndpoints:
    return AdminEndpoints(make_registry([RelayCollector(stats)]),
                          lambda: (ready, {"upstream": ready}), lambda: {"tasks": 3})


def test_metrics_sum_live_and_closed_connections() -> None:
    stats = RelayStats(hold_budget=16 * 1024**2)
    a, b = _Conn("amqp091", 5, 500, held=3000), _Conn("amqp10", 2, 20)
    stats.live.update({a, b})
    stats.accepted.update({"amqp091": 1, "amqp10": 1})
    closed = _Conn("amqp091", 7, 700)
    stats.live.add(closed)
    stats.retire(closed)
    status, _, body = _endpoints(stats).respond("GET", "/metrics")
    text = body.decode()
    assert status == 200
    assert 'floodwall_connections{protocol="amqp091"} 1.0' in text
    assert 'floodwall_frames_total{direction="client_to_server",protocol="amqp091"} 12.0' in text
    assert ('floodwall_relayed_bytes_total{direction="client_to_server",protocol="amqp091"} 1200.0'
            in text)
    assert 'floodwall_connections_accepted_total{protocol="amqp10"} 1.0' in text
    # the hold budget and the connection that holds the most of it
    assert "floodwall_hold_budget_bytes 1.6777216e+07" in text
    assert "floodwall_connection_held_bytes_max 3000.0" in text


def test_readyz_follows_readiness() -> None:
    status, ctype, body = _endpoints(RelayStats(), ready=False).respond("GET", "/readyz")
    assert status == 503 and ctype == "application/json"
    assert json.loads(body) == {"ready": False, "upstream": False}
    assert _endpoints(RelayStats()).respond("GET", "/readyz")[0] == 200


def test_health_state_and_unknown_paths() -> None:
    ep = _endpoints(RelayStats())
    assert ep.respond("GET", "/healthz")[0] == 200
    assert json.loads(ep.respond("GET", "/state?pretty")[2]) == {"tasks": 3}
    assert ep.respond("GET", "/nope")[0] == 404
    assert ep.respond("POST", "/metrics")[0] == 405


# -- the server: a cap on connections, a deadline on each (real sockets) --------------------

def _slow_reader_socket() -> socket.socket:
    """A client socket with the smallest receive buffer: an answer it never reads stays
    in the server's buffers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.setblocking(False)
    return sock


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_clients_that_never_read_are_cut_off_after_the_timeout() -> None:
    big = b"x" * (16 * 1024 * 1024)  # far more than any socket buffer holds
    stats = AdminStats()

    async def body() -> None:
        ep = _endpoints(RelayStats())
        ep.extra["/big"] = lambda: (200, "text/plain", big)
        server = await serve_admin(ep, "127.0.0.1", 0, AdminLimits(8, 0.5), stats)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        socks = []
        for _ in range(5):
            sock = _slow_reader_socket()
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
        await _until(lambda: stats.open == 5, 10, "5 handlers writing")
        started = loop.time()
        await _until(lambda: stats.open == 0, 10, "every handler freed")
        assert loop.time() - started < 5, "held far past the 0.5 s timeout"
        assert stats.timed_out == 5
        assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 200")
        for sock in socks:
            sock.close()
        server.close()
        await server.wait_closed()

    run(body)


def test_a_client_past_the_cap_is_refused_at_once_and_silent_ones_time_out() -> None:
    stats = AdminStats()

    async def body() -> None:
        server = await serve_admin(_endpoints(RelayStats()), "127.0.0.1", 0,
                                   AdminLimits(3, 1.0), stats)
        port = server.sockets[0].getsockname()[1]
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await _until(lambda: stats.open == 3, 10, "3 silent clients held")
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await _get(port, "/healthz")
        assert answer.startswith(b"HTTP/1.1 503") and b"too many admin connections" in answer
        assert loop.time() - started < 0.9  # not after a silent one timed out
        assert stats.refused == 1
        for reader, _ in silent:  # each is cut at its deadline
            assert await asyncio.wait_for(reader.read(), 10) == b""
        await _until(lambda: stats.open == 0, 10, "the silent ones freed")
        assert stats.timed_out == 3
        assert (await _get(port, "/healthz")).startswith(b"HTTP/1.1 200")
        for _, writer in silent:
            writer.close()
        server.close()
        await server.wait_closed()

    run(body)


def test_admin_figures_in_metrics() -> None:
    stats = AdminStats(open=2, refused=3, timed_out=4)
    text = generate_latest(make_registry([AdminCollector(stats)])).decode()
    assert "floodwall_admin_connections 2.0" in text
    assert "floodwall_admin_refused_connections_total 3.0" in text
    assert "floodwall_admin_timeouts_total 4.0" in text
