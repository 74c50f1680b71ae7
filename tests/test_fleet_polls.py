"""The alarms and the topology polled by one member for the fleet, pure parts: the
announcement's fields, the pollers, the digests and their watch
(floodwall/control/fleet.py, floodwall/control/fleet_polls.py)."""

from __future__ import annotations

import pytest

from floodwall.control.fleet import (
    ALARMS_KEY,
    TOPOLOGY_QUEUE,
    Announcement,
    FleetMessageError,
    FleetTable,
    SharedAlarms,
    SharedTopology,
    decode,
    encode,
    poller_of,
)
from floodwall.control.fleet_polls import (
    DigestWatch,
    TopologyDigests,
    fresh,
    topology_digests,
)
from floodwall.control.routing import Topology


def test_alarms_and_topology_round_trip_and_are_small() -> None:
    a = Announcement("pod-1-abc", 1700000000.123, 9, "/", {},
                     alarms=SharedAlarms(("rabbit@a",), (), 0.25, 3),
                     topology=SharedTopology("0123456789abcdef", 12.5))
    data = encode(a)
    assert decode(data) == a
    bare = encode(Announcement("pod-1-abc", 1700000000.123, 9, "/", {}))
    assert len(data) - len(bare) <= 80
    assert decode(bare) == Announcement("pod-1-abc", 1700000000.123, 9, "/", {})


@pytest.mark.parametrize("extra", [
    '"al":[["a"],[],0.1]', '"al":[[1],[],0.1,1]', '"al":[[],[],-1,1]', '"al":"x"',
    '"tp":["d"]', '"tp":[1,2]', '"tp":["d",-1]',
])
def test_malformed_alarms_or_topology_raise_the_modules_error(extra: str) -> None:
    data = ('{"v":1,"id":"a","st":1,"seq":1,"vh":"/","q":[],' + extra + "}").encode()
    with pytest.raises(FleetMessageError):
        decode(data)


def _heard(table: FleetTable, member: str, vhost: str, now: float, seq: int = 1) -> None:
    table.heard(Announcement(member, 1.0, seq, vhost, {}), now)


def test_the_alarm_poller_is_one_for_the_fleet_across_vhosts() -> None:
    """Every member that hears the same members names the same alarm poller, whichever
    vhosts it hears them on; deaf, itself; a silent member does not poll."""
    tables = {m: FleetTable(m) for m in ("a", "b", "c")}
    for me, table in tables.items():
        table.expect(["/"])
        _heard(table, me, "/", 0.0)
        for other in tables.keys() - {me}:
            _heard(table, other, "/" if other != "c" else "v2", 0.0)
    pollers = {t.alarm_poller(0.1) for t in tables.values()}
    assert pollers == {poller_of(ALARMS_KEY, ["a", "b", "c"])}
    lone = FleetTable("z")
    assert lone.alarm_poller(0.0) == "z"  # deaf: itself


def test_the_topology_poller_is_per_vhost_among_those_heard_there() -> None:
    t = FleetTable("a")
    t.expect(["/", "v2"])
    for vhost in ("/", "v2"):
        _heard(t, "a", vhost, 0.0)
    _heard(t, "b", "/", 0.0)
    _heard(t, "c", "v2", 0.0)
    assert t.topology_poller("/", 0.1) == poller_of(("/", TOPOLOGY_QUEUE), ["a", "b"])
    assert t.topology_poller("v2", 0.1) == poller_of(("v2", TOPOLOGY_QUEUE), ["a", "c"])


def test_a_silent_pollers_alarms_and_topology_are_not_read() -> None:
    t = FleetTable("a", timeout=2.5)
    t.expect(["/"])
    t.heard(Announcement("b", 1.0, 1, "/", {}, alarms=SharedAlarms((), (), 0.0, 1),
                         topology=SharedTopology("d", 0.0)), 0.0)
    _heard(t, "a", "/", 0.0)
    assert t.shared_alarms("b", 1.0) is not None and t.shared_topology("/", "b", 1.0)
    for i, now in enumerate([1.0, 2.0, 3.0], start=2):
        _heard(t, "a", "/", now, seq=i)
    assert t.is_silent("b")
    assert t.shared_alarms("b", 3.0) is None and t.shared_topology("/", "b", 3.0) is None
    assert t.alarm_poller(3.0) == "a" and t.topology_poller("/", 3.0) == "a"


def test_digests_are_per_vhost_and_equal_for_equal_models() -> None:
    one, two = Topology(), Topology()
    for t in (one, two):
        t.declare_queue("/", "q1")
        t.declare_queue("v2", "q2")
        t.bind_queue("/", "q1", "amq.direct", "k")
    two.bind_queue("v2", "q2", "amq.topic", "#")  # the same "/", a different "v2"
    d1, d2 = topology_digests(one.items()), topology_digests(two.items())
    assert d1["/"] == d2["/"] and d1["v2"] != d2["v2"]
    assert len(d1["/"]) == 16
    cached = TopologyDigests(one)
    assert cached.of("/") == d1["/"] and cached.of("v2") == d1["v2"]
    assert cached.computed == 1  # once per change of the model
    one.declare_queue("/", "q3")
    assert cached.of("/") != d1["/"] and cached.computed == 2
    assert cached.of("nowhere") == ""


def test_the_watch_covers_equal_digests_and_a_difference_within_the_grace() -> None:
    w = DigestWatch(grace=2.0)
    assert w.compare("/", "x", "x", 0.0).covered
    assert w.compare("/", "x", "y", 1.0).covered  # in flight
    assert w.compare("/", "x", "y", 3.0).covered  # 2.0 s: still within
    v = w.compare("/", "x", "y", 3.1)
    assert not v.covered and v.sync_now and w.differences == 1
    v = w.compare("/", "x", "y", 10.0)
    assert not v.covered and not v.sync_now  # once per difference
    assert w.compare("/", "y", "y", 11.0).covered
    assert w.compare("/", "y", "z", 12.0).covered  # a new difference, a new grace
    assert w.compare("/", "y", "z", 14.5).sync_now
    v = w.compare("/", "y", None, 15.0)
    assert not v.covered and not v.sync_now  # no poller's word: its own syncs


def test_fresh_counts_the_age_and_the_time_since_it_arrived() -> None:
    assert fresh(10.0, 2.0, 15.0, 7.0)
    assert not fresh(10.0, 2.0, 15.1, 7.0)
    assert not fresh(10.0, None, 10.0, 7.0)
