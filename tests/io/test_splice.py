"""The splice lane on real sockets: a run moves in order, a slow receiver stops it with no
more than its pipe in flight, an end inside a run is reported, and the pipe is accounted."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import pytest

from floodwall.io.splice import PIPE_SIZE, LaneState, SpliceLane, splice_available
from floodwall.wire.relaycore import Side
from tests.conftest import eventually, run

pytestmark = [pytest.mark.skipif(not splice_available(), reason="splice(2) is Linux only"),
              pytest.mark.timeout(60)]


@dataclass
class Owner:
    """The connection side of a lane (``LaneOwner``), keeping what it was told."""

    moved: int = 0
    piped: int = 0
    most_piped: int = 0
    heads: list[bytes] = field(default_factory=list)
    written: int = 0  # bytes of a head written through the transport
    dropped: int = 0  # bytes of a run in the pipe when the lane failed
    idle: int = 0
    failed: list[tuple[str, bool]] = field(default_factory=list)
    next_run: int = 0  # a head opens a run of this many bytes

    lane: SpliceLane | None = None
    transport: asyncio.Transport | None = None

    def lane_moved(self, side: Side, n: int) -> None:
        self.moved += n

    def lane_piped(self, delta: int) -> None:
        self.piped += delta
        self.most_piped = max(self.most_piped, self.piped)

    def lane_head(self, side: Side, data: bytes) -> None:
        """As a core would: the frame end (the first byte) and the next run's first bytes
        leave through the transport; the rest of that run is opened."""
        self.heads.append(data[:1])
        if self.next_run and self.lane is not None and self.transport is not None:
            self.transport.write(data[1:])
            self.written += len(data) - 1
            n, self.next_run = self.next_run - (len(data) - 1), 0
            self.lane.start(n)

    def lane_may_read(self, side: Side) -> bool:
        return True

    def lane_idle(self, side: Side) -> None:
        self.idle += 1

    def lane_broken(self, side: Side, exc: Exception) -> None:
        self.failed.append((f"{type(exc).__name__}: {exc}", True))

    def lane_failed(self, side: Side, reason: str, mid_frame: bool, dropped: int) -> None:
        self.failed.append((reason, mid_frame))
        self.dropped = dropped


async def _pairs() -> tuple[socket.socket, socket.socket, socket.socket, socket.socket,
                            asyncio.Transport]:
    """sender -> src (lane reads) ; dst (lane writes, behind a real transport) -> receiver."""
    sender, src = socket.socketpair()
    dst, receiver = socket.socketpair()
    for s in (sender, src, dst, receiver):
        s.setblocking(False)
    for s in (dst, receiver):  # small buffers: a receiver that does not read is felt soon
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, dst)
    return sender, src, dst, receiver, transport


def _read_all(sock: socket.socket, out: bytearray) -> None:
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not data:
            return
        out += data


async def _send(sock: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)


def test_a_run_moves_in_order_then_the_lane_reads_the_head_itself() -> None:
    """Two runs, each followed by the head the lane reads; a whole head read that opens no
    run leaves the socket to the transport (idle)."""
    async def body() -> None:
        sender, src, dst, receiver, transport = await _pairs()
        owner = Owner()
        lane = owner.lane = SpliceLane(asyncio.get_running_loop(), owner, Side.CLIENT,
                                       src.fileno(), dst.fileno(), transport)
        run_bytes = os.urandom(3 * PIPE_SIZE + 123)
        owner.next_run = 5000  # the first head opens a second run
        owner.transport = transport
        second = os.urandom(5000)
        # After the second run, more than a head read of frames that open no run: idle.
        sender_task = asyncio.create_task(_send(sender, run_bytes + b"\xce" + second + b"\xce"
                                                + bytes(2000)))
        lane.start(len(run_bytes))
        got = bytearray()

        def done() -> bool:
            _read_all(receiver, got)
            return len(got) >= len(run_bytes) + len(second) and owner.idle > 0

        await eventually(done, 30, "both runs moved and the lane idle")
        await sender_task
        assert bytes(got) == run_bytes + second
        assert b"".join(owner.heads) == b"\xce\xce"  # the frame ends, read by the lane
        assert owner.moved + owner.written == len(run_bytes) + len(second)
        assert 0 < owner.written <= 1023
        assert owner.piped == 0 and 0 < owner.most_piped <= lane.pipe_size
        assert lane.state is LaneState.IDLE and not owner.failed and owner.idle == 1
        lane.close()
        transport.close()
        for s in (sender, src, receiver):
            s.close()

    run(body)


def test_a_receiver_that_does_not_read_stops_the_run_with_at_most_the_pipe_in_flight() -> None:
    async def body() -> None:
        sender, src, dst, receiver, transport = await _pairs()
        owner = Owner()
        lane = owner.lane = SpliceLane(asyncio.get_running_loop(), owner, Side.SERVER,
                                       src.fileno(), dst.fileno(), transport,
                                       pipe_size=65536)
        total = 8 << 20
        sender_task = asyncio.create_task(_send(sender, os.urandom(total)))
        lane.start(total)
        # Nobody reads: the lane fills the receiver's buffers and its pipe, then stops.
        settled: list[int] = []

        def stalled() -> bool:
            settled.append(owner.moved)
            return len(settled) > 25 and settled[-1] == settled[-25] and not lane.reading

        await eventually(stalled, 30, "the lane stopped reading")
        assert owner.moved < total // 4
        assert owner.piped <= lane.pipe_size and not sender_task.done()
        got = bytearray()

        def drained() -> bool:
            _read_all(receiver, got)
            return len(got) == total

        await eventually(drained, 30, "the receiver read everything")
        await sender_task
        assert owner.moved == total and owner.most_piped <= lane.pipe_size
        lane.close()
        transport.close()
        for s in (sender, src, receiver):
            s.close()

    run(body)


@pytest.mark.parametrize("during_run", [True, False])
def test_the_sender_ending_is_reported_inside_a_run_or_between_runs(during_run: bool) -> None:
    async def body() -> None:
        sender, src, dst, receiver, transport = await _pairs()
        owner = Owner()
        lane = owner.lane = SpliceLane(asyncio.get_running_loop(), owner, Side.CLIENT,
                                       src.fileno(), dst.fileno(), transport)
        lane.start(100_000 if during_run else 1000)
        await _send(sender, os.urandom(1000))
        sender.close()
        got = bytearray()

        def ended() -> Any:
            _read_all(receiver, got)
            return owner.failed

        await eventually(ended, 30, "the end reported")
        assert owner.failed == [("end of stream", during_run)]
        assert lane.state is LaneState.CLOSED and owner.piped == 0
        # Inside a run what was in the pipe is dropped (the connection ends); a whole run
        # has left before the end is met.
        assert (owner.dropped, len(got)) == ((1000, 0) if during_run else (0, 1000))
        transport.close()
        for s in (src, receiver):
            s.close()

    run(body)


def test_the_writing_transports_buffer_goes_before_the_run() -> None:
    async def body() -> None:
        sender, src, dst, receiver, transport = await _pairs()
        owner = Owner()
        lane = owner.lane = SpliceLane(asyncio.get_running_loop(), owner, Side.CLIENT,
                                       src.fileno(), dst.fileno(), transport)
        head = os.urandom(1 << 20)  # more than the socket takes: the transport buffers it
        transport.write(head)
        assert transport.get_write_buffer_size() > 0
        body_bytes = os.urandom(300_000)
        sender_task = asyncio.create_task(_send(sender, body_bytes))
        lane.start(len(body_bytes))
        got = bytearray()

        def done() -> bool:
            _read_all(receiver, got)
            return len(got) == len(head) + len(body_bytes)

        await eventually(done, 30, "the head and the run arrived")
        await sender_task
        assert bytes(got) == head + body_bytes
        lane.close()
        transport.close()
        for s in (sender, src, receiver):
            s.close()

    run(body)


def test_an_owner_that_raises_ends_the_lane_not_the_loop() -> None:
    """A bug behind the lane (the core refusing a count) is the connection's end, reported
    as broken; the event loop and the lane's descriptors are not left behind."""
    async def body() -> None:
        sender, src, dst, receiver, transport = await _pairs()

        class Refusing(Owner):
            def lane_moved(self, side: Side, n: int) -> None:
                raise ValueError("not a run")

        owner = Refusing()
        lane = SpliceLane(asyncio.get_running_loop(), owner, Side.CLIENT, src.fileno(),
                          dst.fileno(), transport)
        lane.start(5000)
        await _send(sender, os.urandom(5000))
        await eventually(lambda: owner.failed, 30, "the lane broken")
        assert owner.failed == [("ValueError: not a run", True)]
        assert lane.state is LaneState.CLOSED and lane.src == -1 and owner.piped == 0
        transport.close()
        for s in (sender, src, receiver):
            s.close()

    run(body)
