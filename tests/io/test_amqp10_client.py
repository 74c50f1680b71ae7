"""The proxy's own AMQP 1.0 sender (``floodwall.io.amqp10_client``).

Three layers: the pure window/credit arithmetic and frame splitting; the client against a
scripted fake broker on a local socket (small windows, drain, refusals, close and EOF, which
RabbitMQ 3.10 never shows: it grants 65535 frames of window and 65536 credits); and the
client against the real RabbitMQ 3.10 (``broker`` marker), byte-exact against proton.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pika
import proton
import pytest
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.io.amqp10_client import (
    ACCEPTED,
    MODIFIED,
    RECEIVED,
    REJECTED,
    RELEASED,
    Amqp10Client,
    Amqp10Sender,
    ReplayLinkCredit,
    SessionWindow,
    outcome_confirm,
    transfer_frames,
)
from floodwall.io.amqp_client import AmqpClientError, Confirm
from floodwall.io.upstreams import Upstreams
from floodwall.wire.amqp10.credit import MASK
from floodwall.wire.amqp10.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    HEADER_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    Frame,
    frame,
    next_frame,
)
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    FLOW,
    OPEN,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    TARGET,
    TRANSFER,
    ErrorInfo,
    decode_composite,
    encode_performative,
    performative,
)
from floodwall.wire.amqp10.types import Described, Symbol, UByte, UInt, ULong, UShort, encode
from tests.conftest import eventually, run
from tests.integration.support import (
    delete_queue,
    direct_params,
    drain_direct,
    numbered,
    unique,
)

DEADLINE = 10.0  # seconds any single expected event may take


def data_section(body: bytes) -> bytes:
    """An AMQP 1.0 message that is one data section (what a 0-9-1 consumer sees as body)."""
    return encode(Described(ULong(0x75), body))


def state(code: int) -> Described:
    return Described(ULong(code), [])


# -- pure arithmetic ------------------------------------------------------------------------
def test_session_window_counts_frames_from_begin_and_flow() -> None:
    w = SessionWindow()
    assert w.room == 0  # nothing before the broker's begin
    w.remote_begin(next_outgoing_id=7, incoming_window=3)
    assert w.room == 3 and w.remote_next_outgoing_id == 7
    for _ in range(3):
        w.sent_frame()
    assert w.room == 0
    # A flow that crossed our last transfer in flight (it saw 2 of the 3) still gives the
    # right limit: next-incoming-id + incoming-window.
    w.remote_flow(next_incoming_id=2, incoming_window=4, next_outgoing_id=7)
    assert w.room == 3
    w.remote_flow(next_incoming_id=3, incoming_window=0, next_outgoing_id=7)
    assert w.room == 0  # closed window: wait, never a negative room
    w.remote_flow(next_incoming_id=None, incoming_window=10, next_outgoing_id=7)
    assert w.room == 7  # null next-incoming-id: counts from our initial transfer-id


def test_session_window_and_delivery_ids_wrap_at_2_32() -> None:
    w = SessionWindow(initial_outgoing_id=MASK - 1, next_outgoing_id=MASK - 1,
                      next_delivery_id=MASK)
    w.remote_begin(next_outgoing_id=0, incoming_window=4)
    assert w.room == 4
    w.sent_frame()
    w.sent_frame()
    assert w.next_outgoing_id == 0 and w.room == 2
    assert [w.take_delivery_id() for _ in range(3)] == [MASK, 0, 1]
    w.remote_flow(next_incoming_id=1, incoming_window=1, next_outgoing_id=0)
    assert w.room == 2  # limit 2 (past the wrap), next id 0
    w.remote_flow(next_incoming_id=MASK, incoming_window=0, next_outgoing_id=0)
    assert w.room == 0  # a limit before the next id is no room, not a huge one


def test_link_credit_limits_wrap_and_drain() -> None:
    c = ReplayLinkCredit(initial_delivery_count=MASK - 1, delivery_count=MASK - 1)
    assert c.credit == 0  # nothing granted yet
    c.receiver_flow(delivery_count=None, link_credit=3, drain=False)  # broker not synced yet
    assert c.credit == 3
    c.sent()
    c.sent()
    assert c.delivery_count == 0 and c.credit == 1
    # A flow sent before our two transfers arrived: same limit, same credit.
    c.receiver_flow(delivery_count=MASK - 1, link_credit=3, drain=False)
    assert c.credit == 1
    assert not c.complete_drain()  # no drain asked
    c.receiver_flow(delivery_count=0, link_credit=5, drain=True)
    assert c.complete_drain()  # gives the 5 back: delivery-count to the limit
    assert c.delivery_count == 5 and c.credit == 0 and not c.drain
    assert not c.complete_drain()  # answered once
    c.receiver_flow(delivery_count=5, link_credit=0, drain=True)
    assert c.complete_drain() and c.delivery_count == 5  # nothing left: still answered


def _frames(data: list[bytes], limit: int) -> list[tuple[list[object], bytes]]:
    out: list[tuple[list[object], bytes]] = []
    for raw in data:
        assert len(raw) <= limit
        found = next_frame(raw, 0, limit, AMQP_FRAME)
        assert isinstance(found, Frame) and found.end == len(raw) and found.code == TRANSFER
        _, fields, stop = decode_composite(raw, found.body, found.end)
        out.append((fields, raw[stop:]))
    return out


@pytest.mark.parametrize("size", [0, 1, 400, 483, 484, 485, 512, 5000])
def test_transfer_frames_fit_the_max_frame_size(size: int) -> None:
    message = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frames = _frames(transfer_frames(3, 77, b"tag", 9, message, 512), 512)
    assert b"".join(payload for _, payload in frames) == message
    first = frames[0][0]
    assert first[:5] == [UInt(3), UInt(77), b"tag", UInt(9), False]
    assert [f[5] if len(f) > 5 else False for f, _ in frames] == \
        [True] * (len(frames) - 1) + [False]
    for fields, _ in frames[1:]:
        assert fields[0] == UInt(3) and fields[1] is None  # continuation: handle and more
    if len(frames) > 1:  # every frame but the last is filled to the limit
        assert all(len(raw) == 512 for raw in transfer_frames(3, 77, b"tag", 9, message,
                                                               512)[:-1])


def test_outcomes() -> None:
    assert outcome_confirm(state(ACCEPTED)) is Confirm.ACK
    for code in (REJECTED, RELEASED, MODIFIED):
        assert outcome_confirm(state(code)) is Confirm.NACK
    assert outcome_confirm(state(RECEIVED)) is None  # not an outcome yet
    assert outcome_confirm(None) is Confirm.NACK  # settled without an outcome: not proof


# -- a scripted broker on a local socket ------------------------------------------------------
class FakeBroker:
    """Just enough of a broker to script what RabbitMQ 3.10 never does: small session windows,
    little credit, drains, refusals by detach, closes with an error, a dropped socket."""

    def __init__(self, max_frame_size: int = 512, incoming_window: int = 2,
                 idle_time_out: int | None = None, sasl_code: int = 0) -> None:
        self.max_frame_size = max_frame_size
        self.incoming_window = incoming_window
        self.idle_time_out = idle_time_out
        self.sasl_code = sasl_code
        self.frames: asyncio.Queue[tuple[int, list[object], bytes]] = asyncio.Queue()
        self.heartbeats = 0
        self.client_open: list[object] = []
        self.sasl_init: list[object] = []
        self.writer: asyncio.StreamWriter | None = None
        self.eof = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.answer_close = True  # as a broker does; False: the client must not wait long

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()

    def client(self, port: int, **kwargs: Any) -> Amqp10Client:
        return Amqp10Client(Upstreams([("127.0.0.1", port)]), "guest", "guest", "/", **kwargs)

    async def _read(self, reader: asyncio.StreamReader, frame_type: int
                    ) -> tuple[int | None, list[object], bytes]:
        buf = await reader.readexactly(HEADER_SIZE)
        buf += await reader.readexactly(int.from_bytes(buf[:4], "big") - HEADER_SIZE)
        found = next_frame(buf, 0, 1 << 24, frame_type)
        assert isinstance(found, Frame)
        if found.code is None:
            return None, [], b""
        code, fields, stop = decode_composite(buf, found.body, found.end)
        return code, fields, buf[stop:found.end]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        try:
            assert await reader.readexactly(8) == SASL_HEADER
            writer.write(SASL_HEADER + frame(encode_performative(
                SASL_MECHANISMS, sasl_server_mechanisms=Symbol("PLAIN")), 0, SASL_FRAME))
            _, self.sasl_init, _ = await self._read(reader, SASL_FRAME)
            writer.write(frame(encode_performative(SASL_OUTCOME, code=UByte(self.sasl_code)),
                               0, SASL_FRAME))
            if self.sasl_code:
                return
            assert await reader.readexactly(8) == AMQP_HEADER
            writer.write(AMQP_HEADER)
            code, self.client_open, _ = await self._read(reader, AMQP_FRAME)
            assert code == OPEN
            writer.write(frame(encode_performative(
                OPEN, container_id="fake", max_frame_size=UInt(self.max_frame_size),
                idle_time_out=None if self.idle_time_out is None else UInt(self.idle_time_out))))
            code, _, _ = await self._read(reader, AMQP_FRAME)
            assert code == BEGIN
            writer.write(frame(encode_performative(
                BEGIN, remote_channel=UShort(0), next_outgoing_id=UInt(0),
                incoming_window=UInt(self.incoming_window), outgoing_window=UInt(100))))
            while True:
                code, fields, payload = await self._read(reader, AMQP_FRAME)
                if code is None:
                    self.heartbeats += 1
                    continue
                self.frames.put_nowait((code, fields, payload))
                if code == CLOSE and self.answer_close:
                    writer.write(frame(encode_performative(CLOSE)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.eof.set()
            writer.close()

    def send(self, code: int, **fields: object) -> None:
        assert self.writer is not None
        self.writer.write(frame(encode_performative(code, **fields)))

    async def expect(self, code: int) -> tuple[list[object], bytes]:
        got, fields, payload = await asyncio.wait_for(self.frames.get(), DEADLINE)
        assert got == code, f"expected performative 0x{code:02x}, got 0x{got:02x}: {fields}"
        return fields, payload

    async def attach(self, client: Amqp10Client, address: str = "q", credit: int = 0,
                     handle: int = 5) -> Amqp10Sender:
        """Open a sender and answer its attach (as broker handle ``handle``), granting
        ``credit`` with a flow when non-zero."""
        opening = asyncio.ensure_future(client.open_sender(address, DEADLINE))
        fields, _ = await self.expect(ATTACH)
        assert fields[2] is False and fields[3] == UByte(0) and fields[4] == UByte(0)
        self.send(ATTACH, name=fields[0], handle=UInt(handle), role=True,
                  snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0), source=fields[5],
                  target=fields[6])
        if credit:
            self.flow(handle, delivery_count=None, credit=credit, next_incoming_id=None,
                      window=self.incoming_window)
        return await asyncio.wait_for(opening, DEADLINE)

    def flow(self, handle: int | None, delivery_count: int | None, credit: int,
             next_incoming_id: int | None, window: int, drain: bool = False) -> None:
        self.send(FLOW, next_incoming_id=None if next_incoming_id is None
                  else UInt(next_incoming_id), incoming_window=UInt(window),
                  next_outgoing_id=UInt(0), outgoing_window=UInt(100),
                  handle=None if handle is None else UInt(handle),
                  delivery_count=None if delivery_count is None else UInt(delivery_count),
                  link_credit=UInt(credit) if handle is not None else None, drain=drain)

    def settle(self, first: int, last: int, outcome: int) -> None:
        self.send(DISPOSITION, role=True, first=UInt(first), last=UInt(last), settled=True,
                  state=state(outcome))


def fake(body: Callable[[FakeBroker], Any], **kwargs: Any) -> None:
    async def main() -> None:
        broker = FakeBroker(**kwargs)
        try:
            await body(broker)
        finally:
            await broker.stop()

    run(main)


def test_fake_window_credit_multiframe_and_disposition_ranges() -> None:
    async def body(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        assert broker.sasl_init[0] == Symbol("PLAIN") and broker.sasl_init[1] == b"\0guest\0guest"
        assert broker.client_open[1] == "vhost:/"
        sender = await broker.attach(client, credit=2)  # window 2 (from begin), credit 2
        big = bytes(range(256)) * 6  # 1536 bytes: 4 frames at max-frame-size 512
        messages = [data_section(b"a"), data_section(b"b"), data_section(b"c"), big]
        futures: list[asyncio.Future[Confirm]] = []

        async def send_all() -> None:
            for i, m in enumerate(messages):
                futures.append(await sender.send(m, message_format=i))

        sending = asyncio.ensure_future(send_all())
        for delivery_id in (0, 1):
            fields, payload = await broker.expect(TRANSFER)
            assert fields[:5] == [UInt(0), UInt(delivery_id), fields[2], UInt(delivery_id),
                                  False]
            assert payload == messages[delivery_id]
        # Window and credit used up: the client waits; it says so and has sent nothing more.
        await eventually(lambda: client.session.room == 0 and sender.credit.credit == 0
                         and not sending.done(), DEADLINE, "the client waiting")
        assert client.session.next_outgoing_id == 2 and broker.frames.empty()
        # Credit for plenty, window for 3 frames: message c (1 frame) and 2 frames of big.
        broker.flow(5, delivery_count=2, credit=5, next_incoming_id=2, window=3)
        fields, payload = await broker.expect(TRANSFER)
        assert fields[1] == UInt(2) and payload == messages[2]
        first, part1 = await broker.expect(TRANSFER)
        assert first[1] == UInt(3) and first[3] == UInt(3) and first[5] is True
        second, part2 = await broker.expect(TRANSFER)
        assert second[5] is True and second[1] is None
        await eventually(lambda: client.session.room == 0, DEADLINE, "window closed")
        assert client.session.next_outgoing_id == 5 and not sending.done()
        broker.flow(None, None, 0, next_incoming_id=5, window=10)  # a session-only flow
        third, part3 = await broker.expect(TRANSFER)
        fourth, part4 = await broker.expect(TRANSFER)
        assert third[5] is True and fourth[5] is False
        assert part1 + part2 + part3 + part4 == big
        await asyncio.wait_for(sending, DEADLINE)
        # A range, then an overlapping range (RabbitMQ 3.10 sends those), then a single one.
        broker.settle(0, 1, ACCEPTED)
        broker.settle(1, 2, ACCEPTED)
        broker.settle(3, 3, REJECTED)
        results = await asyncio.wait_for(asyncio.gather(*futures), DEADLINE)
        assert results == [Confirm.ACK, Confirm.ACK, Confirm.ACK, Confirm.NACK]
        assert (sender.sent, sender.acked, sender.nacked) == (4, 3, 1)
        await client.close()
        await broker.expect(CLOSE)
        await asyncio.wait_for(broker.eof.wait(), DEADLINE)

    fake(body)


def test_fake_drain_is_answered_when_idle() -> None:
    async def body(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        sender = await broker.attach(client, credit=1)
        fut = await sender.send(data_section(b"x"))
        await broker.expect(TRANSFER)
        broker.flow(5, delivery_count=1, credit=4, next_incoming_id=1, window=10, drain=True)
        fields, _ = await broker.expect(FLOW)
        # handle 0 is ours; delivery-count advanced to the limit, credit 0, drain echoed
        assert fields[4] == UInt(0) and fields[5] == UInt(5) and fields[6] == UInt(0)
        assert fields[8] is True and fields[2] == UInt(1)  # next-outgoing-id after 1 frame
        assert sender.credit.credit == 0
        later = asyncio.ensure_future(sender.send(data_section(b"y")))
        await eventually(lambda: sender._busy == 1, DEADLINE, "send waiting for credit")
        broker.flow(5, delivery_count=5, credit=1, next_incoming_id=1, window=10)
        fields, _ = await broker.expect(TRANSFER)
        assert fields[1] == UInt(1)
        broker.settle(0, 1, ACCEPTED)
        assert await asyncio.wait_for(fut, DEADLINE) is Confirm.ACK
        assert await asyncio.wait_for(await later, DEADLINE) is Confirm.ACK
        await client.close()

    fake(body)


def test_fake_refused_attach_and_second_sender() -> None:
    async def body(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        # RabbitMQ 4's refusal: an attach with a null target, then a detach with the error.
        opening = asyncio.ensure_future(client.open_sender("/queues/nope", DEADLINE))
        fields, _ = await broker.expect(ATTACH)
        assert fields[6] == performative(TARGET, address="/queues/nope")
        broker.send(ATTACH, name=fields[0], handle=UInt(0), role=True, target=None)
        broker.send(DETACH, handle=UInt(0), closed=True, error=ErrorInfo(
            "amqp:not-found", "no queue 'nope' in vhost '/'").to_value())
        with pytest.raises(AmqpClientError, match="amqp:not-found: no queue 'nope'"):
            await opening
        fields, _ = await broker.expect(DETACH)  # the detach is answered
        assert fields[0] == UInt(0) and fields[1] is True
        # An attach answered in full, then a detach with an error: open_sender raises if
        # the detach came before it returned, else the sender is gone with the reason.
        opening = asyncio.ensure_future(client.open_sender("/queues/gone", DEADLINE))
        fields, _ = await broker.expect(ATTACH)
        broker.send(ATTACH, name=fields[0], handle=UInt(1), role=True, target=fields[6])
        broker.send(DETACH, handle=UInt(1), closed=True, error=ErrorInfo(
            "amqp:unauthorized-access", "denied").to_value())
        await broker.expect(DETACH)
        with pytest.raises(AmqpClientError, match="unauthorized-access: denied"):
            gone = await opening
            await gone.send(b"refused")
        # The connection survived: two senders, two handles, credit per link.
        a = await broker.attach(client, "qa", credit=3, handle=7)
        b = await broker.attach(client, "qb", credit=3, handle=8)
        assert a.handle != b.handle
        fa = await a.send(data_section(b"to a"))
        fb = await b.send(data_section(b"to b"))
        ta, _ = await broker.expect(TRANSFER)
        tb, _ = await broker.expect(TRANSFER)
        assert (ta[0], ta[1], tb[0], tb[1]) == (UInt(a.handle), UInt(0), UInt(b.handle), UInt(1))
        # The broker detaches link a with an error: a's deliveries are LOST, b's are not.
        broker.send(DETACH, handle=UInt(7), closed=True,
                    error=ErrorInfo("amqp:resource-deleted", "queue deleted").to_value())
        assert await asyncio.wait_for(fa, DEADLINE) is Confirm.LOST
        await broker.expect(DETACH)
        with pytest.raises(AmqpClientError, match="resource-deleted"):
            await a.send(b"again")
        broker.settle(1, 1, ACCEPTED)
        assert await asyncio.wait_for(fb, DEADLINE) is Confirm.ACK
        closing = asyncio.ensure_future(b.close())
        fields, _ = await broker.expect(DETACH)
        assert fields[0] == UInt(b.handle) and fields[1] is True
        broker.send(DETACH, handle=UInt(8), closed=True)
        await asyncio.wait_for(closing, DEADLINE)
        assert client.connected
        await client.close()

    fake(body)


def test_fake_close_with_error_and_eof_resolve_lost() -> None:
    async def body(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        sender = await broker.attach(client, credit=10)
        futures = [await sender.send(data_section(b"%d" % i)) for i in range(2)]
        waiting = asyncio.ensure_future(sender.send(b"never"))  # window 2: this one waits
        broker.send(CLOSE, error=ErrorInfo("amqp:connection:forced", "shutdown").to_value())
        assert await asyncio.wait_for(asyncio.gather(*futures), DEADLINE) == [Confirm.LOST] * 2
        with pytest.raises(AmqpClientError, match="connection:forced: shutdown"):
            await asyncio.wait_for(waiting, DEADLINE)
        assert not client.connected
        with pytest.raises(AmqpClientError, match="forced"):
            await sender.send(b"more")
        await client.close()  # already closed: no error
        await broker.expect(TRANSFER)
        await broker.expect(TRANSFER)
        await broker.expect(CLOSE)  # the broker's close was answered

    fake(body)

    async def eof(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        sender = await broker.attach(client, credit=10)
        fut = await sender.send(data_section(b"x"))
        await broker.expect(TRANSFER)
        assert broker.writer is not None
        broker.writer.transport.abort()
        assert await asyncio.wait_for(fut, DEADLINE) is Confirm.LOST
        await eventually(lambda: not client.connected, DEADLINE, "connection lost")
        assert "EOF" in (client.closed_reason or "") or "lost" in (client.closed_reason or "")
        await client.close()

    fake(eof)


def test_fake_client_close_with_deliveries_in_flight_resolves_lost() -> None:
    async def body(broker: FakeBroker) -> None:
        broker.answer_close = False  # a broker that never answers: close waits only briefly
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        sender = await broker.attach(client, credit=10)
        settled = await sender.send(data_section(b"0"))
        in_flight = await sender.send(data_section(b"1"))
        waiting = asyncio.ensure_future(sender.send(data_section(b"2")))  # window 2: waits
        await broker.expect(TRANSFER)
        await broker.expect(TRANSFER)
        broker.settle(0, 0, ACCEPTED)
        assert await asyncio.wait_for(settled, DEADLINE) is Confirm.ACK
        await asyncio.wait_for(client.close(), DEADLINE)
        assert in_flight.result() is Confirm.LOST
        with pytest.raises(AmqpClientError):
            await waiting
        await broker.expect(CLOSE)
        assert not client.connected

    fake(body)


def test_fake_send_cancelled_mid_delivery_gives_up_the_link() -> None:
    async def body(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        sender = await broker.attach(client, credit=10)
        sending = asyncio.ensure_future(sender.send(bytes(1500)))  # 4 frames, window 2
        await broker.expect(TRANSFER)
        await broker.expect(TRANSFER)
        await eventually(lambda: client.session.room == 0, DEADLINE, "window closed")
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        fields, _ = await broker.expect(DETACH)  # half a delivery: the link is given up
        assert fields[0] == UInt(sender.handle) and fields[1] is True
        with pytest.raises(AmqpClientError, match="cancelled"):
            await sender.send(b"next")
        assert client.connected
        await client.close()

    fake(body)


def test_fake_sasl_refusal_and_heartbeats() -> None:
    async def refused(broker: FakeBroker) -> None:
        port = await broker.start()
        with pytest.raises(AmqpClientError, match=r"sasl-outcome 1 \(auth\)"):
            await broker.client(port).connect(DEADLINE)

    fake(refused, sasl_code=1)

    async def beats(broker: FakeBroker) -> None:
        port = await broker.start()
        client = broker.client(port)
        await client.connect(DEADLINE)
        assert broker.client_open[4] == UInt(60000)  # our idle-time-out, announced
        await eventually(lambda: broker.heartbeats >= 3, DEADLINE, "heartbeats")
        await client.close()

    fake(beats, idle_time_out=100)  # ms: the client beats every 50 ms


# -- the real RabbitMQ 3.10 ---------------------------------------------------------------------
@pytest.fixture
def new_queue(broker: BrokerEndpoint) -> Iterator[Callable[..., str]]:
    """``new(prefix, bind=None)``: a declared queue (bound to amq.direct with routing key
    ``bind`` when given), deleted after the test."""
    made: list[str] = []

    def new(prefix: str, bind: str | None = None) -> str:
        name = unique(prefix)
        made.append(name)
        conn = pika.BlockingConnection(direct_params(broker))
        try:
            ch = conn.channel()
            ch.queue_declare(name)
            if bind is not None:
                ch.queue_bind(name, "amq.direct", routing_key=bind)
        finally:
            conn.close()
        return name

    yield new
    for name in made:
        delete_queue(broker, name)


def client_for(broker: BrokerEndpoint, password: str | None = None) -> Amqp10Client:
    return Amqp10Client(Upstreams([(broker.host, broker.amqp_port)]), broker.username,
                        broker.password if password is None else password, "/")


def proton_url(broker: BrokerEndpoint) -> str:
    return f"amqp://{broker.username}:{broker.password}@{broker.host}:{broker.amqp_port}"


@pytest.mark.broker
@pytest.mark.timeout(180)
def test_broker_2000_mixed_messages_acked_and_in_order(broker: BrokerEndpoint,
                                                       new_queue: Callable[..., str]) -> None:
    queue = new_queue("a10c")
    sizes = [1024, 10, 8 * 1024, 200, 40 * 1024]
    bodies = [numbered(i, sizes[i % len(sizes)]) for i in range(2000)]
    bodies[700] = numbered(700, 1024 * 1024)  # far past the max-frame-size: 17 frames
    bodies[1500] = numbered(1500, 70 * 1024)  # just past it: 2 frames
    seen: dict[str, Any] = {}

    async def main() -> None:
        client = client_for(broker)
        await client.connect(DEADLINE)
        assert client.connected
        sender = await client.open_sender(f"/amq/queue/{queue}", DEADLINE)
        seen.update(open=client.broker_open, begin=client.broker_begin,
                    credit=sender.credit.credit, max_frame=client.max_frame_size)
        futures = [await sender.send(data_section(b)) for b in bodies]
        results = await asyncio.wait_for(asyncio.gather(*futures), 60)
        seen.update(results=results, frames=client.session.next_outgoing_id)
        await sender.close()
        await client.close()
        assert not client.connected

    run(main)
    print(f"RabbitMQ said: {seen['open']}, {seen['begin']}, credit {seen['credit']}, "
          f"transfer frames {seen['frames']}")
    assert seen["results"] == [Confirm.ACK] * len(bodies)
    assert seen["frames"] > len(bodies)  # the big ones went out in several frames
    got = drain_direct(broker, queue, len(bodies))
    assert len(got) == len(bodies)
    # RabbitMQ hands a 0-9-1 consumer the data section's bytes (or all sections encoded).
    out_of_place = [i for i, (want, body) in enumerate(zip(bodies, got, strict=True))
                    if want not in body]
    assert not out_of_place, f"lost, reordered or altered: {out_of_place[:10]}"


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_broker_stores_what_proton_would(broker: BrokerEndpoint,
                                         new_queue: Callable[..., str]) -> None:
    """The client sends proton's encoding byte-exact: a proton receiver cannot tell the
    message from the same one sent by a proton sender."""
    ours, theirs = new_queue("a10fid-ours"), new_queue("a10fid-proton")
    message = proton.Message(
        id="msg-1", subject="the subject", content_type="application/octet-stream",
        durable=True, priority=7, ttl=600.0, correlation_id="corr-9",
        properties={"k": "v", "n": 42, "f": 1.5}, body=b"\x00\x01payload\xff")
    encoded = message.encode()
    results: list[Confirm] = []

    async def main() -> None:
        client = client_for(broker)
        await client.connect(DEADLINE)
        sender = await client.open_sender(f"/amq/queue/{ours}", DEADLINE)
        results.append(await asyncio.wait_for(await sender.send(encoded), DEADLINE))
        await client.close()

    run(main)
    assert results == [Confirm.ACK]
    conn = BlockingConnection(proton_url(broker), timeout=15, allowed_mechs="PLAIN")
    try:
        conn.create_sender(f"/amq/queue/{theirs}").send(message)
        received = []
        for queue in (ours, theirs):
            receiver = conn.create_receiver(f"/amq/queue/{queue}", credit=1)
            received.append(receiver.receive(timeout=15))
            receiver.accept()
            receiver.link.detach()
    finally:
        conn.close()
    a, b = received
    for field in ("body", "subject", "id", "correlation_id", "content_type", "properties",
                  "durable", "priority", "ttl"):
        assert getattr(a, field) == getattr(b, field), field
        assert getattr(a, field) == getattr(message, field), field
    if broker.version >= (4, 0):
        # RabbitMQ 4 adds message annotations naming where each went (its own queue here)
        for got, queue in ((a, ours), (b, theirs)):
            assert got.annotations == {proton.symbol("x-exchange"): "",
                                       proton.symbol("x-routing-key"): queue}, got.annotations
            got.annotations = None
    assert a.encode() == b.encode()  # the broker stored the same bytes either way


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_broker_exchange_address_second_sender_and_refusals(
        broker: BrokerEndpoint, new_queue: Callable[..., str]) -> None:
    rk = unique("rk")
    routed = new_queue("a10rk", bind=rk)
    plain = new_queue("a10second")
    seen: dict[str, Any] = {}

    async def main() -> None:
        client = client_for(broker)
        await client.connect(DEADLINE)
        via_exchange = await client.open_sender(f"/exchange/amq.direct/{rk}", DEADLINE)
        second = await client.open_sender(f"/amq/queue/{plain}", DEADLINE)
        assert via_exchange.handle != second.handle and via_exchange.address.endswith(rk)
        futures = []
        for i in range(100):  # interleaved on one session
            futures.append(await via_exchange.send(data_section(numbered(i, 300))))
            futures.append(await second.send(data_section(numbered(i, 500))))
        seen["results"] = await asyncio.wait_for(asyncio.gather(*futures), 30)
        # RabbitMQ 3.10 does not check /amq/queue/NAME at attach and drops what it is sent
        # there while accepting it (RabbitMQ 4 refuses the attach): the replayer must check
        # that a queue exists before replaying to it.
        try:
            nope = await client.open_sender("/amq/queue/fw-it-surely-missing", DEADLINE)
            seen["nope"] = await asyncio.wait_for(
                await nope.send(data_section(b"dropped")), DEADLINE)
            await nope.close()
        except AmqpClientError as exc:
            seen["nope"] = str(exc)
        # A missing exchange: RabbitMQ 3.10 ends the session with amqp:not-found.
        with pytest.raises(AmqpClientError, match="not-found") as refused:
            await client.open_sender(f"/exchange/{unique('nox')}/rk", DEADLINE)
        seen["refused"] = str(refused.value)
        if not client.connected:  # 3.10: the session (our only one) is gone
            with pytest.raises(AmqpClientError):
                await second.send(b"after")
        await client.close()

    run(main)
    print(f"missing queue: {seen['nope']}; missing exchange: {seen['refused']}")
    assert seen["results"] == [Confirm.ACK] * 200
    assert seen["nope"] is Confirm.ACK or "not-found" in str(seen["nope"])
    for queue, size in ((routed, 300), (plain, 500)):
        got = drain_direct(broker, queue, 100)
        assert len(got) == 100
        assert all(numbered(i, size) in body for i, body in enumerate(got)), queue


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_broker_close_with_sends_in_flight_never_hangs(broker: BrokerEndpoint,
                                                       new_queue: Callable[..., str]) -> None:
    queue = new_queue("a10close")
    results: list[Confirm] = []

    async def main() -> None:
        client = client_for(broker)
        await client.connect(DEADLINE)
        sender = await client.open_sender(f"/amq/queue/{queue}", DEADLINE)
        futures = [await sender.send(data_section(numbered(i, 8192))) for i in range(1000)]
        await asyncio.wait_for(client.close(), DEADLINE)
        assert all(f.done() for f in futures)
        results.extend(f.result() for f in futures)
        with pytest.raises(AmqpClientError):
            await sender.send(b"late")

    run(main)
    assert set(results) <= {Confirm.ACK, Confirm.LOST}
    acked = results.count(Confirm.ACK)
    # LOST only after the last ACK: settlement is in order on one link.
    assert results[:acked] == [Confirm.ACK] * acked
    got = drain_direct(broker, queue, 1000, timeout=10)
    assert len(got) >= acked  # every ACK is really stored (LOST ones may be too)
    print(f"closed with 1000 in flight: {acked} ACK, {len(results) - acked} LOST, "
          f"{len(got)} stored")


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_broker_refuses_bad_credentials_and_vhost(broker: BrokerEndpoint) -> None:
    async def main() -> None:
        with pytest.raises(AmqpClientError, match=r"sasl-outcome 1 \(auth\)"):
            await client_for(broker, password="wrong").connect(DEADLINE)
        client = Amqp10Client(Upstreams([(broker.host, broker.amqp_port)]), broker.username,
                              broker.password, "no-such-vhost")
        with pytest.raises(AmqpClientError, match="no-such-vhost"):
            await client.connect(DEADLINE)
        assert not client.connected
        await client.close()  # never raises

    run(main)
