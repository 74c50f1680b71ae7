"""The soak: a long run through floodwall with a queue tripping and releasing every few
seconds and the spool on; is anything growing?

``python -m bench.soak [--minutes 60] [--rate 20000] [--sample 60] [--out FILE]``

Starts one private RabbitMQ (or uses ``FLOODWALL_TEST_BROKER``) and ``floodwall run
--policies --spool-dir`` (defaults otherwise) with one queue policed at 4 MiB / 2 MiB,
``overflow: spool``. A raw 0-9-1 producer publishes ``--size`` byte messages with confirms
through the proxy at ``--rate`` a second (batches every 10 ms); a raw consumer straight on
the broker takes them (prefetch 500, acking every 100th) and stops acking for ``--phase``
seconds out of every two phases, so the queue fills past capacity (the proxy trips it and
spools), then drains (the proxy releases it and replays the spool), again and again.

Every ``--sample`` seconds: the proxy's RSS and open fds (psutil), its asyncio tasks
(``/state``), the confirm latency (p50, p99, max) of that window, messages published,
confirmed and delivered, trips so far, spool bytes. At the end the consumer reads on until
the spool is empty and every confirmed message was delivered.

Verdict: after the warm-up (``--warmup``: the first fifth of the samples by default) RSS grows
by less than 5%, open fds and tasks not at all (a small noise allowance: 2 fds, 2 tasks), and
nothing confirmed is lost. The suite runs a two-minute variant whose first minute is the
warm-up (tests/chaos/test_soak.py): floodwall's RSS settles within about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from bench import amqp091
from bench.meters import percentile
from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker
from floodwall.dev.devproxy import ProxyProcess

KIB, MIB = 1024, 1024 * 1024
TICK = 0.01
RSS_GROWTH_LIMIT = 0.05
FD_ALLOWANCE = 2
DRAIN_STALL = 60.0
"""Seconds without a delivery after which the final drain gives up (what is left is lost)."""
TASK_ALLOWANCE = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.soak")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--rate", type=int, default=20_000, help="messages per second")
    ap.add_argument("--size", type=int, default=256, help="body bytes")
    ap.add_argument("--capacity", default="4MiB", help="the queue's capacity (resume: half)")
    ap.add_argument("--phase", type=float, default=3.0,
                    help="seconds the consumer reads, then pauses, alternately")
    ap.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.2,
                    help="the part of the samples that is warm-up, not counted as growth")
    ap.add_argument("--out", type=Path)
    return ap.parse_args(argv)


class Soak:
    """The producer, the consumer, and the figures of each window."""

    def __init__(self, ep: BrokerEndpoint, proxy: ProxyProcess, queue: str,
                 opts: argparse.Namespace) -> None:
        self.ep, self.proxy, self.queue, self.opts = ep, proxy, queue, opts
        assert proxy.process is not None
        self.proc = psutil.Process(proxy.process.pid)
        self.sent = 0
        self.pending: deque[tuple[int, float]] = deque()  # (last seq of a batch, sent at)
        self.latencies: list[float] = []
        self.samples: list[dict[str, Any]] = []
        self.stop = False
        self.consumer: amqp091.Amqp091Client
        self.consumer_paused = False
        self.acked_through = 0  # the highest delivery tag acked (multiple)

    def _confirmed(self, tag: int) -> None:
        now = time.perf_counter()
        while self.pending and self.pending[0][0] <= tag:
            self.latencies.append(now - self.pending.popleft()[1])

    async def produce(self, producer: amqp091.Amqp091Client) -> None:
        one = amqp091.publish_frames(self.queue, b"s" * self.opts.size)
        started = time.perf_counter()
        while not self.stop and not producer.lost.done():
            due = int((time.perf_counter() - started) * self.opts.rate) - self.sent
            if due > 0:
                producer.write(one * due)
                self.sent += due
                self.pending.append((self.sent, time.perf_counter()))
            if producer.paused:
                await producer.writable()
            await asyncio.sleep(TICK)

    def _delivered(self, tag: int) -> None:
        """The consumer acks every 100th delivery (multiple) while it reads."""
        if not self.consumer_paused and tag % 100 == 0:
            self._ack(tag)

    def _ack(self, tag: int) -> None:
        """Ack through ``tag`` unless that is done: acking a tag twice is a channel error
        (406 unknown delivery tag) that ends the consumer, and the soak with it (it did,
        when a whole phase passed without a delivery)."""
        if tag > self.acked_through:
            self.consumer.ack(tag, multiple=True)
            self.acked_through = tag

    async def toggle(self) -> None:
        """Read for a phase, stop acking for a phase: with a prefetch of 500 the broker stops
        delivering, the queue grows past capacity and trips."""
        while not self.stop:
            await asyncio.sleep(self.opts.phase)
            self.consumer_paused = True
            await asyncio.sleep(self.opts.phase)
            self.consumer_paused = False
            self._ack(self.consumer.last_delivery_tag)

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.proxy.admin_url + path, timeout=60) as resp:
            return resp.read()

    def _metric(self, text: str, name: str) -> float:
        return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                   if line.startswith(name))

    async def sample(self, producer: amqp091.Amqp091Client,
                     consumer: amqp091.Amqp091Client, t0: float) -> None:
        started = time.monotonic()
        try:
            state = json.loads(await asyncio.to_thread(self._get, "/state"))
            metrics = (await asyncio.to_thread(self._get, "/metrics")).decode()
            admin: str | float = round(time.monotonic() - started, 3)
        except (OSError, TimeoutError) as exc:  # an answer that did not come is a figure too
            state, metrics = {}, ""
            admin = f"no answer: {exc or type(exc).__name__}"
        lat = sorted(self.latencies)
        self.latencies = []
        self.samples.append({
            "minute": round((time.monotonic() - t0) / 60, 2),
            "rss_mib": round(self.proc.memory_info().rss / MIB, 1),
            "fds": self.proc.num_fds(), "tasks": state.get("tasks"),
            "latency_ms": {"p50": round(percentile(lat, 50) * 1000, 1) if lat else None,
                           "p99": round(percentile(lat, 99) * 1000, 1) if lat else None,
                           "max": round(lat[-1] * 1000, 1) if lat else None},
            "sent": self.sent, "confirmed": producer.confirmed, "nacked": producer.nacked,
            "delivered": consumer.deliveries,
            "trips": self._metric(metrics, "floodwall_queue_trips_total"),
            "spool_bytes": (state.get("spool") or {}).get("bytes"),
            "admin_seconds": admin,  # how long /state and /metrics took to answer
            "consumer_lost": str(consumer.lost.exception() or "closed")
            if consumer.lost.done() else None,
        })
        print(json.dumps(self.samples[-1]), flush=True)

    async def run(self) -> dict[str, Any]:
        control = await amqp091.connect(self.ep.host, self.ep.amqp_port)
        await control.declare(self.queue)
        consumer = self.consumer = await amqp091.connect(self.ep.host, self.ep.amqp_port)
        await consumer.qos(500)
        consumer.on_delivery = self._delivered
        await consumer.consume(self.queue, no_ack=False)
        producer = await amqp091.connect("127.0.0.1", self.proxy.port)
        await producer.confirm_select()
        producer.on_confirm = self._confirmed
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self.produce(producer)), loop.create_task(self.toggle())]
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < self.opts.minutes * 60:
                await asyncio.sleep(min(self.opts.sample,
                                        self.opts.minutes * 60 - (time.monotonic() - t0)))
                await self.sample(producer, consumer, t0)
        finally:
            self.stop = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.consumer_paused = False
        self._ack(consumer.last_delivery_tag)
        # The spool replays and the queue drains: as long as deliveries go on (a backlog an
        # hour's run built up can take minutes), until DRAIN_STALL without one.
        drain_started = time.monotonic()
        seen, moved = consumer.deliveries, drain_started
        while not (producer.confirmed + producer.nacked >= self.sent
                   and consumer.deliveries >= producer.confirmed):
            now = time.monotonic()
            if consumer.deliveries != seen:
                seen, moved = consumer.deliveries, now
            elif now - moved > DRAIN_STALL:
                break
            await asyncio.sleep(0.2)
        end = {"sent": self.sent, "confirmed": producer.confirmed, "nacked": producer.nacked,
               "delivered": consumer.deliveries, "producer_lost": producer.lost.done(),
               "drain_seconds": round(time.monotonic() - drain_started, 1)}
        for client in (producer, consumer):
            await client.close()
        await control.delete(self.queue)
        await control.close()
        return {"end": end, "samples": self.samples}


def verdict(doc: dict[str, Any], warmup: float = 0.2) -> dict[str, Any]:
    """Growth after the warm-up (that part of the samples), and nothing lost. RSS:
    the last sample against the first after the warm-up; fds and tasks, which come and go
    by a few with the phase a sample lands in (the spool's segments and replay, a hot
    queue's counting task, the management API's pool): the lowest of the last third
    against the lowest of the first third after the warm-up. What leaks stays, so it
    raises the lowest; what comes and goes does not."""
    samples = doc["samples"]
    if len(samples) < 3:
        return {"ok": None, "why": "fewer than three samples"}
    after = samples[max(1, int(len(samples) * warmup)) - 1:]
    third = max(1, len(after) // 3)
    early, late = after[:third], after[-third:]
    rss_growth = (after[-1]["rss_mib"] - after[0]["rss_mib"]) / after[0]["rss_mib"]
    fd_growth = min(s["fds"] for s in late) - min(s["fds"] for s in early)
    task_growth = (min((s["tasks"] for s in late if s["tasks"] is not None), default=0)
                   - min((s["tasks"] for s in early if s["tasks"] is not None), default=0))
    end = doc["end"]
    lost = end["confirmed"] - min(end["delivered"], end["confirmed"])
    checks = {
        "rss_growth": {"value": round(rss_growth, 4), "limit": RSS_GROWTH_LIMIT,
                       "ok": rss_growth < RSS_GROWTH_LIMIT},
        "fd_growth": {"value": fd_growth, "limit": FD_ALLOWANCE, "ok": fd_growth <= FD_ALLOWANCE},
        "task_growth": {"value": task_growth, "limit": TASK_ALLOWANCE,
                        "ok": task_growth <= TASK_ALLOWANCE},
        "confirmed_lost": {"value": lost, "limit": 0, "ok": lost == 0 and end["nacked"] == 0},
        "trips": {"value": (trips := max(s["trips"] for s in samples)),
                  "ok": trips >= len(samples)},
        "admin_unanswered": {"value": sum(isinstance(s["admin_seconds"], str) for s in samples),
                             "ok": all(not isinstance(s["admin_seconds"], str)
                                       for s in samples)},
    }
    return {"ok": all(c["ok"] for c in checks.values()), **checks}


def soak(ep: BrokerEndpoint, workdir: Path, opts: argparse.Namespace) -> dict[str, Any]:
    queue = f"fw-soak-{os.getpid()}-{int(time.time())}"
    policies = workdir / "p.yaml"
    capacity = opts.capacity
    resume = f"{float(capacity[:-3]) / 2:g}{capacity[-3:]}"
    policies.write_text(
        "version: 1\npolicies:\n"
        f'  - {{name: soak, match: {{queue: "{queue}"}}, capacity: {capacity}, '
        f"resume: {resume}, "
        "overflow: spool, deadline: 10m, spool: {max_bytes: 1GiB, fsync: group, "
        "group_commit_ms: 2}}\n")
    proxy = ProxyProcess(f"{ep.host}:{ep.amqp_port}", workdir / "floodwall.log",
                         ["--policies", str(policies), "--management", ep.management_url,
                          "--spool-dir", str(workdir / "spool"), "--log-format", "json"])
    proxy.start()
    try:
        doc = asyncio.run(Soak(ep, proxy, queue, opts).run())
    finally:
        proxy.stop()
    doc["options"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()}
    doc["verdict"] = verdict(doc, opts.warmup)
    return doc


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the finally blocks stop the proxy and the broker
    # (a killed soak left both running, one of them replaying a spool).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-soak-"))
    local: LocalBroker | None = None
    try:
        existing = os.environ.get("FLOODWALL_TEST_BROKER")
        if existing:
            ep = BrokerEndpoint.from_env(existing)
        else:
            local = LocalBroker(workdir / "rabbit")
            ep = local.start()
        doc = soak(ep, workdir, opts)
    finally:
        if local is not None:
            local.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"end": doc["end"], "verdict": doc["verdict"]}, indent=2))
    if opts.out is not None:
        opts.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if doc["verdict"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
