"""Held producers at their consumers' pace.

``python -m bench.pace [--rounds 2] [--messages 20000] [--out FILE]``

One private RabbitMQ, one ``floodwall run`` with three policies, then:

- **pace**: 20,000 x 1 KiB from a producer through the proxy (raw 0-9-1 frames, no confirms,
  as fast as the socket takes them), one pika consumer straight at the broker (prefetch 200,
  an ack per message, in a process of its own), against queues whose policies say capacity
  1 GiB (never trips), 1 MiB and 256 KiB; the three side by side, ``--rounds`` times in turn.
  Reports the consumed rate (first to last delivery), its ratio to the 1 GiB run of the same
  round, the broker-side depth (a passive declare on a direct connection every ~5 ms: ready
  messages, what a capacity counts) above the capacity, how often the queue was found empty
  while the consumer consumed (the held queue not keeping its consumer busy), the proxy's
  view while held (/state every 250 ms: sampling interval, drain, admitted rate, enqueue
  lag) and the CPU seconds the broker and the proxy spent over the run.
- ``--capacities 1GiB,32KiB``: other capacities (the first the unpoliced reference, the last
  the stopped run's): a small one shows the admission's ceiling with a consumer far below the
  target's 18,000 msg/s (a loaded machine's).
- **stopped**: the same at 256 KiB, but the consumer stops dead (no more acks) after 5,000
  messages while the producer goes on at full speed; the ready messages above capacity
  after the stop (the 200 unacknowledged are the consumer's, on top).
- ``--base DIR``: the pace and stopped runs also through ``floodwall run`` from the checkout
  DIR (an older main, say), alternated with this one's, capacity by capacity.
- **cpu**: the broker's CPU with one queue held (no consumer, the producer held behind it)
  for 3 s, by the proxy's ``--hot-interval`` (1, 2, 5 ms) and with the hot schedule off
  (``--hot-interval 200ms``, the slow interval): the difference is what fast sampling costs
  per tripped queue.

The machine is small and shared: compare figures of one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import psutil

from bench import amqp091
from bench.flow import (
    KIB,
    MIB,
    Stack,
    metric_sum,
    policy_entry,
    queue_state,
    stack,
    tripped,
    write_policies,
)
from bench.meters import cpu_seconds
from bench.relay import beam_of, parse_releases
from floodwall.dev.devbroker import release_named
from floodwall.dev.devproxy import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
PREFETCH = 200
SIZE = 1024
CAPACITIES = {"1GiB": 1024 * MIB, "1MiB": MIB, "256KiB": 256 * KIB}


def size_of(label: str) -> int:
    """Bytes of a capacity label (``32KiB``, ``1MiB``, ``1GiB``)."""
    for unit, size in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", KIB)):
        if label.endswith(unit):
            return int(label[:-len(unit)]) * size
    return int(label)


def consume(host: str, port: int, queue: str, total: int, stop_after: int,
            out: Any) -> None:
    """A pika consumer (a process of its own): prefetch 200, an ack per message; stops dead
    (no more acks, the connection left open) after ``stop_after`` messages when set."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    got, first, last = 0, None, None
    for method, _props, _body in ch.consume(queue, inactivity_timeout=30):
        if method is None:
            break
        got += 1
        last = time.monotonic()
        if first is None:
            first = last
        if stop_after and got >= stop_after:
            out.send({"stopped_at": time.monotonic(), "got": got})
            time.sleep(3600)
        ch.basic_ack(method.delivery_tag)
        if got >= total:
            break
    out.send({"first": first, "last": last, "got": got})
    with contextlib.suppress(Exception):
        conn.close()


class BrokerDepth(threading.Thread):
    """Ready count of ``queue`` by a passive declare on a direct connection, every ~5 ms."""

    def __init__(self, host: str, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.queue = host, port, queue
        self.samples: list[tuple[float, int]] = []
        self.rtts: list[tuple[float, float]] = []  # (asked at, round trip): the control
        self.halt = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters(self.host, self.port))
        ch = conn.channel()
        while not self.halt.is_set():
            asked = time.monotonic()
            ok = ch.queue_declare(self.queue, passive=True)
            now = time.monotonic()
            self.samples.append((now, int(ok.method.message_count)))
            self.rtts.append((asked, now - asked))
            time.sleep(0.005)
        conn.close()

    def round_trips(self, start: float, end: float) -> dict[str, float | None]:
        """This connection's passive declares between ``start`` and ``end``: median, 90th and
        99th percentile round trip (seconds), the control for the proxy's counts (the same
        declare of the same queue, from another process, at the same time)."""
        rs = sorted(r for t, r in self.rtts if start <= t <= end)
        def at(p: float) -> float | None:
            return round(rs[min(len(rs) - 1, int(len(rs) * p))], 5) if rs else None
        return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}

    def max_ready(self, since: float = 0.0) -> int:
        return max((n for t, n in self.samples if t >= since), default=0)

    def peak_at(self, since: float) -> float | None:
        """Seconds from ``since`` to the first count that found the most ready (None: no
        count): near 0, the flood before the first trip; later, the held queue's admission."""
        after = [(t, n) for t, n in self.samples if t >= since]
        if not after:
            return None
        most = max(n for _, n in after)
        return round(next(t for t, n in after if n == most) - since, 3)

    def ready_between(self, start: float, end: float) -> dict[str, Any]:
        """How full the queue was while the consumer consumed: the share of counts that
        found it empty (nothing ready: the consumer can only take what it already has)
        and the median ready count."""
        ns = sorted(n for t, n in self.samples if start <= t <= end)
        if not ns:
            return {"counts": 0}
        return {"counts": len(ns), "empty": round(sum(1 for n in ns if n == 0) / len(ns), 3),
                "median_ready": ns[len(ns) // 2]}


async def produce(host: str, port: int, queue: str, count: int) -> float:
    """``count`` publishes through the proxy as fast as the socket takes them; the seconds
    the writes took (the proxy stops reading while it holds its budget)."""
    client = await amqp091.connect(host, port)
    one = amqp091.publish_frames(queue, b"\xab" * SIZE)
    start, sent, cancelled = time.monotonic(), 0, False
    try:
        while sent < count and not client.lost.done():
            if client.paused:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.writable(), 0.1)
                continue
            n = min(64, count - sent)
            client.write(one * n)
            sent += n
            await asyncio.sleep(0)
        return time.monotonic() - start
    except asyncio.CancelledError:
        client.abort()  # (stopped: what the proxy holds is never meant to go)
        cancelled = True
        raise
    finally:
        # what the socket has not taken yet would be lost by the abort: wait for it
        for _ in range(0 if cancelled else 2400):  # 120 s at most
            if client.transport is None or client.lost.done() \
                    or not client.transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.05)
        if not cancelled:
            await asyncio.sleep(0.5)
            client.abort()


def declare(st: Stack, queue: str, delete: bool = False) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters(
            st.endpoint.host, st.endpoint.amqp_port)) as conn:
        ch = conn.channel()
        if delete:
            ch.queue_delete(queue)
        else:
            ch.queue_declare(queue)


async def wait_policed(fw: Any, queue: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        q = await asyncio.to_thread(queue_state, fw, queue)
        if q and q["depth"]["estimate"] is not None:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{queue} not policed")


async def wait_source(fw: Any, queue: str, timeout: float = 30.0) -> str:
    """The queue's depth source once the proxy has had the broker's figures of it (its
    first slow sample: ``--management-interval``, 5 s by default)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = await asyncio.to_thread(queue_state, fw, queue)
        if q and q["depth"]["source"]:
            return str(q["depth"]["source"])
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{queue}: no broker figures (management or Prometheus) in {timeout:g} s")


async def poll_state(fw: Any, queue: str, seen: list[dict[str, Any]]) -> None:
    """The proxy's /state of ``queue`` every 250 ms (sampling interval, drain, admitted)."""
    while True:
        with contextlib.suppress(Exception):
            q = await asyncio.to_thread(queue_state, fw, queue)
            if q:
                seen.append(q)
        await asyncio.sleep(0.25)


def depth_source(seen: list[dict[str, Any]]) -> str | None:
    """Where the proxy's broker figures of the queue came from (``management`` or
    ``prometheus``), by its last /state sample that says."""
    sources = [q["depth"]["source"] for q in seen if q["depth"].get("source")]
    return sources[-1] if sources else None


def held_pace(seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, over the /state samples taken while the queue was tripped, of its sampling
    interval, drain rate and admitted rate (bytes/s)."""
    held = [q for q in seen if q["tripped"]]
    def med(k: str) -> float | None:
        vals = sorted(q[k] for q in held if q.get(k) is not None)
        return vals[len(vals) // 2] if vals else None
    return {"samples_tripped": len(held), "samples": len(seen),
            "sampling_interval": med("sampling_interval"),
            "drain_rate_bytes": med("drain_rate_bytes"),
            "admitted_rate_bytes": med("admitted_rate_bytes"),
            "enqueue_lag": med("enqueue_lag"),
            "rtt_high": med("rtt_high"),
            "count_rtt": med("count_rtt"),
            "trips": seen[-1]["trips"] if seen else None}


async def one_run(st: Stack, fw: Any, queue: str, capacity: int, messages: int,
                  stop_after: int = 0) -> dict[str, Any]:
    declare(st, queue)
    await wait_policed(fw, queue)
    # the run starts once the proxy has had the broker's figures of the queue, from the
    # source its statistics setting gives (management or Prometheus): the depth it polices
    # by is then that source's, as on a queue policed for longer than a run lasts
    await wait_source(fw, queue)
    ep = st.endpoint
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    consumer = ctx.Process(target=consume, args=(ep.host, ep.amqp_port, queue, messages,
                                                 stop_after, theirs), daemon=True)
    consumer.start()
    watch = BrokerDepth(ep.host, ep.amqp_port, queue)
    watch.start()
    beam, proxy = beam_of(st.broker), fw.process and psutil.Process(fw.process.pid)
    cpu0 = cpu_seconds(beam), cpu_seconds(proxy)
    await asyncio.sleep(0.3)  # the consumer is up
    began = time.monotonic()
    producer = asyncio.ensure_future(produce("127.0.0.1", fw.port, queue, messages))
    seen: list[dict[str, Any]] = []
    poller = asyncio.ensure_future(poll_state(fw, queue, seen))
    result: dict[str, Any] = {"capacity": capacity}
    try:
        if stop_after:
            doc = await asyncio.to_thread(mine.recv)
            stopped = doc["stopped_at"]
            await asyncio.sleep(3.0)  # the producer at full speed, nobody consuming
            state = await asyncio.to_thread(queue_state, fw, queue)
            result.update(stopped_after=doc["got"],
                          max_ready_after_stop=watch.max_ready(stopped),
                          tripped=bool(state and state["tripped"]),
                          depth_source=state and state["depth"]["source"],
                          over_capacity_bytes=watch.max_ready(stopped) * SIZE - capacity)
        else:
            doc = await asyncio.to_thread(mine.recv)
            await producer
            secs = doc["last"] - doc["first"]
            cpu1 = cpu_seconds(beam), cpu_seconds(proxy)
            ready = watch.max_ready()
            result.update(consumed=doc["got"], seconds=round(secs, 3),
                          rate=round((doc["got"] - 1) / secs, 1) if secs > 0 else None,
                          max_ready=ready,
                          ready=watch.ready_between(doc["first"], doc["last"]),
                          control_rtt=watch.round_trips(doc["first"], doc["last"]),
                          over_capacity_bytes=ready * SIZE - capacity,
                          peak_at_s=watch.peak_at(began),
                          held=held_pace(seen),
                          depth_source=depth_source(seen),
                          cpu_seconds={"broker": round(cpu1[0] - cpu0[0], 2),
                                       "proxy": round(cpu1[1] - cpu0[1], 2)})
    finally:
        watch.halt.set()
        poller.cancel()
        producer.cancel()
        with contextlib.suppress(BaseException):
            await producer
        consumer.kill()
        consumer.join(5)
        await asyncio.to_thread(declare, st, queue, True)
    return result


@dataclass
class PaceRig:
    """The pace scenario's proxies on one broker and the queue names of its capacities."""

    st: Stack
    capacities: dict[str, int]
    names: dict[str, str]
    proxies: dict[str, ProxyProcess]


def pace_rig(st: Stack, opts: argparse.Namespace) -> PaceRig:
    """This checkout's proxy (``new``) and, with ``--base``, the other one's, on ``st``."""
    capacities = {label: size_of(label) for label in opts.capacities}
    names = {label: f"pace-{label}-{uuid.uuid4().hex[:6]}" for label in capacities}
    proxies = {"new": st.floodwall("pace", variant_policies(st, names, capacities, "new"),
                                   extra=("--fleet", "off"))}
    if opts.base is not None:  # the same scenario through another checkout, side by side
        proxies["base"] = base_floodwall(st, opts.base,
                                         variant_policies(st, names, capacities, "base"))
    return PaceRig(st, capacities, names, proxies)


async def pace_round(rig: PaceRig, r: int, opts: argparse.Namespace,
                     progress: Any) -> dict[str, Any]:
    """Round ``r``: every capacity through every proxy in turn; rates against the first
    capacity's (the unpoliced run: 1 GiB never trips) through the same proxy."""
    row: dict[str, Any] = {}
    for label, cap in rig.capacities.items():
        for variant, fw in rig.proxies.items():
            q = f"{rig.names[label]}-{variant}{r}"
            row[f"{variant} {label}"] = res = await one_run(rig.st, fw, q, cap, opts.messages)
            progress(f"round {r} {variant} {label}: {res}")
    reference = opts.capacities[0]
    for variant in rig.proxies:
        base = row[f"{variant} {reference}"].get("rate")
        for label in rig.capacities:
            rate = row[f"{variant} {label}"].get("rate")
            row[f"{variant} {label}"]["ratio"] = (round(rate / base, 3)
                                                  if rate and base else None)
    return row


async def pace_stopped(rig: PaceRig, opts: argparse.Namespace,
                       progress: Any) -> dict[str, Any]:
    """The stopped consumer at the last capacity through every proxy; the proxies stopped."""
    stopped = {}
    last = opts.capacities[-1]  # 256 KiB by default
    for variant, fw in rig.proxies.items():
        stopped[variant] = await one_run(rig.st, fw, f"{rig.names[last]}-{variant}stop",
                                         rig.capacities[last], opts.messages, stop_after=5000)
        progress(f"stopped {variant}: {stopped[variant]}")
    for fw in rig.proxies.values():
        rig.st.stop_proxy(fw)
    return stopped


async def pace(st: Stack, opts: argparse.Namespace, progress: Any) -> dict[str, Any]:
    rig = pace_rig(st, opts)
    rounds = [await pace_round(rig, r, opts, progress) for r in range(opts.rounds)]
    return {"rounds": rounds, "stopped": await pace_stopped(rig, opts, progress)}


async def pace_side_by_side(stacks: dict[str, Stack], opts: argparse.Namespace,
                            progress: Any) -> dict[str, dict[str, Any]]:
    """The pace scenario on every configuration, alternated: each round on every broker in
    turn, then the stopped consumer on each."""
    rigs = {cfg: pace_rig(st, opts) for cfg, st in stacks.items()}
    out: dict[str, dict[str, Any]] = {cfg: {"rounds": []} for cfg in stacks}
    for r in range(opts.rounds):
        for cfg, rig in rigs.items():
            out[cfg]["rounds"].append(await pace_round(
                rig, r, opts, lambda m, cfg=cfg: progress(f"{cfg}: {m}")))
    for cfg, rig in rigs.items():
        out[cfg]["stopped"] = await pace_stopped(rig, opts,
                                                 lambda m, cfg=cfg: progress(f"{cfg}: {m}"))
    return out


def variant_policies(st: Stack, names: dict[str, str], capacities: dict[str, int],
                     variant: str) -> Path:
    """The policies of one proxy of a side-by-side run: its own queues only
    (``NAME-VARIANT*``). Each proxy is a sidecar of its own (``--fleet off``): two sidecars
    policing the same queues on one broker would otherwise form a fleet and share each
    queue's room, the idle one counting the other's queue too."""
    entries = [policy_entry(f"p{label}", f"{names[label]}-{variant}*", label, label)
               for label in capacities]
    return write_policies(st.workdir / f"pace-{variant}.yaml", *entries)


def base_floodwall(st: Stack, root: Path, policies: Path) -> ProxyProcess:
    """``floodwall run`` from another checkout (``--base``: an older main, say)."""
    proc = ProxyProcess(upstream=st.upstream, logfile=st.workdir / "base.log",
                        extra_args=["--event-loop", "auto", "--log-format", "json",
                                    "--fleet", "off",
                                    "--policies", str(policies),
                                    "--management", st.endpoint.management_url,
                                    *([] if st.statistics else [
                                        "--prometheus",
                                        f"http://127.0.0.1:{st.broker.prometheus_port}"])],
                        root=root.resolve())
    proc.start()
    st.proxies.append(proc)
    return proc


#: ``--hot-interval`` of the cpu scenario; the first is the slow interval (the hot schedule off)
HOT_INTERVALS = ("200ms", "5ms", "2ms", "1ms")


async def cpu_one(st: Stack, label: str, opts: argparse.Namespace) -> dict[str, Any]:
    """The broker's cores over ``--cpu-seconds`` with one queue held by a proxy at
    ``--hot-interval label``, the proxy's depth counts per second, and where its broker
    figures of the queue came from (``depth_source``: management or prometheus)."""
    beam = beam_of(st.broker)
    name = f"cpu-{label}-{uuid.uuid4().hex[:6]}"
    policies = write_policies(st.workdir / f"cpu-{label}.yaml",
                              policy_entry("cpu", name, "256KiB", "128KiB"))
    fw = st.floodwall(f"cpu-{label}", policies, ("--hot-interval", label))
    try:
        declare(st, name)
        await wait_policed(fw, name)
        producer = asyncio.ensure_future(produce("127.0.0.1", fw.port, name, 2000))
        deadline = time.monotonic() + 20
        while not await asyncio.to_thread(tripped, fw, name):
            if time.monotonic() > deadline:
                raise TimeoutError("not tripped")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await wait_source(fw, name)
        before_probes = await asyncio.to_thread(
            metric_sum, fw, "floodwall_queue_depth_samples_total")
        c0, t0 = cpu_seconds(beam), time.monotonic()
        await asyncio.sleep(opts.cpu_seconds)
        c1, t1 = cpu_seconds(beam), time.monotonic()
        after_probes = await asyncio.to_thread(
            metric_sum, fw, "floodwall_queue_depth_samples_total")
        state = await asyncio.to_thread(queue_state, fw, name)
        producer.cancel()
        with contextlib.suppress(BaseException):
            await producer
        return {"broker_cores": round((c1 - c0) / (t1 - t0), 4),
                "counts_per_s": round((after_probes - before_probes) / (t1 - t0), 1),
                "depth_source": state and state["depth"]["source"]}
    finally:
        st.stop_proxy(fw)
        with contextlib.suppress(Exception):
            declare(st, name, True)


def added_cores(out: dict[str, Any]) -> dict[str, Any]:
    """Each hot interval's broker cores above the slow interval's (the first's)."""
    base = out[HOT_INTERVALS[0]]["broker_cores"]
    for label in HOT_INTERVALS[1:]:
        out[label]["added_cores"] = round(out[label]["broker_cores"] - base, 4)
    return out


async def cpu(st: Stack, opts: argparse.Namespace, progress: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in HOT_INTERVALS:
        out[label] = await cpu_one(st, label, opts)
        progress(f"cpu {label}: {out[label]}")
    return added_cores(out)


async def cpu_side_by_side(stacks: dict[str, Stack], opts: argparse.Namespace,
                           progress: Any) -> dict[str, dict[str, Any]]:
    """The cpu scenario on every configuration, alternated: each hot interval on each
    broker in turn (the brokers all up), so that drifting noise falls on all alike."""
    out: dict[str, dict[str, Any]] = {cfg: {} for cfg in stacks}
    for label in HOT_INTERVALS:
        for cfg, st in stacks.items():
            out[cfg][label] = await cpu_one(st, label, opts)
            progress(f"cpu {cfg} {label}: {out[cfg][label]}")
    return {cfg: added_cores(o) for cfg, o in out.items()}


SCENARIOS = {"pace": pace, "cpu": cpu}
SIDE_BY_SIDE = {"pace": pace_side_by_side, "cpu": cpu_side_by_side}


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def report(doc: dict[str, Any]) -> None:
    res = doc["results"]
    if "pace" in res:
        print("\n| round | capacity | consumed msg/s | ratio to the first | max ready "
              "(over capacity), peak s after the start | found empty | median ready | "
              "held: admitted / drain MB/s, "
              "lag ms, rtt_high ms | count rtt ms: proxy median / control p50, p99 "
              "| CPU s broker / proxy |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for i, row in enumerate(res["pace"]["rounds"]):
            for label, r in row.items():
                ready, held, cpu = r.get("ready", {}), r.get("held", {}), r.get("cpu_seconds", {})
                over = r.get("over_capacity_bytes", 0) / KIB
                pace = "-"
                if held.get("admitted_rate_bytes") is not None:
                    pace = (f"{held['admitted_rate_bytes'] / 1e6:.2f} / "
                            f"{(held.get('drain_rate_bytes') or 0) / 1e6:.2f}, "
                            f"{(held.get('enqueue_lag') or 0) * 1000:.0f}, "
                            f"{(held.get('rtt_high') or 0) * 1000:.0f}")
                ctl, own = r.get("control_rtt") or {}, held.get("count_rtt")
                rtts = (f"{'-' if own is None else f'{own * 1000:.1f}'} / "
                        f"{ms(ctl.get('p50'))}, {ms(ctl.get('p99'))}")
                print(f"| {i} | {label} | {r.get('rate')} | {r.get('ratio')} | "
                      f"{r.get('max_ready')} ({over:.0f} KiB), {r.get('peak_at_s')} | "
                      f"{ready.get('empty')} | "
                      f"{ready.get('median_ready')} | {pace} | {rtts} | "
                      f"{cpu.get('broker')} / {cpu.get('proxy')} |")
        for variant, s in res["pace"]["stopped"].items():
            print(f"\nstopped consumer ({s.get('capacity', 0) // KIB} KiB, {variant}): max ready "
                  "after the stop "
                  f"{s.get('max_ready_after_stop')}, ready over capacity "
                  f"{s.get('over_capacity_bytes', 0) / KIB:.0f} KiB, still tripped "
                  f"{s.get('tripped')}")
    if "cpu" in res:
        print("\n| --hot-interval | broker cores | added per tripped queue | counts/s "
              "| depth source |")
        print("|---|---|---|---|---|")
        for label, r in res["cpu"].items():
            if isinstance(r, dict):
                print(f"| {label} | {r['broker_cores']} | {r.get('added_cores', '-')} | "
                      f"{r['counts_per_s']} | {r.get('depth_source')} |")


STATISTICS = {"on": (True,), "off": (False,), "both": (True, False)}


def configurations(releases: tuple[str, ...], statistics: str
                   ) -> dict[str, tuple[str, bool]]:
    """Label -> (release, management statistics on) of each broker of the run: the release
    alone when statistics are on throughout, else with ``stats on`` / ``stats off``."""
    out: dict[str, tuple[str, bool]] = {}
    for release in releases:
        for on in STATISTICS[statistics]:
            label = release if statistics == "on" else f"{release} stats {'on' if on else 'off'}"
            out[label] = (release, on)
    return out


def expected_source(statistics_on: bool) -> str:
    """Where floodwall must read depth from: management with statistics on, else the
    broker's Prometheus endpoint."""
    return "management" if statistics_on else "prometheus"


def wrong_sources(results: dict[str, Any], statistics_on: bool) -> list[str]:
    """Every run whose proxy read depth from another source than the configuration's (a
    figure that measured the wrong path): ``scenario what: source``."""
    want, bad = expected_source(statistics_on), []
    runs: list[tuple[str, dict[str, Any]]] = []
    for i, row in enumerate(results.get("pace", {}).get("rounds", [])):
        runs += [(f"pace round {i} {k}", r) for k, r in row.items()]
    runs += [(f"pace stopped {k}", r)
             for k, r in results.get("pace", {}).get("stopped", {}).items()]
    runs += [(f"cpu {k}", r) for k, r in results.get("cpu", {}).items() if isinstance(r, dict)]
    for what, r in runs:
        if r.get("depth_source") != want:
            bad.append(f"{what}: {r.get('depth_source')} (expected {want})")
    return bad


def _cell(r: dict[str, Any] | None) -> str:
    if not r:
        return "-"
    over = (r.get("over_capacity_bytes") or 0) / KIB
    return f"{r.get('rate')} ({r.get('ratio')}), {over:.0f} KiB, {r.get('depth_source')}"


def side_by_side_lines(doc: dict[str, Any]) -> list[str]:
    """The tables of a run over several configurations (releases, statistics on / off):
    a column per configuration; ratios are within a configuration."""
    configs: dict[str, Any] = doc["meta"]["configurations"]
    res: dict[str, dict[str, Any]] = doc["results"]
    names = list(configs)
    head = " | ".join(f"{n} ({configs[n].get('rabbitmq') or '?'})" for n in names)
    lines: list[str] = []
    if any("pace" in res[n] for n in names):
        lines += ["\npace: consumed msg/s (ratio to the first capacity), max ready over "
                  "capacity, the proxy's depth source",
                  f"| round | capacity | {head} |", "|---|---|" + "---|" * len(names)]
        rounds = max(len(res[n].get("pace", {}).get("rounds", [])) for n in names)
        for i in range(rounds):
            keys = dict.fromkeys(k for n in names
                                 for row in res[n].get("pace", {}).get("rounds", [])[i:i + 1]
                                 for k in row)
            for k in keys:
                cells = []
                for n in names:
                    got = res[n].get("pace", {}).get("rounds", [])
                    cells.append(_cell(got[i].get(k) if i < len(got) else None))
                lines.append(f"| {i} | {k} | " + " | ".join(cells) + " |")
        stopped = dict.fromkeys(k for n in names for k in res[n].get("pace", {}).get(
            "stopped", {}))
        for k in stopped:
            cells = []
            for n in names:
                st = res[n].get("pace", {}).get("stopped", {}).get(k)
                cells.append("-" if not st else
                             f"{(st.get('over_capacity_bytes') or 0) / KIB:.0f} KiB, tripped "
                             f"{st.get('tripped')}, {st.get('depth_source')}")
            lines.append(f"| stopped | {k} | " + " | ".join(cells) + " |")
    if any("cpu" in res[n] for n in names):
        lines += ["\ncpu: broker cores with one queue held; added per tripped queue (above "
                  f"--hot-interval {HOT_INTERVALS[0]} on the same broker); the proxy's depth "
                  "counts/s; its depth source",
                  f"| --hot-interval | {head} |", "|---|" + "---|" * len(names)]
        for label in HOT_INTERVALS:
            cells = []
            for n in names:
                r = res[n].get("cpu", {}).get(label)
                cells.append("-" if not r else
                             f"{r['broker_cores']} / {r.get('added_cores', '-')} / "
                             f"{r['counts_per_s']} / {r.get('depth_source')}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _run_one(st: Stack, opts: argparse.Namespace, progress: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in opts.scenarios:
        progress(f"== {name}")
        results[name] = asyncio.run(SCENARIOS[name](st, opts, progress))
    return results


def _run_side_by_side(stacks: dict[str, Stack], opts: argparse.Namespace,
                      progress: Any) -> dict[str, dict[str, Any]]:
    """Each scenario alternated over the configurations (``SIDE_BY_SIDE``)."""
    results: dict[str, dict[str, Any]] = {cfg: {} for cfg in stacks}
    for name in opts.scenarios:
        progress(f"== {name}, alternated over " + ", ".join(stacks))
        for cfg, r in asyncio.run(SIDE_BY_SIDE[name](stacks, opts, progress)).items():
            results[cfg][name] = r
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.pace")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--cpu-seconds", type=float, default=3.0)
    p.add_argument("--scenarios", type=lambda s: s.split(","), default=["pace", "cpu"])
    p.add_argument("--capacities", type=lambda s: s.split(","), default=list(CAPACITIES),
                   help="policy capacities, comma-separated: the first is the unpoliced "
                        "reference, the last the stopped consumer's (default 1GiB,1MiB,256KiB)")
    p.add_argument("--broker", type=parse_releases, default=("3.10",),
                   help="the RabbitMQ release, or a comma list (3.10,4.0): a broker each, "
                        "reported side by side (default 3.10)")
    p.add_argument("--statistics", choices=tuple(STATISTICS), default="on",
                   help="the brokers' management statistics: on (floodwall reads depth from "
                        "the management API), off (management_agent.disable_metrics_collector:"
                        " from the Prometheus endpoint), both (a broker of each, side by "
                        "side; default on)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--base", type=Path, default=None,
                   help="another checkout (e.g. an older main) run side by side")
    opts = p.parse_args(argv)
    for name in opts.scenarios:
        if name not in SCENARIOS:
            p.error(f"unknown scenario {name!r}: expected {', '.join(SCENARIOS)}")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out = opts.out or REPO / "bench" / "out" / f"pace-{started:%Y%m%d-%H%M%S}.json"
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker is stopped on exit
    configs = configurations(opts.broker, opts.statistics)
    meta: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"), "loadavg": os.getloadavg(),
        "command": "python -m bench.pace " + " ".join(sys.argv[1:] if argv is None else argv)}
    with contextlib.ExitStack() as brokers:
        stacks = {cfg: brokers.enter_context(stack(progress, release_named(release), on))
                  for cfg, (release, on) in configs.items()}
        if len(stacks) == 1:
            (cfg, (release, on)), = configs.items()
            meta |= {"broker": release, "statistics": "on" if on else "off",
                     "rabbitmq": _version(stacks[cfg])}
            results: dict[str, Any] = _run_one(stacks[cfg], opts, progress)
            wrong = wrong_sources(results, on)
        else:
            meta["configurations"] = {
                cfg: {"broker": release, "statistics": "on" if on else "off",
                      "rabbitmq": _version(stacks[cfg])}
                for cfg, (release, on) in configs.items()}
            results = _run_side_by_side(stacks, opts, progress)
            wrong = [f"{cfg}: {w}" for cfg, (_, on) in configs.items()
                     for w in wrong_sources(results[cfg], on)]
    meta["loadavg_after"] = os.getloadavg()
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    meta["wrong_depth_source"] = wrong
    doc = {"meta": meta, "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    if len(configs) == 1:
        report(doc)
    else:
        print("\n".join(side_by_side_lines(doc)))
    for w in wrong:
        print(f"WRONG DEPTH SOURCE, the figure does not measure this configuration: {w}")
    print(f"\nraw figures: {out}")
    return 1 if wrong else 0


def _version(st: Stack) -> str | None:
    with contextlib.suppress(Exception):
        ov = st.endpoint.api("GET", "/api/overview")
        assert isinstance(ov, dict)
        return str(ov.get("rabbitmq_version"))
    return None


if __name__ == "__main__":
    raise SystemExit(main())
