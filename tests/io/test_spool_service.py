"""The spool service: recovery, group commit and acks, replay against the real broker (in
order, byte-exact, deleted once confirmed, stopping when the queue trips), routing, drain."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import header as pamqp_header
from pamqp.commands import Basic
from prometheus_client import generate_latest

from floodwall.control.controller import FlowController
from floodwall.control.policy import EMPTY_POLICIES, PolicySet, parse_policies
from floodwall.control.routing import Topology
from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.enforce.shared import Enforcement
from floodwall.io.spool import SpoolService, SpoolServiceSettings, record_headers
from floodwall.io.switchboard import Switchboard
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials
from floodwall.ops.metrics import make_registry
from floodwall.ops.telemetry import event_fields
from floodwall.spool.manager import SpoolFull, SpoolLimits, SpoolLocked, SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.types import Described, ULong, decode_value, encode
from tests.conftest import eventually, run

pika = pytest.importorskip("pika")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def content_header(body: bytes, n: int) -> bytes:
    props = Basic.Properties(content_type="text/plain", delivery_mode=2,
                             headers={"n": n, "origin": "spool-test"}, message_id=f"m{n}")
    return bytes(pamqp_header.ContentHeader(0, len(body), props).marshal())


def record(n: int, exchange: str, routing_key: str, size: int = 64) -> SpoolRecord:
    body = f"msg-{n:06d}|".encode().ljust(size, b"x")
    return SpoolRecord(0, time.time(), exchange, routing_key, content_header(body, n), body)


def fill(root: Path, key: tuple[str, str], records: list[SpoolRecord]) -> None:
    m = SpoolManager(root, SpoolLimits(min_free_bytes=0), segment_bytes=64 * 1024)
    for r in records:
        m.append(key, r, 1 << 40)
    m.sync()
    m.close()


def settings(root: Path, ep: BrokerEndpoint | None = None, **kw: Any) -> SpoolServiceSettings:
    host, port = (ep.host, ep.amqp_port) if ep is not None else ("127.0.0.1", 1)
    creds = AmqpCredentials(ep.username, ep.password) if ep is not None else AmqpCredentials()
    return SpoolServiceSettings(root, Upstreams([(host, port)]), creds,
                                SpoolLimits(min_free_bytes=0), check_interval=0.01,
                                retry_min=0.05, retry_max=0.2, **kw)


def policies_for(queue: str, extra: str = "") -> PolicySet:
    return parse_policies(f"""
version: 1
policies:
  - name: spooled
    match: {{vhost: "/", queue: "{queue}*"}}
    max_messages: 500
    resume_messages: 100
    overflow: spool
{extra}
""")


class Admin:
    def __init__(self, ep: BrokerEndpoint) -> None:
        self.conn = pika.BlockingConnection(pika.ConnectionParameters(
            ep.host, ep.amqp_port, credentials=pika.PlainCredentials(ep.username, ep.password)))
        self.ch = self.conn.channel()
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, name: str) -> str:
        self.ch.queue_declare(name)
        self.queues.append(name)
        return name

    def exchange(self, name: str, kind: str) -> str:
        self.ch.exchange_declare(name, kind, auto_delete=False)
        self.exchanges.append(name)
        return name

    def depth(self, name: str) -> int:
        return int(self.ch.queue_declare(name, passive=True).method.message_count)

    def take(self, name: str) -> list[tuple[Any, Any, bytes]]:
        got: list[tuple[Any, Any, bytes]] = []
        while True:
            method, props, body = self.ch.basic_get(name, auto_ack=True)
            if method is None:
                return got
            got.append((method, props, body))

    def close(self) -> None:
        for q in self.queues:
            self.ch.queue_delete(q)
        for e in self.exchanges:
            self.ch.exchange_delete(e)
        self.conn.close()


@pytest.fixture
def admin(broker: BrokerEndpoint) -> Iterator[Admin]:
    a = Admin(broker)
    yield a
    a.close()


def board_for(controller: FlowController,
              seen: list[tuple[str, dict[str, object]]] | None = None) -> Switchboard:
    """What io/ has around the controller; ``seen`` gets the telemetry's view of events."""
    board = Switchboard(Enforcement(controller), time.monotonic)
    if seen is not None:
        board.observe(lambda ev: seen.extend(filter(None, [event_fields(ev)])))
    return board


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == name]


# --- against the broker -----------------------------------------------------------------

@pytest.mark.broker
def test_replay_in_order_byte_exact_and_confirmed_records_deleted(
        broker: BrokerEndpoint, admin: Admin, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    q = admin.queue(unique("replay"))
    key = ("/", q)
    recs = [record(i, "", q) for i in range(3000)]
    recs[1500] = record(1500, "", q, size=300_000)  # bigger than frame_max: split in frames
    fill(tmp_path, key, recs)
    caplog.set_level(logging.INFO, "floodwall.spool")
    topology = Topology()
    topology.declare_queue("/", q)
    controller = FlowController(topology, EMPTY_POLICIES)
    seen: list[tuple[str, dict[str, object]]] = []
    svc = SpoolService(settings(tmp_path, broker), board_for(controller, seen), topology)

    async def body() -> None:
        await svc.start()
        spool = svc.manager.spools[key]
        await eventually(lambda: spool.empty, 30, "the spool to empty")
        await eventually(lambda: admin_depth() == len(recs), 10, "every message queued")
        assert svc.replays[key].replayed == len(recs)
        assert not list((tmp_path / "%2F" / q).glob("*.seg"))  # confirmed: deleted
        text = generate_latest(make_registry([svc.collector])).decode()
        assert (f'floodwall_spool_replayed_records_total{{queue="{q}",vhost="/"}} 3000.0'
                in text)
        assert f'floodwall_spool_records{{queue="{q}",vhost="/"}} 0.0' in text
        state = svc.state()
        assert state["accepting"] is True and state["records"] == 0
        await svc.stop()

    def admin_depth() -> bool | int:
        return admin.depth(q)

    run(body)
    got = admin.take(q)
    assert [b for _, _, b in got] == [r.body for r in recs]
    method, props, _ = got[7]
    assert method.exchange == "" and method.routing_key == q
    assert props.headers == {"n": 7, "origin": "spool-test"} and props.message_id == "m7"
    assert props.content_type == "text/plain" and props.delivery_mode == 2
    started = events(caplog, "spool_replay_started")
    stopped = events(caplog, "spool_replay_stopped")
    assert started and started[0].__dict__["records"] == 3000
    assert stopped[-1].__dict__["reason"] == "empty"
    assert sum(r.__dict__["replayed"] for r in stopped) == 3000
    replays = [fields for name, fields in seen if name == "replay"]  # telemetry events
    assert sum(int(str(f["replayed"])) for f in replays) == 3000
    assert replays[-1]["reason"] == "empty" and replays[-1]["records_left"] == 0


def amqp10_record(n: int, address: str, size: int = 64) -> SpoolRecord:
    """An AMQP 1.0 message as a client transferred it: properties and one data section."""
    body = f"msg-{n:06d}|".encode().ljust(size, b"x")
    message = (encode(Described(ULong(0x73), [f"m{n}", None, None, "subj"]))
               + encode(Described(ULong(0x75), body)))
    return SpoolRecord.amqp10_message(0, time.time(), address, 0, message)


def body_of(rec: SpoolRecord) -> bytes:
    """What a 0-9-1 consumer gets of a record (RabbitMQ 3.10: a single data section's bytes)."""
    if not rec.amqp10:
        return rec.body
    _, end = decode_value(rec.body, 0, len(rec.body))  # the properties section
    section, _ = decode_value(rec.body, end, len(rec.body))
    assert isinstance(section, Described) and isinstance(section.value, bytes)
    return section.value


@pytest.mark.broker
def test_replay_keeps_spool_order_across_0_9_1_and_1_0_records(
        broker: BrokerEndpoint, admin: Admin, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """1.0 records go over AMQP 1.0 (to their address when it routes to exactly the queue,
    else to /amq/queue/Q), 0-9-1 records over 0-9-1; the queue gets them in spool order."""
    q = admin.queue(unique("replay10"))
    other = admin.queue(unique("replay10-other"))
    fanout = admin.exchange(unique("replay10-fan"), "fanout")
    admin.ch.queue_bind(q, fanout)
    admin.ch.queue_bind(other, fanout)
    key = ("/", q)
    recs: list[SpoolRecord] = []
    for i in range(900):
        if i % 300 == 150:
            recs.append(amqp10_record(i, f"/exchange/{fanout}/x"))  # reaches other too
        elif (i // 7) % 2:
            recs.append(amqp10_record(i, f"/amq/queue/{q}"))
        else:
            recs.append(record(i, "", q))
    recs[401] = amqp10_record(401, f"/amq/queue/{q}", size=400_000)  # several frames
    fill(tmp_path, key, recs)
    caplog.set_level(logging.INFO, "floodwall.spool")
    topology = Topology()
    for name in (q, other):
        topology.declare_queue("/", name)
    topology.declare_exchange("/", fanout, "fanout")
    topology.bind_queue("/", q, fanout, "")
    topology.bind_queue("/", other, fanout, "")
    controller = FlowController(topology, EMPTY_POLICIES)
    svc = SpoolService(settings(tmp_path, broker), board_for(controller), topology)

    async def body() -> None:
        await svc.start()
        await eventually(lambda: svc.manager.spools[key].empty, 60, "the spool to empty")
        assert svc.replays[key].replayed == len(recs)
        await svc.stop()

    run(body)
    got = admin.take(q)
    assert [b for _, _, b in got] == [body_of(r) for r in recs]
    assert admin.depth(other) == 0  # the fanout address was not used: rerouted to the queue
    rerouted = events(caplog, "spool_replay_rerouted")
    assert len(rerouted) == 1 and rerouted[0].__dict__["protocol"] == "amqp10"


@pytest.mark.broker
def test_replay_stops_when_the_queue_trips_and_resumes_on_release(
        broker: BrokerEndpoint, admin: Admin, tmp_path: Path) -> None:
    q = admin.queue(unique("tripping"))
    key = ("/", q)
    recs = [record(i, "", q) for i in range(1200)]
    fill(tmp_path, key, recs)
    topology = Topology()
    topology.declare_queue("/", q)
    controller = FlowController(topology, policies_for(q))
    controller.queue_seen(key, time.monotonic())
    controller.sampled_ready_count(key, time.monotonic(), 0, 0.01, time.monotonic())
    svc = SpoolService(settings(tmp_path, broker), board_for(controller), topology)
    received: list[bytes] = []

    async def body() -> None:
        await svc.start()
        policed = controller.queues[key]
        spool = svc.manager.spools[key]
        rounds = 0
        while not spool.empty:
            rounds += 1
            assert rounds < 10
            await eventually(lambda: policed.tripped or spool.empty, 20, "a trip")
            if policed.tripped:
                await eventually(lambda: svc.replays[key].state == "waiting: queue tripped",
                                 5, "the replayer to wait")
                await asyncio.sleep(0.2)
                depth = admin.depth(q)
                assert 500 < depth <= 501 + 5  # stopped at the trip, nothing more went
                assert not spool.empty
            # a consumer drains the queue; the next depth sample releases it
            received.extend(b for _, _, b in admin.take(q))
            await asyncio.sleep(0.05)
            controller.sampled_ready_count(key, time.monotonic(), admin.depth(q), 0.01,
                                           time.monotonic())
            svc.board.settle()
        await eventually(lambda: admin.depth(q) == len(recs) - len(received), 10, "the rest")
        assert rounds >= 2
        await svc.stop()

    run(body)
    received.extend(b for _, _, b in admin.take(q))
    assert received == [r.body for r in recs]


@pytest.mark.broker
def test_routing_kept_when_it_reaches_only_the_queue_else_default_exchange(
        broker: BrokerEndpoint, admin: Admin, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    q = admin.queue(unique("routed"))
    other = admin.queue(unique("other"))
    direct = admin.exchange(unique("fw-direct"), "direct")
    fan = admin.exchange(unique("fw-fan"), "fanout")
    admin.ch.queue_bind(q, direct, "k1")
    admin.ch.queue_bind(q, fan)
    admin.ch.queue_bind(other, fan)
    topology = Topology()
    for name in (q, other):
        topology.declare_queue("/", name)
    topology.declare_exchange("/", direct, "direct")
    topology.declare_exchange("/", fan, "fanout")
    topology.bind_queue("/", q, direct, "k1")
    topology.bind_queue("/", q, fan, "")
    topology.bind_queue("/", other, fan, "")
    key = ("/", q)
    fill(tmp_path, key, [record(0, direct, "k1"), record(1, fan, "any"), record(2, direct, "k1")])
    caplog.set_level(logging.INFO, "floodwall.spool")
    svc = SpoolService(settings(tmp_path, broker),
                       board_for(FlowController(topology, EMPTY_POLICIES)), topology)

    async def body() -> None:
        await svc.start()
        await eventually(lambda: svc.manager.spools[key].empty, 10, "the replay")
        await svc.stop()

    run(body)
    got = admin.take(q)
    assert [(m.exchange, m.routing_key) for m, _, _ in got] == [
        (direct, "k1"), ("", q), (direct, "k1")]
    assert admin.take(other) == []  # the fanout would have copied it there
    assert len(events(caplog, "spool_replay_rerouted")) == 1
    assert svc.replays[key].rerouted


@pytest.mark.broker
def test_unroutable_records_stay_on_disk(broker: BrokerEndpoint, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    q = unique("gone")  # never declared
    key = ("/", q)
    fill(tmp_path, key, [record(i, "", q) for i in range(5)])
    caplog.set_level(logging.INFO, "floodwall.spool")
    svc = SpoolService(settings(tmp_path, broker),
                       board_for(FlowController(Topology(), EMPTY_POLICIES)))

    async def body() -> None:
        await svc.start()
        await eventually(lambda: events(caplog, "spool_queue_unroutable"), 10, "a return")
        assert svc.manager.spools[key].pending_records == 5
        assert svc.replays[key].last_error == "returned"
        await svc.stop()

    run(body)
    again = SpoolManager(tmp_path)
    assert again.recover()[key].records == 5


@pytest.mark.broker
def test_drain_replays_within_the_deadline(broker: BrokerEndpoint, admin: Admin,
                                           tmp_path: Path) -> None:
    q = admin.queue(unique("drain"))
    key = ("/", q)
    fill(tmp_path, key, [record(i, "", q) for i in range(200)])
    topology = Topology()
    topology.declare_queue("/", q)
    svc = SpoolService(settings(tmp_path, broker),
                       board_for(FlowController(topology, EMPTY_POLICIES)), topology)

    async def body() -> None:
        await svc.start()
        left = await svc.drain(asyncio.get_running_loop().time() + 20)
        assert left == (0, 0)
        with pytest.raises(SpoolFull, match="draining"):
            svc.manager.append(key, record(999, "", q), 1 << 30)
        assert await svc.stop() == (0, 0)

    run(body)
    assert len(admin.take(q)) == 200


# --- no broker needed (replay kept off) -------------------------------------------------

class Owner:
    def __init__(self, conn_id: int) -> None:
        self.conn_id = conn_id
        self.durable: list[dict[tuple[str, str], int]] = []

    def channel_released(self, channel: int, now: float) -> None:
        pass

    def spool_durable(self, durable: dict[tuple[str, str], int]) -> None:
        self.durable.append(dict(durable))


def test_group_commit_tells_owners_and_never_does_not_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policies = parse_policies("""
version: 1
policies:
  - name: grouped
    match: {vhost: "/", queue: "g"}
    capacity: 1MiB
    overflow: spool
    spool: {fsync: group, group_commit_ms: 50}
  - name: unsynced
    match: {vhost: "/", queue: "n"}
    capacity: 1MiB
    overflow: spool
    spool: {fsync: never}
""")
    controller = FlowController(Topology(), policies)
    owner = Owner(1)
    seen: list[tuple[str, dict[str, object]]] = []
    board = board_for(controller, seen)
    board.attach(owner)
    svc = SpoolService(settings(tmp_path), board, ready=lambda: False)
    fsynced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        fsynced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)

    async def body() -> None:
        with pytest.raises(SpoolFull):  # not before start() recovered the directory
            svc.manager.append(("/", "g"), record(0, "", "g"), 1 << 30)
        await svc.start()
        t0 = time.monotonic()
        svc.port.append(("/", "n"), record(1, "", "n"), 1 << 30)  # as a gate does
        await eventually(lambda: owner.durable, 2, "the never-fsync commit")
        assert owner.durable[-1] == {("/", "n"): 1} and not fsynced
        svc.port.append(("/", "g"), record(2, "", "g"), 1 << 30)
        svc.port.append(("/", "g"), record(3, "", "g"), 1 << 30)
        await eventually(lambda: len(owner.durable) == 2, 2, "the group commit")
        assert owner.durable[-1] == {("/", "g"): 2}
        assert time.monotonic() - t0 >= 0.05  # it waited for the group
        assert fsynced  # and fsynced it
        assert svc.commits == 2
        # one telemetry event per queue whose spool started filling, not one per record
        assert [(n, f["queue"]) for n, f in seen if n == "spool"] == [("spool", "n"),
                                                                      ("spool", "g")]
        assert svc.replays == {} or all(r.replayed == 0 for r in svc.replays.values())
        await asyncio.sleep(0.05)
        assert "warming up" in svc.replays[("/", "g")].state
        left = await svc.drain(asyncio.get_running_loop().time() + 0.1)
        assert left[0] == 3
        assert await svc.stop() == left

    run(body)


def test_stop_does_not_wait_out_a_replayers_backoff(tmp_path: Path) -> None:
    """A replayer backing off (here from an upstream that refuses it; as well from a queue
    that is gone) ends at once on ``stop()``: the proxy's shutdown does not wait out its
    backoff, up to ``retry_max``."""
    key = ("/", "q")
    fill(tmp_path, key, [record(i, "", "q") for i in range(3)])
    backoff = SpoolServiceSettings(tmp_path, Upstreams([("127.0.0.1", 1)]), AmqpCredentials(),
                                   SpoolLimits(min_free_bytes=0), check_interval=0.01,
                                   retry_min=30.0, retry_max=30.0)
    svc = SpoolService(backoff, board_for(FlowController(Topology())), ready=lambda: True)

    async def body() -> None:
        await svc.start()
        await eventually(lambda: key in svc.replays and "upstream" in svc.replays[key].state,
                         5, "a backoff")
        t0 = time.monotonic()
        left = await svc.stop()
        assert time.monotonic() - t0 < 2.0
        assert left[0] == 3

    run(body)


def test_start_recovers_and_logs_torn_tails_and_takes_the_lock(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = ("vh", "q/with slash")
    fill(tmp_path, key, [record(i, "", key[1]) for i in range(10)])
    seg = sorted((tmp_path / "vh" / "q%2Fwith%20slash").glob("*.seg"))[-1]
    with open(seg, "ab") as f:
        f.write(b"FWR1\x00\x00\x10\x00garbage")  # a torn last append
    caplog.set_level(logging.INFO, "floodwall.spool")
    svc = SpoolService(settings(tmp_path), board_for(FlowController(Topology())),
                       ready=lambda: False)

    async def body() -> None:
        await svc.start()
        other = SpoolService(settings(tmp_path), board_for(FlowController(Topology())))
        with pytest.raises(SpoolLocked):
            await other.start()
        state = svc.state()
        assert state["records"] == 10
        queues = state["queues"]
        assert isinstance(queues, list) and queues[0]["queue"] == "q/with slash"
        await svc.stop()

    run(body)
    (rec,) = events(caplog, "spool_recovered")
    assert rec.__dict__["records"] == 10 and rec.__dict__["torn_tail_bytes"] == 15
    assert rec.levelno == logging.WARNING
    assert events(caplog, "spool_stopped")[-1].__dict__["records_left"] == 10


def test_record_headers_decode_only_when_present() -> None:
    r = record(5, "", "q")
    assert record_headers(r.properties) == {"n": 5, "origin": "spool-test"}
    plain = bytes(pamqp_header.ContentHeader(0, 3, Basic.Properties()).marshal())
    assert record_headers(plain) is None
