"""Hostile 0-9-1 clients through a real ``floodwall run --policies`` in front of RabbitMQ 3.10:
nothing a client sends, before or after login, costs more than its budget.

- a short content header (4 bytes) after a publish, in the first packet (before any
  handshake) or after login: the client gets connection.close 501 and its connection is gone,
  both sockets closed (no descriptor left, none in CLOSE-WAIT), nothing in /state;
- a tune-ok with frame_max=0 then a body frame announcing 4 GiB, after login or pipelined
  with a wrong password before the broker has answered: refused from the frame's header, the
  proxy's RSS stays under its memory budget + 64 MiB;
- ``overflow: spool`` with a spool limit of 1 MiB: a 0-9-1 publish announcing a body of
  2**40 bytes is held (not assembled) and the proxy stops reading it at its hold budget; a 1.0
  delivery of 120 MB in continuation frames is rejected as soon as it outgrows the spool, the
  rest read and dropped; the RSS stays under the memory budget + 64 MiB throughout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.support import (
    AMQP091_HEADER,
    AMQP10_HEADER,
    AMQP10_SASL_HEADER,
    Frame10,
    Raw091,
    capped,
    encode_performative,
    flow_with,
    pika_connection,
    split_frames10,
)

pytestmark = pytest.mark.broker

MIB = 1024 * 1024
BUDGET = 64 * MIB
SHORT_HEADER = struct.pack(">BHI", 2, 1, 4) + b"\x00\x3c\x00\x00" + b"\xce"
GIB4 = struct.pack(">BHI", 3, 1, 0xFFFFFFF0)  # a body frame's header announcing 4 GiB


def publish_method(queue: str) -> bytes:
    return frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)


def pid_of(flow: Any) -> int:
    return int(flow.proc.process.pid)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def close_wait(pid: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections("tcp")
               if c.status == psutil.CONN_CLOSE_WAIT)


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def closes(frames: list[tuple[int, Any]]) -> list[commands.Connection.Close]:
    return [v for _, v in frames if isinstance(v, commands.Connection.Close)]


def live_connections(flow: Any) -> list[Any]:
    return list(flow.proc.state()["connections"])


@pytest.fixture
def guarded(broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any
            ) -> tuple[Any, str]:
    """A floodwall with a policy on a queue (its publish gate reads every publish) and a
    memory budget of ``BUDGET``."""
    q = queues("hostile")
    flow = flow_with(start_floodwall, broker, tmp_path, capped("hostile", q),
                     args=("--memory-budget", str(BUDGET)))
    return flow, q


@pytest.mark.timeout(180)
def test_short_content_headers_before_login_leave_no_descriptor_and_no_connection(
        guarded: tuple[Any, str]) -> None:
    flow, q = guarded
    pid = pid_of(flow)
    baseline = fds(pid)
    clients = []
    for _ in range(30):
        raw = Raw091.connect(flow.port)
        raw.send(AMQP091_HEADER + publish_method(q) + SHORT_HEADER)  # one packet, no login
        clients.append(raw)
    refused = []
    for raw in clients:
        got = closes(raw.frames_until_eof(timeout=30))
        raw.close()
        refused.append(got[0].reply_code if got else None)
    assert refused == [501] * 30
    wait_for(lambda: not live_connections(flow), 30, what="no connection left in /state")
    wait_for(lambda: close_wait(pid) == 0, 30, what="no socket in CLOSE-WAIT")
    # the management poller's sockets come and go: a little slack, not 60
    wait_for(lambda: fds(pid) <= baseline + 2, 30,
             what=f"descriptors back at {baseline} (now {fds(pid)})")
    assert flow.metric("floodwall_protocol_errors_total", protocol="amqp091", side="client") == 30
    assert flow.metric("floodwall_relay_internal_errors_total") == 0
    assert not flow.log("relay_internal_error")


@pytest.mark.timeout(120)
def test_a_short_content_header_after_login_is_refused_501(guarded: tuple[Any, str]) -> None:
    flow, q = guarded
    raw = Raw091.connect(flow.port)
    raw.handshake(name="short-header")
    raw.send_frame(commands.Channel.Open(), 1)
    raw.expect(commands.Channel.OpenOk)
    raw.send(publish_method(q) + SHORT_HEADER)
    got = closes(raw.frames_until_eof(timeout=30))
    raw.close()
    assert got and got[0].reply_code == 501
    assert "content header frame on channel 1" in got[0].reply_text
    assert "shorter than the 14 bytes" in got[0].reply_text
    wait_for(lambda: not live_connections(flow), 30, what="no connection left in /state")
    assert not flow.log("relay_internal_error")
    assert "Traceback" not in flow.proc.logfile.read_text()


def flood(sock: socket.socket, stop: threading.Event, sent: list[int]) -> None:
    """Send zeros (the announced frame's payload) until the proxy closes or ``stop``."""
    chunk = bytes(256 * 1024)
    sock.settimeout(1.0)
    while not stop.is_set():
        try:
            sent[0] += sock.send(chunk)
        except TimeoutError:
            continue
        except OSError:
            return


def refused_without_growing(flow: Any, raw: Raw091, opening: bytes) -> list[Any]:
    """Send ``opening`` (ending in a 4 GiB frame's header) then up to 256 MiB of its payload;
    the proxy's frames to the client until it closed, and check its RSS throughout."""
    pid = pid_of(flow)
    raw.send(opening)
    stop, sent = threading.Event(), [0]
    sender = threading.Thread(target=flood, args=(raw.sock, stop, sent), daemon=True)
    sender.start()
    peak = 0
    try:
        frames = raw.frames_until_eof(timeout=30)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and sender.is_alive():
            peak = max(peak, rss(pid))
            time.sleep(0.05)
    finally:
        stop.set()
        sender.join(10)
        raw.close()
    peak = max(peak, rss(pid))
    print(f"sent {sent[0] / MIB:.1f} MiB after the header; RSS peak {peak / MIB:.1f} MiB, "
          f"bound {(BUDGET + 64 * MIB) / MIB:.0f} MiB")
    assert peak < BUDGET + 64 * MIB
    return frames


@pytest.mark.timeout(120)
def test_tune_ok_frame_max_0_then_a_4_gib_frame_is_refused_from_its_header(
        guarded: tuple[Any, str]) -> None:
    flow, _ = guarded
    raw = Raw091.connect(flow.port)
    raw.send(AMQP091_HEADER)
    raw.expect(commands.Connection.Start)
    raw.send_frame(commands.Connection.StartOk(
        client_properties={"product": "hostile"}, mechanism="PLAIN",
        response="\0guest\0guest", locale="en_US"))
    tune = raw.expect(commands.Connection.Tune)
    assert tune.frame_max == 131072
    opening = b"".join((
        frame.marshal(commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=0,
                                                 heartbeat=0), 0),
        frame.marshal(commands.Connection.Open(virtual_host="/"), 0),
        frame.marshal(commands.Channel.Open(), 1),
        GIB4))
    got = closes(refused_without_growing(flow, raw, opening))
    assert got and got[0].reply_code == 501
    assert "exceeds frame_max 131072" in got[0].reply_text
    wait_for(lambda: not live_connections(flow), 30, what="no connection left in /state")


@pytest.mark.timeout(120)
def test_a_pipelined_wrong_password_and_a_4_gib_frame_is_refused_from_its_header(
        guarded: tuple[Any, str]) -> None:
    """Everything in one go, before the broker has said a word: header, start-ok with a
    wrong password, tune-ok frame_max=0, open, then the 4 GiB frame."""
    flow, _ = guarded
    raw = Raw091.connect(flow.port)
    opening = b"".join((
        AMQP091_HEADER,
        frame.marshal(commands.Connection.StartOk(
            client_properties={"product": "hostile"}, mechanism="PLAIN",
            response="\0guest\0not-the-password", locale="en_US"), 0),
        frame.marshal(commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0), 0),
        frame.marshal(commands.Connection.Open(virtual_host="/"), 0),
        GIB4))
    got = closes(refused_without_growing(flow, raw, opening))
    assert got and got[0].reply_code == 501
    assert "exceeds frame_max 4096" in got[0].reply_text
    wait_for(lambda: not live_connections(flow), 30, what="no connection left in /state")


@pytest.mark.timeout(120)
def test_a_tune_ok_above_the_brokers_frame_max_is_refused_530(guarded: tuple[Any, str]) -> None:
    flow, _ = guarded
    raw = Raw091.connect(flow.port)
    raw.send(AMQP091_HEADER)
    raw.expect(commands.Connection.Start)
    raw.send_frame(commands.Connection.StartOk(
        client_properties={"product": "hostile"}, mechanism="PLAIN",
        response="\0guest\0guest", locale="en_US"))
    tune = raw.expect(commands.Connection.Tune)
    raw.send_frame(commands.Connection.TuneOk(channel_max=tune.channel_max,
                                              frame_max=tune.frame_max * 4, heartbeat=0))
    with contextlib.closing(raw.sock):
        got = closes(raw.frames_until_eof(timeout=30))
    assert got and got[0].reply_code == 530
    assert got[0].reply_text == (f"NOT_ALLOWED - connection.tune-ok frame_max "
                                 f"{tune.frame_max * 4} is above the broker's frame_max "
                                 f"{tune.frame_max}")


# -- overflow: spool captures ---------------------------------------------------------------

def spooling_policy(queue: str) -> str:
    """Capacity 32 KiB, ``overflow: spool`` with a spool limit of 1 MiB for the queue."""
    return (f'{{name: sp, match: {{queue: "{queue}"}}, capacity: 32KiB, resume: 16KiB, '
            f"overflow: spool, deadline: 10m, spool: {{max_bytes: 1MiB, fsync: group}}}}")


@pytest.fixture
def tripped_spool(broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any
                  ) -> tuple[Any, str]:
    """A floodwall with a spool, in front of a spooling queue that is tripped (64 KiB of
    ready messages at the broker)."""
    q = queues("hostile-spool")
    with pika_connection(broker.amqp_port) as conn:  # straight to the broker
        ch = conn.channel()
        ch.queue_declare(q)
        for _ in range(64):
            ch.basic_publish("", q, b"t" * 1024)
    flow = flow_with(start_floodwall, broker, tmp_path, spooling_policy(q),
                     args=("--spool-dir", str(tmp_path / "spool"), "--memory-budget",
                           str(BUDGET), "--depth-interval", "50ms",
                           "--management-interval", "1s"))
    wait_for(lambda: flow.tripped(q), 30, what=f"{q} tripped")
    return flow, q


def stream_until_stalled(sock: socket.socket, frames: Any, pid: int, most: int
                         ) -> tuple[int, int]:
    """Send ``frames`` (an iterator of bytes) until ``most`` bytes went, the proxy stopped
    reading (nothing went for 3 s) or closed; (bytes sent, peak RSS of the proxy)."""
    sent = peak = 0
    sock.settimeout(0.2)
    idle_since = time.monotonic()
    pending = b""
    while sent < most:
        if not pending:
            pending = next(frames, b"")
            if not pending:
                break
        try:
            n = sock.send(pending)
        except TimeoutError:
            n = 0
        except OSError:
            break
        pending = pending[n:]
        sent += n
        now = time.monotonic()
        if n:
            idle_since = now
        elif now - idle_since > 3:
            break
        if sent // (4 * MIB) != (sent - n) // (4 * MIB) or not n:
            peak = max(peak, rss(pid))
    return sent, max(peak, rss(pid))


@pytest.mark.timeout(180)
def test_a_2_to_the_40_publish_to_a_tripped_spooling_queue_is_held_and_bounded(
        tripped_spool: tuple[Any, str]) -> None:
    flow, q = tripped_spool
    pid = pid_of(flow)
    raw = Raw091.connect(flow.port)
    raw.handshake(name="huge-spool")
    raw.send_frame(commands.Channel.Open(), 1)
    raw.expect(commands.Channel.OpenOk)
    raw.send_frame(commands.Confirm.Select(), 1)
    raw.expect(commands.Confirm.SelectOk)
    raw.send(publish_method(q) + frame.marshal(
        pamqp_header.ContentHeader(0, 1 << 40, commands.Basic.Properties()), 1))
    wait_for(lambda: flow.log("spool_refused"), 30, what="the spool refused it")
    (line,) = flow.log("spool_refused")
    assert f"queue={q}" in line and "action=held" in line and "is at its limit" in line
    body = frame.marshal(pamqp_body.ContentBody(bytes(raw.frame_max - 8)), 1)
    sent, peak = stream_until_stalled(raw.sock, iter(lambda: body, b""), pid, 512 * MIB)
    held = flow.held()
    print(f"sent {sent / MIB:.1f} MiB of its body; held {held}; RSS peak {peak / MIB:.1f} MiB")
    assert sent < 64 * MIB  # the proxy stopped reading it at its hold budget
    assert held["messages"] == 1 and held["bytes"] <= 8 * MIB + 2 * raw.frame_max + 256 * 1024
    assert peak < BUDGET + 64 * MIB
    assert spool_records(flow, q) == 0
    raw.close()


def spool_records(flow: Any, queue: str) -> int:
    return int(flow.metric("floodwall_spool_records", queue=queue))


def perf(code: int, fields: list[Any], channel: int = 0, frame_type: int = 0,
         payload: bytes = b"") -> bytes:
    """One 1.0 frame: a performative and, for a transfer, its payload."""
    head = encode_performative(code, fields, channel, frame_type)
    size = len(head) + len(payload)
    return struct.pack(">I", size) + head[4:] + payload


class Raw10:
    """A hand-driven AMQP 1.0 sender over SASL PLAIN, to send what no client library would."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.buf = b""
        self.frames: list[Frame10] = []

    def read_until(self, performative: str, timeout: float = 15) -> Frame10:
        deadline = time.monotonic() + timeout
        while True:
            for n, f in enumerate(self.frames):
                if f.performative == performative:
                    del self.frames[:n + 1]
                    return f
            assert time.monotonic() < deadline, f"no {performative}: {self.frames}"
            chunk = self.sock.recv(65536)
            assert chunk, f"closed before {performative}: {self.frames}"
            self.buf += chunk
            headers, frames = split_frames10(self.buf)
            self.frames += frames
            used = 8 * len(headers) + sum(0 for _ in frames)
            self.buf = self.buf[self._consumed(used):]

    def _consumed(self, start: int) -> int:
        pos = start
        while pos + 8 <= len(self.buf):
            size = struct.unpack(">I", self.buf[pos:pos + 4])[0]
            if self.buf[pos:pos + 4] == b"AMQP":
                pos += 8
                continue
            if pos + size > len(self.buf):
                break
            pos += size
        return pos

    def attach_sender(self, address: str) -> int:
        """Log in (SASL PLAIN guest), open, begin, attach a sender to ``address``; the
        credit the broker granted."""
        import proton

        self.sock.sendall(AMQP10_SASL_HEADER)
        self.read_until("sasl-mechanisms")
        self.sock.sendall(perf(0x41, [proton.symbol("PLAIN"), b"\0guest\0guest"],
                               frame_type=1))
        self.read_until("sasl-outcome")
        self.sock.sendall(AMQP10_HEADER + perf(0x10, ["hostile", "vhost:/"])
                          + perf(0x11, [None, proton.uint(0), proton.uint(5000),
                                        proton.uint(5000)])
                          + perf(0x12, ["big", proton.uint(0), False, None, None,
                                        proton.Described(proton.ulong(0x28), [None]),
                                        proton.Described(proton.ulong(0x29), [address]),
                                        None, False, proton.uint(0)]))
        self.read_until("attach")
        flow10 = self.read_until("flow")
        return int(flow10.fields[6])

    def big_delivery(self, size: int, part: int) -> Iterator[bytes]:
        """One delivery of ``size`` payload bytes in transfer frames of ``part``."""
        import proton

        yield perf(0x14, [proton.uint(0), proton.uint(0), b"t0", proton.uint(0), None,
                          True], payload=bytes(part))
        sent = part
        while sent < size:
            n = min(part, size - sent)
            sent += n
            yield perf(0x14, [proton.uint(0), None, None, None, None, sent < size],
                       payload=bytes(n))


@pytest.mark.timeout(180)
def test_a_1_0_capture_of_120_mb_for_a_1_mib_spool_is_rejected_and_bounded(
        tripped_spool: tuple[Any, str]) -> None:
    flow, q = tripped_spool
    pid = pid_of(flow)
    raw = Raw10(flow.port)
    assert raw.attach_sender(f"/amq/queue/{q}") > 0
    sent, peak = stream_until_stalled(raw.sock, raw.big_delivery(120_000_000, 64 * 1024), pid,
                                      130 * MIB)
    print(f"sent {sent / MIB:.1f} MiB; RSS peak {peak / MIB:.1f} MiB")
    assert sent >= 120_000_000  # the rest of the delivery is read and dropped as it comes
    disposition = raw.read_until("disposition")
    state = disposition.fields[4]
    assert int(state.descriptor) == 0x25  # rejected
    error = state.value[0]
    assert str(error.value[0]) == "amqp:resource-limit-exceeded"
    assert f"cannot be spooled for queue '{q}'" in str(error.value[1])
    assert peak < BUDGET + 64 * MIB
    assert flow.held()["bytes"] == 0 and spool_records(flow, q) == 0
    (line,) = flow.log("spool_refused")
    assert "is at its limit (1048576 bytes)" in line
    raw.sock.close()


@pytest.mark.timeout(120)
def test_an_incomplete_frame_counts_against_the_memory_budget(guarded: tuple[Any, str]
                                                              ) -> None:
    flow, q = guarded
    raw = Raw091.connect(flow.port)
    raw.handshake(name="partial")
    raw.send_frame(commands.Channel.Open(), 1)
    raw.expect(commands.Channel.OpenOk)
    body = frame.marshal(pamqp_body.ContentBody(b"p" * 100_000), 1)
    raw.send(publish_method(q) + frame.marshal(
        pamqp_header.ContentHeader(0, 100_000, commands.Basic.Properties()), 1) + body[:90_000])

    def partial() -> int:
        return int(flow.proc.state()["memory_budget"]["partial_frame_bytes"])

    wait_for(lambda: partial() == 90_000, 30, what="90,000 bytes of a frame counted")
    raw.send(body[90_000:])
    wait_for(lambda: partial() == 0, 30, what="the frame complete, nothing counted")
    raw.send(body[:50_000])
    wait_for(lambda: partial() == 50_000, 30, what="50,000 bytes counted")
    raw.close()  # the client leaves mid-frame: the count goes with it
    wait_for(lambda: partial() == 0 and not live_connections(flow), 30,
             what="the connection gone and its count with it")
