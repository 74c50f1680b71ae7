"""Many connections through one sidecar: memory per idle connection, how long a new client
waits with thousands open, and the handshake at a steady rate of new connections; direct,
floodwall, an earlier checkout (``--base DIR``) and the byte pump side by side, on one
private broker.

``python -m bench.connections [--connections 10000] [--rate 1000] [--rate-seconds 5]
[--base DIR]``

For each target in turn (direct, floodwall, base, pump; ``--rounds`` times, in rotating
order), once the broker is idle again:
1. *served at 0*: a new client's time to ``connection.open-ok`` with nothing else open, for
   ``--probe-seconds``: pika (``BlockingConnection``, heartbeat 60 s) and the raw client
   below, alternated, one every ``--probe-interval``;
2. a *holder* child process opens ``--connections`` idle 0-9-1 connections (the raw
   handshake, heartbeat 60 s negotiated, channel 1 open) and sends each a heartbeat frame
   every 30 s (staggered, as clients do) while it holds them;
3. the relay's RSS with them open, less its RSS before: memory per connection;
4. *served at N*: the same probes as 1 for ``--hold-seconds`` (longer than one heartbeat
   period, so every connection's heartbeats pass during it), and the relay's CPU meanwhile;
5. the holder aborts them all; RSS after.
Then the *rate* runs, alternated for 3 x ``--rounds``: a new raw connection every ``1 /
rate`` seconds for ``--rate-seconds`` (header, start-ok, tune-ok + open, open-ok timed; then
connection.close), with nothing else open: the handshake time, what the relay adds to the
direct one, and the relay's CPU per connection. At ``--rate`` through a handshake
responder (a child answering with pre-encoded frames: the broker's part costs nothing, so
what a relay adds shows where RabbitMQ could not take the rate), and at ``--broker-rate``
against the broker itself.

The raw client is pre-encoded frames and a frame walker (no pamqp on its path), so that
10,000 connections cost the bench little. File descriptors: the relay holds two per
connection (the client's and its upstream), so N connections need ``2N + FD_RESERVE`` of
its ``RLIMIT_NOFILE``; the bench raises its own soft limit to the hard one (children inherit
it) and caps N with a note when the hard limit is too low (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psutil
from pamqp import commands
from pamqp import frame as pframe

from bench.meters import cpu_seconds, median, percentile, rss_bytes
from floodwall.dev.devbroker import LocalBroker, free_port
from floodwall.dev.devproxy import ProxyProcess, child_env

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("direct", "floodwall", "base", "pump")  # base: another checkout (--base DIR)
FD_RESERVE = 64  # descriptors a relay needs besides two per connection
HEARTBEAT = 60  # seconds, negotiated by every client here

HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
_HEAD = struct.Struct(">BHI")
_CM = struct.Struct(">HH")
_TUNE = struct.Struct(">HIH")
START, TUNE, OPEN_OK, CLOSE, CLOSE_OK = (10, 10), (10, 30), (10, 41), (10, 50), (10, 51)
CHANNEL_OPEN_OK, CHANNEL_CLOSE = (20, 11), (20, 40)


def _encode(value: Any, channel: int) -> bytes:
    return bytes(pframe.marshal(value, channel))


START_OK = _encode(commands.Connection.StartOk(
    client_properties={"product": "floodwall-bench-connections",
                       "capabilities": {"heartbeats": True}},
    mechanism="PLAIN", response="\x00guest\x00guest"), 0)
OPEN = _encode(commands.Connection.Open(virtual_host="/"), 0)
CHANNEL_OPEN = _encode(commands.Channel.Open(), 1)
CLOSE_FRAME = _encode(commands.Connection.Close(reply_code=200, reply_text="bench",
                                                class_id=0, method_id=0), 0)


def tune_ok(payload: memoryview, heartbeat: int) -> bytes:
    """Tune-ok for a tune's arguments: the broker's channel_max and frame_max, our heartbeat
    (the lower of the two, 0 meaning none)."""
    channel_max, frame_max, offered = _TUNE.unpack_from(payload, 4)
    beat = min(heartbeat, offered) if offered and heartbeat else heartbeat or offered
    args = _CM.pack(10, 31) + _TUNE.pack(channel_max, frame_max, beat)
    return _HEAD.pack(1, 0, len(args)) + args + b"\xce"


class RawConnection(asyncio.Protocol):
    """One 0-9-1 client doing its own handshake; ``done`` resolves at open-ok (or, with
    ``open_channel``, at channel.open-ok); ``opened_at`` is the perf_counter then."""

    __slots__ = ("_buf", "closing", "done", "heartbeat", "open_channel", "opened_at",
                 "transport")

    def __init__(self, done: asyncio.Future[None], heartbeat: int = HEARTBEAT,
                 open_channel: bool = False) -> None:
        self.done = done
        self.heartbeat = heartbeat
        self.open_channel = open_channel
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self.opened_at = 0.0
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(HEADER)

    def data_received(self, data: bytes) -> None:
        if self.done.done() and not self.closing:
            return  # heartbeats from the broker: nothing to do
        buf = self._buf + data if self._buf else data
        pos, size = 0, len(buf)
        view = memoryview(buf)
        while size - pos >= 8:
            ftype, _channel, length = _HEAD.unpack_from(buf, pos)
            end = pos + 7 + length
            if end >= size:
                break
            if ftype == 1:
                self._method(_CM.unpack_from(buf, pos + 7), view[pos + 7:end])
            pos = end + 1
        self._buf = bytes(buf[pos:])

    def _method(self, cm: tuple[int, int], payload: memoryview) -> None:
        t = self.transport
        assert t is not None
        if cm == START:
            t.write(START_OK)
        elif cm == TUNE:
            t.write(tune_ok(payload, self.heartbeat) + OPEN)
        elif cm == OPEN_OK:
            self.opened_at = time.perf_counter()
            if self.open_channel:
                t.write(CHANNEL_OPEN)
            elif not self.done.done():
                self.done.set_result(None)
        elif cm == CHANNEL_OPEN_OK and not self.done.done():
            self.done.set_result(None)
        elif cm == CLOSE_OK:
            t.abort()
        elif cm in (CLOSE, CHANNEL_CLOSE) and not self.done.done():
            self.done.set_exception(ConnectionError(f"closed by the peer: {bytes(payload)!r}"))
            t.abort()

    def close_cleanly(self) -> None:
        """connection.close; the socket is aborted at close-ok (or when the peer closes)."""
        if self.transport is not None and not self.transport.is_closing():
            self.closing = True
            self.transport.write(CLOSE_FRAME)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("connection closed"))


async def open_raw(host: str, port: int, heartbeat: int = HEARTBEAT,
                   open_channel: bool = False, timeout: float = 30.0
                   ) -> tuple[RawConnection, float]:
    """A handshaken raw connection, and seconds from connect() to open-ok."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    t0 = time.perf_counter()
    _, conn = await asyncio.wait_for(loop.create_connection(
        lambda: RawConnection(done, heartbeat, open_channel), host, port), timeout)
    try:
        await asyncio.wait_for(done, timeout)
    except BaseException:
        if conn.transport is not None:
            conn.transport.abort()
        raise
    return conn, conn.opened_at - t0


# -- the holder: a child process holding N idle connections -----------------------------------
async def hold(host: str, port: int, n: int, concurrency: int) -> None:
    """Open ``n`` connections, say so on stdout (one JSON line), send heartbeats until stdin
    closes or says ``close``, then abort them all."""
    conns: list[RawConnection] = []
    failures: list[str] = []
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def one() -> None:
        async with sem:
            try:
                conn, _ = await open_raw(host, port, open_channel=True, timeout=60)
                conns.append(conn)
            except (OSError, TimeoutError, ConnectionError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps({"open": len(conns), "failures": len(failures),
                      "first_failure": failures[0] if failures else None,
                      "seconds": time.perf_counter() - t0}), flush=True)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        loop.call_soon_threadsafe(_settle, stop)

    reader = loop.run_in_executor(None, read_stdin)
    period = HEARTBEAT // 2  # clients beat at half the timeout, as RabbitMQ does
    tick = 0
    while not stop.done():
        await asyncio.wait([stop], timeout=1.0)
        for conn in conns[tick % period::period]:
            if conn.transport is not None and not conn.transport.is_closing():
                conn.transport.write(HEARTBEAT_FRAME)
        tick += 1
    for conn in conns:
        if conn.transport is not None:
            conn.transport.abort()
    await asyncio.sleep(0.2)
    await reader
    print(json.dumps({"closed": len(conns)}), flush=True)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Holder:
    """``python -m bench.connections --hold`` as a child: its own process and fds."""

    def __init__(self, host: str, port: int, n: int, concurrency: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.connections", "--hold", f"{host}:{port}",
             "--connections", str(n), "--concurrency", str(concurrency)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO,
            env=child_env({}, REPO), text=True)

    async def opened(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            raise RuntimeError(f"holder exited with {self.proc.wait()}")
        doc: dict[str, Any] = json.loads(line)
        return doc

    async def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write("close\n")
            self.proc.stdin.close()
        await asyncio.to_thread(self.proc.stdout.read)
        await asyncio.to_thread(self.proc.wait, 60)


# -- the handshake responder: the broker's side of a handshake, pre-encoded ----------------------
SERVER_START = _encode(commands.Connection.Start(
    server_properties={"product": "floodwall-bench-responder", "capabilities": {}},
    mechanisms="PLAIN", locales="en_US"), 0)
SERVER_TUNE = _encode(commands.Connection.Tune(channel_max=2047, frame_max=131072,
                                               heartbeat=HEARTBEAT), 0)
OPEN_OK_FRAME = _encode(commands.Connection.OpenOk(), 0)
CLOSE_OK_FRAME = _encode(commands.Connection.CloseOk(), 0)
CHANNEL_OPEN_OK_FRAME = _encode(commands.Channel.OpenOk(), 1)
_ANSWERS = {(10, 11): SERVER_TUNE, (10, 40): OPEN_OK_FRAME, (20, 10): CHANNEL_OPEN_OK_FRAME}


class Responder(asyncio.Protocol):
    """Answers a 0-9-1 client's handshake at once (start, tune, open-ok, channel.open-ok,
    close-ok), so that what a relay adds to a handshake at 1,000 a second can be measured
    on a machine whose broker cannot take that many (RabbitMQ needs about a millisecond of
    CPU per connection): the relay's part of a handshake is the same whatever answers."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._header = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        t = self.transport
        assert t is not None
        buf = self._buf + data
        pos = 0
        if not self._header:
            if len(buf) < 8:
                self._buf = buf
                return
            if buf[:8] != HEADER:
                t.write(HEADER)
                t.close()
                return
            self._header, pos = True, 8
            t.write(SERVER_START)
        size = len(buf)
        while size - pos >= 8:
            ftype, _channel, length = _HEAD.unpack_from(buf, pos)
            end = pos + 7 + length
            if end >= size:
                break
            if ftype == 1:
                cm = _CM.unpack_from(buf, pos + 7)
                if cm == CLOSE:
                    t.write(CLOSE_OK_FRAME)
                    t.close()
                    return
                answer = _ANSWERS.get(cm)
                if answer is not None:
                    t.write(answer)
            pos = end + 1
        self._buf = buf[pos:]


async def respond(port: int) -> None:
    """Serve handshakes on ``port`` until killed."""
    server = await asyncio.get_running_loop().create_server(Responder, "127.0.0.1", port,
                                                            backlog=4096)
    print("listening", flush=True)
    await server.serve_forever()


# -- probes -------------------------------------------------------------------------------------
def pika_served(host: str, port: int) -> float:
    """Seconds a pika BlockingConnection (heartbeat 60 s) takes to open; then closed."""
    import pika

    params = pika.ConnectionParameters(host=host, port=port, heartbeat=HEARTBEAT,
                                       connection_attempts=1, socket_timeout=30,
                                       blocked_connection_timeout=None)
    t0 = time.perf_counter()
    conn = pika.BlockingConnection(params)
    took = time.perf_counter() - t0
    conn.close()
    return took


async def raw_served(host: str, port: int) -> float:
    conn, took = await open_raw(host, port)
    conn.close_cleanly()
    return took


async def probe_for(host: str, port: int, seconds: float, interval: float
                    ) -> dict[str, list[float]]:
    """pika and raw probes, alternated, one every ``interval`` for ``seconds``."""
    out: dict[str, list[float]] = {"pika_ms": [], "raw_ms": [], "errors": []}
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        t = time.perf_counter()
        try:
            if i % 2:
                out["raw_ms"].append(await raw_served(host, port) * 1000)
            else:
                out["pika_ms"].append(await asyncio.to_thread(pika_served, host, port) * 1000)
        except Exception as exc:  # counted and shown; the run goes on
            out["errors"].append(f"{type(exc).__name__}: {exc}")  # type: ignore[arg-type]
        i += 1
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t)))
    return out


def summary(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"n": len(s), "p50": percentile(s, 50), "p90": percentile(s, 90),
            "p99": percentile(s, 99), "max": s[-1] if s else math.nan}


@dataclass
class Target:
    name: str
    host: str
    port: int
    process: psutil.Process | None  # the relay; None for direct


@dataclass
class Options:
    connections: int = 10_000
    concurrency: int = 50
    rounds: int = 1
    hold_seconds: float = 40.0
    probe_seconds: float = 8.0
    probe_interval: float = 0.25
    rate: int = 1000
    broker_rate: int = 200
    rate_seconds: float = 5.0
    targets: tuple[str, ...] = TARGETS
    base: Path | None = None  # a checkout of an earlier floodwall, for "base"


async def settle(broker: psutil.Process | None, cores: float = 0.15,
                 limit: float = 120.0) -> float:
    """Wait until the broker is idle again (it takes a while to close thousands of
    connections), at most ``limit`` seconds; returns the seconds waited."""
    t0 = time.perf_counter()
    if broker is None:
        return 0.0
    while time.perf_counter() - t0 < limit:
        c0 = cpu_seconds(broker)
        await asyncio.sleep(1.0)
        if cpu_seconds(broker) - c0 < cores:
            break
    return time.perf_counter() - t0


async def idle_round(t: Target, broker: psutil.Process | None, opts: Options,
                     progress: Callable[[str], None]) -> dict[str, Any]:
    res: dict[str, Any] = {"target": t.name, "settle_s": await settle(broker)}
    res["served_at_0"] = await probe_for(t.host, t.port, opts.probe_seconds, opts.probe_interval)
    await asyncio.sleep(1.0)
    proc = t.process
    before = rss_bytes(proc) if proc else 0
    broker_before = rss_bytes(broker) if broker else 0
    holder = Holder(t.host, t.port, opts.connections, opts.concurrency)
    try:
        res["holder"] = opened = await holder.opened()
        progress(f"   {t.name}: {opened['open']} open in {opened['seconds']:.1f}s"
                 + (f", {opened['failures']} failed ({opened['first_failure']})"
                    if opened["failures"] else ""))
        await asyncio.sleep(2.0)
        during = rss_bytes(proc) if proc else 0
        res["broker_rss_per_connection"] = ((rss_bytes(broker) - broker_before) / opened["open"]
                                            if broker and opened["open"] else math.nan)
        c0, w0 = cpu_seconds(proc), time.perf_counter()
        res["served_at_n"] = await probe_for(t.host, t.port, opts.hold_seconds,
                                             opts.probe_interval)
        res["relay_cores_while_held"] = (cpu_seconds(proc) - c0) / (time.perf_counter() - w0)
        if proc is not None:
            res["rss_before"], res["rss_during"] = before, during
            res["bytes_per_connection"] = ((during - before) / opened["open"]
                                           if opened["open"] else math.nan)
    finally:
        await holder.close()
    await asyncio.sleep(2.0)
    if proc is not None:
        res["rss_after_close"] = rss_bytes(proc)
    return res


async def rate_round(t: Target, rate: int, seconds: float) -> dict[str, Any]:
    """A new connection every 1/rate s for ``seconds``: handshake times, then close."""
    loop = asyncio.get_running_loop()
    count = int(rate * seconds)
    times: list[float] = []
    errors: list[str] = []
    late: list[float] = []

    async def one(at: float) -> None:
        late.append(time.perf_counter() - at)
        try:
            conn, took = await open_raw(t.host, t.port, timeout=30)
            times.append(took * 1000)
            conn.close_cleanly()
        except (OSError, TimeoutError, ConnectionError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    c0 = cpu_seconds(t.process)
    start = time.perf_counter() + 0.05
    tasks: set[asyncio.Task[None]] = set()
    for i in range(count):
        at = start + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    wall = time.perf_counter() - start
    await asyncio.gather(*list(tasks))
    cpu = cpu_seconds(t.process) - c0
    late.sort()
    return {"target": t.name, "rate": rate, "attempted": count, "opened": len(times),
            "errors": len(errors),
            "first_error": errors[0] if errors else None, "achieved_rate": count / wall,
            "handshake_ms": summary(times), "start_late_ms_p99": percentile(late, 99) * 1000,
            "relay_cpu_us_per_connection": cpu / count * 1e6 if t.process else math.nan}


# -- the run --------------------------------------------------------------------------------------
def raise_fd_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def start_floodwall(name: str, upstream: str, workdir: Path, root: Path,
                    proxies: list[ProxyProcess], extra: list[str], ready: bool = True
                    ) -> Target:
    fw = ProxyProcess(upstream=upstream, logfile=workdir / f"{name}.log",
                      extra_args=["--event-loop", "auto", *extra], root=root)
    proxies.append(fw)
    fw.start(wait_ready=ready)
    assert fw.process is not None
    return Target(name, "127.0.0.1", fw.port, psutil.Process(fw.process.pid))


def start_responders(opts: Options, workdir: Path, children: list[subprocess.Popen[bytes]],
                     proxies: list[ProxyProcess]) -> dict[str, Target]:
    """The handshake responder, and a floodwall and a pump in front of it."""
    from bench.relay import wait_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.connections", "--respond",
                             str(port)], cwd=REPO, env=child_env({}, REPO),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    children.append(proc)
    wait_port("127.0.0.1", port, proc)
    out = {"responder": Target("responder", "127.0.0.1", port, None)}
    upstream = f"127.0.0.1:{port}"
    for name, root in (("floodwall", REPO), ("base", opts.base)):
        if name in opts.targets and root is not None:
            out[f"{name}>responder"] = start_floodwall(f"{name}>responder", upstream, workdir,
                                                       root, proxies, [], ready=False)
    if "pump" in opts.targets:
        pump, pport = start_pump(upstream, workdir, "pump-responder.log")
        children.append(pump)
        out["pump>responder"] = Target("pump>responder", "127.0.0.1", pport,
                                       psutil.Process(pump.pid))
    return out


def start_pump(upstream: str, workdir: Path, log_name: str = "pump.log"
               ) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    with open(workdir / log_name, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.pump", "--listen",
                                 f"127.0.0.1:{port}", "--upstream", upstream], cwd=REPO,
                                env=child_env({}, REPO), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
    from bench.relay import wait_port
    wait_port("127.0.0.1", port, proc)
    return proc, port


async def run(opts: Options, targets: dict[str, Target], responders: dict[str, Target],
              broker: psutil.Process | None, progress: Callable[[str], None]
              ) -> dict[str, Any]:
    names = [n for n in TARGETS if n in targets]
    idle: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    for r in range(opts.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            progress(f"== idle round {r + 1}/{opts.rounds}: {name}, load {os.getloadavg()[0]:.2f}")
            res = await idle_round(targets[name], broker, opts, progress)
            res["round"], res["load_before"] = r, os.getloadavg()[0]
            idle.append(res)
            progress("   " + one_line_idle(res))
    for group, rate in ((responders, opts.rate), (targets, opts.broker_rate)):
        gnames = list(group)
        for r in range(opts.rounds * 3):
            for name in gnames[r % len(gnames):] + gnames[:r % len(gnames)]:
                res = await rate_round(group[name], rate, opts.rate_seconds)
                res["round"], res["load"] = r, os.getloadavg()[0]
                rates.append(res)
                h = res["handshake_ms"]
                progress(f"== rate round {r + 1}: {name:<9} {res['achieved_rate']:.0f}/s, "
                         f"handshake p50 {h['p50']:.3f} p90 {h['p90']:.3f} p99 {h['p99']:.3f} "
                         f"ms, {res['errors']} errors, relay "
                         f"{res['relay_cpu_us_per_connection']:.0f} us/conn, "
                         f"load {res['load']:.2f}")
                await asyncio.sleep(1.0)
    return {"idle": idle, "rate": rates}


def one_line_idle(res: dict[str, Any]) -> str:
    z, n = res["served_at_0"], res["served_at_n"]
    mem = f"settled {res['settle_s']:.0f}s, "
    if "bytes_per_connection" in res:
        mem += f"{res['bytes_per_connection'] / 1024:.2f} KiB/conn, "
    if z["errors"]:
        mem += f"{len(z['errors'])} probe errors at 0 ({z['errors'][0]}), "
    return (f"{res['target']}: {mem}served pika p50 {median(z['pika_ms']):.1f} -> "
            f"{median(n['pika_ms']):.1f} ms (max {max(n['pika_ms'], default=math.nan):.1f}), "
            f"raw {median(z['raw_ms']):.2f} -> {median(n['raw_ms']):.2f} ms "
            f"(max {max(n['raw_ms'], default=math.nan):.2f}), "
            f"relay {res['relay_cores_while_held']:.3f} cores while held, "
            f"{len(n['errors'])} probe errors")


def report(doc: dict[str, Any]) -> None:
    print(f"\n{doc['connections']} idle connections (heartbeat {HEARTBEAT} s), "
          f"nofile {doc['nofile']}, {doc['machine']}")
    print("  target      KiB/conn  served@0 pika/raw ms  served@N p50/p99/max pika ms  "
          "raw p50/p99/max ms  relay cores")
    for res in doc["results"]["idle"]:
        z, n = res["served_at_0"], res["served_at_n"]
        p, rw = summary(n["pika_ms"]), summary(n["raw_ms"])
        kib = res.get("bytes_per_connection", math.nan) / 1024
        print(f"  {res['target']:<10}{kib:>9.2f}  {median(z['pika_ms']):>8.1f} / "
              f"{median(z['raw_ms']):<6.2f}      {p['p50']:>6.1f} {p['p99']:>6.1f} "
              f"{p['max']:>6.1f}            {rw['p50']:.2f} {rw['p99']:.2f} {rw['max']:.2f}"
              f"      {res['relay_cores_while_held']:.3f}")
    print(f"\nrate: a new connection every 1/rate s for {doc['rate_seconds']:g} s "
          "(handshake = connect() to open-ok), medians of rounds; + = over the reference")
    by: dict[str, list[dict[str, Any]]] = {}
    for res in doc["results"]["rate"]:
        by.setdefault(res["target"], []).append(res)
    for name, runs in by.items():
        ref = by["responder" if name.endswith("responder") else "direct"]
        direct = median([r["handshake_ms"]["p50"] for r in ref])
        direct99 = median([r["handshake_ms"]["p99"] for r in ref])
        p50 = median([r["handshake_ms"]["p50"] for r in runs])
        p99 = median([r["handshake_ms"]["p99"] for r in runs])
        print(f"  {name:<20} {runs[0]['rate']:>5}/s p50 {p50:.3f} ms (+{p50 - direct:.3f})  "
              f"p99 {p99:.3f} ms "
              f"(+{p99 - direct99:.3f})  errors {sum(r['errors'] for r in runs)}  relay "
              f"{median([r['relay_cpu_us_per_connection'] for r in runs]):.0f} us CPU/conn  "
              f"rate {median([r['achieved_rate'] for r in runs]):.0f}/s")


def parse_args(argv: list[str] | None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.connections", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=50,
                   help="handshakes the holder runs at once while opening")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--hold-seconds", type=float, default=40.0)
    p.add_argument("--probe-seconds", type=float, default=8.0)
    p.add_argument("--probe-interval", type=float, default=0.25)
    p.add_argument("--rate", type=int, default=1000,
                   help="new connections a second through the handshake responder")
    p.add_argument("--broker-rate", type=int, default=200,
                   help="new connections a second to the real broker")
    p.add_argument("--rate-seconds", type=float, default=5.0)
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--base", type=Path, default=None,
                   help="a checkout of an earlier floodwall, run as the target \"base\"")
    p.add_argument("--floodwall-args", default="", help="more arguments for `floodwall run`")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--hold", default=None, help=argparse.SUPPRESS)  # the holder child
    p.add_argument("--respond", type=int, default=None, help=argparse.SUPPRESS)  # responder
    a = p.parse_args(argv)
    targets = tuple(t for t in a.targets.split(",") if t)
    if "direct" not in targets:
        targets = ("direct", *targets)
    return Options(connections=a.connections, concurrency=a.concurrency, rounds=a.rounds,
                   hold_seconds=a.hold_seconds, probe_seconds=a.probe_seconds,
                   probe_interval=a.probe_interval, rate=a.rate, broker_rate=a.broker_rate,
                   rate_seconds=a.rate_seconds,
                   targets=targets, base=a.base), a


def _uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    opts, args = parse_args(argv)
    soft, hard = raise_fd_limit()
    _uvloop()
    if args.hold:
        host, _, port = args.hold.rpartition(":")
        asyncio.run(hold(host, int(port), opts.connections, opts.concurrency))
        return 0
    if args.respond:
        asyncio.run(respond(args.respond))
        return 0
    t_start = time.monotonic()
    # SIGTERM stops the run as Ctrl-C does: the broker and the relays are stopped (finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    notes: list[str] = []
    most = (soft - FD_RESERVE) // 2
    if opts.connections > most:
        notes.append(f"{opts.connections} connections need RLIMIT_NOFILE >= "
                     f"{2 * opts.connections + FD_RESERVE} in the relay (two per connection "
                     f"+ {FD_RESERVE}); the hard limit here is {hard}: measured {most}")
        progress("NOTE " + notes[-1])
        opts.connections = most
    started = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "bench" / "out" / f"connections-{started:%Y%m%d-%H%M%S}.json"
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-conns-"))
    broker = LocalBroker(workdir / "rabbit", config_extra=f"prometheus.tcp.port = {free_port()}\n")
    pump: subprocess.Popen[bytes] | None = None
    children: list[subprocess.Popen[bytes]] = []
    proxies: list[ProxyProcess] = []
    try:
        progress(f"starting RabbitMQ in {workdir}")
        ep = broker.start()
        from bench.relay import beam_of
        beam = beam_of(broker)
        upstream = f"{ep.host}:{ep.amqp_port}"
        targets = {"direct": Target("direct", ep.host, ep.amqp_port, None)}
        for name, root in (("floodwall", REPO), ("base", opts.base)):
            if name in opts.targets and root is not None:
                targets[name] = start_floodwall(name, upstream, workdir, root, proxies,
                                                args.floodwall_args.split())
        if "pump" in opts.targets:
            pump, pport = start_pump(upstream, workdir)
            targets["pump"] = Target("pump", "127.0.0.1", pport, psutil.Process(pump.pid))
        responders = start_responders(opts, workdir, children, proxies)
        progress(f"targets: {', '.join(f'{k}:{v.port}' for k, v in targets.items())}; "
                 f"nofile {soft}/{hard}; load {os.getloadavg()}")
        results = asyncio.run(run(opts, targets, responders, beam, progress))
    finally:
        for p in proxies:
            p.stop()
        for c in children:
            c.terminate()
            c.wait(10)
        if pump is not None:
            pump.terminate()
            pump.wait(10)
        broker.stop()
        broker.remove()
    doc = {"started": started.isoformat(), "connections": opts.connections,
           "rate": opts.rate, "rate_seconds": opts.rate_seconds, "nofile": [soft, hard],
           "notes": notes,
           "options": vars(opts) | {"targets": list(opts.targets), "base": str(opts.base)},
           "machine": f"{platform.node()} {os.cpu_count()} cpus, Python "
                      f"{platform.python_version()}",
           "load_after": os.getloadavg(), "elapsed_s": time.monotonic() - t_start,
           "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    report(doc)
    for note in notes:
        print("note:", note)
    print(f"raw figures: {out}; elapsed {doc['elapsed_s']:.0f} s; load after "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
