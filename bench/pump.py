"""A plain TCP byte pump: the baseline cost of any relay, with no parsing at all.

``python -m bench.pump --listen 127.0.0.1:P --upstream 127.0.0.1:Q``
``python -m bench.pump --listen 127.0.0.1:P --upstream amqps://localhost:Q --upstream-tls-ca CA``
(plain to its clients, TLS to the broker: floodwall's shape with an amqps upstream)
``python -m bench.pump --listen ... --upstream ... --splice``
(no user-space copy at all: splice(2) socket -> pipe -> socket, a blocking thread per
direction: the floor of any relay on this kernel, what a relay could reach if it never
touched the bodies)

Same shape as floodwall's relay (asyncio Protocols on uvloop, one upstream connection per
client, the same 256 KiB write high-water mark, reading stopped on one side while the
other side's write buffer is full), minus the protocol core: bytes go through untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
import threading
from typing import cast

WRITE_HIGH_WATER = 256 * 1024  # as floodwall.io.relay.RelaySettings.write_high_water


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


class ClientSide(asyncio.Protocol):
    """A client's socket; its upstream is opened when it connects."""

    def __init__(self, upstream: tuple[str, int], conns: set[ClientSide],
                 tls: ssl.SSLContext | None = None) -> None:
        self.upstream_addr = upstream
        self.tls = tls
        self.conns = conns
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.connect_task: asyncio.Task[None] | None = None
        self.pending = bytearray()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.client = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.conns.add(self)
        self.connect_task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.tls is None:
                await loop.create_connection(lambda: UpstreamSide(self), *self.upstream_addr)
            else:
                await loop.create_connection(lambda: UpstreamSide(self), *self.upstream_addr,
                                             ssl=self.tls,
                                             server_hostname=self.upstream_addr[0])
        except OSError:
            self.close()
        finally:
            self.connect_task = None

    def upstream_made(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        if self.closed:
            transport.close()
            return
        if self.pending:
            transport.write(bytes(self.pending))
            self.pending.clear()
        if self.client is not None:
            self.client.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.upstream is not None:
            self.upstream.write(data)
        else:
            self.pending += data
            if len(self.pending) > WRITE_HIGH_WATER and self.client is not None:
                self.client.pause_reading()  # resumed by upstream's first resume_writing

    def pause_writing(self) -> None:  # client's write buffer full: stop reading upstream
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and not self.closed:
            self.upstream.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True
        self.conns.discard(self)
        if self.connect_task is not None:
            self.connect_task.cancel()
            self.connect_task = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None


class UpstreamSide(asyncio.Protocol):
    """The pump's socket to the broker for one client."""

    def __init__(self, owner: ClientSide) -> None:
        self.owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.owner.upstream_made(transport)

    def data_received(self, data: bytes) -> None:
        client = self.owner.client
        if client is not None:
            client.write(data)

    def pause_writing(self) -> None:  # upstream's write buffer full: stop reading the client
        if self.owner.client is not None:
            self.owner.client.pause_reading()

    def resume_writing(self) -> None:
        if self.owner.client is not None and not self.owner.closed:
            self.owner.client.resume_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.close()


async def serve(listen: tuple[str, int], upstream: tuple[str, int],
                tls: ssl.SSLContext | None = None) -> None:
    loop = asyncio.get_running_loop()
    conns: set[ClientSide] = set()
    server = await loop.create_server(lambda: ClientSide(upstream, conns, tls), *listen,
                                      backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = server.sockets[0].getsockname()[1]
    print(f"pump listening on {listen[0]}:{port} -> {upstream[0]}:{upstream[1]}", flush=True)
    await stop.wait()
    server.close()
    for conn in list(conns):
        conn.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 5)


SPLICE_CHUNK = 1 << 20


def _splice_one_way(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes src -> dst through a pipe with splice(2) until either side ends."""
    rd, wr = os.pipe()
    with contextlib.suppress(OSError):
        import fcntl

        fcntl.fcntl(wr, 1031, SPLICE_CHUNK)  # F_SETPIPE_SZ: 1 MiB (the default cap allows)
    try:
        while True:
            n = os.splice(src.fileno(), wr, SPLICE_CHUNK)
            if n == 0:
                break
            while n:
                n -= os.splice(rd, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(rd)
        os.close(wr)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _splice_pair(client: socket.socket, upstream: tuple[str, int]) -> None:
    try:
        up = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    for s in (client, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_splice_one_way, args=(up, client), daemon=True)
    back.start()
    _splice_one_way(client, up)
    back.join()
    client.close()
    up.close()


def serve_splice(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    srv = socket.create_server(listen, backlog=1024)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    port = srv.getsockname()[1]
    print(f"pump (splice) listening on {listen[0]}:{port} -> {upstream[0]}:{upstream[1]}",
          flush=True)
    while True:
        client, _ = srv.accept()
        threading.Thread(target=_splice_pair, args=(client, upstream), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pump", description=__doc__)
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept clients on")
    parser.add_argument("--upstream", required=True,
                        help="HOST:PORT to relay to, or amqps://HOST:PORT for TLS upstream")
    parser.add_argument("--upstream-tls-ca", default=None, help="CA file for amqps://")
    parser.add_argument("--event-loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--splice", action="store_true",
                        help="splice(2) with a blocking thread per direction (plain TCP only)")
    args = parser.parse_args(argv)
    if args.splice:
        serve_splice(_hostport(args.listen), _hostport(args.upstream))
        return 0
    upstream, tls = args.upstream, None
    if upstream.startswith("amqps://"):
        upstream = upstream.removeprefix("amqps://")
        tls = ssl.create_default_context(cafile=args.upstream_tls_ca)
    coro = serve(_hostport(args.listen), _hostport(upstream), tls)
    if args.event_loop == "uvloop":
        import uvloop

        uvloop.run(coro)
    else:
        asyncio.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
