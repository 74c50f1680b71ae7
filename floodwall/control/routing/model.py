"""The routing model's records: exchange and destination kinds, exchanges, bindings, policies."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from floodwall.control.routing.terms import _arguments_identity, _frozen

REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."


class TopologyError(ValueError):
    """A management API document or a field value the model cannot read."""


class DestinationKind(enum.StrEnum):
    """What a binding delivers to, spelled as the management API's ``destination_type``."""

    QUEUE = "queue"
    EXCHANGE = "exchange"


class ExchangeKind(enum.StrEnum):
    """How an exchange matches; ``OPAQUE`` is any type the model does not know."""

    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"
    OPAQUE = "opaque"


def _exchange_kind(type_name: str) -> ExchangeKind:
    try:
        kind = ExchangeKind(type_name)
    except ValueError:
        return ExchangeKind.OPAQUE
    return ExchangeKind.OPAQUE if kind is ExchangeKind.OPAQUE else kind


class Destination(NamedTuple):
    """A binding's destination: a queue or an exchange, by name, in the binding's vhost."""

    kind: DestinationKind
    name: str


STANDARD_EXCHANGES: tuple[tuple[str, str, bool], ...] = (
    ("", "direct", False),
    ("amq.direct", "direct", False),
    ("amq.fanout", "fanout", False),
    ("amq.headers", "headers", False),
    ("amq.match", "headers", False),
    ("amq.rabbitmq.trace", "topic", True),
    ("amq.topic", "topic", False),
)
"""(name, type, internal) of the exchanges RabbitMQ 3.10 creates in every vhost."""


# --------------------------------------------------------------------------- model records

@dataclass(frozen=True)
class Exchange:
    """One exchange as declared; ``kind`` is how the model matches it."""

    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)
    policy_alternate_exchange: str | None = None
    kind: ExchangeKind = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _frozen(self.arguments))
        object.__setattr__(self, "kind", _exchange_kind(self.type))

    @property
    def alternate_exchange(self) -> str | None:
        """The AE's name: the ``alternate-exchange`` argument wins over a policy's."""
        if "alternate-exchange" in self.arguments:
            value = self.arguments["alternate-exchange"]
            if isinstance(value, bytes):
                return value.decode(errors="replace")
            return value if isinstance(value, str) else None
        return self.policy_alternate_exchange


@dataclass(frozen=True)
class Binding:
    """One binding; two bindings are the same when all fields and argument types agree."""

    vhost: str
    source: str
    destination: Destination
    routing_key: str = ""
    arguments: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)
    arguments_key: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arguments", _frozen(self.arguments))
        object.__setattr__(self, "arguments_key", _arguments_identity(self.arguments))


# --------------------------------------------------------------------------- policies

@dataclass(frozen=True)
class _Policy:
    name: str
    pattern: re.Pattern[str] | None  # None: an Erlang regex Python cannot compile
    applies_to_exchanges: bool
    priority: float
    alternate_exchange: str | None
