"""AMQP 1.0 senders at full speed while their queue has room, paced when it has none.

``python -m bench.pace10 [--rounds 2] [--count 20000] [--broker 3.10|4.0]
[--scenarios room,paced,stopped] [--capacities 1GiB,1MiB,256KiB]
[--in-flight-allowance SIZE]``

One private RabbitMQ and one ``floodwall run`` with one policy per capacity (resume =
capacity). The sender is a python-qpid-proton link written the way a new user writes it
(``while sender.credit: sender.send(...)``, 1 KiB messages, unsettled), through the proxy,
into ``/amq/queue/Q`` (3.10) or ``/queues/Q`` (4.0); the consumer is a proton receiver
straight at the broker in a process of its own (prefetch 200, each message accepted): a
proton receiver when paced, ``bench.amqp10``'s raw receiver when as fast as it can.

- **room**: the consumer takes messages as fast as it can (it keeps up with the sender: the
  queue stays near empty); the sender's rate (accepted/s from its 1,000th to its last
  acceptance) at each capacity against its rate at the first (1 GiB: never trips), the
  capacities in turn, their order reversed every round; how long the sender waited with no
  credit, and its deliveries not yet accepted each time it ran out (what the proxy let it
  have in flight). Target: >= 0.95 at 256 KiB and 1 MiB.
- **paced**: the consumer takes ``--pace`` msg/s (2,500); its rate (first to last
  delivery) at each capacity against the first, and the queue's ready count at the broker
  above capacity (a passive declare every 5 ms, 1 KiB per message). Target: >= 0.9 of the
  consumer's pace, within capacity + 256 KiB.
- **stopped**: the last capacity, the consumer fast; it stops dead (no more credit) after
  5,000 messages for ``--pause`` seconds (3), then goes on. The queue above capacity while
  it is stopped, and the time from its restart until the sender is at full speed again (its
  acceptances over 100 ms at 0.9 of its rate before the stop). Target: within capacity +
  256 KiB; full speed again within 1 s.

The machine is small and shared: compare figures of one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.amqp10 import Amqp10Receiver, disposition_frame
from bench.flow import (
    KIB,
    Progress,
    Stack,
    fmt,
    metric_sum,
    policed,
    policy_entry,
    run_main,
    write_policies,
)
from bench.meters import cpu_seconds, median
from bench.pace import BrokerDepth, size_of
from bench.relay import beam_of
from bench.two_links import NaiveSender, declare, delete_queue, thread
from floodwall.dev.devbroker import RELEASE_NAMES, BrokerEndpoint

PREFETCH = 200
ACK_EVERY = 50
WINDOW_S = 0.1  # the sender's rate after a restart, over windows of this length


class Consumer(MessagingHandler):  # type: ignore[misc]
    """At the broker: ``rate`` msg/s (None: as fast as it can, ``PREFETCH`` credit kept out);
    stops granting credit after ``stop_after`` messages for ``pause`` seconds."""

    def __init__(self, broker: BrokerEndpoint, source: str, total: int, rate: float | None,
                 stop_after: int, pause: float, out: Any) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = (f"amqp://{broker.username}:{broker.password}@{broker.host}:"
                    f"{broker.amqp_port}")
        self.source, self.total, self.rate = source, total, rate
        self.stop_after, self.pause, self.out = stop_after, pause, out
        self.got = 0
        self.first: float | None = None
        self.last: float | None = None
        self.stopped_at: float | None = None
        self.restarted_at: float | None = None
        self.budget = 0.0
        self.tick = time.monotonic()

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN", reconnect=False)
        self.receiver = event.container.create_receiver(self.conn, self.source)
        if self.rate is None:
            self.receiver.flow(PREFETCH)
        event.container.schedule(0.002, self)

    def on_link_opened(self, event: Any) -> None:
        self.out.send({"attached": True})  # (the run's sender starts now)

    def on_message(self, event: Any) -> None:
        self.got += 1
        self.last = time.monotonic()
        if self.first is None:
            self.first = self.last
        event.delivery.update(event.delivery.ACCEPTED)
        event.delivery.settle()
        if self.got >= self.total:
            self.finish()
            return
        if self.stop_after and self.got == self.stop_after and self.stopped_at is None:
            self.stopped_at = self.last
        if (self.rate is None and self.stopped_at is None) or self.restarted_at is not None:
            self.receiver.flow(1)
        elif self.rate is not None:
            self.budget -= 1

    def on_timer_task(self, event: Any) -> None:
        if self.got >= self.total:
            return
        now = time.monotonic()
        if self.stopped_at is not None and self.restarted_at is None:
            if now - self.stopped_at >= self.pause:
                self.restarted_at = now
                self.receiver.flow(PREFETCH)
        elif self.rate is not None:
            self.budget = min(self.budget + (now - self.tick) * self.rate, 8)
            # RabbitMQ 4.0 may deliver past the credit it was given (proton's credit then
            # reads below 0): top it up to the budget from wherever it is, not only from 0.
            if self.budget > 0 and self.receiver.credit <= 0:
                self.receiver.flow(max(1, int(self.budget)) - self.receiver.credit)
        self.tick = now
        event.container.schedule(0.002, self)

    def finish(self) -> None:
        self.out.send({"got": self.got, "first": self.first, "last": self.last,
                       "stopped_at": self.stopped_at, "restarted_at": self.restarted_at})
        self.conn.close()


def consume(broker: BrokerEndpoint, source: str, total: int, rate: float | None,
            stop_after: int, pause: float, out: Any) -> None:
    """The consumer's process: proton at ``rate``; the raw receiver when as fast as it can."""
    if rate is None:
        asyncio.run(consume_fast(broker, source, total, stop_after, pause, out))
    else:
        Container(Consumer(broker, source, total, rate, stop_after, pause, out)).run()


async def consume_fast(broker: BrokerEndpoint, source: str, total: int, stop_after: int,
                       pause: float, out: Any) -> None:
    """As fast as it can: ``bench.amqp10``'s receiver (transfers counted, not decoded),
    settling and granting ``PREFETCH`` again every ``ACK_EVERY`` deliveries (a proton receiver
    is slower than a proton sender: its queue would fill, and the run measure its pace); it
    stops granting after ``stop_after`` deliveries for ``pause`` seconds."""
    loop = asyncio.get_running_loop()
    _, client = await asyncio.wait_for(
        loop.create_connection(Amqp10Receiver, broker.host, broker.amqp_port), 10)
    done: asyncio.Future[None] = loop.create_future()
    doc: dict[str, Any] = {"first": None, "last": None, "stopped_at": None,
                           "restarted_at": None}
    settled = 0

    def settle(n: int, grant: bool) -> None:
        nonlocal settled
        first = client.first_id
        assert first is not None
        client.write(disposition_frame(first + settled, first + n - 1))
        settled = n
        if grant:
            client.grant(PREFETCH)

    def restart() -> None:
        doc["restarted_at"] = time.monotonic()
        settle(client.deliveries, True)

    def on_delivery(n: int) -> None:
        doc["last"] = now = time.monotonic()
        if doc["first"] is None:
            doc["first"] = now
        if n >= total:
            settle(n, False)
            if not done.done():
                done.set_result(None)
            return
        if stop_after and n >= stop_after and doc["stopped_at"] is None:
            doc["stopped_at"] = now
            loop.call_later(pause, restart)
            return
        if doc["stopped_at"] is not None and doc["restarted_at"] is None:
            return  # stopped dead: what the last grant allowed still comes
        if n - settled >= ACK_EVERY:
            settle(n, True)

    client.on_delivery = on_delivery
    try:
        await client.open_receiver(source, PREFETCH)
        out.send({"attached": True})  # (the run's sender starts now)
        await asyncio.wait([done, client.lost], timeout=600,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        out.send({"got": client.deliveries, **doc})
        await client.close()


def sender_rate(times: list[float]) -> float | None:
    tail = sorted(times)[1000:]
    return (len(tail) - 1) / (tail[-1] - tail[0]) if len(tail) > 1 else None


def stalls(times: list[float], gap: float = 0.002) -> float:
    """Seconds the sender spent in gaps longer than ``gap`` between two acceptances (after its
    1,000th): waiting on credit, the broker or the machine."""
    ts = sorted(times)[1000:]
    return round(sum(b - a for a, b in itertools.pairwise(ts) if b - a > gap), 3)


def back_to_speed(times: list[float], stopped: float, restarted: float) -> float | None:
    """Seconds from ``restarted`` until the sender's acceptances over ``WINDOW_S`` reach 0.9 of
    its rate over the second before ``stopped``; None if they never do."""
    ts = sorted(times)
    before = [t for t in ts if stopped - 1.0 <= t < stopped]
    if len(before) < 2:
        return None
    want = 0.9 * len(before) / 1.0 * WINDOW_S
    after = [t for t in ts if t >= restarted]
    j = 0
    for i, t in enumerate(after):
        while after[j] < t - WINDOW_S:
            j += 1
        if i - j + 1 >= want:
            return round(t - restarted, 3)
    return None


def send_timeout(count: int) -> float:
    """Long enough for ``count`` messages at 200 msg/s, and at least 30 s."""
    return max(30.0, count / 200)


def one_run(st: Stack, fw: Any, queue: str, capacity: int, count: int, rate: float | None,
            stop_after: int = 0, pause: float = 0.0) -> dict[str, Any]:
    ep = st.endpoint
    v2 = st.release.root is not None  # (the Debian 13 root: RabbitMQ 4)
    declare(ep, [queue])
    deadline = time.monotonic() + 30
    while not policed(fw, queue):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue} not policed")
        time.sleep(0.02)
    target = ("/queues/" if v2 else "/amq/queue/") + queue
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    consumer = ctx.Process(target=consume, args=(ep, target, count, rate, stop_after, pause,
                                                 theirs), daemon=True)
    consumer.start()
    watch = BrokerDepth(ep.host, ep.amqp_port, queue)
    watch.start()
    trips0 = metric_sum(fw, "floodwall_queue_trips_total")
    tripped0 = metric_sum(fw, "floodwall_queue_tripped_seconds_total", queue=queue)
    probes0 = metric_sum(fw, "floodwall_queue_depth_samples_total", queue=queue)
    beam, proxy = beam_of(st.broker), fw.process and psutil.Process(fw.process.pid)
    cpu0 = cpu_seconds(beam), cpu_seconds(proxy)
    sender = NaiveSender(fw.port, {target: count})
    try:
        if not mine.poll(30):
            raise TimeoutError("the consumer did not attach")
        mine.recv()  # attached: what it is sent from now on, it consumes
        t_sender = thread(sender)
        if not sender.done.wait(send_timeout(count)):
            raise TimeoutError(f"sender: {len(sender.accepted[target])} of {count} accepted, "
                               f"{dict(sender.sent)} sent, errors {sender.errors}")
        if not mine.poll(60):
            raise TimeoutError(f"consumer did not finish; sender: {len(sender.accepted[target])} "
                               f"accepted, errors {sender.errors}")
        doc = mine.recv()
        cpu1 = cpu_seconds(beam), cpu_seconds(proxy)
        trips = metric_sum(fw, "floodwall_queue_trips_total") - trips0
        tripped_s = metric_sum(fw, "floodwall_queue_tripped_seconds_total", queue=queue) - tripped0
        counts = metric_sum(fw, "floodwall_queue_depth_samples_total", queue=queue) - probes0
        t_sender.join(10)
    finally:
        watch.halt.set()
        consumer.kill()
        consumer.join(5)
        watch.join(5)
        delete_queue(ep, queue)
    times = sender.accepted[target]
    out: dict[str, Any] = {
        "capacity": capacity, "accepted": len(times), "consumed": doc["got"],
        "errors": sender.errors, "trips": trips, "tripped_s": round(tripped_s, 3),
        "sender_rate": sender_rate(times), "stalled_s": stalls(times),
        "credit_wait_s": round(sender.credit_wait[target], 3),
        "unsettled_when_starved": median(sender.unsettled_when_starved[target] or [0]),
        "consumer_rate": ((doc["got"] - 1) / (doc["last"] - doc["first"])
                          if doc["first"] and doc["last"] and doc["last"] > doc["first"]
                          else None),
        "over_capacity_kib": (watch.max_ready() * KIB - capacity) / KIB,
        "depth_counts": counts,
        "cpu_us_per_message": {"broker": round((cpu1[0] - cpu0[0]) / count * 1e6, 1),
                               "proxy": round((cpu1[1] - cpu0[1]) / count * 1e6, 1)}}
    if stop_after and doc["stopped_at"] and doc["restarted_at"]:
        out["over_capacity_stopped_kib"] = (
            watch.max_ready(doc["stopped_at"]) * KIB - capacity) / KIB
        out["back_to_speed_s"] = back_to_speed(times, doc["stopped_at"], doc["restarted_at"])
    return out


async def scenario(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    labels = opts.capacities
    names = {label: f"pace10.{label}" for label in labels}
    allowance = ({"in_flight_allowance": opts.in_flight_allowance}
                 if opts.in_flight_allowance else {})
    policies = write_policies(st.workdir / "pace10.yaml", *(
        policy_entry(f"p{label}", f"{names[label]}.*", label, label, **allowance)
        for label in labels))
    fw = st.floodwall("floodwall-pace10", policies, ("--fleet", "off", *opts.proxy_args))
    out: dict[str, Any] = {}
    try:
        for kind in opts.scenarios:
            rate = opts.pace if kind == "paced" else None
            if kind == "stopped":
                last = labels[-1]
                q = f"{names[last]}.{uuid.uuid4().hex[:6]}"
                res = await asyncio.to_thread(one_run, st, fw, q, size_of(last), opts.count,
                                              None, 5000, opts.pause)
                progress(f"stopped {last}: {res}")
                out["stopped"] = res
                continue
            rounds = []
            for r in range(opts.rounds):
                row: dict[str, Any] = {}
                for label in (labels if r % 2 == 0 else labels[::-1]):
                    q = f"{names[label]}.{uuid.uuid4().hex[:6]}"
                    count = opts.count if rate is None else min(opts.count, int(rate * 4))
                    row[label] = res = await asyncio.to_thread(
                        one_run, st, fw, q, size_of(label), count, rate)
                    progress(f"{kind} round {r} {label}: {res}")
                measure = "sender_rate" if rate is None else "consumer_rate"
                ref = row[labels[0]].get(measure)
                for label in labels:
                    v = row[label].get(measure)
                    row[label]["ratio"] = round(v / ref, 3) if v and ref else None
                rounds.append(row)
            out[kind] = {"rounds": rounds, "ratio": {
                label: median([r[label]["ratio"] for r in rounds if r[label]["ratio"]])
                for label in labels}, "max_over_capacity_kib": {
                label: max(r[label]["over_capacity_kib"] for r in rounds) for label in labels}}
    finally:
        st.stop_proxy(fw)
    return out


def report(doc: dict[str, Any]) -> None:
    res = doc["results"].get("pace10", {})
    print(f"\nfloodwall AMQP 1.0 pace benchmark, {doc['meta']['started']} "
          f"({doc['meta']['command']})")
    for kind, what in (("room", "sender rate"), ("paced", "consumer rate")):
        s = res.get(kind)
        if not s:
            continue
        print(f"  {kind}: {what} against the first capacity (median of rounds); max above "
              "capacity at the broker")
        for label, ratio in s["ratio"].items():
            rates = [r[label].get("sender_rate" if kind == "room" else "consumer_rate")
                     for r in s["rounds"]]
            print(f"    {label:>7}: ratio {fmt(ratio, '.3f')} (rates "
                  f"{', '.join(fmt(v, ',.0f') for v in rates)} msg/s), over capacity "
                  f"{fmt(s['max_over_capacity_kib'][label], '.0f')} KiB, trips "
                  f"{', '.join(fmt(r[label]['trips'], '.0f') for r in s['rounds'])} "
                  f"(tripped for "
                  f"{', '.join(fmt(r[label].get('tripped_s'), '.2f') for r in s['rounds'])} s)")
            runs = [r[label] for r in s["rounds"]]
            print("             waited for credit "
                  f"{', '.join(fmt(r.get('credit_wait_s'), '.2f') for r in runs)} s, "
                  "unsettled when out of credit (median) "
                  f"{', '.join(fmt(r.get('unsettled_when_starved'), '.0f') for r in runs)}")
    s = res.get("stopped")
    if s:
        print(f"  stopped at {s['capacity'] // KIB} KiB: over capacity while stopped "
              f"{fmt(s.get('over_capacity_stopped_kib'), '.0f')} KiB, full speed again "
              f"{fmt(s.get('back_to_speed_s'), '.3f')} s after the restart, errors "
              f"{s['errors'] or 'none'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pace10",
                                description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--count", type=int, default=20000)
    p.add_argument("--pace", type=float, default=2500.0, help="the paced consumer, msg/s")
    p.add_argument("--pause", type=float, default=3.0, help="the stopped consumer's pause, s")
    p.add_argument("--capacities", type=lambda s: s.split(","),
                   default=["1GiB", "1MiB", "256KiB"],
                   help="the first is the reference (never trips); stopped uses the last")
    p.add_argument("--scenarios", type=lambda s: s.split(","),
                   default=["room", "paced", "stopped"])
    p.add_argument("--broker", choices=RELEASE_NAMES, default="3.10")
    p.add_argument("--in-flight-allowance", metavar="SIZE", default=None,
                   help="every policy's in_flight_allowance (default: auto)")
    p.add_argument("--out", type=Path, default=None)
    opts, opts.proxy_args = p.parse_known_args(argv)  # the rest: ``floodwall run`` options
    return run_main("pace10", argv, {"pace10": scenario}, opts, ["pace10"], report)


if __name__ == "__main__":
    sys.exit(main())
