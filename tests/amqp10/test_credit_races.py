"""The credit gate under every interleaving hypothesis finds: flows crossing transfers in
flight, trips and releases at any moment, the broker's flows (lagging, echo, drain) racing the
proxy's, fed whole and one byte at a time.

Three peers around the sans-IO core (``Setup``): a *client* sender model, a *broker* receiver
model and the network between them (one FIFO per direction, frames delivered whenever
hypothesis says). The client sends on a link whenever its credit allows, as a fast sender
does; its credit is 2.6.7's ``delivery-count_rcv + link-credit_rcv - delivery-count_snd``,
computed either as the spec says (rhea) or as proton-c 0.40 does it, in a ``uint32_t``
(``pn_do_flow``; a negative credit wraps to about 2^32 and the client sends everything).
What must hold, at every step:

- neither peer ever gets a detach: no transfer goes beyond a limit the proxy granted;
- no flow the client gets states a limit below what it has already sent (a negative credit),
  so a proton sender never wraps;
- every transfer the client sends reaches the broker exactly once, in order, and never past
  the broker's own limit;
- a flow answering the broker's echo tells it the delivery-count it has counted itself;
- the capped link's credit plus its deliveries the broker has not settled stay within its part
  of the queue's in-flight allowance (the link alone: all of it, in messages of the size its
  last grant was worked out at), so at a trip too;
- while the capped queue stays tripped, the limit the client has never grows, and what reaches
  the queue after the trip is at most the credit the client had then: the overshoot bound;
- once the queue is released and the broker has credit to give, the client has credit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floodwall.control.controller import in_flight_allowance
from floodwall.enforce.amqp10.links import ASSUMED_MESSAGE_BYTES, SenderLink, window_for
from floodwall.wire.amqp10.credit import MASK, serial_add, serial_diff
from floodwall.wire.amqp10.performatives import DETACH, DISPOSITION, FLOW, TRANSFER
from floodwall.wire.amqp10.types import Described, UInt, ULong
from tests.amqp10.streams import amqp, bytewise, performatives, transfer, whole
from tests.amqp10.test_credit_gate import (
    CAPPED_H,
    FREE_H,
    SERVER_CH,
    SERVER_HANDLE,
    VHOST,
    Chunker,
    Setup,
    message,
    num,
)

LINKS = (CAPPED_H, FREE_H)
BY_SERVER_HANDLE = {SERVER_HANDLE[h]: h for h in LINKS}
Frame = tuple[int, list[object]]


@dataclass
class ClientLink:
    """What the client's sender endpoint knows of one link."""

    proton: bool
    count: int = 0  # delivery-count: deliveries sent
    limit: int | None = None  # delivery-count_rcv + link-credit_rcv of the last flow
    tags: list[int] = field(default_factory=list)  # delivery-ids sent, in order

    def credit(self) -> int:
        """Credit as the client computes it (proton: a uint32_t; the spec: signed)."""
        if self.limit is None:
            return 0
        if self.proton:
            return (self.limit - self.count) & MASK
        return serial_diff(self.limit, self.count)


ACCEPTED = Described(ULong(0x24), [])


@dataclass
class BrokerLink:
    """What the broker's receiver endpoint knows of one link (broker numbering)."""

    received: int = 0
    limit: int = 0
    tags: list[int] = field(default_factory=list)


@dataclass
class World:
    s: Setup
    proton: bool
    size: int
    client: dict[int, ClientLink] = field(default_factory=dict)
    broker: dict[int, BrokerLink] = field(default_factory=dict)
    to_proxy: deque[bytes] = field(default_factory=deque)  # client -> proxy frames
    to_client: deque[Frame] = field(default_factory=deque)  # proxy -> client
    to_broker: deque[Frame] = field(default_factory=deque)  # proxy -> broker
    from_broker: deque[bytes] = field(default_factory=deque)  # broker -> proxy frames
    next_id: int = 0
    echoes: int = 0
    drains: int = 0

    def __post_init__(self) -> None:
        for h in LINKS:
            self.client[h] = ClientLink(self.proton)
            self.broker[h] = BrokerLink()
            self.broker_flow(h, 1000)

    # -- the proxy's output into the network -------------------------------------------------
    def _collect(self) -> None:
        to_server, to_client = self.s.take()
        for code, fields in performatives(to_client):
            assert code != DETACH, f"the proxy detached a link: {fields}"
            self.to_client.append((code, fields))
        for code, fields in performatives(to_server):
            assert code != DETACH, f"the proxy detached a link: {fields}"
            self.to_broker.append((code, fields))

    # -- the client --------------------------------------------------------------------------
    def send(self, h: int) -> None:
        link = self.client[h]
        if link.credit() <= 0:
            return
        size = self.size if h == CAPPED_H else 100
        self.to_proxy.append(transfer(0, h, self.next_id, message(size)))
        link.tags.append(self.next_id)
        self.next_id += 1
        link.count = serial_add(link.count, 1)

    def deliver_to_proxy(self, n: int) -> None:
        for _ in range(min(n, len(self.to_proxy))):
            self.s.client(self.to_proxy.popleft())
            self._collect()

    def deliver_to_client(self, n: int) -> None:
        for _ in range(min(n, len(self.to_client))):
            code, fields = self.to_client.popleft()
            if code != FLOW or len(fields) < 7 or fields[4] is None:
                continue
            h = BY_SERVER_HANDLE[num(fields[4])]
            link = self.client[h]
            link.limit = serial_add(num(fields[5]), num(fields[6]))
            # The mechanism: no limit below what the client has already sent.
            assert serial_diff(link.limit, link.count) >= 0, (
                f"a flow states limit {link.limit} to a client at {link.count}")
            drain = len(fields) > 8 and fields[8] is True
            echo = len(fields) > 9 and fields[9] is True
            if drain and link.credit() > 0:  # nothing it wants to send now: drained
                link.count = link.limit
            if drain or echo:
                self.to_proxy.append(amqp(
                    FLOW, 0, next_incoming_id=UInt(0), incoming_window=UInt(5000),
                    next_outgoing_id=UInt(self.next_id), outgoing_window=UInt(5000),
                    handle=UInt(h), delivery_count=UInt(link.count),
                    link_credit=UInt(max(0, serial_diff(link.limit, link.count))),
                    drain=drain or None))

    # -- the broker --------------------------------------------------------------------------
    def broker_flow(self, h: int, extra: int, echo: bool = False, drain: bool = False) -> None:
        """The broker grants again: at least the limit it gave before (RabbitMQ never
        lowers it), counted from what it has received so far (lagging what is in flight)."""
        b = self.broker[h]
        credit = max(0, serial_diff(b.limit, b.received)) + extra
        b.limit = serial_add(b.received, credit)
        self.from_broker.append(amqp(
            FLOW, SERVER_CH, next_incoming_id=UInt(self.next_id), incoming_window=UInt(5000),
            next_outgoing_id=UInt(0), outgoing_window=UInt(5000), handle=UInt(SERVER_HANDLE[h]),
            delivery_count=UInt(b.received), link_credit=UInt(credit), drain=drain or None,
            echo=echo or None))

    def deliver_to_broker(self, n: int) -> None:
        for _ in range(min(n, len(self.to_broker))):
            code, fields = self.to_broker.popleft()
            if code == TRANSFER:
                h = num(fields[0])
                b = self.broker[h]
                assert serial_diff(b.limit, b.received) > 0, "beyond the broker's credit"
                b.received = serial_add(b.received, 1)
                b.tags.append(num(fields[1]))
                # RabbitMQ settles each delivery once its queue has it: the gate counts a
                # windowed link's unsettled deliveries against its window until then
                self.from_broker.append(amqp(DISPOSITION, SERVER_CH, role=True,
                                             first=UInt(num(fields[1])), settled=True,
                                             state=ACCEPTED))
            elif code == FLOW and len(fields) > 5 and fields[4] is not None:
                h = num(fields[4])
                b = self.broker[h]
                count = num(fields[5])
                drained = len(fields) > 8 and fields[8] is True
                if drained:  # the sender used up (or gave up) the credit
                    assert serial_diff(count, b.received) >= 0
                    b.received = count
                    self.drains += 1
                else:  # an echo's answer: what the broker itself has counted
                    assert count == b.received, (count, b.received)
                    self.echoes += 1

    def deliver_from_broker(self, n: int) -> None:
        for _ in range(min(n, len(self.from_broker))):
            self.s.server(self.from_broker.popleft())
            self._collect()

    # -- checks ------------------------------------------------------------------------------
    @property
    def gate_link(self) -> SenderLink:
        link = self.s.gate.sessions[0].links[CAPPED_H]
        assert isinstance(link, SenderLink)
        return link

    @property
    def tripped(self) -> bool:
        return (VHOST, "capped") in self.s.fc.tripped

    def settle(self) -> None:
        """Deliver everything in every direction until the network is quiet."""
        for _ in range(100):
            if not (self.to_proxy or self.to_client or self.to_broker or self.from_broker):
                return
            self.deliver_to_proxy(1 << 30)
            self.deliver_to_broker(1 << 30)
            self.deliver_from_broker(1 << 30)
            self.deliver_to_client(1 << 30)
        raise AssertionError("the network never went quiet")


ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(LINKS), st.integers(1, 40)),
    st.tuples(st.just("to_proxy"), st.integers(1, 30)),
    st.tuples(st.just("to_client"), st.integers(1, 5)),
    st.tuples(st.just("to_broker"), st.integers(1, 30)),
    st.tuples(st.just("from_broker"), st.integers(1, 5)),
    st.tuples(st.just("broker_flow"), st.sampled_from(LINKS), st.integers(0, 200),
              st.booleans(), st.booleans()),
    st.tuples(st.just("trip")),
    st.tuples(st.just("release")),
), max_size=60)


def run(actions: list[tuple[object, ...]], proton: bool, size: int, chunker: Chunker) -> World:
    w = World(Setup(chunker=chunker), proton, size)
    w.s.take()
    w.deliver_from_broker(10)
    q = w.s.fc.queues[(VHOST, "capped")]
    allowance = in_flight_allowance(q.policy)
    # The link's part of the allowance at its last grant that raised its limit: at the assumed
    # size before the proxy has seen one of its messages, then at theirs (a limit granted at
    # the assumed size is never taken back: it bounds until the link has used it up).
    part = window_for(ASSUMED_MESSAGE_BYTES, allowance)
    credit_at_trip = overshoot_at_trip = 0
    for action in actions:
        kind = action[0]
        was_tripped = w.tripped
        granted_before = w.gate_link.credit.granted
        if kind == "send":
            for _ in range(int(action[2])):  # type: ignore[call-overload]
                w.send(int(action[1]))  # type: ignore[call-overload]
        elif kind == "to_proxy":
            w.deliver_to_proxy(int(action[1]))  # type: ignore[call-overload]
        elif kind == "to_client":
            w.deliver_to_client(int(action[1]))  # type: ignore[call-overload]
        elif kind == "to_broker":
            w.deliver_to_broker(int(action[1]))  # type: ignore[call-overload]
        elif kind == "from_broker":
            w.deliver_from_broker(int(action[1]))  # type: ignore[call-overload]
        elif kind == "broker_flow":
            _, h, extra, echo, drain = action
            w.broker_flow(int(h), int(extra), bool(echo), bool(drain))  # type: ignore[call-overload]
        elif kind == "trip":
            w.s.sample("capped", 500_000)
        else:
            w.s.sample("capped", 0)
        w._collect()
        link = w.gate_link
        credit = link.credit
        if credit.granted is not None:
            if granted_before is None or serial_diff(credit.granted, granted_before) > 0:
                part = window_for(link.typical_bytes or ASSUMED_MESSAGE_BYTES, allowance)
            # credit plus unsettled within the link's part of the allowance at any time (a
            # transfer moves one from its credit to its unsettled deliveries, a settlement
            # frees one: only a grant adds, and a grant keeps the sum within the part)
            outstanding = serial_diff(credit.granted, credit.delivery_count)
            assert outstanding + link.unsettled <= part, (outstanding, link.unsettled, part)
            if w.tripped and not was_tripped:  # the trip: what may still reach the queue
                credit_at_trip, overshoot_at_trip = outstanding, q.overshoot_messages
        if was_tripped and w.tripped and kind != "release":
            assert credit.granted == granted_before, "credit grew while tripped"
        if w.tripped:
            assert q.overshoot_messages - overshoot_at_trip <= credit_at_trip
    # the end: everything delivered, the queue drained (a sample after the last transfer)
    # and released, the broker gives credit
    w.settle()
    w.s.sample("capped", 0)
    w._collect()
    w.settle()
    for h in LINKS:
        w.broker_flow(h, 100)
    w.settle()
    for h in LINKS:
        assert w.broker[h].tags == w.client[h].tags, "lost, duplicated or reordered"
        assert w.client[h].credit() > 0, f"link {h} stalled after the release"
    return w


SIZES = st.sampled_from([100, 3000, 20_000])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, proton=st.booleans(), size=SIZES)
def test_interleavings_whole_frames(actions: list[tuple[object, ...]], proton: bool,
                                    size: int) -> None:
    run(actions, proton, size, whole)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, proton=st.booleans())
def test_interleavings_byte_at_a_time(actions: list[tuple[object, ...]], proton: bool) -> None:
    run(actions, proton, 100, bytewise)


@pytest.mark.parametrize("proton", [True, False], ids=["proton", "spec"])
def test_a_trip_crossing_a_full_window_in_flight(proton: bool) -> None:
    """A full window in flight at a trip, step by step: the client has all its credit in flight
    when the queue trips; the proxy sends no flow that lowers its limit, forwards it
    (overshoot) and the client stops at its limit by itself, proton included."""
    w = World(Setup(), proton, 100)
    w.s.take()
    w.deliver_from_broker(10)
    w.deliver_to_client(10)
    window = w.client[CAPPED_H].credit()
    # the link alone, far from capacity: its queue's whole in-flight allowance, at the assumed
    # size (no message seen yet)
    policy = w.s.fc.queues[(VHOST, "capped")].policy
    assert window == window_for(ASSUMED_MESSAGE_BYTES, in_flight_allowance(policy))
    for _ in range(window + 5):
        w.send(CAPPED_H)
    assert len(w.to_proxy) == window  # it stopped at its limit
    w.s.sample("capped", 500_000)
    w.broker_flow(CAPPED_H, 50, echo=True)  # the broker's flow races too
    w.deliver_from_broker(1)
    w.settle()
    q = w.s.fc.queues[(VHOST, "capped")]
    assert q.overshoot_messages == window  # all of it reached the queue after the trip
    assert w.broker[CAPPED_H].tags == w.client[CAPPED_H].tags
    assert w.client[CAPPED_H].credit() == 0  # and not 2^32 - something
    assert w.echoes == 1
    w.s.sample("capped", 0)
    w._collect()
    w.settle()
    assert w.client[CAPPED_H].credit() > 0
