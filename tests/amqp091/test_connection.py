"""Tests for the 0-9-1 relay core: exact relay under any chunking, state read, failures."""

from __future__ import annotations

import gc
import random
import struct
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from floodwall.wire.amqp091.connection import (
    ChannelState,
    ClientInfo,
    CloseReply,
    Connection,
    TuneParams,
    close_frame,
)
from floodwall.wire.amqp091.framing import FRAME_MIN_SIZE, count_frames
from floodwall.wire.relaycore import JOINED_READ_MAX, Failure, RelayCore, Side
from tests.amqp091.wire import (
    CH,
    CLIENT_PROPERTIES,
    FRAME_MAX,
    HEARTBEAT,
    C,
    client_handshake,
    conversation,
    decode_all,
    method,
    publish,
    raw_frame,
    server_handshake,
)


def feed(core: Connection, side: Side, chunks: list[bytes]) -> bytes:
    """Feed chunks from one side, collecting what the core relays to the other."""
    out = []
    for chunk in chunks:
        if side is Side.CLIENT:
            core.receive_from_client(chunk, 0.0)
            out.append(core.data_for_server())
        else:
            core.receive_from_server(chunk, 0.0)
            out.append(core.data_for_client())
    return b"".join(out)


def chunked(data: bytes, rng: random.Random, largest: int) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        step = rng.randint(1, largest)
        chunks.append(data[pos : pos + step])
        pos += step
    return chunks


def tuned(frame_max: int = FRAME_MAX) -> Connection:
    """A core past the handshake, with channel 1 open, and its queues emptied."""
    core = Connection()
    core.receive_from_server(b"".join(server_handshake(frame_max)), 0.0)
    core.receive_from_client(b"".join(client_handshake(frame_max)) + method(CH.Open(), 1), 0.0)
    core.receive_from_server(method(CH.OpenOk(), 1), 0.0)
    core.data_for_client()
    core.data_for_server()
    return core


def close_sent(data: bytes) -> commands.Connection.Close:
    frames = decode_all(data)
    assert len(frames) == 1
    channel, close = frames[0]
    assert channel == 0
    assert isinstance(close, commands.Connection.Close)
    return close


def test_connection_is_a_relay_core() -> None:
    core: RelayCore = Connection()
    assert core.failure is None


def test_relays_a_whole_conversation_byte_exact_and_reads_its_state() -> None:
    talk = conversation()
    core = Connection()
    # Interleave as a real connection does: each peer's frames as they would cross.
    for frames, side in (
        (talk.server[:2], Side.SERVER),
        (talk.client[:2], Side.CLIENT),
    ):
        feed(core, side, [b"".join(frames)])
    assert core.frame_max == FRAME_MAX and core.tuned
    rest_client = b"".join(talk.client[2:])
    rest_server = b"".join(talk.server[2:])
    to_server = feed(core, Side.CLIENT, [rest_client])
    to_client = feed(core, Side.SERVER, [rest_server])
    assert to_server == rest_client
    assert to_client == rest_server
    assert core.failure is None
    assert (core.from_client.frames, core.from_client.bytes) == (
        len(talk.client),
        len(talk.client_bytes),
    )
    assert (core.from_server.frames, core.from_server.bytes) == (
        len(talk.server),
        len(talk.server_bytes),
    )
    assert core.client == ClientInfo(
        "pytest-client", "1.2.3", "Python 3.11", "https://example.invalid/", CLIENT_PROPERTIES
    )
    assert core.virtual_host == "/orders"
    assert core.server_tune == TuneParams(2047, FRAME_MAX, 60)
    assert core.client_tune == TuneParams(2047, FRAME_MAX, 60)
    assert (core.channel_max, core.heartbeat) == (2047, 60)
    assert core.opened
    assert core.closing is Side.CLIENT
    assert core.close_reply == CloseReply(Side.CLIENT, 200, "Goodbye", 0, 0)
    assert core.closed
    assert core.open_channels == set()


def test_a_chunk_of_complete_frames_is_forwarded_as_the_same_object() -> None:
    core = tuned()
    chunk = b"".join(publish(1, b"p" * 1024) * 60)
    core.receive_from_client(chunk, 0.0)
    assert core.data_for_server() is chunk
    assert core.data_for_server() == b""
    assert core.from_client.frames == 4 + 180
    core.receive_from_server(HEARTBEAT, 0.0)
    assert core.data_for_client() is HEARTBEAT


@pytest.mark.parametrize("cut", [1, 7, 500])
def test_a_read_that_completes_a_held_frame_leaves_as_pieces_of_the_reads(cut: int) -> None:
    """``chunks_for_server`` hands the I/O layer the pieces for one vectored write: the held
    frame, then the new read itself (a view of it, not a copy); joined, what
    ``data_for_server`` would have returned. (The new read is larger than
    ``JOINED_READ_MAX``; a smaller one is joined to the held frame: the next test.)"""
    core = tuned()
    frames = publish(1, b"z" * 1024) * 3 + publish(1, b"y" * JOINED_READ_MAX)
    data = b"".join(frames)
    split = len(frames[0]) + len(frames[1]) + cut  # inside the first body frame
    boundary = len(frames[0]) + len(frames[1])
    first, second = data[:split], data[split:]
    core.receive_from_client(first, 0.0)
    assert b"".join(core.chunks_for_server()) == data[:boundary]
    core.receive_from_client(second, 0.0)
    pieces = core.chunks_for_server()
    assert len(pieces) == 2 and b"".join(pieces) == data[boundary:]
    assert pieces[0] == frames[2]  # the held frame, completed
    assert isinstance(pieces[1], memoryview) and pieces[1].obj is second
    assert core.chunks_for_server() == [] and core.data_for_server() == b""


@pytest.mark.parametrize("cut", [1, 7, 8, 500, 1031])
@pytest.mark.parametrize("tail", [0, 3, 9])
def test_a_small_read_that_completes_a_held_frame_is_joined_to_it(cut: int, tail: int) -> None:
    """A read of at most ``JOINED_READ_MAX`` bytes that completes the held frame is relayed
    with it in one pass: one piece, the held frame and the read's complete frames, byte for
    byte; a frame the read leaves incomplete (``tail`` bytes of the next) is held again.
    Fed whole and one byte at a time elsewhere (``test_any_chunking_relays_the_same_bytes``)."""
    core = tuned()
    before = core.from_client.bytes
    frames = publish(1, b"z" * 1024) * 3
    boundary = len(frames[0]) + len(frames[1])
    nxt = b"".join(publish(1, b"n" * 10))
    data = b"".join(frames) + nxt[:tail]
    first, second = data[:boundary + cut], data[boundary + cut:]
    core.receive_from_client(first, 0.0)
    assert b"".join(core.chunks_for_server()) == data[:boundary]
    assert core.pending_from_client == cut
    core.receive_from_client(second, 0.0)
    pieces = core.chunks_for_server()
    assert b"".join(pieces) == b"".join(frames[2:])
    # Joined when the held frame's header was in (a held header's few bytes: as before).
    assert len(pieces) == (1 if cut >= 7 else 2)
    assert core.pending_from_client == tail
    assert core.from_client.frames == 4 + 9
    core.receive_from_client(nxt[tail:], 0.0)
    assert core.data_for_server() == nxt and core.pending_from_client == 0
    assert core.from_client.frames == 4 + 12
    assert core.from_client.bytes - before == len(b"".join(frames)) + len(nxt)


@pytest.mark.parametrize("read", [1, 1000, 65_536, 100_000])
def test_a_large_body_frame_cut_by_reads_leaves_as_views_of_them_byte_exact(read: int) -> None:
    """A 1 MiB message (8 body frames of frame_max): every frame that a read leaves
    incomplete is held as views of the reads (``pending_from_client`` counts them) and
    leaves, once whole, as the very bytes that came, whatever the reads' sizes."""
    core = tuned()
    data = b"".join(publish(1, bytes(range(256)) * 4096)) + HEARTBEAT
    out: list[bytes | memoryview] = []
    for i in range(0, len(data), read):
        core.receive_from_client(data[i:i + read], 0.0)
        pieces = core.chunks_for_server()
        out.extend(pieces)
        assert core.pending_from_client == (i + len(data[i:i + read])
                                            - sum(len(p) for p in out))
    assert b"".join(out) == data
    assert core.pending_from_client == 0 and core.failure is None
    assert core.from_client.frames == 4 + 2 + 9 + 1
    if read >= 65_536:  # some body frames left as more than one piece: no copy was made
        assert any(isinstance(p, memoryview) and len(p) < 131_072 for p in out)


def test_a_large_body_frame_with_a_bad_end_fails_as_any_frame_does() -> None:
    body = raw_frame(3, 1, b"x" * 50_000, end=0x00)
    cut = 20_000
    whole = tuned()
    whole.receive_from_client(body, 0.0)
    split = tuned()
    split.receive_from_client(body[:cut], 0.0)
    assert split.pending_from_client == cut
    split.receive_from_client(body[cut:], 0.0)
    assert whole.failure is not None and split.failure == whole.failure
    assert "frame end octet 0x00" in whole.failure.reason
    assert split.data_for_server() == whole.data_for_server() == b""
    assert split.pending_from_client == 0


def test_nothing_queued_gives_empty_bytes() -> None:
    core = Connection()
    assert core.data_for_server() == b""
    assert core.data_for_client() == b""
    core.receive_from_client(b"", 0.0)
    assert core.data_for_server() == b""


@pytest.mark.parametrize("chunking", ["whole", "bytes", "seed-1", "seed-2", "seed-3", "frames"])
def test_any_chunking_relays_the_same_bytes(chunking: str) -> None:
    talk = conversation()
    for side, frames in ((Side.CLIENT, talk.client), (Side.SERVER, talk.server)):
        data = b"".join(frames)
        if chunking == "whole":
            chunks = [data]
        elif chunking == "bytes":
            chunks = [data[i : i + 1] for i in range(len(data))]
        elif chunking == "frames":
            chunks = list(frames)
        else:
            rng = random.Random(chunking)
            chunks = chunked(data, rng, rng.choice([10, 3000, 70000]))
        core = Connection()
        # The frame limit is the lower of the broker's tune and the client's tune-ok: both
        # must have passed, so the other peer's handshake goes first (and is forgotten).
        if side is Side.CLIENT:
            core.receive_from_server(b"".join(server_handshake()), 0.0)
            core.from_server.frames = core.from_server.bytes = 0
        else:
            core.receive_from_client(b"".join(client_handshake()), 0.0)
            core.from_client.frames = core.from_client.bytes = 0
        core.data_for_client(), core.data_for_server()
        assert feed(core, side, chunks) == data
        counts = core.from_client if side is Side.CLIENT else core.from_server
        assert (counts.frames, counts.bytes) == (len(frames), len(data))
        assert core.failure is None
        assert core.pending_from_client == core.pending_from_server == 0


@pytest.mark.parametrize("chunking", ["whole", "bytes", "seed-1", "seed-2"])
def test_reads_given_as_read_only_views_relay_the_same_bytes_without_a_copy(chunking: str) -> None:
    """The I/O layer lends large reads as read-only views of its buffers (``takes_views``):
    the same bytes leave, and a read of complete frames leaves as a view of that buffer."""
    talk = conversation()
    data = b"".join(talk.client)
    if chunking == "whole":
        chunks = [data]
    elif chunking == "bytes":
        chunks = [data[i : i + 1] for i in range(len(data))]
    else:
        rng = random.Random(chunking)
        chunks = chunked(data, rng, rng.choice([10, 3000, 70000]))
    core = Connection()
    assert core.takes_views
    core.receive_from_server(b"".join(server_handshake()), 0.0)
    core.data_for_client()
    out = []
    for chunk in chunks:
        buffer = bytearray(chunk)
        core.receive_from_client(memoryview(buffer).toreadonly(), 0.0)
        pieces = core.chunks_for_server()
        if chunking == "whole":
            assert any(type(p) is memoryview and p.obj is buffer for p in pieces)
        out.extend(bytes(p) for p in pieces)
    assert b"".join(out) == data
    assert core.failure is None and core.pending_from_client == 0


@pytest.mark.parametrize("cut", [1, 6, 7, 8, 500, 1031])
def test_a_trailing_partial_frame_is_held_until_complete(cut: int) -> None:
    core = tuned()
    frames = publish(1, b"z" * 1024)
    whole = frames[0] + frames[1]
    core.receive_from_client(whole + frames[2][:cut], 0.0)
    assert core.data_for_server() == whole
    assert core.pending_from_client == cut
    assert core.from_client.frames == 4 + 2
    core.receive_from_client(frames[2][cut:] + HEARTBEAT[:3], 0.0)
    assert core.data_for_server() == frames[2]
    assert core.pending_from_client == 3
    core.receive_from_client(HEARTBEAT[3:], 0.0)
    assert core.data_for_server() == HEARTBEAT
    assert core.pending_from_client == 0


def test_heartbeats_pass_untouched_both_ways() -> None:
    core = tuned()
    core.receive_from_client(HEARTBEAT * 3, 0.0)
    core.receive_from_server(HEARTBEAT, 0.0)
    assert core.data_for_server() == HEARTBEAT * 3
    assert core.data_for_client() == HEARTBEAT
    assert core.failure is None


def test_client_info_reads_what_is_there() -> None:
    info = ClientInfo.from_properties({"product": b"raw\xffname", "version": 5})
    assert (info.product, info.version, info.platform, info.information) == (
        "raw\ufffdname",
        "5",
        None,
        None,
    )


def test_input_that_is_not_bytes_is_copied_before_it_is_kept() -> None:
    core = tuned()
    frames = publish(1, b"m" * 10)
    data = bytearray(frames[0] + frames[1][:3])
    core.receive_from_client(data, 0.0)  # type: ignore[arg-type]  # the I/O layer may do this
    data[:] = b"\x00" * len(data)
    core.receive_from_client(frames[1][3:], 0.0)
    assert core.data_for_server() == frames[0] + frames[1]


# --- frame_max ----------------------------------------------------------------------


def test_before_tune_ok_client_frames_are_limited_to_frame_min_size() -> None:
    core = Connection()
    core.receive_from_server(b"".join(server_handshake()), 0.0)
    core.data_for_client()
    start_ok = client_handshake()[0]
    fits = raw_frame(3, 1, b"a" * (FRAME_MIN_SIZE - 8))
    core.receive_from_client(start_ok + fits, 0.0)
    assert core.data_for_server() == start_ok + fits
    assert core.frame_max == FRAME_MIN_SIZE and not core.tuned
    core.receive_from_client(raw_frame(3, 1, b"a" * (FRAME_MIN_SIZE - 7)), 0.0)
    assert core.data_for_server() == b""
    assert core.failure == Failure(
        Side.CLIENT,
        "501 FRAME_ERROR",
        f"content body frame of 4097 bytes on channel 1 at offset {len(start_ok) + 4096} "
        "exceeds frame_max 4096",
    )
    close = close_sent(core.data_for_client())
    assert close.reply_code == 501
    assert close.reply_text == "FRAME_ERROR - " + core.failure.reason


def test_after_tune_ok_the_negotiated_frame_max_applies() -> None:
    core = tuned(FRAME_MAX)
    fits = raw_frame(3, 1, b"a" * (FRAME_MAX - 8))
    core.receive_from_client(fits, 0.0)
    assert core.data_for_server() is fits
    core.receive_from_server(fits, 0.0)
    assert core.data_for_client() is fits
    core.receive_from_client(raw_frame(3, 1, b"a" * (FRAME_MAX - 7)), 0.0)
    assert core.failure is not None
    assert core.failure.condition == "501 FRAME_ERROR"
    assert f"of {FRAME_MAX + 1} bytes" in core.failure.reason


def test_tune_ok_in_the_same_chunk_raises_the_limit_for_the_frames_after_it() -> None:
    core = Connection()
    core.receive_from_server(b"".join(server_handshake(FRAME_MAX)), 0.0)
    big = raw_frame(3, 1, b"a" * 10000)
    data = b"".join(client_handshake(FRAME_MAX)) + big
    core.receive_from_client(data, 0.0)
    assert core.data_for_server() is data
    assert core.failure is None


def test_frame_max_zero_means_no_limit() -> None:
    core = tuned(0)
    assert core.frame_max == 0
    huge = raw_frame(3, 1, b"h" * (1 << 20))
    assert feed(core, Side.CLIENT, [huge[:5000], huge[5000:]]) == huge


def test_a_tiny_negotiated_frame_max_still_allows_frame_min_size() -> None:
    core = tuned(512)
    assert core.frame_max == 512
    fits = raw_frame(3, 1, b"a" * (FRAME_MIN_SIZE - 8))
    core.receive_from_client(fits, 0.0)
    assert core.data_for_server() is fits


def test_an_oversize_frame_fails_on_its_header_without_being_buffered() -> None:
    core = tuned(FRAME_MAX)
    header = struct.pack(">BHI", 3, 1, 50_000_000)
    core.receive_from_client(header[:4], 0.0)
    assert core.failure is None
    core.receive_from_client(header[4:], 0.0)
    assert core.failure is not None and "exceeds frame_max 131072" in core.failure.reason
    assert core.pending_from_client == 0


def test_server_frames_before_tune_ok_are_limited_too() -> None:
    core = Connection()
    core.receive_from_server(raw_frame(1, 0, b"\x00\x0a\x00\x0a" + b"s" * 5000), 0.0)
    assert core.failure is not None and core.failure.side is Side.SERVER


# --- channels and close --------------------------------------------------------------


def test_channel_lifecycle_both_initiators() -> None:
    core = tuned()
    assert core.channels == {1: ChannelState.OPEN}
    core.receive_from_client(method(CH.Open(), 2) + method(CH.Open(), 3), 0.0)
    assert core.channels == {1: ChannelState.OPEN, 2: ChannelState.OPENING, 3: ChannelState.OPENING}
    core.receive_from_server(method(CH.OpenOk(), 2), 0.0)
    assert core.channels[2] is ChannelState.OPEN
    # client closes 1; broker closes 2 (e.g. 404 on a passive declare)
    core.receive_from_client(method(CH.Close(200, "", 0, 0), 1), 0.0)
    core.receive_from_server(method(CH.Close(404, "NOT_FOUND - no queue 'x'", 50, 10), 2), 0.0)
    assert core.channels == {
        1: ChannelState.CLOSING,
        2: ChannelState.CLOSING,
        3: ChannelState.OPENING,
    }
    core.receive_from_server(method(CH.CloseOk(), 1), 0.0)
    core.receive_from_client(method(CH.CloseOk(), 2), 0.0)
    assert core.open_channels == {3}
    assert core.failure is None


def test_methods_on_the_wrong_channel_are_relayed_but_not_read() -> None:
    core = tuned()
    odd = method(CH.Open(), 0) + method(C.Close(200, "", 0, 0), 5) + method(C.TuneOk(0, 0, 0), 4)
    core.receive_from_client(odd, 0.0)
    assert core.data_for_server() is odd
    assert core.open_channels == {1}
    assert core.closing is None
    assert core.frame_max == FRAME_MAX


def test_a_second_channel_open_leaves_the_state_for_the_broker_to_judge() -> None:
    core = tuned()
    core.receive_from_client(method(CH.Open(), 1), 0.0)
    assert core.channels == {1: ChannelState.OPEN}
    assert core.failure is None


def test_broker_initiated_connection_close() -> None:
    core = tuned()
    close = method(C.Close(320, "CONNECTION_FORCED - shutdown", 0, 0))
    core.receive_from_server(close, 0.0)
    assert core.data_for_client() is close
    assert core.closing is Side.SERVER and not core.closed
    assert core.close_reply == CloseReply(Side.SERVER, 320, "CONNECTION_FORCED - shutdown", 0, 0)
    core.receive_from_client(method(C.CloseOk()), 0.0)
    assert core.closed and core.channels == {}


# --- failures -----------------------------------------------------------------------

PREFIX_FRAMES = 4  # tuned(): start-ok, tune-ok, open, channel.open from the client


@pytest.mark.parametrize(
    ("bad", "condition", "reason", "ids"),
    [
        (
            raw_frame(1, 1, b"\x00\x3c\x00\x28" + b"\x00" * 5, end=0x00),
            "501 FRAME_ERROR",
            "frame end octet 0x00 at offset {at16}, expected 0xce",
            (0, 0),
        ),
        (
            raw_frame(5, 1, b"x"),
            "501 FRAME_ERROR",
            "unknown frame type 0x05 at offset {at}",
            (0, 0),
        ),
        (b"\x00" * 64, "501 FRAME_ERROR", "unknown frame type 0x00 at offset {at}", (0, 0)),
        (b"AMQP\x00\x00\x09\x01", "501 FRAME_ERROR", "unknown frame type 0x41", (0, 0)),
        (raw_frame(1, 1, b"\x00\x3c"), "501 FRAME_ERROR", "too short for class and method", (0, 0)),
        (raw_frame(8, 1, b""), "501 FRAME_ERROR", "heartbeat frame on channel 1", (0, 0)),
        (raw_frame(3, 0, b"x"), "505 UNEXPECTED_FRAME", "content body frame on channel 0", (0, 0)),
        (
            raw_frame(1, 0, b"\x00\x0a\x00\x32\x01"),  # connection.close cut short
            "502 SYNTAX_ERROR",
            "cannot decode Connection.Close on channel 0 at offset {at}",
            (10, 50),
        ),
    ],
)
def test_bad_client_input_fails_with_a_close_for_the_client(
    bad: bytes, condition: str, reason: str, ids: tuple[int, int]
) -> None:
    core = tuned()
    before = b"".join(publish(1, b"ok" * 10)) + HEARTBEAT
    after = HEARTBEAT * 2
    prefix_len = core.from_client.bytes
    at = prefix_len + len(before)
    reason = reason.format(at=at, at16=at + 16)
    core.receive_from_client(before + bad + after, 0.0)
    assert core.data_for_server() == before
    assert core.from_client.frames == PREFIX_FRAMES + 4
    assert core.failure is not None
    assert core.failure.side is Side.CLIENT
    assert core.failure.condition == condition
    assert reason in core.failure.reason
    close = close_sent(core.data_for_client())
    assert close.reply_code == int(condition.split()[0])
    assert close.reply_text == f"{condition.split()[1]} - {core.failure.reason}"[:255]
    assert (close.class_id, close.method_id) == ids
    # nothing more is relayed, from either side
    core.receive_from_client(HEARTBEAT, 0.0)
    core.receive_from_server(HEARTBEAT, 0.0)
    assert core.data_for_server() == b"" and core.data_for_client() == b""


def test_undecodable_start_ok_fails_with_syntax_error() -> None:
    core = Connection()
    core.receive_from_server(b"".join(server_handshake()), 0.0)
    core.data_for_client()
    # a client_properties table whose length runs past the frame
    bad = raw_frame(1, 0, b"\x00\x0a\x00\x0b" + b"\x00\x00\xff\xff" + b"x" * 10)
    core.receive_from_client(bad, 0.0)
    assert core.failure is not None
    assert core.failure.condition == "502 SYNTAX_ERROR"
    close = close_sent(core.data_for_client())
    assert (close.reply_code, close.class_id, close.method_id) == (502, 10, 11)
    assert core.client is None
    assert core.data_for_server() == b""


def test_garbage_right_after_the_protocol_header() -> None:
    core = Connection()
    core.receive_from_client(b"GET / HTTP/1.1\r\n\r\n", 0.0)
    assert core.failure == Failure(
        Side.CLIENT, "501 FRAME_ERROR", "unknown frame type 0x47 at offset 0"
    )
    assert core.data_for_server() == b""
    assert close_sent(core.data_for_client()).reply_code == 501


def test_bad_broker_input_closes_both_peers_and_names_the_upstream() -> None:
    core = tuned()
    good = method(commands.Basic.QosOk(), 1) + HEARTBEAT
    core.receive_from_server(good + raw_frame(3, 1, b"body", end=0x41) + HEARTBEAT, 0.0)
    assert core.failure is not None
    assert core.failure.side is Side.SERVER
    assert core.failure.condition == "501 FRAME_ERROR"
    to_client = core.data_for_client()
    assert to_client.startswith(good)
    close = close_sent(to_client[len(good) :])
    assert close.reply_code == 541
    assert close.reply_text.startswith(
        "INTERNAL_ERROR - upstream broker sent a malformed frame: 501 FRAME_ERROR - frame end "
        "octet 0x41"
    )
    to_server = close_sent(core.data_for_server())
    assert to_server.reply_code == 501
    assert to_server.reply_text == "FRAME_ERROR - " + core.failure.reason


def test_undecodable_tune_from_the_broker_is_a_server_failure() -> None:
    core = Connection()
    core.receive_from_server(raw_frame(1, 0, b"\x00\x0a\x00\x1e\x07"), 0.0)
    assert core.failure is not None
    assert (core.failure.side, core.failure.condition) == (Side.SERVER, "502 SYNTAX_ERROR")
    to_server = close_sent(core.data_for_server())
    assert (to_server.reply_code, to_server.class_id, to_server.method_id) == (502, 10, 30)
    assert close_sent(core.data_for_client()).reply_code == 541


def test_failure_while_a_partial_frame_is_held() -> None:
    core = tuned()
    frames = publish(1, b"q" * 100)
    core.receive_from_client(frames[0] + frames[1][:5], 0.0)
    core.receive_from_client(frames[1][5:] + b"\xff" * 8, 0.0)
    assert core.data_for_server() == frames[0] + frames[1]
    assert core.failure is not None and "unknown frame type 0xff" in core.failure.reason
    assert core.pending_from_client == 0


def test_close_text_is_cut_to_a_shortstr() -> None:
    data = close_frame(501, "é" * 200)
    close = close_sent(data)
    assert len(close.reply_text.encode()) <= 255
    assert close.reply_text == "é" * 127


# --- fuzz ---------------------------------------------------------------------------


def run(data: bytes, side: Side, chunks: list[int]) -> tuple[bytes, Failure | None, int]:
    """Feed ``data`` from ``side`` to a fresh core cut at ``chunks``; what came out."""
    core = Connection()
    pieces, pos = [], 0
    for size in chunks:
        pieces.append(data[pos : pos + size])
        pos += size
    pieces.append(data[pos:])
    out = feed(core, side, pieces)
    counts = core.from_client if side is Side.CLIENT else core.from_server
    pending = core.pending_from_client if side is Side.CLIENT else core.pending_from_server
    relayed = out[: counts.bytes]
    assert data.startswith(relayed)
    assert count_frames(relayed, 0, len(relayed)) == counts.frames
    if core.failure is None:
        assert relayed == out
        assert len(out) + pending == len(data)
    else:
        assert core.failure.side is side
        assert pending == 0
        # closes: to the client for a client failure; to both for a broker failure
        to_client = core.data_for_client() if side is Side.CLIENT else out[counts.bytes :]
        to_server = core.data_for_server() if side is Side.SERVER else b""
        codes = [close_sent(to_client).reply_code]
        if side is Side.SERVER:
            codes.append(close_sent(to_server).reply_code)
        assert codes[0] == (541 if side is Side.SERVER else int(core.failure.condition[:3]))
    return out, core.failure, pending


cuts = st.lists(st.integers(min_value=1, max_value=400), max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), side=st.sampled_from(Side), chunks=cuts)
def test_garbage_either_relays_or_fails_never_raises(
    data: bytes, side: Side, chunks: list[int]
) -> None:
    assert run(data, side, chunks) == run(data, side, [])


VALID = conversation()


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, Side]:
    side = draw(st.sampled_from(Side))
    data = bytearray(VALID.client_bytes if side is Side.CLIENT else VALID.server_bytes)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        pos = draw(st.integers(min_value=0, max_value=len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if kind == "flip":
            data[pos] = draw(st.integers(min_value=0, max_value=255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=20))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(min_value=1, max_value=20))]
        else:
            del data[pos:]
        if not data:
            data.append(0)
    return bytes(data), side


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated(), chunks=st.lists(st.integers(min_value=1, max_value=70000), max_size=12))
def test_mutated_streams_relay_or_fail_the_same_under_any_chunking(
    case: tuple[bytes, Side], chunks: list[int]
) -> None:
    data, side = case
    assert run(data, side, chunks) == run(data, side, [])


def test_a_core_is_freed_by_its_last_reference() -> None:
    """No reference cycle through the core's parts (its ``CoreOutput`` carries out the gate's
    commands on the channel table, not through the core): a closed connection's core is gone
    at once, not at the collector's next pass."""
    core = Connection(watch_topology=True)
    core.receive_from_client(method(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0u\0p")), 0.0)
    assert core.data_for_server()
    gone = weakref.ref(core)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del core
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()
