"""The AMQP 1.0 relay core: byte-exact relay, state tracking, limits and failures."""

from __future__ import annotations

import pytest

from floodwall.wire.amqp10.connection import CONTAINER_ID, Connection
from floodwall.wire.amqp10.framing import AMQP_HEADER, SASL_HEADER, frame
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    CLOSE,
    ERROR,
    OPEN,
    SASL_CHALLENGE,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    SASL_RESPONSE,
    Role,
    composite_fields,
    encode_performative,
)
from floodwall.wire.amqp10.types import Array, Described, Symbol, UByte, UInt
from floodwall.wire.relaycore import JOINED_READ_MAX, Failure, FrameCounts, RelayCore, Side
from tests.amqp10 import streams
from tests.amqp10.streams import (
    EMPTY_FRAME,
    bytewise,
    conversation,
    open_,
    performatives,
    random_chunks,
    relay,
    sasl,
    transfer,
    whole,
)

FRAMING = "amqp:connection:framing-error"
DECODE = "amqp:decode-error"
MECHANISMS = sasl(SASL_MECHANISMS, sasl_server_mechanisms=Array(0xA3, (Symbol("PLAIN"),)))
INIT = sasl(SASL_INIT, mechanism=Symbol("PLAIN"), initial_response=b"\x00u\x00p")
OUTCOME_OK = sasl(SASL_OUTCOME, code=UByte(0))
OUTCOME_AUTH = sasl(SASL_OUTCOME, code=UByte(1))


def opened(
    server_max_frame: int | None = 16384, client_max_frame: int | None = 65536
) -> Connection:
    """A plain (no SASL) connection with both Opens relayed, queues emptied."""
    conn = Connection(AMQP_HEADER)
    conn.receive_from_client(open_("c", client_max_frame) + streams.begin(0), 0.0)
    conn.receive_from_server(AMQP_HEADER + open_("s", server_max_frame) + streams.begin(0, 0), 0.0)
    conn.data_for_server()
    conn.data_for_client()
    assert conn.failure is None
    return conn


def close_error(data: bytes) -> tuple[str, str]:
    """The (condition, description) of the close that ``data`` ends with."""
    code, fields = performatives(data)[-1]
    assert code == CLOSE
    error = fields[0]
    assert isinstance(error, Described)
    error_code, error_fields = composite_fields(error)
    assert error_code == ERROR
    condition, description = error_fields[0], error_fields[1]
    assert isinstance(condition, Symbol) and isinstance(description, str)
    return condition, description


# -- relay -------------------------------------------------------------------------------------


def test_connection_is_a_relay_core() -> None:
    core: RelayCore = Connection(SASL_HEADER)
    assert core.failure is None
    assert core.from_client == FrameCounts() and core.from_server == FrameCounts()


def test_rejects_a_header_that_is_not_amqp_1_0() -> None:
    with pytest.raises(ValueError):
        Connection(b"AMQP\x00\x00\x09\x01")


@pytest.mark.parametrize("use_sasl", [True, False])
@pytest.mark.parametrize(
    "chunker",
    [whole, bytewise, random_chunks(1), random_chunks(2, 7), random_chunks(3, 3000)],
    ids=["whole", "bytewise", "random64", "random7", "random3000"],
)
def test_relays_a_whole_conversation_byte_exactly(use_sasl: bool, chunker: streams.Chunker) -> None:
    talk = conversation(use_sasl)
    conn = Connection(talk.first_header)
    out = relay(conn, talk.events, chunker)
    assert conn.failure is None
    assert out.to_server == talk.sent_by(Side.CLIENT)
    assert out.to_client == talk.sent_by(Side.SERVER)


def test_counts_frames_and_bytes() -> None:
    talk = conversation()
    conn = Connection(talk.first_header)
    relay(conn, talk.events, random_chunks(5))
    # client: sasl-init, open, begin, 2 attach, flow, 5 transfers/empty, 2 disp/empty, 4 closing
    assert conn.from_client == FrameCounts(17, len(talk.sent_by(Side.CLIENT)))
    # server: mechanisms, outcome, open, begin, 2 attach, flow, disposition, empty, transfer, 4
    assert conn.from_server == FrameCounts(14, len(talk.sent_by(Side.SERVER)))


def test_tracks_sasl_open_sessions_and_links() -> None:
    talk = conversation()
    conn = Connection(talk.first_header)
    events = list(talk.events)
    relay(conn, events[:6], whole)  # up to both Opens, begins and attaches
    client, server = conn.client, conn.server
    assert client.sasl_mechanism == "PLAIN" and server.sasl_outcome == 0
    assert client.open is not None and server.open is not None
    assert (client.open.container_id, client.open.max_frame_size) == ("client-1", 65536)
    assert (client.open.channel_max, client.open.idle_time_out) == (255, 30000)
    assert (server.open.container_id, server.open.max_frame_size) == ("broker-1", 16384)
    assert server.sessions[3].remote_channel == 0 and client.sessions[0].remote_channel is None
    links = {link.name: (channel, link) for channel, link in client.links()}
    sender = links["orders-sender"][1]
    assert (sender.handle, sender.role, sender.target_address) == (0, Role.SENDER, "orders")
    receiver = links["replies-receiver"][1]
    assert (receiver.role, receiver.source_address) == (Role.RECEIVER, "replies")
    assert server.sessions[3].links[7].role is Role.RECEIVER
    relay(conn, events[6:], whole)
    assert client.sessions == {} and server.sessions == {}
    assert client.close is not None and server.close is not None


def test_a_chunk_of_whole_frames_is_forwarded_as_the_same_object() -> None:
    conn = opened()
    chunk = b"".join(transfer(0, 0, n, b"x" * 100) for n in range(50)) + EMPTY_FRAME
    conn.receive_from_client(chunk, 0.0)
    assert conn.data_for_server() is chunk
    assert conn.data_for_server() == b""
    reply = streams.disposition(0, True, 0, 49)
    conn.receive_from_server(reply, 0.0)
    assert conn.data_for_client() is reply


def test_partial_frames_are_held_back_until_complete() -> None:
    conn = opened()
    one, two = transfer(0, 0, 1, b"a" * 300), transfer(0, 0, 2, b"b" * 300)
    conn.receive_from_client(one + two[:5], 0.0)  # header of `two` incomplete
    assert conn.data_for_server() == one
    conn.receive_from_client(two[5:-1], 0.0)  # all but the last byte
    assert conn.data_for_server() == b""
    conn.receive_from_client(two[-1:] + one[:9], 0.0)
    assert conn.data_for_server() == two
    conn.receive_from_client(one[9:], 0.0)
    assert conn.data_for_server() == one
    assert conn.from_client.frames == 2 + 3


@pytest.mark.parametrize("cut", [3, 8, 700, 1020])
def test_a_large_read_completes_the_held_frame_and_leaves_as_a_view_of_itself(cut: int) -> None:
    """A read that completes the frame held from the read before and goes on well past it
    (``JOINED_READ_MAX``) gives the held frame just the bytes it misses, its header first
    when the header was cut too; the rest of the read leaves as a view of that read, not a
    copy, and the stream arrives byte-exactly, every frame counted once."""
    conn = opened()
    frames = [transfer(0, 0, n, b"x" * 1000) for n in range(60)]
    data = b"".join(frames)
    ten = len(b"".join(frames[:10]))
    first = ten + cut  # inside the 11th frame (its header: cut < 8)
    conn.receive_from_client(data[:first], 0.0)
    assert conn.data_for_server() == data[:ten]
    rest = data[first:]
    assert len(rest) > JOINED_READ_MAX
    conn.receive_from_client(rest, 0.0)
    pieces = conn.chunks_for_server()
    assert b"".join(pieces) == data[ten:]
    assert any(type(p) is memoryview and p.obj is rest and p.nbytes > JOINED_READ_MAX
               for p in pieces)
    assert conn.from_client.frames == 2 + 60 and conn.pending_bytes == 0


def test_a_small_read_that_completes_the_held_frame_is_joined_to_it() -> None:
    """At most ``JOINED_READ_MAX`` past the held frame: one piece, the two joined."""
    conn = opened()
    one, two = transfer(0, 0, 1, b"a" * 3000), transfer(0, 0, 2, b"b" * 3000)
    conn.receive_from_client(one[:100], 0.0)
    conn.receive_from_client(one[100:] + two, 0.0)
    pieces = conn.chunks_for_server()
    assert len(pieces) == 1 and pieces[0] == one + two


def test_data_for_peers_is_empty_bytes_when_nothing_is_queued() -> None:
    conn = Connection(SASL_HEADER)
    assert conn.data_for_server() == b"" and conn.data_for_client() == b""
    conn.receive_from_server(b"", 0.0)
    assert conn.data_for_client() == b""


def test_client_may_pipeline_its_amqp_header_and_open_after_sasl_init() -> None:
    conn = Connection(SASL_HEADER)
    pipelined = INIT + AMQP_HEADER + open_("c") + streams.begin(0)
    server = SASL_HEADER + MECHANISMS + OUTCOME_OK + AMQP_HEADER + open_("s", 1024)
    out = relay(conn, [(Side.CLIENT, pipelined), (Side.SERVER, server)], bytewise)
    assert conn.failure is None
    assert (out.to_server, out.to_client) == (pipelined, server)
    assert conn.client.open is not None and 0 in conn.client.sessions


def test_symbolic_and_full_ulong_descriptors_are_understood() -> None:
    conn = Connection(AMQP_HEADER)
    symbolic = frame(
        b"\x00\xa3\x0eamqp:open:list" + b"\xc0\x0a\x03\xa1\x01c\x40\x70\x00\x00\x04\x00"
    )
    conn.receive_from_client(symbolic, 0.0)
    full = frame(b"\x00\x80" + (0x14).to_bytes(8, "big") + b"\xc0\x03\x01\x43\x43" + b"payload")
    conn.receive_from_client(full, 0.0)
    assert conn.failure is None
    assert conn.client.open is not None and conn.client.open.max_frame_size == 1024
    assert conn.data_for_server() == symbolic + full


def test_extended_frame_header_is_relayed() -> None:
    conn = opened()
    body = encode_performative(ATTACH, name="x", handle=UInt(4), role=False)
    extended = (8 + 8 + len(body)).to_bytes(4, "big") + b"\x04\x00\x00\x00" + b"\xee" * 8 + body
    conn.receive_from_client(extended, 0.0)
    assert conn.failure is None
    assert conn.data_for_server() == extended
    assert 4 in conn.client.sessions[0].links


# -- frame size limits -----------------------------------------------------------------------


def padded_transfer(size: int) -> bytes:
    """A transfer frame of exactly ``size`` bytes."""
    bare = transfer(0, 0, 1, b"")
    return transfer(0, 0, 1, b"p" * (size - len(bare)))


def test_frames_before_the_receiving_peers_open_are_limited_to_512() -> None:
    conn = Connection(AMQP_HEADER)
    conn.receive_from_client(open_("c", 4096) + padded_transfer(512), 0.0)
    assert conn.failure is None
    conn.receive_from_client(padded_transfer(513), 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.CLIENT, FRAMING)
    assert "513" in conn.failure.reason and "512" in conn.failure.reason


def test_after_open_the_limit_is_the_receiving_peers_max_frame_size() -> None:
    conn = opened(server_max_frame=1024, client_max_frame=2048)
    conn.receive_from_client(padded_transfer(1024), 0.0)
    conn.receive_from_server(padded_transfer(2048), 0.0)
    assert conn.failure is None
    conn.receive_from_client(padded_transfer(1025), 0.0)
    assert conn.failure == Failure(
        Side.CLIENT, FRAMING, "frame size 1025 exceeds the max-frame-size 1024"
    )


def test_server_frames_are_limited_by_the_clients_max_frame_size() -> None:
    conn = opened(server_max_frame=1024, client_max_frame=2048)
    conn.receive_from_server(padded_transfer(2049), 0.0)
    assert conn.failure is not None and conn.failure.side is Side.SERVER


def test_an_open_without_max_frame_size_lifts_the_limit_to_the_default() -> None:
    conn = opened(server_max_frame=None)
    conn.receive_from_client(padded_transfer(200_000), 0.0)
    assert conn.failure is None


def test_a_max_frame_size_below_512_still_allows_512() -> None:
    conn = opened(server_max_frame=100)
    conn.receive_from_client(padded_transfer(512), 0.0)
    assert conn.failure is None


def test_sasl_frames_are_limited_to_512() -> None:
    conn = Connection(SASL_HEADER)
    big = sasl(SASL_INIT, mechanism=Symbol("PLAIN"), initial_response=b"x" * 600)
    conn.receive_from_client(big, 0.0)
    assert conn.failure is not None and conn.failure.condition == FRAMING
    assert conn.data_for_client() == b""  # in SASL: nothing to say, the I/O layer hangs up


# -- client failures -------------------------------------------------------------------------


def test_client_garbage_after_open_closes_the_client_with_framing_error() -> None:
    conn = opened()
    good = transfer(0, 0, 1, b"ok")
    conn.receive_from_client(good + b"\x00\x00\x00\x04garbage", 0.0)
    assert conn.failure == Failure(
        Side.CLIENT, FRAMING, "frame size 4 is smaller than the 8-byte frame header"
    )
    to_client = conn.data_for_client()
    assert [code for code, _ in performatives(to_client)] == [CLOSE]  # server's Open was sent
    assert close_error(to_client) == (FRAMING, conn.failure.reason)
    to_server = conn.data_for_server()
    assert to_server.startswith(good)  # the valid frames before the garbage still go
    condition, description = close_error(to_server[len(good) :])
    assert condition == "amqp:connection:forced" and conn.failure.reason in description


def test_after_a_failure_nothing_more_is_relayed() -> None:
    conn = opened()
    conn.receive_from_client(b"\x00\x00\x00\x08\x01\x00\x00\x00", 0.0)  # SASL frame in AMQP
    assert conn.failure is not None
    conn.data_for_client()
    conn.data_for_server()
    conn.receive_from_client(transfer(0, 0, 1, b"late"), 0.0)
    conn.receive_from_server(transfer(0, 0, 1, b"late"), 0.0)
    assert conn.data_for_server() == b"" and conn.data_for_client() == b""


@pytest.mark.parametrize(
    ("bad", "reason_part"),
    [
        (b"\x00\x00\x00\x10\x01\x00\x00\x00" + b"\x00" * 8, "data offset 1"),
        (b"\x00\x00\x00\x10\x05\x00\x00\x00" + b"\x00" * 8, "data offset 5"),
        (b"\x00\x00\x00\x0c\x02\x07\x00\x00" + b"\x00S\x14E", "unknown (0x07) frame"),
        (b"HTTP/1.1 200 OK\r\n", "exceeds the max-frame-size"),
    ],
)
def test_bad_frame_headers_are_framing_errors(bad: bytes, reason_part: str) -> None:
    conn = opened()
    conn.receive_from_client(bad, 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.CLIENT, FRAMING)
    assert reason_part in conn.failure.reason


@pytest.mark.parametrize(
    ("body", "reason_part"),
    [
        (b"\x40", "not a described type"),
        (b"\x00\x53\x12\xc0\x01", "overruns"),  # attach list truncated
        (encode_performative(ATTACH, name="x", handle=UInt(1)), "attach.role is mandatory"),
        (encode_performative(ATTACH, name="x", handle=1, role=True), "attach.handle is int"),
        (encode_performative(OPEN, container_id="again"), "second open"),
        (encode_performative(SASL_INIT, mechanism=Symbol("PLAIN")), "not an AMQP performative"),
        (b"\x00\x53\x99\x45", "0x99 is not an AMQP performative"),
    ],
)
def test_malformed_performatives_are_decode_errors(body: bytes, reason_part: str) -> None:
    conn = opened()
    conn.receive_from_client(frame(body, 0), 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.CLIENT, DECODE)
    assert reason_part in conn.failure.reason
    assert close_error(conn.data_for_client()) == (DECODE, conn.failure.reason)


def test_client_error_before_the_servers_open_sends_open_then_close() -> None:
    conn = Connection(AMQP_HEADER)
    conn.receive_from_server(AMQP_HEADER, 0.0)
    assert conn.data_for_client() == AMQP_HEADER
    conn.receive_from_client(open_("c") + frame(b"\x00\x53\x12\x45"), 0.0)  # attach without fields
    assert conn.failure is not None and conn.failure.condition == DECODE
    to_client = conn.data_for_client()
    codes = performatives(to_client)
    assert [code for code, _ in codes] == [OPEN, CLOSE]
    assert codes[0][1] == [CONTAINER_ID]
    assert all(len(f) <= 512 for f in _frames(to_client))


def test_client_error_before_the_servers_header_sends_header_open_close() -> None:
    conn = Connection(AMQP_HEADER)
    conn.receive_from_client(b"\xff" * 8, 0.0)
    assert conn.failure is not None and conn.failure.condition == FRAMING
    to_client = conn.data_for_client()
    assert to_client.startswith(AMQP_HEADER)
    assert [code for code, _ in performatives(to_client)] == [OPEN, CLOSE]
    assert conn.data_for_server() == b""  # the client's Open never reached the server


def test_client_error_during_sasl_sends_nothing() -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_server(SASL_HEADER + MECHANISMS, 0.0)
    conn.data_for_client()
    conn.receive_from_client(frame(encode_performative(OPEN, container_id="c")), 0.0)  # AMQP frame
    assert conn.failure is not None
    assert conn.failure.condition == FRAMING and "AMQP frame where an SASL" in conn.failure.reason
    assert conn.data_for_client() == b"" and conn.data_for_server() == b""


@pytest.mark.parametrize(
    ("client_bytes", "condition", "reason_part"),
    [
        (AMQP_HEADER, FRAMING, "before sasl-init"),
        (INIT + SASL_HEADER, FRAMING, "after SASL"),
        (INIT + INIT, DECODE, "second sasl-init"),
        (sasl(SASL_RESPONSE, response=b"r"), DECODE, "before sasl-init"),
        (sasl(SASL_OUTCOME, code=UByte(0)), DECODE, "not a SASL frame the client may send"),
        (sasl(SASL_INIT, mechanism="PLAIN"), DECODE, "mechanism is str, expected Symbol"),
        (b"\x00\x00\x00\x08\x02\x01\x00\x00", FRAMING, "empty SASL frame"),
    ],
)
def test_sasl_layer_errors(client_bytes: bytes, condition: str, reason_part: str) -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_client(client_bytes, 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.CLIENT, condition)
    assert reason_part in conn.failure.reason


def test_pipelined_client_error_while_server_is_in_sasl_closes_only_the_server() -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_server(SASL_HEADER + MECHANISMS, 0.0)
    conn.data_for_client()
    conn.receive_from_client(INIT + AMQP_HEADER + open_("c") + b"\x00\x00\x00\x01....", 0.0)
    assert conn.failure is not None and conn.failure.side is Side.CLIENT
    assert conn.data_for_client() == b""  # the client still waits for sasl-outcome
    to_server = conn.data_for_server()
    assert to_server.startswith(INIT + AMQP_HEADER + open_("c"))
    assert close_error(to_server)[0] == "amqp:connection:forced"


def test_long_reasons_are_clipped_to_keep_the_close_frame_small() -> None:
    conn = opened()
    source = Described(Symbol("x" * 400), [])
    conn.receive_from_client(
        frame(encode_performative(ATTACH, name="x", handle=UInt(1), role=False, source=source)), 0.0
    )
    assert conn.failure is not None and len(conn.failure.reason) > 400
    assert all(len(f) <= 512 for f in _frames(conn.data_for_client()))


def test_no_close_to_a_client_whose_connection_the_server_already_closed() -> None:
    conn = opened()
    conn.receive_from_server(streams.close(), 0.0)
    assert conn.data_for_client() == streams.close()
    conn.receive_from_client(b"\x00\x00\x00\x00", 0.0)
    conn.receive_from_client(b"\x02\x00\x00\x00", 0.0)
    assert conn.failure is not None
    assert conn.data_for_client() == b""


# -- server failures -------------------------------------------------------------------------


def test_server_garbage_fails_on_the_server_side_and_closes_both() -> None:
    conn = opened()
    conn.receive_from_server(b"\x00\x00\x00\x09\x02\x00\x00\x00\x00", 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.SERVER, DECODE)
    assert close_error(conn.data_for_server()) == (DECODE, conn.failure.reason)
    condition, description = close_error(conn.data_for_client())
    assert condition == "amqp:internal-error" and "server sent bad data" in description


def test_server_answering_another_protocol_header_is_relayed_then_fails() -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_server(AMQP_HEADER, 0.0)  # "I do not do SASL"
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.SERVER, FRAMING)
    assert conn.data_for_client() == AMQP_HEADER
    assert conn.data_for_server() == b""


def test_server_sending_non_amqp_bytes_is_not_relayed() -> None:
    conn = Connection(AMQP_HEADER)
    conn.receive_from_server(b"HTTP/1.1 400 Bad Request\r\n", 0.0)
    assert conn.failure is not None and conn.failure.side is Side.SERVER
    assert conn.data_for_client() == b""


def test_failed_sasl_outcome_is_relayed_and_nothing_is_injected() -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_server(SASL_HEADER + MECHANISMS, 0.0)
    conn.receive_from_client(INIT + AMQP_HEADER + open_("c"), 0.0)
    conn.receive_from_server(OUTCOME_AUTH, 0.0)
    assert conn.server.sasl_outcome == 1 and conn.failure is None
    assert conn.data_for_client() == SASL_HEADER + MECHANISMS + OUTCOME_AUTH
    conn.receive_from_client(b"\x00\x00\x00\x01\x02\x00\x00\x00", 0.0)  # garbage after refusal
    assert conn.failure is not None
    assert conn.data_for_client() == b""


@pytest.mark.parametrize(
    "server_bytes",
    [
        SASL_HEADER + INIT,  # the client's performative
        SASL_HEADER + sasl(SASL_OUTCOME),  # outcome without its mandatory code
        SASL_HEADER + sasl(SASL_MECHANISMS, sasl_server_mechanisms="PLAIN"),  # not symbols
        SASL_HEADER + b"\x00\x00\x00\x0c\x02\x01\x00\x00\x00\x53\x44\x40",  # not a list
    ],
)
def test_server_sasl_errors_are_decode_errors(server_bytes: bytes) -> None:
    conn = Connection(SASL_HEADER)
    conn.receive_from_server(server_bytes, 0.0)
    assert conn.failure is not None
    assert (conn.failure.side, conn.failure.condition) == (Side.SERVER, DECODE)
    assert conn.data_for_client() == SASL_HEADER


def test_symbol_mechanism_list_and_challenge_response_are_accepted() -> None:
    conn = Connection(SASL_HEADER)
    server = [
        SASL_HEADER + sasl(SASL_MECHANISMS, sasl_server_mechanisms=Symbol("SCRAM-SHA-256")),
        sasl(SASL_CHALLENGE, challenge=b"c1"),
        OUTCOME_OK + AMQP_HEADER,
    ]
    client = [
        sasl(SASL_INIT, mechanism=Symbol("SCRAM-SHA-256"), initial_response=b"n,,n=u"),
        sasl(SASL_RESPONSE, response=b"r1") + AMQP_HEADER + open_("c"),
    ]
    out = relay(
        conn,
        [(Side.SERVER, server[0]), (Side.CLIENT, client[0]), (Side.SERVER, server[1]),
         (Side.CLIENT, client[1]), (Side.SERVER, server[2])],
        whole,
    )
    assert conn.failure is None
    assert (out.to_client, out.to_server) == (b"".join(server), b"".join(client))


def _frames(data: bytes) -> list[bytes]:
    frames: list[bytes] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        frames.append(data[pos : pos + size])
        pos += size
    return frames


def test_close_frame_descriptor_is_numeric() -> None:
    conn = opened()
    conn.receive_from_client(b"\x00\x00\x00\x05", 0.0)
    conn.receive_from_client(b"\x02\x00\x00\x00", 0.0)
    close_frame = _frames(conn.data_for_client())[-1]
    assert close_frame[8:11] == b"\x00\x53\x18"
