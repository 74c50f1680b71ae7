"""A client's SASL EXTERNAL through the 1.0 core: refused by default (sasl-outcome auth to the
client, the sasl-init never reaches the broker), relayed when allowed."""

from __future__ import annotations

import pytest

from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import SASL_HEADER
from floodwall.wire.amqp10.performatives import SASL_INIT, SASL_MECHANISMS, SASL_OUTCOME
from floodwall.wire.amqp10.types import Array, Symbol, UByte
from floodwall.wire.relaycore import EXTERNAL_REFUSED, Side
from tests.amqp10.streams import sasl

MECHANISMS = sasl(SASL_MECHANISMS, sasl_server_mechanisms=Array(
    0xA3, (Symbol("EXTERNAL"), Symbol("PLAIN"))))


def init(mechanism: str) -> bytes:
    return sasl(SASL_INIT, mechanism=Symbol(mechanism), initial_response=b"", hostname="mq")


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "byte-at-a-time"])
def test_external_is_refused_with_sasl_outcome_auth(bytewise: bool) -> None:
    core = Connection(SASL_HEADER)
    core.receive_from_server(SASL_HEADER + MECHANISMS)
    assert core.data_for_client() == SASL_HEADER + MECHANISMS
    data = init("EXTERNAL")
    chunks = [data[i:i + 1] for i in range(len(data))] if bytewise else [data]
    for chunk in chunks:
        core.receive_from_client(chunk)
    assert core.failure is not None
    assert core.failure.refused and core.failure.side is Side.CLIENT
    assert core.failure.condition == "amqp:unauthorized-access"
    assert core.failure.reason == EXTERNAL_REFUSED
    assert core.data_for_server() == b""
    assert core.data_for_client() == sasl(SASL_OUTCOME, code=UByte(1))


def test_plain_and_allowed_external_pass_in_place() -> None:
    for mechanism, refuse in (("PLAIN", True), ("EXTERNAL", False)):
        core = Connection(SASL_HEADER, refuse_external=refuse)
        core.receive_from_server(SASL_HEADER + MECHANISMS)
        core.data_for_client()
        data = init(mechanism)
        core.receive_from_client(data)
        assert core.failure is None
        assert core.data_for_server() == data
