"""Sans-IO micro-benchmark of the AMQP 0-9-1 core's per-message paths.

The ``amqp091.Connection`` core alone, no sockets, tuned as a real client tunes it
(frame_max 131,072), fed realistic streams cut into socket-sized reads (``--read`` bytes,
64 KiB by default, so that most reads end inside a frame as real ones do). Reports the
microseconds of CPU per message spent in the core's calls (the thread's CPU time, so that
other processes on a shared machine do not count; building the input is not counted), best
of ``--repeat`` runs, for these set-ups:

- ``publish``: 1 KiB ``basic.publish`` + header + body on channel 1 to the default exchange,
  routing key ``bench.firehose``, gate off (the plain relay);
- ``publish-policed``: the same with the policies of ``bench.flow``'s throughput scenario
  loaded and ``bench.firehose`` policed, nothing near capacity (a depth sample every 4,096);
- ``publish-unpoliced``: policies loaded, but none matches the queue;
- ``publish-held-free``: policed, another channel (3) of the connection holds (its queue is
  tripped and it sent one publish, held); measured: publishes on channel 1, which is free;
- ``publish-held``: the publisher's own queue (capacity 256 KiB) is tripped and admits at its
  consumers' pace: every publish is held, then let go by the admission. The relay
  is emulated on a clock of its own: a read while the gate is within its hold budget, else a
  ready count (every 5.3 ms of that clock, the queue found empty: a fast consumer) and the
  ``ChannelAdmitted`` it hands out, carried out as the I/O layer does;
- ``deliver`` / ``deliver-policed``: the broker's ``basic.deliver`` + header + body to a
  consumer, one ``multiple`` ``basic.ack`` from the client per 250 deliveries (the drain
  scenario of ``bench.relay``), gate off and with the gate;
- ``handshake``: a "message" is a whole connection, as ``bench.connections``' raw client
  makes them at 1,000 a second: the core made (gate off), start, start-ok, tune, tune-ok +
  open, open-ok, close, close-ok, one read each.

The output is taken as the relay takes it: the pieces for one vectored write
(``chunks_for_server``; a checkout without them: its joined ``data_for_server``). ``--size
1048576`` measures 1 MiB messages (bodies split at frame_max, 9 frames). To compare with
another checkout: ``cd /tmp && PYTHONPATH=/path/to/checkout python /this/bench/core091.py``.

Each set-up also checks that what left the core is byte for byte what went in.

```
.venv/bin/python -m bench.core091
.venv/bin/python -m bench.core091 --setups publish-policed --profile
```
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any, cast

from pamqp import body, commands, frame, header

from bench.gate10 import POLICIES
from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.events import ChannelAdmitted, ChannelFreed
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.enforce.shared import Enforcement
from floodwall.wire.amqp091.connection import Connection

QUEUE = "bench.firehose"
TRIPPED = "bench.firehose.tripped"
FRAME_MAX = 131_072
SAMPLE_EVERY = 4096
SETUPS = ("publish", "publish-policed", "publish-unpoliced", "publish-held-free",
          "publish-held", "deliver", "deliver-policed", "handshake")
HELD = "bench.held"
#: The policed queue far from its capacity whatever the message size: the loop relays 1 MiB
#: messages at thousands a second, and each ready count keeps the last ``SETTLE`` (100 ms)
#: of the ledger in the estimate, which at 1 MiB is some 500 MB (gate10's 256 MiB tripped).
FAR_CAPACITY = ("capacity: 256MiB,\n     resume: 192MiB", "capacity: 8GiB,\n     resume: 6GiB")
HELD_POLICY = """
  - {name: held, match: {vhost: "/", queue: "bench.held"}, capacity: 256KiB, resume: 256KiB,
     deadline: 120s}
"""

_C = commands.Connection
_CH = commands.Channel
_B = commands.Basic


def encode(value: Any, channel: int = 0) -> bytes:
    return bytes(frame.marshal(value, channel))


def content(channel: int, payload: bytes) -> bytes:
    props = _B.Properties(delivery_mode=2)
    return (encode(header.ContentHeader(0, len(payload), props), channel)
            + b"".join(encode(body.ContentBody(payload[i:i + FRAME_MAX - 8]), channel)
                       for i in range(0, len(payload), FRAME_MAX - 8)))


def publish(channel: int, routing_key: str, payload: bytes) -> bytes:
    return encode(_B.Publish(exchange="", routing_key=routing_key), channel) \
        + content(channel, payload)


def deliver(tag: int, payload: bytes) -> bytes:
    return encode(_B.Deliver(consumer_tag="ctag", delivery_tag=tag, exchange="",
                             routing_key="bench.drain"), 1) + content(1, payload)


def make_core(gated: bool, policed: bool = True, held: bool = False
              ) -> tuple[Connection, FlowController | None]:
    """A core past the handshake with channels 1-3 open (channel 1 in confirm mode)."""
    topology = Topology()
    for q in (QUEUE, TRIPPED, "bench.drain", HELD):
        topology.declare_queue("/", q)
    controller: FlowController | None = None
    if gated:
        policies = POLICIES.replace(*FAR_CAPACITY)
        if not policed:
            policies = policies.replace("bench.firehose*", "nothing.*")
        controller = FlowController(topology, parse_policies(
            policies + HELD_POLICY if held else policies))
        now = time.monotonic()
        for q in (QUEUE, TRIPPED, *((HELD,) if held else ())):
            controller.queue_seen(("/", q), now)
        for key in list(controller.queues):
            controller.sampled_management(key, ManagementSample(now, 0, 0, 0, 0, 0), now)
    gate = None if controller is None else PublishFlow(Enforcement(controller), 1)
    core = Connection(gate, conn_id=1)
    now = time.monotonic()
    core.receive_from_server(
        encode(_C.Start(server_properties={"product": "RabbitMQ"}))
        + encode(_C.Tune(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0)), now)
    core.receive_from_client(
        encode(_C.StartOk(client_properties={"product": "bench"}, mechanism="PLAIN",
                          response="\0guest\0guest"))
        + encode(_C.TuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0))
        + encode(_C.Open(virtual_host="/"))
        + b"".join(encode(_CH.Open(), ch) for ch in (1, 2, 3))
        + encode(commands.Confirm.Select(), 1), now)
    core.receive_from_server(
        encode(_C.OpenOk()) + b"".join(encode(_CH.OpenOk(), ch) for ch in (1, 2, 3))
        + encode(commands.Confirm.SelectOk(), 1), now)
    core.data_for_server()
    core.data_for_client()
    return core, controller


def _taker(core: Connection, peer: str) -> Callable[[], list[Any]]:
    """What the relay does with the core's output for ``peer``: its pieces for one vectored
    write (an older checkout may have no pieces: its joined bytes, as its relay writes)."""
    chunks = getattr(core, f"chunks_for_{peer}", None)
    if chunks is not None:
        return cast(Callable[[], list[Any]], chunks)
    data = getattr(core, f"data_for_{peer}")
    return lambda: [data()]


def cut(data: bytes, read: int) -> list[bytes]:
    return [data[i:i + read] for i in range(0, len(data), read)]


def runner(setup: str, messages: int, size: int, read: int) -> Callable[[], float]:
    """A function that relays ``messages`` messages and returns the seconds spent in the
    core; it checks that the bytes left unchanged."""
    if setup == "handshake":
        return handshake_runner(messages)
    gated = setup.endswith(("-policed", "-unpoliced", "-held-free", "-held"))
    core, controller = make_core(gated, policed=not setup.endswith("-unpoliced"),
                                 held=setup == "publish-held")
    payload = b"\xab" * size
    if setup == "publish-held":
        assert controller is not None
        return held_runner(core, controller, messages, payload, read)
    if setup == "publish-held-free":
        assert controller is not None
        key = ("/", TRIPPED)
        controller.sampled_management(key, ManagementSample(time.monotonic(), 1 << 20, 0,
                                                            1 << 40, 1 << 40, 0),
                                      time.monotonic())
        assert key in controller.tripped, "the held channel's queue must be tripped"
        core.receive_from_client(publish(3, TRIPPED, payload), time.monotonic())
        assert core.data_for_server() == b"", "channel 3's publish must be held"
    clock = time.thread_time  # CPU time: robust on a shared machine
    if setup.startswith("publish"):
        one = publish(1, QUEUE, payload)
        reads = cut(one * messages, read)
        feed, take = core.receive_from_client, _taker(core, "server")
        other = core.receive_from_server
        answers = [encode(_B.Ack(delivery_tag=n, multiple=True), 1)
                   for n in range(SAMPLE_EVERY, 1 << 30, SAMPLE_EVERY)]
    else:
        stream = b"".join(deliver(n + 1, payload) for n in range(messages))
        reads = cut(stream, read)
        feed, take = core.receive_from_server, _taker(core, "client")
        other = core.receive_from_client
        answers = [encode(_B.Ack(delivery_tag=n, multiple=True), 1)
                   for n in range(250, messages + 250, 250)]
    expect = b"".join(reads)
    per_read = max(1, messages // len(reads))
    answer_every = max(1, SAMPLE_EVERY * 1024 // max(size, 1024))  # 4 MiB of bodies at most
    state = {"confirmed": 0}

    def run() -> float:
        out: list[Any] = []
        done = 0
        # One clock read around the whole loop: the thread's CPU clock is a system call
        # (~3 us here), which read by read would be a third of a small read's cost.
        t0 = clock()
        for data in reads:
            feed(data, time.monotonic())
            out.extend(take())
            done += per_read
            if done >= answer_every:  # the broker's confirms / the consumer's acks
                done = 0
                ack = answers[state["confirmed"] % len(answers)]
                state["confirmed"] += 1
                other(ack, time.monotonic())
                core.data_for_client()
                core.data_for_server()
                if controller is not None:
                    for key in controller.queues:
                        if key[1] != TRIPPED:
                            controller.sampled_ready_count(key, time.monotonic(), 0, 0.001,
                                                           time.monotonic())
            if core.failure is not None:
                break
        spent = clock() - t0
        if core.failure is not None:
            raise RuntimeError(f"{setup}: {core.failure}")
        if controller is not None and any(k[1] != TRIPPED for k in controller.tripped):
            raise RuntimeError(f"{setup}: {sorted(controller.tripped)} tripped")  # (first:
        if b"".join(out) != expect:  # a trip holds publishes, and then the bytes differ)
            raise RuntimeError(f"{setup}: the relayed bytes differ from the input")
        return spent

    return run


def held_runner(core: Connection, controller: FlowController, messages: int, payload: bytes,
                read: int) -> Callable[[], float]:
    """``publish-held`` (module docstring): returns the CPU seconds the core, the gate and
    the controller spent; checks that every byte left, unchanged and in order."""
    gate = core.gate
    assert isinstance(gate, PublishFlow)
    key = ("/", HELD)
    reads = cut(publish(2, HELD, payload) * messages, read)
    expect = b"".join(reads)
    take = _taker(core, "server")
    clock = time.thread_time
    state = {"now": time.monotonic()}

    def tick(out: list[Any]) -> None:
        """A ready count of the held queue (empty: a fast consumer) and what it admits."""
        now = state["now"] = state["now"] + 0.0053
        controller.sampled_ready_count(key, now - 0.0003, 0, 0.0003, now)
        for event in controller.take_output():
            if isinstance(event, ChannelAdmitted):
                gate.channel_admitted(event.channel, now)
                core.collect()
            elif isinstance(event, ChannelFreed):
                gate.channel_released(event.channel, now)
                core.collect()
        out.extend(take())

    def run() -> float:
        out: list[Any] = []
        now = state["now"]
        controller.sampled_management(key, ManagementSample(now, 1 << 20, 0, 1 << 40, 1 << 40,
                                                            0), now)
        t0 = clock()
        pending = list(reversed(reads))
        ticks = 0
        while pending or gate.held_bytes:
            if pending and not gate.over_budget:
                core.receive_from_client(pending.pop(), state["now"])
                out.extend(take())
            else:
                tick(out)
                ticks += 1
                if ticks > 100 * messages:
                    raise RuntimeError("publish-held: the held publishes never all left")
        spent = clock() - t0
        if b"".join(out) != expect:
            raise RuntimeError("publish-held: the relayed bytes differ from the input")
        return spent

    return run


def handshake_runner(connections: int) -> Callable[[], float]:
    """``handshake`` (module docstring): the CPU seconds of ``connections`` cores made and
    taken through a handshake and a close; checks the last one's bytes against the input."""
    from bench import connections as raw

    tune_ok = raw.tune_ok(memoryview(raw.SERVER_TUNE)[7:-1], raw.HEARTBEAT)
    steps = [(False, raw.SERVER_START), (True, raw.START_OK), (False, raw.SERVER_TUNE),
             (True, tune_ok + raw.OPEN), (False, raw.OPEN_OK_FRAME), (True, raw.CLOSE_FRAME),
             (False, raw.CLOSE_OK_FRAME)]
    expect = b"".join(data for _, data in steps)
    clock = time.thread_time

    def run() -> float:
        t0 = clock()
        for n in range(connections):
            core = Connection(None, n, watch_topology=False)
            out: list[Any] = []
            for from_client, data in steps:
                if from_client:
                    core.receive_from_client(data, 0.0)
                else:
                    core.receive_from_server(data, 0.0)
                out += core.chunks_for_server()
                out += core.chunks_for_client()
        spent = clock() - t0
        if b"".join(out) != expect or not core.closed:
            raise RuntimeError("handshake: the relayed bytes differ from the input")
        return spent

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.core091", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--read", type=int, default=65_536, help="bytes per socket read")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--profile", action="store_true",
                    help="run each set-up once under cProfile instead")
    opts = ap.parse_args(argv)
    for setup in opts.setups.split(","):
        if setup not in SETUPS:
            ap.error(f"unknown set-up {setup!r}; choose from {', '.join(SETUPS)}")
        run = runner(setup, opts.messages, opts.size, opts.read)
        if opts.profile:
            prof = cProfile.Profile()
            prof.runcall(run)
            print(f"== {setup}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            continue
        run()  # warm-up
        best = min(run() for _ in range(opts.repeat))
        print(f"{setup:<18} {best / opts.messages * 1e6:6.2f} us/message "
              f"(best of {opts.repeat} x {opts.messages:,}, {opts.read:,} B reads)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
