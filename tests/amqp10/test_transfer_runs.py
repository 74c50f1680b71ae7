"""Runs of one link's whole deliveries, read in one pass (the per-transfer cost).

The scanner (``floodwall.wire.amqp10.runs``) against the full decoder, and the gate with runs
against the gate a transfer at a time: the broker gets the same bytes, the ledgers, counts,
credit and in-flight deliveries are the same after every read, and the client is never left
without credit the transfer-at-a-time gate would have given it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.amqp10.links import ReceiverLink, SenderLink, encode_performative_fields
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import TRANSFER, TransferFields, decode_composite
from floodwall.wire.amqp10.runs import renumber_run, scan_transfer_run
from floodwall.wire.amqp10.types import Described, UByte, UInt, ULong, encode
from tests.amqp10.streams import amqp, bytewise, continuation, random_chunks, whole
from tests.amqp10.test_credit_gate import (
    ANON_H,
    CAPPED_H,
    FREE_H,
    RECV_H,
    SERVER_CH,
    SERVER_HANDLE,
    VHOST,
    Chunker,
    Setup,
    broker_flow,
    disposition,
    message,
)
from tests.amqp10.test_spool_gate import records, spooling
from tests.conftest import record_calls

LIMIT = 1 << 20
ACCEPTED = Described(ULong(0x24), [])


def xfer(handle: int, delivery: int, payload: bytes = b"\x00Sw\xa1\x02hi", channel: int = 0,
         **fields: Any) -> bytes:
    """A transfer frame; ``fields`` override or add to handle, id, tag, format 0."""
    base: dict[str, Any] = {"handle": UInt(handle), "delivery_id": UInt(delivery),
                            "delivery_tag": delivery.to_bytes(4, "big"),
                            "message_format": UInt(0)}
    base.update(fields)
    return amqp(TRANSFER, channel, payload, **base)


def scan(buf: bytes, handle: int = 0, next_id: int = 0, most: int = 1000,
         most_bytes: float = float("inf"), channel: int = 0) -> tuple[int, int, int, list[int]]:
    unsettled: list[int] = []
    end, count, total = scan_transfer_run(buf, 0, LIMIT, channel, handle, next_id, most,
                                          most_bytes, unsettled)
    return end, count, total, unsettled


# -- the scanner ---------------------------------------------------------------------------

def test_a_run_is_read_to_its_end_with_its_payload_and_unsettled_ids() -> None:
    frames = [xfer(0, i, b"x" * (i + 1), settled=(i % 3 == 0) or None) for i in range(10)]
    end, count, total, unsettled = scan(b"".join(frames))
    assert (end, count, total) == (sum(map(len, frames)), 10, sum(range(1, 11)))
    assert unsettled == [i for i in range(10) if i % 3]


def test_the_broker_s_runs_are_read_alike_without_collecting_unsettled_ids() -> None:
    buf = b"".join(xfer(0, i, b"x" * 9) for i in range(100))  # the ones alike: in bulk
    expected = scan(buf)
    assert expected[3] == list(range(100))
    assert scan_transfer_run(buf, 0, LIMIT, 0, 0, 0, 1000, float("inf"), None) == expected[:3]


@pytest.mark.parametrize(("stopper", "why"), [
    (xfer(1, 3), "another link"),
    (xfer(0, 3, channel=1), "another session"),
    (xfer(0, 4), "a gap in the delivery-ids"),
    (xfer(0, 3, more=True), "the first frame of a multi-frame delivery"),
    (continuation(0, 0, b"x", False), "a frame without a delivery-id"),
    (xfer(0, 3, state=ACCEPTED), "a state"),
    (xfer(0, 3, aborted=True), "aborted"),
    (xfer(0, 3, resume=True), "resume"),
    (amqp(0x13, 0, handle=UInt(0)), "another performative"),
    (b"\x00\x00\x00\x08\x02\x00\x00\x00", "a heartbeat"),
])
def test_the_run_ends_at_the_first_frame_that_is_not_one_of_it(stopper: bytes, why: str) -> None:
    head = b"".join(xfer(0, i) for i in range(3))
    end, count, _, _ = scan(head + stopper + xfer(0, 3))
    assert (end, count) == (len(head), 3), why


def test_the_run_stops_at_its_count_and_byte_limits_and_at_a_cut_frame() -> None:
    frames = [xfer(0, i, b"y" * 100) for i in range(1, 6)]  # (ids of one size)
    data = b"".join(frames)
    assert scan(data, next_id=1, most=2)[:2] == (len(frames[0]) * 2, 2)
    assert scan(data, next_id=1, most_bytes=250)[:3] == (len(frames[0]) * 2, 2, 200)
    for cut in range(len(data) + 1):  # every prefix: the complete frames, no error
        end, count, _, _ = scan(data[:cut], next_id=1)
        assert count == cut // len(frames[0]) and end == count * len(frames[0])


def test_ids_and_handles_in_every_uint_encoding_and_wrap_around() -> None:
    data = xfer(300, 0xFFFFFFFF) + xfer(300, 0) + xfer(300, 1)
    assert scan(data, handle=300, next_id=0xFFFFFFFF)[1:] == (3, 21, [0xFFFFFFFF, 0, 1])
    assert scan(xfer(5, 200), handle=5, next_id=200)[1] == 1


def test_a_list32_transfer_is_read_too() -> None:
    body = (encode(UInt(0)) + encode(UInt(7)) + b"\xa0\x01t" + encode(UInt(0)))
    fields = b"\xd0" + (len(body) + 4).to_bytes(4, "big") + (4).to_bytes(4, "big") + body
    performative = b"\x00\x53\x14" + fields
    frame = (8 + len(performative) + 2).to_bytes(4, "big") + b"\x02\x00\x00\x00" \
        + performative + b"ab"
    assert scan(frame, next_id=7)[1:] == (1, 2, [7])


_FIELD = st.fixed_dictionaries({}, optional={
    "settled": st.sampled_from([True, False, None]),
    "more": st.sampled_from([True, False, None]),
    "rcv_settle_mode": st.sampled_from([UByte(0), UByte(1), None]),
    "state": st.sampled_from([ACCEPTED, None]),
    "resume": st.sampled_from([True, False, None]),
    "aborted": st.sampled_from([True, False, None]),
    "batchable": st.sampled_from([True, False, None]),
    "message_format": st.sampled_from([UInt(0), UInt(7), UInt(1 << 20), None]),
    "delivery_tag": st.binary(max_size=40),
})


@settings(max_examples=300, deadline=None)
@given(extra=st.lists(_FIELD, min_size=1, max_size=6),
       handle=st.sampled_from([0, 1, 255, 256, 70000]), first=st.integers(0, 0xFFFFFFFF),
       payload=st.binary(max_size=30))
def test_what_the_scanner_takes_is_what_the_decoder_reads(
        extra: list[dict[str, Any]], handle: int, first: int, payload: bytes) -> None:
    """Whatever the scanner takes into a run, the full decoder reads as a whole delivery of
    the link with the next delivery-id, and its payload where the scanner says; and it takes
    every frame of that kind in the encodings the encoder makes."""
    frames = [xfer(handle, (first + i) & 0xFFFFFFFF, payload, **f) for i, f in enumerate(extra)]
    _scanned_as_decoded(frames, handle, first)


@settings(max_examples=300, deadline=None)
@given(extra=st.lists(_FIELD, min_size=1, max_size=6),
       handle=st.sampled_from([0, 1, 255, 256, 70000]),
       first=st.sampled_from([0, 1, 200, 255, 256, 300, 0x10000, 0xFFFFFFFE]),
       shift=st.sampled_from([1, 2, 45, 255, 256, 301, 0xFFFFFFFF]),
       payload=st.binary(max_size=30), list32=st.booleans())
def test_a_renumbered_run_is_what_the_encoder_makes_of_each_transfer_with_its_new_id(
        extra: list[dict[str, Any]], handle: int, first: int, shift: int, payload: bytes,
        list32: bool) -> None:
    """Each transfer of a run, its delivery-id less ``shift``: the bytes the per-frame path
    makes of it (decoded, the id replaced, encoded again), whatever the id's encoding was and
    becomes, and from a list32 too."""
    runnable = [{k: v for k, v in f.items() if k not in _ENDS_A_RUN or not v} for f in extra]
    frames = [xfer(handle, (first + i) & 0xFFFFFFFF, payload, **f)
              for i, f in enumerate(runnable)]
    if list32:
        frames = [_as_list32(f) for f in frames]
    buf = b"".join(frames)
    end, count, _, _ = scan(buf, handle=handle, next_id=first)
    assert (end, count) == (len(buf), len(frames))
    want = []
    for f in frames:
        _, fields, start = decode_composite(f, 8, len(f))
        fields = list(fields)
        fields[1] = UInt((int(fields[1]) - shift) & 0xFFFFFFFF)  # type: ignore[call-overload]
        want.append(frame(encode_performative_fields(TRANSFER, fields) + f[start:], 0))
    assert renumber_run(buf, 0, end, shift) == b"".join(want)


_ENDS_A_RUN = ("more", "state", "resume", "aborted")  # (when set)


@pytest.mark.parametrize("tag", range(236, 246))
def test_a_renumbered_id_that_no_longer_fits_a_list8_makes_it_a_list32(tag: int) -> None:
    """Fields just under a list8's 255 bytes: an id that grows from one byte to four makes
    the list a list32, as the encoder would (and one that shrinks, a list8 again)."""
    grow = xfer(1, 5, b"ab", delivery_tag=b"t" * tag)
    shrink = xfer(1, 300, b"ab", delivery_tag=b"t" * tag)
    for buf, first, shift, new in ((grow, 5, (5 - 300) & 0xFFFFFFFF, 300),
                                   (shrink, 300, 295, 5)):
        want = xfer(1, new, b"ab", delivery_tag=b"t" * tag)
        assert scan(buf, handle=1, next_id=first)[:2] == (len(buf), 1)
        assert renumber_run(buf, 0, len(buf), shift) == want
    assert any(xfer(1, 300, b"", delivery_tag=b"t" * t)[11] == 0xD0 for t in range(236, 246))


def _as_list32(f: bytes) -> bytes:
    """The transfer frame ``f`` with its list8 of fields written as a list32."""
    size, count = f[12], f[13]
    body = (size + 3).to_bytes(4, "big") + count.to_bytes(4, "big") + f[14:13 + size]
    rest = b"\x00\x53\x14\xd0" + body + f[13 + size:]
    return (8 + len(rest)).to_bytes(4, "big") + f[4:8] + rest


# Shapes that repeat, so the scanner's comparison with the previous transfer is taken, and
# pairs of the same length that differ in one byte of the fields after the tag.
_SHAPE = st.sampled_from([
    {}, {"settled": True}, {"settled": False}, {"more": True}, {"more": False},
    {"settled": False, "more": False}, {"settled": False, "more": True},
    {"delivery_tag": b"abcd"}, {"delivery_tag": b"abce"}, {"delivery_tag": b"ab"},
    {"message_format": UInt(7)}, {"message_format": UInt(8)},
    {"rcv_settle_mode": UByte(0)}, {"rcv_settle_mode": UByte(1)},
    {"resume": False}, {"resume": True}, {"batchable": True}, {"batchable": False}])


@settings(max_examples=300, deadline=None)
@given(shapes=st.lists(_SHAPE, min_size=1, max_size=12),
       handle=st.sampled_from([0, 255, 256]), first=st.sampled_from([250, 0x10000, 0xFFFFFFFE]),
       gap=st.one_of(st.none(), st.integers(0, 11)),
       payloads=st.lists(st.binary(max_size=8), min_size=12, max_size=12))
def test_transfers_shaped_like_the_previous_one_are_read_as_the_decoder_reads_them(
        shapes: list[dict[str, Any]], handle: int, first: int, gap: int | None,
        payloads: list[bytes]) -> None:
    """Runs of repeated shapes (the scanner compares a transfer with the previous one before
    it parses it), the delivery-ids crossing an encoding's size or 2^32, one id skipped at
    ``gap``, payloads of any size: the scanner takes what the decoder reads as the run."""
    frames = [xfer(handle, (first + i + (gap is not None and i >= gap)) & 0xFFFFFFFF,
                   payloads[i], **f) for i, f in enumerate(shapes)]
    _scanned_as_decoded(frames, handle, first)


@pytest.mark.parametrize(("before", "after"), [
    ({"settled": True}, {"settled": False}), ({"settled": False}, {"settled": True}),
    ({"more": False}, {"more": True}), ({"resume": False}, {"resume": True}),
    ({"aborted": False}, {"aborted": True}), ({"delivery_tag": b"ab"}, {"delivery_tag": b"ac"}),
])
def test_a_transfer_of_the_same_length_as_the_previous_one_is_read_for_what_it_says(
        before: dict[str, Any], after: dict[str, Any]) -> None:
    """The comparison with the previous transfer is of bytes, not of lengths."""
    frames = [xfer(0, 0x10000 + i, b"x", **before) for i in range(3)]
    frames += [xfer(0, 0x10003, b"x", **after), xfer(0, 0x10004, b"x", **before)]
    assert len(frames[3]) == len(frames[2])
    _scanned_as_decoded(frames, 0, 0x10000)


_BASE = {"settled": False, "more": False}
_OTHER = st.sampled_from([
    {"settled": True, "more": False}, {"settled": False, "more": True},
    {"settled": False, "more": False, "delivery_tag": b"abcde"}, {"settled": False},
    {"settled": False, "more": False, "resume": False}, "gap", "handle", "longer", "same"])


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 80), at=st.integers(0, 85), other=_OTHER,
       first=st.sampled_from([0x100, 0x10000, 0xFFFFFFD0, 0xFFFFFFFE]),
       contents=st.binary(min_size=6, max_size=6))
def test_a_run_of_transfers_alike_is_read_as_the_decoder_reads_it(
        n: int, at: int, other: Any, first: int, contents: bytes) -> None:
    """Transfers alike but for their delivery-ids, tags and payloads (a sender at full speed;
    the scanner reads them with one struct), one of them (``at``) replaced by a different
    one: the scanner takes what the decoder reads as the run."""
    frames = []
    for i in range(n):
        delivery = (first + i + (other == "gap" and i >= at)) & 0xFFFFFFFF
        fields: dict[str, Any] = dict(_BASE, delivery_tag=(i * 7919).to_bytes(4, "big"))
        payload, handle = contents[i % 6:] + contents[:i % 6], 0
        if i == at and isinstance(other, dict):
            fields.update(other)
        elif i == at and other == "handle":
            handle = 1
        elif i == at and other == "longer":
            payload += b"!"
        frames.append(xfer(handle, delivery, payload, **fields))
    if other == "handle" and at < n:  # another link's: the run ends before it
        assert scan(b"".join(frames), next_id=first)[:2] == (sum(map(len, frames[:at])), at)
    else:
        _scanned_as_decoded(frames, 0, first)


@pytest.mark.parametrize("most", [1, 2, 3, 9, 10, 11, 40])
@pytest.mark.parametrize("most_bytes", [0, 99, 100, 101, 950, 1000, float("inf")])
def test_a_run_of_transfers_alike_stops_at_its_count_and_byte_limits(
        most: int, most_bytes: float) -> None:
    frames = [xfer(0, 0x10000 + i, b"y" * 100) for i in range(10)]
    data = b"".join(frames)
    taken = min(most, 10, int(most_bytes // 100) if most_bytes < 1e9 else 10)
    many = [xfer(0, 0x10000 + i, b"y" * 100) for i in range(100)]  # (read alike in parts)
    assert scan(b"".join(many), next_id=0x10000, most=most)[1] == min(most, 100)
    assert scan(data, next_id=0x10000, most=most, most_bytes=most_bytes)[:3] \
        == (len(frames[0]) * taken, taken, 100 * taken)
    for cut in range(len(data) - 3 * len(frames[0]), len(data) + 1):
        assert scan(data[:cut], next_id=0x10000, most=most)[1] == min(
            most, cut // len(frames[0]))


def _scanned_as_decoded(frames: list[bytes], handle: int, first: int) -> None:
    data = b"".join(frames)
    end, count, total, unsettled = scan(data, handle=handle, next_id=first)
    expected_ids, expected_total, taken = [], 0, 0
    for i, f in enumerate(frames):
        _, fields, start = decode_composite(f, 8, len(f))
        fields += [None] * (11 - len(fields))
        whole_delivery = not fields[TransferFields.MORE] and fields[TransferFields.STATE] is None \
            and not fields[8] and not fields[TransferFields.ABORTED]  # 8: resume
        if not whole_delivery:
            break
        assert fields[TransferFields.HANDLE] == handle
        if fields[TransferFields.DELIVERY_ID] != (first + i) & 0xFFFFFFFF:
            break
        taken += 1
        expected_total += len(f) - start
        if not fields[TransferFields.SETTLED]:
            expected_ids.append((first + i) & 0xFFFFFFFF)
    assert count == taken and end == sum(map(len, frames[:taken]))
    assert total == expected_total and unsettled == expected_ids


# -- the gate: with runs and a transfer at a time -------------------------------------------

def batch(s: Setup, sends: list[tuple[int, int, bool]]) -> bytes:
    """Transfers (handle, size, settled) as one client write, numbered on from ``s.next_id``;
    the anonymous link's to the capped queue (held while it is tripped: the proxy takes them,
    and the session's ids go on renumbered)."""
    out = []
    for handle, size, settled in sends:
        to = "/amq/queue/capped" if handle == ANON_H else None
        out.append(amqp(TRANSFER, 0, message(size, to), handle=UInt(handle),
                        delivery_id=UInt(s.next_id), delivery_tag=s.next_id.to_bytes(4, "big"),
                        message_format=UInt(0), settled=settled or None))
        s.next_id = (s.next_id + 1) & 0xFFFFFFFF
    return b"".join(out)


def multi_frame(s: Setup, handle: int, size: int) -> bytes:
    body = message(size)
    half = len(body) // 2
    first = amqp(TRANSFER, 0, body[:half], handle=UInt(handle), delivery_id=UInt(s.next_id),
                 delivery_tag=s.next_id.to_bytes(4, "big"), message_format=UInt(0), more=True)
    s.next_id += 1
    return first + continuation(0, handle, body[half:], False)


_SEGMENT = st.tuples(st.sampled_from([CAPPED_H, FREE_H, ANON_H]),
                    st.sampled_from([10, 900, 1500, 5000]),
                    st.booleans(), st.integers(1, 24))
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.lists(_SEGMENT, min_size=1, max_size=4)),
    st.tuples(st.just("multi"), st.sampled_from([CAPPED_H, FREE_H]), st.sampled_from([50, 3000])),
    st.tuples(st.just("settle"), st.integers(0, 3)),
    st.tuples(st.just("sample"), st.sampled_from([0, 40_000, 80_000, 99_000, 120_000])),
    st.tuples(st.just("grant"), st.integers(0, 3)),
), max_size=20)


def _left(s: Setup, handle: int) -> int:
    link = s.gate.sessions[0].links[handle]
    assert isinstance(link, SenderLink)
    return link.credit.client_credit


def _state(s: Setup) -> tuple[object, ...]:
    links = []
    for handle in (CAPPED_H, FREE_H, ANON_H):
        link = s.gate.sessions[0].links[handle]
        assert isinstance(link, SenderLink)
        links.append((link.credit.delivery_count, link.deliveries, link.payload_bytes,
                      link.unsettled, link.blocked, link.detaching))
    queues = [(key, q.depth.forwarded_bytes_total, q.depth.forwarded_messages_total, q.tripped,
               q.overshoot_messages, q.overshoot_bytes, q.in_flight)
              for key, q in sorted(s.fc.queues.items())]
    session = s.gate.sessions[0]
    return tuple(links), tuple(queues), tuple(sorted(session.in_flight)), session.ids.dropped


def _setup(chunker: Chunker, runs: bool) -> tuple[Setup, list[tuple[Any, ...]]]:
    """A gated connection with runs on (recording them) or off; the broker's first grants."""
    s = Setup(chunker=chunker)
    read_runs: list[tuple[Any, ...]] = []
    if runs:
        read_runs = record_calls(s.gate, "on_transfer_run")
    else:
        s.gate.transfer_run = lambda channel, handle: None  # type: ignore[method-assign]
    s.server(broker_flow(7, 0, 5000) + broker_flow(8, 0, 5000) + broker_flow(9, 0, 5000))
    return s, read_runs


def _step(s: Setup, step: tuple[Any, ...], data: bytes | None, settled: int) -> None:
    if step[0] in ("send", "multi"):
        if data:
            s.client(data)
    elif step[0] == "settle" and s.next_id > settled:
        s.server(disposition(SERVER_CH, True, settled, s.next_id - 1))
    elif step[0] == "sample":
        s.sample("capped", step[1])
    elif step[0] == "grant":
        s.server(broker_flow(7, None, 5000) + broker_flow(8, None, 5000)
                 + broker_flow(9, None, 5000))


def _lockstep(steps: list[tuple[Any, ...]], chunker: Chunker) -> int:
    """Both gates fed the same bytes (what the client may send is what both let it); after
    every step the broker got the same bytes and the books agree. Returns the runs read."""
    a, runs = _setup(chunker, runs=True)
    b, _ = _setup(chunker, runs=False)
    assert a.take()[0] == b.take()[0]
    settled = 0
    for step in steps:
        data: bytes | None = None
        if step[0] == "send":
            credit = {h: min(_left(a, h), _left(b, h)) for h in (CAPPED_H, FREE_H, ANON_H)}
            sends = []
            for handle, size, is_settled, n in step[1]:
                for i in range(n):
                    if credit[handle] > 0:  # what the client may send, as it last heard
                        credit[handle] -= 1
                        sends.append((handle, size, is_settled and i % 2 == 0))
            data = batch(a, sends) if sends else None
        elif step[0] == "multi" and min(_left(a, step[1]), _left(b, step[1])) > 0:
            data = multi_frame(a, step[1], step[2])
        b.next_id = a.next_id
        _step(a, step, data, settled)
        _step(b, step, data, settled)
        if step[0] == "settle":
            settled = a.next_id
        assert a.take()[0] == b.take()[0]  # the broker gets the same bytes
        assert _state(a) == _state(b)  # the same counts, ledgers, credit used, in flight
        _no_stall(a, b)
    if a.next_id > settled:  # the broker settles everything: every squeezed link topped up
        for s in (a, b):
            s.server(disposition(SERVER_CH, True, settled, a.next_id - 1))
        assert a.take()[0] == b.take()[0]
        _no_stall(a, b, settled=True)
    return len(runs)


def _no_stall(a: Setup, b: Setup, settled: bool = False) -> None:
    """Where the gate a transfer at a time leaves the client credit, the gate with runs does
    too, or its link waits for a release (blocked: the other gate's credit left is overshoot
    it granted before the trip) or for the broker to settle deliveries in flight (squeezed:
    the settlement tops it up, ``_broker_settled``; not once all are settled)."""
    for handle in (CAPPED_H, FREE_H):
        link = a.gate.sessions[0].links[handle]
        assert isinstance(link, SenderLink)
        waits = link.blocked or (link.squeezed and link.unsettled > 0 and not settled)
        assert _left(a, handle) > 0 or _left(b, handle) == 0 or waits, \
            "a run left the client without credit"


@settings(max_examples=200, deadline=None)
@given(steps=_STEPS, seed=st.integers(0, 3))
def test_runs_book_what_a_transfer_at_a_time_books(steps: list[tuple[Any, ...]],
                                                   seed: int) -> None:
    _lockstep(steps, whole if seed == 0 else random_chunks(seed, 700 if seed < 3 else 40_000))


def test_a_burst_of_one_link_is_read_as_a_run() -> None:
    """The run is taken at all (else the equivalence above says nothing): 30 transfers in
    one read go to the gate as one transfer and one run of 29; a burst of a link with a
    window, read after read, a run each time."""
    assert _lockstep([("send", [(FREE_H, 900, False, 30)])], whole) == 1
    assert _lockstep([("send", [(CAPPED_H, 900, False, 60)])] * 3, whole) >= 3


def test_a_run_after_deliveries_the_proxy_took_goes_on_in_the_broker_s_numbering() -> None:
    """Two anonymous deliveries to the tripped capped queue are held: the proxy took them,
    and the broker's delivery-ids run two behind the client's from then on. A burst of the
    free link after them is still read as a run, every id renumbered: the broker gets ids
    0 to 29 for the client's 2 to 31, as the gate a transfer at a time sends them."""
    s, runs = _setup(whole, runs=True)
    s.take()
    s.sample("capped", 120_000)
    s.client(batch(s, [(ANON_H, 900, False)] * 2))
    assert s.gate.sessions[0].ids.dropped == 2 and s.take()[0] == b""
    s.client(batch(s, [(FREE_H, 900, False)] * 30))
    to_server = s.take()[0]
    assert len(runs) == 1 and runs[0][2] == 29  # the first read alone, then a run of 29
    assert scan(to_server, handle=FREE_H, next_id=0)[:2] == (len(to_server), 30)
    steps = [("sample", 120_000), ("send", [(ANON_H, 900, False, 2)]),
             ("send", [(FREE_H, 900, False, 30)]), ("send", [(FREE_H, 10, True, 300)])]
    assert _lockstep(steps, whole) == 2
    assert _lockstep(steps, random_chunks(1, 700)) >= 2


@pytest.mark.parametrize("runs", [True, False])
def test_a_run_stops_where_a_delivery_trips_the_queue(runs: bool) -> None:
    """Room for four of ten 5,000-byte messages: the queue trips at the fifth whether the
    link is read in runs or not, and the rest are counted as overshoot."""
    s, _ = _setup(whole, runs)
    s.take()
    s.sample("capped", 80_000)
    s.client(batch(s, [(CAPPED_H, 5000, False)] * 10))
    q = s.fc.queues[("/", "capped")]
    assert q.tripped and q.depth.forwarded_messages_total == 10
    assert q.overshoot_messages == 6


def test_no_run_while_the_queue_is_near_its_capacity() -> None:
    """Near capacity every delivery may change a decision: the capped link is read a
    transfer at a time there (the quiet room is below one message)."""
    s = Setup()
    s.server(broker_flow(7, 0, 5000))
    s.take()
    s.sample("capped", 99_500)
    gate: CreditFlow = s.gate
    calls: list[object] = []
    gate.on_transfer_run = lambda *a: calls.append(a)  # type: ignore[method-assign]
    s.client(batch(s, [(CAPPED_H, 900, False)] * 3))
    assert calls == [] and s.fc.queues[("/", "capped")].tripped


def test_a_transfer_beyond_the_credit_ends_the_run_and_detaches_the_link() -> None:
    """One transfer more than the credit the client was given, in the same read: the run
    takes those within the credit, the one beyond is read the usual way and detaches the
    link with transfer-limit-exceeded. (The link keeps the broker's grant: no top-up while
    reading raises the limit, as a window's would, which then counts as granted.)"""
    handle = FREE_H
    s, runs = _setup(whole, runs=True)
    s.take()
    left = _left(s, handle)
    s.client(batch(s, [(handle, 900, False)] * (left + 1)))
    _, to_client = s.take()
    link = s.gate.sessions[0].links[handle]
    assert isinstance(link, SenderLink) and link.detaching and len(runs) == 1
    assert link.deliveries == left
    assert b"amqp:link:transfer-limit-exceeded" in to_client


def test_a_link_that_spools_is_never_read_as_a_run(tmp_path: Path) -> None:
    """Under ``overflow: spool`` a link to a tripped queue keeps its credit and each delivery
    goes to the spool (``_consume``): a burst in one read is all spooled, none forwarded."""
    s = spooling(tmp_path)
    s.gate.on_transfer_run = lambda *a: pytest.fail("a spooling link read as a run")  # type: ignore[method-assign]
    sent = batch(s, [(CAPPED_H, 300, False)] * 12)
    s.client(sent)
    to_server, _ = s.take()
    assert to_server == b"" and len(records(s)) == 12


@settings(max_examples=150, deadline=None)
@given(sends=st.lists(st.tuples(st.sampled_from([CAPPED_H, FREE_H]), st.booleans()),
                      min_size=1, max_size=40),
       ranges=st.lists(st.tuples(st.integers(0, 45), st.integers(0, 8)), max_size=8),
       start=st.sampled_from([0, 0xFFFFFFF0]))
def test_the_brokers_settlements_free_exactly_the_deliveries_they_name(
        sends: list[tuple[int, bool]], ranges: list[tuple[int, int]], start: int) -> None:
    """Model: the in-flight deliveries are the unsettled ones sent, less every id range the
    broker settled (wrapping around 2^32 too); each link's count and each queue's count
    follow them, and what a link tracks is forgotten once settled."""
    s = Setup(initial=start)
    s.next_id = start
    s.server(broker_flow(7, start, 5000) + broker_flow(8, start, 5000))
    s.take()
    s.client(batch(s, [(h, 900, settled) for h, settled in sends]))
    live = {(start + i) & 0xFFFFFFFF: h for i, (h, settled) in enumerate(sends) if not settled}
    session = s.gate.sessions[0]
    tracked_before = {h: session.links[h].delivery.tracked_id for h in (CAPPED_H, FREE_H)}
    live = {i: h for i, h in live.items() if i in session.in_flight}  # (windowed links only)
    for offset, length in ranges:
        first = (start + offset) & 0xFFFFFFFF
        last = (first + length) & 0xFFFFFFFF
        s.server(disposition(SERVER_CH, True, first, last))
        for k in range(length + 1):
            live.pop((first + k) & 0xFFFFFFFF, None)
        assert set(session.in_flight) == set(live)
        for h in (CAPPED_H, FREE_H):
            link = session.links[h]
            assert isinstance(link, SenderLink)
            assert link.unsettled == sum(1 for x in live.values() if x == h)
            tracked = link.delivery.tracked_id
            assert tracked is None or tracked in live
            assert tracked is None or tracked == tracked_before[h]
        q = s.fc.queues[("/", "capped")]
        assert q.in_flight == sum(1 for x in live.values() if x == CAPPED_H)


# -- the broker's deliveries to a receiver: with runs and a transfer at a time -----------------

_DELIVERY = st.one_of(
    st.tuples(st.just("one"), st.sampled_from([10, 900, 3000]), st.booleans(), st.integers(1, 30)),
    st.tuples(st.just("multi"), st.sampled_from([50, 3000]), st.booleans(), st.just(1)),
    st.tuples(st.just("flow"), st.just(0), st.just(False), st.just(0)),
    st.tuples(st.just("settle"), st.just(0), st.just(False), st.just(0)))


def _deliveries(steps: list[tuple[str, int, bool, int]], first: int) -> bytes:
    """The broker's frames to the client's receiver (``RECV_H``): whole deliveries, settled or
    not, multi-frame ones, and a flow or a settlement of the client's deliveries between them;
    delivery-ids on from ``first``."""
    handle, out, next_id = UInt(SERVER_HANDLE[RECV_H]), [], first
    for kind, size, settled, n in steps:
        if kind == "flow":
            out.append(broker_flow(7, None, 5000))
        elif kind == "settle":
            out.append(disposition(SERVER_CH, True, 0, 0))
        for _ in range(n):
            body = message(size)
            fields: dict[str, Any] = {"handle": handle, "delivery_id": UInt(next_id),
                                      "delivery_tag": next_id.to_bytes(4, "big"),
                                      "message_format": UInt(0), "settled": settled or None}
            if kind == "multi":
                half = len(body) // 2
                out.append(amqp(TRANSFER, SERVER_CH, body[:half], more=True, **fields)
                           + continuation(SERVER_CH, handle, body[half:], False))
            else:
                out.append(amqp(TRANSFER, SERVER_CH, body, **fields))
            next_id = (next_id + 1) & 0xFFFFFFFF
    return b"".join(out)


def _receiver_state(s: Setup) -> tuple[object, ...]:
    session = s.gate.sessions[0]
    link = session.links[RECV_H]
    assert isinstance(link, ReceiverLink)
    return (session.next_outgoing, link.in_delivery,
            s.fc.queues[(VHOST, "capped")].depth.delivered_messages_total)


@settings(max_examples=150, deadline=None)
@given(reads=st.lists(st.lists(_DELIVERY, min_size=1, max_size=5), min_size=1, max_size=6),
       first=st.sampled_from([0, 250, 0xFFFFFFF0]), seed=st.integers(0, 3))
def test_the_brokers_deliveries_as_runs_book_what_one_at_a_time_books(
        reads: list[list[tuple[str, int, bool, int]]], first: int, seed: int) -> None:
    """The broker's deliveries to a receiver read as runs and one at a time, in lockstep,
    whole reads, random cuts and one byte at a time: the client gets the same bytes, and the
    session's transfer count, the link's state and the queue's delivered count agree after
    every read."""
    chunker = (whole, bytewise, random_chunks(seed, 700), random_chunks(seed, 40))[seed]
    a, b = Setup(chunker=chunker), Setup(chunker=chunker)
    b.gate.server_transfer_run = lambda channel, handle: False  # type: ignore[method-assign]
    taken = record_calls(a.gate, "on_server_transfer_run")
    a.server(broker_flow(7, 0, 5000))
    b.server(broker_flow(7, 0, 5000))
    assert a.take() == b.take()
    for steps in reads:
        data = _deliveries(steps, first)
        first = (first + sum(n for _, _, _, n in steps)) & 0xFFFFFFFF
        a.server(data)
        b.server(data)
        assert a.take() == b.take()
        assert _receiver_state(a) == _receiver_state(b)
    if seed == 0 and any(k == "one" and n > 1 for r in reads for k, _, _, n in r):
        assert taken  # whole reads of bursts: runs were read


def test_a_burst_from_the_broker_is_read_as_a_run_and_counted() -> None:
    s = Setup()
    runs = record_calls(s.gate, "on_server_transfer_run")
    data = _deliveries([("one", 900, False, 40)], 5)
    s.server(data)
    assert s.take()[1] == data and [count for _, _, count in runs] == [39]
    assert _receiver_state(s) == (40, False, 40)


def test_a_burst_read_after_read_goes_on_with_its_run() -> None:
    """A read that begins with the next delivery of the link whose run ended the last read
    goes on with that run: only the first read's first transfer is read the usual way."""
    s, runs = _setup(whole, runs=True)
    one_at_a_time = record_calls(s.gate, "on_client_transfer")
    for _ in range(3):
        s.client(batch(s, [(FREE_H, 900, False)] * 20))
    assert len(one_at_a_time) == 1 and [r[2] for r in runs] == [19, 20, 20]
    data = _deliveries([("one", 900, False, 40)], 5)  # the broker's side: the same
    server_runs = record_calls(s.gate, "on_server_transfer_run")
    s.server(data[:len(data) // 2 - 3])
    s.server(data[len(data) // 2 - 3:])
    assert sum(r[2] for r in server_runs) == 39


def test_a_read_after_the_routing_model_changed_is_routed_again() -> None:
    """Routing or policies changed between two reads: the next read's first transfer is read
    the usual way (routed again), then the run goes on; another link's transfer between two
    reads of a link ends the run as well."""
    s, runs = _setup(whole, runs=True)
    one_at_a_time = record_calls(s.gate, "on_client_transfer")
    s.client(batch(s, [(FREE_H, 900, False)] * 10))
    s.fc.set_policies(s.fc.policies, list(s.fc.queues), s.clock.t)
    s.client(batch(s, [(FREE_H, 900, False)] * 10))
    assert len(one_at_a_time) == 2 and [r[2] for r in runs] == [9, 9]
    s.client(batch(s, [(CAPPED_H, 900, False)]))
    s.client(batch(s, [(FREE_H, 900, False)] * 10))
    assert len(one_at_a_time) == 4


def test_a_read_of_one_transfer_is_followed_by_its_run() -> None:
    """A read that ends with the transfer that would announce a run (nothing after it):
    the next read begins with that run."""
    s, runs = _setup(whole, runs=True)
    one_at_a_time = record_calls(s.gate, "on_client_transfer")
    s.client(batch(s, [(FREE_H, 900, False)]))
    s.client(batch(s, [(FREE_H, 900, False)] * 5))
    assert len(one_at_a_time) == 1 and [r[2] for r in runs] == [5]
