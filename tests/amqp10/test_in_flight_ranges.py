"""A session's deliveries in flight kept as ranges of the broker's delivery-ids
(``InFlightRanges``): the same answers as a map of each id to its entry, whatever the order of
the settlements, across the wrap of the delivery-ids at 2^32."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.enforce.amqp10.links import InFlightRanges

MASK = 0xFFFFFFFF

# Operations on a session whose broker ids start at ``start``: forward a run of ``n``
# deliveries with entry ``e`` (some of them sent settled: not counted), or settle
# ``offset .. offset + span`` from the first id, or forget the link of entry ``e``.
_OPS = st.lists(st.one_of(
    st.tuples(st.just("forward"), st.integers(1, 40), st.integers(0, 2), st.integers(0, 5)),
    st.tuples(st.just("settle"), st.integers(-5, 400), st.integers(0, 60)),
    st.tuples(st.just("forget"), st.integers(0, 2)),
), max_size=60)


def _entries() -> list[Any]:
    # An entry is (link, queues); the link only needs identity here.
    return [(object(), ()) for _ in range(3)]


@settings(max_examples=300, deadline=None)
@given(start=st.sampled_from([0, 7, MASK - 100, MASK - 3]), ops=_OPS)
def test_ranges_answer_as_a_map_of_each_delivery_id(start: int, ops: list[tuple[Any, ...]]) -> None:
    entries = _entries()
    ranges = InFlightRanges()
    model: dict[int, Any] = {}
    next_id = start
    for op in ops:
        if op[0] == "forward":
            _, n, e, settled_every = op
            for i in range(n):
                broker_id = (next_id + i) & MASK
                if settled_every and i % (settled_every + 1) == settled_every:
                    continue  # sent settled: not in flight
                ranges.add(broker_id, broker_id, entries[e])
                model[broker_id] = entries[e]
            next_id = (next_id + n) & MASK
        elif op[0] == "settle":
            _, offset, span = op
            first = (start + offset) & MASK
            last = (first + span) & MASK
            ids = [(first + i) & MASK for i in range(span + 1)]
            expected = Counter(id(model.pop(i)) for i in ids if i in model)
            got: Counter[int] = Counter()
            for entry, n in ranges.cut(first, last):
                assert n > 0
                got[id(entry)] += n
            assert got == expected
        else:
            entry = entries[op[1]]
            expected_n = sum(1 for v in model.values() if v is entry)
            model = {k: v for k, v in model.items() if v is not entry}
            assert sum(n for _, n in ranges.take_link(entry[0])) == expected_n
        assert list(ranges) == list(model)  # (in the order forwarded)
        assert len(ranges) == len(model) and bool(ranges) == bool(model)
        for i in list(model)[:5]:
            assert ranges.get(i) is model[i] and i in ranges
    assert sum(n for _, n in ranges.take_all()) == len(model) and not ranges


def test_a_run_of_one_link_is_one_range_and_a_settlement_cuts_it() -> None:
    entry: Any = (object(), ())
    ranges = InFlightRanges()
    for i in range(MASK - 9, MASK + 1):
        ranges.add(i, i, entry)
    ranges.add(0, 9, entry)  # (across the wrap)
    assert ranges.ranges == [[MASK - 9, 9, entry]]
    assert ranges.cut(MASK - 4, 2) == [(entry, 8)]  # the middle: two ranges are left
    assert ranges.ranges == [[MASK - 9, MASK - 5, entry], [3, 9, entry]]
    assert ranges.cut(MASK - 20, 20) == [(entry, 5), (entry, 7)]
    assert not ranges


def test_a_range_booked_out_of_order_is_kept_in_order() -> None:
    a: Any = (object(), ())
    b: Any = (object(), ())
    ranges = InFlightRanges()
    ranges.add(10, 12, a)
    ranges.add(5, 6, b)  # (not after the newest)
    assert list(ranges) == [5, 6, 10, 11, 12]
    assert ranges.cut(6, 10) == [(b, 1), (a, 1)]
    assert list(ranges) == [5, 11, 12] and ranges.get(5) is b and ranges.get(12) is a
