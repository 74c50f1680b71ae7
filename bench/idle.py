"""What a sidecar costs while nothing flows: the CPU of an idle ``floodwall run``.

A sidecar sits in every producer pod, and most of them are idle most of the time: what the
proxy spends with no client connected is the pod's CPU too. It comes from the proxy's own
work on a clock: the depth counts of each policed queue (every depth interval, 200 ms), the
fleet's ticks and announcements, the management API's samples and alarm polls.

For each set-up (no policies; policing ``--queues`` queues with the fleet off; the same with
the fleet on, a fleet of one), one ``floodwall run`` is started on the benchmark's own
RabbitMQ, left until its queues are policed and ``--settle`` seconds more, then its CPU
(user + system, psutil) is read over ``--seconds``; the set-ups take turns for ``--rounds``
rounds and the median is reported, in milliseconds of CPU a second (10 ms/s: 1 % of a
core). The broker's CPU over the same window is reported beside it: the counts cost it too.

    python -m bench.idle [--queues 1,20] [--rounds 3] [--seconds 10] [--broker 4.0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from statistics import median
from typing import Any

import psutil

from bench import amqp091
from bench.flow import (
    Progress,
    Stack,
    fmt,
    policed,
    policy_entry,
    run_main,
    until,
    write_policies,
)
from bench.meters import cpu_seconds
from bench.relay import beam_of
from floodwall.dev.devbroker import RELEASE_NAMES

PREFIX = "idle.q"


def setups(queue_counts: list[int]) -> list[tuple[str, int, bool]]:
    """(label, policed queues, fleet on) for each set-up, the unpoliced relay first."""
    out = [("plain", 0, False)]
    for n in queue_counts:
        out += [(f"{n} queues, fleet off", n, False), (f"{n} queues, fleet on", n, True)]
    return out


async def declare(st: Stack, count: int) -> None:
    client = await amqp091.connect(st.endpoint.host, st.endpoint.amqp_port)
    try:
        for i in range(count):
            await client.declare(f"{PREFIX}{i}", {})
    finally:
        await client.close()


async def one_window(st: Stack, label: str, queues: int, fleet: bool,
                     opts: argparse.Namespace) -> dict[str, Any]:
    """Start the set-up's proxy, wait until it polices its queues and settles, read its CPU
    and the broker's over ``opts.seconds``, stop it."""
    extra: tuple[str, ...] = ("--fleet", f"idle-{uuid.uuid4().hex[:6]}" if fleet else "off")
    policies = None
    if queues:
        # One policy per queue, by its exact name: the set-up polices those and no others
        policies = write_policies(st.workdir / f"idle-{queues}.yaml", *(
            policy_entry(f"q{i}", f"{PREFIX}{i}", "64MiB", "48MiB") for i in range(queues)))
    fw = st.floodwall(f"idle-{queues}-{'fleet' if fleet else 'alone'}", policies,
                      extra if queues else ())
    try:
        await until(lambda: all(policed(fw, f"{PREFIX}{i}") for i in range(queues)), 60,
                    f"{label}: its queues policed")
        await asyncio.sleep(opts.settle)  # (unmeasured: start-up work done)
        assert fw.process is not None
        proxy, beam = psutil.Process(fw.process.pid), beam_of(st.broker)
        cpu0, t0 = (cpu_seconds(proxy), cpu_seconds(beam)), time.monotonic()
        await asyncio.sleep(opts.seconds)  # (the measured window)
        cpu1, t1 = (cpu_seconds(proxy), cpu_seconds(beam)), time.monotonic()
    finally:
        st.stop_proxy(fw)
    span = t1 - t0
    return {"proxy_ms_per_s": round((cpu1[0] - cpu0[0]) / span * 1000, 2),
            "broker_ms_per_s": round((cpu1[1] - cpu0[1]) / span * 1000, 2)}


async def scenario(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    await declare(st, max(opts.queues, default=0))
    plan = setups(opts.queues)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in plan}
    for r in range(opts.rounds):
        for label, queues, fleet in (plan if r % 2 == 0 else plan[::-1]):
            res = await one_window(st, label, queues, fleet, opts)
            progress(f"round {r + 1}/{opts.rounds} {label}: {res}")
            runs[label].append(res)
    return {"runs": runs, "median": {
        label: {k: median(x[k] for x in rs) for k in ("proxy_ms_per_s", "broker_ms_per_s")}
        for label, rs in runs.items()}}


def report(doc: dict[str, Any]) -> None:
    res = doc["results"].get("idle")
    if not res:
        return
    print(f"\nfloodwall idle, {doc['meta']['started']} ({doc['meta']['command']})")
    print("  CPU while nothing flows, ms a second (median over rounds; 10 ms/s is 1 % of a core)")
    print(f"  {'set-up':<22}{'proxy':>10}{'broker':>10}   proxy, each round")
    for label, m in res["median"].items():
        each = ", ".join(fmt(x["proxy_ms_per_s"], ".1f") for x in res["runs"][label])
        print(f"  {label:<22}{fmt(m['proxy_ms_per_s'], '.1f'):>10}"
              f"{fmt(m['broker_ms_per_s'], '.1f'):>10}   {each}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle",
                                description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=lambda s: [int(x) for x in s.split(",")], default=[1, 20],
                   help="policed queue counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0, help="measured window")
    p.add_argument("--settle", type=float, default=3.0,
                   help="unmeasured seconds after the queues are policed")
    p.add_argument("--broker", choices=RELEASE_NAMES, default="3.10")
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)
    return run_main("idle", argv, {"idle": scenario}, opts, ["idle"], report)


if __name__ == "__main__":
    sys.exit(main())
