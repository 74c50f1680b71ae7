"""AMQP 1.0 under ``overflow: spool``, driven by bytes: a link to a tripped queue keeps its
credit, its deliveries go to the spool (whole, also when they span frames or arrive a byte
at a time) and are settled ``accepted`` once durable; the session's delivery-ids and
transfer-ids are translated so the broker sees a consecutive session."""

from __future__ import annotations

from pathlib import Path

import pytest

from floodwall.control.controller import in_flight_allowance
from floodwall.enforce.amqp10.links import ASSUMED_MESSAGE_BYTES, SenderLink, link_ref, window_for
from floodwall.spool.log import QueueSpool
from floodwall.spool.manager import SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.performatives import DISPOSITION, FLOW, TRANSFER
from floodwall.wire.amqp10.types import Described, Symbol, UInt, ULong
from tests.amqp10.streams import amqp, continuation, performatives, transfer, whole
from tests.amqp10.test_credit_gate import (
    CAPPED_H,
    CHUNKERS,
    FREE_H,
    SERVER_CH,
    VHOST,
    Chunker,
    Setup,
    broker_flow,
    credit_seen,
    flows,
    message,
    num,
)

CAPPED = (VHOST, "capped")
ACCEPTED = 0x24
REJECTED = 0x25


def spooling(tmp_path: Path, chunker: Chunker = whole, fsync: str = "group",
             max_bytes: str = "64MiB") -> Setup:
    """A gated connection with a spool; the capped queue is tripped, both links have the
    broker's credit."""
    return spooling_granted(tmp_path, chunker, fsync, max_bytes)[0]


def spooling_granted(tmp_path: Path, chunker: Chunker = whole, fsync: str = "group",
                     max_bytes: str = "64MiB") -> tuple[Setup, int]:
    """``spooling``, and the credit the capped link's client was granted before the trip."""
    manager = SpoolManager(tmp_path / "spool")
    s = Setup(overflow="spool", spool=manager, chunker=chunker,
              policy_extra=f"    spool: {{max_bytes: {max_bytes}, fsync: {fsync}}}\n")
    s.server(broker_flow(7, 0, 1000) + broker_flow(8, 0, 1000))
    _, to_client = s.take()
    granted = credit_seen(to_client, 7, 0)
    s.sample("capped", 500_000)
    assert s.fc.queues[CAPPED].tripped
    return s, granted


def records(s: Setup) -> list[SpoolRecord]:
    assert s.spool is not None
    s.spool.sync(False)  # durable as far as reading goes (no fsync in a unit test)
    spool: QueueSpool = s.spool.spools[CAPPED]
    return [rec for rec, _ in spool.read_batch(0, 1 << 30, None)]


def dispositions(data: bytes) -> list[tuple[int, int, int, object]]:
    """(first, last, outcome code, outcome fields) of each disposition."""
    out = []
    for code, f in performatives(data):
        if code != DISPOSITION:
            continue
        assert f[0] is True and f[3] is True  # the proxy settles as the receiver
        state = f[4]
        assert isinstance(state, Described)
        first = num(f[1])
        last = first if len(f) < 3 or f[2] is None else num(f[2])
        out.append((first, last, int(state.descriptor), state.value))  # type: ignore[call-overload]
    return out


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_tripped_queues_link_keeps_credit_and_its_messages_are_spooled(
        tmp_path: Path, chunker: Chunker) -> None:
    s, granted = spooling_granted(tmp_path, chunker)
    # its first grant: its part of the queue's in-flight allowance, at the assumed size
    assert granted == window_for(ASSUMED_MESSAGE_BYTES,
                                 in_flight_allowance(s.fc.queues[CAPPED].policy))
    sent = [s.send(CAPPED_H, 100 + i) for i in range(5)]
    to_server, to_client = s.take()
    assert to_server == b""  # nothing reached the broker
    link = s.gate.sessions[0].links[CAPPED_H]
    assert isinstance(link, SenderLink)
    assert link.unsettled == 0  # nothing in flight: none counts against its allowance
    # and the client was never told to stop: each flow leaves it credit, and the limit it was
    # told last (the first grant's, or a top-up's) leaves it credit after the 5 it sent,
    # what the proxy counts it has left
    assert all(num(f[6]) > 0 for f in flows(to_client, 7))
    left = credit_seen(to_client, 7, 5) if flows(to_client, 7) else granted - 5
    assert left > 0
    assert link.credit.client_credit == left
    assert not s.fc.blocked_channels()
    got = records(s)
    assert [r.amqp10 for r in got] == [True] * 5
    assert {r.address for r in got} == {"/amq/queue/capped"}
    assert [r.body for r in got] == [message(100 + i) for i in range(5)]
    assert all(frame.endswith(r.body) for frame, r in zip(sent, got, strict=True))
    assert s.counters.spooled_records == 5
    assert dispositions(to_client) == []  # nothing is settled before it is durable
    s.board.spool_durable({CAPPED: 3})
    _, to_client = s.take()
    assert [(a, b, c) for a, b, c, _ in dispositions(to_client)] == [(0, 2, ACCEPTED)]
    s.board.spool_durable({CAPPED: 5})
    _, to_client = s.take()
    assert [(a, b, c) for a, b, c, _ in dispositions(to_client)] == [(3, 4, ACCEPTED)]


def test_the_free_link_on_the_same_session_is_renumbered_and_settled_by_the_broker(
        tmp_path: Path) -> None:
    s = spooling(tmp_path)
    for handle in (FREE_H, CAPPED_H, CAPPED_H, FREE_H, CAPPED_H, FREE_H):  # client ids 0..5
        s.send(handle)
    to_server, _ = s.take()
    forwarded = [f for code, f in performatives(to_server) if code == TRANSFER]
    assert [(num(f[0]), num(f[1])) for f in forwarded] == [(FREE_H, 0), (FREE_H, 1),
                                                            (FREE_H, 2)]
    # the broker settles its 0..2: the client hears of 0, 3 and 5
    accepted = Described(ULong(ACCEPTED), [])
    s.server(amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(0), last=UInt(2),
                  settled=True, state=accepted))
    _, to_client = s.take()
    assert [(a, b) for a, b, _, _ in dispositions(to_client)] == [(0, 0), (3, 3), (5, 5)]
    # the session's transfer-ids: 3 frames dropped
    s.server(broker_flow(8, 3, 997, next_incoming=3))
    _, to_client = s.take()
    assert num(flows(to_client, 8)[0][0]) == 6
    s.client(amqp(FLOW, 0, next_incoming_id=UInt(0), incoming_window=UInt(5000),
                  next_outgoing_id=UInt(6), outgoing_window=UInt(5000)))
    to_server, _ = s.take()
    assert num(flows(to_server)[0][2]) == 3


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_multi_frame_delivery_is_spooled_whole_and_an_aborted_one_not_at_all(
        tmp_path: Path, chunker: Chunker) -> None:
    s = spooling(tmp_path, chunker)
    body = message(3000)
    s.client(transfer(0, CAPPED_H, 0, body[:1000], more=True)
             + continuation(0, CAPPED_H, body[1000:2000], more=True)
             + continuation(0, CAPPED_H, body[2000:], more=False))
    s.client(transfer(0, CAPPED_H, 1, body[:1000], more=True)
             + amqp(TRANSFER, 0, b"", handle=UInt(CAPPED_H), aborted=True))
    s.client(transfer(0, FREE_H, 2, message(10)))
    to_server, to_client = s.take()
    assert [r.body for r in records(s)] == [body]
    forwarded = [f for code, f in performatives(to_server) if code == TRANSFER]
    assert [num(f[1]) for f in forwarded] == [0]  # the broker's first delivery
    s.board.spool_durable({CAPPED: 1})
    _, to_client = s.take()
    assert [(a, b) for a, b, _, _ in dispositions(to_client)] == [(0, 0)]


def test_a_delivery_sent_settled_is_spooled_and_not_settled_again(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    s.client(amqp(TRANSFER, 0, message(50), handle=UInt(CAPPED_H), delivery_id=UInt(0),
                  delivery_tag=b"t0", message_format=UInt(0), settled=True))
    s.board.spool_durable({CAPPED: 1})
    to_server, to_client = s.take()
    assert to_server == b"" and dispositions(to_client) == []
    assert [r.body for r in records(s)] == [message(50)]


def test_fsync_never_settles_at_once(tmp_path: Path) -> None:
    s = spooling(tmp_path, fsync="never")
    s.send(CAPPED_H)
    _, to_client = s.take()
    assert [(a, b, c) for a, b, c, _ in dispositions(to_client)] == [(0, 0, ACCEPTED)]


def test_backlog_keeps_the_queue_fifo_after_it_drains(tmp_path: Path) -> None:
    """Below resume but with spooled backlog: new messages join the spool, not the broker."""
    s = spooling(tmp_path)
    s.send(CAPPED_H)
    s.sample("capped", 0)
    assert not s.fc.queues[CAPPED].tripped
    assert s.fc.blocking(VHOST, frozenset({"capped"}))  # the backlog
    s.send(CAPPED_H)
    to_server, _ = s.take()
    assert to_server == b""
    assert len(records(s)) == 2


def test_what_the_spool_refuses_is_rejected_and_the_link_is_held(tmp_path: Path) -> None:
    s = spooling(tmp_path, max_bytes="300B")
    s.send(CAPPED_H, 100)
    s.send(CAPPED_H, 200)  # over the queue's spool limit
    to_server, to_client = s.take()
    assert to_server == b""
    got = dispositions(to_client)
    assert [(a, b, c) for a, b, c, _ in got] == [(1, 1, REJECTED)]
    error = got[0][3][0]  # type: ignore[index]
    assert isinstance(error, Described)
    assert error.value[0] == Symbol("amqp:resource-limit-exceeded")  # type: ignore[index]
    assert "spool" in error.value[1]  # type: ignore[index]
    # held by credit from now on: no more is granted than the client had
    assert s.fc.is_blocked(1, link_ref(0, CAPPED_H))
    assert s.counters.spool_fallbacks == 1 and len(records(s)) == 1
    # the queue drains and the backlog with it: the link gets credit again
    s.sample("capped", 0)
    s.fc.set_backlog(CAPPED, False)
    s.board.settle()
    _, to_client = s.take()
    assert credit_seen(to_client, 7, 2) > 0


def test_a_transactional_transfer_is_not_spooled(tmp_path: Path) -> None:
    s = spooling(tmp_path)
    txn = Described(ULong(0x34), [b"txn-1"])
    frame = amqp(TRANSFER, 0, message(10), handle=UInt(CAPPED_H), delivery_id=UInt(0),
                 delivery_tag=b"t0", message_format=UInt(0), state=txn)
    s.client(frame)
    to_server, to_client = s.take()
    assert to_server == frame  # forwarded as it was, then held by credit
    assert flows(to_client, 7) == []
    assert s.fc.is_blocked(1, link_ref(0, CAPPED_H))
    assert s.spool is not None and CAPPED not in s.spool.spools


def test_without_a_spool_the_link_is_held_by_credit(tmp_path: Path) -> None:
    s = Setup(overflow="spool")
    s.server(broker_flow(7, 0, 1000))
    s.take()
    s.sample("capped", 500_000)
    frame = s.send(CAPPED_H)
    to_server, to_client = s.take()
    assert to_server == frame and flows(to_client, 7) == []
    assert s.fc.is_blocked(1, link_ref(0, CAPPED_H))


def test_a_drop_between_the_frames_of_another_links_delivery_keeps_its_id(
        tmp_path: Path) -> None:
    """Deliveries of two links interleave on one session: a continuation that repeats its
    delivery-id keeps the broker id its first frame got, whatever was dropped meanwhile."""
    s = spooling(tmp_path)
    s.send(CAPPED_H)  # client id 0: spooled, so the free link's next delivery is the broker's 0
    body = message(300)
    s.client(transfer(0, FREE_H, 1, body[:100], more=True))
    s.client(transfer(0, CAPPED_H, 2, message(10)))  # spooled between the free link's frames
    s.client(amqp(TRANSFER, 0, body[100:], handle=UInt(FREE_H), delivery_id=UInt(1),
                  more=False))
    to_server, _ = s.take()
    forwarded = [f for code, f in performatives(to_server) if code == TRANSFER]
    assert [(num(f[0]), num(f[1])) for f in forwarded] == [(FREE_H, 0), (FREE_H, 0)]
    s.next_id = 3
    s.send(FREE_H)  # client id 3: two dropped before it
    to_server, _ = s.take()
    assert [num(f[1]) for code, f in performatives(to_server) if code == TRANSFER] == [1]
