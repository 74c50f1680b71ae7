"""How an exchange matches a message: topic words, headers patterns, and one index per exchange
kind over its bindings."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from floodwall.control.routing.model import Binding, Destination, ExchangeKind
from floodwall.control.routing.terms import _term

_SENDER_SELECTED = ("CC", "BCC")


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
