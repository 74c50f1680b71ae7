"""The fleet benchmark (issue 15): N floodwall sidecars feeding one capped queue.

``python -m bench.fleet [--cases 1:max,4:max,8:max,8:1000] [--seconds 10]
[--variant NAME:ROOT:ARGS ...] [--rounds R] [--out FILE]``

Starts one private RabbitMQ and the largest N of the cases' floodwall processes (JSON logs,
uvloop, one policy: ``fleet.*`` capped at 1 MiB, resume 512 KiB), then for each case
``N:RATE`` (RATE msg/s per producer, ``max``: as fast as the socket takes them):

- a fresh queue ``fleet.<id>``, declared straight on the broker; the case waits until each
  of its N sidecars polices it (topology events);
- one *bare* producer per sidecar (``bench.flow.raw_producer``'s kind: pre-encoded 1 KiB
  publishes, no confirms, Channel.Flow never read: the proxy must hold what it sends), the
  body's first two bytes its producer number;
- one consumer straight on the broker, prefetch 20, acking ``--consumer-rate`` msg/s;
- the broker-side depth: a passive declare on a direct connection every 20 ms, plus the
  consumer's unacked messages, times 1 KiB; the peak is reported (and the management API's
  ``message_bytes`` every 250 ms as a coarse cross-check).

After ``--seconds`` the producers stop writing (their connections stay open, so what the
sidecars hold is released, not dropped), the consumer acks as fast as it can until it has
every message that was written (or ``--drain-timeout``): delivered vs sent, nothing lost.
Fairness: Jain's index of the producers' delivered counts in the second half of the window
(the queue held at capacity), ``(sum x)^2 / (n sum x^2)``; 1.0 is perfectly even.

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
import shlex
import struct
import sys
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import amqp091, relay
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
from floodwall.dev.devproxy import ProxyProcess

SIZE = 1024
CAPACITY = MIB
_ID = struct.Struct(">H")


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


async def sample_depth(st: Stack, queue: str, consumer: Consumer, trace: Trace,
                       stop: asyncio.Event, t0: float) -> None:
    sampler = await amqp091.connect(st.endpoint.host, st.endpoint.amqp_port)
    try:
        while not stop.is_set():
            ready = await sampler.declare(queue, passive=True)
            depth = (ready + consumer.unacked) * SIZE
            trace.samples += 1
            if depth > trace.max_bytes:
                trace.max_bytes, trace.max_at = depth, time.perf_counter() - t0
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


async def run_case(st: Stack, sidecars: list[ProxyProcess], rate: float,
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
    stop_producing, stop_sampling, gone = asyncio.Event(), asyncio.Event(), asyncio.Event()
    stop_consuming = asyncio.Event()
    sent: dict[int, int] = {}
    trace = Trace()
    t0 = time.perf_counter()
    consuming = asyncio.create_task(consumer.run(stop_consuming))
    samplers = [asyncio.create_task(sample_depth(st, queue, consumer, trace, stop_sampling, t0)),
                asyncio.create_task(sample_management(st, queue, trace, stop_sampling))]
    producers = [asyncio.create_task(producer(fw.port, queue, i, rate, stop_producing, sent,
                                              gone)) for i, fw in enumerate(sidecars)]
    procs = [psutil.Process(fw.process.pid) for fw in sidecars if fw.process]
    s0 = cpu.snapshot(None)
    side0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    await asyncio.sleep(opts.seconds / 2)
    consumer.mark()
    await asyncio.sleep(opts.seconds / 2)
    stop_producing.set()
    window = {pid: consumer.per_producer.get(pid, 0) - consumer.marks.get(pid, 0)
              for pid in range(n)}
    s1 = cpu.snapshot(None)
    side1 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    total_sent = sum(sent.values())
    consumer.fast()
    drained = True
    try:
        await until(lambda: consumer.delivered >= sum(sent.values()), opts.drain_timeout,
                    "every message delivered", interval=0.1)
    except TimeoutError:
        drained = False
    stop_sampling.set()
    await asyncio.gather(*samplers, return_exceptions=True)
    gone.set()
    errors = [repr(r) for r in await asyncio.gather(*producers, return_exceptions=True)
              if isinstance(r, BaseException)]
    stop_consuming.set()
    await consuming
    await consumer_client.close()
    still_held = [held(fw)["messages"] for fw in sidecars]
    direct = await amqp091.connect(ep.host, ep.amqp_port)
    await direct.delete(queue)
    await direct.close()
    cpu_d = CpuMeter.delta(s0, s1)
    rates = [window[i] / (opts.seconds / 2) for i in range(n)]
    return {
        "sidecars": n, "rate": int(rate) if rate else "max", "queue": queue,
        "capacity": CAPACITY,
        "max_depth_bytes": trace.max_bytes, "max_at_s": round(trace.max_at, 2),
        "overshoot_bytes": trace.max_bytes - CAPACITY,
        "mgmt_max_bytes": trace.mgmt_max_bytes, "samples": trace.samples,
        "sent": total_sent, "delivered": consumer.delivered,
        "lost": total_sent - consumer.delivered, "drained": drained,
        "held_after": still_held,
        "delivered_rates_second_half": [round(r, 1) for r in rates],
        "jain": jain(rates),
        "sidecar_cpu_cores": (side1 - side0) / cpu_d["wall_s"] if cpu_d["wall_s"] else math.nan,
        "other_cores": (max(0.0, cpu_d["other_cpu_s"] - (side1 - side0)) / cpu_d["wall_s"]
                        if cpu_d["wall_s"] else math.nan),
        "errors": errors,
    }


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
    s0 = cpu.snapshot(None)
    c0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    await asyncio.sleep(seconds)
    s1 = cpu.snapshot(None)
    c1 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    in1, out1 = await asyncio.to_thread(_exchange_counts, st)
    d = CpuMeter.delta(s0, s1)
    wall = d["wall_s"]
    return {"seconds": round(wall, 1), "sidecars": len(procs),
            "sidecar_cores_each": (c1 - c0) / wall / max(1, len(procs)),
            "broker_cores": d.get("broker_cpu_s", math.nan) / wall,
            "other_cores": max(0.0, d["other_cpu_s"] - (c1 - c0)) / wall,
            "fleet_in_per_s": round((in1 - in0) / wall, 1),
            "fleet_out_per_s": round((out1 - out0) / wall, 1)}


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


async def start_sidecars(st: Stack, variant: Variant, n: int, policies: Path
                         ) -> list[ProxyProcess]:
    sidecars: list[ProxyProcess] = []
    for i in range(n):
        args = ["--event-loop", "auto", "--log-format", "json", "--policies", str(policies),
                "--management", st.endpoint.management_url, *variant.args]
        proc = ProxyProcess(upstream=st.upstream,
                            logfile=st.workdir / f"{variant.name}-sidecar-{i}.log",
                            extra_args=args, root=variant.root)
        st.proxies.append(proc)
        sidecars.append(proc)
        await asyncio.to_thread(proc.start, 90.0)
    return sidecars


async def one_pass(st: Stack, variant: Variant, policies: Path, opts: argparse.Namespace,
                   progress: Progress, cpu: CpuMeter) -> dict[str, Any]:
    """Start the variant's sidecars, measure the idle cost and every case, stop them."""
    most = max(n for n, _ in opts.cases)
    sidecars = await start_sidecars(st, variant, most, policies)
    try:
        progress(f"== {variant.name}: {most} sidecars up")
        idle = await idle_cost(st, sidecars, opts.idle_seconds, cpu)
        progress(f"   idle {idle['seconds']:g} s: {idle['sidecar_cores_each']:.4f} cores per "
                 f"sidecar, broker {idle['broker_cores']:.3f} cores, fleet exchange "
                 f"{idle['fleet_in_per_s']} in/s, {idle['fleet_out_per_s']} out/s")
        runs = []
        for n, rate in opts.cases:
            res = await run_case(st, sidecars[:n], rate, opts, cpu)
            res["variant"] = variant.name
            runs.append(res)
            progress(f"   {variant.name} {n} x {res['rate']!s:>5} msg/s: peak "
                     f"{res['max_depth_bytes'] / KIB:7.0f} KiB "
                     f"({res['overshoot_bytes'] / KIB:+.0f}), sent {res['sent']}, delivered "
                     f"{res['delivered']}, jain {res['jain']:.3f}, noise "
                     f"{res['other_cores']:.2f}"
                     + (f" ERRORS {res['errors']}" if res["errors"] else ""))
        return {"idle": idle, "runs": runs}
    finally:
        for proc in sidecars:
            await asyncio.to_thread(st.stop_proxy, proc)


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
            "seconds": opts.seconds}


def report(res: dict[str, Any]) -> None:
    meta = res["meta"]
    print(f"\nbench.fleet {meta['started']} ({meta['cpus']} cores, load before "
          f"{meta['loadavg_before'][0]:.2f}, RabbitMQ {meta.get('rabbitmq')})")
    f = res["results"].get("fleet")
    if not f:
        return
    print(f"one queue capped at 1 MiB, bare producers (1 KiB, no confirms, one per sidecar), "
          f"consumer {f['consumer_rate']:g} msg/s, {f['seconds']:g} s per case; noise: CPU "
          "of everything else on the machine (sidecars and broker excluded)")
    for v in f["variants"]:
        print(f"  variant {v['name']}: {v['root'] or 'this checkout'} {' '.join(v['args'])}")
    print(f"  {'variant':<8}{'round':>6}{'sidecars':>9}{'rate':>6}{'peak':>10}{'over cap':>11}"
          f"{'sent':>8}{'delivered':>10}{'lost':>5}{'jain':>7}{'sidecar cores':>14}"
          f"{'noise':>7}")
    for p in f["passes"]:
        i = p["idle"]
        print(f"  {p['variant']:<8}{p['round']:>6}  idle: {i['sidecar_cores_each']:.4f} cores "
              f"per sidecar ({i['sidecars']}), broker {i['broker_cores']:.3f} cores, fleet "
              f"exchange {i['fleet_in_per_s']:g} publishes/s in, {i['fleet_out_per_s']:g} "
              f"deliveries/s out, noise {i['other_cores']:.2f}")
        for r in p["runs"]:
            print(f"  {p['variant']:<8}{p['round']:>6}{r['sidecars']:>9}{r['rate']!s:>6}"
                  f"{r['max_depth_bytes'] / KIB:>6.0f} KiB{r['overshoot_bytes'] / KIB:>+7.0f} KiB"
                  f"{r['sent']:>8}{r['delivered']:>10}{r['lost']:>5}{r['jain']:>7.3f}"
                  f"{r['sidecar_cpu_cores']:>14.2f}{r['other_cores']:>7.2f}"
                  + (f"  errors: {r['errors']}" if r["errors"] else ""))


def parse_case(text: str) -> tuple[int, float]:
    n, _, rate = text.partition(":")
    return int(n), 0.0 if rate in ("", "max") else float(rate)


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
    a = p.parse_args(argv)
    a.cases = [parse_case(c) for c in a.cases.split(",") if c]
    a.variants = a.variants or [Variant("this")]
    return a


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_main("fleet", argv, {"fleet": fleet}, opts, ["fleet"], report)


if __name__ == "__main__":
    sys.exit(main())
