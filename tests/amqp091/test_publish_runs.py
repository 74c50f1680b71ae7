"""Runs of one channel's whole publishes, read in one pass (the policed publish's cost).

The scanner (``floodwall.wire.amqp091.runs``) against the full decoder (pamqp), and the gate
with runs against the gate a publish at a time: the broker gets the same bytes, the client
the same frames, and the ledgers, counts, held publishes and confirm numbers are the same
after every read, whole or cut anywhere.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from floodwall.wire.amqp091.framing import FRAME_MIN_SIZE, payload_limit
from floodwall.wire.amqp091.runs import scan_publish_run
from tests.amqp091.test_flow import Setup
from tests.amqp091.wire import HEARTBEAT, B, C, method
from tests.conftest import record_calls

CF = commands.Confirm
LIMIT = payload_limit(FRAME_MIN_SIZE)


def publish_frames(channel: int = 1, key: str = "capped", size: int = 10, split: int = 0,
                   props: B.Properties | None = None, mandatory: bool = False,
                   declared: int | None = None) -> list[bytes]:
    """A basic.publish, its content header (``declared`` body size, if not ``size``) and
    body frames of at most ``split`` bytes each (0: one frame)."""
    payload = bytes(i % 251 for i in range(size))
    step = split or max(size, 1)
    props = props or B.Properties(delivery_mode=2)
    return [frame.marshal(B.Publish(exchange="", routing_key=key, mandatory=mandatory), channel),
            frame.marshal(header.ContentHeader(0, size if declared is None else declared, props),
                          channel),
            *[frame.marshal(body.ContentBody(payload[i:i + step]), channel)
              for i in range(0, size, step)]]


METHOD = publish_frames()[0]


def scan(buf: bytes, body_left: int = 0, most: float = float("inf"),
         most_bytes: float = float("inf"), channel: int = 1) -> tuple[int, int, int, int]:
    return scan_publish_run(buf, 0, LIMIT, channel, METHOD, body_left, most, most_bytes)


# -- the scanner ---------------------------------------------------------------------------

def test_a_run_is_read_to_its_end_with_its_body_sizes_and_frames() -> None:
    items = [publish_frames(size=n, split=7) for n in (0, 1, 10, 30)]
    data = b"".join(f for item in items for f in item)
    assert scan(data) == (len(data), 4, 41, sum(map(len, items)))


def test_the_rest_of_the_first_publishs_body_is_taken_first() -> None:
    first = publish_frames(size=30, split=10)
    rest = b"".join(first[3:])  # its last two body frames
    run = b"".join(publish_frames(size=5))
    assert scan(rest + run, body_left=20) == (len(rest + run), 1, 5, 2 + 3)
    assert scan(rest[:-1], body_left=20) == (len(first[3]), 0, 0, 1)  # a cut frame: it stops
    assert scan(rest + run, body_left=25)[:2] == (len(rest), 0)  # owed more: no run after


def _props_with_headers() -> B.Properties:
    return B.Properties(headers={"x": 1})


@pytest.mark.parametrize(("stopper", "why"), [
    (publish_frames(channel=2), "another channel"),
    (publish_frames(key="other"), "another routing key"),
    (publish_frames(mandatory=True), "other flags"),
    (publish_frames(props=_props_with_headers()), "a headers property (the route may differ)"),
    (publish_frames(size=10, declared=11), "body frames short of the header's body size"),
    (publish_frames(size=10, declared=9), "a body frame past the header's body size"),
    ([method(B.Ack(delivery_tag=1), 1)], "another method"),
    ([HEARTBEAT], "a heartbeat"),
    ([publish_frames()[0], publish_frames(channel=2)[1]], "a header on another channel"),
    ([publish_frames()[0], HEARTBEAT, *publish_frames()[1:]], "a frame inside the publish"),
    ([publish_frames()[0], publish_frames()[0]], "a method where the header goes"),
])
def test_the_run_ends_before_the_first_publish_that_is_not_one_of_it(
        stopper: list[bytes], why: str) -> None:
    head = b"".join(f for _ in range(3) for f in publish_frames(size=20, split=8))
    end, count, total, _ = scan(head + b"".join(stopper) + b"".join(publish_frames()))
    assert (end, count, total) == (len(head), 3, 60), why


def test_other_properties_are_fine_and_body_sizes_come_from_each_header() -> None:
    items = [publish_frames(size=5, props=B.Properties(content_type="text/plain")),
             publish_frames(size=70, split=33, props=B.Properties(
                 message_id="m" * 40, priority=3, correlation_id="c")),
             publish_frames(size=0, props=B.Properties())]
    data = b"".join(f for item in items for f in item)
    assert scan(data)[1:3] == (3, 75)


def test_the_run_stops_at_its_count_and_byte_limits_and_at_every_cut() -> None:
    one = b"".join(publish_frames(size=100, split=40))
    data = one * 5
    assert scan(data, most=2)[:3] == (2 * len(one), 2, 200)
    assert scan(data, most_bytes=250)[:3] == (2 * len(one), 2, 200)
    assert scan(data, most_bytes=300)[:3] == (3 * len(one), 3, 300)  # up to the room: in
    for cut in range(len(data) + 1):  # every prefix: the whole publishes in it, no error
        end, count, total, frames = scan(data[:cut])
        assert count == cut // len(one) and end == count * len(one) and total == 100 * count
        assert frames == 5 * count


@pytest.mark.parametrize("bad", [
    lambda f: f[:-1] + b"\x00",  # a bad frame end
    lambda f: f[:3] + (LIMIT + 1).to_bytes(4, "big") + f[7:],  # over frame_max
])
def test_a_malformed_frame_ends_the_run_silently(bad: Any) -> None:
    head = b"".join(publish_frames())
    frames = publish_frames()
    for i in range(len(frames)):
        broken = [*frames[:i], bad(frames[i]), *frames[i + 1:]]
        assert scan(head + b"".join(broken))[:2] == (len(head), 1)


_ITEM = st.one_of(
    st.tuples(st.just("publish"), st.sampled_from([1, 1, 1, 2]),
              st.sampled_from(["capped", "capped", "other"]), st.integers(0, 90),
              st.sampled_from([0, 1, 13, 50]), st.sampled_from(["plain", "typed", "headers"]),
              st.sampled_from([0, 0, 0, -1, 1])),
    st.tuples(st.just("ack"), st.sampled_from([1, 2])),
    st.tuples(st.just("heartbeat")),
)


def _build(item: tuple[Any, ...]) -> list[bytes]:
    if item[0] == "publish":
        _, channel, key, size, split, props, off = item
        p = {"plain": B.Properties(delivery_mode=2),
             "typed": B.Properties(content_type="a/b" * (size % 5), delivery_mode=1),
             "headers": B.Properties(headers={"h": size})}[props]
        return publish_frames(channel, key, size, split, p, declared=max(size + off, 0))
    if item[0] == "ack":
        return [method(B.Ack(delivery_tag=1), item[1])]
    return [HEARTBEAT]


def _decoded_run(data: bytes) -> tuple[int, int, int, int]:
    """What the full decoder reads as the run at the start of ``data``: whole publishes on
    channel 1 with ``METHOD``'s arguments, no headers property, body frames on channel 1
    adding up to the header's body size. Returns (end, count, body bytes, frames)."""
    decoded: list[tuple[int, int, int, object]] = []  # (start, end, channel, frame)
    pos = 0
    while pos < len(data):
        try:
            used, channel, value = frame.unmarshal(data[pos:])
        except Exception:
            break
        decoded.append((pos, pos + used, channel, value))
        pos += used
    end = count = total = frames = i = 0
    while i < len(decoded):
        _, _, channel, value = decoded[i]
        if channel != 1 or not isinstance(value, B.Publish) or i + 1 >= len(decoded) \
                or (value.exchange, value.routing_key, value.mandatory, value.immediate) \
                != ("", "capped", False, False):
            break
        _, _, hch, head = decoded[i + 1]
        if hch != 1 or not isinstance(head, header.ContentHeader) \
                or head.properties.headers is not None:
            break
        j, got = i + 2, 0
        while got < head.body_size and j < len(decoded) and decoded[j][2] == 1 \
                and isinstance(decoded[j][3], body.ContentBody) \
                and got + len(decoded[j][3].value) <= head.body_size:
            got += len(decoded[j][3].value)
            j += 1
        if got != head.body_size:
            break
        end, count, total, frames = decoded[j - 1][1], count + 1, total + head.body_size, \
            frames + j - i
        i = j
    return end, count, total, frames


@settings(max_examples=400, deadline=None)
@given(items=st.lists(_ITEM, max_size=8), cut=st.integers(0, 2000))
def test_what_the_scanner_takes_is_what_the_decoder_reads(items: list[tuple[Any, ...]],
                                                         cut: int) -> None:
    """Whatever the publishes and frames, and wherever the read ends, the scanner takes the
    run the full decoder reads: the same end, publishes, body bytes and frames."""
    data = b"".join(f for item in items for f in _build(item))
    data = data[:cut]
    assert scan(data) == _decoded_run(data)


# -- the gate: with runs and a publish at a time --------------------------------------------

_QUEUES = ("capped", "capped2", "free")
_SEGMENT = st.tuples(st.sampled_from([1, 2]), st.sampled_from(_QUEUES),
                     st.sampled_from([0, 10, 90, 300]), st.integers(1, 12),
                     st.sampled_from(["plain", "headers"]))
_STEPS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.lists(_SEGMENT, min_size=1, max_size=4)),
    st.tuples(st.just("ack"), st.sampled_from([1, 2])),
    st.tuples(st.just("confirm"), st.sampled_from([1, 2])),
    st.tuples(st.just("sample"), st.sampled_from(["capped", "capped2"]),
              st.sampled_from([0, 500, 1500, 1900, 5000])),
    st.tuples(st.just("count"), st.sampled_from(["capped", "capped2"]),
              st.sampled_from([0, 5, 15, 30])),
), max_size=14)


def _state(s: Setup) -> tuple[object, ...]:
    queues = tuple((key, q.depth.forwarded_bytes_total, q.depth.forwarded_messages_total,
                    tuple(q.depth._ledger), q.tripped)
                   for key, q in sorted(s.fc.queues.items()))
    channels = tuple((n, len(ch.held), ch.held_bytes, ch.filling is not None,
                      ch.flow_replies, ch.signalled_off,
                      None if ch.confirms is None else (
                          ch.confirms.client_seq, ch.confirms.broker_seq, ch.confirms.ahead,
                          tuple(ch.confirms.offsets)))
                     for n, ch in sorted(s.gate.channels.items()))
    c = s.counters
    core = s.core
    return (queues, channels, c.held_messages, c.held_bytes, core.from_client.frames,
            core.from_client.bytes, sorted(s.fc.tripped))


SHADOWED = """
version: 1
policies:
  - name: capped
    match: {vhost: "/orders", queue: "capped"}
    capacity: 2000
    resume: 1000
  - name: watched
    mode: shadow
    match: {vhost: "/orders", queue: "capped2"}
    capacity: 2000
    resume: 1000
"""


def _setup(runs: bool, policies: str | None = None, overflow: str = "hold",
           product: str = "pytest-client") -> tuple[Setup, list[tuple[Any, ...]]]:
    """A gate with runs, passed and held (the passed runs it books recorded), or without."""
    s = Setup(overflow=overflow, policies=policies, product=product)
    if runs:
        return s, record_calls(s.gate, "on_publish_run")
    s.gate.publish_run = lambda *a: None  # type: ignore[method-assign]
    s.gate.hold_run = lambda *a: False  # type: ignore[method-assign]
    s.gate.held.release_run = lambda *a: False  # type: ignore[method-assign]
    return s, []


def _cuts(n: int, chunker: random.Random | None, one_byte: bool) -> list[int]:
    """Where the reads of ``n`` bytes end: one read, random cuts, or one byte each."""
    if one_byte:
        return list(range(1, n + 1))
    ends, pos = [], 0
    while pos < n:
        pos = min(n, pos + (n if chunker is None else chunker.randint(1, 700)))
        ends.append(pos)
    return ends


def _agree(a: Setup, b: Setup) -> None:
    assert a.core.data_for_server() == b.core.data_for_server()  # the broker: the same bytes
    assert a.core.data_for_client() == b.core.data_for_client()
    assert _state(a) == _state(b)  # the same ledgers, counts, held publishes, confirm numbers


def _lockstep(steps: list[tuple[Any, ...]], seed: int, one_byte: bool = False,
              overflow: str = "hold") -> int:
    """Both gates fed the same bytes, cut the same way; after every read the broker and the
    client got the same bytes and the books agree. Returns the runs read. (``reject`` in
    confirm mode nacks publishes: the broker's numbers fall behind the client's, and the
    runs after it book both.)"""
    a, runs = _setup(runs=True, overflow=overflow)
    b, _ = _setup(runs=False, overflow=overflow)
    chunker = None if seed == 0 else random.Random(seed)
    for step in steps:
        if step[0] == "send":
            data = _sent(step)
            start = 0
            for end in _cuts(len(data), chunker, one_byte):  # the books agree after each read
                for s in (a, b):
                    s.core.receive_from_client(data[start:end], s.clock.t)
                _agree(a, b)
                start = end
        elif step[0] == "confirm":
            for s in (a, b):
                s.core.receive_from_client(method(CF.Select(), step[1]), s.clock.t)
        else:
            _from_the_broker(a, b, step)
        _agree(a, b)
    return len(runs)


def _sent(step: tuple[Any, ...]) -> bytes:
    """A ``send`` step's publishes: (channel, queue, body size, how many, properties)."""
    return b"".join(f for channel, queue, size, n, props in step[1] for _ in range(n)
                    for f in publish_frames(channel, queue, size, 0 if size < 90 else 40,
                                            B.Properties(headers={"h": 1})
                                            if props == "headers" else None))


def _from_the_broker(a: Setup, b: Setup, step: tuple[Any, ...]) -> None:
    """An ``ack`` step (the broker confirms everything on a channel), a depth sample, or a
    ready count 10 ms on (``count``: a held queue's tokens, admission while held)."""
    if step[0] in ("ack", "broker-ack"):
        for s in (a, b):
            s.core.receive_from_server(method(B.Ack(delivery_tag=1, multiple=True), step[1]),
                                       s.clock.t)
    elif step[0] == "count":
        for s in (a, b):
            s.clock.t += 0.01
            s.fc.sampled_ready_count(("/orders", step[1]), s.clock.t, step[2], 0.001,
                                     s.clock.t)
            s.board.settle()
    else:
        for s in (a, b):
            s.sample(step[1], step[2])


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS, seed=st.integers(0, 3), overflow=st.sampled_from(["hold", "reject"]))
def test_runs_book_what_a_publish_at_a_time_books(steps: list[tuple[Any, ...]],
                                                  seed: int, overflow: str) -> None:
    _lockstep(steps, seed, overflow=overflow)


@settings(max_examples=15, deadline=None)
@given(steps=_STEPS)
def test_runs_book_the_same_fed_one_byte_at_a_time(steps: list[tuple[Any, ...]]) -> None:
    _lockstep(steps, 0, one_byte=True)


def test_a_burst_of_one_channel_is_read_as_a_run() -> None:
    """The run is taken at all (else the equivalence above says nothing): 30 publishes in
    one read go to the gate as one publish and one run of 29, confirm mode or not."""
    burst = ("send", [(1, "free", 90, 30, "plain")])
    assert _lockstep([burst], 0) == 1
    assert _lockstep([("confirm", 1), burst, ("ack", 1), burst], 0) == 2
    assert _lockstep([("send", [(1, "capped", 10, 30, "plain")])], 0) == 1
    # a nack of the proxy's first: the run after it books the broker's numbers behind
    nacked = [("confirm", 1), ("sample", "capped", 5000), ("send", [(1, "capped", 10, 1,
                                                                     "plain")]),
              ("sample", "capped", 0), burst]
    assert _lockstep(nacked, 0, overflow="reject") == 1


@pytest.mark.parametrize("runs", [True, False])
def test_a_run_stops_where_a_publish_trips_the_queue(runs: bool) -> None:
    """Ten 300-byte publishes in one read to a queue with room for about six: the one that
    takes the estimate past capacity passes and trips it, the rest are held, runs or not."""
    s, _ = _setup(runs)
    s.sample("capped", 500)
    data = b"".join(f for _ in range(10) for f in publish_frames(1, "capped", 300, 40))
    s.core.receive_from_client(data, s.clock.t)
    q = s.fc.queues[("/orders", "capped")]
    assert q.tripped
    passed = q.depth.forwarded_messages_total
    assert 0 < passed < 10 and s.counters.held_messages == 10 - passed
    assert s.core.data_for_server() == data[:passed * len(b"".join(
        publish_frames(1, "capped", 300, 40)))]


@pytest.mark.parametrize("condition", ["shadow", "close kept back", "headers", "confirm nack"])
def test_no_run_while_something_could_change_a_decision(condition: str) -> None:
    """Each of these sends the publishes of a read a publish at a time."""
    s, runs = _setup(runs=True, policies=SHADOWED if condition == "shadow" else None)
    data = b"".join(f for _ in range(5) for f in publish_frames(1, "free", 10))
    if condition == "close kept back":  # channel 2 holds, the client's close waits behind
        s.trip()
        s.core.receive_from_client(b"".join(publish_frames(2, "capped", 10))
                                   + method(C.Close(200, "bye", 0, 0)), s.clock.t)
        assert s.gate.held_bytes and s.gate.held.connection_close is not None
    elif condition == "headers":
        data = b"".join(f for _ in range(5) for f in publish_frames(
            1, "free", 10, props=B.Properties(headers={"a": 1})))
    elif condition == "shadow":  # a shadow policy's queue is tripped: the gate records
        s.sample("capped2", 5000)
        assert s.fc.trips.shadow and not s.fc.tripped
    else:  # a Channel.Flow of ours awaits its flow-ok on the channel
        s.gate.held.channel(1).flow_replies = 1
    s.core.receive_from_client(data, s.clock.t)
    assert not runs
    assert s.core.data_for_server().endswith(data)


# -- one channel holds, another publishes (a held connection's free channels) --------------

TX = commands.Tx
CH = commands.Channel
_HELD_STEPS = st.lists(st.one_of(
    # a read: channel 1's bursts (runs) and channel 2's publishes (held), interleaved
    st.tuples(st.just("send"), st.lists(st.tuples(
        st.sampled_from([1, 1, 2]), st.sampled_from(["capped", "capped2", "free"]),
        st.sampled_from([0, 10, 90, 300]), st.integers(1, 12),
        st.sampled_from(["plain", "plain", "headers"])), min_size=1, max_size=5)),
    st.tuples(st.just("method"), st.sampled_from([1, 2]),
              st.sampled_from(["commit", "ack", "flow-ok"])),
    st.tuples(st.just("broker-ack"), st.sampled_from([1, 2])),
    st.tuples(st.just("sample"), st.sampled_from(["capped", "capped2"]),
              st.sampled_from([0, 1500, 5000])),
    st.tuples(st.just("count"), st.sampled_from(["capped", "capped2"]),
              st.sampled_from([0, 5, 15, 30])),
    st.tuples(st.just("close")),
), max_size=10)
_METHODS = {"commit": TX.Commit(), "ack": B.Ack(delivery_tag=1), "flow-ok": CH.FlowOk(active=False)}


def _held_lockstep(steps: list[tuple[Any, ...]], seed: int, overflow: str, confirm: bool,
                   one_byte: bool = False) -> int:
    """Channel 2 holds (its queue tripped, a publish of it held; a client that is sent
    Channel.Flow), channel 1 is free; then whatever the steps say, both gates fed the same
    bytes cut the same way. After every read: the same bytes to both peers, the same books
    (ledgers, held publishes, confirm numbers, Channel.Flow replies owed). Returns the runs
    read on the gate with runs."""
    gates = [_setup(runs=r, overflow=overflow, product="RabbitMQ") for r in (True, False)]
    (a, runs), (b, _) = gates
    chunker = None if seed == 0 else random.Random(seed)

    def feed(data: bytes) -> None:
        start = 0
        for end in _cuts(len(data), chunker, one_byte):
            for s in (a, b):
                s.core.receive_from_client(data[start:end], s.clock.t)
            _agree(a, b)
            start = end

    prelude = method(CF.Select(), 1) + method(CF.Select(), 2) if confirm else b""
    feed(prelude)
    for s in (a, b):
        s.trip()
    feed(b"".join(publish_frames(2, "capped", 10)))
    assert a.gate.channels[2].holding or overflow == "reject"
    for step in steps:
        if step[0] == "send":
            feed(_sent(step))
        elif step[0] == "method":
            feed(method(_METHODS[step[2]], step[1]))
        elif step[0] == "close":
            feed(method(C.Close(200, "bye", 0, 0)))
        else:
            _from_the_broker(a, b, step)
        _agree(a, b)
    return len(runs)


@settings(max_examples=150, deadline=None)
@given(steps=_HELD_STEPS, seed=st.integers(0, 3), overflow=st.sampled_from(["hold", "reject"]),
       confirm=st.booleans())
def test_a_free_channel_runs_while_another_holds_as_a_publish_at_a_time(
        steps: list[tuple[Any, ...]], seed: int, overflow: str, confirm: bool) -> None:
    _held_lockstep(steps, seed, overflow, confirm)


@settings(max_examples=10, deadline=None)
@given(steps=_HELD_STEPS, confirm=st.booleans())
def test_a_free_channel_runs_while_another_holds_one_byte_at_a_time(
        steps: list[tuple[Any, ...]], confirm: bool) -> None:
    _held_lockstep(steps, 0, "hold", confirm, one_byte=True)


def test_the_free_channels_burst_is_a_run_and_passes_around_the_held_frames() -> None:
    """Channel 2 holds and owes a flow-ok; a read of channel 1's burst with channel 2's
    publishes and a commit in the middle: channel 1's 30 publishes go to the broker (two runs,
    one each side of channel 2's frames), channel 2's stay behind, in order, and leave after
    them when the queue drains."""
    s, runs = _setup(runs=True, product="RabbitMQ")
    s.trip()
    held = b"".join(publish_frames(2, "capped", 10))
    s.core.receive_from_client(held, s.clock.t)
    assert s.gate.channels[2].signalled_off and s.gate.channels[2].flow_replies == 1
    burst = b"".join(f for _ in range(15) for f in publish_frames(1, "capped2", 20))
    more = b"".join(publish_frames(2, "free", 10)) + method(TX.Commit(), 2)
    s.core.receive_from_client(burst + more + burst, s.clock.t)
    assert len(runs) == 2
    assert s.core.data_for_server() == burst + burst
    assert s.fc.queues[("/orders", "capped2")].depth.forwarded_messages_total == 30
    s.sample("capped", 0)
    assert s.core.data_for_server() == held + more


# -- held runs (a producer held at its consumers' pace) --------------------------------------

def _both(a: Setup, b: Setup, step: tuple[Any, ...]) -> None:
    """One step (a whole read, confirm.select on channel 1, or the broker's) to both gates;
    then the books agree."""
    if step[0] == "send":
        for s in (a, b):
            s.core.receive_from_client(_sent(step), s.clock.t)
    elif step[0] == "confirm":
        for s in (a, b):
            s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    else:
        _from_the_broker(a, b, step)
    _agree(a, b)


def test_a_held_channels_burst_is_held_as_a_run_and_leaves_in_order() -> None:
    """The queue is tripped: 30 publishes of channel 1 in a read are held as one publish
    and one run of 29 (each its own held publish, with its confirm number), and leave when
    the queue drains as far as it admits them, the same bytes in the same order as a publish
    at a time; the books agree after every step, the read whole or one byte at a time."""
    burst = ("send", [(1, "capped", 90, 30, "plain")])
    steps = [("confirm", 1), ("sample", "capped", 5000), burst, burst, ("sample", "capped", 0),
             ("ack", 1)]
    a, _ = _setup(runs=True)
    held_runs = record_calls(a.gate, "on_hold_run")
    b, _ = _setup(runs=False)
    for i, step in enumerate(steps):
        _both(a, b, step)
        if step[0] == "send":
            assert len(a.gate.channels[1].held) == 30 * (i - 1)
    assert [len(call[4]) for call in held_runs] == [29, 29]
    # the drain lets some go (the ledger trips the 2,000-byte queue again), in order
    went = a.fc.queues[("/orders", "capped")].depth.forwarded_messages_total
    assert 0 < went < 60 and len(a.gate.channels[1].held) == 60 - went
    for one_byte in (False, True):
        _lockstep(steps, 0, one_byte=one_byte)


@pytest.mark.parametrize("condition", ["headers", "reject", "shadow"])
def test_no_held_run_where_a_publish_could_be_decided_otherwise(condition: str) -> None:
    """A headers property (the route may differ), a reject policy (each publish is refused)
    and a shadow policy's trip (each publish is recorded) send the held channel's publishes a
    publish at a time."""
    s, _ = _setup(runs=True, overflow="reject" if condition == "reject" else "hold",
                  policies=SHADOWED if condition == "shadow" else None)
    held_runs = record_calls(s.gate, "on_hold_run")
    s.trip()
    props = "headers" if condition == "headers" else "plain"
    if condition == "shadow":
        s.sample("capped2", 5000)
        assert s.fc.trips.shadow
    s.core.receive_from_client(_sent(("send", [(1, "capped", 90, 10, props)])), s.clock.t)
    assert not any(ends for *_, ends, _ in held_runs)  # (the first one's body: at most)
    if condition != "reject":
        assert len(s.gate.channels[1].held) == 10


def test_a_full_hold_budget_does_not_end_a_held_run() -> None:
    """Past its hold budget a connection is read no more, after the read: a publish at a
    time holds the whole read too, so the run holds it all (the same books as one at a
    time), and the relay's backpressure is as before."""
    a, _ = _setup(runs=True)
    held_runs = record_calls(a.gate, "on_hold_run")
    b, _ = _setup(runs=False)
    for s in (a, b):
        s.gate.ctx.hold_budget = 50
    for step in [("sample", "capped", 5000), ("send", [(1, "capped", 90, 30, "plain")]),
                 ("send", [(1, "capped", 90, 30, "plain")])]:
        _both(a, b, step)
    assert [len(call[4]) for call in held_runs] == [29, 29]
    assert len(a.gate.channels[1].held) == 60
    assert a.gate.over_budget and b.gate.over_budget


def test_held_publishes_leave_in_runs_as_far_as_they_would_one_at_a_time() -> None:
    """Held publishes let go by a count's tokens (and by the queue's release) leave as runs,
    the publishes one at a time would let go and no more: the same bytes and books after
    every count, in confirm mode."""
    steps: list[tuple[Any, ...]] = [
        ("confirm", 1), ("sample", "capped", 5000),
        ("send", [(1, "capped", 90, 30, "plain")]),
        ("count", "capped", 30), ("count", "capped", 5), ("count", "capped", 0),
        ("count", "capped", 0), ("sample", "capped", 0), ("ack", 1)]
    a, _ = _setup(runs=True)
    released = [0]
    run = a.gate.held.release_run

    def counted(*args: Any) -> bool:
        went: bool = run(*args)
        released[0] += went
        return went
    a.gate.held.release_run = counted  # type: ignore[method-assign]
    b, _ = _setup(runs=False)
    for step in steps:
        _both(a, b, step)
    assert released[0] >= 2  # the counts' tokens let runs go, not a publish at a time
    went = a.fc.queues[("/orders", "capped")].depth.forwarded_messages_total
    assert 0 < went <= 30
