"""What the gates tell the rest of the proxy, as values: a publisher held, signalled, refused,
a channel closed or a link detached by the proxy, a publish not spooled.

The gates append them to their outbox among the frames (``floodwall.enforce.commands``); the
I/O layer hands them to ``floodwall.ops.logs`` (the log lines: ``gate_event``) and to the
telemetry (``floodwall.ops.telemetry.event_record``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

QueueKey = tuple[str, str]  # (vhost, queue)


class ProtocolName(Enum):
    """Which protocol a gate speaks."""

    AMQP091 = "amqp091"
    AMQP10 = "amqp10"


class Answer(Enum):
    """How the proxy answered a publish it refused."""

    NACK = "basic.nack"  # 0-9-1, confirm mode
    CHANNEL_CLOSE = "channel.close"  # 0-9-1: 406 to the client (EndedByProxy says why)
    REJECTED = "rejected"  # 1.0: the delivery settled rejected by the proxy
    DETACHED = "amqp:resource-limit-exceeded"  # 1.0: the link detached (EndedByProxy)


class ShadowAction(Enum):
    """What a gate would have done, had the shadow policies been enforced (counted by
    ``GateCounters.shadow``, exported as ``floodwall_shadow_actions_total{action}``)."""

    HELD = "held"  # a publish (0-9-1) held on its channel
    FLOW_OFF = "flow_off"  # 0-9-1: Channel.Flow(active=false) sent
    FLOW_ON = "flow_on"  # 0-9-1: Channel.Flow(active=true) on the would-be release
    CREDIT_WITHHELD = "credit_withheld"  # 1.0: a link's credit withheld
    CREDIT_RESTORED = "credit_restored"  # 1.0: its credit restored on the would-be release
    REJECTED = "rejected"  # refused (overflow: reject)
    SPOOLED = "spooled"  # written to the spool (overflow: spool)


@dataclass(frozen=True, slots=True)
class LinkName:
    """A 1.0 sender link as events name it."""

    session: int  # the client's session channel
    handle: int  # the client's handle
    name: str


@dataclass(frozen=True, slots=True)
class At:
    """Which publisher an event is about: a 0-9-1 channel, or a 1.0 link (``channel`` is then
    its ``link_ref``, the number the flow controller knows it by)."""

    protocol: ProtocolName
    conn: int
    vhost: str
    channel: int
    link: LinkName | None = None


@dataclass(frozen=True, slots=True)
class PublisherHeld:
    """A channel's publishes are held (1.0: a link's credit withheld) on ``queues`` (real
    queues, the broker alarm, lookups); ``signalled``: the client is told to stop."""

    at: At
    queues: frozenset[QueueKey]
    signalled: bool


@dataclass(frozen=True, slots=True)
class WaitingForLookup:
    """A channel's publishes wait for the broker's word on names the model does not know."""

    at: At
    lookups: frozenset[QueueKey]


@dataclass(frozen=True, slots=True)
class Signalled:
    """The client was told to stop (``active`` False) or resume publishing: 0-9-1
    Channel.Flow, 1.0 link credit withheld or restored."""

    at: At
    active: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """A publish refused under ``overflow: reject`` (``queues``: what it was blocked on)."""

    at: At
    queues: frozenset[QueueKey]
    reason: str
    answer: Answer
    body_bytes: int


@dataclass(frozen=True, slots=True)
class DeadlineExpired:
    """A publish (1.0: a link without credit) waited past its policy's deadline and was
    refused; ``queues`` names what it waited on, ``waited`` for how long (seconds)."""

    at: At
    queues: tuple[str, ...]
    reason: str
    answer: Answer
    body_bytes: int
    waited: float


@dataclass(frozen=True, slots=True)
class EndedByProxy:
    """The proxy ended a publisher on both sides: closed a 0-9-1 channel (406 to the client)
    or detached a 1.0 link (``condition``: the detach's error condition; "" for 0-9-1)."""

    at: At
    reason: str
    condition: str = ""


@dataclass(frozen=True, slots=True)
class NotSpooled:
    """A publish to a spooling queue was held instead (the first of its channel or link);
    ``reason``: transactional, mandatory."""

    at: At
    queue: str
    reason: str
    action: str


@dataclass(frozen=True, slots=True)
class SpoolFellBack:
    """The spool refused a publish (``reason``); ``action`` says what the gate did instead."""

    at: At
    queue: str
    reason: str
    action: str


@dataclass(frozen=True, slots=True)
class WouldHave:
    """Shadow mode: what the gate would have done to ``at``'s publishes, had the shadow
    policies among ``queues`` been enforced (it let them pass). Made when a channel or link
    would start to be held (``HELD``, ``CREDIT_WITHHELD``; ``SPOOLED`` for its first
    spooled publish), signalled, released, and for each publish it would have refused."""

    at: At
    action: ShadowAction
    queues: frozenset[QueueKey]


@dataclass(frozen=True, slots=True)
class BrokerRejected:
    """The broker settled a 1.0 client's deliveries ``rejected`` (relayed unchanged): the
    latest range (the broker's delivery-ids ``first``..``last`` on the client's session
    ``session``) and ``count``, the deliveries rejected since the connection's last such
    event (they are rate-limited); the error's condition and description, and the queue
    and reason of its info map where the broker gives them (RabbitMQ 4.3)."""

    conn: int
    vhost: str
    session: int
    first: int
    last: int
    count: int
    condition: str
    description: str
    queue: str | None
    reason: str | None


GateEvent = (PublisherHeld | WaitingForLookup | Signalled | Refused | DeadlineExpired
             | EndedByProxy | NotSpooled | SpoolFellBack | WouldHave | BrokerRejected)
