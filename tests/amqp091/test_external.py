"""A client's SASL EXTERNAL through the 0-9-1 core: refused by default (connection.close 403,
the start-ok never reaches the broker), relayed when the proxy is told to allow it."""

from __future__ import annotations

import pytest
from pamqp import commands

from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.relaycore import EXTERNAL_REFUSED, Side
from tests.amqp091.wire import CLIENT_PROPERTIES, decode_all, method, server_handshake

C = commands.Connection


def start_ok(mechanism: str) -> bytes:
    return method(C.StartOk(client_properties=CLIENT_PROPERTIES, mechanism=mechanism,
                            response=""))


def feed(core: Connection, data: bytes, bytewise: bool) -> None:
    if bytewise:
        for i in range(len(data)):
            core.receive_from_client(data[i:i + 1])
    else:
        core.receive_from_client(data)


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-at-a-time"])
@pytest.mark.parametrize("mechanism", ["EXTERNAL", "external"])
def test_external_is_refused_with_403_and_not_relayed(mechanism: str, bytewise: bool) -> None:
    core = Connection()
    core.receive_from_server(server_handshake()[0])
    assert core.data_for_client()  # the broker's connection.start reaches the client
    feed(core, start_ok(mechanism) + method(C.TuneOk(2047, 131072, 60)), bytewise)
    assert core.failure is not None
    assert core.failure.side is Side.CLIENT and core.failure.refused
    assert core.failure.condition == "403 ACCESS_REFUSED"
    assert core.data_for_server() == b""  # neither the start-ok nor what followed it
    ((channel, close),) = decode_all(core.data_for_client())
    assert channel == 0 and isinstance(close, C.Close)
    assert close.reply_code == 403
    assert close.reply_text == f"ACCESS_REFUSED - {EXTERNAL_REFUSED}"[:255]
    assert (close.class_id, close.method_id) == (10, 11)


def test_plain_passes_in_place() -> None:
    core = Connection()
    core.receive_from_server(server_handshake()[0])
    data = start_ok("PLAIN")
    core.receive_from_client(data)
    assert core.failure is None
    assert core.data_for_server() == data


def test_external_is_relayed_when_allowed() -> None:
    core = Connection(refuse_external=False)
    core.receive_from_server(server_handshake()[0])
    data = start_ok("EXTERNAL")
    core.receive_from_client(data)
    assert core.failure is None
    assert core.data_for_server() == data
