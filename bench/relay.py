"""The relay benchmark: direct vs floodwall vs a plain byte pump vs HAProxy, same broker,
same client.

``python -m bench.relay [--seconds N] [--rounds R] [--size 1024] [--out FILE.json]``

Starts one private RabbitMQ node, one ``floodwall run``, one ``bench.pump`` child and
Debian's HAProxy in TCP mode (one thread unless ``--haproxy-threads``), then for each
scenario alternates the targets (direct, floodwall, pump, haproxy, direct, ...) for R
rounds, so that noise on a small shared machine falls on all of them alike, and reports
medians. See bench/README.md for what each scenario measures.
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
import shutil
import socket
import ssl as ssl_module
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import amqp091
from bench.meters import CpuMeter, cpu_seconds, median, percentile, rss_bytes
from bench.report import print_releases, print_report
from floodwall.dev.devbroker import (
    RELEASE_NAMES,
    BrokerEndpoint,
    BrokerTls,
    LocalBroker,
    free_port,
    release_named,
)
from floodwall.dev.devproxy import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("direct", "floodwall", "pump", "haproxy")
RELAYS = TARGETS[1:]  # what stands between the client and the broker
FIREHOSE_QUEUE = "bench.firehose"
DRAIN_QUEUE = "bench.drain"
FIREHOSE10_QUEUE = "bench.firehose10"
# An exchange address: RabbitMQ's 1.0 plugin re-declares a /queue/NAME target without
# arguments, which a queue with x-max-length refuses.
FIREHOSE10_ADDRESS = f"/exchange/amq.direct/{FIREHOSE10_QUEUE}"
BATCH = 64  # messages per write() in the firehose (1 KiB bodies; fewer when larger)


def batch_of(size: int) -> int:
    """Messages per write(): 64 KiB of bodies or more, at least one message."""
    return max(1, BATCH * 1024 // max(size, 1024))


@dataclass
class Target:
    """Where a client connects, and the relay process in between (None for direct)."""

    name: str
    host: str
    port: int
    process: psutil.Process | None = None
    broken: str | None = None  # why this target is skipped
    ssl: ssl_module.SSLContext | None = None  # the client speaks TLS to it (direct, --tls)


@dataclass
class Options:
    seconds: float = 3.0
    warmup: float = 0.5
    rounds: int = 5
    size: int = 1024
    drain_messages: int = 50_000
    prefetch: int = 1000
    ack_every: int = 250
    latency_rate: int = 5000
    idle_connections: int = 500
    max_length: int = 20_000
    quiet_cores: float = 0.3  # wait before a run while other processes use more than this
    quiet_max_wait: float = 2.0  # ... but no longer than this per run
    quiet_budget: float = 20.0  # ... nor than this over the whole benchmark
    scenarios: tuple[str, ...] = ("idle", "firehose", "drain", "latency", "firehose10")
    targets: tuple[str, ...] = TARGETS


@dataclass
class Rig:
    """The broker, the relays and the meters, for the scenarios to use."""

    endpoint: BrokerEndpoint
    targets: dict[str, Target]
    cpu: CpuMeter
    opts: Options
    control: amqp091.Amqp091Client | None = None
    notes: list[str] = field(default_factory=list)

    quiet_waited: float = 0.0

    async def wait_quiet(self) -> dict[str, float]:
        """Wait (bounded) until processes that are not ours leave the CPUs mostly idle.

        This machine is shared; a test suite starting next to us takes a core. Waiting
        for a lull before each run, and alternating targets, spreads what is left of the
        noise evenly; ``other_cpu_s`` in each result says how much there was anyway.
        """
        opts = self.opts
        relays = [t.process for t in self.targets.values() if t.process is not None]
        waited, step = 0.0, 0.25
        while True:
            a = self.cpu.snapshot(None)
            r0 = sum(cpu_seconds(p) for p in relays)
            await asyncio.sleep(step)
            b = self.cpu.snapshot(None)
            r1 = sum(cpu_seconds(p) for p in relays)
            d = self.cpu.delta(a, b)
            other = (d["other_cpu_s"] - (r1 - r0)) / d["wall_s"]
            if (other <= opts.quiet_cores or waited >= opts.quiet_max_wait
                    or self.quiet_waited >= opts.quiet_budget):
                return {"quiet_wait_s": waited, "other_cores_before": max(0.0, other)}
            waited += step
            self.quiet_waited += step


# -- scenario: 0-9-1 firehose publisher -----------------------------------------------------
async def firehose091(rig: Rig, target: Target) -> dict[str, Any]:
    """Pre-encoded publishes as fast as the socket takes them; count broker confirms."""
    opts = rig.opts
    assert rig.control is not None
    await rig.control.purge(FIREHOSE_QUEUE)
    per_write = batch_of(opts.size)
    batch = amqp091.publish_frames(FIREHOSE_QUEUE, b"\xab" * opts.size) * per_write
    client = await amqp091.connect(target.host, target.port, ssl=target.ssl)
    await client.confirm_select()
    sent = 0
    stop = False

    async def writer() -> None:
        nonlocal sent
        while not stop and not client.lost.done():
            client.write(batch)
            sent += per_write
            if client.paused:
                await client.writable()
            else:
                await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(writer())
    try:
        await asyncio.sleep(opts.warmup)
        c0, s0 = client.confirmed, rig.cpu.snapshot(target.process)
        await asyncio.sleep(opts.seconds)
        c1, s1 = client.confirmed, rig.cpu.snapshot(target.process)
        stop = True
        await task
        # Let what is in flight through every buffer be confirmed before the next run.
        await _settle(lambda: client.confirmed >= sent or client.lost.done(), 15.0)
    finally:
        stop = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    lost = client.lost.done()
    await client.close()
    cpu = rig.cpu.delta(s0, s1)
    msgs = c1 - c0
    return {"msgs": msgs, "msgs_per_s": msgs / cpu["wall_s"], "sent": sent,
            "confirmed": client.confirmed, "nacked": client.nacked,
            "connection_lost": lost, **cpu, **_per_msg(cpu, msgs)}


async def _settle(done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _per_msg(cpu: dict[str, float], msgs: int) -> dict[str, float]:
    if msgs <= 0:
        return {}
    return {"relay_cpu_us_per_msg": cpu["relay_cpu_s"] / msgs * 1e6,
            "relay_reads_per_msg": cpu.get("relay_reads", 0) / msgs,
            "relay_writes_per_msg": cpu.get("relay_writes", 0) / msgs,
            "broker_cpu_us_per_msg": cpu["broker_cpu_s"] / msgs * 1e6,
            "client_cpu_us_per_msg": cpu["client_cpu_s"] / msgs * 1e6}


# -- scenario: consumer drain -----------------------------------------------------------------
async def fill_queue(endpoint: BrokerEndpoint, queue: str, count: int, size: int,
                     ssl: ssl_module.SSLContext | None = None) -> None:
    """Publish ``count`` messages straight to the broker and wait until all are confirmed."""
    client = await amqp091.connect(endpoint.host, endpoint.amqp_port, ssl=ssl)
    try:
        await client.confirm_select()
        one = amqp091.publish_frames(queue, b"\xcd" * size)
        sent = 0
        while sent < count:
            n = min(batch_of(size), count - sent)
            client.write(one * n)
            sent += n
            if client.paused:
                await client.writable()
        if not await _settle(lambda: client.confirmed >= count, 60.0):
            raise RuntimeError(f"fill: {client.confirmed}/{count} confirmed")
    finally:
        await client.close()


async def refill_drain_queue(rig: Rig) -> float:
    """Empty the drain queue and fill it with ``--drain-messages`` straight at the broker;
    the seconds that took."""
    opts = rig.opts
    assert rig.control is not None
    await rig.control.purge(DRAIN_QUEUE)
    t_fill = time.perf_counter()
    await fill_queue(rig.endpoint, DRAIN_QUEUE, opts.drain_messages, opts.size,
                     rig.targets["direct"].ssl)
    t_fill = time.perf_counter() - t_fill
    have = await rig.control.declare(DRAIN_QUEUE, passive=True)
    if have != opts.drain_messages:
        raise RuntimeError(f"drain: queue holds {have}, wanted {opts.drain_messages}")
    return t_fill


async def drain(rig: Rig, target: Target) -> dict[str, Any]:
    """A consumer through the target drains a pre-filled queue: prefetch, multiple acks."""
    opts = rig.opts
    t_fill = await refill_drain_queue(rig)
    client = await amqp091.connect(target.host, target.port, ssl=target.ssl)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    total, every = opts.drain_messages, opts.ack_every

    def on_delivery(tag: int) -> None:
        n = client.deliveries
        if n % every == 0 or n == total:
            client.ack(tag, multiple=True)
        if n == total and not done.done():
            done.set_result(None)

    client.on_delivery = on_delivery
    await client.qos(opts.prefetch)
    s0 = rig.cpu.snapshot(target.process)
    await client.consume(DRAIN_QUEUE, no_ack=False)
    try:
        await asyncio.wait([done, client.lost], timeout=120,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        s1 = rig.cpu.snapshot(target.process)
        await client.close()
    if client.deliveries < total:
        raise RuntimeError(f"drain: {client.deliveries}/{total} delivered"
                           + (" (connection lost)" if client.lost.done() else ""))
    cpu = rig.cpu.delta(s0, s1)
    return {"msgs": client.deliveries, "msgs_per_s": client.deliveries / cpu["wall_s"],
            "fill_s": t_fill, **cpu, **_per_msg(cpu, client.deliveries)}


async def drain10(rig: Rig, target: Target) -> dict[str, Any]:
    """A 1.0 receiver through the target drains a pre-filled queue: ``--prefetch`` link
    credit, settled and granted again every ``ack_every`` deliveries (``drain``'s 1.0 twin)."""
    from bench import amqp10

    opts = rig.opts
    t_fill = await refill_drain_queue(rig)
    marks: list[Any] = []
    res = await amqp10.drain(target.host, target.port, f"/amq/queue/{DRAIN_QUEUE}",
                             opts.drain_messages, opts.prefetch, opts.ack_every,
                             lambda: marks.append(rig.cpu.snapshot(target.process)),
                             ssl=target.ssl)
    cpu = rig.cpu.delta(marks[0], marks[1])
    msgs = int(res["msgs"])
    return {"msgs": msgs, "msgs_per_s": msgs / cpu["wall_s"], "fill_s": t_fill, **cpu,
            **_per_msg(cpu, msgs)}


# -- scenario: latency probe ------------------------------------------------------------------
_TS = struct.Struct(">Q")


async def latency(rig: Rig, target: Target) -> dict[str, Any]:
    """Timestamped publishes at a fixed rate, consumed on the same connection; round trips."""
    opts = rig.opts
    client = await amqp091.connect(target.host, target.port, ssl=target.ssl)
    queue = f"bench.latency.{target.name}.{os.getpid()}"
    await client.declare(queue, exclusive=True, auto_delete=True)
    samples: list[int] = []
    measure_from = [1 << 63]
    received = [0]

    def on_body(payload: memoryview, now: int) -> None:
        ts = _TS.unpack_from(payload, 0)[0]
        received[0] += 1
        if ts >= measure_from[0]:
            samples.append(now - ts)

    client.on_body = on_body
    await client.consume(queue, no_ack=True)
    frames = amqp091.publish_frames(queue, b"\x00" * opts.size)
    # The body's first 8 bytes sit right after the body frame's 7-byte header.
    body_at = len(frames) - opts.size - 1
    head, tail = frames[:body_at], frames[body_at + 8:]
    rate = opts.latency_rate
    sent = sent_at_measure = 0
    s0 = None
    loop_start = time.perf_counter()
    measure_start = loop_start + opts.warmup
    stop_at = measure_start + opts.seconds
    while True:
        now = time.perf_counter()
        if now >= stop_at:
            break
        if s0 is None and now >= measure_start:
            measure_from[0] = time.perf_counter_ns()
            s0 = rig.cpu.snapshot(target.process)
            sent_at_measure = sent
        due = int((now - loop_start) * rate) - sent
        if due > 0:
            parts = []
            for _ in range(due):
                parts.append(head + _TS.pack(time.perf_counter_ns()) + tail)
            client.write(b"".join(parts))
            sent += due
        await asyncio.sleep(0.001)  # uvloop's timers have 1 ms resolution
    s1 = rig.cpu.snapshot(target.process)
    await _settle(lambda: received[0] >= sent, 5.0)
    await client.close()
    assert s0 is not None
    cpu = rig.cpu.delta(s0, s1)
    samples.sort()
    us = [s / 1000 for s in samples]
    return {"sent": sent, "received": received[0], "samples": len(us),
            "achieved_rate": (sent - sent_at_measure) / cpu["wall_s"],
            "p50_us": percentile(us, 50), "p90_us": percentile(us, 90),
            "p99_us": percentile(us, 99), "p999_us": percentile(us, 99.9),
            "max_us": us[-1] if us else math.nan, **cpu,
            **_per_msg(cpu, len(us)), "_samples": us}


# -- scenario: memory per idle connection -----------------------------------------------------
async def idle_connections(rig: Rig, target: Target) -> dict[str, Any]:
    """K idle 0-9-1 connections (handshake done, one channel open): RSS delta / K."""
    assert target.process is not None
    k = rig.opts.idle_connections
    before = rss_bytes(target.process)
    sem = asyncio.Semaphore(25)
    clients: list[amqp091.Amqp091Client] = []

    async def one() -> None:
        async with sem:
            clients.append(await amqp091.connect(target.host, target.port, timeout=30,
                                                 ssl=target.ssl))

    results = await asyncio.gather(*(one() for _ in range(k)), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    await asyncio.sleep(1.0)
    during = rss_bytes(target.process)
    for c in clients:
        c.abort()
    await asyncio.sleep(1.0)
    after = rss_bytes(target.process)
    opened = len(clients)
    return {"connections": opened, "failures": len(failures),
            "first_failure": repr(failures[0]) if failures else None,
            "rss_before": before, "rss_during": during, "rss_after_close": after,
            "bytes_per_connection": (during - before) / opened if opened else math.nan}


# -- scenario: AMQP 1.0 firehose --------------------------------------------------------------
async def firehose10(rig: Rig, target: Target) -> dict[str, Any]:
    from bench import amqp10

    opts = rig.opts
    assert rig.control is not None
    await rig.control.purge(FIREHOSE10_QUEUE)
    s0s1: list[Any] = []

    def mark() -> None:
        s0s1.append(rig.cpu.snapshot(target.process))

    res = await amqp10.firehose(target.host, target.port, FIREHOSE10_ADDRESS,
                                opts.size, opts.warmup, opts.seconds, mark, ssl=target.ssl)
    cpu = rig.cpu.delta(s0s1[0], s0s1[1])
    msgs = int(res["msgs"])
    return {**res, "msgs_per_s": msgs / cpu["wall_s"], **cpu, **_per_msg(cpu, msgs)}


Scenario = Callable[[Rig, Target], Awaitable[dict[str, Any]]]
SCENARIOS: dict[str, tuple[str, Scenario, bool]] = {
    # name: (title, function, alternate targets over rounds)
    "idle": ("memory per idle 0-9-1 connection", idle_connections, False),
    "firehose": ("0-9-1 firehose publisher, confirms counted", firehose091, True),
    "drain": ("0-9-1 consumer drain of a pre-filled queue", drain, True),
    "drain10": ("AMQP 1.0 receiver drain of a pre-filled queue", drain10, True),
    "latency": ("0-9-1 round-trip latency at a fixed rate", latency, True),
    "firehose10": ("AMQP 1.0 firehose sender, accepted dispositions counted", firehose10,
                   True),
}


# -- processes ----------------------------------------------------------------------------------
def wait_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{_name(proc)} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), 1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{_name(proc)} not listening on {port} after {timeout}s")


def _name(proc: subprocess.Popen[bytes]) -> str:
    """The child's program, for a message (``bench.pump``, ``haproxy``)."""
    args = proc.args if isinstance(proc.args, list) else [str(proc.args)]
    program = [str(a) for a in args]
    return program[2] if len(program) > 2 and program[1] == "-m" else Path(program[0]).name


def beam_of(broker: LocalBroker) -> psutil.Process | None:
    if broker.process is None:
        return None
    for child in psutil.Process(broker.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("beam"):
                return child
    return None


async def probe(target: Target) -> str | None:
    """None when a 0-9-1 handshake through the target works, else why not."""
    try:
        client = await amqp091.connect(target.host, target.port, timeout=5, ssl=target.ssl)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    await client.close()
    return None


# -- the run --------------------------------------------------------------------------------------
async def run_all(rig: Rig, progress: Callable[[str], None]) -> dict[str, Any]:
    """Every scenario on one rig: the targets alternated within each round."""
    return (await run_interleaved({"": rig}, progress))[""]


async def prepare(rig: Rig, progress: Callable[[str], None], label: str = "") -> None:
    """The rig's control connection and queues; a target that cannot connect is skipped."""
    opts = rig.opts
    rig.control = await amqp091.connect(rig.endpoint.host, rig.endpoint.amqp_port,
                                        ssl=rig.targets["direct"].ssl)
    await rig.control.declare(FIREHOSE_QUEUE, {"x-max-length": opts.max_length})
    await rig.control.declare(DRAIN_QUEUE)
    await rig.control.declare(FIREHOSE10_QUEUE, {"x-max-length": opts.max_length})
    await rig.control.bind(FIREHOSE10_QUEUE, "amq.direct", FIREHOSE10_QUEUE)
    for t in rig.targets.values():
        t.broken = await probe(t)
        if t.broken:
            progress(f"target {label}{t.name} unusable, skipped: {t.broken}")
            rig.notes.append(f"{t.name} skipped: {t.broken}")


async def measure(rig: Rig, name: str, target: Target) -> dict[str, Any]:
    """One run of scenario ``name`` through ``target``, after a lull; its figures, or
    ``error``."""
    fn = SCENARIOS[name][1]
    quiet = await rig.wait_quiet()
    try:
        res = await asyncio.wait_for(fn(rig, target), rig.opts.seconds * 4 + 120)
    except Exception as exc:
        res = {"error": f"{type(exc).__name__}: {exc}"}
        if target.process is not None and not target.process.is_running():
            target.broken = "process died"
    res.update(quiet)
    if "other_cpu_s" in res:
        res["other_cores"] = res["other_cpu_s"] / res["wall_s"]
    return res


async def run_interleaved(rigs: dict[str, Rig], progress: Callable[[str], None]
                          ) -> dict[str, dict[str, Any]]:
    """Every scenario on every rig (a broker of a release and its relays, all up): in each
    round the rigs in turn, each one's targets in turn, so that drifting noise falls on
    every release and target alike. Results per rig, as ``run_all`` gives them."""
    opts = next(iter(rigs.values())).opts
    for label, rig in rigs.items():
        await prepare(rig, progress, f"{label} " if label else "")
    results: dict[str, dict[str, Any]] = {label: {} for label in rigs}
    for name in opts.scenarios:
        title, _, alternate = SCENARIOS[name]
        progress(f"== {name}: {title}")
        per_target = {label: {t: [] for t in rig.targets} for label, rig in rigs.items()}
        pooled: dict[str, dict[str, list[float]]] = {
            label: {t: [] for t in rig.targets} for label, rig in rigs.items()}
        rounds = opts.rounds if alternate else 1
        for r in range(rounds):
            for label, rig in rigs.items():
                for tname, target in rig.targets.items():
                    if target.broken or not (alternate or target.process is not None):
                        continue
                    t0 = time.monotonic()
                    res = await measure(rig, name, target)
                    pooled[label][tname].extend(res.pop("_samples", []))
                    res["round"] = r
                    per_target[label][tname].append(res)
                    who = f"{label} {tname:<9}" if label else f"{tname:<9}"
                    progress(f"   round {r + 1}/{rounds} {who} {_one_line(name, res)} "
                             f"({time.monotonic() - t0:.1f}s)")
        for label in rigs:
            runs = per_target[label]
            results[label][name] = {"title": title, "runs": runs,
                                    "median": {t: _medians(v) for t, v in runs.items()}}
            if any(pooled[label].values()):
                results[label][name]["pooled"] = {t: _pooled(v)
                                                  for t, v in pooled[label].items() if v}
    for rig in rigs.values():
        assert rig.control is not None
        await rig.control.close()
    return results


def _one_line(scenario: str, res: dict[str, Any]) -> str:
    if "error" in res:
        return "ERROR " + str(res["error"])
    if scenario == "idle":
        return (f"{res['connections']} conns, {res['bytes_per_connection'] / 1024:.1f} KiB/conn"
                + (f", {res['failures']} failed" if res["failures"] else ""))
    if scenario == "latency":
        return (f"p50 {res['p50_us']:.0f} p99 {res['p99_us']:.0f} p999 {res['p999_us']:.0f} us"
                f" ({res['samples']} samples, other cpu {res['other_cpu_s']:.2f}s)")
    cpu = res.get("relay_cpu_us_per_msg")
    return (f"{res['msgs_per_s']:>9,.0f} msg/s"
            + (f", relay {cpu:.1f} us/msg" if cpu else "")
            + (f" ({res['relay_reads_per_msg']:.2f} reads/msg)"
               if res.get("relay_reads_per_msg") else "")
            + f", other cpu {res['other_cpu_s']:.2f}s")


def _pooled(samples: list[float]) -> dict[str, float]:
    """Percentiles of every sample of every round together (more samples for p99.9)."""
    samples.sort()
    return {"samples": len(samples), "p50_us": percentile(samples, 50),
            "p99_us": percentile(samples, 99), "p999_us": percentile(samples, 99.9)}


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    ok = [r for r in runs if "error" not in r]
    keys = {k for r in ok for k, v in r.items() if isinstance(v, int | float)
            and not isinstance(v, bool) and k != "round"}
    return {k: median([r[k] for r in ok if k in r]) for k in sorted(keys)}


def _paired(scenario: dict[str, Any], target: str) -> float:
    """Median over rounds of (target / direct in the same round): drifting noise cancels."""
    direct = {r["round"]: r["msgs_per_s"] for r in scenario["runs"].get("direct", [])
              if "error" not in r}
    ratios = [r["msgs_per_s"] / direct[r["round"]] for r in scenario["runs"].get(target, [])
              if "error" not in r and direct.get(r["round"])]
    return median(ratios)


QUIET_CORES = 0.3  # a run during which other processes used less than this is "quiet"


def noise_adjusted(scenario: dict[str, Any]) -> dict[str, Any]:
    """msgs/s each target would reach with no foreign load on the machine.

    One least-squares fit over every run of every target: ``msgs/s = a[target] + b *
    noise_cores``, with one slope ``b`` for all (noise takes CPU from whichever target
    runs alike; the slope is the throughput a core of noise costs). ``a`` is comparable
    across targets even when their runs met different noise, which medians are not.
    Needs two runs per target, noise that varied by 0.3 cores or more, and for every target
    a run with at most 0.6 cores of noise (an interpolation near zero load, not a guess
    far from the data), and a negative slope; NaN otherwise.
    """
    groups = {t: [(float(r["other_cores"]), float(r["msgs_per_s"]))
                  for r in scenario["runs"].get(t, []) if "error" not in r
                  and "other_cores" in r] for t in TARGETS if scenario["runs"].get(t)}
    nan = {"msgs_per_s": dict.fromkeys(TARGETS, math.nan), "slope": math.nan}
    if any(len(g) < 2 for g in groups.values()):
        return nan
    xs = [x for g in groups.values() for x, _ in g]
    if max(xs) - min(xs) < 0.3 or max(min(x for x, _ in g) for g in groups.values()) > 0.6:
        return nan
    means = {t: (statistics.fmean(x for x, _ in g), statistics.fmean(y for _, y in g))
             for t, g in groups.items()}
    sxy = sum((x - means[t][0]) * (y - means[t][1]) for t, g in groups.items() for x, y in g)
    sxx = sum((x - means[t][0]) ** 2 for t, g in groups.items() for x, _ in g)
    if sxx <= 0:
        return nan
    slope = sxy / sxx
    if slope >= 0:  # more noise never made anything faster: too few or too alike runs
        return nan
    return {"msgs_per_s": {t: my - slope * mx for t, (mx, my) in means.items()},
            "slope": slope}


def _quiet_latency(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median percentiles over the runs during which the machine was quiet."""
    quiet = [r for r in runs if "error" not in r and r.get("other_cores", 9) <= QUIET_CORES]
    out: dict[str, float] = {"runs": len(quiet)}
    for key in ("p50_us", "p99_us", "p999_us"):
        out[key] = median([r[key] for r in quiet])
    return out


def _cpu_model(scenario: dict[str, Any], target: str) -> float:
    """Throughput ratio predicted from CPU per message when the machine's cores are the limit:
    direct needs broker + client CPU per message, a relayed message that plus the relay's.
    Much less sensitive to other processes' noise than the measured rates."""
    def total(t: str) -> float:
        m = scenario["median"].get(t, {})
        return float(sum(m.get(k, math.nan) for k in (
            "broker_cpu_us_per_msg", "client_cpu_us_per_msg"))
            + (m.get("relay_cpu_us_per_msg", math.nan) if t != "direct" else 0.0))
    return _ratio(total("direct"), total(target))


def _ratio(a: float, b: float) -> float:
    """a / b, NaN when b is 0 or NaN (a CPU delta under psutil's 10 ms tick reads as 0)."""
    return a / b if b and not math.isnan(b) else math.nan


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """Ratios and the targets we hold floodwall to."""
    s: dict[str, Any] = {}

    def med(scn: str, tgt: str, key: str) -> float:
        return float(results.get(scn, {}).get("median", {}).get(tgt, {}).get(key, math.nan))

    for scn in ("firehose", "drain", "firehose10"):
        if scn not in results:
            continue
        d = med(scn, "direct", "msgs_per_s")
        adj = noise_adjusted(results[scn])
        fit = adj["msgs_per_s"]
        noise = [x for t in TARGETS if not math.isnan(x := med(scn, t, "other_cores"))]
        s[scn] = {"msgs_per_s_noise_adjusted": fit,
                  "noise_slope_msgs_per_s_per_core": adj["slope"],
                  "max_median_noise_cores": max(noise, default=math.nan)}
        for t in RELAYS:
            s[scn] |= {f"{t}_over_direct": _ratio(med(scn, t, "msgs_per_s"), d),
                       f"{t}_over_direct_noise_adjusted": _ratio(fit.get(t, math.nan),
                                                                         fit["direct"]),
                       f"{t}_over_direct_paired": _paired(results[scn], t),
                       f"{t}_over_direct_cpu_model": _cpu_model(results[scn], t),
                       f"{t}_cpu_us_per_msg": med(scn, t, "relay_cpu_us_per_msg")}
        fc = s[scn]["floodwall_cpu_us_per_msg"]
        s[scn] |= {"cpu_ratio_floodwall_over_pump": _ratio(fc, s[scn]["pump_cpu_us_per_msg"]),
                   "cpu_ratio_floodwall_over_haproxy": _ratio(
                       fc, s[scn]["haproxy_cpu_us_per_msg"]),
                   "floodwall_over_haproxy": _ratio(med(scn, "floodwall", "msgs_per_s"),
                                                    med(scn, "haproxy", "msgs_per_s"))}
    if "latency" in results:
        lat: dict[str, Any] = {}
        pooled = results["latency"].get("pooled", {})
        for key in ("p50_us", "p99_us", "p999_us"):
            d = med("latency", "direct", key)
            lat[key] = {t: med("latency", t, key) for t in TARGETS}
            lat["added_" + key] = {t: med("latency", t, key) - d for t in RELAYS}
            pd = pooled.get("direct", {}).get(key, math.nan)
            lat["added_pooled_" + key] = {t: pooled.get(t, {}).get(key, math.nan) - pd
                                          for t in RELAYS}
        quiet = {t: _quiet_latency(results["latency"]["runs"].get(t, [])) for t in TARGETS}
        lat["quiet"] = quiet
        for key in ("p50_us", "p99_us", "p999_us"):
            lat["added_quiet_" + key] = {t: quiet[t][key] - quiet["direct"][key]
                                         for t in RELAYS}
        s["latency"] = lat
    if "idle" in results:
        s["idle"] = {t: med("idle", t, "bytes_per_connection") for t in RELAYS}
    s["goals"] = _goals(s)
    return s


def _goals(s: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal: the figure judged, which estimate it is, and met / not met / None."""
    goals: dict[str, dict[str, Any]] = {}

    def judge(name: str, value: float, how: str, ok: Callable[[float], bool]) -> None:
        goals[name] = {"value": value, "estimate": how,
                       "met": None if math.isnan(value) else ok(value)}

    fh = s.get("firehose", {})
    adjusted = fh.get("floodwall_over_direct_noise_adjusted", math.nan)
    if not fh:
        judge("firehose_1k_floodwall_over_direct_ge_0.90", math.nan, "not run", bool)
    elif not math.isnan(adjusted):
        judge("firehose_1k_floodwall_over_direct_ge_0.90", adjusted,
              "noise-adjusted (common-slope fit); ratio of medians "
              f"{fh.get('floodwall_over_direct', math.nan):.3f}", lambda v: v >= 0.90)
    elif fh and fh.get("max_median_noise_cores", math.inf) <= QUIET_CORES:
        judge("firehose_1k_floodwall_over_direct_ge_0.90",
              fh.get("floodwall_over_direct", math.nan), "ratio of medians, quiet runs",
              lambda v: v >= 0.90)
    else:
        judge("firehose_1k_floodwall_over_direct_ge_0.90", math.nan,
              "too noisy: no run near zero foreign load to compare; ratio of medians "
              f"{fh.get('floodwall_over_direct', math.nan):.3f}", bool)
    judge("cpu_per_msg_floodwall_le_5x_pump", fh.get("cpu_ratio_floodwall_over_pump", math.nan),
          "median CPU us per message, firehose" if fh else "not run", lambda v: v <= 5.0)
    lat = s.get("latency", {})
    quiet = lat.get("quiet", {})
    if quiet and min(quiet[t]["runs"] for t in ("direct", "floodwall")) >= 1:
        judge("added_p99_le_1ms_at_5k", lat["added_quiet_p99_us"]["floodwall"],
              f"quiet runs only (<= {QUIET_CORES} cores of noise: direct "
              f"{quiet['direct']['runs']}, floodwall {quiet['floodwall']['runs']})",
              lambda v: v <= 1000)
    elif not quiet:
        judge("added_p99_le_1ms_at_5k", math.nan, "not run", bool)
    else:
        judge("added_p99_le_1ms_at_5k", math.nan,
              "no quiet run: p99 under this much foreign load measures the noise", bool)
    judge("idle_conn_le_64KiB", s.get("idle", {}).get("floodwall", math.nan),
          "RSS delta per connection" if "idle" in s else "not run", lambda v: v <= 64 * 1024)
    return goals


def _versions(endpoint: BrokerEndpoint) -> dict[str, Any]:
    import uvloop

    info: dict[str, Any] = {"python": platform.python_version(),
                            "uvloop": getattr(uvloop, "__version__", "?"),
                            "cpus": os.cpu_count(), "machine": platform.machine(),
                            "kernel": platform.release(),
                            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    with contextlib.suppress(Exception):
        ov = endpoint.api("GET", "/api/overview")
        assert isinstance(ov, dict)
        info["rabbitmq"] = ov.get("rabbitmq_version")
        info["erlang"] = ov.get("erlang_version")
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    return info


def parse_args(argv: list[str] | None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="python -m bench.relay",
                                description="direct vs floodwall vs byte pump vs HAProxy, "
                                            "alternated")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="measured seconds per firehose / latency run (default 3)")
    p.add_argument("--warmup", type=float, default=0.5,
                   help="unmeasured seconds before each measured window (default 0.5)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds of alternated targets (default 5)")
    p.add_argument("--size", type=int, default=1024, help="message body bytes")
    p.add_argument("--drain-messages", type=int, default=50_000)
    p.add_argument("--latency-rate", type=int, default=5000, help="msg/s for the latency probe")
    p.add_argument("--idle-connections", type=int, default=500)
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset of: " + ", ".join(SCENARIOS))
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--tls", action="store_true",
                   help="an amqps-only broker (certificates made with trustme): direct clients "
                        "speak TLS to it, floodwall and the pump speak plain to their clients "
                        "and TLS upstream")
    p.add_argument("--max-length", type=int, default=20_000,
                   help="x-max-length of the firehose queues (200 for 1 MiB bodies)")
    p.add_argument("--haproxy-threads", type=int, default=1,
                   help="HAProxy's nbthread (1: one event loop, like floodwall and the pump)")
    p.add_argument("--pump-args", default="",
                   help="extra arguments for `bench.pump` (space separated), e.g. --splice")
    p.add_argument("--floodwall-args", default="",
                   help="extra arguments for `floodwall run` (space separated)")
    p.add_argument("--broker", type=parse_releases, default=("3.10",),
                   help="the RabbitMQ release, or a comma list run one after the other "
                        "(each its own broker) and reported side by side, e.g. 3.10,4.0 "
                        "(4.0: Debian 13's, in the root `make rabbitmq4-root` makes; "
                        "default 3.10)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON file for the raw figures (default bench/out/relay-DATE.json)")
    a = p.parse_args(argv)
    scenarios = tuple(s for s in a.scenarios.split(",") if s)
    targets = tuple(t for t in a.targets.split(",") if t)
    for s in scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}")
    for t in targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r}")
    opts = Options(seconds=a.seconds, warmup=a.warmup, rounds=a.rounds, size=a.size,
                   drain_messages=a.drain_messages, latency_rate=a.latency_rate,
                   max_length=a.max_length, idle_connections=a.idle_connections,
                   scenarios=scenarios,
                   targets=tuple(t for t in TARGETS if t in targets))
    return opts, a


def start_pump(upstream: str, workdir: Path, extra_args: list[str] | None = None,
               name: str = "pump") -> tuple[subprocess.Popen[bytes], int]:
    """A ``bench.pump`` child relaying to ``upstream``, listening; (process, port).
    ``extra_args``: its TLS settings, or ``--splice``; ``name``: its log's (``NAME.log``)."""
    pport = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(workdir / f"{name}.log", "wb") as log:
        pump = subprocess.Popen(
            [sys.executable, "-m", "bench.pump", "--listen", f"127.0.0.1:{pport}",
             "--upstream", upstream, *(extra_args or [])], cwd=REPO, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    wait_port("127.0.0.1", pport, pump)
    return pump, pport


#: HAProxy in TCP mode as a platform team runs it in front of a broker: one frontend, one
#: server, no checks, no logging; ``nbthread`` set (floodwall and the pump run one event loop:
#: ``--haproxy-threads 1`` is like for like, Debian's default is a thread per CPU); ``maxconn``
#: within a 20,000-descriptor limit (HAProxy needs two per connection and refuses to start
#: when it cannot raise its limit to that).
HAPROXY_CONFIG = """global
    nbthread {threads}
    maxconn 9000
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend amqp
    bind 127.0.0.1:{port}
    default_backend broker
backend broker
    server broker {upstream}
"""


def start_haproxy(upstream: str, workdir: Path, threads: int = 1
                  ) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's ``haproxy`` in TCP mode relaying to ``upstream`` (its ``server`` line's
    address and options: ``host:port``, TLS options after it), in the foreground;
    (process, port)."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(binary).exists():
        raise SystemExit("haproxy is not installed: `apt-get install haproxy` (make deps does)")
    port = free_port()
    config = workdir / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(threads=threads, port=port, upstream=upstream))
    with open(workdir / "haproxy.log", "wb") as log:
        proc = subprocess.Popen([binary, "-db", "-f", str(config)], cwd=workdir,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    wait_port("127.0.0.1", port, proc)
    return proc, port


def parse_releases(text: str) -> tuple[str, ...]:
    """``--broker``: one release or a comma list (``3.10,4.0``), each once, in order given."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError("no release given")
    for n in names:
        if n not in RELEASE_NAMES:
            raise argparse.ArgumentTypeError(
                f"unknown release {n!r}: expected a comma list of {', '.join(RELEASE_NAMES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    opts, args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "bench" / "out" / f"relay-{started:%Y%m%d-%H%M%S}.json"
    t_start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    command = " ".join([Path(sys.executable).name, "-m", "bench.relay",
                        *(sys.argv[1:] if argv is None else argv)])
    releases: tuple[str, ...] = args.broker
    rigs: dict[str, Rig] = {}
    proxies: dict[str, ProxyProcess | None] = {}
    with contextlib.ExitStack() as up:  # every release's broker and relays, all up
        for name in releases:
            rigs[name], proxies[name] = up.enter_context(open_rig(opts, args, name, progress))
        metas: dict[str, dict[str, Any]] = {name: {
            "started": started.isoformat(timespec="seconds"), "command": command,
            "broker": name, "options": opts.__dict__, "tls": args.tls,
            "environment": _versions(rig.endpoint), "loadavg_before": os.getloadavg()}
            for name, rig in rigs.items()}
        import uvloop

        one = len(releases) == 1
        got = uvloop.run(run_interleaved({"": rigs[releases[0]]} if one else rigs, progress))
        results = {releases[0]: got[""]} if one else got
        docs: dict[str, dict[str, Any]] = {}
        for name, rig in rigs.items():
            meta = metas[name]
            meta["loadavg_after"] = os.getloadavg()
            meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
            meta["notes"] = rig.notes
            fw = proxies[name]
            if fw is not None:
                meta["floodwall_log_tail"] = fw.log_tail(20)
                loops = [w.split("=", 1)[1] for w in fw.log_tail(200).split()
                         if w.startswith("event_loop=")]
                meta["floodwall_event_loop"] = loops[0] if loops else "unknown"
            docs[name] = {"meta": meta, "results": results[name],
                          "summary": summarize(results[name])}
    out.parent.mkdir(parents=True, exist_ok=True)
    if len(releases) == 1:
        doc = docs[releases[0]]
        out.write_text(json.dumps(_finite(doc), indent=1, default=_json_default,
                                  allow_nan=False))
        print_report(doc)
    else:
        both = {"meta": {"started": started.isoformat(timespec="seconds"),
                         "command": command, "releases": list(releases),
                         "elapsed_s": round(time.monotonic() - t_start, 1)},
                "releases": docs}
        out.write_text(json.dumps(_finite(both), indent=1, default=_json_default,
                                  allow_nan=False))
        print_releases(_finite(both))
    print(f"\nraw figures: {out}")
    return 0


@contextlib.contextmanager
def open_rig(opts: Options, args: argparse.Namespace, release: str,
             progress: Callable[[str], None]) -> Iterator[tuple[Rig, ProxyProcess | None]]:
    """A private broker of ``release`` and the relays of ``opts.targets`` in front of it:
    the rig and the floodwall process; all stopped on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-bench-"))
    # rabbitmq_prometheus listens on 15692 unless told otherwise: another node on this
    # machine (a test run) would make ours fail to boot.
    tls = make_tls(workdir / "pki") if args.tls else None
    broker = LocalBroker(workdir / "rabbit",
                         config_extra=f"prometheus.tcp.port = {free_port()}\n",
                         tls=tls, release=release_named(release))
    fw: ProxyProcess | None = None
    pump: subprocess.Popen[bytes] | None = None
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        progress(f"starting RabbitMQ {release} in {workdir}")
        endpoint = broker.start(timeout=240)
        upstream = f"{endpoint.host}:{endpoint.amqp_port}"
        tls_args: list[str] = []
        direct_ssl = None
        if tls is not None:
            upstream = f"amqps://localhost:{endpoint.amqp_port}"
            tls_args = ["--upstream-tls-ca", str(tls.ca)]
            direct_ssl = ssl_module.create_default_context(cafile=str(tls.ca))
        targets = {"direct": Target("direct", endpoint.host, endpoint.amqp_port,
                                    ssl=direct_ssl)}
        if "floodwall" in opts.targets:
            fw = ProxyProcess(upstream=upstream, logfile=workdir / "floodwall.log",
                              extra_args=["--event-loop", "auto", *tls_args,
                                          *args.floodwall_args.split()])
            fw.start()
            assert fw.process is not None
            targets["floodwall"] = Target("floodwall", "127.0.0.1", fw.port,
                                          psutil.Process(fw.process.pid))
            progress(f"floodwall pid {fw.process.pid} on {fw.port}")
        if "pump" in opts.targets:
            pump, pport = start_pump(upstream, workdir, [*tls_args, *args.pump_args.split()])
            targets["pump"] = Target("pump", "127.0.0.1", pport, psutil.Process(pump.pid))
            progress(f"pump pid {pump.pid} on {pport}")
        if "haproxy" in opts.targets:
            server = f"{endpoint.host}:{endpoint.amqp_port}"
            if tls is not None:
                server = (f"localhost:{endpoint.amqp_port} ssl verify required "
                          f"ca-file {tls.ca} sni str(localhost)")
            haproxy, hport = start_haproxy(server, workdir, args.haproxy_threads)
            targets["haproxy"] = Target("haproxy", "127.0.0.1", hport,
                                        psutil.Process(haproxy.pid))
            progress(f"haproxy pid {haproxy.pid} on {hport} ({args.haproxy_threads} "
                     "thread(s))")
        yield Rig(endpoint, targets, CpuMeter(beam_of(broker)), opts), fw
    finally:
        if fw is not None:
            fw.stop()
        for child in (pump, haproxy):
            if child is not None:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def make_tls(directory: Path) -> BrokerTls:
    """A CA and the broker's certificate (localhost, 127.0.0.1), made now (trustme)."""
    import trustme

    directory.mkdir(parents=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    (directory / "server.pem").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(directory / "server.key"))
    return BrokerTls(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def _finite(value: Any) -> Any:
    """NaN (a figure not measured) as JSON null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: object) -> object:
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
