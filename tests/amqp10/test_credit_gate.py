"""The AMQP 1.0 credit gate driven by bytes: grants, top-ups, trips, releases, bad senders."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.control.controller import (
    ALLOWANCE_PARTS,
    IN_FLIGHT_ALLOWANCE,
    ROOM_LEASE_S,
    FlowController,
    QueueKey,
    in_flight_allowance,
)
from floodwall.control.depth import Depth, ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.control.policy.model import Policy
from floodwall.enforce.amqp10.credit import SQUEEZED_TOP_UP
from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.amqp10.links import (
    ASSUMED_MESSAGE_BYTES,
    MAX_WINDOW_BYTES,
    ROOM_PARTS,
    ROOM_WINDOW_BYTES,
    WINDOW_BYTES,
    WINDOW_PARTS,
    SenderLink,
    link_ref,
    message_routing,
    policy_window,
    room_window,
    window_for,
)
from floodwall.spool.manager import SpoolManager
from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.credit import MASK, serial_add
from floodwall.wire.amqp10.framing import AMQP_HEADER
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    DETACH,
    DISPOSITION,
    FLOW,
    SOURCE,
    TARGET,
    TRANSFER,
    performative,
)
from floodwall.wire.amqp10.types import Described, Symbol, UByte, UInt, ULong, encode
from tests.amqp10.streams import (
    amqp,
    begin,
    bytewise,
    continuation,
    data_section,
    detach,
    disposition,
    end,
    open_,
    performatives,
    random_chunks,
    transfer,
    whole,
)
from tests.fakes import Board, Clock, DefaultExchange, DiskSpool

VHOST = "/"
CAPACITY = 100_000
SERVER_CH = 3
CAPPED_H, FREE_H, ANON_H, RECV_H = 0, 1, 2, 3  # client handles
SERVER_HANDLE = {CAPPED_H: 7, FREE_H: 8, ANON_H: 9, RECV_H: 10}
# The capped queue's in-flight allowance: all of a capacity this small. A lone link's credit
# plus its unsettled deliveries stay within it, so its first grant (no size seen yet) is that
# many messages of the assumed size.
ALLOWANCE = in_flight_allowance(Policy("capped", capacity=CAPACITY))
WINDOW = window_for(ASSUMED_MESSAGE_BYTES, ALLOWANCE)
Chunker = Callable[[bytes], Iterator[bytes]]


def policies(overflow: str, extra: str = "", capacity: int = CAPACITY) -> str:
    return f"""
version: 1
policies:
  - name: capped
    match: {{vhost: "/", queue: "capped*"}}
    capacity: {capacity}
    resume: 50000
    overflow: {overflow}
{extra}"""


def link_attach(channel: int, name: str, handle: int, role: bool, target: str | None,
                source: str | None = None, initial: int | None = 0) -> bytes:
    return amqp(ATTACH, channel, name=name, handle=UInt(handle), role=role,
                snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
                source=performative(SOURCE, address=source),
                target=performative(TARGET, address=target),
                initial_delivery_count=None if role or initial is None else UInt(initial))


def broker_flow(handle: int, count: int | None, credit: int, drain: bool = False,
                echo: bool = False, next_incoming: int = 0) -> bytes:
    return amqp(FLOW, SERVER_CH, next_incoming_id=UInt(next_incoming),
                incoming_window=UInt(5000), next_outgoing_id=UInt(0),
                outgoing_window=UInt(5000), handle=UInt(handle),
                delivery_count=None if count is None else UInt(count),
                link_credit=UInt(credit), drain=drain or None, echo=echo or None)


def client_flow(handle: int, count: int, credit: int, drain: bool = False,
                echo: bool = False, next_outgoing: int = 0) -> bytes:
    return amqp(FLOW, 0, next_incoming_id=UInt(0), incoming_window=UInt(5000),
                next_outgoing_id=UInt(next_outgoing), outgoing_window=UInt(5000),
                handle=UInt(handle), delivery_count=UInt(count), link_credit=UInt(credit),
                drain=drain or None, echo=echo or None)


def message(size: int, to: str | None = None) -> bytes:
    props = b"" if to is None else encode(Described(ULong(0x73), [None, None, to]))
    return props + data_section(b"x" * size)


@dataclass
class Setup:
    """A gated connection: a sender to a capped queue, one to a free queue, an anonymous
    sender and a receiver on the capped queue, all on one session."""

    overflow: str = "hold"
    chunker: Chunker = whole
    initial: int = 0
    clock: Clock = field(default_factory=Clock)
    to_client: list[bytes] = field(default_factory=list)
    to_server: list[bytes] = field(default_factory=list)
    next_id: int = 0
    spool: SpoolManager | None = None  # with a spool: the gate writes through DiskSpool
    policy_extra: str = ""  # more lines of the capped policy (indented 4)
    capacity: int = CAPACITY

    def __post_init__(self) -> None:
        self.fc = FlowController(DefaultExchange(),
                                 parse_policies(policies(self.overflow, self.policy_extra,
                                                               self.capacity)))
        self.board = Board(self.fc, self.clock, None if self.spool is None
                           else DiskSpool(self.spool, self.fc))
        self.counters = self.board.counters
        for q in ("capped", "capped2", "free"):
            self.fc.queue_seen((VHOST, q), self.clock.t)
        self.sample("capped", 0)
        self.sample("capped2", 0)
        self.gate = CreditFlow(self.board.enforcement, 1)
        self.core = Connection(AMQP_HEADER, self.gate, conn_id=1)
        self.board.attach(1, self.core, self.gate)
        self.client(open_("client") + begin(0)
                    + link_attach(0, "capped", CAPPED_H, False, "/amq/queue/capped",
                                  initial=self.initial)
                    + link_attach(0, "free", FREE_H, False, "/queue/free", initial=self.initial)
                    + link_attach(0, "anon", ANON_H, False, None, initial=self.initial)
                    + link_attach(0, "recv", RECV_H, True, None, source="/amq/queue/capped"))
        self.server(AMQP_HEADER + open_("broker") + begin(SERVER_CH, remote_channel=0)
                    + b"".join(link_attach(SERVER_CH, name, SERVER_HANDLE[h], role, t, s)
                               for name, h, role, t, s in (
                                   ("capped", CAPPED_H, True, "/amq/queue/capped", None),
                                   ("free", FREE_H, True, "/queue/free", None),
                                   ("anon", ANON_H, True, None, None),
                                   ("recv", RECV_H, False, None, "/amq/queue/capped"))))
        self.take()

    @property
    def notified(self) -> int:
        """Times the relay was handed output made outside a read (a release, an expiry)."""
        return self.board.flushes

    def sample(self, queue: str, nbytes: int) -> None:
        self.clock.t += 1
        self.fc.sampled_management((VHOST, queue), ManagementSample(
            self.clock.t, nbytes // 100, 0, nbytes, nbytes, 0), self.clock.t)
        self.board.settle()

    def client(self, data: bytes) -> None:
        for chunk in self.chunker(data):
            self.core.receive_from_client(chunk, self.clock.t)
            self.to_server.append(self.core.data_for_server())
            self.to_client.append(self.core.data_for_client())

    def server(self, data: bytes) -> None:
        for chunk in self.chunker(data):
            self.core.receive_from_server(chunk, self.clock.t)
            self.to_server.append(self.core.data_for_server())
            self.to_client.append(self.core.data_for_client())

    def take(self) -> tuple[bytes, bytes]:
        """What the core handed the server and the client since the last take."""
        self.to_server.append(self.core.data_for_server())
        self.to_client.append(self.core.data_for_client())
        out = b"".join(self.to_server), b"".join(self.to_client)
        self.to_server.clear()
        self.to_client.clear()
        return out

    def send(self, handle: int, size: int = 100, to: str | None = None,
             settled: bool = False) -> bytes:
        if settled:  # (sent settled: no disposition, nothing in flight)
            frame = amqp(TRANSFER, 0, message(size, to), handle=UInt(handle),
                         delivery_id=UInt(self.next_id),
                         delivery_tag=self.next_id.to_bytes(4, "big"), message_format=UInt(0),
                         settled=True)
        else:
            frame = transfer(0, handle, self.next_id, message(size, to))
        self.next_id += 1
        self.client(frame)
        return frame


def flows(data: bytes, handle: int | None = None) -> list[list[object]]:
    return [f for code, f in performatives(data) if code == FLOW
            and (handle is None or (len(f) > 4 and f[4] == handle))]


def num(value: object) -> int:
    assert isinstance(value, int)
    return value


def credit_seen(data: bytes, handle: int, sent: int) -> int:
    """What a client that sent ``sent`` deliveries makes of the last flow for ``handle``."""
    f = flows(data, handle)[-1]
    return num(f[5]) + num(f[6]) - sent


CHUNKERS = [pytest.param(whole, id="whole"), pytest.param(bytewise, id="bytewise")]


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_the_capped_link_gets_a_window_the_free_link_the_brokers_bytes(chunker: Chunker
                                                                       ) -> None:
    s = Setup(chunker=chunker)
    grant_capped = broker_flow(7, 0, 1000)
    grant_free = broker_flow(8, 0, 1000)
    s.server(grant_capped + grant_free)
    _, to_client = s.take()
    assert to_client.endswith(grant_free)  # passed byte-exact
    assert credit_seen(to_client, 7, 0) == WINDOW
    assert flows(to_client, 7)[-1][:4] == flows(grant_capped)[0][:4]  # session fields as sent


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_transfers_pass_unchanged_and_credit_is_topped_up_by_the_proxy(chunker: Chunker) -> None:
    """Far from capacity the link's window (half the room plus the allowance) is more than
    its part of the in-flight allowance, which its credit stays within: squeezed, it is
    topped up (by the proxy, not the broker) once 1 / SQUEEZED_TOP_UP of that part is used,
    not per transfer. Its deliveries are sent settled: nothing is in flight, the broker's
    settlements play no part."""
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 1000))
    s.take()
    (view,) = [v for v in s.gate.link_views() if v.handle == CAPPED_H]
    assert view.window is not None and view.window > WINDOW  # squeezed to its allowance
    step = WINDOW // SQUEEZED_TOP_UP
    size = ASSUMED_MESSAGE_BYTES - 100  # the allowance stays what it was assumed to be
    sent = [s.send(CAPPED_H, size, settled=True) for _ in range(step - 1)]
    to_server, to_client = s.take()
    assert to_server == b"".join(sent) and to_client == b""
    s.send(CAPPED_H, size, settled=True)  # an eighth of its part used: top up
    _, to_client = s.take()
    assert credit_seen(to_client, 7, step) == WINDOW
    q = s.fc.queues[(VHOST, "capped")]
    assert q.depth.forwarded_messages_total == step


def _link(s: Setup, handle: int) -> SenderLink:
    link = s.gate.sessions[0].links[handle]
    assert isinstance(link, SenderLink)
    return link


def _send_while_credit(s: Setup, size: int, settled: bool = False, most: int = 10_000) -> int:
    """The client sends on the capped link whatever credit it sees (the proxy's last grant,
    then each flow it gets); returns how many."""
    credit = _link(s, CAPPED_H).credit
    start = credit.delivery_count  # (the client's: Setup's links start at 0)
    sent, limit = start, start + credit.client_credit
    while sent < min(limit, start + most):
        s.send(CAPPED_H, size, settled=settled)
        sent += 1
        _, to_client = s.take()
        if flows(to_client, 7):
            limit = sent + credit_seen(to_client, 7, sent)
    return sent - start


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_unsettled_deliveries_count_against_the_in_flight_allowance_until_the_broker_settles(
        chunker: Chunker) -> None:
    """What the broker has not settled may still be on its way to the queue (RabbitMQ's
    internal flow control holds hundreds of messages out of a ready count's sight): a
    windowed link's credit plus its deliveries the broker has not settled stay within its
    part of the queue's in-flight allowance, though its window (half the room plus the
    allowance) is more; the broker's disposition makes room."""
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 10_000))
    s.take()
    part = window_for(len(message(100)), ALLOWANCE)  # (390 messages of 105 bytes)
    sent = _send_while_credit(s, 100)
    assert sent == part
    assert not s.fc.tripped  # no trip: 41 KB, below 100 KB
    link = _link(s, CAPPED_H)
    assert link.unsettled == sent and link.squeezed
    (view,) = [v for v in s.gate.link_views() if v.handle == CAPPED_H]
    assert (view.phase, view.windowed, view.queues) == ("open", True, ("capped",))
    assert view.window is not None and view.window > part  # (squeezed: its window is more)
    assert view.unsettled == sent and view.deliveries == sent
    assert view.credit == link.credit.client_credit == 0
    # the broker settles the first half (RabbitMQ repeats ranges: once more)
    settle = amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(0), last=UInt(part // 2 - 1),
                  settled=True, state=Described(ULong(0x24), []))
    s.server(settle + settle)
    to_server, to_client = s.take()
    assert to_server == b""
    assert credit_seen(to_client, 7, sent) == part // 2
    assert link.unsettled == sent - part // 2
    # settled the rest: the whole allowance again
    s.server(amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(part // 2),
                  last=UInt(sent - 1), settled=True, state=Described(ULong(0x24), [])))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, sent) == part
    assert link.unsettled == 0 and not s.gate.sessions[0].in_flight


GATE_CHUNKERS = [*CHUNKERS, pytest.param(random_chunks(12, 40), id="random")]


@pytest.mark.parametrize("chunker", GATE_CHUNKERS)
def test_the_brokers_dispositions_are_read_among_its_other_frames(chunker: Chunker) -> None:
    """The broker's dispositions are read by role, first and last alone (``peek_disposition``)
    wherever they fall: between its transfers to a receiver and its flows, split across reads;
    a transfer whose payload holds the bytes of a disposition frame settles nothing; every
    frame reaches the client as the broker sent it."""
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 10_000))
    s.take()
    sent = _send_while_credit(s, 100)
    link = _link(s, CAPPED_H)
    assert link.unsettled == sent
    lookalike = disposition(SERVER_CH, True, 0, sent - 1)  # would settle all of them
    recv = SERVER_HANDLE[RECV_H]
    stream = (transfer(SERVER_CH, recv, 0, data_section(lookalike) + lookalike)
              + disposition(SERVER_CH, True, 0, 9)
              + transfer(SERVER_CH, recv, 1, lookalike)
              + broker_flow(7, sent, 10_000)
              + disposition(SERVER_CH, False, 20, 21)  # the receiver's: not counted
              + disposition(SERVER_CH, True, 10, 10) + disposition(SERVER_CH, True, 10, 10))
    s.server(stream)
    to_server, to_client = s.take()
    assert link.unsettled == sent - 11
    assert sorted(s.gate.sessions[0].in_flight) == list(range(11, sent))
    assert to_server == b""
    # what the proxy wrote of its own (a flow for the capped link) comes after the broker's
    # frames; those reached the client byte-exact, the capped link's flow rewritten
    frames = []
    pos = 0
    while pos < len(to_client):
        size = int.from_bytes(to_client[pos:pos + 4], "big")
        frames.append(to_client[pos:pos + size])
        pos += size
    granted = [f for f in frames if flows(f, 7)]
    # (the link had sent its whole allowance: the 10 settled before the broker's flow are
    # the credit it has again)
    assert len(granted) == 1 and credit_seen(granted[0], 7, sent) == 10
    assert b"".join(f for f in frames if f not in granted) \
        == stream.replace(broker_flow(7, sent, 10_000), b"")


@pytest.mark.parametrize("chunker", CHUNKERS)
@pytest.mark.parametrize("given", [None, 64 * 1024, 128 * 1024])
def test_credit_plus_unsettled_stay_within_the_links_part_of_the_in_flight_allowance(
        chunker: Chunker, given: int | None) -> None:
    """With no more room than ROOM_PARTS allowances (a queue of that capacity: further from
    capacity the part is half the room), a link's credit plus its deliveries the broker has
    not settled stay within its part of the queue's in-flight allowance (256 KiB:
    ``IN_FLIGHT_ALLOWANCE``, or the policy's ``in_flight_allowance``), though its window is
    more; the broker settling some gives back credit for as many. They are counted on the
    queue until the broker settles them or the link goes."""
    allowance = IN_FLIGHT_ALLOWANCE if given is None else given
    capacity = ROOM_PARTS * allowance
    s = Setup(chunker=chunker, capacity=capacity,
              policy_extra="" if given is None else f"    in_flight_allowance: {given}")
    s.server(broker_flow(7, 0, 100_000))
    s.take()
    q = s.fc.queues[(VHOST, "capped")]
    assert in_flight_allowance(q.policy) == q.allowance_bytes() == allowance
    assert q.quiet_bytes - q.depth.forwarded_bytes_total == capacity  # (the room: no more)
    part = window_for(len(message(100)), allowance)  # (1,024 at 256 KiB: 256 bytes each)
    sent = _send_while_credit(s, 100)
    assert sent == part
    assert _link(s, CAPPED_H).credit.client_credit == 0
    assert window_for(len(message(100)), _window_bytes(s, CAPPED_H)) > part  # (squeezed)
    assert q.in_flight == sent and not s.fc.tripped
    assert q.depth.tracked_messages_total == q.depth.forwarded_messages_total == sent
    s.server(disposition(SERVER_CH, True, 0, part // 2 - 1))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, sent) == part // 2
    assert q.in_flight == sent - part // 2
    assert _send_while_credit(s, 100) == part // 2
    assert q.in_flight == part
    s.gate.close()
    assert q.in_flight == 0


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_far_from_capacity_credit_plus_unsettled_go_past_the_allowance_up_to_half_the_room(
        chunker: Chunker) -> None:
    """Far from capacity (the room the estimate shows more than ROOM_PARTS allowances) a
    link's credit plus its deliveries the broker has not settled go past its part of the
    in-flight allowance, up to its part of half that room: each grant gives it its window
    (its credit's cap) on top of what it has unsettled while that stays within half the room
    then; never settled, it stops at the last grant that did. Once a count shows the queue
    near capacity (no more room than ROOM_PARTS allowances) it is back within the
    allowance."""
    capacity = 10_000_000
    s = Setup(chunker=chunker, capacity=capacity)
    s.server(broker_flow(7, 0, 100_000))
    s.take()
    q = s.fc.queues[(VHOST, "capped")]
    allowance = in_flight_allowance(q.policy)
    assert allowance == IN_FLIGHT_ALLOWANCE and q.quiet_bytes == capacity
    size = len(message(100))  # (105 bytes: a window counts them as 256)
    part = window_for(size, allowance)  # (1,024)
    window = window_for(size, ROOM_WINDOW_BYTES)  # (2,048: the room is over it)

    def room() -> float:  # (no max_messages: the bytes the estimate leaves)
        return q.quiet_bytes - q.depth.forwarded_bytes_total

    link = _link(s, CAPPED_H)
    sent, limit, grants = 0, link.credit.client_credit, []
    while sent < limit:  # never settled
        s.send(CAPPED_H, 100)
        sent += 1
        _, to_client = s.take()
        if flows(to_client, 7):
            limit = sent + credit_seen(to_client, 7, sent)
            assert room() > ROOM_PARTS * allowance
            assert window_for(size, _window_bytes(s, CAPPED_H)) == window
            assert limit == min(sent + window, window_for(size, int(room() / ROOM_PARTS)))
            grants.append(sent)
    # topped up at each half window used (``wants_top_up``): the 15th grant, at 14,337 sent,
    # is the last within half the room; at the next, 15,361 sent, half the room is 16,381
    # messages, less than the link may send already
    assert grants == [1 + k * (window // 2) for k in range(15)]
    assert sent == limit == grants[-1] + window == 16_385 > part
    assert window_for(size, int((capacity - (sent - window // 2) * size) / ROOM_PARTS)) \
        == 16_381 < sent
    assert link.unsettled == q.in_flight == sent and link.credit.client_credit == 0
    assert not s.fc.tripped
    s.sample("capped", capacity - ROOM_PARTS * allowance)  # a count: near capacity
    assert room() == ROOM_PARTS * allowance and not s.fc.tripped
    s.server(disposition(SERVER_CH, True, 0, sent - 1))  # settled, all of them
    _, to_client = s.take()
    assert link.unsettled == 0
    assert credit_seen(to_client, 7, sent) == part < window_for(size, _window_bytes(s, CAPPED_H))
    assert _send_while_credit(s, 100) == part  # never settled: its allowance, no more
    assert link.unsettled == part and link.credit.client_credit == 0


def _count(s: Setup, key: QueueKey, ready: int) -> None:
    """A ready count of ``key`` asked for 10 ms on and answered ``ready`` 1 ms later."""
    s.clock.t += 0.01
    asked = s.clock.t
    s.fc.count_asked(key, asked)
    s.clock.t += 0.001
    s.fc.sampled_ready_count(key, asked, ready, 0.001, s.clock.t)
    s.board.settle()


@pytest.mark.parametrize("chunker", CHUNKERS)
@pytest.mark.parametrize("given", [None, 40_000, 300_000])
def test_a_broker_hiding_what_it_has_not_settled_overfills_the_queue_by_at_most_the_allowance(
        chunker: Chunker, given: int | None) -> None:
    """The worst broker: its ready counts show none of the deliveries it has not settled
    (each count is taken to hold them, up to the allowance: ``count_asked``), and it settles
    the older half of them only after each count, so the estimate is short by all it has in
    flight. Settling nothing, it gets no more than the link's part of the allowance (a count
    gives no credit back); settling, it lets the queue go past the capacity untripped, by
    no more than that. Once it settles them all they are counted back into the estimate:
    the next delivery trips the queue, and what the client still had credit for keeps the
    queue within capacity + allowance (the policy's ``in_flight_allowance`` where it gives
    one, more than the capacity too)."""
    s = Setup(chunker=chunker,
              policy_extra="" if given is None else f"    in_flight_allowance: {given}")
    key = (VHOST, "capped")
    q = s.fc.queues[key]
    allowance = in_flight_allowance(q.policy)
    assert allowance == (ALLOWANCE if given is None else given)
    s.server(broker_flow(7, 0, 1_000_000))
    s.take()
    settled = 0

    def counted() -> Depth:
        """A ready count asked for now, answered with what the broker settled (0 at first)."""
        _count(s, key, settled)
        estimate = q.depth.estimate()
        assert estimate is not None
        return estimate

    sent = _send_while_credit(s, 100)
    assert counted() == Depth(0, 0) and q.in_flight == sent  # all of it hidden ...
    more = _send_while_credit(s, 100)  # ... and no more credit for it than the allowance
    assert (more > 0) == (allowance > CAPACITY)  # (past the room the capacity gave at first)
    sent += more
    assert q.in_flight == sent and sent * len(message(100)) <= allowance
    assert counted() == Depth(0, 0) and _send_while_credit(s, 100) == 0
    for _ in range(10):
        assert counted().messages == settled == sent - q.in_flight
        assert not s.fc.tripped
        assert q.depth.forwarded_bytes_total <= CAPACITY + allowance
        if q.depth.forwarded_bytes_total > CAPACITY:
            break
        half = q.in_flight // 2
        s.server(disposition(SERVER_CH, True, settled, settled + half - 1))
        s.take()
        settled += half
        sent += _send_while_credit(s, 100)
    assert q.depth.forwarded_bytes_total > CAPACITY and not s.fc.tripped  # (hidden: in flight)
    s.server(disposition(SERVER_CH, True, settled, sent - 1))
    s.take()
    estimate = q.depth.estimate()
    assert estimate is not None and estimate.messages == sent  # counted back: all of them
    before = q.overshoot_messages
    more = _send_while_credit(s, 100)
    assert key in s.fc.tripped and q.overshoot_messages - before == more - 1  # (the first trips)
    assert CAPACITY < q.depth.forwarded_bytes_total <= CAPACITY + allowance


def test_deliveries_counted_back_leave_the_counted_room_only_when_the_count_found_none(
        ) -> None:
    """The room a queue's last count leaves (``counted_room``, what a link's window takes
    its part of the allowance up to) is not cut by deliveries counted back after a count that
    found the queue empty: consumers that keep up took them; after a count that found
    messages it is, as the estimate is."""
    s = Setup(chunker=whole)
    key = (VHOST, "capped")
    q = s.fc.queues[key]
    s.server(broker_flow(7, 0, 1_000_000))
    s.take()

    def count_and_settle(ready: int) -> int:
        """A count asked for with the link's deliveries in flight, answered ``ready``; then
        the broker settles them all (they are counted back). How many there were."""
        sent = _send_while_credit(s, 100, most=50)
        _count(s, key, ready)
        assert q.in_flight == sent
        s.server(disposition(SERVER_CH, True, q.depth.tracked_messages_total - sent,
                             q.depth.tracked_messages_total - 1))
        s.take()
        assert q.in_flight == 0 and q.depth.counted_back == sent
        return sent

    sent = count_and_settle(0)
    estimate = q.depth.estimate()
    assert estimate is not None and estimate.messages == sent  # (in the estimate ...)
    assert q.counted_room() == CAPACITY  # (... not in the room the count left)
    sent = count_and_settle(3)
    size = q.depth.excluded_bytes
    assert q.counted_room() == CAPACITY - (3 + sent) * size


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_squeezed_link_is_topped_up_once_an_eighth_of_its_part_is_free(chunker: Chunker
                                                                         ) -> None:
    """A link whose credit its unsettled deliveries cut is not sent a flow per disposition:
    settlements that free less than 1 / SQUEEZED_TOP_UP of its part of the allowance give
    the client nothing; the one that frees that much tops it up to its part."""
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 10_000))
    s.take()
    sent = _send_while_credit(s, 100)
    part = window_for(len(message(100)), ALLOWANCE)
    step = part // SQUEEZED_TOP_UP  # (48)
    link = _link(s, CAPPED_H)
    assert sent == part and link.squeezed and link.credit.client_credit == 0
    s.server(disposition(SERVER_CH, True, 0, step - 3) + disposition(SERVER_CH, True, step - 2,
                                                                     step - 2))
    to_server, to_client = s.take()
    assert flows(to_client, 7) == [] and to_server == b""
    assert link.unsettled == sent - (step - 1)
    s.server(disposition(SERVER_CH, True, step - 1, step - 1))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, sent) == step
    assert link.unsettled + link.credit.client_credit == part


def test_an_ended_session_leaves_nothing_counted_in_flight() -> None:
    s = Setup(capacity=1_000_000)
    s.server(broker_flow(7, 0, 100_000))
    s.take()
    _send_while_credit(s, 100, most=10)
    q = s.fc.queues[(VHOST, "capped")]
    assert q.in_flight == 10
    s.client(end(0))
    assert q.in_flight == 0 and not s.gate.sessions


def test_deliveries_sent_settled_are_not_counted_in_flight() -> None:
    """A delivery sent settled gets no disposition: it never holds the link's allowance."""
    s = Setup()
    s.server(broker_flow(7, 0, 10_000))
    s.take()
    part = window_for(len(message(100)), ALLOWANCE)
    sent = _send_while_credit(s, 100, settled=True, most=2 * part)  # (82 KB < 100 KB)
    assert sent == 2 * part and not s.fc.tripped
    assert _link(s, CAPPED_H).credit.client_credit > 0
    depth = s.fc.queues[(VHOST, "capped")].depth  # (their counts keep the margin)
    assert depth.forwarded_messages_total == sent and depth.tracked_messages_total == 0


def test_a_detached_link_leaves_nothing_in_flight() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 10_000))
    s.take()
    _send_while_credit(s, 100)
    assert s.gate.sessions[0].in_flight
    s.client(detach(0, CAPPED_H))
    s.server(detach(SERVER_CH, SERVER_HANDLE[CAPPED_H]))
    s.take()
    assert not s.gate.sessions[0].in_flight


def test_the_window_follows_the_message_size() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 1000))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, 0) == WINDOW  # (the assumed size: 24 messages)
    s.send(CAPPED_H, 100)  # small messages: more of them (its allowance of them, less one)
    _, to_client = s.take()
    assert credit_seen(to_client, 7, 1) == window_for(len(message(100)), ALLOWANCE) - 1 == 389
    assert window_for(64 * 1024 * 4) == 1 and window_for(1024) == 64


@pytest.mark.parametrize(("capacity", "max_messages", "window"), [
    (1 << 20, None, WINDOW_BYTES),  # 1 MiB: 64 KiB (capacity / 1024 is 1 KiB)
    (64 << 20, None, WINDOW_BYTES),  # 64 MiB: 64 KiB either way
    (256 << 20, None, 256 << 10),  # 256 MiB: a quarter of a MiB
    (300_000_000, None, 300_000_000 // WINDOW_PARTS),
    (4 << 30, None, MAX_WINDOW_BYTES),  # 4 GiB: at most 1 MiB
    (256 << 20, 1_000_000, WINDOW_BYTES),  # messages limited too: not scaled
])
def test_the_window_is_a_part_of_a_large_capacity(capacity: int, max_messages: int | None,
                                                  window: int) -> None:
    policy = Policy("p", capacity=capacity, max_messages=max_messages)
    assert policy_window(policy) == window
    assert window_for(1024, window) == window // 1024
    assert window_for(100, window) == window // 256  # small messages count as 256 bytes
    assert window_for(window + 1, window) == 1


def test_a_large_capacity_gives_a_larger_allowance_and_bounds_the_overshoot_by_it() -> None:
    """A queue of 256 MiB gives its links a window of 256 KiB of their messages (1 / 1024
    of the capacity) and an in-flight allowance of 512 KiB (1 / 512), not 256 KiB: a lone
    link with no more room than ROOM_PARTS allowances left (further from capacity its part
    is half the room) may have that much in credit and in flight. What it sends past a trip
    stays within it, though the broker settles each delivery at once."""
    capacity = 256 << 20
    s = Setup(capacity=capacity)
    q = s.fc.queues[(VHOST, "capped")]
    policy = q.policy
    allowance = in_flight_allowance(policy)
    assert allowance == capacity // ALLOWANCE_PARTS == 512 << 10
    s.server(broker_flow(7, 0, 100_000))
    s.take()
    # a count leaving ROOM_PARTS allowances of room (after the first grant, made at the
    # assumed size: the count's 100-byte mean would make it 2,048 messages)
    s.sample("capped", capacity - ROOM_PARTS * allowance)
    s.send(CAPPED_H, 1024)
    _, to_client = s.take()
    size = len(message(1024))
    assert q.quiet_bytes - q.depth.forwarded_bytes_total == ROOM_PARTS * allowance - size
    assert policy_window(policy) == 256 << 10
    window = window_for(size, allowance)
    assert window == 508 > window_for(size, IN_FLIGHT_ALLOWANCE) == 254
    assert credit_seen(to_client, 7, 1) == window - 1  # (one unsettled)
    s.sample("capped", capacity - 20 * size)  # 20 messages of room
    sent, limit = 1, 1 + credit_seen(to_client, 7, 1)
    while (VHOST, "capped") not in s.fc.tripped:
        assert sent < limit
        s.server(disposition(SERVER_CH, True, sent - 1, sent - 1))  # (the last one: settled)
        s.send(CAPPED_H, 1024)
        sent += 1
        _, to_client = s.take()
        if flows(to_client, 7):
            limit = sent + credit_seen(to_client, 7, sent)
    while sent < limit:  # the client sends all the credit it has
        s.send(CAPPED_H, 1024)
        sent += 1
    _, to_client = s.take()
    assert flows(to_client, 7) == []
    assert 0 < q.overshoot_messages <= window
    assert q.overshoot_bytes <= window * size <= allowance


@pytest.mark.parametrize(("room", "sharers", "part"), [
    (1 << 30, 1, ROOM_WINDOW_BYTES // ROOM_PARTS),  # room to spare: half the most
    (300_000, 1, 150_000),  # half the room
    (300_000, 3, 50_000),  # shared by three links
    (0, 1, 0), (-1.0, 1, 0),  # none left; armed to evaluate every delivery
    (math.inf, 1, 0), (math.nan, 1, 0),  # the depth not known: no room to share
])
def test_a_links_part_of_the_room(room: float, sharers: int, part: int) -> None:
    assert room_window(room, sharers) == part


def _window_bytes(s: Setup, handle: int) -> int:
    (view,) = [v for v in s.gate.link_views() if v.handle == handle]
    assert view.windowed and view.window_bytes is not None
    return view.window_bytes


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_queue_with_room_gives_a_lone_link_its_allowance_and_the_overshoot_stays_within_it(
        chunker: Chunker) -> None:
    """A 512 KiB queue's policy window is 64 KiB, its in-flight allowance 256 KiB (half the
    capacity: the room is never more than ROOM_PARTS allowances, past which the link's part
    is half the room); a lone link's window is half the room plus the allowance, and its
    credit its allowance, so a fast sender does not wait on the proxy's top-ups; the window
    shrinks with the room, the credit never goes past the allowance, and what the link
    sends past the trip stays within it (its deliveries sent settled: the broker's
    settlements are not what this is about)."""
    capacity = ROOM_PARTS * IN_FLIGHT_ALLOWANCE
    s = Setup(chunker=chunker, capacity=capacity)
    s.server(broker_flow(7, 0, 1_000_000))
    s.take()
    s.send(CAPPED_H, 1024, settled=True)
    _, to_client = s.take()
    size = len(message(1024))
    q = s.fc.queues[(VHOST, "capped")]
    allowance = in_flight_allowance(q.policy)
    assert allowance == IN_FLIGHT_ALLOWANCE  # (256 KiB: capacity / 512 is less)
    room = q.quiet_bytes - q.depth.forwarded_bytes_total
    assert room == capacity - size  # (no count: the estimate is the ledger)
    assert _window_bytes(s, CAPPED_H) == room_window(room, 1) + allowance \
        == (capacity - size) // ROOM_PARTS + allowance
    first = credit_seen(to_client, 7, 1)
    part = window_for(size, allowance)
    assert first == part == 254
    assert first > 4 * window_for(size, policy_window(q.policy))  # (63 messages)
    sent, limit, windows = 1, 1 + first, [_window_bytes(s, CAPPED_H)]
    while (VHOST, "capped") not in s.fc.tripped:  # no count: the estimate is the ledger
        assert sent < limit
        s.send(CAPPED_H, 1024, settled=True)
        sent += 1
        _, to_client = s.take()
        if flows(to_client, 7):
            limit = sent + credit_seen(to_client, 7, sent)
            windows.append(_window_bytes(s, CAPPED_H))
        assert limit - sent <= part  # nothing in flight: its credit is at most its allowance
    assert windows == sorted(windows, reverse=True) and len(windows) > 2
    assert allowance < windows[-1] < windows[0]  # (room left at each: half of it on top)
    while sent < limit:  # the client sends all the credit it has
        s.send(CAPPED_H, 1024, settled=True)
        sent += 1
    _, to_client = s.take()
    assert flows(to_client, 7) == []
    assert 0 < q.overshoot_messages <= part
    assert q.overshoot_bytes <= allowance
    assert capacity < q.depth.forwarded_bytes_total <= capacity + allowance


def test_links_given_a_window_from_one_queue_share_its_room_and_its_allowance() -> None:
    """Two links sending to one queue each get a quarter of its room and half its in-flight
    allowance, not half and all of them: the second one's window is its quarter of the room
    plus half the allowance, and its credit plus its unsettled deliveries stay within half
    the allowance (the queue's room no more than ROOM_PARTS allowances: further from
    capacity they share half the room instead); a link that sent nothing for ROOM_LEASE_S
    no longer counts as sharing them."""
    s = Setup(capacity=ROOM_PARTS * IN_FLIGHT_ALLOWANCE)
    s.server(broker_flow(7, 0, 1_000_000) + broker_flow(9, 0, 1_000_000))
    s.take()
    q = s.fc.queues[(VHOST, "capped")]
    allowance = in_flight_allowance(q.policy)  # (256 KiB)
    assert q.quiet_bytes == ROOM_PARTS * allowance  # (the room, before anything is sent)

    def room() -> float:
        return q.quiet_bytes - q.depth.forwarded_bytes_total

    s.send(CAPPED_H, 1024)
    s.take()
    assert _window_bytes(s, CAPPED_H) == room_window(room(), 1) + allowance
    s.send(ANON_H, 1024, to="/amq/queue/capped")
    s.take()
    assert _window_bytes(s, ANON_H) == room_window(room(), 2) + allowance // 2 \
        == int(room()) // (2 * ROOM_PARTS) + allowance // 2
    assert sorted(q.room_leases) == [(1, link_ref(0, CAPPED_H)), (1, link_ref(0, ANON_H))]
    anon = _link(s, ANON_H)
    assert anon.credit.client_credit + anon.unsettled \
        == window_for(anon.typical_bytes, allowance // 2)
    s.clock.t += ROOM_LEASE_S + 0.1
    for _ in range(window_for(anon.typical_bytes, allowance // 2) // 2):
        s.send(ANON_H, 1024, to="/amq/queue/capped")  # through a top-up: alone again
    s.take()
    assert _window_bytes(s, ANON_H) == room_window(room(), 1) + allowance
    assert list(q.room_leases) == [(1, link_ref(0, ANON_H))]
    assert anon.credit.client_credit + anon.unsettled == window_for(anon.typical_bytes, allowance)


def test_room_leases_expire_oldest_first_however_many_links() -> None:
    """A client that attaches thousands of links leaves as many leases; they expire a
    second later, in the order they were taken, at the next link's grant."""
    s = Setup()
    q = s.fc.queues[(VHOST, "capped")]
    assert [q.room_sharers((1, ref), 0.0) for ref in range(10_000)][-1] == 10_000
    assert q.room_sharers((1, 5), 0.5) == 10_000  # renewed: now the newest
    assert q.room_sharers((2, 0), ROOM_LEASE_S + 0.1) == 2  # (1, 5) and itself
    assert list(q.room_leases) == [(1, 5), (2, 0)]


def test_a_multi_frame_transfer_counts_once_and_books_all_its_bytes() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 1000))
    s.take()
    big = message(1500)
    frames = (transfer(0, CAPPED_H, 0, big[:500], more=True)
              + continuation(0, CAPPED_H, big[500:1000], more=True)
              + continuation(0, CAPPED_H, big[1000:], more=False))
    s.client(frames)
    to_server, _ = s.take()
    assert to_server == frames
    q = s.fc.queues[(VHOST, "capped")]
    assert q.depth.forwarded_messages_total == 1
    assert q.depth.forwarded_bytes_total == len(big)
    link = _link(s, CAPPED_H)
    # one delivery counted, and in flight; the credit follows the size seen: the allowance
    # of 1.5 KB messages, less the one unsettled
    assert link.credit.delivery_count == 1 and link.unsettled == 1
    assert link.credit.client_credit == window_for(len(big), ALLOWANCE) - 1


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_trip_withholds_credit_and_the_release_restores_it(chunker: Chunker) -> None:
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 1000) + broker_flow(8, 0, 1000))
    _, to_client = s.take()
    limit = credit_seen(to_client, 7, 0)  # the client's limit: 0 + credit
    n = 0
    while (VHOST, "capped") not in s.fc.tripped:
        s.send(CAPPED_H, 20_000)
        n += 1
    to_server, to_client = s.take()
    assert n == 5  # 5 x ~20 KB > 100 KB
    assert flows(to_client, 7) == []  # the limit the client has is not taken back
    assert s.fc.is_blocked(1, link_ref(0, CAPPED_H))
    blocked = s.fc.blocked_channels()
    assert [(b.conn_id, b.channel) for b in blocked] == [(1, link_ref(0, CAPPED_H))]
    # what it would send with credit (its window) is its demand to a fleet: it holds nothing
    assert blocked[0].wants_bytes == policy_window(s.fc.queues[(VHOST, "capped")].policy)
    # the free link on the same session goes on, byte for byte
    free = b"".join(s.send(FREE_H, 20_000) for _ in range(5))
    to_server, to_client = s.take()
    assert to_server == free and flows(to_client, 7) == []
    # what the client still had credit for is forwarded and counted as overshoot
    q = s.fc.queues[(VHOST, "capped")]
    sent = b"".join(s.send(CAPPED_H, 100) for _ in range(limit - n))
    n = limit
    to_server, to_client = s.take()
    assert to_server == sent and to_client == b""
    assert q.overshoot_messages == limit - 5 and q.overshoot_bytes > 0
    # the broker grants again while tripped: the client still sees no more than it had
    s.server(broker_flow(7, n, 1000))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, n) == 0
    # nor when the broker settles what it got (its allowance free again)
    s.server(disposition(SERVER_CH, True, 0, s.next_id - 1))
    _, to_client = s.take()
    assert flows(to_client, 7) == [] and _link(s, CAPPED_H).unsettled == 0
    # release: the proxy sends the flow itself, the link's part of the allowance
    s.sample("capped", 500)
    assert (VHOST, "capped") not in s.fc.tripped
    _, to_client = s.take()
    assert s.notified == 1
    assert credit_seen(to_client, 7, n) == window_for(_link(s, CAPPED_H).typical_bytes,
                                                      ALLOWANCE)
    assert s.fc.blocked_channels() == []
    assert s.counters.signals == {("amqp10", "flow_off"): 1, ("amqp10", "flow_on"): 1}


def test_a_held_link_is_admitted_in_its_turn_and_its_credit_reserved_on_the_tokens() -> None:
    """While its queue is held, a withheld link is admitted in the round robin with the 0-9-1
    channels waiting on the queue: credit for what the tokens hold (at most its window),
    reserved on them until its transfers come, so a publish later in the round is not
    admitted on the same tokens; what it sends on that credit is admitted, not overshoot,
    and the link stays blocked."""
    s = Setup()
    key, ref = (VHOST, "capped"), link_ref(0, CAPPED_H)
    s.server(broker_flow(7, 0, 1000))
    _, to_client = s.take()
    limit = credit_seen(to_client, 7, 0)
    for _ in range(limit):  # 5 trip it, the rest on the credit the client had: overshoot
        s.send(CAPPED_H, 20_000)
    q = s.fc.queues[key]
    assert key in s.fc.tripped and s.fc.is_blocked(1, ref)
    overshoot = q.overshoot_messages
    assert s.fc.block(2, 1, frozenset({key}), s.clock.t)  # a 0-9-1 channel waits on it too
    s.take()
    t = s.clock.t
    granted: list[list[object]] = []
    for i in range(1, 10):  # counts: 3 messages ready (60 KB, above resume), draining
        s.clock.t = t + i * 0.05
        s.fc.sampled_ready_count(key, s.clock.t - 0.001, 3, 0.001, s.clock.t)
        s.board.settle()
        granted = flows(s.take()[1], 7)
        if granted:
            break
    assert granted, "never admitted"
    admitted = num(granted[-1][5]) + num(granted[-1][6]) - limit
    assert 0 < admitted <= window_for(20_000, policy_window(q.policy))
    mine = s.fc.admission_room(frozenset({key}), s.clock.t, 1, ref)
    theirs = s.fc.admission_room(frozenset({key}), s.clock.t)
    assert mine is not None and theirs is not None
    assert theirs[1] == mine[1] - admitted and theirs[0] < mine[0]
    assert s.fc.is_blocked(1, ref) and s.counters.signals.get(("amqp10", "flow_on")) is None
    (view,) = [v for v in s.gate.link_views() if v.handle == CAPPED_H]
    assert (view.credit, view.admitted_credit) == (admitted, admitted)  # (/state shows it)
    for _ in range(admitted):
        s.send(CAPPED_H, 20_000)
    s.take()
    (view,) = [v for v in s.gate.link_views() if v.handle == CAPPED_H]
    assert (view.credit, view.admitted_credit) == (0, 0)
    assert s.fc.admission_room(frozenset({key}), s.clock.t) == \
        s.fc.admission_room(frozenset({key}), s.clock.t, 1, ref)  # nothing reserved any more
    assert q.overshoot_messages == overshoot and s.fc.is_blocked(1, ref)


def test_links_alone_on_a_held_queue_wait_for_its_release() -> None:
    """No 0-9-1 channel waits on the held queue (nor other fleet members feed it): its links
    are not admitted while it is held (they wait for the release at the resume level)."""
    s = Setup()
    key = (VHOST, "capped")
    s.server(broker_flow(7, 0, 1000))
    limit = credit_seen(s.take()[1], 7, 0)
    for _ in range(limit):
        s.send(CAPPED_H, 20_000)
    s.take()
    t = s.clock.t
    for i in range(1, 10):
        s.clock.t = t + i * 0.05
        s.fc.sampled_ready_count(key, s.clock.t - 0.001, 3, 0.001, s.clock.t)
        s.board.settle()
        assert flows(s.take()[1], 7) == []
    assert s.board.admitted and key in s.fc.tripped  # (its turns came: it took none)


def test_a_link_attached_while_its_queue_is_tripped_gets_no_credit() -> None:
    s = Setup()
    s.sample("capped", 500_000)
    s.server(broker_flow(7, 0, 1000))
    _, to_client = s.take()
    assert credit_seen(to_client, 7, 0) == 0
    s.sample("capped", 0)
    _, to_client = s.take()
    assert credit_seen(to_client, 7, 0) == WINDOW


@pytest.mark.parametrize("chunker", CHUNKERS)
def test_a_transfer_beyond_every_grant_detaches_the_link(chunker: Chunker) -> None:
    s = Setup(chunker=chunker)
    s.server(broker_flow(7, 0, 2) + broker_flow(8, 0, 1000))
    s.take()
    ok = s.send(CAPPED_H) + s.send(CAPPED_H)
    s.take()
    bad = s.send(CAPPED_H)
    later = s.send(CAPPED_H)
    free = s.send(FREE_H)
    to_server, to_client = s.take()
    assert ok and bad and later
    # the broker gets a detach instead of the transfers, and the free link's transfer
    got = performatives(to_server)
    assert [code for code, _ in got] == [DETACH, TRANSFER]
    assert got[0][1][0] == CAPPED_H and got[0][1][1] is True
    # ... numbered as the broker counts: client ids 2 and 3 never reached it, 4 is its 2
    assert to_server.endswith(amqp(TRANSFER, 0, message(100), handle=UInt(FREE_H),
                                   delivery_id=UInt(2), delivery_tag=(4).to_bytes(4, "big"),
                                   message_format=UInt(0)))
    assert free.endswith(message(100))
    detached = performatives(to_client)
    assert [code for code, _ in detached] == [DETACH]
    assert detached[0][1][0] == 7
    error = detached[0][1][2]
    assert isinstance(error, Described)
    assert error.value[0] == Symbol("amqp:link:transfer-limit-exceeded")  # type: ignore[index]
    # both replies are absorbed; the session's transfer-ids are shifted by the 2 dropped
    s.client(detach(0, CAPPED_H))
    s.server(detach(SERVER_CH, 7) + broker_flow(8, 1, 1000, next_incoming=3))
    to_server, to_client = s.take()
    assert to_server == b""
    f = flows(to_client, 8)[0]
    assert f[0] == 5  # next-incoming-id 3 + 2 dropped frames
    s.client(client_flow(FREE_H, 1, 999, next_outgoing=5))
    to_server, _ = s.take()
    assert flows(to_server)[0][2] == 3


def test_drain_and_echo_keep_their_meaning() -> None:
    s = Setup()
    s.server(broker_flow(7, 0, 100, drain=True))
    _, to_client = s.take()
    f = flows(to_client, 7)[0]
    assert (f[5], f[6], f[8]) == (0, WINDOW, True)
    # the client has nothing to send: it advances its count to what it was given
    s.client(client_flow(CAPPED_H, WINDOW, 0, drain=True))
    to_server, _ = s.take()
    f = flows(to_server, CAPPED_H)[0]
    assert (f[5], f[6], f[8]) == (100, 0, True)  # the whole broker grant is drained
    # echo: the broker asks, the client answers, counts translated both ways
    s.server(broker_flow(7, 100, 10, echo=True))
    _, to_client = s.take()
    f = flows(to_client, 7)[0]
    assert (f[5], f[6], f[9]) == (WINDOW, 10, True)
    s.client(client_flow(CAPPED_H, WINDOW, 10))
    to_server, _ = s.take()
    f = flows(to_server, CAPPED_H)[0]
    assert (f[5], f[6]) == (100, 10)


def test_delivery_counts_wrap_around() -> None:
    start = MASK - 5
    s = Setup(initial=start)
    s.server(broker_flow(7, start, 1000))
    s.take()
    for _ in range(40):
        s.send(CAPPED_H, 10)
    _, to_client = s.take()
    last = flows(to_client, 7)[-1]
    limit = serial_add(num(last[5]), num(last[6]))
    # none settled: the limit is the link's part of the allowance from where it started
    assert serial_add(limit, -start) == window_for(len(message(10)), ALLOWANCE)
    assert serial_add(limit, -serial_add(start, 40)) > 0
    link = _link(s, CAPPED_H)
    assert link.credit.delivery_count == serial_add(start, 40)


def test_anonymous_multi_frame_delivery_to_a_tripped_queue_is_forwarded_then_held_by_credit(
        ) -> None:
    """A delivery that spans frames is not held per message (``enforce.amqp10.held``): it is
    forwarded, and the link's credit withheld until its queue drains."""
    s = Setup()
    s.server(broker_flow(9, 0, 1000))
    _, to_client = s.take()
    # per-message links are always capped: by the policy window while they feed no policed
    # queue (no allowance of one counts on them)
    assert credit_seen(to_client, 9, 0) == window_for(ASSUMED_MESSAGE_BYTES, WINDOW_BYTES)
    s.send(ANON_H, 100, to="/amq/queue/free")
    s.take()
    s.sample("capped", 500_000)
    body = message(100, "/amq/queue/capped")
    msg = transfer(0, ANON_H, 1, body[:30], more=True) + continuation(0, ANON_H, body[30:],
                                                                       more=False)
    s.client(msg)
    to_server, to_client = s.take()
    assert to_server == msg
    assert flows(to_client, 9) == []  # no more credit (what it has is not taken back)
    assert s.fc.is_blocked(1, link_ref(0, ANON_H))
    s.sample("capped", 0)
    _, to_client = s.take()
    assert credit_seen(to_client, 9, 2) > 0


def test_anonymous_sender_under_reject_gets_rejected_and_keeps_its_credit() -> None:
    s = Setup(overflow="reject")
    s.server(broker_flow(9, 0, 1000))
    s.take()
    s.sample("capped", 500_000)
    s.send(ANON_H, 100, to="/amq/queue/capped")
    s.send(ANON_H, 100, to="/amq/queue/free")
    to_server, to_client = s.take()
    # the rejected one never reaches the broker; the next one takes its delivery-id
    assert to_server == amqp(TRANSFER, 0, message(100, "/amq/queue/free"),
                             handle=UInt(ANON_H), delivery_id=UInt(0),
                             delivery_tag=(1).to_bytes(4, "big"), message_format=UInt(0))
    got = performatives(to_client)
    assert got[0][0] == DISPOSITION
    assert all(f[6] != 0 for f in flows(to_client, 9))  # credit is never withheld
    fields = got[0][1]
    assert fields[0] is True and fields[1] == 0 and fields[3] is True
    state = fields[4]
    assert isinstance(state, Described) and state.descriptor == 0x25
    assert s.counters.rejects == 1
    assert s.fc.blocked_channels() == []
    # the broker's flows are shifted by the dropped frame and the dropped delivery
    s.server(broker_flow(9, 1, 999, next_incoming=1))
    _, to_client = s.take()
    f = flows(to_client, 9)[0]
    assert f[0] == 2  # next-incoming-id + 1 dropped
    assert (f[5], f[6]) == (2, window_for(106))  # the client counts 2, the broker 1


def test_receiver_deliveries_feed_the_ledger() -> None:
    s = Setup()
    body = data_section(b"y" * 10)
    s.server(transfer(SERVER_CH, 10, 0, body)
             + transfer(SERVER_CH, 10, 1, body[:5], more=True)
             + continuation(SERVER_CH, 10, body[5:], more=False))
    _, to_client = s.take()
    assert len(performatives(to_client)) == 3
    assert s.fc.queues[(VHOST, "capped")].depth.delivered_messages_total == 2


def test_message_routing_reads_to_and_subject() -> None:
    header = encode(Described(ULong(0x70), [True]))
    props = encode(Described(ULong(0x73), [None, None, "/queues/a%2Fb", "subj"]))
    payload = header + props + data_section(b"z")
    assert message_routing(payload, 0, len(payload)) == ("/queues/a%2Fb", "subj")
    assert message_routing(data_section(b"z"), 0, 4) is None
    assert message_routing(data_section(b"z"), 0, len(data_section(b"z"))) == (None, None)


def test_without_policies_flow_and_transfer_frames_are_not_read() -> None:
    core = Connection(AMQP_HEADER)
    assert core.gate is None
    data = open_("c") + begin(0) + transfer(0, 5, 0, b"\xff\xff")  # undecodable payload: unread
    core.receive_from_client(data, 0.0)
    assert core.data_for_server() == data and core.failure is None


def test_a_malformed_flow_closes_the_connection_with_decode_error() -> None:
    s = Setup()
    bad = amqp(FLOW, 0, next_incoming_id=UInt(0), incoming_window=UInt(1),
               next_outgoing_id=UInt(0), outgoing_window=UInt(1), handle="nope")
    s.client(bad)
    assert s.core.failure is not None
    assert s.core.failure.condition == "amqp:decode-error"


def renumbered() -> tuple[Setup, bytes]:
    """A session the proxy consumed deliveries of (rejected under ``overflow: reject``): the
    client's ids 0..4, 1 and 3 dropped; and what the broker got."""
    s = Setup(overflow="reject")
    s.server(broker_flow(9, 0, 1000))
    s.take()
    s.sample("capped", 500_000)
    for to in ("free", "capped", "free", "capped", "free"):  # ids 0..4; 1 and 3 dropped
        s.send(ANON_H, 100, to=f"/amq/queue/{to}")
    return s, s.take()[0]


def test_delivery_ids_are_translated_around_what_the_proxy_settled() -> None:
    """The broker numbers only the deliveries it got (consecutive, 2.7.5); its dispositions
    are mapped back to the client's ids range by range, and the client's to the broker's."""
    s, to_server = renumbered()
    assert [num(f[1]) for code, f in performatives(to_server) if code == TRANSFER] == [0, 1, 2]
    accepted = Described(ULong(0x24), [])
    s.server(amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(0), last=UInt(2),
                  settled=True, state=accepted)
             + amqp(DISPOSITION, SERVER_CH, role=True, first=UInt(1), settled=True,
                    state=accepted))
    _, to_client = s.take()
    ranges = [(f[1], f[2]) for code, f in performatives(to_client) if code == DISPOSITION]
    assert ranges == [(0, 0), (2, 2), (4, 4), (2, 2)]
    # the client settling its own: 0..4 is the broker's 0..2; 3 alone was never the broker's
    s.client(amqp(DISPOSITION, 0, role=False, first=UInt(0), last=UInt(4), settled=True)
             + amqp(DISPOSITION, 0, role=False, first=UInt(3), settled=True)
             + amqp(DISPOSITION, 0, role=False, first=UInt(4), settled=True))
    to_server, _ = s.take()
    ranges = [(f[1], f[2]) for code, f in performatives(to_server) if code == DISPOSITION]
    assert ranges == [(0, 2), (2, 2)]


@pytest.mark.parametrize("next_incoming", [None, 0, 7, 300, MASK])
@pytest.mark.parametrize("drain", [False, True])
def test_grant_flows_are_the_bytes_the_generic_encoder_makes(next_incoming: int | None,
                                                             drain: bool) -> None:
    from floodwall.enforce.amqp10.links import grant_flow_body
    from floodwall.wire.amqp10.performatives import encode_performative

    for numbers in ([0, 0, 0, 0, 0, 0], [1, 255, 256, 65535, 2**31, MASK], [5000, 3, 9, 7, 16, 1]):
        window_in, next_out, window_out, handle, count, credit = numbers
        assert grant_flow_body(next_incoming, window_in, next_out, window_out, handle, count,
                               credit, drain) == encode_performative(
            FLOW, next_incoming_id=None if next_incoming is None else UInt(next_incoming),
            incoming_window=UInt(window_in), next_outgoing_id=UInt(next_out),
            outgoing_window=UInt(window_out), handle=UInt(handle), delivery_count=UInt(count),
            link_credit=UInt(credit), drain=drain or None)


def test_a_link_without_credit_past_the_deadline_is_detached() -> None:
    """What a 0-9-1 publisher gets at the deadline, in 1.0 terms: the link is detached with
    amqp:resource-limit-exceeded naming the queue; counted; the broker's end detached too."""
    s = Setup(policy_extra="    deadline: 5s\n")
    s.server(broker_flow(7, 0, 1000) + broker_flow(8, 0, 1000))
    _, to_client = s.take()
    limit = credit_seen(to_client, 7, 0)
    s.sample("capped", 500_000)
    gate = s.board  # as the relay's expiry timer: the gate's output is carried out
    ref = link_ref(0, CAPPED_H)
    s.send(CAPPED_H)  # the trip withholds more credit; the client has limit - 1 left
    assert s.fc.is_blocked(1, ref)
    t0 = s.clock.t
    assert gate.expire(t0) == 0  # it still has credit: not starved
    assert s.fc.blocked_channels()[0].starved_since is None
    for _ in range(limit - 1):
        s.send(CAPPED_H)
    s.take()
    assert gate.expire(t0 + 1) == 0  # out of credit from now (seen at this call)
    assert s.fc.blocked_channels()[0].starved_since == t0 + 1
    assert gate.expire(t0 + 5.9) == 0  # 4.9 s without credit: within the deadline
    assert gate.expire(t0 + 6.0) == 1
    to_server, to_client = s.take()
    (code, fields), = performatives(to_client)
    assert code == DETACH and fields[0] == SERVER_HANDLE[CAPPED_H] and fields[1] is True
    error = fields[2]
    assert isinstance(error, Described)
    assert error.value[0] == Symbol("amqp:resource-limit-exceeded")
    assert "queue 'capped'" in error.value[1] and "5s deadline" in error.value[1]
    assert performatives(to_server)[0][0] == DETACH
    assert s.counters.deadline_expiries == 1 and s.fc.blocked_channels() == []
    assert s.notified == 1
    # both peers' answering detaches are absorbed; the free link goes on
    s.client(detach(0, CAPPED_H))
    s.server(detach(SERVER_CH, SERVER_HANDLE[CAPPED_H]))
    free = s.send(FREE_H)
    to_server, to_client = s.take()
    assert to_server == free and to_client == b""


def test_a_release_before_the_deadline_restarts_the_wait() -> None:
    s = Setup(policy_extra="    deadline: 5s\n")
    s.server(broker_flow(7, 0, 1000))
    _, to_client = s.take()
    limit = credit_seen(to_client, 7, 0)
    s.sample("capped", 500_000)
    for _ in range(limit):
        s.send(CAPPED_H)
    gate = s.board  # as the relay's expiry timer: the gate's output is carried out
    t0 = s.clock.t
    gate.expire(t0)
    s.sample("capped", 0)  # released at t0 + 1: credit again
    s.sample("capped", 500_000)
    assert gate.expire(t0 + 10) == 0  # blocked again but not out of credit
    assert s.counters.deadline_expiries == 0


# -- the top-up shortcut -------------------------------------------------------------------
# ``LinkCredit.after_transfer`` skips working out a window while the client has over half its
# ceiling left: no window could top it up then. Whatever happens, the bytes both peers get
# must be the ones the gate gives when it works the window out after every transfer.
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from([CAPPED_H, FREE_H]),
              st.sampled_from([10, 900, 1500, 5000, 20_000]), st.integers(1, 40)),
    st.tuples(st.just("settle"), st.integers(0, 3)),
    st.tuples(st.just("sample"), st.sampled_from([0, 40_000, 80_000, 99_000, 120_000])),
    st.tuples(st.just("grant"), st.integers(0, 3)),
), max_size=25)


def _run_steps(steps: list[tuple[object, ...]], scale: int = 1) -> list[tuple[bytes, bytes]]:
    """``scale``: the capacity and the samples that many times the usual (2,560: 256 MB, a
    window of 250,000 bytes instead of 64 KiB)."""
    s = Setup(capacity=CAPACITY * scale)
    s.server(broker_flow(7, 0, 5000) + broker_flow(8, 0, 5000))
    out = [s.take()]
    settled = 0
    for step in steps:
        if step[0] == "send":
            _, handle, size, n = step
            for _ in range(int(n)):  # type: ignore[call-overload]
                link = s.gate.sessions[0].links[int(handle)]  # type: ignore[call-overload]
                if link.credit.client_credit == 0:  # type: ignore[union-attr]
                    break
                s.send(int(handle), int(size))  # type: ignore[call-overload]
        elif step[0] == "settle" and s.next_id > settled:
            s.server(disposition(SERVER_CH, True, settled, s.next_id - 1))
            settled = s.next_id
        elif step[0] == "sample":
            s.sample("capped", int(step[1]) * scale)  # type: ignore[call-overload]
        elif step[0] == "grant":
            s.server(broker_flow(7, None, 5000))
        out.append(s.take())
    return out


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS, scale=st.sampled_from([1, 2560]))
def test_the_top_up_shortcut_changes_no_byte(steps: list[tuple[object, ...]], scale: int
                                             ) -> None:
    from floodwall.wire.amqp10.credit import SenderCredit
    with_shortcut = _run_steps(steps, scale)
    original = SenderCredit.has_over_half
    SenderCredit.has_over_half = lambda self, window: False  # type: ignore[method-assign]
    try:
        without = _run_steps(steps, scale)
    finally:
        SenderCredit.has_over_half = original  # type: ignore[method-assign]
    assert with_shortcut == without
