"""Property tests of the relay core: any input relays, or sets a Failure, never raises."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import AMQP_HEADER, SASL_HEADER
from floodwall.wire.relaycore import Side
from tests.amqp10.streams import Chunker, Conversation, Relayed, conversation, relay, whole

TALKS = [conversation(True), conversation(False)]
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def cutter(cuts: list[int]) -> Iterator[int]:
    while True:
        yield from cuts or [1]


def chunker_from(sizes: list[int]) -> Chunker:
    def chunks(data: bytes) -> Iterator[bytes]:
        steps = cutter(sizes)
        pos = 0
        while pos < len(data):
            step = next(steps)
            yield data[pos : pos + step]
            pos += step

    return chunks


@FUZZ
@given(st.sampled_from(TALKS), st.lists(st.integers(1, 300), min_size=1, max_size=20))
def test_any_chunking_relays_the_same_bytes(talk: Conversation, sizes: list[int]) -> None:
    conn = Connection(talk.first_header)
    out = relay(conn, talk.events, chunker_from(sizes))
    assert conn.failure is None
    assert out.to_server == talk.sent_by(Side.CLIENT)
    assert out.to_client == talk.sent_by(Side.SERVER)


@FUZZ
@given(
    st.sampled_from([SASL_HEADER, AMQP_HEADER]),
    st.lists(st.tuples(st.sampled_from(Side), st.binary(max_size=64)), max_size=30),
)
def test_garbage_sets_a_failure_or_waits_never_raises(
    header: bytes, events: list[tuple[Side, bytes]]
) -> None:
    conn = Connection(header)
    relay(conn, events, whole)
    if conn.failure is not None:
        assert conn.failure.condition in {
            "amqp:connection:framing-error",
            "amqp:decode-error",
        }


@st.composite
def mutated(draw: st.DrawFn) -> Conversation:
    talk = draw(st.sampled_from(TALKS))
    events = list(talk.events)
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(events) - 1))
        side, data = events[index]
        buf = bytearray(data)
        at = draw(st.integers(0, len(buf) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete"]))
        if kind == "flip":
            buf[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            del buf[at : at + draw(st.integers(1, 4))]
        events[index] = (side, bytes(buf))
    return Conversation(talk.first_header, tuple(events))


@FUZZ
@given(mutated(), st.lists(st.integers(1, 200), min_size=1, max_size=10))
def test_mutated_streams_relay_or_fail_the_same_way_whatever_the_chunking(
    talk: Conversation, sizes: list[int]
) -> None:
    results: list[tuple[object, Relayed]] = []
    for chunker in (whole, chunker_from(sizes)):
        conn = Connection(talk.first_header)
        out = relay(conn, talk.events, chunker)
        results.append((conn.failure, out))
        if conn.failure is None:
            # Nothing invented, nothing reordered: at most a partial tail is still held back.
            assert talk.sent_by(Side.CLIENT).startswith(out.to_server)
            assert talk.sent_by(Side.SERVER).startswith(out.to_client)
    assert results[0] == results[1]
