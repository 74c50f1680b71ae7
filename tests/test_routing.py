"""Unit tests for floodwall.control.routing: every routing rule, the topic matcher, cycles and
the cache."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.control.routing import (
    Binding,
    Destination,
    DestinationKind,
    ExchangeKind,
    Topology,
    TopologyError,
    headers_match,
    topic_matches,
    topic_words,
)

V = "/"


def topology(*queues: str) -> Topology:
    t = Topology()
    for q in queues:
        t.declare_queue(V, q)
    return t


# --------------------------------------------------------------------------- topic matcher

# (binding key, routing key, matches). The rows marked "broker" were observed on RabbitMQ 3.10.8.
TOPIC_TABLE = [
    ("", "", True),  # broker
    ("", "a", False),
    ("", ".", False),
    ("*", "", False),  # broker: "" is zero words
    ("*", "a", True),  # broker
    ("*", "a.b", False),
    ("*", ".", False),  # broker: "." is two empty words
    ("#", "", True),  # broker
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("#.#", "", True),  # broker
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("*.*", ".", True),  # broker
    ("*.*", "a.", True),  # broker
    ("*.*", ".a", True),  # broker
    ("*.*", "a", False),
    ("*.*", "a.b.c", False),
    (".", ".", True),  # broker
    (".", "", False),
    ("a.#.b", "a.b", True),  # broker
    ("a.#.b", "a.x.y.b", True),  # broker
    ("a.#.b", "a..b", True),  # broker
    ("a.#.b", "a.b.c", False),
    ("a.#.b", "b", False),
    ("#.a", "a", True),  # broker
    ("#.a", ".a", True),  # broker
    ("#.a", "x.y.a", True),
    ("#.a", "a.b", False),
    ("a.#", "a", True),  # broker
    ("a.#", "a.", True),  # broker
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "", False),
    ("*.#", "", False),  # broker
    ("*.#", "a", True),  # broker
    ("*.#", "a.b.c", True),
    ("#.*", "", False),  # broker
    ("#.*", "a", True),  # broker
    ("#.*", ".", True),  # broker
    ("a..b", "a..b", True),  # broker
    ("a..b", "a.b", False),
    ("a.*.b", "a..b", True),  # broker
    ("a.*.b", "a.b", False),
    ("a.*.b", "a.x.b", True),
    ("a.*.b", "a.x.y.b", False),
    ("a.b", "a.b", True),
    ("a.b", "a.b.", False),
    ("a", "A", False),
    ("a*", "ab", False),  # wildcards are whole words only
    ("a#", "a", False),
    ("a#", "a#", True),
    ("#.#.#", "a", True),
    ("#.b.#", "a.b.c", True),
    ("#.b.#", "b", True),
    ("#.b.#", "a.c", False),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("#.*.#", "", False),
    ("#.*.#", "a", True),
    ("a.#.#.b", "a.b", True),
    ("a.#.b.#.c", "a.x.b.y.b.c", True),
    ("a.#.b.#.c", "a.c.b", False),
    ("*.b.*", "a.b.c", True),
    ("*.b.*", "b.b.b.b", False),
    ("é.*", "é.x", True),
]


@pytest.mark.parametrize(("binding_key", "routing_key", "expected"), TOPIC_TABLE)
def test_topic_matches_table(binding_key: str, routing_key: str, expected: bool) -> None:
    assert topic_matches(binding_key, routing_key) is expected


def test_topic_words_split_as_rabbitmq() -> None:
    assert topic_words("") == ()
    assert topic_words(".") == ("", "")
    assert topic_words("a.") == ("a", "")
    assert topic_words("a.b") == ("a", "b")


def reference_match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """The obvious exponential recursion: an oracle for the matcher and the trie."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and reference_match(rest, words[1:])


key_words = st.lists(st.sampled_from(["a", "b", ""]), max_size=5).map(".".join)
pattern_words = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=5).map(".".join)


@given(pattern_words, key_words)
def test_topic_matches_agrees_with_reference(binding_key: str, routing_key: str) -> None:
    expected = reference_match(topic_words(binding_key), topic_words(routing_key))
    assert topic_matches(binding_key, routing_key) is expected


@given(st.lists(pattern_words, max_size=8), key_words)
def test_topic_exchange_trie_agrees_with_matcher(patterns: list[str], routing_key: str) -> None:
    t = Topology()
    t.declare_exchange(V, "t", "topic")
    for i, p in enumerate(patterns):
        t.bind_queue(V, f"q{i}", "t", p)
    expected = {f"q{i}" for i, p in enumerate(patterns) if topic_matches(p, routing_key)}
    assert t.route(V, "t", routing_key) == expected


# --------------------------------------------------------------------------- exchange types

def test_default_exchange_routes_to_existing_queue_named_by_key() -> None:
    t = topology("orders")
    assert t.route(V, "", "orders") == {"orders"}
    assert t.route(V, "", "missing") == frozenset()
    assert t.route(V, "", "") == frozenset()
    assert t.route("/other", "", "orders") == frozenset()


def test_default_exchange_cannot_be_bound_declared_or_deleted() -> None:
    t = topology("q")
    t.bind_queue(V, "q", "", "other")
    t.bind_exchange(V, "", "amq.direct", "k")
    t.declare_exchange(V, "", "fanout")
    t.delete_exchange(V, "")
    assert t.route(V, "", "other") == frozenset()
    assert t.route(V, "amq.direct", "k") == frozenset()
    assert t.exchange(V, "") is not None and t.exchange(V, "").type == "direct"  # type: ignore[union-attr]
    assert t.route(V, "", "q") == {"q"}


def test_default_exchange_ignores_direct_reply_to() -> None:
    t = topology("amq.rabbitmq.reply-to.abc")
    assert t.route(V, "", "amq.rabbitmq.reply-to.abc") == frozenset()


def test_direct_exchange_matches_key_exactly() -> None:
    t = topology("a", "b", "c")
    t.declare_exchange(V, "d", "direct")
    t.bind_queue(V, "a", "d", "k")
    t.bind_queue(V, "b", "d", "k")
    t.bind_queue(V, "c", "d", "k.*")
    t.bind_queue(V, "c", "d", "")
    assert t.route(V, "d", "k") == {"a", "b"}
    assert t.route(V, "d", "k.x") == frozenset()
    assert t.route(V, "d", "k.*") == {"c"}
    assert t.route(V, "d", "") == {"c"}


def test_fanout_exchange_ignores_key_and_headers() -> None:
    t = topology("a", "b")
    t.declare_exchange(V, "f", "fanout")
    t.bind_queue(V, "a", "f", "ignored")
    t.bind_queue(V, "b", "f")
    assert t.route(V, "f", "anything", {"h": 1}) == {"a", "b"}
    assert t.route(V, "f", "") == {"a", "b"}


def test_topic_exchange_routes_each_queue_once() -> None:
    t = topology("a", "b")
    t.declare_exchange(V, "t", "topic")
    t.bind_queue(V, "a", "t", "#")
    t.bind_queue(V, "a", "t", "x.*")
    t.bind_queue(V, "b", "t", "x.y")
    assert t.route(V, "t", "x.y") == {"a", "b"}
    assert t.route(V, "t", "z") == {"a"}


def test_standard_exchanges_exist_in_every_known_vhost() -> None:
    t = topology("q")
    assert {x.name for x in t.exchanges(V)} >= {"", "amq.direct", "amq.topic", "amq.fanout",
                                                 "amq.headers", "amq.match",
                                                 "amq.rabbitmq.trace"}
    t.bind_queue(V, "q", "amq.topic", "a.*")
    assert t.route(V, "amq.topic", "a.b") == {"q"}
    assert t.route(V, "amq.rabbitmq.trace", "a") == frozenset()  # internal


def test_unknown_exchange_and_vhost_route_nowhere() -> None:
    t = topology("q")
    assert t.route(V, "nope", "q") == frozenset()
    assert t.route("nowhere", "amq.direct", "q") == frozenset()


def test_internal_exchange_is_not_publishable_but_routes_when_reached() -> None:
    t = topology("q")
    t.declare_exchange(V, "front", "fanout")
    t.declare_exchange(V, "inner", "fanout", internal=True)
    t.bind_exchange(V, "inner", "front")
    t.bind_queue(V, "q", "inner")
    assert t.route(V, "inner", "") == frozenset()
    assert t.route(V, "front", "") == {"q"}
    t.declare_exchange(V, "lonely", "direct", arguments={"alternate-exchange": "inner"})
    assert t.route(V, "lonely", "k") == {"q"}


def test_opaque_exchange_routes_conservatively_to_everything_bound() -> None:
    t = topology("a", "b", "spill")
    t.declare_exchange(V, "spill", "fanout")
    t.bind_queue(V, "spill", "spill")
    t.declare_exchange(V, "h", "x-consistent-hash", arguments={"alternate-exchange": "spill"})
    x = t.exchange(V, "h")
    assert x is not None and x.kind is ExchangeKind.OPAQUE and x.type == "x-consistent-hash"
    assert t.route(V, "h", "any") == {"spill"}  # nothing bound: the AE
    t.bind_queue(V, "a", "h", "1")
    t.bind_queue(V, "b", "h", "3")
    assert t.route(V, "h", "any") == {"a", "b"}


# --------------------------------------------------------------------------- headers

def headers_topology(**bindings: dict[str, object]) -> Topology:
    t = Topology()
    t.declare_exchange(V, "h", "headers")
    for queue, args in bindings.items():
        t.bind_queue(V, queue, "h", "", args)
    return t


def test_headers_all_and_any() -> None:
    t = headers_topology(
        all_=({"x-match": "all", "a": 1, "b": "x"}),
        any_=({"x-match": "any", "a": 1, "b": "x"}),
        default=({"a": 1, "b": "x"}),
    )
    assert t.route(V, "h", "", {"a": 1, "b": "x"}) == {"all_", "any_", "default"}
    assert t.route(V, "h", "", {"a": 1}) == {"any_"}
    assert t.route(V, "h", "", {"a": 2, "b": "x", "c": 0}) == {"any_"}
    assert t.route(V, "h", "", {}) == frozenset()
    assert t.route(V, "h", "", None) == frozenset()


def test_headers_empty_patterns() -> None:
    # Observed on the broker: "all" with no keys matches everything, "any" nothing.
    t = headers_topology(all_={"x-match": "all"}, any_={"x-match": "any"}, bare={})
    assert t.route(V, "h", "", None) == {"all_", "bare"}
    assert t.route(V, "h", "", {"a": 1}) == {"all_", "bare"}


def test_headers_x_keys_ignored_unless_with_x() -> None:
    t = headers_topology(
        plain={"x-match": "all", "x-foo": "z"},
        all_x={"x-match": "all-with-x", "x-foo": "z"},
        any_x={"x-match": "any-with-x", "x-foo": "z", "a": 1},
    )
    assert t.route(V, "h", "", {}) == {"plain"}
    assert t.route(V, "h", "", {"x-foo": "z"}) == {"plain", "all_x", "any_x"}
    assert t.route(V, "h", "", {"a": 1}) == {"plain", "any_x"}
    # x-match itself is never a key to match, even with -with-x.
    assert headers_match({"x-match": "all-with-x"}, {}) is True


def test_headers_unknown_x_match_falls_back_to_all() -> None:
    assert headers_match({"x-match": "bogus", "a": 1}, {"a": 1}) is True
    assert headers_match({"x-match": 7, "a": 1, "b": 2}, {"a": 1}) is False


def test_headers_void_binding_value_means_presence() -> None:
    assert headers_match({"a": None}, {"a": 5}) is True
    assert headers_match({"a": None}, {"a": None}) is True
    assert headers_match({"a": None}, {"b": 5}) is False
    assert headers_match({"x-match": "any", "a": None, "b": 1}, {"a": "anything"}) is True
    # a void *header* is just a value: it equals only a void pattern value
    assert headers_match({"a": 1}, {"a": None}) is False


@pytest.mark.parametrize(("pattern", "header", "expected"), [
    (1, 1, True),
    (1, 1.0, True),  # Erlang: 1 == 1.0
    (1.5, 1.5, True),
    (1, True, False),  # Erlang: true is an atom, not 1
    (True, True, True),
    (True, 1, False),
    (False, 0, False),
    ("1", 1, False),
    ("1", b"1", True),  # longstr and byte array are both binaries
    ("a", "a", True),
    ("a", "A", False),
    (1577836800, datetime(2020, 1, 1, tzinfo=UTC), True),  # a timestamp is its integer
    (1, datetime(1970, 1, 1, 0, 0, 1), True),
    (Decimal("1"), Decimal("1"), True),
    (Decimal("1"), 1, False),  # a decimal is a {Scale, Value} tuple
    (Decimal("1.5"), Decimal("1.50"), False),  # different scale
    (Decimal("15E-1"), Decimal("1.5"), True),
    ([1, "a"], [1, "a"], True),
    ([1, "a"], ["a", 1], False),
    ([1], [True], False),
    ({"k": 1}, {"k": 1}, True),
    ({"k": 1}, {"k": 2}, False),
])
def test_headers_values_compare_as_erlang(pattern: object, header: object,
                                          expected: bool) -> None:
    assert headers_match({"k": pattern}, {"k": header}) is expected


def test_headers_exchange_sees_cc_but_not_bcc() -> None:
    t = headers_topology(cc={"x-match": "any", "CC": None}, bcc={"x-match": "any", "BCC": None})
    assert t.route(V, "h", "", {"CC": ["z"], "BCC": ["z"]}) == {"cc"}


def test_headers_with_values_no_decoder_produces_never_crash() -> None:
    odd = complex(1, 2)
    assert headers_match({"a": odd}, {"a": odd}) is True
    assert headers_match({"a": odd}, {"a": 1}) is False
    assert headers_match({"a": 1}, {"a": Decimal("NaN")}) is False
    t = Topology()
    t.bind_queue(V, "q", "amq.headers", "", {"a": odd})
    assert t.route(V, "amq.headers", "", {"a": odd, "b": object()}) == {"q"}


# --------------------------------------------------------------------------- CC and BCC

def test_cc_and_bcc_add_routing_keys() -> None:
    t = topology("c1", "c2", "c3")
    t.declare_exchange(V, "d", "direct")
    for i in (1, 2, 3):
        t.bind_queue(V, f"c{i}", "d", f"k{i}")
    assert t.route(V, "d", "k1", {"CC": ["k2"], "BCC": ["k3"]}) == {"c1", "c2", "c3"}
    assert t.route(V, "d", "none", {"CC": ["k2", 7, b"k3"]}) == {"c2"}  # only strings count
    assert t.route(V, "", "nope", {"CC": ["c1"]}) == {"c1"}
    t.declare_exchange(V, "t", "topic")
    t.bind_queue(V, "c1", "t", "a.*")
    assert t.route(V, "t", "b", {"BCC": ["a.x"]}) == {"c1"}


def test_cc_that_is_not_an_array_routes_nowhere() -> None:
    t = topology("q")
    assert t.route(V, "", "q", {"CC": "q"}) == frozenset()
    assert t.route(V, "", "q", {"BCC": None}) == frozenset()


def test_cc_keys_reach_downstream_exchanges_and_count_against_alternates() -> None:
    t = topology("a", "spill")
    t.declare_exchange(V, "spill", "fanout")
    t.bind_queue(V, "spill", "spill")
    t.declare_exchange(V, "d", "direct", arguments={"alternate-exchange": "spill"})
    t.declare_exchange(V, "d2", "direct")
    t.bind_exchange(V, "d2", "d", "k2")
    t.bind_queue(V, "a", "d2", "k3")
    # "k2" matches d -> d2 (so d's AE is not used); "k3" then matches in d2.
    assert t.route(V, "d", "k1", {"CC": ["k2", "k3"]}) == {"a"}
    assert t.route(V, "d", "k1") == {"spill"}


# --------------------------------------------------------------------------- AE and e2e

def test_alternate_exchange_used_only_when_nothing_matched() -> None:
    t = topology("q", "spill")
    t.declare_exchange(V, "spill", "fanout")
    t.bind_queue(V, "spill", "spill")
    t.declare_exchange(V, "d", "direct", arguments={"alternate-exchange": "spill"})
    t.bind_queue(V, "q", "d", "k")
    assert t.route(V, "d", "k") == {"q"}
    assert t.route(V, "d", "other") == {"spill"}


def test_alternate_exchange_not_used_when_a_matched_exchange_routes_nowhere() -> None:
    # Observed on the broker: x -> y matched, y routes nothing, x's AE is still not used.
    t = topology("spill")
    t.declare_exchange(V, "spill", "fanout")
    t.bind_queue(V, "spill", "spill")
    t.declare_exchange(V, "x", "direct", arguments={"alternate-exchange": "spill"})
    t.declare_exchange(V, "y", "direct")
    t.bind_exchange(V, "y", "x", "k")
    assert t.route(V, "x", "k") == frozenset()
    # ... but y's own AE is used, as y matched nothing
    t.declare_exchange(V, "y", "direct", arguments={"alternate-exchange": "spill"})
    assert t.route(V, "x", "k") == {"spill"}


def test_alternate_exchange_chain_and_cycle() -> None:
    t = topology("end")
    t.declare_exchange(V, "a", "direct", arguments={"alternate-exchange": "b"})
    t.declare_exchange(V, "b", "topic", arguments={"alternate-exchange": "c"})
    t.declare_exchange(V, "c", "direct", arguments={"alternate-exchange": "a"})
    assert t.route(V, "a", "k") == frozenset()  # a -> b -> c -> a: ends
    t.bind_queue(V, "end", "c", "k")
    assert t.route(V, "a", "k") == {"end"}
    assert t.route(V, "b", "k") == {"end"}
    assert t.route(V, "c", "zz") == frozenset()


def test_alternate_exchange_self_missing_and_default() -> None:
    t = topology("q")
    t.declare_exchange(V, "self", "direct", arguments={"alternate-exchange": "self"})
    t.declare_exchange(V, "gone", "direct", arguments={"alternate-exchange": "missing"})
    t.declare_exchange(V, "dflt", "direct", arguments={"alternate-exchange": ""})
    assert t.route(V, "self", "q") == frozenset()
    assert t.route(V, "gone", "q") == frozenset()
    # Observed on the broker: the default exchange as an AE delivers nowhere in 3.10.
    assert t.route(V, "dflt", "q") == frozenset()
    t.declare_exchange(V, "missing", "fanout")
    t.bind_queue(V, "q", "missing")
    assert t.route(V, "gone", "x") == {"q"}  # the AE is looked up by name at routing time


def test_exchange_to_exchange_is_transitive() -> None:
    t = topology("q1", "q2", "q3")
    t.declare_exchange(V, "a", "topic")
    t.declare_exchange(V, "b", "direct")
    t.declare_exchange(V, "c", "fanout")
    t.bind_exchange(V, "b", "a", "x.*")
    t.bind_exchange(V, "c", "b", "x.y")
    t.bind_queue(V, "q1", "a", "#")
    t.bind_queue(V, "q2", "b", "x.z")
    t.bind_queue(V, "q3", "c")
    assert t.route(V, "a", "x.y") == {"q1", "q3"}
    assert t.route(V, "a", "x.z") == {"q1", "q2"}
    assert t.route(V, "a", "w") == {"q1"}


def test_exchange_to_exchange_cycles_terminate() -> None:
    t = topology("q")
    for name in ("a", "b", "c"):
        t.declare_exchange(V, name, "fanout")
    t.bind_exchange(V, "b", "a")
    t.bind_exchange(V, "c", "b")
    t.bind_exchange(V, "a", "c")
    t.bind_exchange(V, "a", "a")
    assert t.route(V, "a", "") == frozenset()
    t.bind_queue(V, "q", "c")
    assert t.route(V, "b", "") == {"q"}


def test_exchange_binding_to_unknown_exchange_routes_nowhere_until_declared() -> None:
    t = topology("q")
    t.declare_exchange(V, "a", "fanout")
    t.bind_exchange(V, "b", "a")
    assert t.route(V, "a", "") == frozenset()
    t.declare_exchange(V, "b", "fanout")
    t.bind_queue(V, "q", "b")
    assert t.route(V, "a", "") == {"q"}


def test_headers_exchange_downstream_of_topic() -> None:
    t = topology("q")
    t.declare_exchange(V, "t", "topic")
    t.declare_exchange(V, "h", "headers")
    t.bind_exchange(V, "h", "t", "a.#")
    t.bind_queue(V, "q", "h", "", {"k": "v"})
    assert t.route(V, "t", "a.b", {"k": "v"}) == {"q"}
    assert t.route(V, "t", "a.b", {"k": "w"}) == frozenset()
    assert t.route(V, "t", "a.b", None) == frozenset()
    assert t.route(V, "t", "a.b", {"k": "v"}) == {"q"}


# --------------------------------------------------------------------------- policies

POLICY = {"vhost": V, "name": "ae", "pattern": "^pol\\.", "apply-to": "exchanges",
          "definition": {"alternate-exchange": "spill"}, "priority": 0}


def spill_docs() -> tuple[list[dict[str, object]], list[dict[str, object]],
                          list[dict[str, object]]]:
    exchanges: list[dict[str, object]] = [
        {"name": "spill", "vhost": V, "type": "fanout", "durable": True,
         "auto_delete": False, "internal": False, "arguments": {}},
        {"name": "pol.x", "vhost": V, "type": "direct", "durable": True,
         "auto_delete": False, "internal": False, "arguments": {}, "policy": "ae"},
    ]
    queues: list[dict[str, object]] = [{"name": "spilled", "vhost": V}]
    bindings: list[dict[str, object]] = [
        {"source": "spill", "vhost": V, "destination": "spilled", "destination_type": "queue",
         "routing_key": "", "arguments": {}, "properties_key": "~"},
    ]
    return exchanges, queues, bindings


def test_policy_alternate_exchange_from_management() -> None:
    t = Topology()
    t.load_management(*spill_docs(), [POLICY])
    assert t.route(V, "pol.x", "k") == {"spilled"}
    without = Topology()
    without.load_management(*spill_docs())
    assert without.route(V, "pol.x", "k") == frozenset()


def test_policy_applies_to_exchanges_declared_later_and_argument_wins() -> None:
    t = Topology()
    t.load_management(*spill_docs(), [
        POLICY,
        {**POLICY, "name": "low", "pattern": ".*", "priority": -1,
         "definition": {"alternate-exchange": "elsewhere"}},
        {**POLICY, "name": "queues-only", "pattern": ".*", "priority": 9,
         "apply-to": "queues", "definition": {"alternate-exchange": "elsewhere"}},
    ])
    t.declare_exchange(V, "pol.new", "topic")
    assert t.route(V, "pol.new", "k") == {"spilled"}
    t.declare_exchange(V, "pol.arg", "topic", arguments={"alternate-exchange": "none"})
    assert t.route(V, "pol.arg", "k") == frozenset()
    x = t.exchange(V, "other")
    assert x is None
    t.declare_exchange(V, "other", "topic")
    assert t.exchange(V, "other").alternate_exchange == "elsewhere"  # type: ignore[union-attr]


def test_policy_with_a_pattern_python_cannot_compile_still_names_the_ae() -> None:
    erlang_only = {**POLICY, "pattern": "^pol\\.(?<name>x)"}  # fine in PCRE, not in Python
    t = Topology()
    t.load_management(*spill_docs(), [erlang_only])
    assert t.route(V, "pol.x", "k") == {"spilled"}  # the exchange names its policy
    t.declare_exchange(V, "pol.y", "direct")  # ... but a new one cannot be matched
    assert t.route(V, "pol.y", "k") == frozenset()


# --------------------------------------------------------------------------- mutations

def test_delete_exchange_removes_bindings_as_source_and_destination() -> None:
    t = topology("q")
    t.declare_exchange(V, "a", "fanout")
    t.declare_exchange(V, "b", "fanout")
    t.bind_exchange(V, "b", "a")
    t.bind_queue(V, "q", "b")
    t.delete_exchange(V, "b")
    assert t.bindings(V) == []
    t.declare_exchange(V, "b", "fanout")  # recreated: its old bindings are gone for good
    assert t.route(V, "a", "") == frozenset()
    assert t.route(V, "b", "") == frozenset()


def test_delete_queue_removes_its_bindings_and_default_route() -> None:
    t = topology("q", "r")
    t.declare_exchange(V, "f", "fanout")
    t.bind_queue(V, "q", "f")
    t.bind_queue(V, "r", "f")
    t.delete_queue(V, "q")
    assert t.route(V, "f", "") == {"r"}
    assert t.route(V, "", "q") == frozenset()
    assert t.queues(V) == {"r"}
    t.declare_queue(V, "q")
    assert t.route(V, "f", "") == {"r"}


def test_unbind_removes_only_the_exact_binding() -> None:
    t = topology("q")
    t.declare_exchange(V, "h", "headers")
    t.bind_queue(V, "q", "h", "", {"a": True})
    t.bind_queue(V, "q", "h", "", {"a": 1})
    assert len(t.bindings(V)) == 2  # True and 1 are different AMQP values
    t.unbind_queue(V, "q", "h", "", {"a": 1})
    assert t.route(V, "h", "", {"a": 1}) == frozenset()
    assert t.route(V, "h", "", {"a": True}) == {"q"}
    t.unbind_queue(V, "q", "h", "other-key", {"a": True})
    assert t.route(V, "h", "", {"a": True}) == {"q"}


def test_bindings_with_same_key_and_different_arguments_are_distinct() -> None:
    t = topology("q")
    t.declare_exchange(V, "d", "direct")
    t.bind_queue(V, "q", "d", "k", {"x": 1})
    t.bind_queue(V, "q", "d", "k", {"x": 2})
    t.bind_queue(V, "q", "d", "k", {"x": 2})  # same binding again: no duplicate
    assert len(t.bindings(V)) == 2
    t.unbind_queue(V, "q", "d", "k", {"x": 1})
    assert t.route(V, "d", "k") == {"q"}
    t.unbind_queue(V, "q", "d", "k", {"x": 2})
    assert t.route(V, "d", "k") == frozenset()


def test_auto_delete_exchanges_cascade_on_unbind() -> None:
    # Observed on the broker: unbinding q from ad2 deletes ad2, which deletes ad1.
    t = topology("q")
    t.declare_exchange(V, "ad1", "fanout", auto_delete=True)
    t.declare_exchange(V, "ad2", "fanout", auto_delete=True)
    t.declare_exchange(V, "keep", "fanout")
    t.bind_queue(V, "q", "ad2")
    t.bind_exchange(V, "ad2", "ad1")
    t.bind_exchange(V, "ad2", "keep")
    t.unbind_queue(V, "q", "ad2")
    assert t.exchange(V, "ad2") is None
    assert t.exchange(V, "ad1") is None
    assert t.exchange(V, "keep") is not None
    assert t.bindings(V) == []


def test_auto_delete_exchange_goes_with_its_last_queue() -> None:
    t = topology("q", "r")
    t.declare_exchange(V, "ad", "fanout", auto_delete=True)
    t.bind_queue(V, "q", "ad")
    t.bind_queue(V, "r", "ad")
    t.delete_queue(V, "q")
    assert t.exchange(V, "ad") is not None
    t.delete_queue(V, "r")
    assert t.exchange(V, "ad") is None


def test_auto_delete_exchange_survives_without_ever_having_bindings() -> None:
    # Observed on the broker: declared and never bound, or an unbind of nothing: it stays.
    t = topology("q")
    t.declare_exchange(V, "ad", "fanout", auto_delete=True)
    t.unbind_queue(V, "q", "ad")
    t.unbind_exchange(V, "ad", "ad", "nothing")
    assert t.exchange(V, "ad") is not None


def test_deleting_an_exchange_auto_deletes_its_sources() -> None:
    t = Topology()
    t.declare_exchange(V, "src", "fanout", auto_delete=True)
    t.declare_exchange(V, "dst", "fanout")
    t.bind_exchange(V, "dst", "src")
    t.delete_exchange(V, "dst")
    assert t.exchange(V, "src") is None


def test_redeclare_keeps_bindings_and_updates_type() -> None:
    t = topology("q")
    t.declare_exchange(V, "x", "direct")
    t.bind_queue(V, "q", "x", "a.*")
    assert t.route(V, "x", "a.b") == frozenset()
    t.declare_exchange(V, "x", "topic")  # the model follows what the broker confirmed
    assert t.route(V, "x", "a.b") == {"q"}


def test_bind_proves_the_queue_exists() -> None:
    t = Topology()
    t.bind_queue(V, "q", "amq.direct", "k")
    assert t.route(V, "", "q") == {"q"}


def test_binding_records_compare_by_typed_arguments() -> None:
    dest = Destination(DestinationKind.QUEUE, "q")
    assert Binding(V, "x", dest, "k", {"a": 1}) == Binding(V, "x", dest, "k", {"a": 1})
    assert Binding(V, "x", dest, "k", {"a": 1}) != Binding(V, "x", dest, "k", {"a": True})
    assert Binding(V, "x", dest, "k", {"a": 1, "b": 2}) == Binding(V, "x", dest, "k",
                                                                   {"b": 2, "a": 1})


# --------------------------------------------------------------------------- cache

def test_cache_is_invalidated_by_every_kind_of_change() -> None:
    t = topology("q")
    t.declare_exchange(V, "t", "topic")
    assert t.route(V, "t", "a.b") == frozenset()
    steps: list[tuple[Callable[[], None], set[str]]] = [
        (lambda: t.bind_queue(V, "q", "t", "a.*"), {"q"}),
        (lambda: t.unbind_queue(V, "q", "t", "a.*"), set()),
        (lambda: t.bind_queue(V, "q", "t", "#"), {"q"}),
        (lambda: t.delete_queue(V, "q"), set()),
        (lambda: t.bind_queue(V, "q", "t", "#"), {"q"}),
        (lambda: t.declare_exchange(V, "t", "direct"), set()),
        (lambda: t.declare_exchange(V, "t", "topic"), {"q"}),
        (lambda: t.delete_exchange(V, "t"), set()),
    ]
    for change, expected in steps:
        before = t.generation
        change()
        assert t.generation > before
        assert t.route(V, "t", "a.b") == expected
        assert t.route(V, "t", "a.b") == expected  # the cached answer too


def test_cache_is_invalidated_by_default_exchange_queue_changes() -> None:
    t = Topology()
    t.declare_exchange(V, "x", "direct")
    assert t.route(V, "", "q") == frozenset()
    t.declare_queue(V, "q")
    assert t.route(V, "", "q") == {"q"}
    t.delete_queue(V, "q")
    assert t.route(V, "", "q") == frozenset()


def test_cache_returns_the_same_object_and_skips_header_dependent_routes() -> None:
    t = topology("q", "r")
    t.declare_exchange(V, "f", "fanout")
    t.bind_queue(V, "q", "f")
    first = t.route(V, "f", "k")
    assert t.route(V, "f", "k", {"whatever": 1}) is first
    t.declare_exchange(V, "h", "headers")
    t.bind_exchange(V, "h", "f")
    t.bind_queue(V, "r", "h", "", {"a": 1})
    assert t.route(V, "f", "k", {"a": 1}) == {"q", "r"}
    assert t.route(V, "f", "k", {"a": 2}) == {"q"}
    assert t.route(V, "f", "k") == {"q"}
    assert t.route(V, "f", "k", {"a": 1}) == {"q", "r"}


def test_cache_is_bounded() -> None:
    t = Topology(cache_size=4)
    t.declare_exchange(V, "t", "topic")
    t.bind_queue(V, "q", "t", "#")
    for i in range(10):
        assert t.route(V, "t", f"k{i}") == {"q"}
    assert len(t._cache) == 4
    assert t.route(V, "t", "k0") == {"q"}
    uncached = Topology(cache_size=0)
    uncached.bind_queue(V, "q", "amq.topic", "#")
    assert uncached.route(V, "amq.topic", "k") == {"q"}
    assert uncached._cache == {}


def test_cc_routes_bypass_the_cache() -> None:
    t = topology("a", "b")
    t.declare_exchange(V, "d", "direct")
    t.bind_queue(V, "a", "d", "ka")
    t.bind_queue(V, "b", "d", "kb")
    assert t.route(V, "d", "ka") == {"a"}
    assert t.route(V, "d", "ka", {"CC": ["kb"]}) == {"a", "b"}
    assert t.route(V, "d", "ka") == {"a"}


# --------------------------------------------------------------------------- management API

def test_load_management_documents() -> None:
    # Shapes as RabbitMQ 3.10.8's /api/exchanges, /api/queues and /api/bindings return them.
    exchanges = [
        {"arguments": {}, "auto_delete": False, "durable": True, "internal": False, "name": "",
         "type": "direct", "user_who_performed_action": "rmq-internal", "vhost": V},
        {"arguments": {"alternate-exchange": "ae"}, "auto_delete": False, "durable": False,
         "internal": False, "name": "h", "type": "headers", "vhost": V},
        {"arguments": {}, "auto_delete": False, "durable": False, "internal": False,
         "name": "ae", "type": "fanout", "vhost": V},
        {"arguments": {}, "auto_delete": False, "durable": True, "internal": False,
         "name": "other", "type": "fanout", "vhost": "v2"},
    ]
    queues = [{"name": "q", "vhost": V}, {"name": "spill", "vhost": V},
              {"name": "q2", "vhost": "v2"}]
    bindings = [
        {"source": "", "vhost": V, "destination": "q", "destination_type": "queue",
         "routing_key": "q", "arguments": {}, "properties_key": "q"},
        {"source": "h", "vhost": V, "destination": "q", "destination_type": "queue",
         "routing_key": "", "arguments": {"a": "undefined", "x-match": "all"},
         "properties_key": "~abc"},
        {"source": "ae", "vhost": V, "destination": "spill", "destination_type": "queue",
         "routing_key": "", "arguments": {}, "properties_key": "~"},
        {"source": "other", "vhost": "v2", "destination": "q2", "destination_type": "queue",
         "routing_key": "", "arguments": {}, "properties_key": "~"},
    ]
    t = Topology()
    t.declare_queue("stale", "gone")
    t.load_management(exchanges, queues, bindings)
    assert t.vhosts() == ["/", "v2"]
    assert t.route(V, "h", "", {"a": "anything"}) == {"q"}  # "undefined" read as void
    assert t.route(V, "h", "", {"b": 1}) == {"spill"}
    assert t.route(V, "", "q") == {"q"}
    assert t.route("v2", "other", "") == {"q2"}
    assert len(t.bindings(V)) == 2

    t.load_management([], [], [], vhost="v2")  # one vhost replaced, the other kept
    assert t.route("v2", "other", "") == frozenset()
    assert t.route(V, "h", "", {"b": 1}) == {"spill"}
    t.load_management(exchanges, queues, bindings, vhost=V)
    assert t.vhosts() == ["/", "v2"] and t.queues(V) == {"q", "spill"}


@pytest.mark.parametrize(("exchanges", "queues", "bindings"), [
    ({}, [], []),
    ([{"vhost": V, "type": "direct"}], [], []),
    ([{"name": "x", "vhost": V, "type": "direct", "internal": "no"}], [], []),
    ([], [{"vhost": V}], []),
    ([], [], [{"source": "x", "vhost": V, "destination": "q", "destination_type": "stream",
               "routing_key": "", "arguments": {}}]),
    ([], [], [{"source": "x", "vhost": V, "destination": "q", "destination_type": "queue",
               "routing_key": "", "arguments": []}]),
    ([], [], ["x"]),
])
def test_load_management_refuses_malformed_documents_and_keeps_the_model(
        exchanges: object, queues: object, bindings: object) -> None:
    t = topology("q")
    with pytest.raises(TopologyError):
        t.load_management(exchanges, queues, bindings)
    assert t.route(V, "", "q") == {"q"}


header_values = st.sampled_from([1, 0, 1.0, "1", "a", b"a", True, False, None])
header_tables = st.dictionaries(st.sampled_from(["a", "b", "x-c"]), header_values, max_size=3)


@given(st.lists(st.tuples(st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"]),
                          header_tables), max_size=8),
       st.one_of(st.none(), header_tables))
def test_headers_exchange_index_agrees_with_matcher(
        patterns: list[tuple[str | None, dict[str, object]]],
        headers: dict[str, object] | None) -> None:
    t = Topology()
    t.declare_exchange(V, "h", "headers")
    expected = set()
    for i, (mode, table) in enumerate(patterns):
        args = dict(table) if mode is None else {**table, "x-match": mode}
        t.bind_queue(V, f"q{i}", "h", "", args)
        if headers_match(args, headers):
            expected.add(f"q{i}")
    assert t.route(V, "h", "", headers) == expected
