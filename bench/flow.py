"""Flow-control benchmarks: what policies cost, how far a queue overshoots, how fast a trip
holds publishers, and how much the management API is asked (the flow control's targets).

``python -m bench.flow [--scenarios throughput,overshoot,trip,management] [--out FILE]``

Starts one private RabbitMQ and the floodwall processes each scenario needs (JSON logs,
uvloop, default flow settings), then:

- **throughput**: the 1 KiB firehoses of ``bench.relay`` (0-9-1 with confirms, AMQP 1.0
  with accepted dispositions) alternated over four targets: direct, floodwall without
  policies, floodwall with policies that police the firehose's own queue (capacity far
  above anything it reaches: nothing trips), and the plain byte pump. Target: policed
  floodwall >= 0.90 of direct.
- **overshoot**: a producer through floodwall at a capped queue with a slow consumer
  (straight to the broker); broker-side depth sampled every 20 ms by a passive declare on a
  direct connection (plus the consumer's unacknowledged count), and by the management API
  every 250 ms. Reports max depth - capacity per producer kind and rate, per capacity.
  Target: <= 256 KiB.
- **trip**: paced publishers on three channels (two on one connection) feed one capped
  queue; time from the proxy's ``queue_tripped`` log line to each channel's
  ``publisher_held`` line, cross-checked from the broker's side (what was forwarded, with
  send stamps). Target: <= 10 ms.
- **management**: ``floodwall_management_requests_total`` per minute with 1 and with 100
  idle client connections, alternated. Target: independent of the connection count.

See bench/README.md ("Flow-control benchmarks") for the method and its limits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands

from bench import amqp091, relay
from bench.meters import CpuMeter, median
from floodwall.dev.devbroker import (
    HOST_RELEASE,
    BrokerEndpoint,
    BrokerRelease,
    LocalBroker,
    free_port,
    release_named,
)
from floodwall.dev.devproxy import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
KIB = 1024
MIB = 1024 * KIB
QUIET_CORES = 0.3
Progress = Callable[[str], None]


# -- shared: a broker, floodwall processes, the proxy's state and logs ---------------------
def policy_entry(name: str, queue: str, capacity: str, resume: str, **more: str) -> str:
    """One policy as a YAML flow mapping (deadline 120 s: no run waits that long)."""
    extra = "".join(f", {k}: {v}" for k, v in {"deadline": "120s", **more}.items())
    return (f'{{name: {name}, match: {{queue: "{queue}"}}, capacity: {capacity}, '
            f"resume: {resume}{extra}}}")


def write_policies(path: Path, *entries: str) -> Path:
    path.write_text("version: 1\npolicies:\n" + "".join(f"  - {e}\n" for e in entries))
    return path


@dataclass
class Stack:
    """One private RabbitMQ and the floodwall processes started on it."""

    workdir: Path
    broker: LocalBroker = field(init=False)
    endpoint: BrokerEndpoint = field(init=False)
    proxies: list[ProxyProcess] = field(default_factory=list)
    release: BrokerRelease = HOST_RELEASE  # which RabbitMQ (``--broker 4.0``)
    #: False: the broker's management statistics off
    #: (``management_agent.disable_metrics_collector``); floodwall reads depth from the
    #: broker's Prometheus endpoint (``--prometheus``)
    statistics: bool = True

    def start(self) -> BrokerEndpoint:
        extra = "" if self.statistics else "management_agent.disable_metrics_collector = true\n"
        self.broker = LocalBroker(self.workdir / "rabbit", release=self.release,
                                  config_extra=extra)
        self.endpoint = self.broker.start(timeout=240)
        return self.endpoint

    @property
    def upstream(self) -> str:
        return f"{self.endpoint.host}:{self.endpoint.amqp_port}"

    def floodwall(self, name: str, policies: Path | None = None,
                  extra: tuple[str, ...] = ()) -> ProxyProcess:
        """``floodwall run`` (uvloop, JSON logs); with ``--policies`` and ``--management``
        when given a policies file; defaults for everything else."""
        args = ["--event-loop", "auto", "--log-format", "json", *extra]
        if policies is not None:
            args += ["--policies", str(policies), "--management", self.endpoint.management_url]
            if not self.statistics:
                args += ["--prometheus", f"http://127.0.0.1:{self.broker.prometheus_port}"]
        proc = ProxyProcess(upstream=self.upstream, logfile=self.workdir / f"{name}.log",
                            extra_args=args)
        proc.start()
        self.proxies.append(proc)
        return proc

    def stop_proxy(self, proc: ProxyProcess) -> None:
        proc.stop()
        if proc in self.proxies:
            self.proxies.remove(proc)

    def close(self) -> None:
        for proc in self.proxies:
            proc.stop()
        self.proxies.clear()
        with contextlib.suppress(AttributeError):
            self.broker.stop()


@contextlib.contextmanager
def stack(progress: Progress, release: BrokerRelease = HOST_RELEASE,
          statistics: bool = True) -> Iterator[Stack]:
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-flowbench-"))
    s = Stack(workdir, release=release, statistics=statistics)
    try:
        progress(f"starting RabbitMQ in {workdir}"
                 + ("" if statistics else " (management statistics off)"))
        s.start()
        yield s
    finally:
        s.close()
        shutil.rmtree(workdir, ignore_errors=True)


def queue_state(proc: ProxyProcess, queue: str) -> dict[str, Any] | None:
    flow = proc.state().get("flow") or {}
    assert isinstance(flow, dict)
    for q in flow.get("queues", []):
        if q["queue"] == queue and q["vhost"] == "/":
            return dict(q)
    return None


def policed(proc: ProxyProcess, queue: str) -> bool:
    q = queue_state(proc, queue)
    return bool(q and q["depth"]["estimate"] is not None)


def tripped(proc: ProxyProcess, queue: str) -> bool:
    q = queue_state(proc, queue)
    return bool(q and q["tripped"])


def held(proc: ProxyProcess) -> dict[str, int]:
    flow = proc.state().get("flow") or {}
    assert isinstance(flow, dict)
    return dict(flow.get("held") or {"bytes": 0, "messages": 0})


def blocked_channels(proc: ProxyProcess) -> list[dict[str, Any]]:
    flow = proc.state().get("flow") or {}
    assert isinstance(flow, dict)
    return list(flow.get("blocked_channels") or [])


def metric_sum(proc: ProxyProcess, name: str, **labels: str) -> float:
    """Sum of the /metrics samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in proc.get("/metrics").decode().splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        mname, _, lab = key.partition("{")
        if mname != name:
            continue
        have = dict(part.split("=", 1) for part in lab.rstrip("}").split(",") if "=" in part)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total


def log_events(proc: ProxyProcess, event: str) -> list[dict[str, Any]]:
    """Every JSON log line of ``event`` the proxy wrote so far."""
    out = []
    for line in proc.logfile.read_text(errors="replace").splitlines():
        if f'"{event}"' not in line:
            continue
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if doc.get("event") == event:
                out.append(doc)
    return out


async def until(check: Callable[[], object], timeout: float, what: str,
                interval: float = 0.02) -> None:
    """Poll a blocking ``check`` (HTTP to the proxy) in a thread until it is truthy."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def noise_fit(groups: dict[str, list[tuple[float, float]]]) -> tuple[dict[str, float], float]:
    """``rate = a[group] + b * noise_cores`` by least squares with one common slope, as
    ``bench.relay.noise_adjusted`` (same conditions, any group names): each group's ``a``,
    its rate at zero foreign load, and ``b``; NaNs when the runs do not support a fit."""
    nan = (dict.fromkeys(groups, math.nan), math.nan)
    if not groups or any(len(g) < 2 for g in groups.values()):
        return nan
    xs = [x for g in groups.values() for x, _ in g]
    if max(xs) - min(xs) < 0.3 or max(min(x for x, _ in g) for g in groups.values()) > 0.6:
        return nan
    means = {k: (statistics.fmean(x for x, _ in g), statistics.fmean(y for _, y in g))
             for k, g in groups.items()}
    sxy = sum((x - means[k][0]) * (y - means[k][1]) for k, g in groups.items() for x, y in g)
    sxx = sum((x - means[k][0]) ** 2 for k, g in groups.items() for x, _ in g)
    if sxx <= 0 or sxy / sxx >= 0:
        return nan
    slope = sxy / sxx
    return {k: my - slope * mx for k, (mx, my) in means.items()}, slope


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan


def judge_ratio(fit: float, medians: float, noise: list[float], goal: float
                ) -> tuple[float, str, bool | None]:
    """The figure a ratio goal is judged by (as bench.relay does): the noise-adjusted fit
    when there is one; else the ratio of medians if every run was quiet (<= 0.3 cores of
    noise), or if the noise was so steady (range < 0.3 cores) that every run met the
    same; else none."""
    if not math.isnan(fit):
        return fit, f"noise-adjusted fit (ratio of medians {medians:.3f})", fit >= goal
    if math.isnan(medians) or not noise:
        return math.nan, "not measured", None
    lo, hi = min(noise), max(noise)
    if hi <= QUIET_CORES:
        return medians, "ratio of medians, quiet runs", medians >= goal
    if hi - lo < 0.3:
        return medians, (f"ratio of medians; noise steady at {lo:.2f}-{hi:.2f} cores, alike "
                         "for every run"), medians >= goal
    return math.nan, (f"too noisy for a verdict: no fit, ratio of medians {medians:.3f} "
                      f"with {lo:.2f}-{hi:.2f} cores of noise"), None


def fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def verdict(ok: bool | None) -> str:
    return "met" if ok is True else "NOT MET" if ok is False else "not measured"


def start_pump(upstream: str, logfile: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(logfile, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.pump", "--listen", f"127.0.0.1:{port}",
             "--upstream", upstream], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT)
    relay.wait_port("127.0.0.1", port, proc)
    return proc, port


def stop_pump(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def unique(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


# == (a) relay throughput with policies loaded, nothing tripped ============================
THROUGHPUT_TARGETS = ("direct", "floodwall", "policed", "pump")


async def throughput(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    policies = write_policies(
        st.workdir / "throughput.yaml",
        # the firehoses' own queues: policed, never near capacity (x-max-length 20,000 x 1 KiB)
        policy_entry("firehose", "bench.firehose*", "256MiB", "192MiB"),
        policy_entry("others", "orders.*", "64MiB", "48MiB"),
        policy_entry("more", "billing.*", "16MiB", "8MiB"))
    endpoint = st.endpoint
    control = await amqp091.connect(endpoint.host, endpoint.amqp_port)
    await control.declare(relay.FIREHOSE_QUEUE, {"x-max-length": 20_000})
    await control.declare(relay.FIREHOSE10_QUEUE, {"x-max-length": 20_000})
    await control.bind(relay.FIREHOSE10_QUEUE, "amq.direct", relay.FIREHOSE10_QUEUE)
    plain = st.floodwall("floodwall-plain")
    pol = st.floodwall("floodwall-policed", policies)
    pump, pump_port = start_pump(st.upstream, st.workdir / "pump.log")
    try:
        for q in (relay.FIREHOSE_QUEUE, relay.FIREHOSE10_QUEUE):
            await until(functools.partial(policed, pol, q), 30, f"{q} policed")
        assert plain.process is not None and pol.process is not None
        targets = {
            "direct": relay.Target("direct", endpoint.host, endpoint.amqp_port),
            "floodwall": relay.Target("floodwall", "127.0.0.1", plain.port,
                                      psutil.Process(plain.process.pid)),
            "policed": relay.Target("policed", "127.0.0.1", pol.port,
                                    psutil.Process(pol.process.pid)),
            "pump": relay.Target("pump", "127.0.0.1", pump_port, psutil.Process(pump.pid)),
        }
        ropts = relay.Options(seconds=opts.seconds, warmup=opts.warmup, rounds=opts.rounds,
                              size=1024, quiet_budget=30.0)
        rig = relay.Rig(endpoint, targets, CpuMeter(relay.beam_of(st.broker)), ropts,
                        control=control)
        out: dict[str, Any] = {}
        for scn, fn in (("firehose", relay.firehose091), ("firehose10", relay.firehose10)):
            progress(f"== throughput {scn}")
            runs: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
            for r in range(opts.rounds):
                for name, target in targets.items():
                    quiet = await rig.wait_quiet()
                    try:
                        res = await asyncio.wait_for(fn(rig, target), opts.seconds * 4 + 60)
                    except Exception as exc:  # recorded, the run goes on
                        res = {"error": f"{type(exc).__name__}: {exc}"}
                    res.update(quiet, round=r)
                    if "other_cpu_s" in res:
                        res["other_cores"] = res["other_cpu_s"] / res["wall_s"]
                    runs[name].append(res)
                    progress(f"   round {r + 1}/{opts.rounds} {name:<9} "
                             + (res["error"] if "error" in res else
                                f"{res['msgs_per_s']:>9,.0f} msg/s, relay "
                                f"{res.get('relay_cpu_us_per_msg', 0):.1f} us/msg, noise "
                                f"{res['other_cores']:.2f} cores"))
            out[scn] = summarize_throughput(runs)
        out["trips"] = {q: await asyncio.to_thread(
            metric_sum, pol, "floodwall_queue_trips_total", queue=q)
            for q in (relay.FIREHOSE_QUEUE, relay.FIREHOSE10_QUEUE)}
        flow_doc: Any = (await asyncio.to_thread(pol.state))["flow"]
        out["policed_queues"] = [q["queue"] for q in flow_doc["queues"]]
        return out
    finally:
        await control.close()
        st.stop_proxy(plain)
        st.stop_proxy(pol)
        stop_pump(pump)


def summarize_throughput(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ok = {t: [r for r in rs if "error" not in r] for t, rs in runs.items()}
    med = {t: {k: median([r[k] for r in rs if k in r]) for k in (
        "msgs_per_s", "relay_cpu_us_per_msg", "broker_cpu_us_per_msg", "client_cpu_us_per_msg",
        "other_cores")} for t, rs in ok.items()}
    fit, slope = noise_fit({t: [(r["other_cores"], r["msgs_per_s"]) for r in rs]
                            for t, rs in ok.items()})
    direct_by_round = {r["round"]: r["msgs_per_s"] for r in ok["direct"]}

    def paired(t: str) -> float:
        return median([r["msgs_per_s"] / direct_by_round[r["round"]] for r in ok[t]
                       if direct_by_round.get(r["round"])])

    def cpu_total(t: str) -> float:
        m = med[t]
        base = m["broker_cpu_us_per_msg"] + m["client_cpu_us_per_msg"]
        return base + (m["relay_cpu_us_per_msg"] if t != "direct" else 0.0)

    ratios = {t: {"medians": ratio(med[t]["msgs_per_s"], med["direct"]["msgs_per_s"]),
                  "paired": paired(t),
                  "noise_adjusted": ratio(fit.get(t, math.nan), fit.get("direct", math.nan)),
                  "cpu_model": ratio(cpu_total("direct"), cpu_total(t))}
              for t in runs if t != "direct"}
    noise = [r["other_cores"] for t in ("direct", "policed") for r in ok[t]]
    value, how, met = judge_ratio(ratios["policed"]["noise_adjusted"],
                                  ratios["policed"]["medians"], noise, 0.90)
    return {"runs": runs, "median": med, "noise_fit": fit, "noise_slope": slope,
            "over_direct": ratios,
            "policed_over_floodwall_cpu": ratio(med["policed"]["relay_cpu_us_per_msg"],
                                                med["floodwall"]["relay_cpu_us_per_msg"]),
            "goal": {"value": value, "estimate": how, "met": met}}


# == (b) broker-side overshoot =============================================================
@dataclass
class DepthTrace:
    max_bytes: int = 0
    max_at: float = 0.0
    samples: int = 0
    mgmt_max_bytes: int = 0
    mgmt_samples: int = 0


class SlowConsumer:
    """Straight to the broker: prefetch ``prefetch``, acks one message every 1/rate s."""

    def __init__(self, client: amqp091.Amqp091Client, rate: float) -> None:
        self.client, self.rate = client, rate
        self.tags: deque[int] = deque()
        self.acked = 0
        client.on_delivery = self.tags.append

    @property
    def unacked(self) -> int:
        return self.client.deliveries - self.acked

    async def run(self, stop: asyncio.Event) -> None:
        start = time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - start) * self.rate) - self.acked
            while due > 0 and self.tags:
                self.client.ack(self.tags.popleft(), multiple=False)
                self.acked += 1
                due -= 1
            await asyncio.sleep(0.001)


async def raw_producer(host: str, port: int, queue: str, rate: float, size: int,
                       stop: asyncio.Event, counts: dict[str, int]) -> None:
    """No confirms. rate 0: pre-encoded batches as fast as the socket takes them;
    otherwise paced on a 1 ms timer (never bursting more than 10 ms' worth to catch up)."""
    client = await amqp091.connect(host, port)
    try:
        await publish_paced(client, amqp091.publish_frames(queue, b"\xab" * size), rate, stop,
                            counts, "sent")
    finally:
        client.abort()


async def publish_paced(client: Any, one: bytes, rate: float, stop: asyncio.Event,
                        counts: dict[Any, int], key: Any) -> None:
    """Write the publish ``one`` on ``client`` until ``stop`` (or the connection is lost),
    counting in ``counts[key]``. rate 0: batches as fast as the socket takes them; else
    paced on a 1 ms timer, never bursting more than 10 ms' worth to catch up."""
    batch = one * relay.BATCH
    counts.setdefault(key, 0)
    start = time.perf_counter()
    while not stop.is_set() and not client.lost.done():
        if client.paused:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.writable(), 0.1)
            continue
        if rate <= 0:
            client.write(batch)
            counts[key] += relay.BATCH
            await asyncio.sleep(0)
            continue
        due = int((time.perf_counter() - start) * rate) - counts[key]
        most = max(1, int(rate * 0.01))
        if due > most:  # fell behind (a stall): shift the schedule, do not burst
            start += (due - most) / rate
            due = most
        if due > 0:
            client.write(one * due)
            counts[key] += due
        await asyncio.sleep(0.001)


def pika_producer(port: int, queue: str, rate: float, size: int, stop: threading.Event,
                  counts: dict[str, Any]) -> None:
    """pika BlockingConnection in confirm mode: each basic_publish waits for its confirm."""
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, connection_attempts=1, socket_timeout=10))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        body = b"\xab" * size
        start = time.perf_counter()
        while not stop.is_set():
            if rate > 0:
                wait = start + counts["sent"] / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            ch.basic_publish("", queue, body)
            counts["sent"] += 1
    except Exception as exc:  # recorded with the run
        counts["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            conn.close()


async def overshoot_run(st: Stack, fw: ProxyProcess, kind: str, rate: float, cap_name: str,
                        capacity: int, opts: argparse.Namespace, cpu: CpuMeter
                        ) -> dict[str, Any]:
    ep = st.endpoint
    queue = unique(f"ovs-{cap_name}.{kind}")
    size = 1024
    via = await amqp091.connect("127.0.0.1", fw.port)  # declared through the proxy: policed
    await via.declare(queue)
    await via.close()
    await until(lambda: policed(fw, queue), 20, f"{queue} policed")
    consumer_client = await amqp091.connect(ep.host, ep.amqp_port)
    await consumer_client.qos(opts.prefetch)
    consumer = SlowConsumer(consumer_client, opts.consumer_rate)
    await consumer_client.consume(queue, no_ack=False)
    sampler = await amqp091.connect(ep.host, ep.amqp_port)
    trace = DepthTrace()
    stop = asyncio.Event()
    counts: dict[str, Any] = {"sent": 0}
    t0 = time.perf_counter()

    async def sample_passive() -> None:
        while not stop.is_set():
            ready = await sampler.declare(queue, passive=True)
            depth = (ready + consumer.unacked) * size
            trace.samples += 1
            if depth > trace.max_bytes:
                trace.max_bytes, trace.max_at = depth, time.perf_counter() - t0
            await asyncio.sleep(0.02)

    async def sample_management() -> None:
        path = "/api/queues/%2F/" + urllib.parse.quote(queue, safe="")
        while not stop.is_set():
            with contextlib.suppress(Exception):
                doc = await asyncio.to_thread(ep.api, "GET", path, None, 5)
                assert isinstance(doc, dict)
                trace.mgmt_max_bytes = max(trace.mgmt_max_bytes, int(doc.get("message_bytes")
                                                                      or 0))
                trace.mgmt_samples += 1
            await asyncio.sleep(0.25)

    tasks = [asyncio.create_task(consumer.run(stop)), asyncio.create_task(sample_passive()),
             asyncio.create_task(sample_management())]
    pika_stop = threading.Event()
    thread: threading.Thread | None = None
    if kind == "raw":
        tasks.append(asyncio.create_task(raw_producer("127.0.0.1", fw.port, queue, rate, size,
                                                      stop, counts)))
    else:
        thread = threading.Thread(target=pika_producer, daemon=True,
                                  args=(fw.port, queue, rate, size, pika_stop, counts))
        thread.start()
    fw_proc = psutil.Process(fw.process.pid) if fw.process else None
    s0 = cpu.snapshot(fw_proc)
    await asyncio.sleep(opts.overshoot_seconds)
    s1 = cpu.snapshot(fw_proc)
    stop.set()
    pika_stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    trips = await asyncio.to_thread(metric_sum, fw, "floodwall_queue_trips_total", queue=queue)
    # Clean up through the proxy: the delete unpolices the queue and releases what is held
    # (to a queue that is gone: the broker drops it).
    via = await amqp091.connect("127.0.0.1", fw.port)
    await via.delete(queue)
    await via.close()
    if thread is not None:
        await asyncio.to_thread(thread.join, 30)
    await consumer_client.close()
    await sampler.close()
    await until(lambda: held(fw)["messages"] == 0, 60, "held publishes gone")
    cpu_d = CpuMeter.delta(s0, s1)
    if "error" in counts:
        errors.append(counts["error"])
    return {"producer": kind, "rate": int(rate) if rate else "max", "capacity": capacity,
            "queue": queue,
            "max_depth_bytes": trace.max_bytes, "max_at_s": round(trace.max_at, 2),
            "overshoot_bytes": trace.max_bytes - capacity,
            "mgmt_max_bytes": trace.mgmt_max_bytes,
            "mgmt_overshoot_bytes": trace.mgmt_max_bytes - capacity,
            "samples": trace.samples, "mgmt_samples": trace.mgmt_samples,
            "sent": counts["sent"], "consumed": consumer.acked, "trips": trips,
            "other_cores": cpu_d["other_cpu_s"] / cpu_d["wall_s"], "errors": errors}


async def overshoot(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    caps = {"256k": (256 * KIB, "256KiB", "128KiB"), "1m": (MIB, "1MiB", "512KiB")}
    policies = write_policies(st.workdir / "overshoot.yaml", *(
        policy_entry(f"ovs-{n}", f"ovs-{n}.*", c, r) for n, (_, c, r) in caps.items()))
    fw = st.floodwall("floodwall-overshoot", policies)
    cpu = CpuMeter(relay.beam_of(st.broker))
    producers = [(p.split(":")[0], 0.0 if p.split(":")[1] == "max" else float(p.split(":")[1]))
                 for p in opts.producers.split(",")]
    runs = []
    try:
        for cap_name, (capacity, _, _) in caps.items():
            for kind, rate in producers:
                res = await overshoot_run(st, fw, kind, rate, cap_name, capacity, opts, cpu)
                runs.append(res)
                progress(f"   {kind:<4} {res['rate']!s:>5} msg/s cap {cap_name:<4}: "
                         f"max depth {res['max_depth_bytes'] / KIB:7.1f} KiB (overshoot "
                         f"{res['overshoot_bytes'] / KIB:+7.1f} KiB; mgmt "
                         f"{res['mgmt_max_bytes'] / KIB:.1f} KiB), {res['trips']:.0f} trips, "
                         f"sent {res['sent']}, consumed {res['consumed']}, noise "
                         f"{res['other_cores']:.2f}" + (f" ERRORS {res['errors']}"
                                                        if res["errors"] else ""))
    finally:
        st.stop_proxy(fw)
    worst = max((r["overshoot_bytes"] for r in runs), default=math.nan)
    worst_mgmt = max((r["mgmt_overshoot_bytes"] for r in runs), default=math.nan)
    return {"runs": runs, "consumer_rate": opts.consumer_rate, "prefetch": opts.prefetch,
            "seconds": opts.overshoot_seconds,
            "goal": {"value": max(worst, worst_mgmt),
                     "estimate": "worst max(depth) - capacity over all runs, passive declare "
                                 "every 20 ms (+ unacked) and management API",
                     "met": max(worst, worst_mgmt) <= 256 * KIB}}


# == (c) trip latency ======================================================================
_STAMP = struct.Struct(">HId")  # feeder id, sequence, time.time() at the write


class Feeder:
    """One paced publisher channel; every body starts with (id, seq, send time)."""

    def __init__(self, fid: int, client: amqp091.Amqp091Client, channel: int, queue: str,
                 size: int) -> None:
        self.fid, self.client, self.channel = fid, client, channel
        frames = amqp091.publish_frames(queue, b"\x00" * size, channel=channel)
        at = len(frames) - size - 1
        self.head, self.tail = frames[:at], frames[at + _STAMP.size:]
        self.sent: list[float] = []

    def publish(self, n: int) -> None:
        parts = []
        for _ in range(n):
            now = time.time()
            parts.append(self.head + _STAMP.pack(self.fid, len(self.sent), now) + self.tail)
            self.sent.append(now)
        self.client.write(b"".join(parts))


async def feed(feeders: list[Feeder], rate: float, stop: asyncio.Event) -> None:
    start = time.perf_counter()
    while not stop.is_set():
        for f in feeders:
            due = int((time.perf_counter() - start) * rate) - len(f.sent)
            if due > 0 and not f.client.paused:
                f.publish(min(due, 10))
        await asyncio.sleep(0.001)


async def read_queue(ep: BrokerEndpoint, queue: str, count: int) -> list[tuple[int, int, float]]:
    """The first ``count`` messages of ``queue``, straight from the broker: their stamps."""
    client = await amqp091.connect(ep.host, ep.amqp_port)
    got: list[tuple[int, int, float]] = []
    done = asyncio.Event()

    def on_body(payload: memoryview, _now: int) -> None:
        if len(got) < count:
            got.append(_STAMP.unpack_from(payload, 0))
        if len(got) >= count:
            done.set()

    client.on_body = on_body
    try:
        if count:
            await client.consume(queue, no_ack=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 30)
    finally:
        await client.close()
    return got


async def trip_trial(st: Stack, fw: ProxyProcess, mode: str, opts: argparse.Namespace
                     ) -> dict[str, Any]:
    ep = st.endpoint
    queue = unique(f"trip-{mode}")
    via = await amqp091.connect("127.0.0.1", fw.port)
    await via.declare(queue)
    await via.close()
    await until(lambda: policed(fw, queue), 20, f"{queue} policed")
    size = 1024
    a = await amqp091.connect("127.0.0.1", fw.port)
    await a.call(commands.Channel.Open(), commands.Channel.OpenOk, 2)
    b = await amqp091.connect("127.0.0.1", fw.port)
    feeders = [Feeder(1, a, 1, queue, size), Feeder(2, a, 2, queue, size),
               Feeder(3, b, 1, queue, size)]
    rate = opts.trip_rate if mode == "ledger" else opts.trip_rate / 2
    stop = asyncio.Event()
    task = asyncio.create_task(feed(feeders, rate, stop))
    prefill = 0
    try:
        if mode == "sample":
            # Straight to the broker, unseen by the proxy's ledger: the estimate crosses
            # when the next ready-count sample (every 200 ms) sees it.
            await asyncio.sleep(0.03)
            prefill = (MIB + 256 * KIB) // size
            direct = await amqp091.connect(ep.host, ep.amqp_port)
            stamp = _STAMP.pack(0, 0, 0.0)
            direct.write(amqp091.publish_frames(queue, stamp + b"\x00" * (size - len(stamp)))
                         * prefill)
            await direct.close()
        await until(lambda: tripped(fw, queue), 20, f"{queue} tripped", interval=0.01)
        await asyncio.sleep(opts.trip_hold)
    finally:
        stop.set()
        await task
    await asyncio.sleep(0.3)  # whatever was forwarded has reached the queue
    trips = [e for e in log_events(fw, "queue_tripped") if e.get("queue") == queue]
    helds = [e for e in log_events(fw, "publisher_held") if queue in str(e.get("queues", ""))
             .split(",")]
    check = await amqp091.connect(ep.host, ep.amqp_port)
    in_queue = await check.declare(queue, passive=True)
    await check.close()
    stamps = await read_queue(ep, queue, in_queue)
    via = await amqp091.connect("127.0.0.1", fw.port)
    await via.delete(queue)
    await via.close()
    a.abort()
    b.abort()
    await until(lambda: held(fw)["messages"] == 0, 30, "held publishes gone")
    t_trip = float(trips[0]["ts"]) if trips else math.nan
    held_ms = sorted((float(e["ts"]) - t_trip) * 1000 for e in helds)
    forwarded = {f.fid: 0 for f in feeders}
    last_fwd = {f.fid: -math.inf for f in feeders}
    for fid, seq, ts in stamps:
        if fid in forwarded:
            forwarded[fid] = max(forwarded[fid], seq + 1)
            last_fwd[fid] = max(last_fwd[fid], ts)
    after = sum(1 for fid, _, ts in stamps if fid and ts > t_trip)
    # Which log line is which feeder: connection A is the one with a channel 2.
    conn_a = next((e.get("conn") for e in helds if e.get("channel") == 2), None)
    held_at = {(1 if e.get("conn") == conn_a else 3) if e.get("channel") == 1 else 2:
               float(e["ts"]) for e in helds}
    per_channel = []
    for f in feeders:
        n = forwarded[f.fid]
        first_held_sent = f.sent[n] if n < len(f.sent) else math.nan
        at = held_at.get(f.fid, math.nan)
        per_channel.append({
            "feeder": f.fid, "sent": len(f.sent), "forwarded": n,
            "last_forwarded_sent_ms": (last_fwd[f.fid] - t_trip) * 1000 if n else None,
            "first_held_sent_ms": (first_held_sent - t_trip) * 1000,
            "held_after_trip_ms": (at - t_trip) * 1000,
            # the proxy's part: from the later of the trip and the write of the publish it
            # held (loopback transit included) to the hold
            "proxy_lag_ms": (at - max(t_trip, first_held_sent)) * 1000})
    depth_messages = int(trips[0].get("depth_messages", -1)) if trips else -1
    return {"mode": mode, "queue": queue, "rate_per_channel": rate,
            "trip_depth_bytes": trips[0].get("depth_bytes") if trips else None,
            "trip_depth_messages": depth_messages, "prefill": prefill,
            "sample_driven": bool(prefill) and depth_messages >= prefill,
            "channels_held": len(helds), "held_after_trip_ms": held_ms,
            "proxy_lag_ms": sorted(c["proxy_lag_ms"] for c in per_channel),
            "forwarded_sent_after_trip": after, "in_queue": in_queue,
            "per_channel": per_channel}


async def trip(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    policies = write_policies(st.workdir / "trip.yaml",
                              policy_entry("trip-ledger", "trip-ledger.*", "256KiB", "128KiB"),
                              policy_entry("trip-sample", "trip-sample.*", "1MiB", "512KiB"))
    fw = st.floodwall("floodwall-trip", policies)
    trials = []
    try:
        for i in range(opts.trip_trials):
            for mode in ("ledger", "sample"):
                res = await trip_trial(st, fw, mode, opts)
                trials.append(res)
                progress(f"   trial {i + 1} {mode:<6}: {res['channels_held']} channels held "
                         f"at +{', +'.join(f'{v:.2f}' for v in res['held_after_trip_ms'])} ms "
                         f"after the trip; {res['forwarded_sent_after_trip']} forwarded "
                         f"publishes sent after it; trip depth {res['trip_depth_messages']} "
                         f"msgs" + (" (sample-driven)" if res["sample_driven"] else ""))
    finally:
        st.stop_proxy(fw)
    every = [v for t in trials for v in t["held_after_trip_ms"]]
    lags = [v for t in trials for v in t["proxy_lag_ms"]]
    complete = all(t["channels_held"] == 3 for t in trials)
    worst = max(every, default=math.nan)
    return {"trials": trials, "rate_per_channel": opts.trip_rate,
            "held_after_trip_ms": {"median": median(every), "max": worst, "n": len(every)},
            "proxy_lag_ms": {"median": median(lags), "max": max(lags, default=math.nan)},
            "forwarded_sent_after_trip_total": sum(t["forwarded_sent_after_trip"]
                                                   for t in trials),
            "goal": {"value": worst, "estimate": "max over trials and channels of "
                     "publisher_held.ts - queue_tripped.ts (proxy log)"
                     + ("" if complete else "; SOME CHANNEL NEVER HELD"),
                     "met": complete and worst <= 10.0}}


# == (d) management API load ===============================================================
async def management(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    ep = st.endpoint
    queue = "mgmt.orders"
    control = await amqp091.connect(ep.host, ep.amqp_port)
    await control.declare(queue)
    await control.close()
    policies = write_policies(st.workdir / "management.yaml",
                              policy_entry("mgmt", "mgmt.*", "64MiB", "48MiB"))
    fw = st.floodwall("floodwall-management", policies)
    windows = []
    try:
        await until(lambda: policed(fw, queue), 30, f"{queue} policed")
        one = amqp091.publish_frames(queue, b"\xab" * 1024)
        sem = asyncio.Semaphore(20)

        async def connect() -> amqp091.Amqp091Client:
            async with sem:
                c = await amqp091.connect("127.0.0.1", fw.port, timeout=30)
                c.write(one)  # one publish each to the policed queue, then idle
                return c

        for r in range(opts.mgmt_rounds):
            for n in (1, opts.connections):
                clients = await asyncio.gather(*(connect() for _ in range(n)))
                await asyncio.sleep(2.0)  # settle: connection set-up done
                c0 = await asyncio.to_thread(metric_sum, fw,
                                             "floodwall_management_requests_total")
                t0 = time.monotonic()
                await asyncio.sleep(opts.mgmt_seconds)
                c1 = await asyncio.to_thread(metric_sum, fw,
                                             "floodwall_management_requests_total")
                wall = time.monotonic() - t0
                per_min = (c1 - c0) / wall * 60
                windows.append({"round": r, "connections": n, "requests": c1 - c0,
                                "seconds": wall, "per_minute": per_min})
                progress(f"   round {r + 1} {n:>4} idle connections: {c1 - c0:.0f} requests "
                         f"in {wall:.0f} s = {per_min:.1f}/min")
                for c in clients:
                    await c.close()
    finally:
        st.stop_proxy(fw)
    by_n = {n: median([w["per_minute"] for w in windows if w["connections"] == n])
            for n in (1, opts.connections)}
    rel = ratio(by_n[opts.connections], by_n[1])
    # Timer-driven requests fall into a window or the next by phase alone: allow 10 % or
    # two requests per window, whichever is more.
    slack = max(0.1 * by_n[1], 2 * 60 / opts.mgmt_seconds)
    return {"windows": windows, "per_minute": by_n, "ratio": rel,
            "goal": {"value": rel, "estimate": f"requests/min with {opts.connections} vs 1 idle "
                     f"connections (median of windows; same within {slack:.1f}/min)",
                     "met": abs(by_n[opts.connections] - by_n[1]) <= slack}}


# == report ================================================================================
def report(doc: dict[str, Any]) -> None:
    res = doc["results"]
    print(f"\nfloodwall flow benchmarks, {doc['meta']['started']} "
          f"({doc['meta']['command']})")
    if "throughput" in res:
        for scn in ("firehose", "firehose10"):
            s = res["throughput"].get(scn)
            if not s:
                continue
            print(f"\nthroughput {scn} (1 KiB; policed = floodwall with policies on this queue, "
                  "nothing tripped)")
            print(f"  {'target':<10}{'msgs/s':>10}{'x direct':>10}{'paired':>8}{'fit':>8}"
                  f"{'cpu-model':>10}{'relay us/msg':>14}{'noise cores':>13}")
            for t in THROUGHPUT_TARGETS:
                m = s["median"][t]
                rt = s["over_direct"].get(t, {})
                print(f"  {t:<10}{fmt(m['msgs_per_s'], ',.0f'):>10}"
                      f"{fmt(rt.get('medians', 1.0), '.3f'):>10}{fmt(rt.get('paired'), '.3f'):>8}"
                      f"{fmt(rt.get('noise_adjusted'), '.3f'):>8}"
                      f"{fmt(rt.get('cpu_model'), '.3f'):>10}"
                      f"{fmt(m['relay_cpu_us_per_msg'] if t != 'direct' else None, '.2f'):>14}"
                      f"{fmt(m['other_cores'], '.2f'):>13}")
            g = s["goal"]
            print(f"  {verdict(g['met'])}: policed >= 0.90 x direct: {fmt(g['value'], '.3f')} "
                  f"({g['estimate']}); CPU per msg policed / unpoliced floodwall "
                  f"{fmt(s['policed_over_floodwall_cpu'], '.2f')}x")
        print(f"  trips during the runs: {res['throughput'].get('trips')}")
    if "overshoot" in res:
        o = res["overshoot"]
        print(f"\novershoot (slow consumer {o['consumer_rate']:g} msg/s, prefetch "
              f"{o['prefetch']}, {o['seconds']:g} s per run)")
        print("  (mgmt max: the management API's message_bytes, refreshed by the broker "
              "every 5 s: a coarse cross-check; '-' = no figure yet)")
        print(f"  {'producer':<8}{'rate':>6}{'capacity':>10}{'max depth':>11}{'over':>9}"
              f"{'mgmt max':>10}{'trips':>7}{'sent':>9}{'noise':>7}")
        for r in o["runs"]:
            print(f"  {r['producer']:<8}{r['rate']!s:>6}{r['capacity'] // KIB:>7} KiB"
                  f"{r['max_depth_bytes'] / KIB:>7.0f} KiB{r['overshoot_bytes'] / KIB:>+6.0f} KiB"
                  f"{fmt(r['mgmt_max_bytes'] / KIB if r['mgmt_max_bytes'] else None, '.0f'):>6}"
                  f" KiB{r['trips']:>7.0f}{r['sent']:>9}"
                  f"{r['other_cores']:>7.2f}" + (f"  errors: {r['errors']}" if r["errors"]
                                                 else ""))
        g = o["goal"]
        print(f"  {verdict(g['met'])}: depth <= capacity + 256 KiB: worst "
              f"{g['value'] / KIB:+.0f} KiB")
    if "trip" in res:
        t = res["trip"]
        h = t["held_after_trip_ms"]
        print(f"\ntrip latency (3 channels paced at {t['rate_per_channel']:g} msg/s each; "
              "ledger- and sample-driven trips)")
        for tr in t["trials"]:
            lags = ", +".join(f"{v:.2f}" for v in tr["held_after_trip_ms"])
            proxy = ", ".join(f"{v:.2f}" for v in tr["proxy_lag_ms"])
            print(f"  {tr['mode']:<7} held +{lags} ms (proxy's part {proxy}); forwarded "
                  f"sent after trip: {tr['forwarded_sent_after_trip']}"
                  + (" (sample-driven)" if tr["sample_driven"] else ""))
        g = t["goal"]
        pl = t["proxy_lag_ms"]
        print(f"  {verdict(g['met'])}: trip to held <= 10 ms: median {fmt(h['median'], '.2f')} "
              f"ms, max {fmt(h['max'], '.2f')} ms over {h['n']} channel holds; the proxy's "
              f"part (from the later of trip and write): median {fmt(pl['median'], '.2f')}, "
              f"max {fmt(pl['max'], '.2f')} ms")
    if "management" in res:
        m = res["management"]
        print("\nmanagement API requests per minute: "
              + ", ".join(f"{n} connections {v:.1f}" for n, v in m["per_minute"].items())
              + f"; ratio {fmt(m['ratio'], '.3f')}: {verdict(m['goal']['met'])}")


SCENARIOS: dict[str, Callable[[Stack, argparse.Namespace, Progress], Awaitable[dict[str, Any]]]]
SCENARIOS = {"throughput": throughput, "overshoot": overshoot, "trip": trip,
             "management": management}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.flow", description=__doc__.split("\n")[0])
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=4, help="throughput: rounds (default 4)")
    p.add_argument("--seconds", type=float, default=3.0, help="throughput: measured s per run")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--producers", default="raw:max,raw:5000,raw:1000,pika:max",
                   help="overshoot: KIND:RATE list (raw = no confirms, pika = confirms)")
    p.add_argument("--consumer-rate", type=float, default=250.0)
    p.add_argument("--prefetch", type=int, default=20)
    p.add_argument("--overshoot-seconds", type=float, default=10.0)
    p.add_argument("--trip-trials", type=int, default=5)
    p.add_argument("--trip-rate", type=float, default=1000.0,
                   help="trip: msg/s per feeding channel (ledger; half that for sample mode)")
    p.add_argument("--trip-hold", type=float, default=0.3)
    p.add_argument("--connections", type=int, default=100)
    p.add_argument("--mgmt-seconds", type=float, default=30.0)
    p.add_argument("--mgmt-rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    for s in a.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}")
    return a


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def run_main(prog: str, argv: list[str] | None, scenarios: dict[str, Any], opts: Any,
             names: list[str], printer: Callable[[dict[str, Any]], None]) -> int:
    """Shared by bench.flow and bench.two_senders: one stack, the scenarios, JSON, report."""
    started = dt.datetime.now(dt.UTC)
    out = opts.out or REPO / "bench" / "out" / f"{prog}-{started:%Y%m%d-%H%M%S}.json"
    t_start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    import uvloop

    meta: dict[str, Any] = {"started": started.isoformat(timespec="seconds"),
            "command": " ".join([".venv/bin/python", "-m", f"bench.{prog}",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "options": {k: (str(v) if isinstance(v, Path) else v)
                        for k, v in vars(opts).items()},
            "loadavg_before": os.getloadavg(), "cpus": os.cpu_count()}
    results: dict[str, Any] = {}
    with stack(progress, release_named(getattr(opts, "broker", "3.10"))) as st:
        with contextlib.suppress(Exception):
            ov = st.endpoint.api("GET", "/api/overview")
            assert isinstance(ov, dict)
            meta["rabbitmq"] = ov.get("rabbitmq_version")
        for name in names:
            progress(f"== {name}")
            t0 = time.monotonic()
            try:
                results[name] = uvloop.run(scenarios[name](st, opts, progress))
            except Exception as exc:
                progress(f"{name} FAILED: {type(exc).__name__}: {exc}")
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results[name]["elapsed_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_after"] = os.getloadavg()
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    doc = {"meta": meta, "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite(doc), indent=1, default=str))
    printer({"meta": meta, "results": {k: v for k, v in results.items() if "error" not in v}})
    for k, v in results.items():
        if "error" in v:
            print(f"\n{k}: FAILED: {v['error']}")
    print(f"\nraw figures: {out}; elapsed {meta['elapsed_s']} s")
    return 1 if any("error" in v for v in results.values()) else 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_main("flow", argv, SCENARIOS, opts, opts.scenarios, report)


if __name__ == "__main__":
    sys.exit(main())
