"""Hostile AMQP 1.0 input against the core and its credit gate: frames announced larger than
the limit (refused from their header, before the broker's open too), and spool captures
bounded by the spool's limits and the hold and memory budgets; whole and one byte at a time."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from floodwall.control.memory import MemoryBudget
from floodwall.enforce import events as ev
from floodwall.enforce.amqp10.links import link_ref
from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import AMQP_HEADER
from floodwall.wire.amqp10.performatives import TRANSFER
from floodwall.wire.amqp10.types import Described, Symbol, UInt
from floodwall.wire.relaycore import Side
from tests.amqp10 import streams
from tests.amqp10.streams import amqp, bytewise, continuation, open_, transfer, whole
from tests.amqp10.test_credit_gate import CAPPED_H, CHUNKERS, Chunker, Setup, message
from tests.amqp10.test_spool_gate import CAPPED, REJECTED, dispositions, records, spooling

FRAMING = "amqp:connection:framing-error"
GIB4 = struct.pack(">IBBH", 0xFFFFFFF0, 2, 0, 0)  # a frame header announcing 4 GiB


def fed(conn: Connection, data: bytes, chunker: Chunker, side: Side = Side.CLIENT) -> None:
    receive = conn.receive_from_client if side is Side.CLIENT else conn.receive_from_server
    for chunk in chunker(data):
        receive(chunk, 0.0)
        if conn.failure is not None:
            return


# -- the frame limit -----------------------------------------------------------------------

@pytest.mark.parametrize("chunker", CHUNKERS)
def test_before_the_brokers_open_a_4_gib_frame_is_refused_from_its_header(
        chunker: Chunker) -> None:
    """The client's own open (max-frame-size 4 GiB) says what *it* accepts: its frames stay
    held to the spec's 512 until the broker's open."""
    conn = Connection(AMQP_HEADER)
    fed(conn, open_("c", 0xFFFFFFFF) + GIB4, chunker)
    assert conn.failure is not None and conn.failure.side is Side.CLIENT
    assert conn.failure.condition == FRAMING
    assert conn.failure.reason == "frame size 4294967280 exceeds the max-frame-size 512"
    assert conn.pending_bytes == 0


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_after_the_brokers_open_its_max_frame_size_is_the_limit(chunker: Chunker) -> None:
    conn = Connection(AMQP_HEADER)
    conn.receive_from_client(open_("c", 0xFFFFFFFF) + streams.begin(0), 0.0)
    conn.receive_from_server(AMQP_HEADER + open_("s", 131072), 0.0)
    fed(conn, GIB4, chunker)
    assert conn.failure is not None
    assert conn.failure.reason == "frame size 4294967280 exceeds the max-frame-size 131072"
    assert conn.pending_bytes == 0


def test_a_partial_frame_is_counted_as_pending() -> None:
    conn = Connection(AMQP_HEADER)
    frame = open_("c" * 200)
    conn.receive_from_client(frame[:100], 0.0)
    assert conn.failure is None and conn.pending_bytes == 100
    conn.receive_from_client(frame[100:], 0.0)
    assert conn.failure is None and conn.pending_bytes == 0


# -- spool captures ------------------------------------------------------------------------

def big_delivery(delivery: int, body: bytes, frame_bytes: int) -> bytes:
    """One delivery in transfer frames of ``frame_bytes`` of payload."""
    parts = [body[i:i + frame_bytes] for i in range(0, len(body), frame_bytes)]
    out = [transfer(0, CAPPED_H, delivery, parts[0], more=True)]
    out += [continuation(0, CAPPED_H, p, more=n < len(parts) - 1)
            for n, p in enumerate(parts[1:], 1)]
    return b"".join(out)


def fell_back(s: Setup) -> list[ev.SpoolFellBack]:
    return [e for e in s.core.events() if isinstance(e, ev.SpoolFellBack)]


def rejected_reason(to_client: bytes) -> str:
    ((first, last, outcome, fields),) = dispositions(to_client)
    assert (first, last, outcome) == (0, 0, REJECTED)
    error = fields[0]  # type: ignore[index]
    assert isinstance(error, Described)
    assert error.value[0] == Symbol("amqp:resource-limit-exceeded")  # type: ignore[index]
    return str(error.value[1])  # type: ignore[index]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_capture_past_the_queues_spool_limit_is_dropped_and_rejected(
        tmp_path: Path, chunker: Chunker) -> None:
    """120 MB of continuation frames for a queue whose spool takes 1 MiB, at scale: here a
    64 KiB limit and 200 KiB. What was captured is let go at the limit, the rest dropped as
    it comes, the delivery rejected at once naming the queue, the link held by credit."""
    s = spooling(tmp_path, chunker, max_bytes="64KiB")
    s.client(big_delivery(0, message(200 * 1024), 8192))
    to_server, to_client = s.take()
    assert to_server == b""
    reason = rejected_reason(to_client)
    assert reason.startswith("floodwall: the message cannot be spooled for queue 'capped' "
                             "(spool of 'capped' is at its limit (65536 bytes): no room for ")
    (why,) = fell_back(s)
    assert why.queue == "capped" and why.action.startswith("rejected")
    assert s.counters.held_bytes == 0 and s.gate.captured_bytes == 0
    assert s.spool is not None and CAPPED not in s.spool.spools  # nothing written
    assert s.counters.spool_fallbacks == 1
    assert s.fc.is_blocked(1, link_ref(0, CAPPED_H))


def test_a_capture_counts_as_held_until_it_is_spooled(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    body = message(30_000)
    frames = big_delivery(0, body, 8192)
    first = transfer(0, CAPPED_H, 0, body[:8192], more=True)
    s.client(first)
    assert s.counters.held_bytes == s.gate.captured_bytes == 8192
    s.client(frames[len(first):])
    assert s.counters.held_bytes == s.gate.captured_bytes == 0
    assert [r.body for r in records(s)] == [body]


def test_a_capture_past_the_hold_budget_is_rejected(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    s.gate.ctx.hold_budget = 16 * 1024
    s.client(big_delivery(0, message(30_000), 8192))
    _, to_client = s.take()
    assert "does not fit the connection's hold budget (16384 bytes, 16384 held)" in \
        rejected_reason(to_client)
    assert s.counters.held_bytes == 0


def test_a_capture_past_the_memory_budget_is_rejected(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    s.board.enforcement.memory = MemoryBudget(16 * 1024)  # resume: 14 KiB
    s.client(big_delivery(0, message(30_000), 8192))
    _, to_client = s.take()
    assert "does not fit the memory budget (16384 bytes, 8192 held)" in \
        rejected_reason(to_client)
    assert s.counters.held_bytes == 0


def test_a_capture_in_progress_is_let_go_with_its_link_and_its_connection(
        tmp_path: Path) -> None:
    s = spooling(tmp_path)
    s.client(transfer(0, CAPPED_H, 0, message(20_000)[:8192], more=True))
    assert s.counters.held_bytes == 8192
    s.gate.close()
    assert s.counters.held_bytes == 0 and s.gate.captured_bytes == 0
    s = spooling(tmp_path / "2")
    s.client(transfer(0, CAPPED_H, 0, message(20_000)[:8192], more=True))
    s.client(amqp(TRANSFER, 0, b"", handle=UInt(CAPPED_H), aborted=True))
    assert s.counters.held_bytes == 0 and s.gate.captured_bytes == 0
    assert whole is not bytewise  # (both chunkers are in CHUNKERS above)
