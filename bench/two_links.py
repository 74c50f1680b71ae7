"""The two-link scenario: a python-qpid-proton sender at full speed, through floodwall.

``python -m bench.two_links [--rounds 3] [--rates 2500,250,0] [--count 6000]
[--free-count 30000] [--broker 3.10|4.0] [--address v1|v2|null] [--control]``

``--address``: the links' addresses. ``v1`` (the default): ``/queue/Q``, which RabbitMQ 3.10
declares on attach (4.0 still takes it, deprecated). ``v2``: RabbitMQ 4's ``/queues/Q`` (the
queues declared first; not on 3.10). ``null``: the capped link has a null target and each
message carries ``to`` ``/queues/Q`` (RabbitMQ 4); the free link stays ``/queues/F``.

One proton connection, one session, two sender links written the way a new user writes them
(``while sender.credit: sender.send(...)``): ``/queue/two.capped`` (policy 512 KiB, resume =
capacity) and ``/queue/two.free`` (no policy), 1 KiB messages: ``--count`` on the capped link,
``--free-count`` on the free one (its run some 2-3 s: a shorter one, 5,000 messages in 0.4 s,
moved 0.8-1.1 between rounds with a hiccup of the broker's or the client's). A consumer
straight at the broker drains the capped queue at ``--rates`` msg/s (credit paced, each
message accepted as it comes) and the free queue as fast as it can. Per round and rate:

- accepted on each link, consumed from each queue, link/session/connection errors;
- the capped queue's depth at the broker over capacity: the maximum of ready x 1 KiB from a
  passive declare every 20 ms (the consumer holds at most one message unacknowledged);
- trips, and floodwall's own overshoot count (messages forwarded to the queue while it was
  tripped, sent on credit granted before the trip) per trip, and how often floodwall
  counted the capped queue (passive declares a second over the run);
- the free link's rate (accepted/s from its 1,000th to its last acceptance) with the capped
  link throttled beside it, against its rate alone (the capped link idle) in the same round:
  rounds alternate alone/both and both/alone. At a consumer rate of 0 nobody consumes the
  capped queue (``/queue/two.stopped``, 512 KiB, resume 256 KiB): the free link starts
  once the capped one is tripped and stays throttled outright (no credit), so the free
  link's ratio shows what the proxy's throttling itself costs a neighbour on the same
  session. At rates above 0 the capped link is admitted at the consumer's pace and its
  sends share the client's one proton thread with the free link, so the ratio there also
  measures the client's own CPU;
- so the capped link's sends a second over the free link's run: what it took of that thread
  while the free link's rate was measured;
- with ``--control``, a third leg each round: the free link alone again, its ratio to the
  round's alone run what the harness moves by with nothing changed (the spread a single
  round's ratio is read against).

The consumer and the depth watcher run in a process of their own (``BrokerSide``): the
sender's process runs the sender alone, as an application's would.

Targets: every message accepted on both links and consumed, at most 256 KiB over
capacity (goal 64 KiB), no link error, free-link ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import psutil
from proton import Endpoint, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.flow import (
    Progress,
    Stack,
    fmt,
    metric_sum,
    policed,
    policy_entry,
    run_main,
    until,
    write_policies,
)
from bench.meters import CpuMeter, cpu_seconds, mann_whitney, median
from bench.relay import beam_of
from floodwall.dev.devbroker import RELEASE_NAMES, BrokerEndpoint

KIB = 1024
CAPACITY = 512 * KIB
NULL = "null:"


class NaiveSender(MessagingHandler):  # type: ignore[misc]
    """Two links on one session; each sends while ``sender.credit`` says so."""

    def __init__(self, port: int, counts: dict[str, int],
                 finish: list[str] | None = None) -> None:
        super().__init__()
        self.url = f"amqp://guest:guest@127.0.0.1:{port}"
        self.counts = counts
        self.addresses = list(counts)
        self.finish = self.addresses if finish is None else finish  # done when these are
        self.hold: set[str] = set()  # addresses that wait for ``go`` before sending
        self.go = threading.Event()
        # (RabbitMQ 3.10's amqp1_0 plugin can settle a delivery twice: once alone, once in
        # a range from another queue's oldest unconfirmed delivery over it)
        self.tags: set[tuple[str, bytes]] = set()
        self.senders: list[Any] = []
        self.sent: dict[str, int] = collections.Counter()
        self.sent_at: dict[str, list[float]] = collections.defaultdict(list)
        self.accepted: dict[str, list[float]] = collections.defaultdict(list)
        # Seconds each link waited with no credit, from the send that spent its last credit
        # to the next credit the client saw; its deliveries not yet accepted at each such
        # send (what the proxy's in-flight bound let it have out).
        self.credit_wait: dict[str, float] = collections.Counter()
        self.unsettled_when_starved: dict[str, list[int]] = collections.defaultdict(list)
        self._starved_since: dict[str, float] = {}
        self.errors: list[str] = []
        self.done = threading.Event()
        # per address: no more acceptances will come (all accepted, or the connection failed)
        self.ended = {a: threading.Event() for a in counts}

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, allowed_mechs="PLAIN", reconnect=False)
        for key in self.addresses:  # "null:/queues/Q": a null target, each message's to
            target = None if key.startswith(NULL) else key
            self.senders.append(event.container.create_sender(conn, target, name=key))
        if self.hold:
            event.container.schedule(0.005, self)

    def on_timer_task(self, event: Any) -> None:
        if not self.go.is_set():
            event.container.schedule(0.005, self)
            return
        self.hold.clear()
        for sender in self.senders:
            if sender.credit > 0:
                self.send(sender)

    def on_sendable(self, event: Any) -> None:
        since = self._starved_since.pop(event.sender.name, None)
        if since is not None:
            self.credit_wait[event.sender.name] += time.monotonic() - since
        self.send(event.sender)

    def send(self, sender: Any) -> None:
        address = sender.name
        if address in self.hold:
            return
        to = address[len(NULL):] if address.startswith(NULL) else None
        count = self.counts[address]
        while sender.credit > 0 and self.sent[address] < count:
            sender.send(Message(body=b"x" * KIB, address=to))
            self.sent[address] += 1
            self.sent_at[address].append(time.monotonic())
        if self.sent[address] < count and address not in self._starved_since:
            self._starved_since[address] = time.monotonic()
            self.unsettled_when_starved[address].append(
                self.sent[address] - len(self.accepted[address]))

    def on_accepted(self, event: Any) -> None:
        address = event.link.name
        if (address, event.delivery.tag) in self.tags:
            return
        self.tags.add((address, event.delivery.tag))
        self.accepted[address].append(time.monotonic())
        if len(self.accepted[address]) >= self.counts[address]:
            self.ended[address].set()
        if all(self.ended[a].is_set() for a in self.finish):
            self.done.set()
            event.connection.close()

    def on_rejected(self, event: Any) -> None:
        self.errors.append("rejected")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link: {event.link.remote_condition}")
        self._failed()
        event.connection.close()

    def on_session_error(self, event: Any) -> None:
        self.errors.append(f"session: {event.session.remote_condition}")

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f"connection: {event.connection.remote_condition}")
        self._failed()

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f"transport: {event.transport.condition}")
        self._failed()

    def _failed(self) -> None:
        self.done.set()
        for ended in self.ended.values():
            ended.set()


class PacedConsumer(MessagingHandler):  # type: ignore[misc]
    """At the broker: ``rate`` msg/s from the capped queue, the free one as fast as it can."""

    def __init__(self, broker: BrokerEndpoint, qcap: str, qfree: str, rate: float,
                 source: str = "/amq/queue/") -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = (f"amqp://{broker.username}:{broker.password}@{broker.host}:"
                    f"{broker.amqp_port}")
        self.qcap, self.qfree, self.rate, self.source = qcap, qfree, rate, source
        self.got: dict[str, int] = collections.Counter()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.budget = 0.0
        self.last = time.monotonic()
        self.overrun = False

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN", reconnect=False)
        self.cap = (event.container.create_receiver(self.conn, self.source + self.qcap)
                    if self.qcap else None)  # (alone: no capped queue to attach to)
        self.free = event.container.create_receiver(self.conn, self.source + self.qfree)
        event.container.schedule(0.002, self)

    def on_link_opened(self, event: Any) -> None:
        # Credit only once the broker's attach is in: proton puts delivery-count 0 on a flow
        # sent before it, and RabbitMQ 4 starts its links at 2**32 - 5, so such a flow grants
        # 5 more than asked (proton's credit then reads below 0, and every later flow carries
        # a delivery-count behind the broker's: the capped link stalled for good).
        if event.receiver is not None and event.receiver.name == self.free.name:
            self.free.flow(500)

    def on_message(self, event: Any) -> None:
        free = event.receiver.name == self.free.name
        self.got["free" if free else "cap"] += 1
        event.delivery.update(event.delivery.ACCEPTED)
        event.delivery.settle()
        if free:
            self.free.flow(1)
            return
        self.budget -= 1
        if self.cap.credit < 0 and not self.overrun:
            self.overrun = True
            self.errors.append("the broker delivered past the capped link's credit")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"consumer link: {event.link.remote_condition}")

    def on_timer_task(self, event: Any) -> None:
        if self.stop.is_set():
            self.conn.close()
            return
        now = time.monotonic()
        self.budget = min(self.budget + (now - self.last) * self.rate, 8)
        self.last = now
        if (self.cap is not None and self.cap.state & Endpoint.REMOTE_ACTIVE
                and self.budget >= 1 and self.cap.credit == 0):
            self.cap.flow(int(self.budget))
        event.container.schedule(0.002, self)


def thread(handler: Any) -> threading.Thread:
    t = threading.Thread(target=lambda: Container(handler).run(), daemon=True)
    t.start()
    return t


class BrokerSide:
    """The paced consumer and the depth watcher in a process of their own, so that the
    sender's process runs the sender alone: in one process their Python threads took the
    sender's GIL (the harness at 0.9 of a core, the proxy at 0.2), and the free link's ratio
    measured the harness. The watcher starts with the process (``start``), the consumer at
    ``consume``; ``got`` and ``max_ready`` are read across the processes."""

    def __init__(self, broker: BrokerEndpoint, qcap: str, qfree: str, rate: float,
                 source: str, watched: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.cap, self.free, self.max_ready = (ctx.Value("q", 0), ctx.Value("q", 0),
                                               ctx.Value("q", 0))
        self.stop, self.go, self.started = ctx.Event(), ctx.Event(), ctx.Event()
        self.errors_out = ctx.SimpleQueue()
        self.process = ctx.Process(target=_broker_side, daemon=True, args=(
            broker, qcap, qfree, rate, source, watched, self.cap, self.free, self.max_ready,
            self.stop, self.go, self.started, self.errors_out))

    def start(self) -> None:
        self.process.start()
        if not self.started.wait(30):
            raise TimeoutError("the consumer process did not start")

    def consume(self) -> None:
        self.go.set()

    @property
    def got(self) -> dict[str, int]:
        return {"cap": self.cap.value, "free": self.free.value}

    def finish(self) -> list[str]:
        """Stop both, wait for the process; the consumer's errors."""
        self.stop.set()
        self.process.join(15)
        errors: list[str] = []
        while not self.errors_out.empty():
            errors.append(self.errors_out.get())
        return errors


def _broker_side(broker: BrokerEndpoint, qcap: str, qfree: str, rate: float, source: str,
                 watched: str, cap: Any, free: Any, max_ready: Any, stop: Any, go: Any,
                 started: Any, errors_out: Any) -> None:
    """The child process of ``BrokerSide``: the watcher at once, the consumer's container
    once ``go`` is set."""
    consumer = PacedConsumer(broker, qcap, qfree, rate, source)
    halt = threading.Event()
    depth: dict[str, int] = {}
    watcher = threading.Thread(target=watch_depth, args=(broker, watched, halt, depth),
                               daemon=True)
    watcher.start()
    started.set()
    t_consumer: threading.Thread | None = None
    while not stop.wait(0.05):
        if t_consumer is None and go.is_set():
            t_consumer = thread(consumer)
        cap.value, free.value = consumer.got["cap"], consumer.got["free"]
        max_ready.value = depth.get("max_ready", 0)
    consumer.stop.set()
    halt.set()
    if t_consumer is not None:
        t_consumer.join(10)
    watcher.join(10)
    cap.value, free.value = consumer.got["cap"], consumer.got["free"]
    max_ready.value = depth.get("max_ready", 0)
    for error in consumer.errors:
        errors_out.put(error)


def watch_depth(broker: BrokerEndpoint, queue: str, stop: threading.Event,
                out: dict[str, int]) -> None:
    params = pika.ConnectionParameters(broker.host, broker.amqp_port, credentials=(
        pika.PlainCredentials(broker.username, broker.password)))
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    while not stop.is_set():
        try:
            n = ch.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:  # not declared yet
            ch = conn.channel()
            n = 0
        out["max_ready"] = max(out.get("max_ready", 0), n)
        stop.wait(0.02)
    conn.close()


def wait_declared(broker: BrokerEndpoint, queues: list[str], timeout: float) -> None:
    """Until each of ``queues`` exists (a ``/queue/`` sender link declares its own): the
    consumer attaches with ``/amq/queue/``, which a missing queue refuses, and a refused
    receiver takes nothing for the rest of the run."""
    params = pika.ConnectionParameters(broker.host, broker.amqp_port, credentials=(
        pika.PlainCredentials(broker.username, broker.password)))
    deadline = time.monotonic() + timeout
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        for queue in queues:
            while True:
                try:
                    ch.queue_declare(queue, passive=True)
                    break
                except pika.exceptions.ChannelClosedByBroker:  # not declared yet
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"queue {queue} not declared after {timeout}s") from None
                    ch = conn.channel()
                    time.sleep(0.01)


def declare(broker: BrokerEndpoint, queues: list[str]) -> None:
    """Declare ``queues`` at the broker (the v2 forms declare nothing on attach)."""
    params = pika.ConnectionParameters(broker.host, broker.amqp_port, credentials=(
        pika.PlainCredentials(broker.username, broker.password)))
    with pika.BlockingConnection(params) as conn:
        for queue in queues:
            conn.channel().queue_declare(queue)


def tripped(fw: Any, queue: str) -> bool:
    return metric_sum(fw, "floodwall_queue_tripped", queue=queue) > 0


def delete_queue(broker: BrokerEndpoint, queue: str) -> None:
    params = pika.ConnectionParameters(broker.host, broker.amqp_port, credentials=(
        pika.PlainCredentials(broker.username, broker.password)))
    with pika.BlockingConnection(params) as conn:
        conn.channel().queue_delete(queue)


def free_run(accepted: list[float]) -> tuple[float, float, int] | None:
    """The free link's run: its 1,000th and last acceptance, and the acceptances between."""
    tail = sorted(accepted)[1000:]
    return (tail[0], tail[-1], len(tail)) if len(tail) > 1 and tail[-1] > tail[0] else None


def free_rate(accepted: list[float]) -> float:
    run = free_run(accepted)
    return float("nan") if run is None else (run[2] - 1) / (run[1] - run[0])


def beside_rate(sent: list[float], free: list[float]) -> float:
    """The capped link's sends a second over the free link's run (``free_run``): one proton
    thread sends both links, so this is what the capped link took of it while the free
    link's rate was measured. (Its sends, not its acceptances: a message the proxy holds is
    accepted only when its queue admits it.)"""
    run = free_run(free)
    if run is None:
        return float("nan")
    lo, hi, _ = run
    return sum(1 for t in sent if lo <= t <= hi) / (hi - lo)


def one_run(st: Stack, fw: Any, rate: float, count: int, free_count: int, both: bool,
            form: str = "v1") -> dict[str, Any]:
    kind = "stopped" if rate == 0 else "capped"  # (a policy with hysteresis, see scenario)
    qcap, qfree = f"two.{kind}.{uuid.uuid4().hex[:6]}", f"two.free.{uuid.uuid4().hex[:6]}"
    prefix = "/queue/" if form == "v1" else "/queues/"
    cap_key = (NULL if form == "null" else "") + prefix + qcap
    free_key = prefix + qfree
    if form != "v1":  # only the v1 /queue/ form declares its queue on attach
        declare(st.endpoint, [qcap, qfree])
    counts = ({cap_key: count} if both else {}) | {free_key: free_count}
    # rate 0: nobody consumes the capped queue, so its link stays throttled (no credit)
    # once the queue is full; the run ends when the free link is done
    sender = NaiveSender(fw.port, counts, finish=[free_key] if rate == 0 else None)
    if rate == 0:  # the free link starts once the capped one is throttled (or alone: at once)
        sender.hold.add(free_key)
    consumer = BrokerSide(st.endpoint, qcap if both else "", qfree, rate,
                          "/amq/queue/" if form == "v1" else "/queues/", qcap)
    trips0 = metric_sum(fw, "floodwall_queue_trips_total")
    over0 = metric_sum(fw, "floodwall_queue_overshoot_messages_total")
    counts0 = metric_sum(fw, "floodwall_queue_depth_samples_total", queue=qcap)
    started = time.monotonic()
    consumer.start()  # its depth watcher from now on
    # the cores each process used while the free link ran (its run's ends: its first
    # send, its last acceptance), and floodwall's socket reads and writes (thousands a
    # second), so that what a throttled neighbour costs can be placed
    meter = CpuMeter(beam_of(st.broker))
    fw_proc = psutil.Process(fw.process.pid) if fw.process else None
    consumer_proc = psutil.Process(consumer.process.pid)
    s0, c0 = meter.snapshot(fw_proc), cpu_seconds(consumer_proc)
    t_sender = thread(sender)
    # the links declare their queues: the consumer attaches once they exist (the capped
    # one also once floodwall has a depth for it)
    wait_declared(st.endpoint, ([qcap] if both else []) + [qfree], 30)
    if both:
        deadline = time.monotonic() + 30
        while not policed(fw, qcap) and time.monotonic() < deadline:
            time.sleep(0.02)
    consumer.consume()
    if rate == 0:
        deadline = time.monotonic() + 30
        while both and not tripped(fw, qcap) and time.monotonic() < deadline:
            time.sleep(0.01)
        sender.go.set()
    deadline = time.monotonic() + 120
    sender.ended[free_key].wait(120)
    s1, c1 = meter.snapshot(fw_proc), cpu_seconds(consumer_proc)
    cpu = CpuMeter.delta(s0, s1)
    cores = {"floodwall": cpu["relay_cpu_s"], "broker": cpu["broker_cpu_s"],
             "sender": cpu["client_cpu_s"], "consumer": c1 - c0,
             "machine": cpu["machine_cpu_s"]}
    cores = {k: v / cpu["wall_s"] for k, v in cores.items()}
    cores |= {"floodwall_reads_k": cpu["relay_reads"] / cpu["wall_s"] / 1000,
              "floodwall_writes_k": cpu["relay_writes"] / cpu["wall_s"] / 1000}
    sender.done.wait(max(1.0, deadline - time.monotonic()))
    deadline = time.monotonic() + 60
    want = {"cap": count if both and rate else 0, "free": free_count}
    while any(consumer.got[k] < v for k, v in want.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer_errors = consumer.finish()
    t_sender.join(10)
    trips = metric_sum(fw, "floodwall_queue_trips_total") - trips0
    over = metric_sum(fw, "floodwall_queue_overshoot_messages_total") - over0
    counts = metric_sum(fw, "floodwall_queue_depth_samples_total", queue=qcap) - counts0
    elapsed = time.monotonic() - started
    if both and rate == 0:  # what the throttled link left behind (after its metrics)
        delete_queue(st.endpoint, qcap)
    acc = {a.split("/")[-1].split(".")[1]: len(t) for a, t in sender.accepted.items()}
    return {"both": both, "rate": rate, "accepted": acc, "consumed": consumer.got,
            "errors": sender.errors + consumer_errors,
            "over_capacity_kib": max(0, consumer.max_ready.value * KIB - CAPACITY) / KIB,
            "trips": trips, "overshoot_messages": over,
            "overshoot_per_trip": over / trips if trips else 0.0,
            "capped_counts_per_s": counts / elapsed,
            "cores_while_free_ran": cores,
            "free_msgs_per_s": free_rate(sender.accepted[free_key]),
            "capped_sends_per_s": beside_rate(sender.sent_at[cap_key] if both else [],
                                              sender.accepted[free_key])}


async def scenario(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    # resume = capacity trips as often as possible while a consumer drains; with nobody
    # consuming it would flap on the estimate's noise (each release a burst of credit), so
    # the stopped runs' queue resumes at half its capacity
    policies = write_policies(st.workdir / "two-links.yaml",
                              policy_entry("two-capped", "two.capped.*", "512KiB", "512KiB"),
                              policy_entry("two-stopped", "two.stopped.*", "512KiB", "256KiB"))
    fw = st.floodwall("floodwall-two-links", policies)
    out: dict[str, Any] = {}
    try:
        await until(lambda: policed(fw, "none") or True, 1, "started")
        for rate in opts.rates:
            runs = []
            for r in range(opts.rounds):
                legs = ["alone", "both"] + (["control"] if opts.control else [])
                for leg in legs if r % 2 == 0 else legs[::-1]:
                    both = leg == "both"
                    res = await asyncio.to_thread(one_run, st, fw, rate, opts.count,
                                                  opts.free_count, both,
                                                  opts.address)
                    res["round"], res["control"] = r, leg == "control"
                    runs.append(res)
                    progress(f"   {rate:.0f} msg/s round {r + 1} {leg:<7}"
                             f": accepted {res['accepted']}, consumed {res['consumed']}, "
                             f"over capacity {res['over_capacity_kib']:.0f} KiB, trips "
                             f"{res['trips']:.0f}, overshoot/trip "
                             f"{res['overshoot_per_trip']:.1f} msgs, free "
                             f"{res['free_msgs_per_s']:,.0f} msg/s"
                             + (f", ERRORS {res['errors']}" if res["errors"] else ""))
            out[f"{rate:.0f}"] = summarize(runs, opts.count, opts.free_count)
    finally:
        st.stop_proxy(fw)
    return out


def summarize(runs: list[dict[str, Any]], count: int, free_count: int) -> dict[str, Any]:
    both = [r for r in runs if r["both"]]
    stopped = both and both[0]["rate"] == 0  # the capped link sends only until it trips
    alone = {r["round"]: r["free_msgs_per_s"] for r in runs
             if not r["both"] and not r["control"]}

    def paired(legs: list[dict[str, Any]]) -> list[float]:
        return [r["free_msgs_per_s"] / alone[r["round"]] for r in legs if alone.get(r["round"])]
    ratios = paired(both)
    control = paired([r for r in runs if r["control"]])
    return {
        "runs": runs,
        "all_accepted": all((stopped or r["accepted"].get("capped") == count)
                            and r["accepted"].get("free") == free_count for r in both),
        "all_consumed": all((stopped or r["consumed"].get("cap") == count)
                            and r["consumed"].get("free") == free_count for r in both),
        "errors": [e for r in runs for e in r["errors"]],
        "max_over_capacity_kib": max(r["over_capacity_kib"] for r in both),
        "trips": median([r["trips"] for r in both]),
        "overshoot_per_trip": median([r["overshoot_per_trip"] for r in both]),
        "capped_counts_per_s": median([r["capped_counts_per_s"] for r in both]),
        "free_ratio_paired": median(ratios),
        "free_ratios": ratios,
        "control_ratios": control,
        "free_alone": median(list(alone.values())),
        "free_both": median([r["free_msgs_per_s"] for r in both]),
        "capped_sends_beside": median([r["capped_sends_per_s"] for r in both]),
        "cores_alone": median_cores([r for r in runs if not r["both"] and not r["control"]]),
        "cores_both": median_cores(both),
    }


def spread(ratios: list[float]) -> str:
    """The lowest and highest of a leg's paired ratios."""
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def median_cores(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per process, the median over ``runs`` of the cores it used while the free link ran."""
    keys = runs[0]["cores_while_free_ran"] if runs else {}
    return {k: median([r["cores_while_free_ran"][k] for r in runs]) for k in keys}


def report(doc: dict[str, Any]) -> None:
    print(f"\nfloodwall two-links benchmark, {doc['meta']['started']} "
          f"({doc['meta']['command']})")
    for rate, s in doc["results"]["two_links"].items():
        if not isinstance(s, dict):
            continue
        what = ("the free link" if rate == "0" else "both links")
        print(f"  consumer {rate} msg/s: every message accepted on {what}: "
              f"{s['all_accepted']}, "
              f"consumed all: {s['all_consumed']}, errors {s['errors'] or 'none'}")
        print(f"    capped queue over capacity: max {fmt(s['max_over_capacity_kib'], '.0f')} "
              f"KiB; trips (median) {fmt(s['trips'], '.0f')}, overshoot per trip "
              f"{fmt(s['overshoot_per_trip'], '.1f')} msgs"
              + (f"; counted {fmt(s['capped_counts_per_s'], '.0f')} times a second"
                 if "capped_counts_per_s" in s else ""))
        print(f"    free link: alone {fmt(s['free_alone'], ',.0f')} msg/s, beside the throttled "
              f"link {fmt(s['free_both'], ',.0f')} msg/s, paired ratio "
              f"{fmt(s['free_ratio_paired'], '.3f')} (target >= 0.95)"
              + (f"; rounds {spread(s['free_ratios'])}" if s.get("free_ratios") else ""))
        if s.get("control_ratios"):
            u, p = mann_whitney(s["free_ratios"], s["control_ratios"])
            print(f"    control, the free link alone again against alone: median "
                  f"{median(s['control_ratios']):.3f}, rounds {spread(s['control_ratios'])} "
                  f"(the harness's own spread); beside against control: Mann-Whitney U "
                  f"{u:.1f} of {len(s['free_ratios']) * len(s['control_ratios'])}, p {p:.2f}")
        if "capped_sends_beside" in s:
            print(f"    the capped link's sends while the free link ran: "
                  f"{fmt(s['capped_sends_beside'], ',.0f')} msg/s (what it took of the "
                  f"client's one thread)")
        if s.get("cores_alone"):
            print("    cores while the free link ran, alone / beside the throttled link: "
                  + ", ".join(f"{k} {s['cores_alone'][k]:.2f} / {s['cores_both'][k]:.2f}"
                              for k in s["cores_alone"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.two_links",
                                description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                   default=[2500.0, 250.0, 0.0],
                   help="the capped queue's consumer, msg/s; 0: stopped (the capped link "
                   "stays throttled, the run ends when the free link is done)")
    p.add_argument("--count", type=int, default=6000, help="messages on the capped link")
    p.add_argument("--free-count", type=int, default=30000,
                   help="messages on the free link (its rate: from its 1,000th acceptance)")
    p.add_argument("--broker", choices=RELEASE_NAMES, default="3.10",
                   help="RabbitMQ 3.10 (the host's) or 4.0 (the Debian 13 root)")
    p.add_argument("--address", choices=("v1", "v2", "null"), default="v1",
                   help="v1 /queue/Q; v2 /queues/Q (RabbitMQ 4); null: the capped link's "
                   "target null, each message's to /queues/Q (RabbitMQ 4)")
    p.add_argument("--control", action="store_true",
                   help="each round also runs the free link alone a second time: its ratio "
                   "to the first is what the harness moves by with nothing changed")
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)
    if opts.address != "v1" and opts.broker == "3.10":
        p.error(f"--address {opts.address} needs RabbitMQ 4 (--broker 4.0): 3.10 has no v2 "
                "addresses and refuses a null target")
    return run_main("two_links", argv, {"two_links": scenario}, opts, ["two_links"], report)


if __name__ == "__main__":
    sys.exit(main())
