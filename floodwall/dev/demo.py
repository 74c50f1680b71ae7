"""``make demo``: the founding scenario, a fast producer and a slow consumer, through floodwall.

Everything runs on this machine: Debian's rabbitmq-server from a private directory (the
host's 3.10, or with ``--broker 4.0`` Debian 13's 4.0 from its root), a
``floodwall run`` child process with ``policies/demo.yaml``, and two pika clients that
connect through the proxy: a producer at 100 msg/s (publisher confirms on, as a careful
producer has them) and a consumer at 10 msg/s. Without floodwall the queue would grow by
90 KiB/s until the broker's memory alarm stops every publisher; with it, the queue is held
at its capacity and the producer is slowed to the consumer's pace. A live table shows it
once a second; at the end the queue is drained to prove nothing was lost. The broker's
and the proxy's logs, the samples and the proxy's telemetry stay in ``demo-output/``; the
telemetry is then analysed (``floodwall analyze``) into ``demo-output/report/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
from rich.console import Console
from rich.live import Live
from rich.table import Table

from floodwall.control.policy import Policy, format_bytes, load_policies
from floodwall.dev.devbroker import RELEASE_NAMES, BrokerEndpoint, LocalBroker, release_named
from floodwall.dev.devproxy import ProxyProcess

QUEUE = "demo.orders"


@dataclass
class Rates:
    """What the two clients did; written by their threads, read by the display."""

    published: int = 0
    consumed: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _producer(port: int, rate: float, body_size: int, stop: threading.Event, rates: Rates) -> None:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()  # basic_publish returns once the broker has the message
        body = b"x" * body_size
        interval, next_at = 1.0 / rate, time.monotonic()
        while not stop.is_set():
            ch.basic_publish("", QUEUE, body)
            with rates.lock:
                rates.published += 1
            next_at = max(next_at + interval, time.monotonic())  # never burst to catch up
            delay = next_at - time.monotonic()
            if delay > 0:
                conn.sleep(delay)  # keeps heartbeats and the proxy's frames flowing
        conn.close()
    except Exception as exc:  # shown in the summary; the demo goes on
        rates.errors.append(f"producer: {exc!r}")


def _consumer(port: int, rate: float, stop: threading.Event, rates: Rates) -> None:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        interval = 1.0 / rate
        while not stop.is_set():
            method, _, _ = ch.basic_get(QUEUE)
            if method is None:
                conn.sleep(0.05)
                continue
            conn.sleep(interval)  # the slow part: "processing" the message
            ch.basic_ack(method.delivery_tag)
            with rates.lock:
                rates.consumed += 1
        conn.close()
    except Exception as exc:
        rates.errors.append(f"consumer: {exc!r}")


def _drain(port: int) -> int:
    """Consume what is left in the queue, fast, straight from the broker; returns how many."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    n = 0
    while True:
        method, _, _ = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        n += 1
    conn.close()
    return n


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if f'queue="{QUEUE}"' in line or "{" not in line or "queue=" not in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--produce-rate", type=float, default=100.0)
    parser.add_argument("--consume-rate", type=float, default=10.0)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--policies", type=Path, default=Path("policies/demo.yaml"))
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--broker", choices=RELEASE_NAMES, default="3.10",
                        help="the RabbitMQ to run: the host's package (3.10) or Debian 13's "
                             "4.0 in its root (make rabbitmq4-root; make demo BROKER=4.0)")
    return parser.parse_args()


def main() -> None:
    args = _arguments()

    console = Console()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    policies = load_policies(args.policies)
    policy = policies.for_queue("/", QUEUE)
    capacity = policy.capacity if policy is not None else 0
    release = release_named(args.broker)
    console.print(f"[bold]floodwall demo[/]: starting RabbitMQ {release.full_version} "
                  f"(logs in {out}/broker) ...")
    node = LocalBroker(out / "broker", release=release)
    node.start()
    broker = node.endpoint
    proxy = ProxyProcess(f"127.0.0.1:{broker.amqp_port}", out / "floodwall.log",
                         ["--policies", str(args.policies),
                          "--management", broker.management_url,
                          "--telemetry-dir", str(out / "telemetry")])
    try:
        probe, probe_ch = _start(console, proxy, broker, policy, capacity)
        rates, stop_producer, stop_consumer = Rates(), threading.Event(), threading.Event()
        producer = threading.Thread(target=_producer, args=(proxy.port, args.produce_rate,
                                                            args.body_size, stop_producer,
                                                            rates))
        consumer = threading.Thread(target=_consumer, args=(proxy.port, args.consume_rate,
                                                            stop_consumer, rates))
        producer.start()
        consumer.start()
        samples = _watch(console, proxy, probe_ch, rates, args, capacity)
        # The producer may be waiting on a held publish: the consumer keeps draining until
        # the queue releases it and the producer has stopped.
        stop_producer.set()
        producer.join(60)
        stop_consumer.set()
        consumer.join(30)
        probe.close()
        metrics = proxy.get("/metrics").decode()
        (out / "samples.json").write_text(json.dumps(samples, indent=1))
        proxy.stop()
        left = _drain(broker.amqp_port)
        _summary(console, samples, rates, left, capacity, args, metrics)
        for err in rates.errors:
            console.print(f"[red]{err}[/]")
        console.print(f"samples: {out}/samples.json, proxy log: {out}/floodwall.log, "
                      f"broker log: {out}/broker/log")
    finally:
        proxy.stop()
        node.stop()
    # The demo's own telemetry, through the Spark pipeline (docs/pipeline.md).
    from floodwall_pipeline.cli import run_analysis

    console.print()
    if run_analysis([str(out / "telemetry")], out / "report", resolution=1.0) == 0:
        console.print(f"[bold]report of this run[/]: {out / 'report' / 'report.html'}")


def _start(console: Console, proxy: ProxyProcess, broker: BrokerEndpoint,
           policy: Policy | None, capacity: int) -> tuple[Any, Any]:
    """Start floodwall, declare the queue at the broker after it (as in production), and open
    the probe connection that counts the queue; (connection, channel)."""
    proxy.start()
    # As in production, the queue is declared by the consumer's side straight at the
    # broker, after floodwall started: floodwall learns it from the broker's topology
    # events (the rabbitmq_event_exchange plugin, enabled on this broker).
    setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1",
                                                              broker.amqp_port))
    setup.channel().queue_declare(QUEUE, durable=False)
    setup.close()
    console.print(f"broker on :{broker.amqp_port}, floodwall on :{proxy.port} "
                  f"(admin {proxy.admin_url}), policy: {QUEUE} capacity "
                  f"{format_bytes(capacity)}, resume "
                  f"{format_bytes(policy.resume if policy else 0)}")
    console.print(f"{QUEUE} declared at the broker after floodwall started; "
                  f"{_topology_line(proxy)}")
    probe = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1",
                                                              broker.amqp_port))
    probe_ch = probe.channel()

    return probe, probe_ch


def _watch(console: Console, proxy: ProxyProcess, probe_ch: Any, rates: Rates,
           args: argparse.Namespace, capacity: int) -> list[dict[str, float]]:
    """One row a second for ``--seconds``: the rates, the queue, whether it is tripped."""
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    last = (0, 0, started)
    with Live(console=console, refresh_per_second=4) as live:
        while time.monotonic() - started < args.seconds:
            time.sleep(1.0)
            now = time.monotonic()
            with rates.lock:
                pub, con = rates.published, rates.consumed
            ready = probe_ch.queue_declare(QUEUE, passive=True).method.message_count
            metrics = proxy.get("/metrics").decode()
            dt = now - last[2]
            row = {"t": round(now - started, 1), "publish_rate": (pub - last[0]) / dt,
                   "consume_rate": (con - last[1]) / dt, "queue_messages": ready,
                   "queue_bytes": ready * args.body_size,
                   "tripped": _metric(metrics, "floodwall_queue_tripped"),
                   "held_messages": _metric(metrics, "floodwall_held_messages")}
            samples.append(row)
            last = (pub, con, now)
            live.update(_table(samples, args, capacity))
    return samples


def _topology_line(proxy: ProxyProcess, timeout: float = 5.0) -> str:
    """How floodwall learned of the demo queue (its /state), once it polices it."""
    deadline = time.monotonic() + timeout
    topology: dict[str, object] = {}
    while time.monotonic() < deadline:
        flow = proxy.state().get("flow")
        if isinstance(flow, dict):
            topology = flow.get("topology") or {}
            if any(q.get("queue") == QUEUE for q in flow.get("queues") or []):
                break
        time.sleep(0.05)
    changes = topology.get("changes")
    learned = ", ".join(f"{n} by {source}" for source, n in sorted(changes.items())
                        if n) if isinstance(changes, dict) else ""
    return (f"floodwall polices it (topology events: {topology.get('events', '?')}; "
            f"changes learned: {learned or 'none yet'})")


def _table(samples: list[dict[str, float]], args: argparse.Namespace, capacity: int) -> Table:
    table = Table(title=f"{QUEUE}: producer wants {args.produce_rate:g}/s, consumer takes "
                        f"{args.consume_rate:g}/s, capacity {format_bytes(capacity)}")
    for col in ("t (s)", "published/s", "consumed/s", "queue msgs", "queue bytes",
                "of capacity", "tripped", "held at proxy"):
        table.add_column(col, justify="right")
    for r in samples[-12:]:
        share = r["queue_bytes"] / capacity if capacity else 0
        table.add_row(f"{r['t']:.0f}", f"{r['publish_rate']:.0f}", f"{r['consume_rate']:.0f}",
                      str(int(r["queue_messages"])), format_bytes(int(r["queue_bytes"])),
                      f"{share:.0%}", "yes" if r["tripped"] else "no",
                      str(int(r["held_messages"])))
    return table


def _summary(console: Console, samples: list[dict[str, float]], rates: Rates, left: int,
             capacity: int, args: argparse.Namespace, metrics: str) -> None:
    peak = max((r["queue_bytes"] for r in samples), default=0)
    second_half = samples[len(samples) // 2:]
    pub_rate = sum(r["publish_rate"] for r in second_half) / max(len(second_half), 1)
    trips = _metric(metrics, "floodwall_queue_trips_total")
    delivered = rates.consumed + left
    console.print()
    console.print("[bold]summary[/]")
    console.print(f"  queue peak {format_bytes(int(peak))} against capacity "
                  f"{format_bytes(capacity)} ({peak / capacity:.0%} of it)" if capacity else "")
    console.print(f"  producer: asked for {args.produce_rate:g}/s, ran at {pub_rate:.1f}/s in "
                  f"the second half (consumer {args.consume_rate:g}/s); queue tripped "
                  f"{trips:.0f} time(s)")
    verdict = "[green]nothing lost[/]" if delivered == rates.published else "[red]MISMATCH[/]"
    console.print(f"  published and confirmed {rates.published}, consumed {rates.consumed} "
                  f"+ {left} drained at the end = {delivered}: {verdict}")


if __name__ == "__main__":
    main()
