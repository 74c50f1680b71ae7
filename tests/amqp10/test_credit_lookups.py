"""The AMQP 1.0 credit gate and lookups, driven by bytes: a link whose target the model does
not know gets no credit until the broker was asked; a link that may come to feed a policed
queue is capped by the window; one that becomes policed gets none until its queue's first
figure, then its part of the queue's in-flight allowance."""

from __future__ import annotations

from floodwall.control.controller import FlowController, in_flight_allowance
from floodwall.control.lookups import Lookup, LookupKind, LookupResult
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.amqp10.links import ASSUMED_MESSAGE_BYTES, SenderLink, window_for
from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import AMQP_HEADER
from tests.amqp10.streams import begin, open_, transfer
from tests.amqp10.test_credit_gate import broker_flow, credit_seen, flows, link_attach, message
from tests.fakes import Board, Clock

POLICIES = """
version: 1
policies:
  - {name: orders, match: {vhost: "/", queue: "orders.*"}, capacity: 100000, resume: 50000}
"""
SERVER_CH = 3
WINDOW = window_for(ASSUMED_MESSAGE_BYTES)  # the policy's window, at the assumed size
BODY = len(message(100))  # the payload of ``Link.send``'s messages


class Link:
    """One sender link to ``target`` on a gated connection, the model a real Topology."""

    def __init__(self, target: str, topology: Topology | None = None) -> None:
        self.now = [1000.0]
        self.topology = topology or Topology()
        self.topology.declare_vhost("/")
        self.fc = FlowController(self.topology, parse_policies(POLICIES))
        self.board = Board(self.fc, Clock(self.now[0]))
        self.gate = CreditFlow(self.board.enforcement, 1)
        self.core = Connection(AMQP_HEADER, self.gate, conn_id=1)
        self.board.attach(1, self.core, self.gate)
        self.core.receive_from_client(open_("client") + begin(0)
                                      + link_attach(0, "l", 0, False, target), self.now[0])
        self.core.receive_from_server(AMQP_HEADER + open_("broker")
                                      + begin(SERVER_CH, remote_channel=0)
                                      + link_attach(SERVER_CH, "l", 7, True, target), self.now[0])
        self.take()
        self.next_id = 0

    def take(self) -> tuple[bytes, bytes]:
        return self.core.data_for_server(), self.core.data_for_client()

    def broker_grants(self, credit: int = 1000) -> bytes:
        self.core.receive_from_server(broker_flow(7, 0, credit), self.now[0])
        return self.take()[1]

    def send(self, size: int = 100) -> None:
        self.core.receive_from_client(transfer(0, 0, self.next_id, message(size)), self.now[0])
        self.next_id += 1

    def sender(self) -> SenderLink:
        link = self.gate.sessions[0].links[0]
        assert isinstance(link, SenderLink)
        return link

    def allowance(self, queue: str) -> int:
        """The in-flight allowance of ``queue`` (bytes): the link's part of it, alone."""
        return in_flight_allowance(self.fc.queues[("/", queue)].policy)


def test_a_link_to_an_unknown_queue_gets_credit_once_the_lookup_is_answered() -> None:
    link = Link("/amq/queue/orders.new")
    to_client = link.broker_grants()
    assert credit_seen(to_client, 7, 0) == 0  # withheld: the model has never heard of it
    lookup = Lookup("/", LookupKind.QUEUE, "orders.new")
    assert link.fc.lookups.take_due() == [lookup]
    link.topology.declare_queue("/", "orders.new")
    link.fc.queue_seen(("/", "orders.new"), link.now[0])
    link.fc.sampled_ready_count(("/", "orders.new"), link.now[0], 0, None, link.now[0])
    link.fc.lookup_answered(lookup, LookupResult.FOUND, link.now[0])
    link.board.settle()
    _, to_client = link.take()
    # policed, its queue empty: the link alone may have its queue's whole in-flight allowance
    # in credit (no message seen yet: at the assumed size)
    assert credit_seen(to_client, 7, 0) == window_for(ASSUMED_MESSAGE_BYTES,
                                                      link.allowance("orders.new"))


def test_a_link_to_an_absent_queue_a_policy_matches_is_capped_all_the_same() -> None:
    link = Link("/amq/queue/orders.later")
    link.broker_grants()
    link.fc.lookup_answered(Lookup("/", LookupKind.QUEUE, "orders.later"),
                            LookupResult.ABSENT, link.now[0])
    link.board.settle()
    _, to_client = link.take()
    # It may be declared elsewhere at any moment: one window, never the broker's 1000.
    assert credit_seen(to_client, 7, 0) == WINDOW


def test_links_that_cannot_become_policed_get_the_brokers_credit_as_it_was() -> None:
    link = Link("/amq/queue/audit")  # no policy matches audit
    grant = broker_flow(7, 0, 1000)
    link.core.receive_from_server(grant, link.now[0])
    assert link.take()[1] == grant


def test_a_link_to_an_exchange_that_becomes_policed_waits_for_the_first_figure() -> None:
    link = Link("/exchange/amq.direct/orders.late")
    to_client = link.broker_grants()
    assert credit_seen(to_client, 7, 0) == WINDOW  # capped: a binding may come any moment
    link.send()
    _, to_client = link.take()
    limit = credit_seen(to_client, 7, 0)  # topped up to a window of its 105-byte messages
    assert limit == 1 + window_for(BODY)
    # Made elsewhere: the queue and its binding (an event), and its first figure.
    link.topology.bind_queue("/", "orders.late", "amq.direct", "orders.late")
    link.fc.queue_seen(("/", "orders.late"), link.now[0])
    link.send()
    _, to_client = link.take()
    # Waits for the queue's first figure: no top-up, and no flow that takes back the limit
    # the client holds (proton would wrap a negative credit; see floodwall/wire/amqp10/credit.py).
    assert flows(to_client, 7) == []
    link.fc.sampled_ready_count(("/", "orders.late"), link.now[0], 0, None, link.now[0])
    link.board.settle()
    _, to_client = link.take()
    # policed now: its part of the queue's in-flight allowance, less its 2 deliveries the
    # broker has not settled (credit plus unsettled within the allowance)
    assert link.sender().unsettled == 2
    assert credit_seen(to_client, 7, 2) == window_for(BODY, link.allowance("orders.late")) - 2
    assert link.fc.queues[("/", "orders.late")].depth.forwarded_messages_total == 1


def test_a_link_holding_the_brokers_credit_gets_no_more_when_a_reload_polices_it() -> None:
    """A reload that polices a queue a link already holds the broker's credit for cannot
    take that credit back (a flow lowering the limit below what the client may have sent
    makes proton's credit wrap): the link gets no top-up until the queue's first figure,
    and the overshoot it can still cause is bounded by the broker's grant before the
    reload (docs/operations.md, "What clients see")."""
    link = Link("/amq/queue/audit")
    link.topology.declare_queue("/", "audit")
    link.core.receive_from_server(broker_flow(7, 0, 1000), link.now[0])
    link.take()  # the broker's 1000 passed as they were
    link.fc.set_policies(parse_policies(POLICIES.replace('"orders.*"', '"audit"')),
                         [("/", "audit")], link.now[0])
    link.board.settle()
    link.send()
    _, to_client = link.take()
    assert flows(to_client, 7) == []  # no top-up; the 999 it holds stand
    link.fc.sampled_ready_count(("/", "audit"), link.now[0], 0, None, link.now[0])
    link.board.settle()
    _, to_client = link.take()
    # Its first figure: the grant is the window on top of what it has used, but never
    # below the limit it holds (1000).
    assert credit_seen(to_client, 7, 1) == 999
    # the broker tops up its own
    link.core.receive_from_server(broker_flow(7, 1, 1000), link.now[0])
    _, to_client = link.take()
    assert credit_seen(to_client, 7, 1) == 999  # capped: nothing beyond the limit held
