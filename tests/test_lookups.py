"""Lookups: the table (floodwall/control/lookups.py) and the gate's use of it (FlowController)."""

from __future__ import annotations

import pytest

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.lookups import (
    SWEEP_AT,
    Lookup,
    LookupKind,
    LookupResult,
    LookupTable,
    is_pseudo,
)
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from tests.fakes import Owner

Q = LookupKind.QUEUE
X = LookupKind.EXCHANGE


# --- the table ----------------------------------------------------------------------------------
def test_a_wanted_lookup_is_asked_once_and_waited_for() -> None:
    table = LookupTable()
    lk = Lookup("/", Q, "orders.a")
    assert not table.due
    assert table.want(lk, 10.0) is True
    assert table.want(lk, 10.1) is True  # still pending: no second question
    assert table.due  # the I/O layer, which looks after each call, is to ask
    assert table.take_due() == [lk]
    assert table.take_due() == []
    assert table.pending(lk) and table.pending_key(lk.key)
    assert table.lookup_of(lk.key) == lk
    assert table.asked == 1


def test_absent_answers_are_remembered_for_the_ttl_then_asked_again() -> None:
    table = LookupTable(ttl=1.0)
    lk = Lookup("/", Q, "orders.a")
    table.want(lk, 10.0)
    assert table.answered(lk, True, 10.25) == pytest.approx(0.25)
    assert not table.pending_key(lk.key)
    assert table.want(lk, 10.5) is False  # remembered: the publish goes
    assert table.want(lk, 11.2) is False
    assert table.want(lk, 11.3) is True  # expired: asked again
    assert table.take_due() == [lk]


def test_found_answers_are_not_remembered_and_forget_drops_remembered_ones() -> None:
    table = LookupTable()
    lk = Lookup("/", X, "orders")
    table.want(lk, 0.0)
    table.answered(lk, False, 0.1)
    assert table.want(lk, 0.2) is True  # the model knows it now; a lookup again is a miss
    table.answered(lk, True, 0.3)
    table.forget(lk)
    assert table.want(lk, 0.4) is True
    assert table.answered(Lookup("/", Q, "never"), True, 1.0) is None


def test_retry_puts_a_pending_lookup_back_and_sweeping_keeps_pending_ones() -> None:
    table = LookupTable()
    lk = Lookup("/", Q, "a")
    table.want(lk, 0.0)
    table.take_due()
    assert not table.due
    table.retry(lk)
    assert table.due and table.take_due() == [lk]
    table.retry(Lookup("/", Q, "not pending"))
    assert table.take_due() == []
    for i in range(SWEEP_AT):
        other = Lookup("/", Q, f"q{i}")
        table.want(other, 0.0)
        table.answered(other, True, 0.0)
    table.want(Lookup("/", Q, "late"), 5.0)  # sweeps the expired answers
    assert len(table._entries) == 2
    assert table.pending(lk)


def test_lookup_keys_are_pseudo_queues_in_the_empty_vhost() -> None:
    key = Lookup("v", X, "x").key
    assert is_pseudo(key) and not is_pseudo(("v", "x"))
    assert key != Lookup("v", Q, "x").key != Lookup("w", X, "x").key


# --- the gate -----------------------------------------------------------------------------------
POLICIES = """
version: 1
policies:
  - {name: orders, match: {queue: "orders.*"}, capacity: 1000, resume: 500}
  - {name: strict, match: {queue: "strict.*"}, capacity: 1000, on_unknown_depth: block}
  - {name: other, match: {vhost: other, queue: "*"}, capacity: 1000}
"""


def gate(policies: str = POLICIES) -> tuple[FlowController, Topology, list[float]]:
    now = [100.0]
    topology = Topology()
    topology.declare_queue("/", "free")
    fc = FlowController(topology, parse_policies(policies))
    return fc, topology, now


def test_lookup_is_asked_for_names_a_policy_could_match_and_the_model_lacks() -> None:
    fc, topology, now = gate()
    route = topology.route
    # The default exchange to a queue the model does not have, matching a policy: ask.
    key = fc.lookup_for("/", "", "orders.a", route("/", "", "orders.a"), now[0])
    assert key == Lookup("/", Q, "orders.a").key
    assert fc.lookups.take_due() == [Lookup("/", Q, "orders.a")]
    # ... but not for a name no policy matches, a known queue, or the reply-to pseudo-queue.
    assert fc.lookup_for("/", "", "audit", route("/", "", "audit"), now[0]) is None
    assert fc.lookup_for("/", "", "free", route("/", "", "free"), now[0]) is None
    assert fc.lookup_for("/", "", "amq.rabbitmq.reply-to.x", frozenset(), now[0]) is None
    # An exchange the model has never seen: ask; a known one (even routing nowhere): don't.
    key = fc.lookup_for("/", "made.elsewhere", "k", frozenset(), now[0])
    assert key == Lookup("/", X, "made.elsewhere").key
    assert fc.lookup_for("/", "amq.topic", "k", route("/", "amq.topic", "k"), now[0]) is None
    # A vhost no policy names: nothing to police, nothing to ask.
    assert fc.lookup_for("elsewhere", "", "orders.a", frozenset(), now[0]) is None
    assert fc.lookup_for("elsewhere", "nowhere", "k", frozenset(), now[0]) is None
    assert fc.polices_vhost("other") and not fc.polices_vhost("elsewhere")


def test_publishes_wait_on_a_lookup_until_it_is_answered() -> None:
    fc, topology, now = gate()
    owner = Owner()
    owner.watch(fc)
    key = fc.lookup_for("/", "", "orders.a", frozenset(), now[0])
    assert key is not None
    assert fc.block(owner.conn_id, 1, frozenset({key}), now[0]) is True
    assert fc.is_blocked(owner.conn_id, 1)
    # The I/O layer found it: the model learns it, it is policed with its first figure.
    topology.declare_queue("/", "orders.a")
    fc.queue_seen(("/", "orders.a"), now[0])
    fc.sampled_ready_count(("/", "orders.a"), 100.0, 3, None, now[0])
    assert fc.lookup_answered(Lookup("/", Q, "orders.a"), LookupResult.FOUND, now[0]) is False
    assert owner.released == [1] and not fc.is_blocked(owner.conn_id, 1)
    # Found is not remembered: the model knows the name now.
    assert fc.lookup_for("/", "", "orders.a", topology.route("/", "", "orders.a"), now[0]) is None


def test_a_policed_queue_waits_for_its_first_figure() -> None:
    fc, _, now = gate()
    owner = Owner()
    owner.watch(fc)
    key = ("/", "orders.b")
    fc.queue_seen(key, now[0])
    assert fc.awaiting_first_figure(key)
    (pending,) = fc.blocking("/", frozenset({"orders.b", "free"}))
    assert pending == Lookup("/", Q, "orders.b").key
    assert fc.lookups.take_due() == [Lookup("/", Q, "orders.b")]
    assert fc.block(owner.conn_id, 7, frozenset({pending}), now[0])
    fc.sampled_management(key, ManagementSample(99.0, 0, 0, 0, 0, 0), now[0])
    assert not fc.awaiting_first_figure(key) and owner.released == [7]
    assert fc.blocking("/", frozenset({"orders.b"})) == frozenset()
    # The lookup answering later changes nothing.
    assert fc.lookup_answered(Lookup("/", Q, "orders.b"), LookupResult.FOUND, now[0]) is False


def test_a_figure_over_capacity_trips_before_the_waiting_publishes_go() -> None:
    fc, _, now = gate()
    owner = Owner()
    owner.watch(fc)
    key = ("/", "orders.c")
    fc.queue_seen(key, now[0])
    (pending,) = fc.blocking("/", frozenset({"orders.c"}))
    fc.block(owner.conn_id, 1, frozenset({pending}), now[0])
    # 50 messages of unknown size, then bytes ...
    fc.sampled_ready_count(key, 100.0, 50, None, now[0])
    fc.sampled_management(key, ManagementSample(100.5, 50, 0, 5000, 5000, 0), now[0])
    assert key in fc.tripped
    assert owner.released == [1]  # released from the lookup: it re-checks and finds the trip
    assert fc.blocking("/", frozenset({"orders.c"})) == frozenset({key})


@pytest.mark.parametrize(("name", "stays"), [("orders.d", False), ("strict.d", True)])
def test_a_failed_lookup_lets_go_or_keeps_waiting_as_on_unknown_depth_says(
        name: str, stays: bool) -> None:
    fc, _, now = gate()
    owner = Owner()
    owner.watch(fc)
    key = fc.lookup_for("/", "", name, frozenset(), now[0])
    assert key is not None
    fc.block(owner.conn_id, 1, frozenset({key}), now[0])
    lk = Lookup("/", Q, name)
    assert fc.lookup_answered(lk, LookupResult.FAILED, now[0]) is stays
    assert fc.is_blocked(owner.conn_id, 1) is stays
    if not stays:  # remembered as "failed, let go" (longer than an absent answer)
        now[0] += 2
        assert fc.lookup_for("/", "", name, frozenset(), now[0]) is None
        now[0] += 10
        assert fc.lookup_for("/", "", name, frozenset(), now[0]) == key


def test_a_failed_exchange_lookup_blocks_when_any_policy_of_the_vhost_says_block() -> None:
    fc, _, now = gate()
    assert fc.lookup_answered(Lookup("/", X, "x"), LookupResult.FAILED, now[0]) is True
    fc2, _, now = gate(POLICIES.replace(", on_unknown_depth: block", ""))
    fc2.lookup_for("/", "x", "k", frozenset(), now[0])
    assert fc2.lookup_answered(Lookup("/", X, "x"), LookupResult.FAILED, now[0]) is False


def test_absent_is_remembered_and_unpolicing_a_waiting_queue_releases_it() -> None:
    fc, _, now = gate()
    owner = Owner()
    owner.watch(fc)
    key = fc.lookup_for("/", "", "orders.e", frozenset(), now[0])
    assert key is not None
    fc.lookup_answered(Lookup("/", Q, "orders.e"), LookupResult.ABSENT, now[0])
    assert fc.lookup_for("/", "", "orders.e", frozenset(), now[0]) is None
    fc.queue_seen(("/", "orders.f"), now[0])
    (pending,) = fc.blocking("/", frozenset({"orders.f"}))
    fc.block(owner.conn_id, 3, frozenset({pending}), now[0])
    fc.queue_deleted(("/", "orders.f"), now[0])
    assert owner.released == [3]
