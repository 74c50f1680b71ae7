"""The refusal and robustness paths end to end, through a real ``floodwall run
--policies --management``: overflow reject, deadline, hold budget, a client gone while held,
reload, a sick management API, a broker alarm, and a flood into a queue just declared.

Most tests trip a queue by filling it at the broker itself past ``max_messages`` (a count
the proxy reads in real time), so no publish of the test's own is needed to trip it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import aio_pika.exceptions
import pika
import pika.exceptions
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header
from pamqp.heartbeat import Heartbeat

from floodwall.dev.devbroker import (
    BrokerEndpoint,
    LocalBroker,
    free_port,
)
from tests.conftest import wait_for
from tests.integration.support import (
    FlowProxy,
    Raw091,
    broker_connection_named,
    capped,
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

pytestmark = pytest.mark.broker

KIB = 1024
TARGET = 64 * KIB + 256 * KIB
FILL = 80  # messages put in at the broker: over max_messages 64
FILL_BASE = 1_000_000  # their sequence numbers start here


def counted(name: str, queue: str, **fields: str) -> str:
    """64 KiB / 32 KiB, and 64 / 32 messages: a direct fill of FILL messages trips it."""
    return capped(name, queue, max_messages="64", resume_messages="32", **fields)


def declare_direct(broker: BrokerEndpoint, *names: str) -> None:
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        for name in names:
            ch.queue_declare(name)


def fill_direct(broker: BrokerEndpoint, queue: str, count: int = FILL) -> None:
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        for i in range(count):
            ch.basic_publish("", queue, numbered(FILL_BASE + i))


def trip(broker: BrokerEndpoint, flow: FlowProxy, queue: str) -> None:
    """Fill ``queue`` at the broker past max_messages; wait for the proxy to trip it."""
    fill_direct(broker, queue)
    wait_for(lambda: flow.tripped(queue), 10, what=f"{queue} tripped")


def broker_channels_of(broker: BrokerEndpoint, name: str) -> list[Any] | None:
    """The broker's channels on the upstream connection of the client called ``name``."""
    record = broker_connection_named(broker, name)
    if record is None:
        return None
    doc = broker.api("GET", f"/api/connections/{quote(record['name'], safe='')}/channels")
    assert isinstance(doc, list)
    return doc


def publish_frames(seq: int, queue: str, channel: int = 1) -> bytes:
    data = numbered(seq)
    return (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), channel)
            + frame.marshal(pamqp_header.ContentHeader(0, len(data),
                                                       commands.Basic.Properties()), channel)
            + frame.marshal(pamqp_body.ContentBody(data), channel))


def expect_frame(raw: Raw091, kind: type, timeout: float = 10.0) -> Any:
    raw.sock.settimeout(timeout)
    while True:
        _, value = raw.read_frame()
        if isinstance(value, Heartbeat):
            continue
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r} " + (
            f"{getattr(value, 'reply_code', '')} {getattr(value, 'reply_text', '')}")
        return value


def open_raw(flow: FlowProxy, queue: str, name: str | None = None) -> Raw091:
    raw = Raw091.connect(flow.port)
    raw.handshake(name=name or unique("raw"))
    raw.send_frame(commands.Channel.Open(), 1)
    expect_frame(raw, commands.Channel.OpenOk)
    return raw


# -- 4. overflow: reject ------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_reject_nacks_in_confirm_mode_and_confirms_stay_aligned(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q, free = queues("rej"), queues("free")
    declare_direct(broker, q, free)
    flow = flow_with(start_floodwall, broker, tmp_path, counted("rej", q, overflow="reject"))
    trip(broker, flow, q)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", free, numbered(0))  # acked
        for i in (1, 3):
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", q, numbered(i))
            ch.basic_publish("", free, numbered(i + 1))  # acked: numbers still line up

    async def interleaved() -> list[Any]:
        url = f"amqp://guest:guest@127.0.0.1:{flow.port}/"
        async with await aio_pika.connect(url, timeout=10) as conn:
            ch = await conn.channel(publisher_confirms=True)
            targets = [free, q, free, q, q, free, free, q, free]
            results = await asyncio.wait_for(asyncio.gather(*(
                ch.default_exchange.publish(aio_pika.Message(numbered(10 + i)), routing_key=t)
                for i, t in enumerate(targets)), return_exceptions=True), 15)
            return list(zip(targets, results, strict=True))

    for target, result in asyncio.run(interleaved()):
        if target == q:
            assert isinstance(result, aio_pika.exceptions.DeliveryError), result
        else:
            assert isinstance(result, commands.Basic.Ack), result
    assert flow.metric("floodwall_rejected_publishes_total") == 2 + 4
    assert ready_count(broker, free) == 3 + 5
    assert ready_count(broker, q) == FILL, "a rejected publish reached the queue"
    assert flow.held()["messages"] == 0


@pytest.mark.timeout(60)
def test_reject_without_confirms_closes_the_channel_naming_the_queue(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q, free = queues("rej"), queues("free")
    declare_direct(broker, q, free)
    flow = flow_with(start_floodwall, broker, tmp_path, counted("rej", q, overflow="reject"))
    trip(broker, flow, q)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.basic_publish("", free, numbered(0))
        ch.basic_publish("", q, numbered(1))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare(q, passive=True)
        assert info.value.reply_code == 406
        assert q in info.value.reply_text and "reject" in info.value.reply_text
        # the connection and its other channels are fine
        ch2 = conn.channel()
        ch2.confirm_delivery()
        ch2.basic_publish("", free, numbered(2))
    assert ready_count(broker, free) == 2
    assert ready_count(broker, q) == FILL
    assert flow.metric("floodwall_rejected_publishes_total") == 1


# -- 5. deadline ------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_deadline_nacks_or_closes_with_a_reason(broker: BrokerEndpoint, start_floodwall: Any,
                                               tmp_path: Path, queues: Any) -> None:
    q, free = queues("dl"), queues("free")
    declare_direct(broker, q, free)
    flow = flow_with(start_floodwall, broker, tmp_path, counted("dl", q, deadline="2s"))
    trip(broker, flow, q)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", q, numbered(0))
        waited = time.monotonic() - t0
        assert 1.9 <= waited < 5, f"nacked after {waited:.2f}s"
        ch.basic_publish("", free, numbered(1))  # acked: the channel goes on
        plain = conn.channel()
        plain.basic_publish("", q, numbered(2))
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            plain.queue_declare(q, passive=True)  # waits behind the held publish
        waited = time.monotonic() - t0
        assert 1.8 <= waited < 5, f"closed after {waited:.2f}s"
        assert info.value.reply_code == 406
        assert "deadline" in info.value.reply_text and q in info.value.reply_text
        assert conn.is_open
        conn.channel().queue_declare(free, passive=True)
    assert flow.metric("floodwall_deadline_expiries_total") == 2
    assert ready_count(broker, q) == FILL, "an expired publish reached the queue"
    assert ready_count(broker, free) == 1
    assert flow.held()["messages"] == 0


@pytest.mark.timeout(60)
def test_deadline_close_after_the_client_closed_its_channel(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """pika's connection.close() does exactly this when publishes are held past the deadline."""
    q = queues("dl")
    declare_direct(broker, q)
    flow = flow_with(start_floodwall, broker, tmp_path, counted("dl", q, deadline="1s"))
    trip(broker, flow, q)
    name = unique("raw")
    raw = open_raw(flow, q, name)
    try:
        raw.send(publish_frames(0, q))
        wait_for(lambda: flow.held()["messages"] == 1, 10, what="the publish held")
        raw.send_frame(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                             method_id=0), 1)
        close = expect_frame(raw, commands.Channel.Close)
        assert close.reply_code == 406 and "deadline" in close.reply_text
        # the broker has answered the proxy's own close (its channel is gone) before the
        # client's close-ok goes out: the order this test is about
        wait_for(lambda: broker_channels_of(broker, name) == [], 15,
                 what="the broker to close the proxy's channel")
        raw.send_frame(commands.Channel.CloseOk(), 1)
        raw.send_frame(commands.Channel.Open(), 2)
        expect_frame(raw, commands.Channel.OpenOk)  # nothing else, and no connection.close
        raw.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye",
                                                 class_id=0, method_id=0))
        expect_frame(raw, commands.Connection.CloseOk)
    finally:
        raw.close()
    assert ready_count(broker, q) == FILL


# -- 6. hold budget ---------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_hold_budget_stops_reading_that_connection_only(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q, free = queues("budget"), queues("free")
    declare_direct(broker, q, free)
    budget = 256 * KIB
    flow = flow_with(start_floodwall, broker, tmp_path, counted("budget", q),
                     args=("--hold-budget", "256KiB"))
    trip(broker, flow, q)
    count = 3000  # 3 MiB: far past the budget
    published: list[int] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with pika_connection(flow.port) as conn:
                ch = conn.channel()
                for i in range(count):
                    ch.basic_publish("", q, numbered(i))
                    published.append(i)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        wait_for(lambda: flow.log("hold_budget_exceeded"), 20, what="hold_budget_exceeded")
        # the proxy holds no more than the budget (plus what one read brought)
        peak = 0
        for _ in range(10):  # an observation window: the upper bound must hold throughout
            peak = max(peak, flow.held()["bytes"])
            time.sleep(0.1)
        print(f"hold budget {budget}: peak held {peak} bytes")
        assert budget < peak <= 2 * budget, peak
        assert flow.tripped(q) and ready_count(broker, q) == FILL
        # another connection keeps working, promptly
        t0 = time.monotonic()
        with pika_connection(flow.port) as other:
            ch = other.channel()
            ch.confirm_delivery()
            for i in range(50):
                ch.basic_publish("", free, numbered(i))
            got = ch.basic_get(free, auto_ack=True)
            assert got[0] is not None and seq_of(got[2]) == 0
        assert time.monotonic() - t0 < 5
    finally:
        landed = drain_direct(broker, q, FILL + count, timeout=60)
    producer.join(30)
    assert not producer.is_alive() and not errors, errors
    ids = sorted(seq_of(b) for b in landed)
    assert ids == list(range(count)) + [FILL_BASE + i for i in range(FILL)]
    wait_for(lambda: flow.held()["messages"] == 0, 10, what="nothing held")


def pika_params_for(flow: FlowProxy) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", flow.port, connection_attempts=1,
                                     socket_timeout=10)


# -- 7. a client that leaves while its publishes are held ----------------------------------
@pytest.mark.timeout(60)
def test_held_publishes_outlive_their_client(broker: BrokerEndpoint, start_floodwall: Any,
                                             tmp_path: Path, queues: Any) -> None:
    q = queues("gone")
    declare_direct(broker, q)
    flow = flow_with(start_floodwall, broker, tmp_path, counted("gone", q))
    trip(broker, flow, q)
    # one client vanishes (socket closed, no connection.close) ...
    raw = open_raw(flow, q)
    raw.send(b"".join(publish_frames(i, q) for i in range(50)))
    wait_for(lambda: flow.held()["messages"] == 50, 10, what="50 held")
    raw.close()
    wait_for(lambda: flow.log("client_gone_with_held_publishes"), 10, what="client gone")
    # ... another closes cleanly: its close waits behind its held publishes
    conn = pika.BlockingConnection(pika_params_for(flow))
    ch = conn.channel()
    for i in range(50, 80):
        ch.basic_publish("", q, numbered(i))
    wait_for(lambda: flow.held()["messages"] == 80, 10, what="80 held")
    closer = threading.Thread(target=conn.close, daemon=True)
    closer.start()
    time.sleep(0.5)  # observation window for a negative claim: close must NOT finish
    assert closer.is_alive(), "connection.close did not wait for the held publishes"
    assert ready_count(broker, q) == FILL
    landed = drain_direct(broker, q, FILL + 80, timeout=30)
    closer.join(10)
    assert not closer.is_alive()
    assert sorted(map(seq_of, landed)) == list(range(80)) + [FILL_BASE + i for i in range(FILL)]
    wait_for(lambda: flow.log("held_publishes_delivered"), 10, what="delivered line")
    assert not flow.log("held_publishes_lost")
    time.sleep(0.3)  # observation window for a negative claim: no second copy turns up
    assert ready_count(broker, q) == 0, "a publish arrived twice"


# -- 8. reload --------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_reload_applies_a_good_file_and_keeps_the_policy_on_a_bad_one(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q, free = queues("reload"), queues("free")
    declare_direct(broker, q, free)
    path = policy_file(tmp_path / "p.yaml", capped("reload", q, "1MiB", "512KiB"))
    flow = start_flow(start_floodwall, broker, path)
    wait_for(lambda: flow.policed(q), 10, what="policed")
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(100):  # 100 KiB: within 1 MiB
            ch.basic_publish("", q, numbered(i))
        # a real-time depth sample taken after the 100 confirmed publishes: the proxy has
        # seen them at the broker, so "not tripped" is its verdict on 100 KiB
        def sampled_all() -> bool:
            state = flow.queue_state(q)
            ready = state["depth"]["ready_count"] if state else None
            return ready is not None and ready >= 100

        wait_for(sampled_all, 15, what="a depth sample counting the 100 messages")
        assert not flow.tripped(q)
        policy_file(path, capped("reload", q, "64KiB", "32KiB"))
        flow.proc.signal(signal.SIGHUP)
        wait_for(lambda: flow.tripped(q), 10, what="tripped at the new capacity")
        assert flow.log("policies_reloaded")
        assert flow.metric("floodwall_queue_capacity_bytes", queue=q) == 64 * KIB
        # the same connection goes on: a publish to q is held, one elsewhere is not
        plain = conn.channel()
        plain.basic_publish("", q, numbered(100))
        wait_for(lambda: flow.held()["messages"] == 1, 10, what="held")
        ch.basic_publish("", free, numbered(0))
        # a bad file: refused, the policy in force stays
        path.write_text("version: 1\npolicies:\n  - {name: bad, match: {queue: x}, "
                        "capacity: lots}\n")
        flow.proc.signal(signal.SIGHUP)
        wait_for(lambda: flow.log("policy_reload_failed"), 10, what="policy_reload_failed")
        assert flow.metric("floodwall_policy_reloads_total", result="error") >= 1
        assert flow.metric("floodwall_queue_capacity_bytes", queue=q) == 64 * KIB
        assert flow.tripped(q) and flow.held()["messages"] == 1
        landed = drain_direct(broker, q, 101, timeout=30)
        assert sorted(map(seq_of, landed)) == list(range(101))
        assert conn.is_open
    line = flow.log("policy_reload_failed")[0]
    assert "p.yaml" in line and "keeping" in line


# -- 9. a management API that answers 401, or not at all -------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("trouble", ["auth", "unreachable"])
def test_relay_goes_on_when_the_management_api_fails(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any,
        trouble: str) -> None:
    """The relay works; the trouble shows in /readyz, metrics and the log; a policed queue's
    depth is unknown and its on_unknown_depth (block here) applies, deadline included."""
    q, free = queues("mgmt"), queues("free")
    declare_direct(broker, q, free)
    if trouble == "auth":
        url, env = None, {"FLOODWALL_MANAGEMENT_PASSWORD": "wrong"}
    else:
        url, env = f"http://127.0.0.1:{free_port()}", {}
    flow = start_flow(start_floodwall, broker, policy_file(
        tmp_path / "p.yaml", capped("mgmt", q, on_unknown_depth="block", deadline="1s")),
        management=url, env=env)
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(10):
            ch.basic_publish("", free, numbered(i))
        got = [ch.basic_get(free, auto_ack=True)[2] for _ in range(10)]
        assert [seq_of(b) for b in got] == list(range(10))
        ch.queue_declare(q)  # through the proxy: policed without the topology
        wait_for(lambda: flow.tripped(q), 10, what="on_unknown_depth: block")
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", q, numbered(10))
        assert time.monotonic() - t0 >= 0.9
        ch.basic_publish("", free, numbered(11))
    assert flow.metric("floodwall_management_errors_total", kind=trouble) > 0
    assert flow.metric("floodwall_management_up") == 0
    status, body = http_status(flow.proc.admin_url + "/readyz")
    detail = json.loads(body)["flow"]
    assert status == 200, detail  # reported, not fatal
    assert detail["management"]["ok"] is False and detail["management"]["kind"] == trouble
    assert detail["depth_unknown"] == [f"{q}@/"]
    assert len(flow.log("management_api_failed")) == 1
    assert ready_count(broker, q) == 0 and ready_count(broker, free) == 1


# -- 10. a broker alarm, end to end ----------------------------------------------------------
# On the spare broker: an alarm must not block the session broker's other publishers.
#: rabbitmqctl arguments that raise and clear each resource alarm (the node keeps working:
#: a memory watermark nothing stays under, a free-disk limit no disk has).
ALARMS = {
    "memory": (("set_vm_memory_high_watermark", "0.0000001"),
               ("set_vm_memory_high_watermark", "0.4")),
    "disk": (("set_disk_free_limit", str(10**18)), ("set_disk_free_limit", "50000000")),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("alarm", ["memory", "disk"])
def test_broker_alarm_holds_publishes_at_the_proxy_and_consumers_go_on(
        spare: LocalBroker, start_floodwall: Any, tmp_path: Path, alarm: str) -> None:
    raise_alarm, clear_alarm = ALARMS[alarm]
    ep = spare.endpoint
    q, source = unique("alarm"), unique("alarm-src")
    declare_direct(ep, q, source)
    fill_direct(ep, source, 300)
    flow = start_flow(start_floodwall, ep, policy_file(tmp_path / "p.yaml",
                                                       capped("alarm", q, "100MiB", "50MiB")),
                      upstream=f"{ep.host}:{ep.amqp_port}")
    wait_for(lambda: flow.policed(q), 15, what="policed")
    name = unique("alarm-client")
    consumed: list[int] = []
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", flow.port, client_properties={"connection_name": name},
        connection_attempts=1, socket_timeout=10))
    try:
        pub = conn.channel()
        sub = conn.channel()
        sub.basic_qos(prefetch_count=1)

        def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
            consumed.append(seq_of(body))
            ch.basic_ack(method.delivery_tag)

        spare.ctl(*raise_alarm)
        try:
            deadline = time.monotonic() + 30
            while flow.metric("floodwall_broker_alarm") != 1:
                assert time.monotonic() < deadline, "the proxy never saw the alarm"
                conn.process_data_events(0.1)
            for i in range(20):
                pub.basic_publish("", q, numbered(i))
            wait_for(lambda: flow.held()["messages"] == 20, 5, what="20 held")
            sub.basic_consume(source, on_message)  # consuming during the alarm
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                conn.process_data_events(0.1)
            assert flow.held()["messages"] == 20
            assert len(consumed) == 300, "the consumer stopped during the alarm"
            record = broker_connection_named(ep, name)
            assert record is not None and record.get("state") != "blocked", record
            assert ready_count(ep, q) == 0
        finally:
            spare.ctl(*clear_alarm)
        deadline = time.monotonic() + 30
        while flow.held()["messages"]:
            assert time.monotonic() < deadline, "held publishes not released"
            conn.process_data_events(0.1)
        landed = drain_direct(ep, q, 20, timeout=20)
        assert sorted(map(seq_of, landed)) == list(range(20))
        assert flow.metric("floodwall_broker_alarm") == 0
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("alarm", ["memory", "disk"])
def test_broker_alarm_holds_amqp10_sends_at_the_proxy_and_receivers_go_on(
        spare: LocalBroker, start_floodwall: Any, tmp_path: Path, alarm: str) -> None:
    """The same for AMQP 1.0: a sender through floodwall during the alarm has nothing of its
    reach the broker (floodwall holds the link, on 4.x before the broker's own closed session
    window would), while a receiver through floodwall on the same broker goes on; once the
    alarm clears, every message arrives."""
    from proton import Message
    from proton.utils import BlockingConnection

    raise_alarm, clear_alarm = ALARMS[alarm]
    ep = spare.endpoint
    q, source = unique("alarm10"), unique("alarm10-src")
    declare_direct(ep, q, source)
    fill_direct(ep, source, 50)
    flow = start_flow(start_floodwall, ep, policy_file(tmp_path / "p.yaml",
                                                       capped("alarm10", q, "100MiB", "50MiB")),
                      upstream=f"{ep.host}:{ep.amqp_port}")
    wait_for(lambda: flow.policed(q), 15, what="policed")

    def address(queue: str) -> str:
        # v2 from RabbitMQ 4 (v1 deprecated there); 3.10's plugin has only v1
        return f"/queues/{queue}" if ep.version >= (4, 0) else f"/amq/queue/{queue}"

    url = f"amqp://guest:guest@127.0.0.1:{flow.port}"
    sent: list[int] = []
    failure: list[BaseException] = []

    def send() -> None:
        try:
            conn = BlockingConnection(url, timeout=60, allowed_mechs="PLAIN")
            sender = conn.create_sender(address(q))
            for i in range(10):
                sender.send(Message(body=numbered(i)), timeout=60)
                sent.append(i)
            conn.close()
        except BaseException as exc:
            failure.append(exc)

    spare.ctl(*raise_alarm)
    sender = threading.Thread(target=send, daemon=True)
    try:
        wait_for(lambda: flow.metric("floodwall_broker_alarm") == 1, 30,
                 what="the proxy to see the alarm")
        sender.start()
        receiver_conn = BlockingConnection(url, timeout=30, allowed_mechs="PLAIN")
        receiver = receiver_conn.create_receiver(address(source), credit=10)
        got = []
        for _ in range(50):  # receiving during the alarm
            got.append(receiver.receive(timeout=20))
            receiver.accept()
        receiver_conn.close()
        assert len(got) == 50
        assert ready_count(ep, q) == 0 and not sent, "a send reached the broker in the alarm"
    finally:
        spare.ctl(*clear_alarm)
    sender.join(90)
    assert not failure, failure
    assert sent == list(range(10))
    landed = drain_direct(ep, q, 10, timeout=20)
    # read over 0-9-1, a 1.0 message's body is its encoded sections: each holds its payload
    assert len(landed) == 10
    assert all(numbered(i) in body for i, body in enumerate(landed)), landed
    wait_for(lambda: flow.metric("floodwall_broker_alarm") == 0, 30, what="the alarm cleared")


# -- a flood into a queue the moment it is declared ---------------------------------------------
@pytest.mark.timeout(60)
def test_flood_right_after_declare_stays_within_target(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    """The flow control's target holds "at any publish rate": also before the first depth sample.
    A raw client declares the queue and, on its declare-ok, writes 2000 publishes at once."""
    q = queues("flood")
    count = 2000
    flow = flow_with(start_floodwall, broker, tmp_path, capped("flood", q))
    burst = b"".join(publish_frames(i, q) for i in range(count))
    raw = open_raw(flow, q)
    try:
        raw.send_frame(commands.Queue.Declare(queue=q), 1)
        expect_frame(raw, commands.Queue.DeclareOk)
        raw.send(burst)
        wait_for(lambda: flow.tripped(q), 10, what="tripped")
        wait_for(lambda: ready_count(broker, q) + flow.held()["messages"] == count, 10,
                 what="every publish at the broker or held")
        depth = ready_count(broker, q)
        landed = drain_direct(broker, q, count, timeout=40)
        assert sorted(map(seq_of, landed)) == list(range(count))
    finally:
        raw.close()
    assert depth * KIB <= TARGET, f"{depth} KiB at the broker, over {TARGET // KIB} KiB"
