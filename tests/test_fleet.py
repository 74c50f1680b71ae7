"""The fleet's pure parts: the announcement format, membership with expiry, and max-min fair
shares of a queue's headroom (floodwall/control/fleet.py)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.control.depth import ManagementSample, QueueDepth
from floodwall.control.fleet import (
    COLD_INTERVAL,
    FLEET_VERSION,
    MEMBER_TIMEOUT,
    Announcement,
    FleetMessageError,
    FleetTable,
    IngressMeter,
    MemberBack,
    MemberJoined,
    MemberLeft,
    MemberSilent,
    QueueReport,
    SharedSample,
    announce_due,
    decode,
    demand_of,
    encode,
    fallback_share,
    held_by_queue,
    is_fleet_queue,
    last_sample,
    max_min_shares,
    member_queue,
    poller_of,
    withheld_by_queue,
)

Q = ("/", "orders")


def _ann(member: str, seq: int, demand: float | None = 1000.0, started: float = 100.0,
         vhost: str = "/", leaving: bool = False, queue: str = "orders") -> Announcement:
    return Announcement(member, started, seq, vhost,
                        {queue: QueueReport(500.0, 2048, demand, 4096, 0.05)},
                        leaving=leaving)


# -- the wire format ----------------------------------------------------------------------
def test_an_announcement_round_trips_and_is_small() -> None:
    a = Announcement("pod-a-1234-ab12", 1_700_000_000.123, 42, "/", {
        "orders": QueueReport(123456.7, 2048, 125504.7, 1_048_576, 0.012),
        "billing": QueueReport(0.0, 0, None, None, None),
    })
    data = encode(a)
    assert decode(data) == a
    assert len(data) < 200  # two queues: ~60 bytes + ~45 per queue
    assert json.loads(data)["v"] == FLEET_VERSION


def test_a_leaving_announcement_says_so() -> None:
    a = _ann("b", 7, leaving=True)
    got = decode(encode(a))
    assert got is not None and got.leaving


def test_a_newer_version_is_ignored_not_an_error() -> None:
    assert decode(b'{"v": 99, "anything": "new"}') is None


@pytest.mark.parametrize("data", [
    b"", b"not json", b"[]", b'{"v": "1"}',
    b'{"v":1,"id":"","st":1,"seq":1,"vh":"/","q":[]}',
    b'{"v":1,"id":"a","st":1,"seq":-1,"vh":"/","q":[]}',
    b'{"v":1,"id":"a","st":1,"seq":1,"vh":"/","q":[["q",1,2,3,4]]}',
    b'{"v":1,"id":"a","st":1,"seq":1,"vh":"/","q":[["q",-1,2,3,4,0]]}',
    b'{"v":1,"id":"a","st":1,"seq":1,"vh":"/","q":[["q",null,2,3,4,0]]}',
    b'{"v":1,"id":"a","seq":1,"vh":"/","q":[]}',
    b'\xff\xfe',
])
def test_malformed_announcements_raise_the_modules_error(data: bytes) -> None:
    with pytest.raises(FleetMessageError):
        decode(data)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_the_modules_error(data: bytes) -> None:
    try:
        decode(data)
    except FleetMessageError:
        pass


def test_fleet_queues_are_named_apart() -> None:
    assert is_fleet_queue(member_queue("default", "pod-a"))
    assert not is_fleet_queue("orders")


# -- membership ---------------------------------------------------------------------------
def _table(timeout: float = MEMBER_TIMEOUT, vhosts: tuple[str, ...] = ("/",)) -> FleetTable:
    t = FleetTable("me", timeout=timeout)
    t.expect(vhosts)
    return t


def test_a_member_joins_at_its_first_announcement() -> None:
    t = _table()
    t.heard(_ann("me", 1), 0.0)
    t.heard(_ann("b", 1), 0.05)
    assert t.members(0.05) == ["b"]
    assert t.size(0.05) == 2
    assert t.take_changes() == [MemberJoined("b", "/", 2)]
    assert t.take_changes() == []


def test_a_silent_member_turns_silent_after_the_timeout_and_still_counts() -> None:
    t = _table(2.5)
    t.heard(_ann("me", 0), 0.0)
    t.heard(_ann("b", 1), 0.0)
    t.take_changes()
    for i in range(1, 26):  # this sidecar keeps hearing itself every 100 ms
        t.heard(_ann("me", i), i * 0.1)
    assert t.members(2.5) == ["b"] and t.silent_members(2.5) == {}
    t.heard(_ann("me", 26), 2.6)
    # Unheard for the timeout: silent, not gone: it counts, asking for an equal share (its
    # last demand is stale), so its part of the queue is not handed to the others.
    assert t.members(2.6) == ["b"] and t.size(2.6) == 2
    assert t.silent_members(2.6) == {"b": 0.0}
    assert t.take_changes() == [MemberSilent("b", 2.6, 2)]
    assert t.reports(Q, 2.6)["b"].demand is None
    assert t.shares(Q, 1000.0, QueueReport(0.0, 0, 5000.0), 2.6) == \
        pytest.approx({"b": 500.0, "me": 500.0})
    # It speaks again: back, without a leave and a join (no flap).
    t.heard(_ann("b", 2, demand=10.0), 3.0)
    assert t.take_changes() == [MemberBack("b", 3.0, 2)]
    assert t.silent_members(3.0) == {} and t.reports(Q, 3.0)["b"].demand == 10.0


def test_a_silent_member_leaves_when_its_queue_is_gone_or_after_the_limit() -> None:
    t = FleetTable("me", timeout=2.5, silent_limit=20.0)
    t.expect(["/"])
    t.heard(_ann("me", 0), 0.0)
    t.heard(_ann("b", 1), 0.0)
    t.heard(_ann("c", 1), 0.0)
    for i in range(1, 31):
        t.heard(_ann("me", i), i * 0.1)
    assert set(t.silent_members(3.0)) == {"b", "c"}
    t.gone("b", 3.0)  # the broker: its queue is gone (its connection died)
    assert t.members(3.0) == ["c"]
    for i in range(31, 201):
        t.heard(_ann("me", i), i * 0.1)
    assert t.members(20.0) == ["c"]
    assert t.members(20.2) == []  # silent past the limit
    left = [c for c in t.take_changes() if isinstance(c, MemberLeft)]
    assert [(c.member, c.reason) for c in left] == [("b", "queue deleted"), ("c", "timeout")]


def test_a_deaf_sidecar_keeps_the_fleet_it_last_heard() -> None:
    t = _table(2.5)
    t.heard(_ann("b", 1), 0.0)
    t.heard(_ann("c", 1), 0.0)
    t.heard(_ann("me", 1), 0.1)
    assert not t.deaf(0.1) and t.size(0.1) == 3
    # Nothing heard at all since (its own echo included): deaf, and the fleet stays 3.
    assert t.deaf(10.0)
    assert t.members(10.0) == ["b", "c"]
    assert t.size(10.0) == 3
    # Hearing itself again: what it missed while deaf says nothing about the others (a
    # starved event loop reads its own echo first): their silence counts from now.
    t.heard(_ann("me", 2), 10.1)
    assert t.members(10.1) == ["b", "c"] and t.silent_members(12.5) == {}
    t.heard(_ann("b", 2), 10.2)  # b was in the same backlog
    for i, at in enumerate([11.0, 12.0, 12.7]):
        t.heard(_ann("me", 3 + i), at)
    assert t.silent_members(12.7) == {"c": 0.0}  # c is still unheard 2.6 s on
    assert [type(c).__name__ for c in t.take_changes()] == \
        ["MemberJoined", "MemberJoined", "MemberSilent"]  # nobody left


def test_never_having_heard_itself_is_deaf() -> None:
    t = FleetTable("me")
    assert t.deaf(0.0)  # announcing nowhere
    t.expect(["/"])
    assert t.deaf(0.0)
    t.heard(_ann("b", 1), 0.0)
    assert t.members(100.0) == ["b"]


def test_leaving_and_queue_deleted_remove_at_once() -> None:
    t = _table()
    t.heard(_ann("me", 1), 0.0)
    t.heard(_ann("b", 1), 0.0)
    t.heard(_ann("c", 1), 0.0)
    t.heard(_ann("b", 2, leaving=True), 0.2)
    t.gone("c", 0.3)
    assert t.members(0.3) == []
    reasons = [c.reason for c in t.take_changes() if isinstance(c, MemberLeft)]
    assert reasons == ["leaving", "queue deleted"]


def test_stale_and_duplicate_announcements_are_ignored() -> None:
    t = FleetTable("me")
    t.heard(_ann("b", 5, demand=10.0), 0.0)
    t.heard(_ann("b", 5, demand=99.0), 0.1)
    t.heard(_ann("b", 4, demand=99.0), 0.2)
    assert t.reports(Q, 0.2)["b"].demand == 10.0
    assert t.ignored_total == 2


def test_a_restart_under_the_same_id_is_a_new_member() -> None:
    t = FleetTable("me")
    t.heard(_ann("b", 900, started=100.0), 0.0)
    t.heard(_ann("b", 1, started=200.0, demand=5.0), 0.1)
    assert t.reports(Q, 0.1)["b"].demand == 5.0
    kinds = [type(c).__name__ for c in t.take_changes()]
    assert kinds == ["MemberJoined", "MemberLeft", "MemberJoined"]
    t.heard(_ann("b", 901, started=100.0), 0.2)  # the old incarnation, late
    assert t.reports(Q, 0.2)["b"].demand == 5.0


def test_reports_are_per_vhost_channel() -> None:
    t = _table(2.5, ("/", "v2"))
    t.heard(_ann("b", 1, vhost="/"), 0.0)
    for i in range(4):  # this sidecar hears itself on both, every second
        t.heard(_ann("me", i + 1), float(i))
        t.heard(_ann("me", i + 1, vhost="v2"), float(i))
    t.heard(_ann("b", 1, vhost="v2"), 2.0)
    assert t.members(3.0) == ["b"]  # heard on v2 lately
    # its / reports are stale: it still counts there, asking for an equal share
    assert t.reports(("/", "orders"), 3.0)["b"].demand is None
    assert t.reports(("v2", "orders"), 3.0)["b"].demand == 1000.0


# -- shares -------------------------------------------------------------------------------
def test_max_min_gives_the_modest_all_it_needs_and_splits_the_rest() -> None:
    got = max_min_shares(1000.0, {"a": 100.0, "b": 5000.0, "c": 5000.0})
    assert got == pytest.approx({"a": 100.0, "b": 450.0, "c": 450.0})


def test_a_newcomer_gets_an_equal_share() -> None:
    got = max_min_shares(900.0, {"a": 5000.0, "b": 5000.0, "new": None})
    assert got["new"] == pytest.approx(300.0)
    assert sum(got.values()) == pytest.approx(900.0)


def test_what_nobody_needs_is_split_evenly() -> None:
    got = max_min_shares(1000.0, {"a": 100.0, "b": 300.0})
    assert got == pytest.approx({"a": 400.0, "b": 600.0})


def test_no_headroom_no_shares() -> None:
    assert max_min_shares(-5.0, {"a": 1.0, "b": None}) == {"a": 0.0, "b": 0.0}
    assert max_min_shares(10.0, {}) == {}


demands = st.dictionaries(st.sampled_from("abcdefgh"),
                          st.none() | st.floats(0, 1e7, allow_nan=False), min_size=1)
headrooms = st.floats(-1e6, 1e7, allow_nan=False)


@given(headrooms, demands)
def test_shares_never_sum_to_more_than_the_headroom(headroom: float,
                                                    d: dict[str, float | None]) -> None:
    got = max_min_shares(headroom, d)
    assert set(got) == set(d)
    assert all(s >= 0 for s in got.values())
    assert sum(got.values()) <= max(headroom, 0.0) * (1 + 1e-9) + 1e-6


@given(st.floats(1.0, 1e7), demands)
def test_each_gets_at_least_its_demand_or_an_equal_share(headroom: float,
                                                         d: dict[str, float | None]) -> None:
    got = max_min_shares(headroom, d)
    equal = headroom / len(d)
    for m, dm in d.items():
        want = equal if dm is None else min(dm, equal)
        assert got[m] >= want * (1 - 1e-9) - 1e-6
    # max-min: nobody gets more than its demand while another's demand is unmet
    unmet = [m for m, dm in d.items() if dm is not None and got[m] < dm * (1 - 1e-9) - 1e-6]
    if unmet:
        top = max(got[m] for m in unmet)
        for m, dm in d.items():
            if dm is not None:
                assert got[m] <= max(dm, top) * (1 + 1e-9) + 1e-6


@given(st.floats(1.0, 1e7), demands, st.sampled_from("abcdefgh"), st.floats(0, 1e7))
def test_a_share_is_monotone_in_its_demand(headroom: float, d: dict[str, float | None],
                                           who: str, more: float) -> None:
    base = d.get(who)
    if base is None:
        base = 0.0
    before = max_min_shares(headroom, {**d, who: base})[who]
    after = max_min_shares(headroom, {**d, who: base + more})[who]
    assert after >= before * (1 - 1e-9) - 1e-6


@given(st.floats(1.0, 1e7), demands)
def test_more_demand_never_gets_less(headroom: float, d: dict[str, float | None]) -> None:
    got = max_min_shares(headroom, d)
    known = sorted((dm, got[m]) for m, dm in d.items() if dm is not None)
    for (_, s1), (_, s2) in itertools.pairwise(known):
        assert s1 <= s2 * (1 + 1e-9) + 1e-6


def test_a_deaf_sidecar_takes_the_fallback_share() -> None:
    t = _table(2.5)
    t.heard(_ann("b", 1, demand=10.0), 0.0)
    t.heard(_ann("c", 1, demand=10.0), 0.0)
    t.heard(_ann("me", 1), 0.0)
    mine = QueueReport(0.0, 0, 1e9, None, None)
    heard = t.shares(Q, 900.0, mine, 0.1)["me"]
    # b and c need 10 each, but each is kept half an equal share (MIN_WANT x 300)
    assert heard == pytest.approx(600.0)
    deaf = t.shares(Q, 900.0, mine, 5.0)["me"]
    assert deaf == pytest.approx(fallback_share(900.0, 3)) == pytest.approx(300.0)


# -- demand, ingress, held, samples -------------------------------------------------------
def test_demand_is_ingress_plus_held_over_the_horizon() -> None:
    assert demand_of(1000.0, 2048, horizon=2.0) == 2024.0


def test_ingress_meter_measures_bytes_per_second() -> None:
    m = IngressMeter()
    m.update({Q: 0}, 0.0)
    assert Q not in m.rates
    m.update({Q: 1000}, 0.1)
    assert m.rates[Q] == pytest.approx(10_000.0)
    m.update({}, 0.2)
    assert m.rates == {}


def test_held_bytes_are_shared_by_blocked_channels() -> None:
    other = ("/", "billing")
    got = held_by_queue([frozenset({Q}), frozenset({Q, other}), frozenset({other})], 3000)
    assert got == {Q: 2000, other: 2000}
    assert held_by_queue([], 100) == {}


def test_last_sample_is_the_ready_count_in_bytes_with_its_age() -> None:
    d = QueueDepth()
    assert last_sample(d, 1.0) is None
    d.sampled_management(ManagementSample(0.0, 10, 2, 1200, 1000, 200))
    d.sampled_ready_count(1.0, 20, 0.001)
    assert last_sample(d, 1.5) == (20 * 100, 0.5)  # ready only: not the 2 unacked


def test_default_timeout_is_within_the_issue_bound() -> None:
    assert MEMBER_TIMEOUT + 0.1 < 3.0  # one announcement interval late, still < 3 s


def test_deaf_on_one_vhost_is_deaf() -> None:
    t = _table(2.5, ("/", "v2"))
    t.heard(_ann("b", 1), 0.0)
    t.heard(_ann("me", 1), 0.0)
    assert t.deaf(0.0)  # nothing heard on v2 yet
    t.heard(_ann("me", 1, vhost="v2"), 0.1)
    assert not t.deaf(0.1)
    t.heard(_ann("me", 2), 3.0)  # v2 silent since 0.1
    assert t.deaf(3.0) and t.members(3.0) == ["b"] and t.size(3.0) == 2
    t.expect(["/"])  # no longer announcing on v2
    assert not t.deaf(3.0)
    assert t.members(3.0) == ["b"] and t.silent_members(3.0) == {"b": 0.0}


# -- one management poller per queue ------------------------------------------------------
def test_a_management_sample_round_trips_on_the_clock_of_the_receiver() -> None:
    sample = ManagementSample(10.0, 5, 2, 7000, 5000, 2000)
    shared = SharedSample.of(sample, 10.25, sid=3)
    a = Announcement("p", 1.0, 1, "/", {"orders": QueueReport(0.0, 0, 0.0, None, None,
                                                              shared)})
    got = decode(encode(a))
    assert got is not None and got.queues["orders"].management == shared
    assert shared.sample(100.0) == ManagementSample(99.75, 5, 2, 7000, 5000, 2000)


def test_every_member_picks_the_same_poller_and_a_leaver_moves_only_its_own() -> None:
    members = [f"pod-{i}" for i in range(8)]
    keys = [("/", f"q{i}") for i in range(200)]
    picks = {k: poller_of(k, members) for k in keys}
    assert picks == {k: poller_of(k, list(reversed(members))) for k in keys}
    assert len(set(picks.values())) == 8  # spread over the members
    without = {k: poller_of(k, members[1:]) for k in keys}
    moved = [k for k in keys if picks[k] != without[k]]
    assert moved and all(picks[k] == "pod-0" for k in moved)


def test_the_poller_is_among_those_that_police_the_queue_and_deaf_is_oneself() -> None:
    t = _table()
    t.heard(_ann("me", 1), 0.0)
    t.heard(_ann("b", 1), 0.0)
    t.heard(_ann("c", 1, queue="other"), 0.0)
    assert t.poller(Q, 0.1) == poller_of(Q, ["me", "b"])
    assert t.poller(Q, 10.0) == "me"  # deaf: poll it oneself


def test_a_members_shared_sample_is_read_with_its_arrival() -> None:
    t = _table()
    shared = SharedSample(1, 0, 100, 100, 0, True, 0.5, 7)
    t.heard(Announcement("b", 1.0, 1, "/", {"orders": QueueReport(0, 0, 0.0, None, None,
                                                                  shared)}), 2.0)
    assert t.shared_sample(Q, "b", 2.1) == (shared, 2.0)
    assert t.shared_sample(Q, "c", 2.1) is None
    assert t.shared_sample(("/", "other"), "b", 2.1) is None


def test_announcements_are_frequent_only_while_hot() -> None:
    assert announce_due(None, 0.0, hot=False)
    assert not announce_due(0.0, 0.5, hot=False) and announce_due(0.0, 1.0, hot=False)
    assert announce_due(0.0, 0.1, hot=True) and not announce_due(0.0, 0.05, hot=True)
    assert announce_due(0.0, 0.09, hot=True)  # a tick's jitter
    assert MEMBER_TIMEOUT > 2 * COLD_INTERVAL  # one lost cold announcement is no departure


def test_withheld_links_windows_are_shared_over_the_queues_each_waits_on() -> None:
    other = ("/", "other")
    got = withheld_by_queue([(frozenset({Q}), 4000), (frozenset({Q, other}), 2000),
                             (frozenset({other}), 0)])
    assert got == {Q: 5000, other: 1000}
    assert withheld_by_queue([]) == {}
