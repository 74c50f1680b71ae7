"""``make demo``: a real broker, floodwall in front, a fast producer and a slow consumer.

Everything runs on this machine: Debian's rabbitmq-server from a private directory, a
``floodwall run`` child process, and two pika clients that connect through the proxy. A
live table shows rates and the queue's depth once a second; the broker's and the proxy's
logs stay in ``demo-output/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika
from rich.console import Console
from rich.live import Live
from rich.table import Table

from proxy.devbroker import BrokerEndpoint, LocalBroker
from proxy.devproxy import ProxyProcess

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
        body = b"x" * body_size
        interval, next_at = 1.0 / rate, time.monotonic()
        while not stop.is_set():
            ch.basic_publish("", QUEUE, body)
            with rates.lock:
                rates.published += 1
            next_at += interval
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


def _queue_depth(broker: BrokerEndpoint) -> tuple[int, int]:
    doc = broker.api("GET", f"/api/queues/%2F/{QUEUE}")
    assert isinstance(doc, dict)
    return int(doc.get("messages", 0)), int(doc.get("message_bytes", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--produce-rate", type=float, default=100.0)
    parser.add_argument("--consume-rate", type=float, default=10.0)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    args = parser.parse_args()

    console = Console()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    console.print(f"[bold]floodwall demo[/]: starting RabbitMQ (logs in {out}/broker) ...")
    node = LocalBroker(out / "broker")
    node.start()
    broker = node.endpoint
    proxy = ProxyProcess(f"127.0.0.1:{broker.amqp_port}", out / "floodwall.log")
    try:
        proxy.start()
        console.print(f"broker on :{broker.amqp_port}, floodwall on :{proxy.port} "
                      f"(admin {proxy.admin_url})")
        setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proxy.port))
        setup.channel().queue_declare(QUEUE, durable=False)
        setup.close()

        rates, stop = Rates(), threading.Event()
        threads = [
            threading.Thread(target=_producer, args=(proxy.port, args.produce_rate,
                                                     args.body_size, stop, rates)),
            threading.Thread(target=_consumer, args=(proxy.port, args.consume_rate, stop,
                                                     rates)),
        ]
        for t in threads:
            t.start()
        samples = []
        started = time.monotonic()
        last = (0, 0, started)
        with Live(console=console, refresh_per_second=4) as live:
            while (now := time.monotonic()) - started < args.seconds:
                time.sleep(1.0)
                now = time.monotonic()
                with rates.lock:
                    pub, con = rates.published, rates.consumed
                messages, nbytes = _queue_depth(broker)
                dt = now - last[2]
                row = {"t": round(now - started, 1), "publish_rate": (pub - last[0]) / dt,
                       "consume_rate": (con - last[1]) / dt, "queue_messages": messages,
                       "queue_bytes": nbytes}
                samples.append(row)
                last = (pub, con, now)
                table = Table(title=f"{QUEUE}: producer {args.produce_rate:g}/s, "
                                    f"consumer {args.consume_rate:g}/s, through floodwall")
                for col in ("t (s)", "published/s", "consumed/s", "queue msgs", "queue bytes"):
                    table.add_column(col, justify="right")
                for r in samples[-10:]:
                    table.add_row(f"{r['t']:.0f}", f"{r['publish_rate']:.0f}",
                                  f"{r['consume_rate']:.0f}", str(r["queue_messages"]),
                                  str(r["queue_bytes"]))
                live.update(table)
        stop.set()
        for t in threads:
            t.join(30)
        (out / "samples.json").write_text(json.dumps(samples, indent=1))
        console.print(f"published {rates.published}, consumed {rates.consumed}, "
                      f"queue now {samples[-1]['queue_messages'] if samples else '?'} messages")
        for err in rates.errors:
            console.print(f"[red]{err}[/]")
        console.print(f"samples: {out}/samples.json, proxy log: {out}/floodwall.log")
    finally:
        proxy.stop()
        node.stop()


if __name__ == "__main__":
    main()
