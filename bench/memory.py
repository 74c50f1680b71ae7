"""Memory under a flood of held publishes.

``python -m bench.memory [--producers 40] [--size 64KiB] [--seconds 10] [--args ...]``

Starts one private RabbitMQ (or uses ``FLOODWALL_TEST_BROKER``) and ``floodwall run
--policies`` with one capped queue (``overflow: hold``), trips the queue by filling it at the
broker, then starts ``--producers`` raw AMQP 0-9-1 connections through the proxy, each
publishing ``--size`` messages without confirms as fast as the proxy reads them, for
``--seconds``. The proxy's RSS is sampled every 100 ms (psutil) with its held bytes
(``/state``). Then the producers leave (their held publishes stay the proxy's to deliver),
a consumer drains the queue straight from the broker until every message the proxy held has
arrived, and the RSS is read again a few seconds after the release.

Target: with default settings (40 producers, 64 KiB) RSS stays under 200 MiB,
and memory is returned after the release.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
import psutil
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker
from floodwall.dev.devproxy import ProxyProcess

KIB = 1024
MIB = 1024 * KIB
HEADER = b"AMQP\x00\x00\x09\x01"


def parse_size(text: str) -> int:
    units = {"kib": KIB, "mib": MIB, "b": 1}
    low = text.lower()
    for suffix, mult in units.items():
        if low.endswith(suffix):
            return int(float(low[: -len(suffix)]) * mult)
    return int(low)


def _read_frame(sock: socket.socket, buf: bytearray) -> Any:
    import struct

    while True:
        if len(buf) >= 7:
            size = struct.unpack(">I", buf[3:7])[0]
            if len(buf) >= size + 8:
                _, _, value = frame.unmarshal(bytes(buf[: size + 8]))
                del buf[: size + 8]
                return value
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def raw_producer(port: int, queue: str, size: int, stop: threading.Event,
                 sent: list[int], index: int) -> None:
    """One connection, one channel, publishes without confirms until ``stop``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    buf = bytearray()
    try:
        sock.sendall(HEADER)
        _read_frame(sock, buf)  # start
        sock.sendall(frame.marshal(commands.Connection.StartOk(
            client_properties={"product": "bench.memory"}, mechanism="PLAIN",
            response="\0guest\0guest", locale="en_US"), 0))
        tune = _read_frame(sock, buf)
        sock.sendall(frame.marshal(commands.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=131072, heartbeat=0), 0))
        sock.sendall(frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
        _read_frame(sock, buf)
        sock.sendall(frame.marshal(commands.Channel.Open(), 1))
        _read_frame(sock, buf)
        body = os.urandom(size)
        one = (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
               + frame.marshal(pamqp_header.ContentHeader(0, size,
                                                          commands.Basic.Properties()), 1)
               + frame.marshal(pamqp_body.ContentBody(body), 1))
        sock.settimeout(0.2)
        view = memoryview(one)
        while not stop.is_set():
            offset = 0
            while offset < len(one) and not stop.is_set():
                try:
                    offset += sock.send(view[offset:])
                except TimeoutError:
                    continue
            if offset == len(one):
                sent[index] += 1
    finally:
        sock.close()  # the client leaves; what the proxy holds is its to deliver


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.memory")
    ap.add_argument("--producers", type=int, default=40)
    ap.add_argument("--size", type=parse_size, default=64 * KIB)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--args", default="", help="extra floodwall flags (one string)")
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-membench-"))
    local: LocalBroker | None = None
    existing = os.environ.get("FLOODWALL_TEST_BROKER")
    try:
        if existing:
            ep = BrokerEndpoint.from_env(existing)
        else:
            local = LocalBroker(workdir / "rabbit")
            ep = local.start()
        doc = run(ep, workdir, opts)
    finally:
        if local is not None:
            local.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    if opts.out is not None:
        opts.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def run(ep: BrokerEndpoint, workdir: Path, opts: argparse.Namespace) -> dict[str, Any]:
    queue = f"fw-membench-{os.getpid()}-{int(time.time())}"
    direct = pika.ConnectionParameters(ep.host, ep.amqp_port, credentials=pika.PlainCredentials(
        ep.username, ep.password))
    with pika.BlockingConnection(direct) as conn:
        conn.channel().queue_declare(queue)
    policies = workdir / "p.yaml"
    policies.write_text("version: 1\npolicies:\n"
                        f'  - {{name: bench, match: {{queue: "{queue}"}}, capacity: 1MiB, '
                        "resume: 512KiB, overflow: hold, deadline: 10m}\n")
    proxy = ProxyProcess(f"{ep.host}:{ep.amqp_port}", workdir / "floodwall.log",
                         ["--policies", str(policies), "--management", ep.management_url,
                          "--log-format", "json", *opts.args.split()])
    proxy.start()
    try:
        return measure(ep, direct, proxy, queue, opts)
    finally:
        proxy.stop()
        with contextlib.suppress(Exception), pika.BlockingConnection(direct) as conn:
            conn.channel().queue_delete(queue)


def _state(proxy: ProxyProcess) -> dict[str, Any]:
    return dict(proxy.state())


def _held(proxy: ProxyProcess) -> int:
    flow = _state(proxy).get("flow") or {}
    return int((flow.get("held") or {}).get("bytes", 0))


def _started_line(proxy: ProxyProcess) -> str:
    for line in proxy.logfile.read_text().splitlines():
        if '"started"' in line:
            return line
    return ""


def measure(ep: BrokerEndpoint, direct: pika.ConnectionParameters, proxy: ProxyProcess,
            queue: str, opts: argparse.Namespace) -> dict[str, Any]:
    assert proxy.process is not None
    proc = psutil.Process(proxy.process.pid)
    with pika.BlockingConnection(direct) as conn:  # trip it: 2 MiB over a 1 MiB capacity
        ch = conn.channel()
        for _ in range(32):
            ch.basic_publish("", queue, os.urandom(64 * KIB))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        flow = _state(proxy).get("flow") or {}
        if any(q["queue"] == queue and q["tripped"] for q in flow.get("queues", [])):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("the queue did not trip")
    rss_before = proc.memory_info().rss
    stop = threading.Event()
    sent = [0] * opts.producers
    threads = [threading.Thread(target=raw_producer, daemon=True,
                                args=(proxy.port, queue, opts.size, stop, sent, i))
               for i in range(opts.producers)]
    for t in threads:
        t.start()
    peak_rss = peak_held = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < opts.seconds:
        peak_rss = max(peak_rss, proc.memory_info().rss)
        peak_held = max(peak_held, _held(proxy))
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(10)
    time.sleep(1.0)
    held_after_leave = _held(proxy)
    rss_after_leave = proc.memory_info().rss
    metrics = proxy.get("/metrics").decode()
    budget_lines = [line for line in metrics.splitlines()
                    if line.startswith("floodwall_memory_budget")]
    # drain straight from the broker until the proxy holds nothing and the queue is empty
    drained = 0
    t_release = time.monotonic()
    with pika.BlockingConnection(direct) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        for method, _, _ in ch.consume(queue, auto_ack=True, inactivity_timeout=1.0):
            if method is not None:
                drained += 1
                continue
            if _held(proxy) == 0 and ch.queue_declare(queue, passive=True).method \
                    .message_count == 0:
                break
            if time.monotonic() - t_release > 300:
                break
        ch.cancel()
    release_seconds = time.monotonic() - t_release
    time.sleep(3.0)
    rss_released = proc.memory_info().rss
    return {
        "producers": opts.producers, "size": opts.size, "seconds": opts.seconds,
        "args": opts.args, "started": _started_line(proxy),
        "rss_before_mib": round(rss_before / MIB, 1), "rss_peak_mib": round(peak_rss / MIB, 1),
        "held_peak_mib": round(peak_held / MIB, 1),
        "held_after_clients_left_mib": round(held_after_leave / MIB, 1),
        "rss_after_clients_left_mib": round(rss_after_leave / MIB, 1),
        "rss_after_release_mib": round(rss_released / MIB, 1),
        "published_by_clients": sum(sent), "drained_messages": drained - 32,
        "release_seconds": round(release_seconds, 1), "budget_metrics": budget_lines,
    }


if __name__ == "__main__":
    raise SystemExit(main())
