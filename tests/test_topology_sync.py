"""Changes to the routing model from every source, and how a full sync is judged."""

from __future__ import annotations

import pytest

from floodwall.control.routing import (
    ChangeKind,
    QueueType,
    Topology,
    TopologyChange,
    TopologyError,
    exchange_changes,
)
from floodwall.control.routing.sync import SyncDifference, change_names, describe

K = ChangeKind


def changes() -> list[TopologyChange]:
    return [
        TopologyChange(K.DECLARE_VHOST, "v", "v"),
        TopologyChange(K.DECLARE_EXCHANGE, "v", "x", exchange_type="topic"),
        TopologyChange(K.DECLARE_QUEUE, "v", "q", queue_type=QueueType.STREAM),
        TopologyChange(K.BIND_QUEUE, "v", "q", "x", "z.*"),
        TopologyChange(K.BIND_EXCHANGE, "v", "x", "amq.topic", "z.#"),
    ]


def test_apply_builds_what_the_methods_build_and_is_idempotent() -> None:
    model = Topology()
    for change in changes():
        model.apply(change)
    once = model.items()
    for change in changes():
        model.apply(change)
    assert model.items() == once
    assert model.route("v", "amq.topic", "z.a") == frozenset({"q"})
    assert model.queue_type("v", "q") is QueueType.STREAM
    assert ("queue", "v", "q", "stream") in once
    assert ("exchange", "v", "x", "topic", False, False, None) in once
    model.apply(TopologyChange(K.UNBIND_EXCHANGE, "v", "x", "amq.topic", "z.#"))
    assert model.route("v", "amq.topic", "z.a") == frozenset()
    model.apply(TopologyChange(K.UNBIND_QUEUE, "v", "q", "x", "z.*"))
    model.apply(TopologyChange(K.DELETE_QUEUE, "v", "q"))
    assert not model.knows_queue("v", "q") and model.queue_type("v", "q") is QueueType.CLASSIC
    model.apply(TopologyChange(K.DELETE_EXCHANGE, "v", "x"))
    assert not model.knows_exchange("v", "x")
    model.apply(TopologyChange(K.DELETE_VHOST, "v", "v"))
    assert model.vhosts() == [] and model.items() == frozenset()


def test_a_listing_and_the_same_changes_give_the_same_items() -> None:
    listed = Topology()
    listed.load_management(
        exchanges=[{"name": n, "vhost": "v", "type": t, "internal": i}
                   for n, t, i in (("", "direct", False), ("amq.direct", "direct", False),
                                   ("amq.fanout", "fanout", False),
                                   ("amq.headers", "headers", False),
                                   ("amq.match", "headers", False),
                                   ("amq.rabbitmq.trace", "topic", True),
                                   ("amq.topic", "topic", False), ("x", "topic", False))],
        queues=[{"name": "q", "vhost": "v", "type": "stream"}],
        bindings=[{"source": "x", "vhost": "v", "destination": "q",
                   "destination_type": "queue", "routing_key": "z.*", "arguments": {}},
                  {"source": "amq.topic", "vhost": "v", "destination": "x",
                   "destination_type": "exchange", "routing_key": "z.#", "arguments": {}}])
    changed = Topology()
    for change in changes():
        changed.apply(change)
    assert listed.items() == changed.items()


def test_exchange_changes_read_an_exchange_and_its_bindings() -> None:
    found = exchange_changes(
        {"name": "x", "vhost": "/", "type": "headers", "durable": True, "auto_delete": True,
         "internal": False, "arguments": {"alternate-exchange": "ae"}},
        [{"source": "x", "vhost": "/", "destination": "q", "destination_type": "queue",
          "routing_key": "", "arguments": {"x-match": "any", "k": "undefined"}},
         {"source": "x", "vhost": "/", "destination": "y", "destination_type": "exchange",
          "routing_key": "r", "arguments": {}},
         {"source": "", "vhost": "/", "destination": "q", "destination_type": "queue",
          "routing_key": "q", "arguments": {}}])
    assert [c.kind for c in found] == [K.DECLARE_EXCHANGE, K.BIND_QUEUE, K.BIND_EXCHANGE]
    assert found[0].auto_delete and found[0].arguments == {"alternate-exchange": "ae"}
    assert found[1].arguments == {"x-match": "any", "k": None}
    with pytest.raises(TopologyError):
        exchange_changes([], [])
    with pytest.raises(TopologyError):
        exchange_changes({"name": "x", "vhost": "/", "type": "direct"},
                         [{"source": "x", "vhost": "/", "destination": "q",
                           "destination_type": "stream", "routing_key": ""}])


def test_change_names_and_touches() -> None:
    bind = TopologyChange(K.BIND_QUEUE, "v", "q", "x", "k")
    assert change_names(bind) == {("v", "q"), ("v", "x")}
    assert change_names(TopologyChange(K.DELETE_VHOST, "v", "v")) == {("v", "")}
    assert bind.touches() == (("binding", "v", "x", "queue", "q", "k"), ("queue", "v", "q"))


def test_a_difference_is_excused_by_changes_in_its_grace_period() -> None:
    before, after = Topology(), Topology()
    for model in (before, after):
        model.declare_queue("/", "kept")
    after.declare_queue("/", "missed")
    after.declare_queue("/", "in.flight")
    after.bind_queue("/", "in.flight", "amq.topic", "k")
    before.declare_queue("/", "gone")
    diff = SyncDifference(after.items() - before.items(), before.items() - after.items(),
                          found_at=130.0, in_step_since=100.0)
    diff.note(TopologyChange(K.DECLARE_QUEUE, "/", "in.flight"))  # its event came late
    missing, extra = diff.confirmed()
    assert missing == frozenset({("queue", "/", "missed", "classic")})
    assert extra == frozenset({("queue", "/", "gone", "classic")})
    assert diff.out_of_step_seconds() == 30.0
    assert describe(missing | extra) == "queue gone@/,queue missed@/"
    diff.note(TopologyChange(K.DELETE_VHOST, "/", "/"))
    assert diff.confirmed() == (frozenset(), frozenset())
    assert SyncDifference(frozenset(), frozenset(), 1.0, None).out_of_step_seconds() is None


def test_describe_bindings_and_long_lists() -> None:
    model = Topology()
    for i in range(12):
        model.bind_queue("/", f"q{i:02d}", "amq.topic", "k")
    text = describe(i for i in model.items() if i[0] == "binding")
    assert text.startswith("binding amq.topic->queue:q00[k]@/,")
    assert text.endswith(",... (2 more)")


def test_bindings_from_events_and_from_the_listing_compare_equal() -> None:
    """Decimals and timestamps: typed in frames and events, plain numbers in the listing."""
    from datetime import UTC, datetime
    from decimal import Decimal

    framed, listed = Topology(), Topology()
    framed.bind_queue("/", "q", "amq.headers", "", {"d": Decimal("1.5"), "n": 2,
                                                     "t": datetime(2020, 1, 1, tzinfo=UTC),
                                                     "x-match": "any"})
    listed.load_management(
        exchanges=[{"name": "amq.headers", "vhost": "/", "type": "headers"}],
        queues=[{"name": "q", "vhost": "/"}],
        bindings=[{"source": "amq.headers", "vhost": "/", "destination": "q",
                   "destination_type": "queue", "routing_key": "",
                   "arguments": {"d": 1.5, "n": 2, "t": 1577836800, "x-match": "any"}}])
    pick = [i for i in framed.items() if i[0] == "binding"]
    assert pick and set(pick) == {i for i in listed.items() if i[0] == "binding"}
