"""Declares, deletes and binds seen in the 0-9-1 stream reach the routing model once -ok."""

from __future__ import annotations

from pamqp import commands

from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.amqp091.topology import TopologyChange
from tests.amqp091.wire import CH, client_handshake, method, server_handshake

Q = commands.Queue
X = commands.Exchange


def _core() -> tuple[Connection, list[TopologyChange]]:
    changes: list[TopologyChange] = []
    core = Connection(on_topology=changes.append)
    core.receive_from_server(b"".join(server_handshake()))
    core.receive_from_client(b"".join(client_handshake()) + method(CH.Open(), 1))
    core.receive_from_server(method(CH.OpenOk(), 1))
    return core, changes


def test_changes_apply_on_the_brokers_ok_not_on_the_request() -> None:
    core, changes = _core()
    core.receive_from_client(method(X.Declare(exchange="ex", exchange_type="topic"), 1))
    assert changes == []
    core.receive_from_server(method(X.DeclareOk(), 1))
    assert [(c.kind, c.vhost, c.name, c.exchange_type) for c in changes] == [
        ("declare_exchange", "/orders", "ex", "topic")]


def test_server_named_queue_and_the_empty_name_shortcut() -> None:
    core, changes = _core()
    core.receive_from_client(method(Q.Declare(queue="", exclusive=True), 1))
    core.receive_from_server(method(Q.DeclareOk(queue="amq.gen-abc", message_count=0,
                                                consumer_count=0), 1))
    core.receive_from_client(method(Q.Bind(queue="", exchange="ex", routing_key=""), 1))
    core.receive_from_server(method(Q.BindOk(), 1))
    assert [(c.kind, c.name, c.source, c.routing_key) for c in changes] == [
        ("declare_queue", "amq.gen-abc", "", ""),
        ("bind_queue", "amq.gen-abc", "ex", "amq.gen-abc"),
    ]


def test_a_refused_request_is_forgotten_with_its_channel() -> None:
    core, changes = _core()
    core.receive_from_client(method(Q.Delete(queue="nope"), 1))
    core.receive_from_server(method(CH.Close(404, "NOT_FOUND", 50, 40), 1))
    core.receive_from_client(method(CH.CloseOk(), 1))
    core.receive_from_client(method(CH.Open(), 1))
    core.receive_from_server(method(CH.OpenOk(), 1))
    core.receive_from_client(method(Q.Delete(queue="other"), 1))
    core.receive_from_server(method(Q.DeleteOk(message_count=0), 1))
    assert [(c.kind, c.name) for c in changes] == [("delete_queue", "other")]


def test_nowait_requests_apply_at_once() -> None:
    core, changes = _core()
    core.receive_from_client(method(Q.Bind(queue="q", exchange="ex", routing_key="k",
                                           nowait=True), 1))
    assert [(c.kind, c.name, c.routing_key) for c in changes] == [("bind_queue", "q", "k")]
