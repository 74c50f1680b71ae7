"""The broker's settlements read as runs (``scan_settlements``, ``server_settle_run``).

RabbitMQ settles each delivery of a fast sender with a disposition of its own, tens to a
read. A disposition and the dispositions alike that follow it are read in one pass and
booked as ranges of consecutive ids, while that is all booking them one by one would do. The
scanner against crafted frames; the core and gate with runs against the same without, fed
the same bytes: the same bytes out to both peers and the same books after every read.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.wire.amqp10.performatives import DISPOSITION, FLOW
from floodwall.wire.amqp10.runs import SETTLE_SPAN, scan_settlements, settle_template
from floodwall.wire.amqp10.types import Described, UInt, ULong
from tests.amqp10.streams import (
    amqp,
    disposition,
    performatives,
    random_chunks,
    transfer,
    whole,
)
from tests.amqp10.test_credit_gate import (
    ANON_H,
    CAPPED_H,
    SERVER_CH,
    Setup,
    broker_flow,
    message,
    renumbered,
)
from tests.conftest import record_calls

ACCEPTED = Described(ULong(0x24), [])
REJECTED = Described(ULong(0x25), [])
BASE = 1000  # delivery-ids in the uint encoding (below 256 they are smalluints: no run)


def settle(first: int, last: int | None = None, channel: int = SERVER_CH, **fields: object
           ) -> bytes:
    """The broker's disposition as RabbitMQ sends it: role receiver, first, last, settled,
    accepted, batchable null."""
    base: dict[str, object] = {"role": True, "first": UInt(first),
                               "last": UInt(first if last is None else last),
                               "settled": True, "state": ACCEPTED, "batchable": None}
    base.update(fields)
    return amqp(DISPOSITION, channel, **base)


def scan(frames: list[bytes]) -> tuple[int, int, list[tuple[int, int]]]:
    """``scan_settlements`` of ``frames``, the first the template."""
    buf = b"".join(frames)
    return scan_settlements(buf, 0, len(frames[0]))


# -- the scanner ---------------------------------------------------------------------------

def test_the_template_is_a_receivers_disposition_with_uint_first_and_last() -> None:
    one = settle(BASE)
    assert settle_template(one, 0, len(one))
    for other in (settle(5), settle(BASE, role=False), disposition(SERVER_CH, True, 5, BASE),
                  amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(BASE), settled=True),
                  amqp(FLOW, 0, handle=UInt(BASE)), settle(BASE + 2, BASE + 1),
                  settle(BASE, BASE + SETTLE_SPAN)):
        assert not settle_template(other, 0, len(other)), other.hex()


def test_consecutive_settlements_are_one_range_gaps_and_repeats_start_another() -> None:
    frames = [settle(BASE + i) for i in range(40)]
    assert scan(frames) == (sum(map(len, frames)), 39, [(BASE, BASE + 39)])
    frames = [settle(BASE), settle(BASE + 1), settle(BASE + 2), settle(BASE + 5),
              settle(BASE + 6), settle(BASE + 6), settle(BASE + 3, BASE + 4)]
    end, count, ranges = scan(frames)
    assert (end, count) == (sum(map(len, frames)), 6)
    assert ranges == [(BASE, BASE + 2), (BASE + 5, BASE + 6), (BASE + 6, BASE + 6),
                      (BASE + 3, BASE + 4)]


def model(frames: list[bytes]) -> tuple[int, int, list[tuple[int, int]]]:
    """``scan_settlements`` frame by frame, from its contract: the frames after the first
    that are it again but for first and last (a forward range under SETTLE_SPAN), their
    ranges with consecutive ones joined."""
    template = frames[0]

    def rest(f: bytes) -> bytes:
        return f[:16] + f[20:21] + f[25:] if len(f) == len(template) else b""

    end, count = len(template), 0
    ranges = [(int.from_bytes(template[16:20], "big"), int.from_bytes(template[21:25], "big"))]
    for f in frames[1:]:
        first, last = int.from_bytes(f[16:20], "big"), int.from_bytes(f[21:25], "big")
        if rest(f) != rest(template) or (last - first) & 0xFFFFFFFF >= SETTLE_SPAN:
            break
        if first == (ranges[-1][1] + 1) & 0xFFFFFFFF \
                and (last - ranges[-1][0]) & 0xFFFFFFFF < SETTLE_SPAN:
            ranges[-1] = (ranges[-1][0], last)
        else:
            ranges.append((first, last))
        end, count = end + len(f), count + 1
    return end, count, ranges


def test_settlements_read_many_at_once_and_one_by_one_make_the_same_ranges() -> None:
    alike = [settle(BASE + 1 + i) for i in range(40)]
    frames = [settle(BASE), *alike, settle(BASE + 41, BASE + 43),
              *(settle(BASE + 44 + i) for i in range(5))]
    assert scan(frames) == (sum(map(len, frames)), 46, [(BASE, BASE + 48)])


def test_a_joined_range_spans_at_most_settle_span_ids() -> None:
    frames = [wide(BASE), wide(BASE + 1, BASE + SETTLE_SPAN - 2),
              *(wide(BASE + SETTLE_SPAN - 1 + i) for i in range(4))]
    assert scan(frames) == model(frames)
    assert scan(frames)[2] == [(BASE, BASE + SETTLE_SPAN - 1), (BASE + SETTLE_SPAN,
                                                                BASE + SETTLE_SPAN + 2)]


_ODD = st.sampled_from(["next", "next", "next", "next", "range", "repeat", "gap", "rejected",
                        "longer", "last71", "channel"])


@settings(max_examples=400, deadline=None)
@given(kinds=st.lists(_ODD, min_size=1, max_size=80), start=st.sampled_from(
    [BASE, 0xFFFFFFFF - 40, 1 << 31]))
def test_what_the_scanner_reads_is_what_frame_by_frame_reading_would(
        kinds: list[str], start: int) -> None:
    """Blocks of settlements alike (read with one struct) and the frames read one by one
    give the ranges the contract gives, whatever is mixed in."""
    frames, at = [wide(start)], start
    for kind in kinds:
        at = (at + 1) & 0xFFFFFFFF
        if kind == "range":
            frames.append(wide(at, (at + 2) & 0xFFFFFFFF))
            at = (at + 2) & 0xFFFFFFFF
        elif kind == "repeat":
            frames.append(wide((at - 1) & 0xFFFFFFFF))
            at = (at - 1) & 0xFFFFFFFF
        elif kind == "gap":
            at = (at + 5) & 0xFFFFFFFF
            frames.append(wide(at))
        elif kind == "rejected":
            frames.append(settle(BASE, state=REJECTED)[:16] + at.to_bytes(4, "big") + b"\x70"
                          + at.to_bytes(4, "big") + settle(BASE, state=REJECTED)[25:])
        elif kind == "longer":
            frames.append(settle(BASE, batchable=True))
        elif kind == "last71":
            f = wide(at)
            frames.append(f[:20] + b"\x71" + f[21:])
        elif kind == "channel":  # the same frame on another session
            f = wide(at)
            frames.append(f[:6] + (SERVER_CH + 1).to_bytes(2, "big") + f[8:])
        else:  # the next one (the ids wrap where they do)
            frames.append(wide(at))
    assert scan(frames) == model(frames)


@pytest.mark.parametrize(("stopper", "why"), [
    (settle(BASE + 1, channel=SERVER_CH + 1), "another session"),
    (settle(BASE + 1, state=REJECTED), "another outcome"),
    (settle(BASE + 1, batchable=True), "batchable"),
    (settle(BASE + 1, role=False), "the sender's"),
    (settle(BASE + 2, BASE + 1), "last before first"),
    (settle(BASE + 1, BASE + SETTLE_SPAN + 1), "too many ids"),
    (disposition(SERVER_CH, True, 7, 7), "smalluint ids"),
    (broker_flow(7, 0, 10), "another performative"),
    (b"\x00\x00\x00\x08\x02\x00\x00\x00", "a heartbeat"),
])
def test_the_run_ends_at_the_first_frame_that_is_not_one_of_it(stopper: bytes, why: str) -> None:
    frames = [settle(BASE), settle(BASE + 1), stopper, settle(BASE + 2)]
    assert scan(frames) == (len(frames[0]) * 2, 1, [(BASE, BASE + 1)]), why


def wide(first: int, last: int | None = None) -> bytes:
    """``settle`` with first and last in the uint encoding whatever their value (an encoder
    that always writes four bytes)."""
    frame = bytearray(settle(BASE))
    frame[16:20] = first.to_bytes(4, "big")
    frame[21:25] = (first if last is None else last).to_bytes(4, "big")
    return bytes(frame)


def test_a_cut_frame_ends_the_run_and_ids_wrap_around() -> None:
    frames = [wide((0xFFFFFFFD + i) & 0xFFFFFFFF) for i in range(6)]  # 2^32 - 3 to 2
    data = b"".join(frames)
    size = len(frames[0])
    assert scan_settlements(data, 0, size) == (len(data), 5, [(0xFFFFFFFD, 2)])
    for cut in range(size, len(data) + 1):
        end, count, _ = scan_settlements(data[:cut], 0, size)
        assert count == cut // size - 1 and end == (count + 1) * size


# -- the gate with and without runs, in lockstep ----------------------------------------------

class Twins:
    """Two gated connections fed the same bytes; ``slow`` never reads settlement runs.
    ``dropped``: deliveries the proxy took for itself first (anonymous ones to a tripped
    queue, held), so that the session is renumbered: the broker's ids run that many behind
    the client's, and the client gets the same settlements in fewer frames from runs."""

    def __init__(self, chunker_seed: int | None = None, capacity: int = 100_000,
                 dropped: int = 0) -> None:
        chunker = whole if chunker_seed is None else random_chunks(chunker_seed, 90)
        self.fast = Setup(chunker=chunker, capacity=capacity)
        chunker = whole if chunker_seed is None else random_chunks(chunker_seed, 90)
        self.slow = Setup(chunker=chunker, capacity=capacity)
        self.slow.gate.server_settle_run = lambda channel, alone: False  # type: ignore[method-assign]
        for s in (self.fast, self.slow):
            s.next_id = BASE
            if dropped:
                s.server(broker_flow(9, 0, 1000))
                s.sample("capped2", 2 * capacity)
                for _ in range(dropped):
                    s.send(ANON_H, 100, to="/amq/queue/capped2")
                assert s.gate.sessions[0].ids.dropped == dropped
        self.exact = not dropped
        self.server(broker_flow(7, 0, 100_000))
        self.sent = 0

    def client(self, n: int, size: int) -> None:
        """The client sends ``n`` deliveries, or as many as its credit allows, in one read."""
        n = min(n, self.fast.gate.sessions[0].links[CAPPED_H].credit.room())  # type: ignore[union-attr]
        for s in (self.fast, self.slow):
            frames = b""
            for _ in range(n):
                frames += transfer(0, CAPPED_H, s.next_id, message(size))
                s.next_id += 1
            s.client(frames)
        self.sent += n
        self.check()

    def server(self, data: bytes) -> None:
        self.fast.server(data)
        self.slow.server(data)
        self.check()

    def check(self) -> None:
        fast, slow = self.fast.take(), self.slow.take()
        if self.exact:
            assert fast == slow
        else:  # the same bytes to the broker; the same outcome for each delivery, in order
            assert fast[0] == slow[0] and settled_ids(fast[1]) == settled_ids(slow[1])
        assert self.fast.core.from_server == self.slow.core.from_server  # frames, bytes
        a, b = self.fast.gate, self.slow.gate
        for ga, gb in ((a, b),):
            sa, sb = ga.sessions[0], gb.sessions[0]
            assert list(sa.in_flight) == list(sb.in_flight)
            la, lb = sa.links[CAPPED_H], sb.links[CAPPED_H]
            assert (la.unsettled, la.squeezed, la.delivery.tracked_id, la.credit) == (  # type: ignore[union-attr]
                lb.unsettled, lb.squeezed, lb.delivery.tracked_id, lb.credit)  # type: ignore[union-attr]
        qa = self.fast.fc.queues[("/", "capped")]
        qb = self.slow.fc.queues[("/", "capped")]
        assert qa.in_flight == qb.in_flight


def settled_ids(data: bytes) -> tuple[list[object], list[object]]:
    """The frames of ``data`` but its dispositions, and each id those settle with what, in
    order (a range counted id by id)."""
    others: list[object] = []
    ids: list[object] = []
    for code, f in performatives(data):
        if code != DISPOSITION:
            others.append((code, f))
            continue
        first = int(f[1])  # type: ignore[call-overload]
        last = first if len(f) < 3 or f[2] is None else int(f[2])  # type: ignore[call-overload]
        span = (last - first) & 0xFFFFFFFF
        ids += [(f[0], i & 0xFFFFFFFF, f[3:]) for i in range(first, first + span + 1)]
    return others, ids


def test_a_read_of_settlements_is_booked_in_two_calls_and_the_books_agree() -> None:
    t = Twins(capacity=10**9)
    while t.sent < 60:
        t.client(60 - t.sent, 100)
    calls = record_calls(t.fast.gate, "on_server_settle_run")
    t.server(b"".join(settle(BASE + i) for i in range(40)))
    assert [call[1:3] for call in calls] == [(BASE, BASE + 39)]  # one call
    assert t.fast.gate.sessions[0].links[CAPPED_H].unsettled == 20  # type: ignore[union-attr]


def test_while_a_link_is_squeezed_each_settlement_is_booked_on_its_own() -> None:
    t = Twins()  # a capacity the in-flight deliveries squeeze the window under
    link = t.fast.gate.sessions[0].links[CAPPED_H]
    while (room := link.credit.room()) > 0:  # type: ignore[union-attr]
        t.client(min(room, 50), 100)
    assert link.squeezed and link.unsettled > 16  # type: ignore[union-attr]
    calls = record_calls(t.fast.gate, "on_server_settled")
    t.server(b"".join(settle(BASE + i) for i in range(8)))
    assert [call[2:4] for call in calls] == [(BASE + i, BASE + i) for i in range(8)]


_STEP = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 80), st.integers(0, 0)),
    st.tuples(st.just("settle"), st.integers(1, 60), st.integers(0, 3)),
    st.tuples(st.just("flow"), st.integers(0, 0), st.integers(0, 0)),
)


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=14), seed=st.integers(0, 10_000),
       whole_reads=st.booleans(), dropped=st.sampled_from([0, 0, 2]))
def test_with_and_without_settlement_runs_the_bytes_and_books_are_the_same(
        steps: list[tuple[str, int, int]], seed: int, whole_reads: bool, dropped: int) -> None:
    """Whatever the client sends and however the broker settles it (in order, repeated,
    out of order, in ranges, past what was sent) and however the reads are cut; on a
    renumbered session the client's ids (the same outcome for each delivery, in order)."""
    t = Twins(None if whole_reads else seed, dropped=dropped)
    settled = 0
    for kind, n, twist in steps:
        if kind == "send":
            t.client(n, 100)
        elif kind == "flow":
            t.server(broker_flow(7, t.sent, 100_000))
        else:
            ids = list(range(settled, settled + n))
            frames = [settle(BASE + i) for i in ids]
            if twist == 1 and frames:
                frames.insert(len(frames) // 2, frames[0])  # a repeat
            elif twist == 2 and len(frames) > 2:
                frames[1], frames[2] = frames[2], frames[1]  # out of order
            elif twist == 3 and frames:
                frames[-1] = settle(BASE + ids[-1], BASE + ids[-1] + 3)  # a range past
            settled += n
            t.server(b"".join(frames))
    assert CAPPED_H in t.fast.gate.sessions[0].links  # (no step broke the rules)


def test_a_run_of_settlements_on_a_renumbered_session_reaches_the_client_in_its_ids() -> None:
    """Two deliveries held first: the broker's 40 dispositions of its ids BASE..BASE+39 are
    read as one run and reach the client as one disposition of its BASE+2..BASE+41, the
    deliveries in flight freed as one at a time would."""
    t = Twins(capacity=10**9, dropped=2)
    while t.sent < 40:
        t.client(40 - t.sent, 100)
    calls = record_calls(t.fast.gate, "on_server_settle_run")
    t.fast.server(b"".join(settle(BASE + i) for i in range(40)))
    t.slow.server(b"".join(settle(BASE + i) for i in range(40)))
    fast, slow = t.fast.take()[1], t.slow.take()[1]
    assert [call[1:3] for call in calls] == [(BASE, BASE + 39)]
    ranges = [(f[1], f[2]) for code, f in performatives(fast) if code == DISPOSITION]
    assert ranges == [(BASE + 2, BASE + 41)] and len(performatives(slow)) == 40
    assert settled_ids(fast) == settled_ids(slow)
    assert t.fast.gate.sessions[0].links[CAPPED_H].unsettled == 0  # type: ignore[union-attr]
    t.exact = True
    t.check()  # the books


@pytest.mark.parametrize("dropped", [0, 2])
def test_a_settlement_alone_in_its_read_is_a_run_only_where_the_session_renumbers(
        dropped: int) -> None:
    """A disposition with nothing after it in the read: on a renumbered session booked as a
    run of one and written in the client's ids (not decoded and encoded again); elsewhere
    read by ``on_server_settled``, cheaper for one frame."""
    t = Twins(capacity=10**9, dropped=dropped)
    t.client(3, 100)
    calls = record_calls(t.fast.gate, "on_server_settle_run")
    t.fast.server(settle(BASE + 1, BASE + 2))
    t.slow.server(settle(BASE + 1, BASE + 2))
    fast, slow = t.fast.take()[1], t.slow.take()[1]
    assert [call[1:3] for call in calls] == ([(BASE + 1, BASE + 2)] if dropped else [])
    ranges = [(f[1], f[2]) for code, f in performatives(fast) if code == DISPOSITION]
    assert ranges == [(BASE + 1 + dropped, BASE + 2 + dropped)]
    assert settled_ids(fast) == settled_ids(slow)
    t.exact = True
    t.check()  # the books


def test_in_a_renumbered_session_every_settlement_is_mapped_back() -> None:
    """A session some of whose deliveries the proxy consumed is renumbered: the broker's
    dispositions are mapped back to the client's ids, around the ones it consumed."""
    s, _ = renumbered()  # the client's ids 0..4, 1 and 3 dropped
    s.server(wide(0) + wide(1) + wide(2))  # (uint first and last: the run's shape)
    _, to_client = s.take()
    ranges = [(f[1], f[2]) for code, f in performatives(to_client) if code == DISPOSITION]
    assert ranges == [(0, 0), (2, 2), (4, 4)]
