"""The exchange/binding model that says which queues a publish lands in, as RabbitMQ 3.10 routes."""

from __future__ import annotations

import calendar
import enum
import functools
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import NamedTuple, TypeAlias

from floodwall.wire.topology import ChangeKind, QueueType, TopologyChange

__all__ = [
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

ROUTE_CACHE_SIZE = 65536
"""Most (vhost, exchange, routing key) answers kept; the oldest goes first."""

REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."
_SENDER_SELECTED = ("CC", "BCC")
_EMPTY: frozenset[str] = frozenset()


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


# --------------------------------------------------------------------------- field values

_Term: TypeAlias = object  # an Erlang-like term: tuples of str/bytes/int/float


def _timestamp(value: datetime) -> int:
    return calendar.timegm(value.utctimetuple())


def _decimal_term(value: Decimal) -> tuple[object, ...]:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return ("opaque", repr(value))  # NaN and infinities have no AMQP encoding
    unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    if exponent > 0:
        return ("decimal", 0, unscaled * 10**exponent)
    return ("decimal", -exponent, unscaled)


def _type_tag(value: object) -> str:
    """The AMQP type a decoded value most likely had, for comparisons inside tables and arrays."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, datetime):
        return "timestamp"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    return "opaque"


def _term(value: object) -> _Term:
    """``value`` as RabbitMQ holds it, so that Python ``==`` on terms is Erlang ``==``."""
    if value is None:
        return ("atom", "undefined")
    if isinstance(value, bool):
        return ("atom", "true" if value else "false")
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("binary", value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return ("binary", bytes(value))
    if isinstance(value, Decimal):
        return _decimal_term(value)
    if isinstance(value, datetime):
        return ("number", _timestamp(value))
    if isinstance(value, Mapping):
        return ("table", tuple(
            (_key_bytes(k), _type_tag(v), _term(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple((_type_tag(v), _term(v)) for v in value))
    # Nothing a decoder should produce; equal only to an equal repr, and never a crash on
    # the publish path.
    return ("opaque", type(value).__name__, repr(value))


def _key_bytes(key: object) -> bytes:
    if isinstance(key, bytes):
        return key
    return str(key).encode()


def _identity(value: object) -> _Term:
    """A hashable, type-exact key for a binding argument value (``True`` is not ``1``)."""
    if isinstance(value, Mapping):
        return ("table", tuple((k, _identity(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_identity(v) for v in value))
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    term = _term(value)
    return (_type_tag(value), term if isinstance(term, tuple) and term[0] == "opaque" else value)


def _arguments_identity(arguments: Mapping[str, object]) -> _Term:
    # RabbitMQ sorts a binding's top-level arguments before comparing bindings.
    return tuple(sorted(((k, _identity(v)) for k, v in arguments.items()),
                        key=lambda item: str(item[0])))


def _frozen(arguments: Mapping[str, object] | None) -> Mapping[str, object]:
    return MappingProxyType(dict(arguments or {}))


# --------------------------------------------------------------------------- topic matching

@functools.lru_cache(maxsize=16384)
def topic_words(key: str) -> tuple[str, ...]:
    """A topic routing or binding key as RabbitMQ splits it: ``""`` is no words at all."""
    return tuple(key.split(".")) if key else ()


def _words_match(pattern: Sequence[str], words: Sequence[str]) -> bool:
    # Glob matching with '#' as "any run of words" and '*' as "one word", backtracking only
    # to the last '#': linear for patterns with at most one '#', never exponential.
    p = w = 0
    star_p, star_w = -1, 0
    n_p, n_w = len(pattern), len(words)
    while w < n_w:
        if p < n_p and pattern[p] == "#":
            star_p, star_w = p, w
            p += 1
        elif p < n_p and (pattern[p] == "*" or pattern[p] == words[w]):
            p += 1
            w += 1
        elif star_p >= 0:
            p = star_p + 1
            star_w += 1
            w = star_w
        else:
            return False
    while p < n_p and pattern[p] == "#":
        p += 1
    return p == n_p


@functools.lru_cache(maxsize=65536)
def topic_matches(binding_key: str, routing_key: str) -> bool:
    """Whether a topic exchange binding key matches a routing key, exactly as RabbitMQ does."""
    return _words_match(topic_words(binding_key), topic_words(routing_key))


# --------------------------------------------------------------------------- headers matching

class _Presence:
    """The pattern value of a void binding argument: the header only has to be there."""

    __slots__ = ()


_PRESENT = _Presence()
_MISSING = object()


@dataclass(frozen=True, slots=True)
class _HeadersPattern:
    match_all: bool
    fields: tuple[tuple[str, object], ...]  # (key, term or _PRESENT)

    @classmethod
    def of(cls, arguments: Mapping[str, object]) -> _HeadersPattern:
        mode = arguments.get("x-match")
        match_all = mode not in ("any", "any-with-x")
        with_x = mode in ("all-with-x", "any-with-x")
        fields = tuple(
            (k, _PRESENT if v is None else _term(v))
            for k, v in arguments.items()
            if k != "x-match" and (with_x or not k.startswith("x-"))
        )
        return cls(match_all, fields)

    def matches(self, data: Mapping[str, object]) -> bool:
        if self.match_all:
            for key, expected in self.fields:
                got = data.get(key, _MISSING)
                if got is _MISSING or (expected is not _PRESENT and got != expected):
                    return False
            return True
        for key, expected in self.fields:
            got = data.get(key, _MISSING)
            if got is not _MISSING and (expected is _PRESENT or got == expected):
                return True
        return False


def _header_terms(headers: Mapping[str, object] | None) -> dict[str, object]:
    if not headers:
        return {}
    return {k: _term(v) for k, v in headers.items() if k != "BCC"}


def headers_match(binding_arguments: Mapping[str, object],
                  headers: Mapping[str, object] | None) -> bool:
    """Whether a headers exchange binding with these arguments matches a message's headers."""
    return _HeadersPattern.of(binding_arguments).matches(_header_terms(headers))


def _sender_selected_keys(routing_key: str, headers: Mapping[str, object]
                          ) -> tuple[str, ...] | None:
    """The routing key plus ``CC`` and ``BCC`` keys, or None when the broker refuses them."""
    keys = [routing_key]
    for name in _SENDER_SELECTED:
        value = headers.get(name, _MISSING)
        if value is _MISSING:
            continue
        if not isinstance(value, list | tuple):
            return None
        keys.extend(v for v in value if isinstance(v, str))
    return tuple(dict.fromkeys(keys))


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


# --------------------------------------------------------------------------- per-exchange indexes

class _Message:
    """What one publish offers to exchanges: its routing keys and (lazily) its header terms."""

    __slots__ = ("_terms", "headers", "keys")

    def __init__(self, keys: tuple[str, ...], headers: Mapping[str, object] | None) -> None:
        self.keys = keys
        self.headers = headers
        self._terms: dict[str, object] | None = None

    def terms(self) -> dict[str, object]:
        if self._terms is None:
            self._terms = _header_terms(self.headers)
        return self._terms


_NO_DESTINATIONS: frozenset[Destination] = frozenset()


class _DirectIndex:
    __slots__ = ("by_key",)

    def __init__(self, bindings: Iterable[Binding]) -> None:
        by_key: dict[str, set[Destination]] = {}
        for b in bindings:
            by_key.setdefault(b.routing_key, set()).add(b.destination)
        self.by_key = {k: frozenset(v) for k, v in by_key.items()}

    def destinations(self, message: _Message) -> Collection[Destination]:
        keys = message.keys
        if len(keys) == 1:
            return self.by_key.get(keys[0], _NO_DESTINATIONS)
        found: set[Destination] = set()
        for key in keys:
            found.update(self.by_key.get(key, ()))
        return found


class _FanoutIndex:
    """Every bound destination: fanout exchanges, and opaque ones conservatively."""

    __slots__ = ("everything",)

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self.everything = frozenset(b.destination for b in bindings)

    def destinations(self, message: _Message) -> Collection[Destination]:
        return self.everything


class _TopicNode:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.destinations: set[Destination] = set()


class _TopicIndex:
    """A trie of binding-key words, walked as ``rabbit_exchange_type_topic:trie_match``."""

    __slots__ = ("root",)

    def __init__(self, bindings: Iterable[Binding]) -> None:
        self.root = _TopicNode()
        for b in bindings:
            node = self.root
            for word in topic_words(b.routing_key):
                node = node.children.setdefault(word, _TopicNode())
            node.destinations.add(b.destination)

    def destinations(self, message: _Message) -> Collection[Destination]:
        found: set[Destination] = set()
        for key in message.keys:
            words = topic_words(key)
            self._match(self.root, words, 0, found, set())
        return found

    def _match(self, node: _TopicNode, words: tuple[str, ...], at: int,
               found: set[Destination], seen: set[tuple[int, int]]) -> None:
        mark = (id(node), at)
        if mark in seen:
            return
        seen.add(mark)
        children = node.children
        if at == len(words):
            found.update(node.destinations)
        else:
            exact = children.get(words[at])
            if exact is not None:
                self._match(exact, words, at + 1, found, seen)
            star = children.get("*")
            if star is not None and star is not exact:
                self._match(star, words, at + 1, found, seen)
        hash_node = children.get("#")
        if hash_node is not None:
            for skip in range(at, len(words) + 1):
                self._match(hash_node, words, skip, found, seen)


class _HeadersIndex:
    """Header patterns filed under the (key, value) pairs and keys that can satisfy them.

    A message's headers then only have to look up their own items: an ``any`` pattern found
    that way matches; an ``all`` pattern, filed under one of its fields, is checked in full.
    """

    __slots__ = ("always", "by_key", "by_value", "entries")

    def __init__(self, bindings: Iterable[Binding]) -> None:
        grouped: dict[object, tuple[_HeadersPattern, set[Destination]]] = {}
        for b in bindings:
            entry = grouped.get(b.arguments_key)
            if entry is None:
                entry = grouped[b.arguments_key] = (_HeadersPattern.of(b.arguments), set())
            entry[1].add(b.destination)
        self.entries = tuple((p, frozenset(d)) for p, d in grouped.values())
        always: set[Destination] = set()
        self.by_value: dict[tuple[str, object], list[int]] = {}
        self.by_key: dict[str, list[int]] = {}
        for i, (pattern, destinations) in enumerate(self.entries):
            if not pattern.fields:
                if pattern.match_all:
                    always.update(destinations)  # "all" of nothing matches every message
                continue
            fields = list(pattern.fields)
            if pattern.match_all:
                valued = [f for f in fields if f[1] is not _PRESENT]
                fields = (valued or fields)[:1]
            for key, expected in fields:
                if expected is _PRESENT:
                    self.by_key.setdefault(key, []).append(i)
                else:
                    self.by_value.setdefault((key, expected), []).append(i)
        self.always = frozenset(always)

    def destinations(self, message: _Message) -> Collection[Destination]:
        data = message.terms()
        found = set(self.always)
        by_value, by_key, entries = self.by_value, self.by_key, self.entries
        tried: set[int] = set()
        for key, value in data.items():
            for candidates in (by_value.get((key, value)), by_key.get(key)):
                if candidates is None:
                    continue
                for i in candidates:
                    if i in tried:
                        continue
                    tried.add(i)
                    pattern, destinations = entries[i]
                    if not pattern.match_all or pattern.matches(data):
                        found.update(destinations)
        return found


_Index: TypeAlias = _DirectIndex | _FanoutIndex | _TopicIndex | _HeadersIndex
_INDEX_FOR_KIND: dict[ExchangeKind, type[_Index]] = {
    ExchangeKind.DIRECT: _DirectIndex,
    ExchangeKind.FANOUT: _FanoutIndex,
    ExchangeKind.TOPIC: _TopicIndex,
    ExchangeKind.HEADERS: _HeadersIndex,
    ExchangeKind.OPAQUE: _FanoutIndex,
}


class _OutgoingBindings:
    """The bindings of one source exchange, with a matching index built when first needed."""

    __slots__ = ("_index", "_index_kind", "bindings")

    def __init__(self) -> None:
        self.bindings: dict[Binding, None] = {}
        self._index: _Index | None = None
        self._index_kind: ExchangeKind | None = None

    def add(self, binding: Binding) -> bool:
        if binding in self.bindings:
            return False
        self.bindings[binding] = None
        self._index = None
        return True

    def remove(self, binding: Binding) -> bool:
        if self.bindings.pop(binding, _MISSING) is _MISSING:
            return False
        self._index = None
        return True

    def index(self, kind: ExchangeKind) -> _Index:
        if self._index is None or self._index_kind is not kind:
            self._index = _INDEX_FOR_KIND[kind](self.bindings)
            self._index_kind = kind
        return self._index


# --------------------------------------------------------------------------- policies

@dataclass(frozen=True)
class _Policy:
    name: str
    pattern: re.Pattern[str] | None  # None: an Erlang regex Python cannot compile
    applies_to_exchanges: bool
    priority: float
    alternate_exchange: str | None


def _read_policy(item: Mapping[str, object], where: str) -> _Policy:
    name = _text(item, "name", where)
    definition = item.get("definition")
    if not isinstance(definition, Mapping):
        raise TopologyError(f"{where}: definition is not an object")
    try:
        pattern: re.Pattern[str] | None = re.compile(_text(item, "pattern", where))
    except re.error:
        pattern = None
    priority = item.get("priority", 0)
    ae = definition.get("alternate-exchange")
    return _Policy(
        name=name,
        pattern=pattern,
        applies_to_exchanges=item.get("apply-to", "all") in ("exchanges", "all"),
        priority=float(priority) if isinstance(priority, int | float) else 0.0,
        alternate_exchange=ae if isinstance(ae, str) else None,
    )


def _text(item: Mapping[str, object], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise TopologyError(f"{where}: {key!r} is missing or not a string")
    return value


def _flag(item: Mapping[str, object], key: str, default: bool, where: str) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise TopologyError(f"{where}: {key!r} is not a boolean")
    return value


def _json_arguments(item: Mapping[str, object], where: str) -> dict[str, object]:
    value = item.get("arguments")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TopologyError(f"{where}: arguments is not an object")
    return {str(k): _from_json(v) for k, v in value.items()}


def _from_json(value: object) -> object:
    """A management API field value; ``"undefined"`` is how the API renders void."""
    if value == "undefined":
        return None
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _from_json(v) for k, v in value.items()}
    return value


def _listed_form(value: object) -> object:
    """A binding argument as the management API lists it (a decimal as a float, a timestamp
    as its integer, bytes as text), hashable: how two sources' bindings are compared."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _listed_form(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", *(_listed_form(v) for v in value))
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return _timestamp(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode(errors="replace")
    return value


def _items(document: object, what: str) -> Iterator[tuple[str, Mapping[str, object]]]:
    if not isinstance(document, list):
        raise TopologyError(f"{what}: expected a JSON array, got {type(document).__name__}")
    for i, item in enumerate(document):
        where = f"{what}[{i}]"
        if not isinstance(item, Mapping):
            raise TopologyError(f"{where}: expected an object")
        yield where, item


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
        loaded: dict[str, _VirtualHost] = {}

        def target(where: str, item: Mapping[str, object]) -> _VirtualHost | None:
            name = _text(item, "vhost", where)
            if vhost is not None and name != vhost:
                return None
            v = loaded.get(name)
            if v is None:
                v = loaded[name] = _VirtualHost(name)
            return v

        policy_ae: dict[tuple[str, str], str | None] = {}
        for where, item in _items(policies if policies is not None else [], "policies"):
            v = target(where, item)
            policy = _read_policy(item, where)
            if v is not None:
                v.policies.append(policy)
                policy_ae[(v.name, policy.name)] = policy.alternate_exchange
        for where, item in _items(exchanges, "exchanges"):
            v = target(where, item)
            if v is None:
                continue
            name = _text(item, "name", where)
            policy_name = item.get("policy")
            v.exchanges[name] = Exchange(
                v.name, name, _text(item, "type", where),
                durable=_flag(item, "durable", True, where),
                auto_delete=_flag(item, "auto_delete", False, where),
                internal=_flag(item, "internal", False, where),
                arguments=_json_arguments(item, where),
                policy_alternate_exchange=(policy_ae.get((v.name, policy_name))
                                           if isinstance(policy_name, str) else None),
            )
        for where, item in _items(queues, "queues"):
            v = target(where, item)
            if v is not None:
                name = _text(item, "name", where)
                v.queues.add(name)
                queue_type = QueueType.of(item.get("type"))
                if queue_type is not QueueType.CLASSIC:
                    v.queue_types[name] = queue_type
        for where, item in _items(bindings, "bindings"):
            v = target(where, item)
            if v is None:
                continue
            source = _text(item, "source", where)
            if source == "":
                continue  # the default exchange's implicit bindings
            try:
                kind = DestinationKind(_text(item, "destination_type", where))
            except ValueError as exc:
                raise TopologyError(f"{where}: unknown destination_type") from exc
            v.add_binding(Binding(
                v.name, source, Destination(kind, _text(item, "destination", where)),
                _text(item, "routing_key", where), _json_arguments(item, where)))
        if vhost is None:
            self._vhosts = loaded
        else:
            self._vhosts[vhost] = loaded.get(vhost) or _VirtualHost(vhost)
        self._changed()


def exchange_changes(exchange: object, bindings: object) -> list[TopologyChange]:
    """The changes one exchange's management API documents mean: its declaration
    (``/api/exchanges/{vhost}/{name}``) and its bindings as source
    (``.../bindings/source``). Raises TopologyError for a malformed document."""
    if not isinstance(exchange, Mapping):
        raise TopologyError("exchange: expected an object")
    where = "exchange"
    vhost = _text(exchange, "vhost", where)
    name = _text(exchange, "name", where)
    changes = [TopologyChange(
        ChangeKind.DECLARE_EXCHANGE, vhost, name,
        arguments=_json_arguments(exchange, where),
        exchange_type=_text(exchange, "type", where),
        durable=_flag(exchange, "durable", True, where),
        auto_delete=_flag(exchange, "auto_delete", False, where),
        internal=_flag(exchange, "internal", False, where))]
    for at, item in _items(bindings, "bindings"):
        source = _text(item, "source", at)
        if source == "":
            continue
        kind = _text(item, "destination_type", at)
        if kind not in ("queue", "exchange"):
            raise TopologyError(f"{at}: unknown destination_type")
        changes.append(TopologyChange(
            ChangeKind.BIND_QUEUE if kind == "queue" else ChangeKind.BIND_EXCHANGE,
            _text(item, "vhost", at), _text(item, "destination", at), source,
            _text(item, "routing_key", at), _json_arguments(item, at)))
    return changes
