"""Link credit arithmetic (AMQP 1.0 section 2.6.7) with RFC-1982 serial numbers."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.wire.amqp10.credit import (
    HALF,
    MASK,
    DeliveryIds,
    LinkFlow,
    SenderCredit,
    serial_add,
    serial_diff,
    serial_lt,
    serial_max,
    serial_min,
)

NEAR_WRAP = MASK - 2  # three deliveries before the 2^32 wrap


def test_serial_numbers_compare_across_the_wrap() -> None:
    assert serial_add(MASK, 1) == 0
    assert serial_add(0, -1) == MASK
    assert serial_diff(2, MASK) == 3
    assert serial_diff(MASK, 2) == -3
    assert serial_lt(MASK, 0) and not serial_lt(0, MASK)
    assert serial_max(MASK, 5) == 5 and serial_min(MASK, 5) == MASK
    assert serial_diff(HALF - 1, 0) == HALF - 1
    assert serial_diff(0, HALF - 1) == -(HALF - 1)


def granted(start: int = 0, broker_credit: int = 1000, window: int | None = 10,
            broker_count: int | None = None) -> tuple[SenderCredit, LinkFlow]:
    c = SenderCredit(start)
    c.broker_flow(LinkFlow(start if broker_count is None else broker_count, broker_credit))
    return c, c.grant(window)


@pytest.mark.parametrize("start", [0, 12345, NEAR_WRAP, MASK])
def test_grant_is_the_broker_credit_capped_by_the_window(start: int) -> None:
    c, flow = granted(start)
    assert flow == LinkFlow(start, 10)
    assert c.client_credit == 10 and c.broker_credit == 1000
    _, flow = granted(start, broker_credit=4)
    assert flow.link_credit == 4
    _, flow = granted(start, window=None)
    assert flow.link_credit == 1000
    _, flow = granted(start, window=0)  # tripped
    assert flow.link_credit == 0


@pytest.mark.parametrize("start", [0, NEAR_WRAP])
def test_transfers_count_once_each_and_top_up_at_half_the_window(start: int) -> None:
    c, _ = granted(start)
    for i in range(4):
        assert c.transfer()
        assert not c.wants_top_up(10), i
    assert c.transfer()  # 5 left: half the window
    assert c.wants_top_up(10)
    assert c.grant(10) == LinkFlow(serial_add(start, 5), 10)
    assert c.delivery_count == serial_add(start, 5)
    assert c.broker_credit == 995


def test_no_top_up_beyond_what_the_broker_allows() -> None:
    c, _ = granted(broker_credit=6, window=10)
    for _ in range(3):
        c.transfer()
    assert c.client_credit == 3 and c.broker_credit == 3
    assert not c.wants_top_up(10)


@pytest.mark.parametrize("start", [0, NEAR_WRAP])
def test_transfers_in_flight_when_a_flow_crosses_them(start: int) -> None:
    """The broker's flow was sent before it saw 3 transfers the client had already sent: its
    delivery-count lags, its limit (count + credit) is what counts."""
    c, _ = granted(start, broker_credit=20)
    for _ in range(3):
        assert c.transfer()
    # the broker answers on what it had seen (start) with a fresh credit of 20
    c.broker_flow(LinkFlow(start, 20))
    assert c.broker_credit == 17  # limit start+20, the client is at start+3
    flow = c.grant(10)
    assert flow == LinkFlow(serial_add(start, 3), 10)
    # tripped: no more credit, but the limit the client has (start+13) is not taken back
    assert c.grant(0) == LinkFlow(serial_add(start, 3), 10)
    for _ in range(10):
        assert c.transfer()  # sent under the limit it was given: accepted
    assert c.client_credit == 0
    assert c.grant(0) == LinkFlow(serial_add(start, 13), 0)
    assert not c.transfer()  # beyond every limit ever granted


@pytest.mark.parametrize("start", [0, NEAR_WRAP])
def test_a_grant_never_lowers_the_limit_the_client_has(start: int) -> None:
    """A smaller window (pacing) or a trip never states a limit below the last one: a sender
    with transfers in flight would read negative credit (proton-c wraps it to ~2^32)."""
    c, flow = granted(start, window=10)
    assert flow == LinkFlow(start, 10)
    c.transfer()
    assert c.grant(2) == LinkFlow(serial_add(start, 1), 9)  # smaller window: the limit stands
    for _ in range(8):
        c.transfer()
    assert c.grant(2) == LinkFlow(serial_add(start, 9), 2)  # 1 left < 2: topped up to 2
    assert c.high_water == serial_add(start, 11)


def test_only_the_broker_lowers_a_limit() -> None:
    """The broker's own flow with a lower limit is passed on (as without the proxy)."""
    c, _ = granted(0, broker_credit=100, window=10)
    c.broker_flow(LinkFlow(0, 4))
    assert c.grant(10) == LinkFlow(0, 4)
    assert c.high_water == 10  # what the client may have sent before it saw it


@pytest.mark.parametrize("start", [0, NEAR_WRAP])
def test_a_transfer_beyond_every_grant_is_refused(start: int) -> None:
    c, _ = granted(start, window=2)
    assert c.transfer() and c.transfer()
    assert not c.transfer()


def test_a_transfer_before_any_grant_is_refused() -> None:
    c = SenderCredit(7)
    assert not c.transfer()


def test_first_broker_flow_without_delivery_count_starts_at_the_initial_count() -> None:
    c = SenderCredit(NEAR_WRAP)
    c.broker_flow(LinkFlow(None, 50))
    assert c.grant(None) == LinkFlow(NEAR_WRAP, 50)
    assert c.high_water == serial_add(NEAR_WRAP, 50)


@pytest.mark.parametrize("start", [0, NEAR_WRAP])
def test_drain_with_no_messages_consumes_the_whole_broker_grant(start: int) -> None:
    """The broker asks for a drain; the client has nothing to send and advances its count to
    what it was given (the window); the proxy drains the rest of the broker's grant."""
    c = SenderCredit(start)
    c.broker_flow(LinkFlow(start, 100, drain=True))
    flow = c.grant(10)
    assert flow == LinkFlow(start, 10, drain=True)
    to_broker = c.client_flow(LinkFlow(serial_add(start, 10), 0, drain=True))
    assert to_broker == LinkFlow(serial_add(start, 100), 0, drain=True)
    assert c.broker_credit == 0 and c.client_credit == 0
    # counts stay translated: the broker now counts 90 ahead of the client
    assert c.offset == 90
    c.broker_flow(LinkFlow(serial_add(start, 100), 5))
    assert c.grant(10) == LinkFlow(serial_add(start, 10), 5)
    assert c.transfer()
    assert c.client_flow(LinkFlow(serial_add(start, 11), 4)) == LinkFlow(
        serial_add(start, 101), 4)


def test_drain_after_sending_some_messages() -> None:
    c = SenderCredit(0)
    c.broker_flow(LinkFlow(0, 30, drain=True))
    c.grant(10)
    for _ in range(4):
        c.transfer()
    to_broker = c.client_flow(LinkFlow(10, 0, drain=True))  # drained the 6 left
    assert to_broker == LinkFlow(30, 0, drain=True)


def test_a_drain_flag_echoed_before_the_client_drained_changes_nothing() -> None:
    c = SenderCredit(0)
    c.broker_flow(LinkFlow(0, 30, drain=True))
    c.grant(10)
    assert c.client_flow(LinkFlow(0, 10, drain=True)) == LinkFlow(0, 30, drain=True)
    assert c.offset == 0


def test_echo_reports_the_senders_state_in_broker_numbering() -> None:
    c, _ = granted(0, broker_credit=50, window=10)
    c.transfer()
    out = c.client_flow(LinkFlow(1, 9, echo=True))
    assert out == LinkFlow(1, 49, echo=True)


def test_a_dropped_delivery_shifts_the_broker_numbering() -> None:
    c, _ = granted(0, broker_credit=50, window=10)
    assert c.transfer()
    c.dropped()  # settled by the proxy: the broker never saw it
    assert c.offset == MASK  # -1
    assert c.broker_credit == 50  # the broker's grant untouched, before any new flow
    assert c.client_flow(LinkFlow(1, 9)) == LinkFlow(0, 50)
    c.broker_flow(LinkFlow(0, 50))  # the broker still counts 0 deliveries
    assert c.broker_credit == 50  # the client at 1 may go to 51
    assert c.client_flow(LinkFlow(1, 9)) == LinkFlow(0, 50)


@pytest.mark.parametrize("start", [MASK - 100, MASK])
def test_a_long_run_across_the_wrap(start: int) -> None:
    c, _ = granted(start, broker_credit=1000, window=16)
    broker_count = start
    for i in range(300):
        assert c.transfer(), i
        if c.wants_top_up(16):
            c.grant(16)
        if i % 50 == 49:  # the broker catches up and grants again
            broker_count = c.delivery_count
            c.broker_flow(LinkFlow(broker_count, 1000))
    assert c.delivery_count == serial_add(start, 300)
    assert 0 < c.client_credit <= 16


# -- DeliveryIds: a session's delivery-ids when the proxy consumed some ---------------------

@settings(max_examples=300, deadline=None)
@given(start=st.sampled_from([0, 7, MASK - 40, MASK - 3, 1 << 31]),
       dropped=st.lists(st.booleans(), min_size=1, max_size=60),
       horizon=st.sampled_from([4, 1 << 20]))
def test_delivery_ids_map_both_ways_like_the_model(start: int, dropped: list[bool],
                                                   horizon: int) -> None:
    """Against a plain model (each client id, and the broker id it got or None), across the
    2^32 wrap: broker ranges map to exactly the client ids of those broker ids, client
    ranges to the broker ids of the forwarded ones among them."""
    ids = DeliveryIds(horizon=horizon)
    model: list[tuple[int, int | None]] = []
    broker = serial_add(start, 0)
    for i, drop in enumerate(dropped):
        client = serial_add(start, i)
        if drop:
            ids.drop(client)
            model.append((client, None))
        else:
            assert serial_add(client, -ids.dropped) == broker
            model.append((client, broker))
            broker = serial_add(broker, 1)
    forwarded = [(c, b) for c, b in model if b is not None]
    recent = forwarded if horizon > len(dropped) else forwarded[-1:]
    for i, (_, b_first) in enumerate(recent):
        for _, b_last in recent[i:]:
            want = [c for c, b in forwarded if b is not None
                    and serial_diff(b, b_first) >= 0 and serial_diff(b_last, b) >= 0]
            got = [serial_add(lo, k) for lo, hi in ids.client_ranges(b_first, b_last)
                   for k in range(serial_diff(hi, lo) + 1)]
            assert got == want
    if horizon <= len(dropped):
        return  # what the horizon forgot is not asked about below
    for i in range(len(model)):
        for j in range(i, len(model)):
            want_b = [b for _, b in model[i:j + 1] if b is not None]
            got_b = [serial_add(lo, k) for lo, hi in ids.broker_ranges(model[i][0], model[j][0])
                     for k in range(serial_diff(hi, lo) + 1)]
            assert got_b == want_b
            assert len(ids.broker_ranges(model[i][0], model[j][0])) <= 1  # consecutive


def test_delivery_ids_without_drops_are_the_identity() -> None:
    ids = DeliveryIds()
    assert ids.dropped == 0
    assert ids.client_ranges(3, 9) == [(3, 9)]
    assert ids.broker_ranges(3, 9) == [(3, 9)]


def _credit_states(seed: int) -> Iterator[tuple[random.Random, int, list[int | None]]]:
    """20,000 delivery-counts (edges of the serial space among them) and three limits near
    each (or None): the broker's, the granted and the high-water mark."""
    rng = random.Random(seed)
    edges = [0, 1, 2, HALF - 1, HALF, HALF + 1, MASK - 1, MASK]
    for _ in range(20_000):
        count = rng.choice([rng.randrange(MASK + 1), rng.choice(edges)])
        near = [None if rng.random() < 0.1 else serial_add(count, rng.choice(
            [rng.randint(-300, 300), HALF, HALF + 1, -HALF, rng.randrange(MASK + 1)]))
            for _ in range(3)]
        yield rng, count, near


def test_the_per_transfer_checks_agree_with_the_credit_figures() -> None:
    """``wants_top_up`` and ``transfer`` work the serial arithmetic out inline: they must
    say what ``client_credit``, ``broker_credit`` and ``serial_lt`` say, wrap included."""
    for rng, count, near in _credit_states(1982):
        credit = SenderCredit(count, broker_limit=near[0], granted=near[1], high_water=near[2])
        window = rng.choice([0, 1, 2, 16, 63, 64, 256])
        left = credit.client_credit
        assert credit.wants_top_up(window) is (left * 2 <= window
                                               and credit.broker_credit > left)
        high_water = credit.high_water
        assert credit.transfer() is (high_water is not None and serial_lt(count, high_water))
        assert credit.delivery_count == serial_add(count, 1)


def _grant_by_the_book(c: SenderCredit, window: int | None) -> LinkFlow:
    """``SenderCredit.grant`` in the serial functions (what the inline arithmetic replaces)."""
    count = c.delivery_count
    credit = c.broker_credit
    if window is not None:
        credit = min(credit, window)
    limit = serial_add(count, credit)
    kept = c.granted
    if kept is not None:
        if c.broker_limit is not None:
            kept = serial_min(kept, c.broker_limit)
        if serial_lt(limit, kept):
            limit = kept
            credit = serial_diff(limit, count)
    c.granted = limit
    c.high_water = limit if c.high_water is None else serial_max(c.high_water, limit)
    return LinkFlow(count, credit, c.drain)


def test_grant_works_the_serial_arithmetic_out_as_the_serial_functions_do() -> None:
    """``grant`` runs once per read of a fast sender, its arithmetic inline: the flow, the
    limit granted and the high-water mark are those of the serial functions, wrap included."""
    for rng, count, near in _credit_states(2026):
        window = rng.choice([None, 0, 1, 2, 16, 63, 64, 256])
        fast = SenderCredit(count, broker_limit=near[0], granted=near[1], high_water=near[2],
                            drain=rng.random() < 0.1)
        book = SenderCredit(count, broker_limit=near[0], granted=near[1], high_water=near[2],
                            drain=fast.drain)
        assert fast.grant(window) == _grant_by_the_book(book, window)
        assert fast == book
