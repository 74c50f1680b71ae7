"""A broker that ends the connection right after the TLS handshake, before its first AMQP
bytes: with TLS 1.3 that is how it refuses a client certificate (or its absence). The
refusal reaches the client as an alert on its first read, or, when its protocol header
crossed the alert on the wire, as a bare reset or EOF. Each of the proxy's own clients
names all three as a ``TlsFailure``, not a bare ``ConnectionResetError``.

The server here is a loopback TLS 1.3 listener that completes the handshake and then
resets (SO_LINGER 0) or closes the socket without reading, the two shapes the race takes."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trustme

from floodwall.io.amqp10_client import Amqp10Client
from floodwall.io.amqp_client import AmqpClient
from floodwall.io.readiness import UpstreamProbe
from floodwall.io.relay import RelayedConnection, RelaySettings
from floodwall.io.tls import TlsFailure, UpstreamTlsContext, listener_context, tls_error
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import ListenerTls, ProxySettings, TlsVersion, UpstreamTls
from floodwall.ops.metrics import RelayStats
from tests.io.test_tls import write


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    cert, key = write(tmp_path, "server", ca.issue_cert("localhost"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return cert, key, tmp_path / "ca.pem"


async def _ending_server(cert: Path, key: Path, reset: bool) -> tuple[asyncio.Server, int]:
    context = listener_context(ListenerTls(cert, key, min_version=TlsVersion.TLS1_3))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    return server, server.sockets[0].getsockname()[1]


Connect = Callable[[int, UpstreamTlsContext], Awaitable[None]]


async def _amqp091(port: int, tls: UpstreamTlsContext) -> None:
    client = AmqpClient(Upstreams([("localhost", port)]), "guest", "guest", tls=tls)
    try:
        await client.connect(5)
    finally:
        await client.close()


async def _amqp10(port: int, tls: UpstreamTlsContext) -> None:
    client = Amqp10Client(Upstreams([("localhost", port)]), "guest", "guest", "/", tls=tls)
    await client.connect(5)


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
@pytest.mark.parametrize("connect", [_amqp091, _amqp10], ids=["amqp091", "amqp10"])
def test_an_end_right_after_the_handshake_is_named(
        tls_files: tuple[Path, Path, Path], reset: bool, connect: Connect) -> None:
    cert, key, ca = tls_files
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=ca))

    async def scenario() -> None:
        server, port = await _ending_server(cert, key, reset)
        async with server:
            with pytest.raises(TlsFailure) as failure:
                await connect(port, tls)
        text = str(failure.value)
        assert "right after the TLS handshake" in text, text
        assert "absence of a client certificate (none is configured)" in text, text

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_the_relay_counts_and_logs_it_as_a_tls_failure(
        tls_files: tuple[Path, Path, Path], reset: bool, caplog: pytest.LogCaptureFixture
        ) -> None:
    """A relayed client's connection: its protocol header went upstream, so it is closed
    (not told), and the failure is counted and logged as ``upstream_tls_failed``."""
    cert, key, ca = tls_files
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=ca))
    stats = RelayStats()

    async def scenario() -> None:
        server, port = await _ending_server(cert, key, reset)
        settings = RelaySettings(Upstreams([("localhost", port)]), upstream_tls=tls)
        loop = asyncio.get_running_loop()
        relay = await loop.create_server(lambda: RelayedConnection(settings, stats, 1),
                                         "127.0.0.1", 0)
        async with server, relay:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", relay.sockets[0].getsockname()[1])
            writer.write(b"AMQP\x00\x00\x09\x01")
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed
            writer.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert stats.upstream_tls_failures == 1
    (line,) = [r for r in caplog.records if r.getMessage() == "upstream_tls_failed"]
    reason = str(getattr(line, "reason", ""))
    assert "right after the TLS handshake" in reason, reason
    assert ("EOF" if not reset else "ConnectionResetError") in reason, reason


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_the_readiness_probe_says_why(tls_files: tuple[Path, Path, Path], reset: bool
                                      ) -> None:
    cert, key, ca = tls_files
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=ca))
    stats = RelayStats()

    async def scenario() -> UpstreamProbe:
        server, port = await _ending_server(cert, key, reset)
        async with server:
            settings = ProxySettings(None, (("localhost", port),), upstream_tls=tls.settings)
            probe = UpstreamProbe(settings, Upstreams(settings.upstreams), tls, stats)
            assert await probe.probe() is False
        return probe

    probe = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert not stats.upstream_up
    assert "right after the TLS handshake" in probe.last_error, probe.last_error


def test_only_an_end_before_the_first_bytes_and_only_with_tls(
        tls_files: tuple[Path, Path, Path]) -> None:
    _, _, ca = tls_files
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=ca))
    reset = ConnectionResetError(104, "Connection reset by peer")
    eof = asyncio.IncompleteReadError(b"", 7)
    assert isinstance(tls_error(reset, tls, "localhost"), TlsFailure)
    assert isinstance(tls_error(eof, tls, "localhost"), TlsFailure)
    # the broker spoke first: a later reset is a reset, not a certificate refusal
    assert tls_error(reset, tls, "localhost", greeted=True) is reset
    assert tls_error(eof, tls, "localhost", greeted=True) is eof
    # plain TCP: nothing to do with TLS
    assert tls_error(reset, None, "localhost") is reset
    # other errors pass through
    refused = ConnectionRefusedError(111, "Connection refused")
    assert tls_error(refused, tls, "localhost") is refused
