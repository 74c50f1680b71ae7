"""Who gets Channel.Flow: the rules of floodwall/enforce/amqp091/clients.py against the
client_properties real clients send in Connection.StartOk.

The tables below are what RabbitMQ 3.10's management API recorded for each client (Debian 12's
packages), capabilities left out; tests/clients/test_clients_direct.py reads them again from
the running clients, so a client that changes what it sends fails there.
"""

from __future__ import annotations

import pytest
from pamqp.common import FieldTable

from floodwall.enforce.amqp091.clients import KNOWN_CLIENTS, FlowReaction, flow_reaction, may_signal
from floodwall.wire.amqp091.hooks import ClientInfo

SENT: dict[str, FieldTable] = {
    "amqp091-go 1.5.0": {"product": "AMQP 0.9.1 Client", "version": "1.5.0",
                         "platform": "golang"},
    # Config.Properties from NewConnectionProperties(), the documented way to name a
    # connection: the library then sends no product, version or platform
    "amqp091-go 1.5.0, named": {"connection_name": "orders"},
    "Bunny 2.19.0": {"product": "Bunny", "version": "2.19.0",
                     "platform": "ruby 3.1.2p20 (2022-04-12 revision 4491bb740a) "
                                 "[x86_64-linux-gnu]",
                     "information": "http://rubybunny.info"},
    "php-amqplib 3.5.3": {"product": "AMQPLib", "platform": "PHP", "version": "3.5.3",
                          "information": "", "copyright": ""},
    "rabbitmq-c 0.11.0": {"product": "rabbitmq-c", "version": "0.11.0", "platform": "Linux",
                          "information": "See https://github.com/alanxz/rabbitmq-c",
                          "copyright": "Copyright (c) 2007-2014 VMWare Inc, Tony "
                                       "Garnock-Jones, and Alan Antonuk."},
}

EXPECTED = {
    "amqp091-go 1.5.0": FlowReaction.TOLERATES,
    "amqp091-go 1.5.0, named": FlowReaction.UNKNOWN,
    "Bunny 2.19.0": FlowReaction.BREAKS,
    "php-amqplib 3.5.3": FlowReaction.TOLERATES,
    "rabbitmq-c 0.11.0": FlowReaction.LEFT_TO_APPLICATION,
}


@pytest.mark.parametrize("client", sorted(SENT))
def test_what_real_clients_send_is_classified(client: str) -> None:
    info = ClientInfo.from_properties(SENT[client])
    assert flow_reaction(info) is EXPECTED[client]
    signalled = EXPECTED[client] in (FlowReaction.HONOURS, FlowReaction.TOLERATES)
    assert may_signal(info) is signalled


def test_products_match_exactly() -> None:
    """"AMQPLib" is php-amqplib, "amqplib" Node's amqplib: case matters."""
    php = ClientInfo.from_properties({"product": "AMQPLib"})
    node = ClientInfo.from_properties({"product": "amqplib"})
    assert flow_reaction(php) is FlowReaction.TOLERATES
    assert flow_reaction(node) is FlowReaction.BREAKS
    assert flow_reaction(ClientInfo.from_properties({"product": "rabbitmq-C"})) \
        is FlowReaction.UNKNOWN


def test_platform_narrows_the_java_and_dotnet_rows() -> None:
    java = ClientInfo.from_properties({"product": "RabbitMQ", "platform": "Java"})
    dotnet = ClientInfo.from_properties({"product": "RabbitMQ", "platform": ".NET"})
    other = ClientInfo.from_properties({"product": "RabbitMQ", "platform": "Erlang/OTP"})
    assert flow_reaction(java) is flow_reaction(dotnet) is FlowReaction.HONOURS
    assert flow_reaction(other) is FlowReaction.UNKNOWN


def test_no_client_properties_is_unknown_and_not_signalled() -> None:
    assert flow_reaction(None) is FlowReaction.UNKNOWN
    assert may_signal(ClientInfo.from_properties({})) is False


def test_every_row_is_one_product_and_platform() -> None:
    keys = [(k.product, k.platform) for k in KNOWN_CLIENTS]
    assert len(keys) == len(set(keys))
    assert all(k.reaction is not FlowReaction.UNKNOWN for k in KNOWN_CLIENTS)
