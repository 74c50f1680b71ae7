"""Helpers for the integration tests: unique names, payloads, raw AMQP sockets, the broker API."""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
from pamqp import commands, frame
from pamqp.heartbeat import Heartbeat

from floodwall.dev.devbroker import BrokerEndpoint

AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"
AMQP10_SASL_HEADER = b"AMQP\x03\x01\x00\x00"


def unique(prefix: str) -> str:
    """A queue/exchange/connection name no other test (or run) uses."""
    return f"fw-it-{prefix}-{uuid.uuid4().hex[:10]}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ from message to message (not all zeros, not compressible)."""
    block = hashlib.sha256(f"{seed}".encode()).digest()
    out = bytearray()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def pika_params(port: int, **kwargs: Any) -> pika.ConnectionParameters:
    kwargs.setdefault("connection_attempts", 1)
    kwargs.setdefault("socket_timeout", 10)
    kwargs.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters("127.0.0.1", port, **kwargs)


@contextlib.contextmanager
def pika_connection(port: int, **kwargs: Any) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika_params(port, **kwargs))
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@contextlib.contextmanager
def temp_queue(port: int, name: str | None = None, **declare: Any) -> Iterator[str]:
    """Declare a uniquely named queue (through ``port``) and delete it afterwards."""
    queue = name or unique("q")
    with pika_connection(port) as conn:
        conn.channel().queue_declare(queue, **declare)
    def delete() -> None:
        with pika_connection(port) as conn:
            conn.channel().queue_delete(queue)

    try:
        yield queue
    except BaseException:
        with contextlib.suppress(Exception):  # keep the test's own failure in front
            delete()
        raise
    delete()


def log_lines(logfile: Path, event: str) -> list[str]:
    text = logfile.read_text(errors="replace") if logfile.exists() else ""
    return [line for line in text.splitlines() if f"event={event} " in line + " "]


def http_status(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; the status and body, also for 4xx/5xx answers."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- the broker's management API ---------------------------------------------------------
def broker_connections(broker: BrokerEndpoint) -> list[dict[str, Any]]:
    doc = broker.api("GET", "/api/connections")
    assert isinstance(doc, list)
    return doc


def broker_connection_named(broker: BrokerEndpoint, name: str) -> dict[str, Any] | None:
    """The broker's record of the connection whose client called itself ``name``."""
    for conn in broker_connections(broker):
        props = conn.get("client_properties") or {}
        if conn.get("user_provided_name") == name or props.get("connection_name") == name:
            return conn
    return None


def delete_queue(broker: BrokerEndpoint, name: str) -> None:
    import urllib.parse

    try:
        broker.api("DELETE", "/api/queues/%2F/" + urllib.parse.quote(name, safe=""))
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


# -- raw AMQP 0-9-1 over a socket --------------------------------------------------------
class PeerClosed(Exception):
    """The other end closed the socket."""


@dataclass
class Raw091:
    """A hand-driven AMQP 0-9-1 client socket, to send what no client library would."""

    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    frame_max: int = 131072

    @classmethod
    def connect(cls, port: int, timeout: float = 10.0) -> Raw091:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    @property
    def local_address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, value: Any, channel: int = 0) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise PeerClosed
        self.buf += chunk

    def read_frame(self) -> tuple[int, Any]:
        """The next whole frame as (channel, pamqp value)."""
        while True:
            if len(self.buf) >= 7:
                size = struct.unpack(">I", self.buf[3:7])[0]
                if len(self.buf) >= size + 8:
                    consumed, channel, value = frame.unmarshal(bytes(self.buf[: size + 8]))
                    del self.buf[:consumed]
                    return channel, value
            self._fill()

    def expect(self, kind: type) -> Any:
        """Read frames (skipping heartbeats) until one of ``kind``; fail on anything else."""
        while True:
            _, value = self.read_frame()
            if isinstance(value, Heartbeat):
                continue
            assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
            return value

    def handshake(self, name: str = "raw", frame_max: int = 131072, heartbeat: int = 0,
                  open_connection: bool = True, vhost: str = "/") -> None:
        """Header, Start/StartOk, Tune/TuneOk and (unless told not to) Open/OpenOk."""
        self.send(AMQP091_HEADER)
        self.expect(commands.Connection.Start)
        self.send_frame(commands.Connection.StartOk(
            client_properties={"connection_name": name, "product": "floodwall-it"},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = min(frame_max, tune.frame_max) if tune.frame_max else frame_max
        self.send_frame(commands.Connection.TuneOk(channel_max=tune.channel_max,
                                                   frame_max=self.frame_max,
                                                   heartbeat=heartbeat))
        if open_connection:
            self.send_frame(commands.Connection.Open(virtual_host=vhost))
            self.expect(commands.Connection.OpenOk)

    def close_cleanly(self) -> None:
        self.send_frame(commands.Connection.Close(reply_code=200, reply_text="bye",
                                                         class_id=0, method_id=0))
        self.expect(commands.Connection.CloseOk)
        self.sock.close()

    def frames_until_eof(self, timeout: float = 10.0) -> list[tuple[int, Any]]:
        """Every frame the peer still sends, until it closes the socket (or the deadline)."""
        deadline = time.monotonic() + timeout
        got: list[tuple[int, Any]] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"socket still open after {timeout}s; frames so far: {got}")
            self.sock.settimeout(remaining)
            try:
                got.append(self.read_frame())
            except (PeerClosed, ConnectionResetError):
                return got

    def close(self) -> None:
        self.sock.close()


def read_until_eof(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the peer sends until it closes; TimeoutError if it does not by the deadline."""
    deadline = time.monotonic() + timeout
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"socket still open after {timeout}s; got {bytes(data)!r}")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


# -- raw AMQP 1.0 frames -----------------------------------------------------------------
PERFORMATIVES = {0x10: "open", 0x11: "begin", 0x12: "attach", 0x13: "flow", 0x14: "transfer",
                 0x15: "disposition", 0x16: "detach", 0x17: "end", 0x18: "close",
                 0x40: "sasl-mechanisms", 0x41: "sasl-init", 0x42: "sasl-challenge",
                 0x43: "sasl-response", 0x44: "sasl-outcome"}


@dataclass
class Frame10:
    type: int
    channel: int
    performative: str | None
    fields: list[Any]


def encode_performative(code: int, fields: list[Any], channel: int = 0, frame_type: int = 0
                        ) -> bytes:
    """One AMQP 1.0 frame whose body is the described list ``code`` of ``fields``."""
    import proton

    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(code), fields))
    body = data.encode()
    return struct.pack(">IBBH", 8 + len(body), 2, frame_type, channel) + body


def split_frames10(data: bytes) -> tuple[list[bytes], list[Frame10]]:
    """Protocol headers and decoded frames from a captured 1.0 byte stream."""
    import proton

    headers: list[bytes] = []
    frames: list[Frame10] = []
    pos = 0
    while pos + 8 <= len(data):
        if data[pos:pos + 4] == b"AMQP":
            headers.append(data[pos:pos + 8])
            pos += 8
            continue
        size, doff, ftype, channel = struct.unpack(">IBBH", data[pos:pos + 8])
        if size < 8 or pos + size > len(data):
            break
        body = data[pos + doff * 4: pos + size]
        name, fields = None, []
        if body:
            d = proton.Data()
            d.decode(body)
            d.rewind()
            d.next()
            value = d.get_object()
            if isinstance(value, proton.Described):
                name = PERFORMATIVES.get(int(value.descriptor), hex(int(value.descriptor)))
                fields = list(value.value or [])
        frames.append(Frame10(ftype, channel, name, fields))
        pos += size
    return headers, frames


def amqp10_login(sock: socket.socket, broker: BrokerEndpoint) -> None:
    """SASL PLAIN as ``broker``'s user on a fresh 1.0 ``sock``, up to the outcome, where the
    broker wants it: RabbitMQ 4 takes AMQP 1.0 only after SASL (it answers a bare AMQP header
    with its SASL header and closes); 3.10's plugin takes a bare header, so nothing is sent."""
    import proton

    if broker.version < (4, 0):
        return
    sock.sendall(AMQP10_SASL_HEADER)
    got = b""

    def until(name: str) -> None:
        nonlocal got
        while name not in [f.performative for f in split_frames10(got)[1]]:
            chunk = sock.recv(65536)
            assert chunk, f"closed during SASL after {split_frames10(got)}"
            got += chunk

    until("sasl-mechanisms")
    sock.sendall(encode_performative(0x41, [
        proton.symbol("PLAIN"), f"\0{broker.username}\0{broker.password}".encode()],
        frame_type=1))
    until("sasl-outcome")
    outcome = next(f for f in split_frames10(got)[1] if f.performative == "sasl-outcome")
    assert outcome.fields[0] == 0, f"SASL PLAIN refused: {outcome.fields}"


def close_condition(frames: list[Frame10]) -> str | None:
    """The error condition of the first ``close`` performative, if any."""
    import proton

    for f in frames:
        if f.performative == "close":
            if not f.fields or f.fields[0] is None:
                return ""
            err = f.fields[0]
            if isinstance(err, proton.Described):
                return str(err.value[0])
            return str(err)
    return None


_PEER_RE = re.compile(r"\bpeer=(\S+)")


def lines_naming(lines: list[str], peer: str) -> list[str]:
    return [line for line in lines if (m := _PEER_RE.search(line)) and m.group(1) == peer]


# -- flow control: a floodwall with policies, metrics, the broker's side of a queue ------
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` in a Prometheus text page: (labels, value)."""
    found = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        mname, _, lab = key.partition("{")
        if mname == name:
            found.append((dict(_LABEL_RE.findall(lab)), float(value)))
    return found


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 when none)."""
    return sum(v for lab, v in metric_samples(text, name)
               if all(lab.get(k) == want for k, want in labels.items()))


def policy_file(path: Path, *policies: str, extra: str = "") -> Path:
    """A version 1 policies file: each of ``policies`` is one policy's YAML flow mapping."""
    lines = ["version: 1", extra, "policies:"] + [f"  - {p}" for p in policies]
    path.write_text("\n".join(lines) + "\n")
    return path


def capped(name: str, queue: str, capacity: str = "64KiB", resume: str = "32KiB",
           **fields: str) -> str:
    """One policy entry (flow-mapping YAML) capping ``queue`` (an exact name or a glob)."""
    more = "".join(f", {k}: {v}" for k, v in fields.items())
    return (f'{{name: {name}, match: {{queue: "{queue}"}}, capacity: {capacity}, '
            f"resume: {resume}{more}}}")


def direct_params(broker: BrokerEndpoint, **kwargs: Any) -> pika.ConnectionParameters:
    """pika parameters for the broker itself (not through the proxy)."""
    kwargs.setdefault("connection_attempts", 1)
    kwargs.setdefault("socket_timeout", 10)
    return pika.ConnectionParameters(
        broker.host, broker.amqp_port,
        credentials=pika.PlainCredentials(broker.username, broker.password), **kwargs)


def numbered(seq: int, size: int = 1024) -> bytes:
    """A body that starts with its sequence number (10 digits), padded to ``size`` bytes,
    like the foreign clients' bodies (tests/clients)."""
    return f"{seq:010d}".encode().ljust(size, b"x")


def seq_of(body: bytes) -> int:
    return int(body[:10])


def broker_queue(broker: BrokerEndpoint, queue: str) -> dict[str, Any]:
    """The management API's record of ``queue`` in vhost /."""
    import urllib.parse

    doc = broker.api("GET", "/api/queues/%2F/" + urllib.parse.quote(queue, safe=""))
    assert isinstance(doc, dict)
    return doc


def drain_direct(broker: BrokerEndpoint, queue: str, count: int, timeout: float = 60.0
                 ) -> list[bytes]:
    """Consume (auto-ack) from the broker itself until ``count`` messages came from ``queue``
    or ``timeout`` passed; the bodies, in order. Fewer than ``count`` means the deadline."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    conn = pika.BlockingConnection(direct_params(broker))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        for method, _, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.2):
            if method is not None:
                got.append(body)
            if len(got) >= count or time.monotonic() > deadline:
                break
        ch.cancel()
    finally:
        if conn.is_open:
            conn.close()
    return got


def ready_count(broker: BrokerEndpoint, queue: str) -> int:
    """Messages ready in ``queue`` right now (a passive declare on the broker itself)."""
    conn = pika.BlockingConnection(direct_params(broker))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        if conn.is_open:
            conn.close()


@dataclass
class FlowProxy:
    """A ``floodwall run --policies FILE --management URL`` and what the tests ask of it."""

    proc: Any  # floodwall.dev.devproxy.ProxyProcess
    policies: Path

    @property
    def port(self) -> int:
        return int(self.proc.port)

    def metrics(self) -> str:
        return str(self.proc.get("/metrics").decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        return metric_sum(self.metrics(), name, **labels)

    def queue_state(self, queue: str) -> dict[str, Any] | None:
        flow = self.proc.state().get("flow") or {}
        for q in flow.get("queues", []):
            if q["queue"] == queue and q["vhost"] == "/":
                return dict(q)
        return None

    def tripped(self, queue: str) -> bool:
        q = self.queue_state(queue)
        return bool(q and q["tripped"])

    def policed(self, queue: str) -> bool:
        """Policed, with a depth estimate (the first sample is in)."""
        q = self.queue_state(queue)
        return bool(q and q["depth"]["estimate"] is not None)

    def held(self) -> dict[str, int]:
        flow = self.proc.state().get("flow") or {}
        return dict(flow.get("held") or {"bytes": 0, "messages": 0})

    def blocked_channels(self) -> list[dict[str, Any]]:
        flow = self.proc.state().get("flow") or {}
        return list(flow.get("blocked_channels") or [])

    def log(self, event: str) -> list[str]:
        return log_lines(self.proc.logfile, event)


def start_flow(start_floodwall: Any, broker: BrokerEndpoint, policies: Path, *args: str,
               management: str | None = None, upstream: str | None = None,
               env: dict[str, str] | None = None) -> FlowProxy:
    """``floodwall run --policies POLICIES --management URL ARGS`` (the conftest factory)."""
    url = management or f"http://{broker.host}:{broker.management_port}"
    proc = start_floodwall("--policies", str(policies), "--management", url, *args,
                           upstream=upstream, env=env)
    return FlowProxy(proc, policies)



def flow_with(start_floodwall: Any, broker: BrokerEndpoint, tmp_path: Path, *policies: str,
              args: tuple[str, ...] = ()) -> FlowProxy:
    """``start_flow`` with a policies file ``tmp_path/p.yaml`` holding ``policies``."""
    return start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml", *policies),
                      *args)

class DepthWatch(threading.Thread):
    """Broker-side depth of one queue: passive declare every 50 ms, management bytes and the
    proxy's view (``sample_proxy``; here its tripped gauge) every 250 ms."""

    def __init__(self, broker: BrokerEndpoint, flow: FlowProxy, queue: str) -> None:
        super().__init__(daemon=True, name=f"watch-{queue}")
        self.broker, self.flow, self.queue = broker, flow, queue
        self.max_ready = 0
        self.max_message_bytes = 0
        self.tripped_seen = False
        self.samples = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def sample_proxy(self) -> None:
        if self.flow.tripped(self.queue):
            self.tripped_seen = True

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.broker))
            ch = conn.channel()
            next_slow = 0.0
            while not self.done.is_set():
                n = ch.queue_declare(self.queue, passive=True).method.message_count
                self.max_ready = max(self.max_ready, n)
                self.samples += 1
                if time.monotonic() >= next_slow:
                    q = broker_queue(self.broker, self.queue)
                    self.max_message_bytes = max(self.max_message_bytes,
                                                 int(q.get("message_bytes") or 0))
                    self.sample_proxy()
                    next_slow = time.monotonic() + 0.25
                self.done.wait(0.05)
            conn.close()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.done.set()
        self.join(10)
        if self.error is not None:
            raise AssertionError(f"depth watch failed: {self.error!r}") from self.error


def from_prometheus(flow: FlowProxy, queue: str, at_least: int) -> bool:
    """Whether ``/state`` says ``queue``'s broker figures come from a Prometheus endpoint,
    with at least ``at_least`` bytes ready."""
    q = flow.queue_state(queue)
    return q is not None and q["depth"]["source"] == "prometheus" \
        and q["depth"]["broker"] is not None and q["depth"]["broker"]["bytes"] >= at_least
