"""The exchange/binding model that says which queues a publish lands in, as RabbitMQ 3.10 routes."""

from __future__ import annotations

from collections.abc import Mapping

from floodwall.control.routing.loaders import _listed_form, read_management
from floodwall.control.routing.matching import (
    _sender_selected_keys,
)
from floodwall.control.routing.model import (
    Binding,
    Destination,
    DestinationKind,
    Exchange,
)
from floodwall.control.routing.vhost import _EMPTY, _VirtualHost
from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange

ROUTE_CACHE_SIZE = 65536
"""Most (vhost, exchange, routing key) answers kept; the oldest goes first."""


# --------------------------------------------------------------------------- the model

class Topology:
    """Every vhost's exchanges, queues and bindings, and the routes they imply.

    Each rule was read from RabbitMQ 3.10.8's own code (decompiled from the Debian
    package's beam files) and checked against a running broker.

    Routing (``rabbit_exchange:route``):
    - A publish to the default exchange ``""`` lands in the queue named by each routing key,
      if it exists (``amq.rabbitmq.reply-to.*`` names no queue).
    - Any other exchange starts a walk that visits each exchange at most once per publish,
      so exchange-to-exchange and alternate-exchange cycles end. Queue destinations are
      collected, exchange destinations walked. An exchange's alternate exchange (its
      ``alternate-exchange`` argument, else its policy's) is walked only when the exchange
      itself matched no destination at all: a matched exchange destination that routes
      nowhere still counts as a match.
    - An unknown or ``internal`` exchange routes nowhere (the broker closes the channel with
      404 or 403); an internal exchange reached by a binding or as an AE routes normally.
    - The default exchange reached as an alternate exchange routes nowhere: in 3.10 its
      bindings are implicit and only a publish *to* ``""`` looks queues up by name.
    - ``CC`` and ``BCC`` headers (arrays of strings) add routing keys for every exchange type.
      ``BCC`` is stripped before routing, so a headers exchange sees ``CC`` but not ``BCC``.
      A ``CC`` or ``BCC`` that is not an array makes the broker refuse the publish (406).
    - topic: words split on ``.``; ``""`` is no words, ``"a."`` is ``a`` and an empty word;
      ``*`` is exactly one (possibly empty) word, ``#`` zero or more.
    - headers: ``x-match`` is ``all`` (also the fallback for any unexpected value), ``any``,
      ``all-with-x`` or ``any-with-x``. Binding keys starting with ``x-`` are ignored except
      in the ``-with-x`` modes (``x-match`` itself always is). A void (``None``) binding value
      matches the header's mere presence. Values compare as Erlang's ``==``: AMQP types are
      ignored, numbers compare by value (``1 == 1.0``; a timestamp is its integer), booleans
      equal only booleans, strings and byte arrays compare as bytes, a decimal is its
      ``(scale, value)`` pair (``Decimal("1")`` is not ``1``). Inside nested tables and
      arrays the element types count too, which decoded Python values only approximate.
    - Any other exchange type (``x-consistent-hash``, ``x-delayed-message``, ...) is
      ``opaque``: conservatively it routes to every destination bound to it, and to its
      alternate exchange only when nothing is bound to it.
    - Answers that did not depend on headers are cached per (vhost, exchange, routing key)
      until the next change; ``generation`` counts changes.

    Changes:
    - Apply a mutation when the broker confirms it (``DeclareOk``, ``BindOk``, ...), with
      names already resolved (server-named queues, the ``""`` "last declared queue").
    - Deleting a queue or an exchange removes its bindings. An ``auto_delete`` exchange goes
      with its last binding as source, and that cascades, as in ``rabbit_binding``.
      Unbinding a binding that does not exist changes nothing.
    - A vhost the model learns of starts with RabbitMQ's standard exchanges (``amq.*``).
    - The broker deletes exclusive and auto-delete queues, and applies new policies, without
      a frame the proxy relays: those show up at the next ``load_management``.
    - ``load_management`` reads the management API's documents. The API renders a void
      binding value as the string ``"undefined"``, read back as void; it renders a decimal
      ``(scale, value)`` as the float ``scale.value``, which cannot be read back, so decimal
      binding arguments are exact only when they come from frames.
    """

    def __init__(self, *, cache_size: int = ROUTE_CACHE_SIZE) -> None:
        self._vhosts: dict[str, _VirtualHost] = {}
        self._cache: dict[tuple[str, str, str], frozenset[str]] = {}
        self._cache_size = cache_size
        # Goes up on every change that can change a route; equal values mean equal routes.
        # (A plain attribute: the gates read it per message.)
        self.generation = 0

    def _changed(self) -> None:
        self.generation += 1
        self._cache.clear()

    def _vhost(self, vhost: str) -> _VirtualHost:
        v = self._vhosts.get(vhost)
        if v is None:
            v = self._vhosts[vhost] = _VirtualHost(vhost)
            self._changed()
        return v

    # ------------------------------------------------------------------ routing

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: Mapping[str, object] | None = None) -> frozenset[str]:
        """Names of the queues in ``vhost`` that a publish to ``exchange`` lands in.

        Empty for an unknown vhost or exchange, an internal exchange, or a ``CC``/``BCC``
        header the broker would refuse. ``headers`` are the decoded basic properties'
        headers table. Answers that do not depend on headers are cached until the next change.
        """
        if headers is not None and ("CC" in headers or "BCC" in headers):
            keys = _sender_selected_keys(routing_key, headers)
            v = self._vhosts.get(vhost)
            if keys is None or v is None:
                return _EMPTY
            return v.route(exchange, keys, headers)[0]
        cache_key = (vhost, exchange, routing_key)
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        v = self._vhosts.get(vhost)
        if v is None:
            return _EMPTY
        queues, depends_on_headers = v.route(exchange, (routing_key,), headers)
        if not depends_on_headers and self._cache_size > 0:
            cache = self._cache
            if len(cache) >= self._cache_size:
                del cache[next(iter(cache))]
            cache[cache_key] = queues
        return queues

    # ------------------------------------------------------------------ queries

    def exchange(self, vhost: str, name: str) -> Exchange | None:
        """The exchange, or None when the model does not know it."""
        v = self._vhosts.get(vhost)
        return None if v is None else v.exchanges.get(name)

    def exchanges(self, vhost: str) -> list[Exchange]:
        v = self._vhosts.get(vhost)
        return [] if v is None else sorted(v.exchanges.values(), key=lambda x: x.name)

    def queues(self, vhost: str) -> frozenset[str]:
        v = self._vhosts.get(vhost)
        return _EMPTY if v is None else frozenset(v.queues)

    def bindings(self, vhost: str) -> list[Binding]:
        """Explicit bindings (the default exchange's implicit ones are not listed)."""
        v = self._vhosts.get(vhost)
        if v is None:
            return []
        return [b for out in v.outgoing.values() for b in out.bindings]

    def vhosts(self) -> list[str]:
        return sorted(self._vhosts)

    def knows_exchange(self, vhost: str, name: str) -> bool:
        """Whether the model has the exchange (the default exchange of a known vhost too)."""
        v = self._vhosts.get(vhost)
        return v is not None and name in v.exchanges

    def knows_queue(self, vhost: str, name: str) -> bool:
        v = self._vhosts.get(vhost)
        return v is not None and name in v.queues

    def queue_type(self, vhost: str, name: str) -> QueueType:
        v = self._vhosts.get(vhost)
        return QueueType.CLASSIC if v is None else v.queue_types.get(name, QueueType.CLASSIC)

    def items(self) -> frozenset[tuple[object, ...]]:
        """Everything the model holds that routing depends on, as comparable tuples:
        ``("vhost", name)``, ``("queue", vhost, name, type)``, ``("exchange", vhost, name,
        type, internal, auto_delete, alternate exchange)`` and ``("binding", vhost, source,
        destination kind, destination, routing key, arguments)``. Two models that route alike
        have equal items; a sync compares the model with the broker's listing this way."""
        found: set[tuple[object, ...]] = set()
        for v in self._vhosts.values():
            found.add(("vhost", v.name))
            for q in v.queues:
                found.add(("queue", v.name, q, v.queue_types.get(q, QueueType.CLASSIC).value))
            for x in v.exchanges.values():
                found.add(("exchange", v.name, x.name, x.type, x.internal, x.auto_delete,
                           x.alternate_exchange))
            for out in v.outgoing.values():
                for b in out.bindings:
                    found.add(("binding", v.name, b.source, b.destination.kind.value,
                               b.destination.name, b.routing_key,
                               _listed_form(b.arguments)))
        return frozenset(found)

    # ------------------------------------------------------------------ mutations

    def declare_exchange(self, vhost: str, name: str, type: str, *, durable: bool = True,
                         auto_delete: bool = False, internal: bool = False,
                         arguments: Mapping[str, object] | None = None) -> None:
        """Exchange.DeclareOk: creates it, or updates a known one in place (bindings kept)."""
        if name == "":
            return  # the default exchange cannot be declared
        v = self._vhost(vhost)
        x = Exchange(vhost, name, type, durable, auto_delete, internal, arguments or {},
                     v.policy_alternate_exchange(name))
        old = v.exchanges.get(name)
        if old is not None and old == x and old.arguments == x.arguments:
            return
        v.exchanges[name] = x
        self._changed()

    def delete_exchange(self, vhost: str, name: str) -> None:
        """Exchange.DeleteOk: removes it and its bindings as source and as destination."""
        v = self._vhosts.get(vhost)
        if v is None or name == "":
            return
        v.delete_exchange(name)
        self._changed()

    def declare_queue(self, vhost: str, name: str,
                      queue_type: QueueType = QueueType.CLASSIC) -> None:
        """Queue.DeclareOk, with the name the broker returned."""
        v = self._vhost(vhost)
        if queue_type is QueueType.CLASSIC:
            v.queue_types.pop(name, None)
        else:
            v.queue_types[name] = queue_type
        if name not in v.queues:
            v.queues.add(name)
            self._changed()

    def declare_vhost(self, vhost: str) -> None:
        """A vhost exists: it starts with the standard exchanges."""
        self._vhost(vhost)

    def delete_vhost(self, vhost: str) -> None:
        if self._vhosts.pop(vhost, None) is not None:
            self._changed()

    def apply(self, change: TopologyChange) -> None:
        """Apply one change, whoever made it (a client through the proxy, an event, a
        lookup). Every change is idempotent: applying it twice is applying it once."""
        c, k = change, change.kind
        if k is ChangeKind.DECLARE_QUEUE:
            self.declare_queue(c.vhost, c.name, c.queue_type)
        elif k is ChangeKind.DELETE_QUEUE:
            self.delete_queue(c.vhost, c.name)
        elif k is ChangeKind.DECLARE_EXCHANGE:
            self.declare_exchange(c.vhost, c.name, c.exchange_type, durable=c.durable,
                                  auto_delete=c.auto_delete, internal=c.internal,
                                  arguments=c.arguments)
        elif k is ChangeKind.DELETE_EXCHANGE:
            self.delete_exchange(c.vhost, c.name)
        elif k is ChangeKind.BIND_QUEUE:
            self.bind_queue(c.vhost, c.name, c.source, c.routing_key, c.arguments)
        elif k is ChangeKind.UNBIND_QUEUE:
            self.unbind_queue(c.vhost, c.name, c.source, c.routing_key, c.arguments)
        elif k is ChangeKind.BIND_EXCHANGE:
            self.bind_exchange(c.vhost, c.name, c.source, c.routing_key, c.arguments)
        elif k is ChangeKind.UNBIND_EXCHANGE:
            self.unbind_exchange(c.vhost, c.name, c.source, c.routing_key, c.arguments)
        elif k is ChangeKind.DECLARE_VHOST:
            self.declare_vhost(c.name)
        elif k is ChangeKind.DELETE_VHOST:
            self.delete_vhost(c.name)

    def delete_queue(self, vhost: str, name: str) -> None:
        """Queue.DeleteOk: removes it and its bindings (auto-delete exchanges may follow)."""
        v = self._vhosts.get(vhost)
        if v is None:
            return
        v.queues.discard(name)
        v.queue_types.pop(name, None)
        v.delete_destination(Destination(DestinationKind.QUEUE, name))
        self._changed()

    def bind_queue(self, vhost: str, queue: str, exchange: str, routing_key: str = "",
                   arguments: Mapping[str, object] | None = None) -> None:
        """Queue.BindOk (also proves the queue exists)."""
        if exchange == "":
            return
        v = self._vhost(vhost)
        v.queues.add(queue)
        binding = Binding(vhost, exchange, Destination(DestinationKind.QUEUE, queue),
                          routing_key, arguments or {})
        v.add_binding(binding)
        self._changed()

    def unbind_queue(self, vhost: str, queue: str, exchange: str, routing_key: str = "",
                     arguments: Mapping[str, object] | None = None) -> None:
        """Queue.UnbindOk."""
        self._unbind(Binding(vhost, exchange, Destination(DestinationKind.QUEUE, queue),
                             routing_key, arguments or {}))

    def bind_exchange(self, vhost: str, destination: str, source: str, routing_key: str = "",
                      arguments: Mapping[str, object] | None = None) -> None:
        """Exchange.BindOk: messages routed by ``source`` also go through ``destination``."""
        if source == "" or destination == "":
            return
        binding = Binding(vhost, source, Destination(DestinationKind.EXCHANGE, destination),
                          routing_key, arguments or {})
        self._vhost(vhost).add_binding(binding)
        self._changed()

    def unbind_exchange(self, vhost: str, destination: str, source: str,
                        routing_key: str = "",
                        arguments: Mapping[str, object] | None = None) -> None:
        """Exchange.UnbindOk."""
        self._unbind(Binding(vhost, source, Destination(DestinationKind.EXCHANGE, destination),
                             routing_key, arguments or {}))

    def _unbind(self, binding: Binding) -> None:
        v = self._vhosts.get(binding.vhost)
        if v is not None and v.remove_binding(binding):
            self._changed()

    # ------------------------------------------------------------------ management API

    def load_management(self, exchanges: object, queues: object, bindings: object,
                        policies: object | None = None, *, vhost: str | None = None) -> None:
        """Replace the model (or only ``vhost``'s part) with management API documents.

        ``exchanges``, ``queues``, ``bindings`` and ``policies`` are the decoded JSON of
        ``/api/exchanges``, ``/api/queues`` (only ``name``, ``vhost`` and ``type`` are read, so
        ``?columns=name,vhost,type`` is enough), ``/api/bindings`` and ``/api/policies``, for all
        vhosts or for one (``/api/exchanges/{vhost}``...). Without ``policies``, only
        ``alternate-exchange`` arguments give exchanges an AE. Nothing changes if a document
        is malformed (TopologyError).
        """
        loaded = read_management(exchanges, queues, bindings, policies, vhost=vhost)
        if vhost is None:
            self._vhosts = loaded
        else:
            self._vhosts[vhost] = loaded.get(vhost) or _VirtualHost(vhost)
        self._changed()
