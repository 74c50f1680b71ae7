"""RabbitMQ's topology events read as model changes (floodwall/control/routing/events.py).

The header values below are copied from events a RabbitMQ 3.10.8 broker sent (pika decoded
them): the arguments arrive as arrays of Erlang terms printed as text.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.control.routing import ChangeKind, QueueType, Topology
from floodwall.control.routing.events import EventError, EventNote, erlang_arguments, read_event

HEADERS_BINDING = [
    '{<<"arr">>,array,[{signedint,1},{longstr,<<"two">>},{bool,false}]}',
    '{<<"b">>,bool,true}', '{<<"big">>,long,1099511627776}', '{<<"d">>,decimal,{2,125}}',
    '{<<"i">>,signedint,5}', '{<<"n">>,void,undefined}', '{<<"neg">>,signedint,-7}',
    '{<<"s">>,longstr,<<"héllo \\"w\\" \\\\ \\n">>}',
    '{<<"t">>,table,[{<<"a">>,signedint,1},{<<"b">>,longstr,<<"c">>}]}',
    '{<<"ts">>,timestamp,1577836800}', '{<<"x-match">>,longstr,<<"any">>}']


def test_arguments_read_back_as_a_client_frame_decodes_them() -> None:
    assert erlang_arguments(HEADERS_BINDING) == {
        "arr": [1, "two", False], "b": True, "big": 1099511627776, "d": Decimal("1.25"),
        "i": 5, "n": None, "neg": -7, "s": 'héllo "w" \\ \n', "t": {"a": 1, "b": "c"},
        "ts": 1577836800, "x-match": "any"}
    assert erlang_arguments([]) == {} and erlang_arguments(None) == {}
    assert erlang_arguments({"already": "a table"}) == {"already": "a table"}


@pytest.mark.parametrize(("term", "value"), [
    ('{<<"k">>,longstr,<<"é"/utf8>>}', "é"),
    ('{<<"k">>,longstr,<<104,105>>}', "hi"),
    ('{<<"k">>,binary,<<0,255>>}', b"\x00\xff"),
    ('{<<"k">>,longstr,<<>>}', ""),
    ('{<<"k">>,double,1.5e-3}', 0.0015),
    ('{<<"k">>,float,2}', 2.0),
    ('{<<"k">>,longstr,<<"tab\\there \\101">>}', "tab\there A"),
    ('{<<"k">>,longstr,<<"\\x{e9}t\\x41">>}', "étA"),
    ('{<<"k">>,array,[]}', []),
    ('{<<"k">>,table,[]}', {}),
    ('{<<"k">>,long,16#ff}', 255),
    ('{<<"k">>,long,-2#101}', -5),
])
def test_each_term_form(term: str, value: object) -> None:
    assert erlang_arguments([term]) == {"k": value}


@pytest.mark.parametrize("bad", [
    "", "{", '{<<"k">>,longstr}', '{<<"k">>,nosuchtype,1}', '{<<"k">>,signedint,<<"x">>}',
    '{<<"k">>,longstr,<<"unterminated>>}', '{<<"k">>,bool,maybe}', '{<<"k">>,long,1} trailing',
    '{<<"k">>,decimal,{1}}', '{<<"k">>,array,[1]}', '{<<"k">>,longstr,<<300>>}', "[1,2",
])
def test_malformed_terms_raise_event_error(bad: str) -> None:
    with pytest.raises(EventError):
        erlang_arguments([bad])
    with pytest.raises(EventError):
        erlang_arguments("not an array")


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_event_error(text: str) -> None:
    try:
        erlang_arguments([text])
    except EventError:
        pass


@given(st.lists(st.one_of(st.text(max_size=20), st.integers(-10**12, 10**12), st.booleans(),
                          st.none()), max_size=5))
def test_printed_binding_tables_read_back(values: list[object]) -> None:
    """Terms printed the way the broker prints them read back to the same values."""
    def printed(value: object) -> tuple[str, str]:
        if value is None:
            return "void", "undefined"
        if isinstance(value, bool):
            return "bool", "true" if value else "false"
        if isinstance(value, int):
            return "long", str(value)
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return "longstr", f'<<"{text}"/utf8>>'

    terms = []
    for i, value in enumerate(values):
        kind, body = printed(value)
        terms.append(f'{{<<"k{i}">>,{kind},{body}}}')
    assert erlang_arguments(terms) == {f"k{i}": v for i, v in enumerate(values)}


# --- events -------------------------------------------------------------------------------------
def test_queue_events() -> None:
    quorum = read_event("queue.created", {
        "user_who_performed_action": "guest",
        "arguments": ['{<<"x-queue-type">>,longstr,<<"quorum">>}'],
        "type": "rabbit_quorum_queue", "exclusive": False, "auto_delete": False,
        "durable": True, "name": "ev.q", "vhost": "/", "timestamp_in_ms": 1795473654657})
    assert quorum is not None and not isinstance(quorum, EventNote)
    assert (quorum.kind, quorum.vhost, quorum.name, quorum.queue_type) == (
        ChangeKind.DECLARE_QUEUE, "/", "ev.q", QueueType.QUORUM)
    stream = read_event("queue.created", {
        "arguments": ['{<<"x-queue-type">>,longstr,<<"stream">>}'], "name": "s",
        "vhost": "v"})
    assert stream is not None and not isinstance(stream, EventNote)
    assert stream.queue_type is QueueType.STREAM
    exclusive = read_event("queue.created", {
        "exclusive": True, "owner_pid": "<floodwall@localhost.1.848.0>", "arguments": [],
        "auto_delete": False, "durable": False, "name": "amq.gen-s7vYcZ", "vhost": "/"})
    assert exclusive is not None and not isinstance(exclusive, EventNote)
    assert exclusive.queue_type is QueueType.CLASSIC
    gone = read_event("queue.deleted", {"user_who_performed_action": "rmq-internal",
                                        "name": "amq.gen-s7vYcZ", "vhost": "/"})
    assert gone is not None and not isinstance(gone, EventNote)
    assert gone.kind is ChangeKind.DELETE_QUEUE


def test_exchange_and_binding_events_build_the_same_model_as_frames() -> None:
    from_events, from_frames = Topology(), Topology()
    events = [
        ("exchange.created", {
            "policy": "", "arguments": ['{<<"alternate-exchange">>,longstr,<<"ev.ae">>}'],
            "internal": False, "auto_delete": False, "durable": False, "type": "headers",
            "name": "ev.h", "vhost": "/"}),
        ("queue.created", {"name": "q1", "vhost": "/", "arguments": []}),
        ("binding.created", {
            "vhost": "/", "arguments": HEADERS_BINDING, "routing_key": "",
            "destination_kind": "queue", "destination_name": "q1", "source_kind": "exchange",
            "source_name": "ev.h"}),
        ("binding.created", {
            "vhost": "/", "arguments": [], "routing_key": "z.#",
            "destination_kind": "exchange", "destination_name": "ev.h",
            "source_kind": "exchange", "source_name": "amq.topic"}),
    ]
    for key, headers in events:
        change = read_event(key, headers)
        assert change is not None and not isinstance(change, EventNote)
        from_events.apply(change)
    from_frames.declare_exchange("/", "ev.h", "headers", durable=False,
                                 arguments={"alternate-exchange": "ev.ae"})
    from_frames.declare_queue("/", "q1")
    from_frames.bind_queue("/", "q1", "ev.h", "", erlang_arguments(HEADERS_BINDING))
    from_frames.bind_exchange("/", "ev.h", "amq.topic", "z.#")
    assert from_events.items() == from_frames.items()
    assert from_events.route("/", "amq.topic", "z.a", {"i": 5}) == frozenset({"q1"})
    unbind = read_event("binding.deleted", dict(events[2][1]))
    assert unbind is not None and not isinstance(unbind, EventNote)
    from_events.apply(unbind)
    assert from_events.route("/", "amq.topic", "z.a", {"i": 5}) == frozenset()
    deleted = read_event("exchange.deleted", {"name": "ev.h", "vhost": "/"})
    assert deleted is not None and not isinstance(deleted, EventNote)
    from_events.apply(deleted)
    assert not from_events.knows_exchange("/", "ev.h")


def test_vhost_policy_and_other_events() -> None:
    created = read_event("vhost.created", {"name": "late"})
    assert created is not None and not isinstance(created, EventNote)
    model = Topology()
    model.apply(created)
    assert model.knows_exchange("late", "amq.topic")
    deleted = read_event("vhost.deleted", {"name": "late"})
    assert deleted is not None and not isinstance(deleted, EventNote)
    model.apply(deleted)
    assert model.vhosts() == []
    assert read_event("policy.set", {"name": "ae", "vhost": "/"}) is EventNote.POLICY_CHANGED
    assert read_event("policy.cleared", {}) is EventNote.POLICY_CHANGED
    assert read_event("connection.created", {"name": "x"}) is None
    assert read_event("queue.stats", None) is None


@pytest.mark.parametrize(("key", "headers"), [
    ("queue.created", {"vhost": "/"}),
    ("queue.deleted", {"name": 5, "vhost": "/"}),
    ("exchange.created", {"name": "x", "vhost": "/"}),
    ("binding.created", {"vhost": "/", "source_name": "x", "destination_kind": "topic",
                         "destination_name": "q", "routing_key": "", "arguments": []}),
    ("binding.created", {"vhost": "/", "source_name": "x", "destination_kind": "queue",
                         "destination_name": "q", "routing_key": "",
                         "arguments": ['{<<"k">>,bogus,1}']}),
    ("vhost.created", {}),
])
def test_unreadable_events_raise(key: str, headers: dict[str, object]) -> None:
    with pytest.raises(EventError):
        read_event(key, headers)
