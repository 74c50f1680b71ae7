"""Live topology end to end: queues, bindings and vhosts made by anyone after the proxy started are
policed from their first publish, through a real ``floodwall run --policies --management``
in front of the real RabbitMQ 3.10 (with the rabbitmq_event_exchange plugin, and without).

The topology is changed straight at the broker (pika on a direct connection, the management
API), never through the proxy under test, as consumers on other pods do. The flood comes from
the bare socket client (``Raw091``: no confirms, ignores Channel.Flow), from proton (AMQP 1.0)
or from a second floodwall. Broker-side depth is watched by a passive declare every few
milliseconds on a direct connection; the bound is capacity + 256 KiB.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from floodwall.dev.devbroker import (
    PLUGINS,
    BrokerEndpoint,
    BrokerError,
    BrokerRelease,
    LocalBroker,
    server_script,
)
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    Raw091,
    capped,
    delete_queue,
    direct_params,
    drain_direct,
    flow_with,
    http_status,
    numbered,
    pika_connection,
    policy_file,
    ready_count,
    seq_of,
    start_flow,
    unique,
)
from tests.integration.test_amqp10_flow import LinkStats, ProtonSenders

pytestmark = pytest.mark.broker

KIB = 1024
MIB = 1024 * KIB
OVER = 256 * KIB  # the flow control's bound: broker-side depth never more than this over capacity


# -- helpers ---------------------------------------------------------------------------------
class BrokerDepth(threading.Thread):
    """The most messages ``queue`` held, by a passive declare every ``every`` seconds on a
    direct connection; a queue that does not exist (yet, or any more) counts as 0."""

    def __init__(self, broker: BrokerEndpoint, queue: str, vhost: str = "/",
                 every: float = 0.003) -> None:
        super().__init__(daemon=True, name=f"depth-{queue}")
        self.broker, self.queue, self.vhost, self.every = broker, queue, vhost, every
        self.max_ready = 0
        self.samples = 0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.broker, virtual_host=self.vhost))
            ch = conn.channel()
            while not self.done.is_set():
                try:
                    n = ch.queue_declare(self.queue, passive=True).method.message_count
                except pika.exceptions.ChannelClosedByBroker:
                    ch = conn.channel()
                    n = 0
                self.max_ready = max(self.max_ready, n)
                self.samples += 1
                self.done.wait(self.every)
            conn.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> int:
        self.done.set()
        self.join(10)
        if self.error is not None:
            raise AssertionError(f"depth watch failed: {self.error!r}") from self.error
        return self.max_ready


def publish_frames(seq: int, exchange: str, routing_key: str, channel: int = 1) -> bytes:
    data = numbered(seq)
    return (frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key),
                          channel)
            + frame.marshal(pamqp_header.ContentHeader(0, len(data),
                                                       commands.Basic.Properties()), channel)
            + frame.marshal(pamqp_body.ContentBody(data), channel))


def burst(exchange: str, routing_key: str, count: int, start: int = 0) -> bytes:
    return b"".join(publish_frames(start + i, exchange, routing_key) for i in range(count))


def open_raw(port: int, vhost: str = "/") -> Raw091:
    raw = Raw091.connect(port)
    raw.handshake(name=unique("raw"), vhost=vhost)
    raw.send_frame(commands.Channel.Open(), 1)
    raw.expect(commands.Channel.OpenOk)
    return raw


def settled(broker: BrokerEndpoint, flow: FlowProxy, queue: str, count: int,
            vhost: str = "/") -> None:
    """Wait until every publish of the flood is at the broker or held at the proxy."""
    wait_for(lambda: ready_count_in(broker, queue, vhost) + flow.held()["messages"] == count,
             20, 0.05, what="every publish at the broker or held")


def ready_count_in(broker: BrokerEndpoint, queue: str, vhost: str = "/") -> int:
    if vhost == "/":
        return ready_count(broker, queue)
    with pika.BlockingConnection(direct_params(broker, virtual_host=vhost)) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def live_flow(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path, *policies: str,
              events: str = "on", more: tuple[str, ...] = ()) -> FlowProxy:
    return flow_with(start_floodwall, broker, tmp_path, *policies,
                     args=("--topology-events", events, *more))


def changes(flow: FlowProxy, source: str) -> float:
    return flow.metric("floodwall_topology_changes_total", source=source)


def needs_event_plugin(broker: BrokerEndpoint) -> None:
    """Skip on a broker (FLOODWALL_TEST_BROKER) without the rabbitmq_event_exchange plugin."""
    import urllib.error

    try:
        broker.api("GET", "/api/exchanges/%2F/amq.rabbitmq.event")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            pytest.skip("the broker has no rabbitmq_event_exchange plugin")
        raise


# -- 1. a queue declared at the broker, flooded through the proxy within 50 ms -----------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("events", ["on", "off"])
def test_queue_declared_at_the_broker_then_flooded_within_50ms(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        events: str) -> None:
    """A queue the proxy has not seen, as a new user tried it: policy on a queue the broker
    does not have yet, 3 MiB through the proxy against 1 MiB capacity, the queue declared
    straight at the broker and the flood written within 50 ms. With the event plugin the
    model learns it from the event; without, the first publish waits for a lookup."""
    if events == "on":
        needs_event_plugin(broker)
    q = queues("live")
    count = 3 * 1024  # 3 MiB of 1 KiB messages
    flow = live_flow(start_floodwall, broker, tmp_path, capped("live", q, "1MiB", "512KiB"),
                     events=events)
    raw = open_raw(flow.port)
    data = burst("", q, count)
    watch = BrokerDepth(broker, q)
    watch.start()
    try:
        with pika.BlockingConnection(direct_params(broker)) as conn:
            conn.channel().queue_declare(q)
            declared = time.monotonic()
            raw.send(data)
            wrote = time.monotonic() - declared
        assert wrote < 0.05, f"the flood took {wrote * 1000:.0f} ms to write"
        wait_for(lambda: flow.tripped(q), 10, what="tripped")
        settled(broker, flow, q, count)
        time.sleep(0.3)  # (anything still on its way shows in the watch)
    finally:
        max_ready = watch.stop()
    landed = drain_direct(broker, q, count, timeout=60)
    raw.close()
    print(f"live queue ({events}): max depth {max_ready} KiB, {watch.samples} samples")
    assert max_ready * KIB <= MIB + OVER, f"{max_ready} KiB at the broker"
    assert [seq_of(b) for b in landed] == list(range(count)), "lost or reordered"
    if events == "on":
        assert changes(flow, "event") >= 1
        assert flow.log("topology_events_up")
    else:
        assert flow.metric("floodwall_topology_lookups_total", kind="queue", result="found") >= 1
        assert changes(flow, "event") == 0


# -- 2. a binding made at the broker, publishing starts 1 s later ------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("events", "exchange"),
                         [("on", "amq.topic"), ("on", "new"), ("off", "new")])
def test_binding_made_at_the_broker_then_flooded_a_second_later(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        events: str, exchange: str) -> None:
    """A topic binding made straight at the broker (to an exchange the proxy knew from the
    start, or to one made just now), then 3 MiB through the proxy a second later. Without
    the event plugin only a new exchange is covered (its lookup reads its bindings); a new
    binding on a known exchange waits for the next sync: that case needs the plugin."""
    if exchange == "amq.topic":
        needs_event_plugin(broker)
    q = queues("bound")
    count = 3 * 1024
    flow = live_flow(start_floodwall, broker, tmp_path, capped("bound", q, "1MiB", "512KiB"),
                     events=events)
    x = "amq.topic" if exchange == "amq.topic" else unique("x")
    raw = open_raw(flow.port)
    watch = BrokerDepth(broker, q)
    watch.start()
    try:
        with pika.BlockingConnection(direct_params(broker)) as conn:
            ch = conn.channel()
            if x != "amq.topic":
                ch.exchange_declare(x, "topic", auto_delete=True)
            ch.queue_declare(q)
            ch.queue_bind(q, x, f"{q}.*.orders")
            time.sleep(1.0)
            raw.send(burst(x, f"{q}.eu.orders", count))
            wait_for(lambda: flow.tripped(q), 10, what="tripped")
            settled(broker, flow, q, count)
            time.sleep(0.3)
    finally:
        max_ready = watch.stop()
    landed = drain_direct(broker, q, count, timeout=60)
    raw.close()
    print(f"binding ({events}, {exchange}): max depth {max_ready} KiB")
    assert max_ready * KIB <= MIB + OVER, f"{max_ready} KiB at the broker"
    assert [seq_of(b) for b in landed] == list(range(count))
    if events == "off":
        assert flow.metric("floodwall_topology_lookups_total", kind="exchange",
                           result="found") >= 1


# -- 3. kinds of queues ------------------------------------------------------------------------
def _count(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["quorum", "exclusive", "auto_delete", "server_named"])
def test_every_kind_of_queue_is_policed_from_its_first_publish(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        kind: str) -> None:
    """Quorum, exclusive (to another connection: no passive declare but its owner's, so its
    first figure comes from the management API), auto-delete and server-named (amq.gen-*)
    queues declared straight at the broker, flooded at once through the proxy: held within
    the bound (nobody consumes, so the depth once settled is the most it held); an exclusive
    queue is forgotten when its owner's connection closes."""
    pattern = "amq.gen-*" if kind == "server_named" else None
    name = "" if kind == "server_named" else queues(kind)
    count = 1024  # 1 MiB against 256 KiB
    flow = live_flow(start_floodwall, broker, tmp_path,
                     capped(kind, pattern or name, "256KiB", "128KiB"))
    owner = pika.BlockingConnection(direct_params(broker))
    raw = open_raw(flow.port)
    try:
        ch = owner.channel()
        args = {"x-queue-type": "quorum"} if kind == "quorum" else None
        q = ch.queue_declare(name, durable=kind == "quorum", exclusive=kind == "exclusive",
                             auto_delete=kind == "auto_delete", arguments=args).method.queue
        raw.send(burst("", q, count))
        wait_for(lambda: flow.tripped(q), 10, what="tripped")
        deadline = time.monotonic() + 20
        while _count(ch, q) + flow.held()["messages"] != count:
            assert time.monotonic() < deadline, "publishes neither at the broker nor held"
            owner.sleep(0.05)
        owner.sleep(0.3)
        depth = _count(ch, q)
        got: list[int] = []
        ch.basic_qos(prefetch_count=200)
        # An exclusive queue's depth comes every 5 s (the management API): each release of
        # what is held waits for a figure, ~40 s for the lot on a loaded machine.
        deadline = time.monotonic() + 75
        for method, _, body in ch.consume(q, auto_ack=True, inactivity_timeout=0.5):
            if method is not None:
                got.append(seq_of(body))
            if len(got) == count or time.monotonic() > deadline:
                break
        ch.cancel()
        print(f"{kind} {q}: {depth} KiB at the broker once settled")
        assert depth * KIB <= 256 * KIB + OVER, f"{depth} KiB at the broker"
        assert got == list(range(count))
        if kind in ("quorum", "auto_delete"):
            ch.queue_delete(q)
    finally:
        raw.close()
        owner.close()  # an exclusive queue goes with its connection
    if kind == "server_named":
        delete_queue(broker, q)
    wait_for(lambda: flow.queue_state(q) is None, 10, what=f"{kind} queue forgotten")


# -- 4. deleted and declared again -------------------------------------------------------------
@pytest.mark.timeout(120)
def test_deleted_and_declared_again_is_policed_anew(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q = queues("again")
    count = 1024
    flow = live_flow(start_floodwall, broker, tmp_path, capped("again", q, "256KiB", "128KiB"))
    raw = open_raw(flow.port)
    try:
        with pika.BlockingConnection(direct_params(broker)) as conn:
            ch = conn.channel()
            ch.queue_declare(q)
            raw.send(burst("", q, count))
            wait_for(lambda: flow.tripped(q), 10, what="tripped the first time")
            ch.queue_delete(q)
            # Its held publishes go where the broker routes them now: nowhere.
            wait_for(lambda: flow.held()["messages"] == 0, 10, what="held ones let go")
            wait_for(lambda: flow.queue_state(q) is None, 10, what="forgotten")
            # ... once the broker has routed them (a round trip behind them on the channel),
            # before the queue is there again.
            raw.send_frame(commands.Exchange.Declare(exchange="amq.direct", passive=True), 1)
            raw.expect(commands.Exchange.DeclareOk)
            ch.queue_declare(q)
            watch = BrokerDepth(broker, q)
            watch.start()
            try:
                raw.send(burst("", q, count, start=count))
                wait_for(lambda: flow.tripped(q), 10, what="tripped again")
                settled(broker, flow, q, count)
                time.sleep(0.3)
            finally:
                max_ready = watch.stop()
        landed = drain_direct(broker, q, count, timeout=60)
    finally:
        raw.close()
    assert max_ready * KIB <= 256 * KIB + OVER
    assert [seq_of(b) for b in landed] == list(range(count, 2 * count))


# -- 5. a vhost created after the proxy started ------------------------------------------------
@pytest.mark.timeout(120)
def test_queue_in_a_vhost_created_after_start(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path) -> None:
    """The policies name a vhost that does not exist yet; it is made, a queue declared in
    it straight at the broker, and flooded through the proxy at once."""
    vhost = unique("vhost")
    q = unique("late")
    count = 1024
    entry = capped("late", q, "256KiB", "128KiB").replace("match: {",
                                                          f'match: {{vhost: "{vhost}", ')
    flow = start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml", entry))
    quoted = urllib.parse.quote(vhost, safe="")
    broker.api("PUT", f"/api/vhosts/{quoted}")
    try:
        broker.api("PUT", f"/api/permissions/{quoted}/{broker.username}",
                   {"configure": ".*", "write": ".*", "read": ".*"})
        with pika.BlockingConnection(direct_params(broker, virtual_host=vhost)) as conn:
            ch = conn.channel()
            ch.queue_declare(q)
            raw = open_raw(flow.port, vhost)
            watch = BrokerDepth(broker, q, vhost)
            watch.start()
            try:
                raw.send(burst("", q, count))
                wait_for(lambda: any(s["queue"] == q and s["tripped"]
                                     for s in flow.proc.state()["flow"]["queues"]),
                         10, what="tripped")
                settled(broker, flow, q, count, vhost)
                time.sleep(0.3)
            finally:
                max_ready = watch.stop()
            got = 0
            for method, _, _body in ch.consume(q, auto_ack=True, inactivity_timeout=1.0):
                if method is None:
                    break
                got += 1
                if got == count:
                    break
            ch.cancel()
            raw.close()
        assert max_ready * KIB <= 256 * KIB + OVER
        assert got == count
    finally:
        broker.api("DELETE", f"/api/vhosts/{quoted}")


# -- 6. declared through another sidecar -------------------------------------------------------
@pytest.mark.timeout(120)
def test_queue_declared_through_another_sidecar(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """Two floodwalls with the same policy: a consumer declares the queue through sidecar B,
    a producer floods it through sidecar A at once."""
    q = queues("sidecar")
    count = 1024
    entry = capped("sidecar", q, "256KiB", "128KiB")
    a = live_flow(start_floodwall, broker, tmp_path, entry)
    b = start_flow(start_floodwall, broker, policy_file(tmp_path / "b.yaml", entry))
    raw = open_raw(a.port)
    watch = BrokerDepth(broker, q)
    watch.start()
    try:
        with pika_connection(b.port) as conn:
            conn.channel().queue_declare(q)
        raw.send(burst("", q, count))
        wait_for(lambda: a.tripped(q), 10, what="tripped at A")
        settled(broker, a, q, count)
        time.sleep(0.3)
    finally:
        max_ready = watch.stop()
    landed = drain_direct(broker, q, count, timeout=60)
    raw.close()
    assert max_ready * KIB <= 256 * KIB + OVER
    assert [seq_of(x) for x in landed] == list(range(count))
    assert b.queue_state(q) is not None  # B polices it too (it relayed the declare)


# -- 7. a stream: depth is what it retains -----------------------------------------------------
@pytest.mark.timeout(120)
def test_stream_depth_is_what_it_retains(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """A stream keeps its messages after they are read, so its depth is what it retains (the
    broker's count, up to its statistics interval old, plus the proxy's ledger since then).
    Flooded: it trips at capacity and stays tripped (reading does not drain a stream);
    raising the capacity releases the rest, and every message is in the stream, in order."""
    q = queues("stream")
    count = 1024
    policies = tmp_path / "p.yaml"
    policy_file(policies, capped("stream", q, "256KiB", "128KiB"))
    flow = start_flow(start_floodwall, broker, policies)
    raw = open_raw(flow.port)
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
        try:
            raw.send(burst("", q, count))
            wait_for(lambda: flow.tripped(q), 10, what="tripped")
            wait_for(lambda: flow.held()["messages"] > 0, 10, what="held")
            time.sleep(1.0)
            held = flow.held()["messages"]
            in_stream = count - held
            print(f"stream: {in_stream} messages in the stream, {held} held")
            assert in_stream * KIB <= 256 * KIB + OVER
            assert flow.tripped(q)
            policy_file(policies, capped("stream", q, "64MiB", "32MiB"))
            wait_for(lambda: flow.held()["messages"] == 0, 20, what="released by the reload")
            ch.basic_qos(prefetch_count=500)
            got: list[int] = []
            for method, _, body in ch.consume(q, arguments={"x-stream-offset": "first"},
                                              inactivity_timeout=2.0):
                if method is None:
                    break
                ch.basic_ack(method.delivery_tag)
                got.append(seq_of(body))
                if len(got) == count:
                    break
            ch.cancel()
            assert got == list(range(count))
        finally:
            raw.close()
            ch.queue_delete(q)


# -- 8. AMQP 1.0: a link attached before its queue existed -------------------------------------
@pytest.mark.timeout(120)
def test_amqp10_link_to_a_queue_declared_later(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """A proton sender attaches to ``/exchange/amq.direct/Q`` while Q does not exist: nothing
    policed is behind it yet, but a binding may come at any moment, so its credit is one
    window, not the broker's grant. Q is then declared and bound straight at the broker, and
    the sender sends as fast as credit allows: its next transfer finds Q policed (no credit
    until Q's first figure, then the window), and the queue holds."""
    needs_event_plugin(broker)  # (a binding to a known exchange: only events tell it)
    q = queues("link10")
    count = 1024
    flow = live_flow(start_floodwall, broker, tmp_path, capped("link10", q, "256KiB", "128KiB"))
    link = LinkStats("late", f"/exchange/amq.direct/{q}", rate=0, count=count)
    link.active = False
    sender = ProtonSenders(flow.port, [link])
    sender.start()
    watch = BrokerDepth(broker, q)
    try:
        wait_for(lambda: link.link is not None and link.link.credit > 0, 15,
                 what="the link has the broker's credit")
        with pika.BlockingConnection(direct_params(broker)) as conn:
            ch = conn.channel()
            ch.queue_declare(q)
            ch.queue_bind(q, "amq.direct", q)
        watch.start()
        link.active = True
        wait_for(lambda: flow.tripped(q), 15, what="tripped")
        time.sleep(1.0)
        max_ready = watch.stop()
        assert max_ready * KIB <= 256 * KIB + OVER, f"{max_ready} KiB at the broker"
        got = drain_direct(broker, q, count, timeout=60)  # the held link gets credit again
        wait_for(lambda: link.accepted >= count, 30, what="every message accepted")
    finally:
        if not watch.done.is_set():
            watch.stop()
        sender.finish()
    assert not sender.errors and not link.rejected
    assert len(got) == count


# -- 8b. AMQP 1.0: a link that declares its own queue and sends at once -----------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("events", ["on", "off"])
@pytest.mark.parametrize("neighbour", [False, True])
def test_amqp10_link_declaring_its_queue_sends_at_once(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        events: str, neighbour: bool) -> None:
    """A proton sender attaches to ``/queue/Q`` (RabbitMQ declares Q on the attach) and sends
    as fast as credit allows from its first flow, nobody consuming: Q matches a policy but
    the proxy learns of Q only from the attach's effects (an event, or the lookup), so the
    link's first window is all it may send before Q is policed with a first figure; then the
    ledger trips Q. Bound: capacity + one window at the broker. ``neighbour``: a second link
    on the same session sends to a queue no policy matches, as fast as it can, too."""
    if events == "on":
        needs_event_plugin(broker)
    q = queues("own10")
    count = 3072  # 3 MiB against 512 KiB
    flow = live_flow(start_floodwall, broker, tmp_path,
                     capped("own10", q, "512KiB", "256KiB"), events=events)
    watch = BrokerDepth(broker, q)
    watch.start()
    link = LinkStats("own", f"/queue/{q}", rate=0, count=count)
    free = LinkStats("free", f"/queue/{queues('free10')}", rate=0, count=count)
    sender = ProtonSenders(flow.port, [link, free] if neighbour else [link])
    sender.start()
    try:
        wait_for(lambda: flow.tripped(q), 20, what="tripped")
        # the link gets no more credit: what it sent stops growing
        wait_for(lambda: link.sent == link.accepted and link.link is not None
                 and link.link.credit == 0, 20, what="the link without credit, all settled")
        max_ready = watch.stop()
        print(f"amqp10 own queue (events {events}): {link.sent} sent, broker max "
              f"{max_ready} ready")
        assert max_ready * KIB <= 512 * KIB + OVER, f"{max_ready} KiB at the broker"
        got = drain_direct(broker, q, count, timeout=60)  # the held link gets credit again
        wait_for(lambda: link.accepted >= count, 30, what="every message accepted")
    finally:
        if not watch.done.is_set():
            watch.stop()
        sender.finish()
    assert not sender.errors and not link.rejected
    assert len(got) == count


# -- 9. management API load does not grow with queues no policy matches ---------------------
@pytest.mark.timeout(180)
def test_management_load_does_not_grow_with_unpoliced_queues(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """Requests to the management API in equal windows, before and after 300 queues no policy
    matches were declared at the broker and each got a publish through the proxy."""
    policed = queues("mgmt-policed")
    flow = live_flow(start_floodwall, broker, tmp_path,
                     capped("mgmt", policed, "256KiB", "128KiB"),
                     more=("--management-interval", "1s", "--topology-interval", "3600s"))
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(policed)
    wait_for(lambda: flow.policed(policed), 10, what="policed")

    def window(seconds: float) -> float:
        before = flow.metric("floodwall_management_requests_total")
        time.sleep(seconds)
        return flow.metric("floodwall_management_requests_total") - before

    quiet = window(6.0)
    others = [unique("mgmt-free") for _ in range(300)]
    try:
        with pika.BlockingConnection(direct_params(broker)) as conn:
            ch = conn.channel()
            for name in others:
                ch.queue_declare(name)
        with pika_connection(flow.port) as conn:
            ch = conn.channel()
            for name in others:
                ch.basic_publish("", name, b"x")
        busy = window(6.0)
    finally:
        with pika.BlockingConnection(direct_params(broker)) as conn:
            ch = conn.channel()
            for name in others:
                ch.queue_delete(name)
    print(f"management requests per 6 s: {quiet:.0f} with 1 queue, {busy:.0f} with 300 "
          "more")
    assert busy <= quiet + 2  # the timers' phase may add one sample or alarm poll
    assert flow.metric("floodwall_topology_lookups_total", kind="exchange", result="found") == 0


# -- 10. a broker without the event plugin -----------------------------------------------------
@pytest.fixture(scope="module")
def plain_node(broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    """A node of our own without rabbitmq_event_exchange."""
    try:
        server_script()
    except BrokerError as exc:
        pytest.skip(f"needs Debian's rabbitmq-server: {exc}")
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-it-noevents-"))
    node = LocalBroker(workdir, plugins=tuple(p for p in PLUGINS
                                              if p != "rabbitmq_event_exchange"),
                     release=broker_release)
    node.start()
    try:
        yield node
    finally:
        node.remove()


@pytest.mark.timeout(120)
def test_without_the_event_plugin_it_says_so_and_lookups_police(
        plain_node: LocalBroker, start_floodwall: Any, tmp_path: Path) -> None:
    ep = plain_node.endpoint
    q = unique("noevents")
    count = 1024
    flow = start_flow(start_floodwall, ep,
                      policy_file(tmp_path / "p.yaml", capped("noev", q, "256KiB", "128KiB")),
                      upstream=f"{ep.host}:{ep.amqp_port}")
    wait_for(lambda: flow.log("topology_events_unavailable"), 10, what="the warning")
    status, body = http_status(flow.proc.admin_url + "/readyz")
    assert status == 200
    assert b"rabbitmq_event_exchange plugin is not enabled" in body
    state = flow.proc.state()["flow"]["topology"]  # type: ignore[index]
    assert state["events"].startswith("unavailable")
    assert flow.metric("floodwall_topology_events_up") == 0
    raw = open_raw(flow.port)
    watch = BrokerDepth(ep, q)
    watch.start()
    try:
        with pika.BlockingConnection(direct_params(ep)) as conn:
            conn.channel().queue_declare(q)
        raw.send(burst("", q, count))
        wait_for(lambda: flow.tripped(q), 10, what="tripped")
        settled(ep, flow, q, count)
        time.sleep(0.3)
    finally:
        max_ready = watch.stop()
    landed = drain_direct(ep, q, count, timeout=60)
    raw.close()
    assert max_ready * KIB <= 256 * KIB + OVER
    assert len(landed) == count
    assert len(flow.log("topology_events_unavailable")) == 1  # said once
    with contextlib.suppress(Exception):
        delete_queue(ep, q)
