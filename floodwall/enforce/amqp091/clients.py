"""Which 0-9-1 clients may be sent an unsolicited Channel.Flow, by what they call themselves.

Read from their sources and tried against RabbitMQ (docs/design/clients.md has the table, with
the versions tried): some honour it, some tolerate it, some break on it and one leaves it to
the application. Only the first two kinds are signalled under ``signal: auto``; publishes
are held for every client either way. Products are matched exactly, whatever the version:
a client that names its connection the documented way in amqp091-go (``Config.Properties``)
sends no product at all and is UNKNOWN, held but not signalled.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from floodwall.wire.amqp091.hooks import ClientInfo


class FlowReaction(Enum):
    """What a client does with a Channel.Flow(active=false) it did not ask for."""

    HONOURS = "honours"  # replies flow-ok and stops publishing
    TOLERATES = "tolerates"  # replies (flow-ok, or a stray flow), keeps publishing
    BREAKS = "breaks"  # errors, or leaves its connection in a bad state
    LEFT_TO_APPLICATION = "left to the application"  # no reply; the app's frame loop gets it
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class KnownClient:
    product: str  # client_properties.product, compared exactly ("amqplib" is not "AMQPLib")
    platform: str | None  # None = any
    reaction: FlowReaction
    note: str


KNOWN_CLIENTS: tuple[KnownClient, ...] = (
    KnownClient("RabbitMQ", "Java", FlowReaction.HONOURS,
                "RabbitMQ Java client: flow-ok, basicPublish blocks until flow is on"),
    KnownClient("RabbitMQ", ".NET", FlowReaction.HONOURS,
                "RabbitMQ .NET client: flow-ok, BasicPublish blocks"),
    KnownClient("py-amqp", None, FlowReaction.TOLERATES,
                "py-amqp (kombu, Celery): flow-ok, keeps publishing"),
    KnownClient("AMQP 0.9.1 Client", None, FlowReaction.TOLERATES,
                "amqp091-go: flow-ok, keeps publishing; NotifyFlow listeners are told"),
    KnownClient("https://github.com/streadway/amqp", None, FlowReaction.TOLERATES,
                "streadway/amqp: flow-ok, keeps publishing"),
    KnownClient("AMQPLib", None, FlowReaction.TOLERATES,
                "php-amqplib: put aside while it waits for acks or replies, keeps publishing; "
                "an unfiltered wait() answers with a channel.flow, which the proxy absorbs"),
    KnownClient("Pika Python Client Library", None, FlowReaction.BREAKS,
                "pika: no flow-ok, logs a warning; RabbitMQ never gets the reply it expects"),
    KnownClient("aiormq", None, FlowReaction.BREAKS,
                "aiormq / aio-pika: no flow-ok, its next RPC fails (InvalidFrameError)"),
    KnownClient("amqplib", None, FlowReaction.BREAKS,
                "amqplib (Node): connection error 'reply is not a function'"),
    KnownClient("Bunny", None, FlowReaction.BREAKS,
                "Bunny (Ruby): its reader thread dies ('Do not know how to handle'); "
                "publishes go unanswered, the next RPC times out"),
    KnownClient("rabbitmq-c", None, FlowReaction.LEFT_TO_APPLICATION,
                "rabbitmq-c (C): no flow-ok; the frame goes to the application's frame loop"),
)


def flow_reaction(client: ClientInfo | None) -> FlowReaction:
    """How this client is known to react to an injected Channel.Flow."""
    if client is None or client.product is None:
        return FlowReaction.UNKNOWN
    platform = (client.platform or "").casefold()
    for known in KNOWN_CLIENTS:
        if known.product != client.product:
            continue
        if known.platform is None or platform.startswith(known.platform.casefold()):
            return known.reaction
    return FlowReaction.UNKNOWN


def may_signal(client: ClientInfo | None) -> bool:
    """True for clients that honour or at least tolerate an unsolicited Channel.Flow."""
    return flow_reaction(client) in (FlowReaction.HONOURS, FlowReaction.TOLERATES)
