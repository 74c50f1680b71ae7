"""What the broker spends on a passive declare and on a fleet delivery:
whether a fleet should share its depth counts through the fanout or cap how often each
member counts.

``python -m bench.broker_costs [--declares 5000] [--publishes 2000] [--members 1,4,8]
[--rounds 2] [--out FILE]``

One private RabbitMQ; the broker's CPU seconds (beam.smp, from /proc, ``CpuMeter``) before
and after K operations, less what it spends idle over the same wall time (measured before
each round):

- *passive declare*: K back-to-back ``queue.declare(passive)`` on one channel of an
  ``AmqpClient`` (the sidecar's own client, one in flight, as ``_probe_hot`` counts a hot
  queue), of an empty queue and of a queue with 10,000 ready messages;
- *fleet delivery*: a fanout exchange with M member queues (exclusive, consumed without
  acks on M connections of their own, as ``FleetService`` does), K publishes of a 200-byte
  body (an announcement's size) on a plain channel, paced in bursts of 50, until every
  member has all K: CPU per publish, and per delivery from the fit ``p + M x d`` over the
  member counts.

The machine is shared (2 cores): quote the figures of one run side by side, with the load
average, as bench/README.md says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.meters import CpuMeter
from bench.spool_bench import broker_process
from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker
from floodwall.io.amqp_client import AmqpClient, Delivery
from floodwall.io.upstreams import Upstreams

BODY = b"x" * 200


def client(ep: BrokerEndpoint) -> AmqpClient:
    return AmqpClient(Upstreams([(ep.host, ep.amqp_port)]), ep.username, ep.password, "/")


async def idle_rate(meter: CpuMeter, seconds: float = 3.0) -> float:
    """The broker's CPU seconds per second with nothing to do."""
    a = meter.snapshot(None)
    await asyncio.sleep(seconds)
    d = CpuMeter.delta(a, meter.snapshot(None))
    return d["broker_cpu_s"] / d["wall_s"]


async def declares(ep: BrokerEndpoint, meter: CpuMeter, count: int, ready: int,
                   idle: float) -> dict[str, Any]:
    c = client(ep)
    await c.connect()
    queue = f"costs.declare.{ready}.{time.monotonic_ns()}"
    await c.declare_queue(queue)
    if ready:
        channel = await c.open_plain_channel()
        for i in range(ready):
            c.publish_plain(channel, "", queue, BODY)
            if i % 500 == 0:
                await c.drain()
        await c.drain()
        for _ in range(200):  # until the broker has enqueued them all (at most 10 s)
            counts = await c.queue_counts(queue)
            if counts is None or counts.messages >= ready:
                break
            await asyncio.sleep(0.05)
    a = meter.snapshot(None)
    for _ in range(count):
        await c.queue_counts(queue, lane="probe")
    d = CpuMeter.delta(a, meter.snapshot(None))
    await c.close()
    cpu = d["broker_cpu_s"] - idle * d["wall_s"]
    return {"kind": "passive declare", "ready": ready, "count": count,
            "wall_s": round(d["wall_s"], 3), "broker_cpu_s": round(d["broker_cpu_s"], 3),
            "us_per_op": round(cpu / count * 1e6, 1),
            "per_s": round(count / d["wall_s"])}


async def fanout(ep: BrokerEndpoint, meter: CpuMeter, members: int, count: int,
                 idle: float) -> dict[str, Any]:
    exchange = f"costs.fleet.{members}.{time.monotonic_ns()}"
    pub = client(ep)
    await pub.connect()
    await pub.declare_exchange(exchange, "fanout")
    got = [0] * members
    done = asyncio.Event()
    subs = []
    for m in range(members):
        sub = client(ep)
        await sub.connect()
        queue = f"{exchange}.{m}"
        await sub.declare_queue(queue, exclusive=True, auto_delete=True,
                                arguments={"x-max-length": 100_000})
        await sub.bind_queue(queue, exchange, "")

        def on(_d: Delivery, m: int = m) -> None:
            got[m] += 1
            if min(got) >= count:
                done.set()

        await sub.consume(queue, on)
        subs.append(sub)
    channel = await pub.open_plain_channel()
    a = meter.snapshot(None)
    for i in range(count):
        pub.publish_plain(channel, exchange, "", BODY)
        if i % 50 == 49:
            await pub.drain()
            await asyncio.sleep(0)
    await pub.drain()
    await asyncio.wait_for(done.wait(), 120)
    d = CpuMeter.delta(a, meter.snapshot(None))
    for c in [pub, *subs]:
        await c.close()
    cpu = d["broker_cpu_s"] - idle * d["wall_s"]
    return {"kind": "fanout", "members": members, "count": count,
            "wall_s": round(d["wall_s"], 3), "broker_cpu_s": round(d["broker_cpu_s"], 3),
            "us_per_publish": round(cpu / count * 1e6, 1),
            "us_per_delivery_all_in": round(cpu / (count * members) * 1e6, 1)}


def fit(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    """Least squares of cost per publish = p + members x d: (p, d) in microseconds."""
    pts = [(r["members"], r["us_per_publish"]) for r in rows]
    if len({m for m, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(m for m, _ in pts) / n, sum(y for _, y in pts) / n
    d = sum((m - mx) * (y - my) for m, y in pts) / sum((m - mx) ** 2 for m, _ in pts)
    return my - d * mx, d


async def run(opts: argparse.Namespace, ep: BrokerEndpoint) -> dict[str, Any]:
    meter = CpuMeter(broker_process(ep))
    rows: list[dict[str, Any]] = []
    for r in range(opts.rounds):
        idle = await idle_rate(meter)
        print(f"round {r}: broker idle {idle:.3f} cores, load {os.getloadavg()}", flush=True)
        for ready in (0, 10_000):
            rows.append(await declares(ep, meter, opts.declares, ready, idle) | {"round": r})
            print(rows[-1], flush=True)
        for members in opts.members:
            rows.append(await fanout(ep, meter, members, opts.publishes, idle) | {"round": r})
            print(rows[-1], flush=True)
    fans = [x for x in rows if x["kind"] == "fanout"]
    p_d = fit(fans)
    decl = [x["us_per_op"] for x in rows if x["kind"] == "passive declare"]
    return {"rows": rows, "load_average": os.getloadavg(),
            "declare_us": sorted(decl),
            "publish_us": None if p_d is None else round(p_d[0], 1),
            "delivery_us": None if p_d is None else round(p_d[1], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--declares", type=int, default=5000)
    ap.add_argument("--publishes", type=int, default=2000)
    ap.add_argument("--members", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-costs-"))
    broker = LocalBroker(workdir / "rabbit")
    try:
        ep = broker.start()
        res = asyncio.run(run(opts, ep))
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    if opts.out is not None:
        opts.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
