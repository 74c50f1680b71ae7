"""A change to the broker's topology as a typed value: what every source of changes produces.

The 0-9-1 core reads them from the declares, deletes and binds it relays (``wire.amqp091.
topology``), the 1.0 core from links that declare a queue, the topology feed from the broker's
events, lookups and syncs; the routing model (``control.routing``) applies them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ChangeKind", "QueueType", "TopologyChange"]


class QueueType(enum.StrEnum):
    """A queue's type as RabbitMQ 3.10 has them; a stream's depth is counted differently."""

    CLASSIC = "classic"
    QUORUM = "quorum"
    STREAM = "stream"

    @classmethod
    def of(cls, name: object) -> QueueType:
        """From ``x-queue-type``, the management API's ``type`` or an event's
        ``rabbit_*_queue`` module name; anything else is classic."""
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        if not isinstance(name, str):
            return cls.CLASSIC
        name = name.removeprefix("rabbit_").removesuffix("_queue")
        try:
            return cls(name)
        except ValueError:
            return cls.CLASSIC


class ChangeKind(enum.StrEnum):
    """One change to the broker's topology, whoever made it."""

    DECLARE_QUEUE = "declare_queue"
    DELETE_QUEUE = "delete_queue"
    DECLARE_EXCHANGE = "declare_exchange"
    DELETE_EXCHANGE = "delete_exchange"
    BIND_QUEUE = "bind_queue"
    UNBIND_QUEUE = "unbind_queue"
    BIND_EXCHANGE = "bind_exchange"
    UNBIND_EXCHANGE = "unbind_exchange"
    DECLARE_VHOST = "declare_vhost"
    DELETE_VHOST = "delete_vhost"


@dataclass(frozen=True, slots=True)
class TopologyChange:
    """One change to apply to the routing model (``Topology.apply``).

    ``name`` is the queue, exchange or vhost (for binds: the destination); ``source`` the
    exchange bound from. ``message_count`` is a declare-ok's ready count, when there is one.
    """

    kind: ChangeKind
    vhost: str
    name: str
    source: str = ""
    routing_key: str = ""
    arguments: Mapping[str, object] = field(default_factory=dict)
    exchange_type: str = ""
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    message_count: int | None = None
    queue_type: QueueType = QueueType.CLASSIC

    def touches(self) -> tuple[tuple[str, ...], ...]:
        """The model items this change is about, as ``Topology.items`` names them."""
        k = self.kind
        if k in (ChangeKind.DECLARE_QUEUE, ChangeKind.DELETE_QUEUE):
            return (("queue", self.vhost, self.name),)
        if k in (ChangeKind.DECLARE_EXCHANGE, ChangeKind.DELETE_EXCHANGE):
            return (("exchange", self.vhost, self.name),)
        if k in (ChangeKind.DECLARE_VHOST, ChangeKind.DELETE_VHOST):
            return (("vhost", self.name),)
        kind = "queue" if k in (ChangeKind.BIND_QUEUE, ChangeKind.UNBIND_QUEUE) else "exchange"
        return (("binding", self.vhost, self.source, kind, self.name, self.routing_key),
                (kind, self.vhost, self.name))
