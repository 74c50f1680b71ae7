"""Hostile 0-9-1 clients through a real ``floodwall run --policies`` in front of RabbitMQ 3.10:
nothing a client sends, before or after login, costs more than its budget.

- a short content header (4 bytes) after a publish, in the first packet (before any
  handshake) or after login: the client gets connection.close 501 and its connection is gone,
  both sockets closed (no descriptor left, none in CLOSE-WAIT), nothing in /state;
- a tune-ok with frame_max=0 then a body frame announcing 4 GiB, after login or pipelined
  with a wrong password before the broker has answered: refused from the frame's header, the
  proxy's RSS stays under its memory budget + 64 MiB.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from pamqp import commands, frame

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.support import (
    AMQP091_HEADER,
    Raw091,
    capped,
    flow_with,
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
