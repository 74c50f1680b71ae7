"""AMQP 1.0 addresses to exchanges, routing keys and queues, as RabbitMQ reads them.

Targets (where a sender link's messages go):

| address | RabbitMQ | exchange | routing key |
|---|---|---|---|
| ``/exchange/X/RK`` | 3.10 | X | RK |
| ``/exchange/X`` | 3.10 | X | the message's ``subject`` |
| ``/topic/RK`` | 3.10 | ``amq.topic`` | RK |
| ``/queue/Q``, ``/amq/queue/Q`` | 3.10 | ``""`` | Q |
| ``/queue`` | 3.10 | ``""`` | the message's ``subject`` |
| ``Q`` (no leading ``/``) | 3.10 | ``""`` | Q |
| ``/exchanges/X/RK`` | 4.x (v2) | X | RK |
| ``/exchanges/X`` | 4.x (v2) | X | the message's ``subject`` |
| ``/queues/Q`` | 4.x (v2) | ``""`` | Q |
| null (anonymous terminus) | both | from the message's ``to`` (any form above) | |

The 4.x (v2) forms percent-encode each segment (RFC 3986); the 3.10 forms are taken as they
are. ``amq.default`` in a v2 address is the default exchange ``""``. An address that fits no
form resolves to nothing: the broker will refuse it, the proxy polices nothing for it.

Sources (where a receiver link's messages come from) name a queue in the ``/queue/Q``,
``/amq/queue/Q``, ``/queues/Q`` and bare ``Q`` forms; exchange and topic sources consume from
a queue the broker makes for the link, which no policy names.

The vhost is the Open's ``hostname`` with a ``vhost:`` prefix (3.10), else ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import quote, unquote

DEFAULT_EXCHANGE: Final = ""
TOPIC_EXCHANGE: Final = "amq.topic"
DEFAULT_VHOST: Final = "/"
_NO_QUEUES: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Destination:
    """Where a message sent to an address goes: an exchange and a routing key.

    ``routing_key`` None means "the message's subject" (``/exchange/X``, ``/queue``).
    """

    exchange: str
    routing_key: str | None

    @property
    def per_message(self) -> bool:
        return self.routing_key is None


class Router(Protocol):
    """``FlowController.destinations``: exchange and routing key to queue names."""

    def destinations(self, vhost: str, exchange: str, routing_key: str,
                     headers: dict[str, object] | None = None) -> frozenset[str]: ...


def _v2_segment(text: str) -> str | None:
    """A percent-encoded v2 segment; None if it is empty or not valid UTF-8 once decoded."""
    if not text:
        return None
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        return None


def parse_target(address: str) -> Destination | None:
    """The destination of a target address (or a message's ``to``); None if it fits no form."""
    if not address.startswith("/"):
        return Destination(DEFAULT_EXCHANGE, address) if address else None
    parts = address[1:].split("/")
    head, rest = parts[0], parts[1:]
    if head == "exchange" and rest and rest[0]:
        if len(rest) == 1:
            return Destination(rest[0], None)
        return Destination(rest[0], "/".join(rest[1:]))
    if head == "topic" and rest:
        return Destination(TOPIC_EXCHANGE, "/".join(rest))
    if head == "queue":
        if not rest:
            return Destination(DEFAULT_EXCHANGE, None)
        if len(rest) == 1 and rest[0]:
            return Destination(DEFAULT_EXCHANGE, rest[0])
        return None
    if head == "amq" and len(rest) == 2 and rest[0] == "queue" and rest[1]:
        return Destination(DEFAULT_EXCHANGE, rest[1])
    if head == "queues" and len(rest) == 1:
        queue = _v2_segment(rest[0])
        return None if queue is None else Destination(DEFAULT_EXCHANGE, queue)
    if head == "exchanges" and 1 <= len(rest) <= 2:
        exchange = _v2_segment(rest[0])
        if exchange is None:
            return None
        if exchange == "amq.default":
            exchange = DEFAULT_EXCHANGE
        if len(rest) == 1:
            return Destination(exchange, None)
        key = _v2_segment(rest[1]) if rest[1] else ""
        return None if key is None else Destination(exchange, key)
    return None


def queue_address(queue: str, broker_version: str | None) -> str:
    """The target that sends straight to ``queue`` on a broker of ``broker_version`` (its
    Open's ``version`` property): ``/queues/Q`` (v2, percent-encoded) from RabbitMQ 4, which
    deprecates the v1 forms and refuses them by default from 4.3; ``/amq/queue/Q`` before
    (and when the version is unknown or unreadable: the form every release takes)."""
    major = (broker_version or "").split(".", 1)[0]
    if major.isdigit() and int(major) >= 4:
        return "/queues/" + quote(queue, safe="")
    return f"/amq/queue/{queue}"


def source_queue(address: str | None) -> str | None:
    """The queue a receiver link consumes from, when its source address names one."""
    if not address:
        return None
    if not address.startswith("/"):
        return address
    parts = address[1:].split("/")
    if len(parts) == 2 and parts[0] == "queue" and parts[1]:
        return parts[1]
    if len(parts) == 3 and parts[:2] == ["amq", "queue"] and parts[2]:
        return parts[2]
    if len(parts) == 2 and parts[0] == "queues":
        return _v2_segment(parts[1])
    return None


def declared_queue(address: str | None) -> str | None:
    """The queue RabbitMQ 3.10 declares when a link attaches to ``address``: ``/queue/Q``
    and bare ``Q`` (as a target or a source)."""
    if not address:
        return None
    if not address.startswith("/"):
        return address
    parts = address[1:].split("/")
    if len(parts) == 2 and parts[0] == "queue" and parts[1]:
        return parts[1]
    return None


def vhost_of(hostname: str | None) -> str:
    """The vhost a connection's Open names: ``vhost:NAME`` in ``hostname``, else ``/``."""
    if hostname and hostname.startswith("vhost:") and len(hostname) > len("vhost:"):
        return hostname[len("vhost:"):]
    return DEFAULT_VHOST


def queues_for(router: Router, vhost: str, destination: Destination | None,
               subject: str | None = None) -> frozenset[str]:
    """The queues a message to ``destination`` lands in (``subject`` for per-message keys)."""
    if destination is None:
        return _NO_QUEUES
    key = destination.routing_key
    if key is None:
        if subject is None:
            return _NO_QUEUES
        key = subject
    return router.destinations(vhost, destination.exchange, key)
