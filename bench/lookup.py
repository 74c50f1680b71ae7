"""What a lookup adds to the first publish to a queue floodwall has not heard of.

``python -m bench.lookup [--trials 200] [--out FILE]``

One private RabbitMQ (with the rabbitmq_event_exchange plugin) and two ``floodwall run
--policies`` processes: one with ``--topology-events off`` (every new queue is found by a
lookup) and one with the events on. A raw 0-9-1 client in confirm mode (bench.amqp091)
publishes through each; a control connection declares queues straight at the broker. Each
trial declares a new queue at the broker and at once publishes one 1 KiB message to it
through the proxy, then a second one; the latency of each is the time from writing the
publish to the broker's confirm. Trials alternate between

- **lookup**: events off, the queue matches a policy: the first publish waits for a lookup
  (passive declare on the proxy's own connection), and the queue's first figure;
- **event**: events on, the same; the event and the publish race (either may be first);
- **unpoliced**: events off, a queue no policy matches: no lookup, the same broker work
  (a first publish to a new queue), the reference;
- **direct**: the same, straight to the broker.

Reported per case: median and p90 of the first and the second publish. The figure the issue
asks for is the lookup's added latency on the first publish: ``lookup`` first minus
``unpoliced`` first, by medians (target <= 2 ms), and nothing on the second. The proxy's own
``floodwall_topology_lookup_seconds`` histogram is read too.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench import amqp091
from bench.flow import (
    Progress,
    Stack,
    fmt,
    metric_sum,
    policy_entry,
    run_main,
    unique,
    write_policies,
)
from bench.meters import median, percentile
from floodwall.dev.devproxy import ProxyProcess

BODY = b"x" * 1024
CASES = ("lookup", "event", "unpoliced", "direct")


async def confirmed_publish(client: amqp091.Amqp091Client, queue: str) -> float:
    """Publish one message; seconds until the broker's confirm."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    want = client.confirmed + 1

    def on_confirm(tag: int) -> None:
        if tag >= want and not done.done():
            done.set_result(None)

    client.on_confirm = on_confirm
    started = time.perf_counter()
    client.write(amqp091.publish_frames(queue, BODY))
    await asyncio.wait_for(done, 10)
    return time.perf_counter() - started


async def lookup_latency(st: Stack, opts: argparse.Namespace,
                         progress: Progress) -> dict[str, Any]:
    policies = write_policies(st.workdir / "lookup.yaml",
                              policy_entry("lat", "lat.*", "64MiB", "32MiB"))
    off = st.floodwall("floodwall-events-off", policies, ("--topology-events", "off"))
    on = st.floodwall("floodwall-events-on", policies)
    ep = st.endpoint
    control = await amqp091.connect(ep.host, ep.amqp_port)
    clients: dict[str, amqp091.Amqp091Client] = {}
    try:
        for case, port in (("lookup", off.port), ("event", on.port), ("unpoliced", off.port),
                           ("direct", ep.amqp_port)):
            host = ep.host if case == "direct" else "127.0.0.1"
            clients[case] = client = await amqp091.connect(host, port)
            await client.confirm_select()
        first: dict[str, list[float]] = {c: [] for c in CASES}
        second: dict[str, list[float]] = {c: [] for c in CASES}
        made: list[str] = []
        for trial in range(opts.trials):
            for case in CASES:
                prefix = "lat" if case in ("lookup", "event") else "free"
                queue = f"{prefix}.{unique(case)}"
                made.append(queue)
                await control.declare(queue)
                first[case].append(await confirmed_publish(clients[case], queue))
                second[case].append(await confirmed_publish(clients[case], queue))
            if (trial + 1) % 50 == 0:
                progress(f"   {trial + 1}/{opts.trials} trials")
                for queue in made:
                    await control.delete(queue)
                made.clear()
        for queue in made:
            await control.delete(queue)
        out: dict[str, Any] = {"trials": opts.trials}
        for case in CASES:
            f, s = sorted(first[case]), sorted(second[case])
            out[case] = {"first_median_ms": median(f) * 1e3,
                         "first_p90_ms": percentile(f, 90) * 1e3,
                         "second_median_ms": median(s) * 1e3,
                         "second_p90_ms": percentile(s, 90) * 1e3}
        out["added_first_ms"] = (out["lookup"]["first_median_ms"]
                                 - out["unpoliced"]["first_median_ms"])
        out["added_first_event_ms"] = (out["event"]["first_median_ms"]
                                       - out["unpoliced"]["first_median_ms"])
        out["added_second_ms"] = (out["lookup"]["second_median_ms"]
                                  - out["unpoliced"]["second_median_ms"])
        for name, proc in (("events_off", off), ("events_on", on)):
            out[name] = await asyncio.to_thread(proxy_lookups, proc)
        return out
    finally:
        for client in clients.values():
            await client.close()
        await control.close()
        st.stop_proxy(off)
        st.stop_proxy(on)


def proxy_lookups(proc: ProxyProcess) -> dict[str, float]:
    count = metric_sum(proc, "floodwall_topology_lookup_seconds_count")
    total = metric_sum(proc, "floodwall_topology_lookup_seconds_sum")
    return {"lookups": count, "mean_ms": total / count * 1e3 if count else 0.0,
            "within_1ms": metric_sum(proc, "floodwall_topology_lookup_seconds_bucket",
                                     le="0.001"),
            "within_2ms": metric_sum(proc, "floodwall_topology_lookup_seconds_bucket",
                                     le="0.002"),
            "learned_by_event": metric_sum(proc, "floodwall_topology_changes_total",
                                           source="event"),
            "learned_by_lookup": metric_sum(proc, "floodwall_topology_changes_total",
                                            source="lookup")}


def report(doc: dict[str, Any]) -> None:
    meta, res = doc["meta"], doc["results"].get("lookup")
    print(f"\nbench.lookup, {meta['started']}, RabbitMQ {meta.get('rabbitmq', '?')}, "
          f"load average {meta['loadavg_before'][0]:.2f} -> {meta['loadavg_after'][0]:.2f}")
    if not res:
        return
    print(f"first and second publish to a queue declared at the broker just before, "
          f"{res['trials']} trials each, publish -> confirm (ms)")
    print("  case        first p50  first p90  second p50  second p90")
    for case in CASES:
        r = res[case]
        print(f"  {case:<10} {fmt(r['first_median_ms'], '10.3f')} "
              f"{fmt(r['first_p90_ms'], '10.3f')} {fmt(r['second_median_ms'], '11.3f')} "
              f"{fmt(r['second_p90_ms'], '11.3f')}")
    added = res["added_first_ms"]
    print(f"  added by the lookup to the first publish (lookup - unpoliced, medians): "
          f"{added:.3f} ms -> {'met' if added <= 2.0 else 'NOT MET'} (target <= 2 ms); "
          f"with events on {res['added_first_event_ms']:.3f} ms; to the second publish "
          f"{res['added_second_ms']:.3f} ms")
    for name in ("events_off", "events_on"):
        p = res[name]
        print(f"  proxy ({name}): {p['lookups']:.0f} lookups, mean {p['mean_ms']:.3f} ms, "
              f"{p['within_1ms']:.0f} within 1 ms, {p['within_2ms']:.0f} within 2 ms; "
              f"changes learned by event {p['learned_by_event']:.0f}, by lookup "
              f"{p['learned_by_lookup']:.0f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.lookup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    return run_main("lookup", argv, {"lookup": lookup_latency}, opts, ["lookup"], report)


if __name__ == "__main__":
    raise SystemExit(main())
