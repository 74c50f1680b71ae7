"""Opaque runs: the body of a large frame passes untouched, moved by the core or the I/O layer.

With ``opaque_min`` set, a body frame that a read leaves with at least that many body bytes
to come leaves at once (its head), and the core says how many of the next bytes are its
body (``opaque_from_client`` / ``opaque_from_server``). Fed to the core they pass as they
came; moved by the I/O layer (``skip_from_*``) the core only counts them. Either way the
peer gets the same bytes, the frame-end octet is checked, and what the gate makes for that
peer meanwhile waits until the frame has passed.
"""

from __future__ import annotations

import random

import pytest
from pamqp import commands

from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.relaycore import Side
from tests.amqp091.test_connection import tuned
from tests.amqp091.test_flow import Setup, pub
from tests.amqp091.wire import (
    HEARTBEAT,
    B,
    content,
    decode_all,
    method,
    publish,
    raw_frame,
)

MIB = 1 << 20
OPAQUE_MIN = 16 * 1024
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: 8 body frames of frame_max 131072


def cuts(data: bytes, read: int | str) -> list[bytes]:
    """``data`` in reads of ``read`` bytes, or of random sizes (``"random"``)."""
    if read == "random":
        rng, out, pos = random.Random(7), [], 0
        while pos < len(data):
            step = rng.choice((1, 7, 300, 4096, 65_536, 200_000))
            out.append(data[pos:pos + step])
            pos += step
        return out
    assert isinstance(read, int)
    return [data[i:i + read] for i in range(0, len(data), read)]


def opaque(core: Connection, side: Side) -> int:
    return core.opaque_from_client if side is Side.CLIENT else core.opaque_from_server


def receive(core: Connection, side: Side, data: bytes) -> bytes:
    if side is Side.CLIENT:
        core.receive_from_client(data, 0.0)
        return core.data_for_server()
    core.receive_from_server(data, 0.0)
    return core.data_for_client()


def skip(core: Connection, side: Side, n: int) -> None:
    (core.skip_from_client if side is Side.CLIENT else core.skip_from_server)(n)


def deliver(channel: int, payload: bytes, tag: int = 1) -> list[bytes]:
    return [method(B.Deliver(consumer_tag="c", delivery_tag=tag, exchange="",
                             routing_key="q"), channel), *content(channel, payload)]


def stream(side: Side, large: int = MIB, second: int = 300_000) -> bytes:
    """A large message, a heartbeat, a small message and another large one, from ``side``."""
    if side is Side.CLIENT:
        return (b"".join(publish(1, PAYLOAD[:large])) + HEARTBEAT
                + b"".join(publish(1, b"small")) + b"".join(publish(1, PAYLOAD[:second])))
    return (b"".join(deliver(1, PAYLOAD[:large])) + HEARTBEAT + b"".join(deliver(1, b"s", 2))
            + b"".join(deliver(1, PAYLOAD[:second], 3)))


def stream_for(side: Side, read: int | str) -> bytes:
    """One byte at a time: two messages of 200 KB and 40 KB (1.3 MB would take minutes)."""
    return stream(side, 200_000, 40_000) if read == 1 else stream(side)


@pytest.mark.parametrize("side", [Side.CLIENT, Side.SERVER])
@pytest.mark.parametrize("read", [1, 1000, 65_536, 100_000, "random"])
def test_fed_to_the_core_an_opaque_run_passes_byte_exact(side: Side, read: int | str) -> None:
    """The I/O layer may ignore the runs: every byte fed leaves as it came, counted as
    the copying core counts it, whole or one byte at a time."""
    data = stream_for(side, read)
    core, plain = tuned(), tuned()
    core.opaque_min = OPAQUE_MIN
    seen, out = 0, []
    for chunk in cuts(data, read):
        out.append(receive(core, side, chunk))
        receive(plain, side, chunk)
        seen = max(seen, opaque(core, side))
    assert b"".join(out) == data
    assert core.failure is None and core.pending_bytes == 0 and opaque(core, side) == 0
    counts, plain_counts = ((core.from_client, plain.from_client) if side is Side.CLIENT
                            else (core.from_server, plain.from_server))
    assert counts == plain_counts
    if read != 100_000 or side is Side.CLIENT:  # (100 000-byte reads may end in a frame end)
        assert seen >= OPAQUE_MIN


@pytest.mark.parametrize("side", [Side.CLIENT, Side.SERVER])
@pytest.mark.parametrize("read", [1, 1000, 65_536, "random"])
def test_moved_by_the_io_layer_an_opaque_run_is_counted_and_the_peer_gets_the_same_bytes(
        side: Side, read: int | str) -> None:
    """An I/O layer that moves every run itself (as splice(2) does): what the core hands
    back and what was moved, in order, are the input; most of a 1 MiB body is moved."""
    data = stream_for(side, read)
    core = tuned()
    core.opaque_min = OPAQUE_MIN
    counts = core.from_client if side is Side.CLIENT else core.from_server
    before = counts.bytes
    out, moved, pos = [], 0, 0
    reads = cuts(data, read)
    pending = b""
    while pos < len(data) or pending:
        if not pending:
            pending = reads.pop(0)
            pos += len(pending)
        n = opaque(core, side)
        if n:  # the I/O layer moves the run's bytes itself: they never reach the core
            take = min(n, len(pending))
            skip(core, side, take)
            out.append(pending[:take])
            pending, moved = pending[take:], moved + take
            continue
        out.append(receive(core, side, pending))
        pending = b""
    assert b"".join(out) == data
    assert core.failure is None and opaque(core, side) == 0
    assert counts.bytes - before == len(data)
    bodies = 240_000 if read == 1 else MIB + 300_000
    # Small reads (as the relay's after a run) leave nearly all of a body to the runs;
    # large ones hold whole body frames, which pass in place.
    assert moved > (0.9 if read in (1, 1000) else 0.3) * bodies


def test_a_body_frame_with_less_than_opaque_min_to_come_is_held_as_before() -> None:
    core = tuned()
    core.opaque_min = OPAQUE_MIN
    frame = raw_frame(3, 1, b"x" * 20_000)
    core.receive_from_client(frame[:len(frame) - OPAQUE_MIN], 0.0)
    assert core.opaque_from_client == 0 and core.data_for_server() == b""
    assert core.pending_from_client == len(frame) - OPAQUE_MIN
    core.receive_from_client(frame[len(frame) - OPAQUE_MIN:], 0.0)
    assert core.data_for_server() == frame


def test_without_opaque_min_there_is_never_a_run() -> None:
    core = tuned()
    for chunk in cuts(stream(Side.CLIENT), 1000):
        core.receive_from_client(chunk, 0.0)
        assert core.opaque_from_client == 0


@pytest.mark.parametrize("side", [Side.CLIENT, Side.SERVER])
@pytest.mark.parametrize("moved", [True, False])
def test_a_bad_frame_end_after_a_run_fails_as_any_frame_does(side: Side, moved: bool) -> None:
    frame = raw_frame(3, 1, b"x" * 50_000, end=0x00)
    core = tuned()
    core.opaque_min = OPAQUE_MIN
    head = receive(core, side, frame[:1000])
    assert head == frame[:1000] and opaque(core, side) == 50_000 + 7 - 1000
    if moved:
        skip(core, side, opaque(core, side))
    else:
        assert receive(core, side, frame[1000:-1]) == frame[1000:-1]
    assert receive(core, side, frame[-1:] + HEARTBEAT) == b""
    assert core.failure is not None and core.failure.side is side
    assert core.failure.condition == "501 FRAME_ERROR"
    assert "frame end octet 0x00" in core.failure.reason
    # The peer the frame was going to is inside it: no close frame fits there. (A bad frame
    # from the broker: the broker still gets its close.)
    if side is Side.SERVER:
        assert core.data_for_client() == b""
        assert isinstance(decode_all(core.data_for_server())[0][1], commands.Connection.Close)
    else:
        assert core.data_for_server() == b""
        assert isinstance(decode_all(core.data_for_client())[0][1], commands.Connection.Close)


def test_skipping_more_than_the_run_is_refused() -> None:
    core = tuned()
    core.opaque_min = OPAQUE_MIN
    core.receive_from_client(raw_frame(3, 1, b"x" * 50_000)[:100], 0.0)
    with pytest.raises(ValueError, match="the opaque run has"):
        core.skip_from_client(50_000)
    with pytest.raises(ValueError):
        core.skip_from_server(1)


@pytest.mark.parametrize("read", [1, 3_000, 65_536])
def test_a_held_publishs_body_is_never_a_run_the_gate_reads_it(read: int) -> None:
    """A channel the gate reads frame by frame (its publish held; or captured for the
    spool) has no runs: its body is held, then released whole; a free channel's bodies
    pass as runs in between."""
    s = Setup()
    s.core.opaque_min = OPAQUE_MIN
    s.trip()
    held = pub(1, "capped", MIB, 1)
    free = pub(2, "free", 300_000, 2)
    passed: list[bytes] = []
    runs = 0
    for chunk in cuts(held + free, read):
        s.core.receive_from_client(chunk, s.clock.t)
        passed.append(s.core.data_for_server())
        if s.core.opaque_from_client:
            runs += 1
            assert passed[-1] or runs > 1  # runs only once the free channel's body came
    assert b"".join(passed) == free
    assert runs
    assert s.counters.held_messages == 1
    s.sample("capped", 0)
    assert s.core.data_for_server() == held


def test_what_the_gate_makes_for_the_peer_during_a_run_waits_for_the_frame_end() -> None:
    """A held publish released while a free channel's body frame is half through: its
    frames leave after that frame's end octet, never inside it."""
    s = Setup()
    s.core.opaque_min = OPAQUE_MIN
    s.trip()
    held = pub(1, "capped", 100, 1)
    s.core.receive_from_client(held, s.clock.t)
    assert s.core.data_for_server() == b""
    free = pub(2, "free", 100_000, 2)
    cut = len(free) - 50_000
    s.core.receive_from_client(free[:cut], s.clock.t)
    assert s.core.data_for_server() == free[:cut]
    assert s.core.opaque_from_client == 50_000 - 1
    s.sample("capped", 0)  # releases the held publish: into the core, outside a read
    assert s.core.data_for_server() == b""
    s.core.skip_from_client(49_000)
    s.core.receive_from_client(free[cut + 49_000:], s.clock.t)
    assert s.core.data_for_server() == free[cut + 49_000:] + held
    assert s.counters.held_messages == 0
