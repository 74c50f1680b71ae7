"""The routing model: which queues a publish lands in, as RabbitMQ 3.10 routes, kept in step with
the broker.

``topology`` is the model (``Topology``: route, apply a change, load a listing); ``vhost`` one
virtual host of it; ``model`` its records; ``matching`` how each exchange kind matches;
``terms`` how argument values compare; ``loaders`` the management API's documents; ``events``
RabbitMQ's topology events read as changes; ``sync`` how a full sync's difference with the
model is judged. Pure: no I/O, no clock.
"""

from floodwall.control.routing.loaders import exchange_changes
from floodwall.control.routing.matching import headers_match, topic_matches, topic_words
from floodwall.control.routing.model import (
    REPLY_TO_PREFIX,
    STANDARD_EXCHANGES,
    Binding,
    Destination,
    DestinationKind,
    Exchange,
    ExchangeKind,
    TopologyError,
)
from floodwall.control.routing.topology import ROUTE_CACHE_SIZE, Topology
from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange

__all__ = [
    "REPLY_TO_PREFIX",
    "ROUTE_CACHE_SIZE",
    "STANDARD_EXCHANGES",
    "Binding",
    "ChangeKind",
    "Destination",
    "DestinationKind",
    "Exchange",
    "ExchangeKind",
    "QueueType",
    "Topology",
    "TopologyChange",
    "TopologyError",
    "exchange_changes",
    "headers_match",
    "topic_matches",
    "topic_words",
]
