"""The 0-9-1 gate and lookups, driven by bytes: a publish naming what the model does not know
waits (in channel order, other channels going on) until the broker was asked."""

from __future__ import annotations

import random

import pytest

from floodwall.control.controller import FlowController
from floodwall.control.lookups import Lookup, LookupKind, LookupResult
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from floodwall.enforce.amqp091.gate import LOOKUP_HOLD_BUDGET
from floodwall.wire.amqp091.connection import Connection
from tests.amqp091.wire import CH, B, client_handshake, content, method, server_handshake

POLICIES = """
version: 1
policies:
  - {name: orders, match: {vhost: "/orders", queue: "orders.*"}, capacity: 2000, resume: 1000}
"""
VHOST = "/orders"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Setup:
    def __init__(self) -> None:
        self.clock = Clock()
        self.topology = Topology()
        self.topology.declare_queue(VHOST, "free")
        self.fc = FlowController(self.topology, self.clock, parse_policies(POLICIES))
        self.core = Connection(self.fc, conn_id=1)
        self.core.receive_from_server(b"".join(server_handshake()))
        self.core.receive_from_client(b"".join(client_handshake()))
        self.core.receive_from_client(method(CH.Open(), 1) + method(CH.Open(), 2))
        self.core.receive_from_server(method(CH.OpenOk(), 1) + method(CH.OpenOk(), 2))
        self.core.data_for_server()
        self.core.data_for_client()
        assert self.core.flow is not None
        self.flow = self.core.flow

    def found(self, queue: str, ready: int = 0) -> None:
        """What the I/O layer does when a queue lookup finds the queue."""
        self.topology.declare_queue(VHOST, queue)
        self.fc.queue_seen((VHOST, queue))
        self.fc.sampled_ready_count((VHOST, queue), self.clock.t, ready)
        self.fc.lookup_answered(Lookup(VHOST, LookupKind.QUEUE, queue), LookupResult.FOUND)


def pub(channel: int, queue: str, size: int = 100, tag: int = 0, exchange: str = "") -> bytes:
    return (method(B.Publish(exchange=exchange, routing_key=queue), channel)
            + b"".join(content(channel, bytes([tag % 256]) * size)))


@pytest.mark.parametrize("chunk", [1, 5, 97, None])
def test_a_publish_to_an_unknown_queue_waits_for_the_lookup(chunk: int | None) -> None:
    s = Setup()
    held = pub(1, "orders.new", tag=1) + pub(1, "free", tag=2)  # free waits behind it
    other = pub(2, "free", tag=3) + method(B.Ack(delivery_tag=1), 1)
    stream = held + other
    rng = random.Random(chunk)
    pos, out = 0, b""
    while pos < len(stream):
        step = len(stream) if chunk is None else rng.randint(1, chunk)
        s.core.receive_from_client(stream[pos:pos + step])
        out += s.core.data_for_server()
        pos += step
    assert out == other  # channel 2 and the ack pass; channel 1 waits for the answer
    assert s.fc.lookups.take_due() == [Lookup(VHOST, LookupKind.QUEUE, "orders.new")]
    assert s.flow.waiting_for_lookup
    assert s.core.data_for_client() == b""  # no Channel.Flow for a moment's wait
    s.found("orders.new")
    assert s.core.data_for_server() == held
    # Booked on the queue it was looked up for: the ledger starts from the broker's figure.
    depth = s.fc.queues[(VHOST, "orders.new")].depth
    assert depth.forwarded_messages_total == 1
    assert not s.flow.waiting_for_lookup
    # A stream of publishes costs one lookup: the next one passes at once.
    s.core.receive_from_client(pub(1, "orders.new", tag=4))
    assert s.core.data_for_server() != b""
    assert s.fc.lookups.take_due() == []


def test_an_absent_queue_is_asked_once_per_ttl() -> None:
    s = Setup()
    first = pub(1, "orders.none", tag=1)
    s.core.receive_from_client(first)
    assert s.core.data_for_server() == b""
    s.fc.lookup_answered(Lookup(VHOST, LookupKind.QUEUE, "orders.none"), LookupResult.ABSENT)
    assert s.core.data_for_server() == first  # the broker routes it nowhere; it goes
    again = pub(1, "orders.none", tag=2)
    s.core.receive_from_client(again)
    assert s.core.data_for_server() == again
    assert s.fc.lookups.asked == 1
    s.clock.t += 2  # past the ttl: asked again
    s.core.receive_from_client(pub(1, "orders.none", tag=3))
    assert s.core.data_for_server() == b""
    assert s.fc.lookups.asked == 2


def test_a_queue_found_over_capacity_holds_what_waited_for_it() -> None:
    s = Setup()
    waiting = pub(1, "orders.full", 500, tag=1)
    s.core.receive_from_client(waiting)
    s.topology.declare_queue(VHOST, "orders.full")
    s.fc.queue_seen((VHOST, "orders.full"))
    from floodwall.control.depth import ManagementSample

    s.fc.sampled_management((VHOST, "orders.full"), ManagementSample(999.0, 30, 0, 3000,
                                                                     3000, 0))
    s.fc.lookup_answered(Lookup(VHOST, LookupKind.QUEUE, "orders.full"), LookupResult.FOUND)
    assert (VHOST, "orders.full") in s.fc.tripped
    assert s.core.data_for_server() == b""  # still held: now on the tripped queue itself
    assert s.fc.held_messages == 1
    assert [b.queues for b in s.fc.blocked_channels()] == [frozenset({(VHOST, "orders.full")})]


def test_a_publish_to_an_unknown_exchange_is_routed_again_once_it_is_known() -> None:
    s = Setup()
    held = pub(1, "a.b", tag=1, exchange="made.elsewhere")
    s.core.receive_from_client(held)
    assert s.core.data_for_server() == b""
    assert s.fc.lookups.take_due() == [Lookup(VHOST, LookupKind.EXCHANGE, "made.elsewhere")]
    # The lookup read the exchange and its binding to a queue a policy matches.
    s.topology.declare_exchange(VHOST, "made.elsewhere", "topic")
    s.topology.bind_queue(VHOST, "orders.bound", "made.elsewhere", "a.*")
    s.fc.queue_seen((VHOST, "orders.bound"))
    s.fc.lookup_answered(Lookup(VHOST, LookupKind.EXCHANGE, "made.elsewhere"),
                         LookupResult.FOUND)
    # Routed again: it lands in orders.bound, which waits for its first figure.
    assert s.core.data_for_server() == b""
    s.fc.sampled_ready_count((VHOST, "orders.bound"), s.clock.t, 0)
    assert s.core.data_for_server() == held
    assert s.fc.queues[(VHOST, "orders.bound")].depth.forwarded_messages_total == 1


def test_a_flood_behind_a_lookup_stops_being_read_past_the_lookup_budget() -> None:
    s = Setup()
    big = b"".join(pub(1, "orders.flood", 10_000, tag=i) for i in range(40))
    s.core.receive_from_client(big)
    assert s.flow.held_bytes > LOOKUP_HOLD_BUDGET
    assert s.flow.over_budget  # the relay stops reading until the answer is in
    s.found("orders.flood")
    assert not s.flow.over_budget
    assert s.fc.held_messages > 0  # the answer let 2000 bytes go, then the queue tripped
    assert (VHOST, "orders.flood") in s.fc.tripped


def test_a_channel_closed_while_it_waits_forgets_the_lookup_wait() -> None:
    s = Setup()
    s.core.receive_from_client(pub(1, "orders.x"))
    assert s.flow.waiting_for_lookup
    s.core.receive_from_client(method(CH.Close(reply_code=200, reply_text="", class_id=0,
                                               method_id=0), 1))
    s.core.receive_from_server(method(CH.CloseOk(), 1))
    assert not s.flow.waiting_for_lookup
    s.found("orders.x")  # nothing to release any more
    assert s.core.data_for_server() == b""
