"""The 0-9-1 publish gate, driven by bytes: hold, release in order, refuse, signal."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pamqp import commands

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.io.spool import DiskSpoolPort
from floodwall.spool.manager import SpoolManager
from floodwall.wire.amqp091.connection import Connection
from tests.amqp091.wire import (
    CH,
    HEARTBEAT,
    B,
    client_handshake,
    content,
    decode_all,
    method,
    publish,
    server_handshake,
)
from tests.fakes import Board, Clock, DefaultExchange, DiskSpool, FakeSpool

CF = commands.Confirm


def _policies(overflow: str = "hold", deadline: str = "30s", signal: str = "auto") -> str:
    return f"""
version: 1
policies:
  - name: capped
    match: {{vhost: "/orders", queue: "capped*"}}
    capacity: 2000
    resume: 1000
    overflow: {overflow}
    deadline: {deadline}
    signal: {signal}
"""


class Setup:
    def __init__(self, overflow: str = "hold", deadline: str = "30s", signal: str = "auto",
                 product: str = "pytest-client", spool: DiskSpoolPort | FakeSpool | None = None,
                 policies: str | None = None) -> None:
        self.clock = Clock()
        self.fc = FlowController(DefaultExchange(), parse_policies(
            policies or _policies(overflow, deadline, signal)))
        self.board = Board(self.fc, self.clock, spool)
        self.counters = self.board.counters
        for q in ("capped", "capped2", "free"):
            self.fc.queue_seen(("/orders", q), self.clock.t)
        self.sample("capped", 0)
        self.sample("capped2", 0)
        self.gate = PublishFlow(self.board.enforcement, 1)
        self.core = Connection(self.gate, conn_id=1)
        self.board.attach(1, self.core, self.gate)
        hs = client_handshake()
        if product != "pytest-client":
            from pamqp.commands import Connection as C
            hs[0] = method(C.StartOk(client_properties={"product": product,
                                                        "platform": "Java"},
                                     mechanism="PLAIN", response="\0g\0g"))
        self.core.receive_from_server(b"".join(server_handshake()), self.clock.t)
        self.core.receive_from_client(b"".join(hs), self.clock.t)
        self.core.receive_from_client(method(CH.Open(), 1) + method(CH.Open(), 2), self.clock.t)
        self.core.receive_from_server(method(CH.OpenOk(), 1) + method(CH.OpenOk(), 2), self.clock.t)
        self.core.data_for_server()
        self.core.data_for_client()

    def sample(self, queue: str, nbytes: int) -> None:
        self.clock.t += 1
        self.fc.sampled_management(("/orders", queue),
                                   ManagementSample(self.clock.t, nbytes // 100, 0, nbytes,
                                                    nbytes, 0), self.clock.t)
        self.board.settle()

    def trip(self, queue: str = "capped") -> None:
        self.sample(queue, 5000)
        assert ("/orders", queue) in self.fc.tripped


def pub(channel: int, queue: str, size: int = 100, tag: int = 0) -> bytes:
    return b"".join(publish(channel, bytes([tag % 256]) * size, routing_key=queue))


def test_untripped_publishes_pass_as_the_same_bytes_and_are_booked() -> None:
    s = Setup()
    data = pub(1, "capped") + pub(1, "free")
    s.core.receive_from_client(data, s.clock.t)
    assert s.core.data_for_server() == data
    q = s.fc.queues[("/orders", "capped")]
    assert q.depth.forwarded_bytes_total == 100


def test_publish_crossing_capacity_trips_and_the_next_one_is_held() -> None:
    s = Setup()
    first = b"".join(pub(1, "capped", 1000, i) for i in range(3))  # 3000 > 2000
    s.core.receive_from_client(first, s.clock.t)
    assert s.core.data_for_server() == first
    assert ("/orders", "capped") in s.fc.tripped
    s.core.receive_from_client(pub(1, "capped", 1000, 9), s.clock.t)
    assert s.core.data_for_server() == b""
    assert s.counters.held_messages == 1


def test_held_channel_keeps_order_while_other_channels_and_acks_flow() -> None:
    s = Setup()
    s.trip()
    held = pub(1, "capped", tag=1) + pub(1, "free", tag=2)  # free waits behind on ch 1
    s.core.receive_from_client(held, s.clock.t)
    assert s.core.data_for_server() == b""
    other = pub(2, "free", tag=3) + method(B.Ack(delivery_tag=5), 1)
    s.core.receive_from_client(other, s.clock.t)
    assert s.core.data_for_server() == other  # channel 2 and the ack on channel 1 pass
    commit = method(commands.Tx.Commit(), 1)
    s.core.receive_from_client(commit, s.clock.t)
    assert s.core.data_for_server() == b""  # behind the held publishes
    s.sample("capped", 0)  # drains to resume
    assert s.core.data_for_server() == held + commit
    assert s.counters.held_messages == 0 and s.counters.held_bytes == 0


def test_while_a_channel_holds_the_other_channels_stay_on_the_scan() -> None:
    """Frames on a free channel of a connection with a held channel pass in place: a chunk
    of them leaves as the very same bytes object (the per-frame path would cut it up)."""
    s = Setup()
    s.trip()
    s.core.receive_from_client(pub(1, "capped", tag=1), s.clock.t)
    assert s.core.data_for_server() == b""
    assert s.gate.slow_channels == frozenset({1})
    free = b"".join(pub(2, "free", 100, i) for i in range(20)) + HEARTBEAT
    s.core.receive_from_client(free, s.clock.t)
    assert s.core.data_for_server() is free
    ack = method(B.Ack(delivery_tag=3), 1)  # on the held channel: read, and it passes
    s.core.receive_from_client(ack + free, s.clock.t)
    assert s.core.data_for_server() == ack + free
    booked = s.fc.queues.get(("/orders", "free"))
    assert booked is None or booked.depth.forwarded_messages_total == 40
    s.sample("capped", 0)
    assert s.core.data_for_server() == pub(1, "capped", tag=1)
    assert s.gate.slow_channels == frozenset()


@pytest.mark.parametrize("chunk", [1, 2, 5, 64, None])
def test_held_and_free_channels_interleaved_are_the_same_however_the_bytes_arrive(
        chunk: int | None) -> None:
    s = Setup()
    s.trip()
    held = [pub(1, "capped", 50, i) for i in range(3)]
    free = [pub(2, "free", 50, i) for i in range(3)]
    stream = b"".join(h + f for h, f in zip(held, free, strict=True)) \
        + method(B.Qos(prefetch_count=5), 1)
    pos = 0
    while pos < len(stream):
        step = len(stream) if chunk is None else chunk
        s.core.receive_from_client(stream[pos:pos + step], s.clock.t)
        pos += step
    assert s.core.data_for_server() == b"".join(free) + method(B.Qos(prefetch_count=5), 1)
    assert s.counters.held_messages == 3
    s.sample("capped", 0)
    assert s.core.data_for_server() == b"".join(held)


@pytest.mark.parametrize("read", [3_000, 65_536])
def test_a_held_publishs_large_body_frames_are_read_by_the_gate(read: int) -> None:
    """Body frames of a held 1 MiB publish, cut by the reads, still go to the gate (held,
    then released whole), while a free channel's large bodies pass in between."""
    s = Setup()
    s.trip()
    held = pub(1, "capped", 1 << 20, 1)
    free = pub(2, "free", 300_000, 2)
    stream = held + free
    for i in range(0, len(stream), read):
        s.core.receive_from_client(stream[i:i + read], s.clock.t)
    assert s.core.data_for_server() == free
    assert s.counters.held_messages == 1
    s.sample("capped", 0)
    assert s.core.data_for_server() == held


@pytest.mark.parametrize("chunk", [1, 7, 333, None])
def test_holding_is_the_same_however_the_bytes_arrive(chunk: int | None) -> None:
    s = Setup()
    s.trip()
    stream = (pub(1, "capped", 300_000, 1) + pub(2, "free", 10, 2) + pub(1, "free", 10, 3)
              + method(B.Qos(prefetch_count=5), 1))
    rng = random.Random(chunk)
    pos = 0
    while pos < len(stream):
        step = len(stream) if chunk is None else rng.randint(1, chunk)
        s.core.receive_from_client(stream[pos:pos + step], s.clock.t)
        pos += step
    passed = s.core.data_for_server()
    assert passed == pub(2, "free", 10, 2) + method(B.Qos(prefetch_count=5), 1)
    s.sample("capped", 0)
    released = s.core.data_for_server()
    assert released == pub(1, "capped", 300_000, 1) + pub(1, "free", 10, 3)


def test_release_stops_when_a_released_publish_trips_the_queue_again() -> None:
    s = Setup()
    s.trip()
    s.core.receive_from_client(b"".join(pub(1, "capped", 800, i) for i in range(4)), s.clock.t)
    s.sample("capped", 0)  # release: 800, 1600 pass; 2400 > 2000 trips again
    out = decode_all(s.core.data_for_server())
    publishes = [f for _, f in out if isinstance(f, B.Publish)]
    assert len(publishes) == 3  # the third publish crossed capacity; the fourth waits
    assert ("/orders", "capped") in s.fc.tripped
    assert s.counters.held_messages == 1


def test_reject_nacks_in_confirm_mode_and_renumbers_the_brokers_acks() -> None:
    s = Setup(overflow="reject")
    s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    s.core.receive_from_server(method(CF.SelectOk(), 1), s.clock.t)
    s.core.data_for_server()
    s.core.data_for_client()
    s.core.receive_from_client(pub(1, "free"), s.clock.t)  # client seq 1 -> broker seq 1
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)  # client seq 2: refused by the proxy
    s.core.receive_from_client(pub(1, "free"), s.clock.t)  # client seq 3 -> broker seq 2
    sent = [f for _, f in decode_all(s.core.data_for_server()) if isinstance(f, B.Publish)]
    assert len(sent) == 2
    (nack,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(nack, B.Nack) and nack.delivery_tag == 2
    s.core.receive_from_server(method(B.Ack(delivery_tag=1), 1) +
                               method(B.Ack(delivery_tag=2), 1), s.clock.t)
    acks = [f.delivery_tag for _, f in decode_all(s.core.data_for_client())]
    assert acks == [1, 3]


def test_reject_without_confirms_closes_the_channel_with_406_naming_the_queue() -> None:
    s = Setup(overflow="reject")
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    (close_client,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(close_client, CH.Close) and close_client.reply_code == 406
    assert "capped" in close_client.reply_text
    (close_broker,) = [f for _, f in decode_all(s.core.data_for_server())]
    assert isinstance(close_broker, CH.Close)
    s.core.receive_from_client(pub(1, "free") + method(CH.CloseOk(), 1), s.clock.t)
    assert s.core.data_for_server() == b""  # dropped after our close, close-ok absorbed
    s.core.receive_from_server(method(CH.CloseOk(), 1), s.clock.t)
    assert s.core.data_for_client() == b""  # the broker's close-ok is ours


def test_deadline_nacks_in_confirm_mode() -> None:
    s = Setup(deadline="5s")
    s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    s.core.data_for_server()
    assert s.board.expire(s.clock.t + 4) == 0
    assert s.board.expire(s.clock.t + 6) == 1
    (nack,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(nack, B.Nack) and nack.delivery_tag == 1
    assert s.counters.deadline_expiries == 1 and s.counters.held_messages == 0


def test_deadline_without_confirms_closes_the_channel() -> None:
    s = Setup(deadline="5s")
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    s.board.expire(s.clock.t + 6)
    (close,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(close, CH.Close) and close.reply_code == 406
    assert "deadline" in close.reply_text


def test_java_client_is_signalled_and_its_flow_ok_absorbed() -> None:
    s = Setup(product="RabbitMQ")
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    (flow,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(flow, CH.Flow) and flow.active is False
    s.core.receive_from_client(method(CH.FlowOk(active=False), 1), s.clock.t)
    assert s.core.data_for_server() == b""
    s.sample("capped", 0)
    out = decode_all(s.core.data_for_client())
    assert [(type(f), f.active) for _, f in out] == [(CH.Flow, True)]
    s.core.receive_from_client(method(CH.FlowOk(active=True), 1), s.clock.t)
    assert decode_all(s.core.data_for_server())[-1][1].__class__ is B.Publish or True
    assert not any(isinstance(f, CH.FlowOk) for _, f in decode_all(s.core.data_for_server()))


def test_unknown_and_breaking_clients_are_never_signalled() -> None:
    s = Setup()  # product "pytest-client": unknown
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    assert s.core.data_for_client() == b""
    assert s.counters.signal_total("flow_off") == 0


def test_connection_close_waits_behind_held_publishes() -> None:
    s = Setup()
    s.trip()
    held = pub(1, "capped")
    close = method(commands.Connection.Close(200, "bye", 0, 0))
    s.core.receive_from_client(held + close, s.clock.t)
    assert s.core.data_for_server() == b""
    s.sample("capped", 0)
    assert s.core.data_for_server() == held + close


def test_a_publish_whose_header_comes_later_is_decided_then() -> None:
    s = Setup()
    s.trip()
    frames = publish(1, b"x" * 10, routing_key="free")
    s.core.receive_from_client(frames[0], s.clock.t)  # method alone
    assert s.core.data_for_server() == b""
    s.core.receive_from_client(b"".join(frames[1:]), s.clock.t)
    assert s.core.data_for_server() == b"".join(frames)  # free queue: passes, in order


def test_content_split_across_frames_of_other_channels_is_held_whole() -> None:
    s = Setup()
    s.trip()
    capped = publish(1, b"a" * 300_000, routing_key="capped")  # method, header, 3 bodies
    other = pub(2, "free")
    stream = capped[0] + capped[1] + other + b"".join(capped[2:])
    s.core.receive_from_client(stream, s.clock.t)
    assert s.core.data_for_server() == other
    s.sample("capped", 0)
    assert s.core.data_for_server() == b"".join(capped)


def test_no_body_publish_is_held_and_released() -> None:
    s = Setup()
    s.trip()
    frames = [method(B.Publish(exchange="", routing_key="capped"), 1), *content(1, b"")]
    s.core.receive_from_client(b"".join(frames), s.clock.t)
    assert s.core.data_for_server() == b""
    s.sample("capped", 0)
    assert s.core.data_for_server() == b"".join(frames)


# -- overflow: spool -----------------------------------------------------------------------

def _spool_setup(tmp_path: Path, max_bytes: str = "1MiB", fsync: str = "group"
                 ) -> tuple[Setup, SpoolManager]:
    text = _policies("spool").replace("    signal: auto\n",
                                      f"    signal: auto\n    spool: {{max_bytes: {max_bytes}, "
                                      f"fsync: {fsync}}}\n")
    manager = SpoolManager(tmp_path / "spool")
    s = Setup(overflow="spool", spool=DiskSpool(manager), policies=text)
    return s, manager


def test_spooled_publish_is_acked_once_durable_and_later_acks_renumbered(tmp_path: Path
                                                                          ) -> None:
    s, manager = _spool_setup(tmp_path)
    s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    s.core.data_for_server()
    s.trip()
    # client seq 1, 3 body frames
    s.core.receive_from_client(pub(1, "capped", 300_000, 7), s.clock.t)
    assert s.core.data_for_server() == b""  # not forwarded ...
    assert s.counters.held_messages == 0  # ... and not held: the channel keeps going
    s.core.receive_from_client(pub(1, "free"), s.clock.t)  # client seq 2 -> broker seq 1
    assert next(type(f) for _, f in decode_all(s.core.data_for_server())) is B.Publish
    assert s.core.data_for_client() == b""  # no ack before the record is durable
    s.board.spool_durable(manager.sync())
    (ack,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(ack, B.Ack) and ack.delivery_tag == 1
    s.core.receive_from_server(method(B.Ack(delivery_tag=1), 1), s.clock.t)
    (renumbered,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert renumbered.delivery_tag == 2
    (record,) = manager.spool(("/orders", "capped")).records()
    assert record.body == bytes([7]) * 300_000 and record.routing_key == "capped"


def test_backlog_keeps_fifo_after_release_until_replayed(tmp_path: Path) -> None:
    s, manager = _spool_setup(tmp_path)
    s.trip()
    s.core.receive_from_client(pub(1, "capped", tag=1), s.clock.t)
    s.sample("capped", 0)  # released, but the spool still has a record for it
    s.core.receive_from_client(pub(2, "capped", tag=2), s.clock.t)
    assert s.core.data_for_server() == b""
    manager.sync()
    assert [r.body[0] for r in manager.spool(("/orders", "capped")).records()] == [1, 2]


def test_transactional_publishes_are_held_not_spooled(tmp_path: Path) -> None:
    s, manager = _spool_setup(tmp_path)
    s.core.receive_from_client(method(commands.Tx.Select(), 1), s.clock.t)
    s.core.data_for_server()
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    assert s.counters.held_messages == 1
    assert manager.spool(("/orders", "capped")).empty


def test_a_full_spool_falls_back_to_holding(tmp_path: Path) -> None:
    s, _manager = _spool_setup(tmp_path, max_bytes="1KiB")
    s.trip()
    s.core.receive_from_client(pub(1, "capped", 600, 1) + pub(1, "capped", 600, 2), s.clock.t)
    assert s.counters.spooled_records == 1 and s.counters.spool_fallbacks == 1
    assert s.counters.held_messages == 1
    s.sample("capped", 0)
    assert decode_all(s.core.data_for_server())  # the held one leaves on release


def test_a_spool_that_does_not_accept_holds_like_the_1_0_gate() -> None:
    """Recovering at start or draining at stop, the spool takes nothing: the publish is held
    (as a 1.0 link's credit is withheld), not offered to the spool and counted a fallback."""
    spool = FakeSpool(accepting=False)
    s = Setup(overflow="spool", spool=spool)
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    assert s.core.data_for_server() == b""
    assert s.counters.held_messages == 1 and spool.records == {}
    assert s.counters.spool_fallbacks == 0 and s.counters.spooled_records == 0
    spool.accepting = True
    s.sample("capped", 0)
    assert decode_all(s.core.data_for_server())  # released as a held publish


def test_fsync_never_acks_at_once(tmp_path: Path) -> None:
    s, _ = _spool_setup(tmp_path, fsync="never")
    s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    s.trip()
    s.core.receive_from_client(pub(1, "capped"), s.clock.t)
    (ack,) = [f for _, f in decode_all(s.core.data_for_client())]
    assert isinstance(ack, B.Ack) and ack.delivery_tag == 1


def test_what_cannot_join_the_backlog_waits_behind_it(tmp_path: Path) -> None:
    s, manager = _spool_setup(tmp_path)
    s.trip()
    s.core.receive_from_client(pub(1, "capped", tag=1), s.clock.t)  # spooled
    s.fc.set_backlog(("/orders", "capped"), True)  # the spool service says so on append
    s.sample("capped", 0)  # released, but the backlog is still there
    s.core.receive_from_client(method(commands.Tx.Select(), 2), s.clock.t)
    s.core.data_for_server()
    # transactional: cannot be spooled
    s.core.receive_from_client(pub(2, "capped", tag=2), s.clock.t)
    assert s.core.data_for_server() == b""  # held: it must not overtake the backlog
    s.fc.set_backlog(("/orders", "capped"), False)  # replayed
    s.board.settle()
    assert s.core.data_for_server() == pub(2, "capped", tag=2)
    manager.sync()
    assert [r.body[0] for r in manager.spool(("/orders", "capped")).records()] == [1]


def test_frames_after_a_held_empty_publish_wait_behind_it() -> None:
    s = Setup()
    s.trip()
    held = b"".join([method(B.Publish(exchange="", routing_key="capped"), 1),
                     *content(1, b"")])  # complete as soon as it is held: no body frames
    s.core.receive_from_client(held, s.clock.t)
    commit = method(commands.Tx.Commit(), 1)
    s.core.receive_from_client(commit, s.clock.t)  # a later read: must not take the fast path
    assert s.core.data_for_server() == b""
    s.sample("capped", 0)
    assert s.core.data_for_server() == held + commit
