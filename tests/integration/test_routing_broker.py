"""The routing model against a real RabbitMQ: predicted queue sets equal where messages land."""

from __future__ import annotations

import os
import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import pika
import pika.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from floodwall.control.routing import Topology
from floodwall.dev.devbroker import BrokerEndpoint

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

EXAMPLES = int(os.environ.get("FLOODWALL_ROUTING_EXAMPLES", "50"))
TYPES = ("direct", "fanout", "topic", "headers")
HEADER_KEYS = ("h1", "h2", "x-h")
# Binding values: None is AMQP void (presence only). No decimals: the management API
# renders them wrongly (see floodwall.control.routing), and no floats: pika cannot send them.
BINDING_VALUES = (1, 0, "1", "a", True, None)
HEADER_VALUES = (1, 0, "1", "a", True, False, None, b"a", Decimal("1"),
                 datetime(1970, 1, 1, 0, 0, 1))


# --------------------------------------------------------------------------- scenarios

@dataclass
class ExchangeSpec:
    name: str
    type: str
    internal: bool
    auto_delete: bool
    alternate: str | None  # an exchange name placeholder, "" or "missing"


@dataclass
class Op:
    kind: str  # bind_queue | bind_exchange | unbind | delete_queue | delete_exchange
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    arguments: dict[str, object] = field(default_factory=dict)
    target: int = 0  # for unbind: which earlier bind op
    altered: bool = False  # for unbind: a key that was never bound (a no-op)


@dataclass
class Message:
    routing_key: str
    headers: dict[str, object] | None


@dataclass
class Scenario:
    queues: list[str]
    exchanges: list[ExchangeSpec]
    policy_alternate: str | None
    ops: list[Op]
    messages: list[Message]


routing_words = st.lists(st.sampled_from(["a", "b", ""]), max_size=3).map(".".join)
binding_keys = st.one_of(
    routing_words, st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=3).map(".".join))


@st.composite
def binding_arguments(draw: st.DrawFn) -> dict[str, object]:
    if draw(st.integers(0, 3)) == 0:
        return {}
    args: dict[str, object] = {
        k: draw(st.sampled_from(BINDING_VALUES))
        for k in draw(st.lists(st.sampled_from(HEADER_KEYS), max_size=3, unique=True))}
    mode = draw(st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"]))
    if mode is not None:
        args["x-match"] = mode
    return args


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    queues = [f"q{i}" for i in range(draw(st.integers(2, 4)))]
    n_exchanges = draw(st.integers(2, 6))
    xnames = [f"x{i}" for i in range(n_exchanges)]
    exchanges = [
        ExchangeSpec(
            name=name,
            type=draw(st.sampled_from(TYPES)),
            internal=draw(st.integers(0, 4)) == 0,
            auto_delete=draw(st.integers(0, 3)) == 0,
            alternate=draw(st.one_of(st.none(), st.none(), st.sampled_from(xnames),
                                     st.sampled_from(["", "missing"]))),
        )
        for name in xnames
    ]
    policy_alternate = draw(st.one_of(st.none(), st.none(), st.sampled_from(xnames)))
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.booleans()):
            ops.append(Op("bind_queue", destination=draw(st.sampled_from(queues)),
                          source=draw(st.sampled_from(xnames)),
                          routing_key=draw(binding_keys), arguments=draw(binding_arguments())))
        else:
            ops.append(Op("bind_exchange", destination=draw(st.sampled_from(xnames)),
                          source=draw(st.sampled_from(xnames)),
                          routing_key=draw(binding_keys), arguments=draw(binding_arguments())))
    binds = len(ops)
    for _ in range(draw(st.integers(0, 3))):
        ops.append(Op("unbind", target=draw(st.integers(0, binds - 1)),
                      altered=draw(st.integers(0, 4)) == 0))
    if draw(st.integers(0, 3)) == 0:
        ops.append(Op("delete_queue", destination=draw(st.sampled_from(queues))))
    if draw(st.integers(0, 3)) == 0:
        ops.append(Op("delete_exchange", destination=draw(st.sampled_from(xnames))))
    messages = [draw(messages_for(queues)) for _ in range(draw(st.integers(1, 5)))]
    return Scenario(queues, exchanges, policy_alternate, ops, messages)


@st.composite
def messages_for(draw: st.DrawFn, queues: list[str]) -> Message:
    # "@q1" stands for the full name of queue q1 (for the default exchange and CC).
    key = draw(st.one_of(routing_words, st.sampled_from([f"@{q}" for q in queues])))
    if draw(st.integers(0, 2)) == 0:
        return Message(key, None)
    headers: dict[str, object] = {
        k: draw(st.sampled_from(HEADER_VALUES))
        for k in draw(st.lists(st.sampled_from(HEADER_KEYS), max_size=3, unique=True))}
    for cc in ("CC", "BCC"):
        if draw(st.integers(0, 4)) == 0:
            keys = st.one_of(routing_words, st.sampled_from([f"@{q}" for q in queues]))
            headers[cc] = draw(st.lists(keys, max_size=2))
    if draw(st.integers(0, 30)) == 0:
        headers["CC"] = "a"  # not an array: the broker refuses the publish
    return Message(key, headers)


# --------------------------------------------------------------------------- broker side

class BrokerSession:
    """One pika connection with a confirm-mode channel that is reopened after a channel error."""

    def __init__(self, broker: BrokerEndpoint, vhost: str) -> None:
        params = pika.ConnectionParameters(
            broker.host, broker.amqp_port, vhost,
            pika.PlainCredentials(broker.username, broker.password))
        self.connection = pika.BlockingConnection(params)
        self.channel = self._open()

    def _open(self) -> pika.adapters.blocking_connection.BlockingChannel:
        channel = self.connection.channel()
        channel.confirm_delivery()
        return channel

    def call(self, method: str, *args: object, **kwargs: object) -> bool:
        """Run one AMQP method; False (and a fresh channel) if the broker refused it."""
        try:
            getattr(self.channel, method)(*args, **kwargs)
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self._open()
            return False
        return True

    def close(self) -> None:
        self.connection.close()


@pytest.fixture(scope="module")
def vhost(broker: BrokerEndpoint) -> Iterator[str]:
    """A private vhost for this module, so other tests' objects never show up in its model."""
    name = f"floodwall-routing-{uuid.uuid4().hex[:8]}"
    quoted = urllib.parse.quote(name, safe="")
    broker.api("PUT", f"/api/vhosts/{quoted}")
    broker.api("PUT", f"/api/permissions/{quoted}/{broker.username}",
               {"configure": ".*", "write": ".*", "read": ".*"})
    yield name
    broker.api("DELETE", f"/api/vhosts/{quoted}")


@pytest.fixture(scope="module")
def session(broker: BrokerEndpoint, vhost: str) -> Iterator[BrokerSession]:
    s = BrokerSession(broker, vhost)
    yield s
    s.close()


def management_model(broker: BrokerEndpoint, vhost: str) -> Topology:
    q = urllib.parse.quote(vhost, safe="")
    t = Topology()
    t.load_management(
        broker.api("GET", f"/api/exchanges/{q}"),
        broker.api("GET", f"/api/queues/{q}?columns=name,vhost"),
        broker.api("GET", f"/api/bindings/{q}"),
        broker.api("GET", f"/api/policies/{q}"),
        vhost=vhost,
    )
    return t


def structure(t: Topology, vhost: str, prefix: str) -> tuple[object, ...]:
    """What both models must agree on: exchanges, queues and bindings with the prefix."""
    return (
        sorted(x.name for x in t.exchanges(vhost) if x.name.startswith(prefix)),
        sorted(q for q in t.queues(vhost) if q.startswith(prefix)),
        sorted((b.source, b.destination.kind.value, b.destination.name, b.routing_key)
               for b in t.bindings(vhost) if b.source.startswith(prefix)),
    )


# --------------------------------------------------------------------------- the property

@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario=scenarios())
def test_predicted_queues_equal_where_messages_land(
        broker: BrokerEndpoint, vhost: str, session: BrokerSession, scenario: Scenario) -> None:
    prefix = f"rt-{uuid.uuid4().hex[:10]}."
    policy = f"{prefix}ae"
    quoted = urllib.parse.quote(vhost, safe="")
    try:
        run_scenario(broker, vhost, session, scenario, prefix, policy)
    finally:
        for x in scenario.exchanges:
            session.call("exchange_delete", prefix + x.name)
        for q in scenario.queues:
            session.call("queue_delete", prefix + q)
        if scenario.policy_alternate is not None:
            broker.api("DELETE", f"/api/policies/{quoted}/{urllib.parse.quote(policy)}")


def run_scenario(broker: BrokerEndpoint, vhost: str, session: BrokerSession,
                 scenario: Scenario, prefix: str, policy: str) -> None:
    def full(name: str) -> str:
        return prefix + name

    def expand(key: str) -> str:
        return prefix + key[1:] if key.startswith("@") else key

    quoted = urllib.parse.quote(vhost, safe="")
    if scenario.policy_alternate is not None:
        broker.api("PUT", f"/api/policies/{quoted}/{urllib.parse.quote(policy)}", {
            "pattern": "^" + re.escape(prefix), "apply-to": "exchanges", "priority": 0,
            "definition": {"alternate-exchange": full(scenario.policy_alternate)}})

    # The proxy's view: a management snapshot taken before, then the frames it relays.
    relayed = management_model(broker, vhost)
    call = session.call

    for q in scenario.queues:
        assert call("queue_declare", full(q))
        relayed.declare_queue(vhost, full(q))
    for x in scenario.exchanges:
        args: dict[str, object] = {}
        if x.alternate is not None:
            args["alternate-exchange"] = "" if x.alternate == "" else full(x.alternate)
        assert call("exchange_declare", full(x.name), x.type, durable=False,
                    auto_delete=x.auto_delete, internal=x.internal, arguments=args)
        relayed.declare_exchange(vhost, full(x.name), x.type, durable=False,
                                 auto_delete=x.auto_delete, internal=x.internal,
                                 arguments=args)

    for op in scenario.ops:
        apply_op(op, scenario.ops, session, relayed, vhost, full)

    loaded = management_model(broker, vhost)
    assert structure(loaded, vhost, prefix) == structure(relayed, vhost, prefix)

    existing_queues = [q for q in loaded.queues(vhost) if q.startswith(prefix)]
    targets = [""] + [full(x.name) for x in scenario.exchanges]
    for message in scenario.messages:
        routing_key = expand(message.routing_key)
        headers = message.headers
        if headers is not None:
            headers = {k: [expand(c) for c in v] if isinstance(v, list) else v
                       for k, v in headers.items()}
        for exchange in targets:
            body = uuid.uuid4().bytes
            published = call("basic_publish", exchange, routing_key, body,
                             pika.BasicProperties(headers=headers))
            landed = set()
            for q in existing_queues:
                while True:
                    method, _props, got = session.channel.basic_get(q, auto_ack=True)
                    if method is None:
                        break
                    assert got == body, f"a stray message in {q}"
                    landed.add(q)
            case = f"publish to {exchange!r} key {routing_key!r} headers {headers!r}"
            assert published or not landed, case
            assert loaded.route(vhost, exchange, routing_key, headers) == landed, \
                "model from the management API: " + case
            assert relayed.route(vhost, exchange, routing_key, headers) == landed, \
                "model from relayed frames: " + case


def apply_op(op: Op, ops: list[Op], session: BrokerSession, model: Topology, vhost: str,
             full: Callable[[str], str]) -> None:
    """Do ``op`` on the broker; apply it to the model only if the broker said Ok."""
    if op.kind == "unbind":
        bound = ops[op.target]
        key = bound.routing_key + ("-never-bound" if op.altered else "")
        op = Op("unbind_" + bound.kind.removeprefix("bind_"), bound.destination, bound.source,
                key, bound.arguments)
    dst, src = full(op.destination), full(op.source)
    key, args = op.routing_key, op.arguments
    if op.kind == "bind_queue":
        if session.call("queue_bind", dst, src, key, args):
            model.bind_queue(vhost, dst, src, key, args)
    elif op.kind == "bind_exchange":
        if session.call("exchange_bind", dst, src, key, args):
            model.bind_exchange(vhost, dst, src, key, args)
    elif op.kind == "unbind_queue":
        if session.call("queue_unbind", dst, src, key, args):
            model.unbind_queue(vhost, dst, src, key, args)
    elif op.kind == "unbind_exchange":
        if session.call("exchange_unbind", dst, src, key, args):
            model.unbind_exchange(vhost, dst, src, key, args)
    elif op.kind == "delete_queue":
        if session.call("queue_delete", dst):
            model.delete_queue(vhost, dst)
    elif op.kind == "delete_exchange":
        if session.call("exchange_delete", dst):
            model.delete_exchange(vhost, dst)
    else:
        raise AssertionError(f"unknown op {op.kind}")
