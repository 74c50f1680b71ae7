"""One virtual host of the routing model: exchanges, queues, bindings, the routes through them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from floodwall.control.routing.matching import _Message, _OutgoingBindings
from floodwall.control.routing.model import (
    REPLY_TO_PREFIX,
    STANDARD_EXCHANGES,
    Binding,
    Destination,
    DestinationKind,
    Exchange,
    ExchangeKind,
    _Policy,
)
from floodwall.wire.topology import QueueType

_EMPTY: frozenset[str] = frozenset()


# --------------------------------------------------------------------------- one vhost

class _VirtualHost:
    """Exchanges, queues and bindings of one vhost, with RabbitMQ's deletion cascades."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: set[str] = set()
        self.queue_types: dict[str, QueueType] = {}  # those that are not classic
        self.outgoing: dict[str, _OutgoingBindings] = {}
        self.incoming: dict[Destination, set[Binding]] = {}
        self.policies: list[_Policy] = []
        for xname, xtype, internal in STANDARD_EXCHANGES:
            self.exchanges[xname] = Exchange(name, xname, xtype, internal=internal)

    def policy_alternate_exchange(self, exchange: str) -> str | None:
        best: _Policy | None = None
        for policy in self.policies:
            if (policy.applies_to_exchanges and policy.pattern is not None
                    and policy.pattern.search(exchange)
                    and (best is None or policy.priority > best.priority)):
                best = policy
        return None if best is None else best.alternate_exchange

    def add_binding(self, binding: Binding) -> bool:
        if not self.outgoing.setdefault(binding.source, _OutgoingBindings()).add(binding):
            return False
        self.incoming.setdefault(binding.destination, set()).add(binding)
        return True

    def _drop(self, binding: Binding) -> bool:
        out = self.outgoing.get(binding.source)
        if out is None or not out.remove(binding):
            return False
        if not out.bindings:
            del self.outgoing[binding.source]
        into = self.incoming.get(binding.destination)
        if into is not None:
            into.discard(binding)
            if not into:
                del self.incoming[binding.destination]
        return True

    def remove_binding(self, binding: Binding) -> bool:
        if not self._drop(binding):
            return False
        self._auto_delete([binding.source])
        return True

    def delete_destination(self, destination: Destination) -> None:
        """Drop every binding to ``destination``; then auto-delete sources left unused."""
        removed = list(self.incoming.get(destination, ()))
        for binding in removed:
            self._drop(binding)
        self._auto_delete(b.source for b in removed)

    def delete_exchange(self, name: str) -> None:
        self.exchanges.pop(name, None)
        out = self.outgoing.get(name)
        for binding in list(out.bindings if out is not None else ()):
            self._drop(binding)
        self.delete_destination(Destination(DestinationKind.EXCHANGE, name))

    def _auto_delete(self, sources: Iterable[str]) -> None:
        pending = list(dict.fromkeys(sources))
        while pending:
            name = pending.pop()
            x = self.exchanges.get(name)
            if x is None or not x.auto_delete or name in self.outgoing:
                continue
            del self.exchanges[name]
            removed = list(self.incoming.get(Destination(DestinationKind.EXCHANGE, name), ()))
            for binding in removed:
                self._drop(binding)
            pending.extend(b.source for b in removed)

    def route(self, exchange: str, keys: tuple[str, ...],
              headers: Mapping[str, object] | None) -> tuple[frozenset[str], bool]:
        """Queues a publish lands in, and whether the answer depended on headers."""
        if exchange == "":
            queues = self.queues
            return frozenset(
                k for k in keys if k in queues and not k.startswith(REPLY_TO_PREFIX)), False
        start = self.exchanges.get(exchange)
        if start is None or start.internal:
            return _EMPTY, False
        message = _Message(keys, headers)
        seen = {exchange}
        work = [start]
        found: set[str] = set()
        depends_on_headers = False
        exchanges = self.exchanges
        queue_kind = DestinationKind.QUEUE
        while work:
            x = work.pop()
            out = self.outgoing.get(x.name)
            if x.kind is ExchangeKind.HEADERS:
                depends_on_headers = True
            destinations = out.index(x.kind).destinations(message) if out is not None else ()
            if not destinations:
                ae = x.alternate_exchange
                if ae is not None and ae not in seen:
                    seen.add(ae)
                    nxt = exchanges.get(ae)
                    if nxt is not None:
                        work.append(nxt)
                continue
            for kind, name in destinations:
                if kind is queue_kind:
                    found.add(name)
                elif name not in seen:
                    seen.add(name)
                    nxt = exchanges.get(name)
                    if nxt is not None:
                        work.append(nxt)
        return frozenset(found), depends_on_headers
