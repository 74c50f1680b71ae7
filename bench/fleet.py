"""The fleet benchmark: N floodwall sidecars feeding one capped queue.

``python -m bench.fleet [--cases 1:max,4:max,8:max,8:1000] [--seconds 10]
[--protocol 0-9-1|1.0|mixed] [--broker 3.10|4.0] [--variant NAME:ROOT:ARGS ...] [--rounds R]
[--out FILE]``

Starts one private RabbitMQ and the largest N of the cases' floodwall processes (JSON logs,
uvloop, one policy: ``fleet.*`` capped at 1 MiB, resume 512 KiB), then for each case
``N:RATE`` (RATE msg/s per producer, ``max``: as fast as the socket takes them):

- a fresh queue ``fleet.<id>``, declared straight on the broker; the case waits until each
  of its N sidecars polices it (topology events);
- one *bare* producer per sidecar and RATE (``bench.flow.raw_producer``'s kind: pre-encoded
  1 KiB publishes, no confirms, Channel.Flow never read: the proxy must hold what it sends),
  the body's first two bytes its producer number; with ``--protocol 1.0`` raw AMQP 1.0
  senders instead (``bench.amqp10``: 1 KiB unsettled transfers as fast as the link credit
  allows, into ``/amq/queue/Q`` on 3.10, ``/queues/Q`` on 4.0), with ``mixed`` every other
  producer (0-9-1 first: ``1:max/max`` is one of each through one sidecar);
- one consumer straight on the broker, prefetch 20, acking ``--consumer-rate`` msg/s;
- the broker-side depth: a passive declare on a direct connection every 20 ms, plus the
  consumer's unacked messages, times 1 KiB; the peak is reported (and the management API's
  ``message_bytes`` every 250 ms as a coarse cross-check).

After ``--seconds`` the producers stop writing (their connections stay open, so what the
sidecars hold is released, not dropped), the consumer acks as fast as it can until it has
every message that was written (or ``--drain-timeout``): delivered vs sent, nothing lost.
Fairness: Jain's index of the producers' delivered counts in the second half of the window
(the queue held at capacity), ``(sum x)^2 / (n sum x^2)``; 1.0 is perfectly even; with
more than one protocol, per protocol too.

First, for each variant, the sidecars' cost with no traffic (``--idle-seconds``): their CPU,
the broker's, and the fleet exchange's publishes and deliveries per second.

``--variant NAME:ROOT:ARGS`` (repeatable) runs every case with another floodwall: ROOT a
checkout (the baseline: a ``git archive`` of a commit), ARGS more arguments (``--fleet
off``). Variants alternate for ``--rounds`` passes, each pass starting its sidecars afresh, on
one broker in one run, so their figures are side by side; the machine is shared (2 cores),
see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import math
import re
import shlex
import shutil
import signal
import struct
import sys
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import amqp091, amqp10, relay
from bench.flow import (
    KIB,
    MIB,
    Progress,
    Stack,
    held,
    policed,
    policy_entry,
    publish_paced,
    run_main,
    unique,
    until,
    write_policies,
)
from bench.meters import CpuMeter
from floodwall.dev.devbroker import RELEASE_NAMES
from floodwall.dev.devproxy import ProxyProcess

SIZE = 1024
CAPACITY = MIB
_ID = struct.Struct(">H")
_U32 = struct.Struct(">I")
#: A 1.0 producer's own bound on unsettled deliveries (``bench.amqp10.firehose``'s): the
#: proxy's credit is what paces it.
MAX_UNSETTLED = 10_000
PROTOCOLS = ("0-9-1", "1.0", "mixed")


def protocol_of(pid: int, protocol: str) -> str:
    """Producer ``pid``'s protocol: ``mixed`` alternates, 0-9-1 first (a sidecar with two
    producers has one of each; N sidecars with one each, every other one)."""
    if protocol != "mixed":
        return protocol
    return "1.0" if pid % 2 else "0-9-1"


@dataclass
class Consumer:
    """Straight to the broker; counts deliveries per producer (the body's first 2 bytes);
    acks ``rate`` msg/s (``math.inf``: everything at once)."""

    client: amqp091.Amqp091Client
    rate: float
    per_producer: dict[int, int] = field(default_factory=dict)
    marks: dict[int, int] = field(default_factory=dict)  # per_producer at ``mark()``
    tags: deque[int] = field(default_factory=deque)
    acked: int = 0

    def __post_init__(self) -> None:
        self.client.on_delivery = self.tags.append
        self.client.on_body = self._body

    def _body(self, payload: memoryview, _now: int) -> None:
        pid = _ID.unpack_from(payload)[0]
        self.per_producer[pid] = self.per_producer.get(pid, 0) + 1

    @property
    def delivered(self) -> int:
        return sum(self.per_producer.values())

    @property
    def unacked(self) -> int:
        return self.client.deliveries - self.acked

    def mark(self) -> None:
        self.marks = dict(self.per_producer)

    async def run(self, stop: asyncio.Event) -> None:
        start, done = time.perf_counter(), 0
        while not stop.is_set():
            if math.isinf(self.rate):
                if self.tags:
                    self.client.ack(self.tags[-1], multiple=True)
                    self.acked += len(self.tags)
                    self.tags.clear()
            else:
                due = int((time.perf_counter() - start) * self.rate) - done
                while due > 0 and self.tags:
                    self.client.ack(self.tags.popleft(), multiple=False)
                    self.acked += 1
                    done += 1
                    due -= 1
            await asyncio.sleep(0.001)

    def fast(self) -> None:
        self.rate = math.inf


async def producer(port: int, queue: str, pid: int, rate: float, stop: asyncio.Event,
                   counts: dict[int, int], gone: asyncio.Event) -> None:
    """A bare producer through one sidecar: no confirms, Channel.Flow never read. rate 0:
    batches as fast as the socket takes them; else paced on a 1 ms timer. Stays connected
    until ``gone`` (held publishes are released, not dropped)."""
    client = await amqp091.connect("127.0.0.1", port)
    counts[pid] = 0
    try:
        await publish_paced(client, amqp091.publish_frames(
            queue, _ID.pack(pid) + b"\xab" * (SIZE - 2)), rate, stop, counts, pid)
        await gone.wait()
    finally:
        client.abort()


async def producer10(port: int, address: str, pid: int, rate: float, stop: asyncio.Event,
                     counts: dict[int, int], gone: asyncio.Event) -> None:
    """A raw AMQP 1.0 sender through one sidecar (``bench.amqp10``: pre-encoded unsettled
    transfers, 1 KiB bodies, the first two bytes its producer number): as fast as its link
    credit allows (rate 0), else paced on a 1 ms timer within it. Stays connected until
    ``gone`` (its last deliveries settle)."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(amqp10.Amqp10Client, "127.0.0.1", port), 10)
    counts[pid] = 0
    try:
        await client.open_sender(address)
        template, id_at, tag_at = amqp10.transfer_template(_ID.pack(pid) + b"\xab" * (SIZE - 2))
        batch, step = bytearray(template * amqp10.BATCH), len(template)
        start = time.perf_counter()
        while not stop.is_set() and not client.lost.done() and client.error is None:
            n = min(amqp10.BATCH, client.sendable(MAX_UNSETTLED))
            if rate > 0:
                n = min(n, max(0, int((time.perf_counter() - start) * rate) - counts[pid]))
            if n == 0:
                client.flowed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.flowed.wait(), 0.001 if rate > 0 else 0.1)
                continue
            d = client.next_delivery
            for i in range(n):
                _U32.pack_into(batch, i * step + id_at, d + i)
                _U32.pack_into(batch, i * step + tag_at, d + i)
            client.write(bytes(batch[:n * step]))
            client.next_delivery = d + n
            counts[pid] += n
            if not client._writable.is_set():
                await client._writable.wait()
            else:
                await asyncio.sleep(0)
        if client.error is not None:
            raise amqp10.Amqp10Error(client.error)
        await gone.wait()
    finally:
        await client.close(1.0)


def jain(xs: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1.0 when all are equal."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if xs and sq else math.nan


@dataclass
class Trace:
    max_bytes: int = 0
    max_at: float = 0.0
    samples: int = 0
    mgmt_max_bytes: int = 0
    mgmt_samples: int = 0
    series: list[tuple[float, int]] = field(default_factory=list)  # (s since t0, bytes)

    def max_after(self, t: float) -> int:
        return max((d for at, d in self.series if at >= t), default=0)


async def sample_depth(st: Stack, queue: str, consumer: Consumer, trace: Trace,
                       stop: asyncio.Event, t0: float) -> None:
    sampler = await amqp091.connect(st.endpoint.host, st.endpoint.amqp_port)
    try:
        while not stop.is_set():
            ready = await sampler.declare(queue, passive=True)
            depth = (ready + consumer.unacked) * SIZE
            trace.samples += 1
            at = time.perf_counter() - t0
            trace.series.append((at, depth))
            if depth > trace.max_bytes:
                trace.max_bytes, trace.max_at = depth, at
            await asyncio.sleep(0.02)
    finally:
        await sampler.close()


async def sample_management(st: Stack, queue: str, trace: Trace, stop: asyncio.Event) -> None:
    path = "/api/queues/%2F/" + urllib.parse.quote(queue, safe="")
    while not stop.is_set():
        with contextlib.suppress(Exception):
            doc = await asyncio.to_thread(st.endpoint.api, "GET", path, None, 5)
            assert isinstance(doc, dict)
            trace.mgmt_max_bytes = max(trace.mgmt_max_bytes, int(doc.get("message_bytes") or 0))
            trace.mgmt_samples += 1
        await asyncio.sleep(0.25)


def fleet_events(sidecars: list[ProxyProcess], offsets: list[int]) -> dict[str, int]:
    """The fleet's membership log lines the sidecars wrote since ``offsets``: joins, leaves
    by reason (a live member timed out and joined again is a flap), silent and back; and its
    announcement timer's lateness past 0.5 s (``fleet_tick_late``: count, largest)."""
    counts: dict[str, int] = {}
    for fw, offset in zip(sidecars, offsets, strict=True):
        with contextlib.suppress(OSError), open(fw.logfile, "rb") as f:
            f.seek(offset)
            for line in f:
                if b"fleet_member_joined" in line:
                    key = "joined"
                elif b"fleet_member_left" in line:
                    m = re.search(rb'"reason": ?"([^"]+)"', line)
                    key = "left " + (m.group(1).decode() if m else "?")
                elif b"fleet_member_silent" in line:
                    key = "silent"
                elif b"fleet_member_back" in line:
                    key = "back"
                elif b"fleet_tick_late" in line:
                    key = "tick late"
                    m = re.search(rb'"late_seconds": ?([0-9.]+)', line)
                    late = float(m.group(1)) if m else 0.0
                    counts["tick late max ms"] = max(counts.get("tick late max ms", 0),
                                                     int(late * 1000))
                else:
                    continue
                counts[key] = counts.get(key, 0) + 1
    return counts


def log_sizes(sidecars: list[ProxyProcess]) -> list[int]:
    sizes = []
    for fw in sidecars:
        try:
            sizes.append(fw.logfile.stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes


def fleet_doc(fw: ProxyProcess) -> dict[str, Any]:
    flow = fw.state().get("flow") or {}
    assert isinstance(flow, dict)
    doc = flow.get("fleet") or {}
    assert isinstance(doc, dict)
    return doc


def counts_member(fw: ProxyProcess, queue: str, member: str) -> bool:
    """Whether ``fw`` still counts ``member`` in ``queue``'s shares (or among its members)."""
    doc = fleet_doc(fw)
    if member in {m["id"] for m in doc.get("members", [])}:
        return True
    return any(q["queue"] == queue and member in q.get("members", {})
               for q in doc.get("queues", []))


async def kill_one(victim: ProxyProcess, survivors: list[ProxyProcess], queue: str,
                   t0: float) -> dict[str, Any]:
    """SIGKILL ``victim``; how long until every survivor stopped counting it in the queue's
    shares (the takeover target: within 3 s), polled on /state every 20 ms."""
    member = str(fleet_doc(victim)["me"])
    assert victim.process is not None
    victim.process.send_signal(signal.SIGKILL)
    killed = time.perf_counter()
    await asyncio.to_thread(victim.process.wait, 10)
    pending = list(survivors)
    takeover: list[float] = []
    while pending and time.perf_counter() - killed < 30:
        for fw in list(pending):
            if not await asyncio.to_thread(counts_member, fw, queue, member):
                takeover.append(time.perf_counter() - killed)
                pending.remove(fw)
        await asyncio.sleep(0.02)
    return {"killed_at_s": round(killed - t0, 2),
            "takeover_s": round(max(takeover), 3) if not pending else math.inf,
            "takeover_each_s": [round(x, 3) for x in takeover]}


@dataclass
class CaseRun:
    """One case's producers, consumer and samplers, started together."""

    st: Stack
    sidecars: list[ProxyProcess]
    case: Case
    queue: str
    consumer: Consumer
    trace: Trace = field(default_factory=Trace)
    sent: dict[int, int] = field(default_factory=dict)
    stop_producing: asyncio.Event = field(default_factory=asyncio.Event)
    stop_sampling: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    producers: list[asyncio.Task[Any]] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)  # producer -> sidecar index
    protocol: str = "0-9-1"  # --protocol: 0-9-1, 1.0 or mixed (``protocol_of``)
    address: str = ""  # the 1.0 producers' target: /amq/queue/Q (3.10), /queues/Q (4.0)
    protocols: list[str] = field(default_factory=list)  # producer -> its protocol

    def start(self, t0: float) -> None:
        self.tasks = [
            asyncio.create_task(sample_depth(self.st, self.queue, self.consumer, self.trace,
                                             self.stop_sampling, t0)),
            asyncio.create_task(sample_management(self.st, self.queue, self.trace,
                                                  self.stop_sampling))]
        for i, fw in enumerate(self.sidecars):
            for rate in self.case.rates:
                pid = len(self.owner)
                self.owner.append(i)
                self.protocols.append(protocol_of(pid, self.protocol))
                if self.protocols[-1] == "1.0":
                    self.producers.append(asyncio.create_task(producer10(
                        fw.port, self.address, pid, rate, self.stop_producing, self.sent,
                        self.gone)))
                    continue
                self.producers.append(asyncio.create_task(producer(
                    fw.port, self.queue, pid, rate, self.stop_producing, self.sent,
                    self.gone)))


async def run_case(st: Stack, sidecars: list[ProxyProcess], case: Case,
                   opts: argparse.Namespace, cpu: CpuMeter) -> dict[str, Any]:
    ep, n = st.endpoint, len(sidecars)
    queue = unique("fleet")
    direct = await amqp091.connect(ep.host, ep.amqp_port)
    await direct.declare(queue)
    await direct.close()
    for fw in sidecars:
        await until(functools.partial(policed, fw, queue), 30, f"{queue} policed by {fw.port}")
    consumer_client = await amqp091.connect(ep.host, ep.amqp_port)
    await consumer_client.qos(opts.prefetch)
    consumer = Consumer(consumer_client, opts.consumer_rate)
    await consumer_client.consume(queue, no_ack=False)
    stop_consuming = asyncio.Event()
    run = CaseRun(st, sidecars, case, queue, consumer, protocol=opts.protocol,
                  address=("/queues/" if st.release.root is not None else "/amq/queue/") + queue)
    offsets = log_sizes(sidecars)
    t0 = time.perf_counter()
    consuming = asyncio.create_task(consumer.run(stop_consuming))
    run.start(t0)
    procs = [psutil.Process(fw.process.pid) for fw in sidecars if fw.process]
    api0 = [await asyncio.to_thread(api_requests, fw) for fw in sidecars]
    counts0 = [await asyncio.to_thread(depth_counts, fw, queue) for fw in sidecars]
    s0 = cpu.snapshot(None)
    side0 = {p.pid: p.cpu_times().user + p.cpu_times().system for p in procs}
    killed: dict[str, Any] = {}
    if case.kill:  # kill the last a third of the way; fairness over the last third
        await asyncio.sleep(opts.seconds / 3)
        killed = await kill_one(sidecars[-1], sidecars[:-1], queue, t0)
        await asyncio.sleep(max(0.0, t0 + 2 * opts.seconds / 3 - time.perf_counter()))
        window_s = opts.seconds / 3
    else:
        await asyncio.sleep(opts.seconds / 2)
        window_s = opts.seconds / 2
    consumer.mark()
    sent_mark = dict(run.sent)
    await asyncio.sleep(window_s)
    if case.kill:
        killed["peak_after_kill_bytes"] = run.trace.max_after(killed["killed_at_s"])
    run.stop_producing.set()
    window = {pid: consumer.per_producer.get(pid, 0) - consumer.marks.get(pid, 0)
              for pid in range(len(run.owner))}
    offered = [(run.sent.get(pid, 0) - sent_mark.get(pid, 0)) / window_s
               for pid in range(len(run.owner))]
    s1 = cpu.snapshot(None)
    api1 = [await asyncio.to_thread(api_requests, fw) for fw in sidecars]
    counts1 = [await asyncio.to_thread(depth_counts, fw, queue) for fw in sidecars]
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    side_d = sum(p.cpu_times().user + p.cpu_times().system - side0[p.pid] for p in alive)
    res = await finish_case(run, consumer, consuming, stop_consuming, opts)
    cpu_d = CpuMeter.delta(s0, s1)
    live = [pid for pid in range(len(run.owner)) if not (case.kill and run.owner[pid] == n - 1)]
    rates = [window[pid] / window_s for pid in range(len(run.owner))]
    res.update({
        "sidecars": n, "case": case.label,
        "rate": "/".join("max" if r <= 0 else f"{r:g}" for r in case.rates),
        "max_at_s": round(run.trace.max_at, 2),
        "delivered_rates_second_half": [round(r, 1) for r in rates],
        "jain": jain([rates[pid] for pid in live]),
        "protocols": run.protocols,
        "jain_by_protocol": {p: jain([rates[pid] for pid in live if run.protocols[pid] == p])
                             for p in sorted(set(run.protocols))},
        "delivered_by_protocol": {p: round(sum(rates[pid] for pid in live
                                               if run.protocols[pid] == p), 1)
                                  for p in sorted(set(run.protocols))},
        "pace": sum(rates[pid] for pid in live) / opts.consumer_rate,
        "fleet_events": fleet_events(sidecars, offsets),
        "sidecar_cpu_cores": side_d / cpu_d["wall_s"] if cpu_d["wall_s"] else math.nan,
        "other_cores": (max(0.0, cpu_d["other_cpu_s"] - side_d) / cpu_d["wall_s"]
                        if cpu_d["wall_s"] else math.nan),
        "depth_kib_per_second": depth_profile(run.trace),
        # the load on the broker and its API: passive declares of the case's queue per
        # second (each live sidecar, and the fleet), management API requests per second
        "counts_per_s": [round((b - a) / cpu_d["wall_s"], 1)
                         for a, b in zip(counts0, counts1, strict=True) if b == b],
        "api_per_s": api_rates(api0, api1, cpu_d["wall_s"])})
    if killed:
        res["kill"] = killed
    if len(case.rates) > 1:  # greedy and modest: the modest one's part of the drain
        res["modest"] = modest_figures(case, rates, offered, opts.consumer_rate)
    return res


def depth_profile(trace: Trace) -> list[list[int]]:
    """The broker-side depth, per second of the case: [min, max] KiB."""
    out: dict[int, list[int]] = {}
    for at, d in trace.series:
        lo_hi = out.setdefault(int(at), [d, d])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], d), max(lo_hi[1], d)
    return [[lo // KIB, hi // KIB] for _, (lo, hi) in sorted(out.items())]


def modest_figures(case: Case, rates: list[float], offered: list[float], drain: float
                   ) -> dict[str, Any]:
    """For each sidecar's least paced producer: its delivered rate while held against the
    target, min(its demand, half the drain), its demand being what it wrote in the
    window (the bench's loop may fall behind its pace on a busy machine)."""
    per = len(case.rates)
    slowest = min((r for r in case.rates if r > 0), default=0.0)
    j = case.rates.index(slowest) if slowest else 0
    got = [rates[i * per + j] for i in range(case.sidecars)]
    demand = [offered[i * per + j] for i in range(case.sidecars)]
    target = [min(d, drain / 2 / case.sidecars) for d in demand]
    return {"demand": [round(d, 1) for d in demand], "target": [round(t, 1) for t in target],
            "delivered": [round(g, 1) for g in got],
            "met": all(g >= 0.95 * t for g, t in zip(got, target, strict=True))}


async def finish_case(run: CaseRun, consumer: Consumer, consuming: asyncio.Task[None],
                      stop_consuming: asyncio.Event, opts: argparse.Namespace
                      ) -> dict[str, Any]:
    """Drain: every message the live sidecars' producers sent is delivered (a killed
    sidecar's held messages are gone with it: counted apart)."""
    ep, n = run.st.endpoint, len(run.sidecars)
    dead = {i for i, fw in enumerate(run.sidecars) if fw.process and fw.process.poll() is not None}
    live = [pid for pid in range(len(run.owner)) if run.owner[pid] not in dead]
    total_sent = sum(run.sent.values())
    consumer.fast()
    drained = True
    try:
        await until(lambda: all(consumer.per_producer.get(p, 0) >= run.sent.get(p, 0)
                                for p in live), opts.drain_timeout,
                    "every message delivered", interval=0.1)
    except TimeoutError:
        drained = False
    await asyncio.sleep(0.5)  # the dead sidecar's last forwarded ones, if any
    run.stop_sampling.set()
    await asyncio.gather(*run.tasks, return_exceptions=True)
    run.gone.set()
    errors = [repr(r) for r in await asyncio.gather(*run.producers, return_exceptions=True)
              if isinstance(r, BaseException)]
    stop_consuming.set()
    await consuming
    await consumer.client.close()
    still_held = [held(fw)["messages"] for i, fw in enumerate(run.sidecars) if i not in dead]
    direct = await amqp091.connect(ep.host, ep.amqp_port)
    await direct.delete(run.queue)
    await direct.close()
    lost = sum(run.sent.get(p, 0) - consumer.per_producer.get(p, 0) for p in live)
    dead_pids = [p for p in range(len(run.owner)) if run.owner[p] in dead]
    return {"queue": run.queue, "capacity": CAPACITY,
            "max_depth_bytes": run.trace.max_bytes,
            "overshoot_bytes": run.trace.max_bytes - CAPACITY,
            "mgmt_max_bytes": run.trace.mgmt_max_bytes, "samples": run.trace.samples,
            "sent": total_sent, "delivered": consumer.delivered, "lost": lost,
            "dead_sidecar_unforwarded": sum(run.sent.get(p, 0) - consumer.per_producer.get(p, 0)
                                            for p in dead_pids),
            "drained": drained, "held_after": still_held, "errors": errors,
            "sidecars_alive": n - len(dead)}


_API = re.compile(r'^floodwall_management_request_seconds_count\{endpoint="([a-z]+)"\} (\S+)$',
                  re.M)
_COUNTS = re.compile(r'^floodwall_queue_depth_samples_total\{[^}]*queue="([^"]+)"[^}]*\} (\S+)$',
                     re.M)


def api_requests(fw: ProxyProcess) -> dict[str, float]:
    """The sidecar's management API requests so far, by endpoint (its metrics; {} when it
    cannot be read: killed)."""
    try:
        text = fw.get("/metrics", 2.0).decode()
    except Exception:
        return {}
    return {m[1]: float(m[2]) for m in _API.finditer(text)}


def depth_counts(fw: ProxyProcess, queue: str) -> float:
    """The ready counts (passive declares) the sidecar took of ``queue`` so far."""
    try:
        text = fw.get("/metrics", 2.0).decode()
    except Exception:
        return math.nan
    return sum(float(m[2]) for m in _COUNTS.finditer(text) if m[1] == queue)


def api_rates(before: list[dict[str, float]], after: list[dict[str, float]], seconds: float
              ) -> dict[str, Any]:
    """Management API requests per second by endpoint: per sidecar (mean, max) and for the
    fleet (their sum)."""
    per = [{k: (a.get(k, 0.0) - b.get(k, 0.0)) / seconds for k in a.keys() | b.keys()}
           for b, a in zip(before, after, strict=True) if a and b]
    totals = [sum(d.values()) for d in per]
    endpoints = sorted({k for d in per for k in d})
    return {"per_sidecar_mean": round(sum(totals) / max(1, len(totals)), 3),
            "per_sidecar_max": round(max(totals, default=0.0), 3),
            "fleet": round(sum(totals), 3),
            "fleet_by_endpoint": {k: round(sum(d.get(k, 0.0) for d in per), 3)
                                  for k in endpoints}}


def _exchange_counts(st: Stack) -> tuple[int, int]:
    """(published in, routed out) of the default fleet's exchange on /, from the
    management API's message_stats (0, 0 when it does not exist: --fleet off)."""
    try:
        doc = st.endpoint.api("GET", "/api/exchanges/%2F/floodwall.fleet.default", None, 5)
    except Exception:
        return 0, 0
    stats = (doc or {}).get("message_stats") or {} if isinstance(doc, dict) else {}
    return int(stats.get("publish_in") or 0), int(stats.get("publish_out") or 0)


async def idle_cost(st: Stack, sidecars: list[ProxyProcess], seconds: float,
                    cpu: CpuMeter) -> dict[str, Any]:
    """What the sidecars cost with no traffic (policies loaded, nothing policed but what
    the fleet needs): their CPU, the broker's, and the fleet exchange's messages/s (the
    management API's counters, refreshed every 5 s: read over whole refreshes)."""
    procs = [psutil.Process(fw.process.pid) for fw in sidecars if fw.process]
    await asyncio.sleep(6.0)  # let the API's figures catch up with the start-up
    in0, out0 = await asyncio.to_thread(_exchange_counts, st)
    api0 = [await asyncio.to_thread(api_requests, fw) for fw in sidecars]
    s0 = cpu.snapshot(None)
    c0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    await asyncio.sleep(seconds)
    s1 = cpu.snapshot(None)
    c1 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    api1 = [await asyncio.to_thread(api_requests, fw) for fw in sidecars]
    in1, out1 = await asyncio.to_thread(_exchange_counts, st)
    d = CpuMeter.delta(s0, s1)
    wall = d["wall_s"]
    return {"seconds": round(wall, 1), "sidecars": len(procs),
            "sidecar_cores_each": (c1 - c0) / wall / max(1, len(procs)),
            "broker_cores": d.get("broker_cpu_s", math.nan) / wall,
            "other_cores": max(0.0, d["other_cpu_s"] - (c1 - c0)) / wall,
            "fleet_in_per_s": round((in1 - in0) / wall, 1),
            "fleet_out_per_s": round((out1 - out0) / wall, 1),
            "api_per_s": api_rates(api0, api1, wall)}


@dataclass(frozen=True)
class Variant:
    """A floodwall to run the cases with: a name, a checkout (None: this one), arguments."""

    name: str
    root: Path | None = None
    args: tuple[str, ...] = ()


def parse_variant(text: str) -> Variant:
    """``NAME:ROOT:ARGS`` (ROOT and ARGS may be empty), e.g. ``main:/tmp/main:`` or
    ``off::--fleet off``."""
    name, _, rest = text.partition(":")
    root, _, args = rest.partition(":")
    return Variant(name, Path(root) if root else None, tuple(shlex.split(args)))


async def start_sidecars(st: Stack, variant: Variant, n: int, policies: Path,
                         tag: str = "") -> list[ProxyProcess]:
    sidecars: list[ProxyProcess] = []
    for i in range(n):
        args = ["--event-loop", "auto", "--log-format", "json", "--policies", str(policies),
                "--management", st.endpoint.management_url, *variant.args]
        proc = ProxyProcess(upstream=st.upstream,
                            logfile=st.workdir / f"{variant.name}-sidecar-{tag or i}.log",
                            extra_args=args, root=variant.root)
        st.proxies.append(proc)
        sidecars.append(proc)
        await asyncio.to_thread(proc.start, 90.0)
    return sidecars


def _by_protocol(res: dict[str, Any]) -> str:
    """`` (0-9-1 0.998 at 500 msg/s, 1.0 0.990 at 480 msg/s)``: each protocol's Jain index
    and delivered rate while held, when the producers speak more than one."""
    by = res.get("jain_by_protocol") or {}
    if len(by) < 2:
        return ""
    rates = res.get("delivered_by_protocol") or {}
    return " (" + ", ".join(f"{p} {j:.3f} at {rates.get(p, 0):g} msg/s"
                            for p, j in by.items()) + ")"


def case_line(variant: str, res: dict[str, Any]) -> str:
    line = (f"   {variant} {res['case']:<12} peak {res['max_depth_bytes'] / KIB:7.0f} KiB "
            f"({res['overshoot_bytes'] / KIB:+.0f}), sent {res['sent']}, delivered "
            f"{res['delivered']}, lost {res['lost']}, jain {res['jain']:.3f}"
            f"{_by_protocol(res)}, pace "
            f"{res['pace']:.2f}, noise {res['other_cores']:.2f}, fleet {res['fleet_events']}")
    if "kill" in res:
        k = res["kill"]
        line += (f"; killed at {k['killed_at_s']} s: taken over in {k['takeover_s']} s, peak "
                 f"after {k['peak_after_kill_bytes'] / KIB:.0f} KiB")
    if "modest" in res:
        m = res["modest"]
        line += f"; modest got {m['delivered']} msg/s, target {m['target']}"
    return line + (f" ERRORS {res['errors']}" if res["errors"] else "")


async def one_pass(st: Stack, variant: Variant, policies: Path, opts: argparse.Namespace,
                   progress: Progress, cpu: CpuMeter) -> dict[str, Any]:
    """Start the variant's sidecars, measure the idle cost and every case, stop them."""
    most = max(c.sidecars for c in opts.cases)
    sidecars = await start_sidecars(st, variant, most, policies)
    try:
        progress(f"== {variant.name}: {most} sidecars up")
        idle = await idle_cost(st, sidecars, opts.idle_seconds, cpu)
        progress(f"   idle {idle['seconds']:g} s: {idle['sidecar_cores_each']:.4f} cores per "
                 f"sidecar, broker {idle['broker_cores']:.3f} cores, fleet exchange "
                 f"{idle['fleet_in_per_s']} in/s, {idle['fleet_out_per_s']} out/s, "
                 f"management API {idle['api_per_s']}")
        runs = []
        for case in opts.cases:
            res = await run_case(st, sidecars[:case.sidecars], case, opts, cpu)
            res["variant"] = variant.name
            runs.append(res)
            progress(case_line(variant.name, res))
            if case.kill:  # a fresh sidecar in the killed one's place
                dead = sidecars[case.sidecars - 1]
                st.proxies.remove(dead)
                sidecars[case.sidecars - 1] = (await start_sidecars(
                    st, variant, 1, policies, f"{case.sidecars - 1}-after-kill"))[0]
        return {"idle": idle, "runs": runs}
    finally:
        for proc in sidecars:
            await asyncio.to_thread(st.stop_proxy, proc)
        if opts.logs is not None:
            opts.logs.mkdir(parents=True, exist_ok=True)
            for log in st.workdir.glob(f"{variant.name}-sidecar-*.log"):
                shutil.copy(log, opts.logs / log.name)


async def fleet(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    policies = write_policies(st.workdir / "fleet.yaml",
                              policy_entry("fleet", "fleet.*", "1MiB", "512KiB"))
    cpu = CpuMeter(relay.beam_of(st.broker))
    passes = []
    for r in range(opts.rounds):
        for variant in opts.variants:
            res = await one_pass(st, variant, policies, opts, progress, cpu)
            res.update(variant=variant.name, round=r)
            passes.append(res)
    return {"passes": passes, "variants": [
                {"name": v.name, "root": str(v.root) if v.root else None, "args": v.args}
                for v in opts.variants],
            "consumer_rate": opts.consumer_rate, "prefetch": opts.prefetch,
            "protocol": opts.protocol,
            "seconds": opts.seconds}


def report(res: dict[str, Any]) -> None:
    meta = res["meta"]
    print(f"\nbench.fleet {meta['started']} ({meta['cpus']} cores, load before "
          f"{meta['loadavg_before'][0]:.2f}, RabbitMQ {meta.get('rabbitmq')})")
    f = res["results"].get("fleet")
    if not f:
        return
    print(f"one queue capped at 1 MiB, {f.get('protocol', '0-9-1')} producers (1 KiB, 0-9-1 bare: "
          "no confirms; 1.0 raw: unsettled, as fast as credit allows), "
          f"consumer {f['consumer_rate']:g} msg/s, {f['seconds']:g} s per case; noise: CPU "
          "of everything else on the machine (sidecars and broker excluded)")
    for v in f["variants"]:
        print(f"  variant {v['name']}: {v['root'] or 'this checkout'} {' '.join(v['args'])}")
    print(f"  {'variant':<8}{'round':>6} {'case':<14}{'peak':>10}{'over cap':>11}"
          f"{'sent':>8}{'delivered':>10}{'lost':>5}{'jain':>7}{'pace':>6}{'sidecar cores':>14}"
          f"{'noise':>7}  fleet log / kill / modest")
    for p in f["passes"]:
        i = p["idle"]
        print(f"  {p['variant']:<8}{p['round']:>6}  idle: {i['sidecar_cores_each']:.4f} cores "
              f"per sidecar ({i['sidecars']}), broker {i['broker_cores']:.3f} cores, fleet "
              f"exchange {i['fleet_in_per_s']:g} publishes/s in, {i['fleet_out_per_s']:g} "
              f"deliveries/s out, noise {i['other_cores']:.2f}")
        if "api_per_s" in i:
            a = i["api_per_s"]
            print(f"  {'':<14}  idle management API requests/s: {a['per_sidecar_mean']:g} per "
                  f"sidecar (max {a['per_sidecar_max']:g}), {a['fleet']:g} for the fleet "
                  f"{a['fleet_by_endpoint']}")
        for r in p["runs"]:
            extra = [str(r.get("fleet_events") or "")]
            if "kill" in r:
                k = r["kill"]
                extra.append(f"taken over in {k['takeover_s']} s, peak after the kill "
                             f"{k['peak_after_kill_bytes'] / KIB:.0f} KiB")
            if "modest" in r:
                m = r["modest"]
                extra.append(f"modest {m['delivered']} msg/s (target {m['target']}, "
                             f"{'met' if m['met'] else 'NOT met'})")
            extra.append(_by_protocol(r).strip(" ()"))
            print(f"  {p['variant']:<8}{p['round']:>6} {r['case']:<14}"
                  f"{r['max_depth_bytes'] / KIB:>6.0f} KiB{r['overshoot_bytes'] / KIB:>+7.0f} KiB"
                  f"{r['sent']:>8}{r['delivered']:>10}{r['lost']:>5}{r['jain']:>7.3f}"
                  f"{r['pace']:>6.2f}{r['sidecar_cpu_cores']:>14.2f}{r['other_cores']:>7.2f}  "
                  + " / ".join(e for e in extra if e)
                  + (f"  errors: {r['errors']}" if r["errors"] else ""))
            if "counts_per_s" in r:
                c, a = r["counts_per_s"], r["api_per_s"]
                print(f"  {'':<14}  passive declares/s {sum(c):.0f} (each {c}); management "
                      f"API {a['fleet']:g}/s, per sidecar {a['per_sidecar_mean']:g}")


@dataclass(frozen=True)
class Case:
    """``N:RATE[/RATE...][:kill]``: N sidecars, on each one producer per RATE (msg/s; max:
    unpaced), e.g. ``4:max``, ``1:max/100`` (a greedy and a modest producer on one
    sidecar), ``4:max:kill`` (the last sidecar killed with SIGKILL a third of the way)."""

    sidecars: int
    rates: tuple[float, ...]
    kill: bool = False

    @property
    def label(self) -> str:
        rates = "/".join("max" if r <= 0 else f"{r:g}" for r in self.rates)
        return f"{self.sidecars}:{rates}" + (":kill" if self.kill else "")


def parse_case(text: str) -> Case:
    n, _, rest = text.partition(":")
    rates, _, flag = rest.partition(":")
    if flag not in ("", "kill"):
        raise ValueError(f"case {text!r}: {flag!r} is not kill")
    return Case(int(n), tuple(0.0 if r in ("", "max") else float(r)
                              for r in (rates or "max").split("/")), flag == "kill")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="1:max,4:max,8:max,1:1000,4:1000,8:1000",
                   help="SIDECARS:RATE list (RATE msg/s per producer, max: unpaced)")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--consumer-rate", type=float, default=1000.0)
    p.add_argument("--prefetch", type=int, default=20)
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--idle-seconds", type=float, default=20.0,
                   help="first, the sidecars' cost with no traffic, over this long")
    p.add_argument("--variant", dest="variants", action="append", type=parse_variant,
                   help="NAME:ROOT:ARGS, repeatable: a floodwall to run every case with (ROOT "
                        "another checkout, e.g. a git archive of main; ARGS more arguments); "
                        "default: this checkout as is")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over the variants, alternated (default 1)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--protocol", choices=PROTOCOLS, default="0-9-1",
                   help="the producers: bare 0-9-1 publishers, raw AMQP 1.0 senders, or "
                        "mixed (every other producer 1.0, 0-9-1 first); Jain's index is "
                        "reported per protocol and overall")
    p.add_argument("--broker", choices=RELEASE_NAMES, default="3.10",
                   help="the RabbitMQ to run on: the host's 3.10 or the 4.0 root")
    p.add_argument("--logs", type=Path, default=None,
                   help="copy the sidecars' logs here after each pass (the run's own "
                        "directory is removed at the end)")
    a = p.parse_args(argv)
    a.cases = [parse_case(c) for c in a.cases.split(",") if c]
    a.variants = a.variants or [Variant("this")]
    return a


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_main("fleet", argv, {"fleet": fleet}, opts, ["fleet"], report)


if __name__ == "__main__":
    sys.exit(main())
