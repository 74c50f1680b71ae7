"""Sans-IO micro-benchmark of the AMQP 1.0 credit gate's per-transfer path.

The ``amqp10.Connection`` core alone, no sockets: a client session with one sender link
attached to ``/exchange/amq.direct/Q`` (the firehose10 address), routed by a real
``Topology``, with the policies of ``bench.flow``'s throughput scenario loaded and a depth
sample in (nothing near capacity). The client side is fed 1 KiB unsettled transfers,
``--batch`` per ``receive_from_client`` (as a socket read hands them over); the broker side
answers with a credit flow whenever the link's broker credit runs low, and the depth probe
answers every ``SAMPLE_EVERY`` transfers. Reports the microseconds per transfer spent in the
core's calls (thread CPU time; the client's own work is not counted), best of ``--repeat`` runs,
for three set-ups:

- ``policed``: the link's queue is policed (the "policed" target of ``bench.flow``);
- ``unpoliced``: policies loaded, but none matches the link's queue;
- ``gate off``: no policies at all (the plain relay);
- ``held-free``: as ``unpoliced``, beside a second sender link of the same session whose
  policed queue is tripped and which is held (no credit): what the free link pays for its
  held neighbour (``bench.two_senders`` through sockets).

```
.venv/bin/python -m bench.gate10
.venv/bin/python -m bench.gate10 --transfers 200000 --profile policed
.venv/bin/python -m bench.gate10 --settle-each --one-read   # a disposition per delivery
```
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import struct
import time
from collections.abc import Callable

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.control.routing import Topology
from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.shared import Enforcement
from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import AMQP_HEADER, frame
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    BEGIN,
    DISPOSITION,
    FLOW,
    OPEN,
    SOURCE,
    TARGET,
    TRANSFER,
    decode_composite,
    encode_performative,
    performative,
)
from floodwall.wire.amqp10.types import Described, UByte, UInt, ULong, UShort

QUEUE = "bench.firehose10"
OTHER = "other.queue"
HELD = "bench.firehose.held"
HELD_READY = 10_000_000
"""What each sample says of the held neighbour's queue (``held-free``): far past capacity."""
POLICIES = """
version: 1
policies:
  - {name: firehose, match: {vhost: "/", queue: "bench.firehose*"}, capacity: 256MiB,
     resume: 192MiB, deadline: 120s}
  - {name: others, match: {vhost: "/", queue: "orders.*"}, capacity: 64MiB, resume: 48MiB,
     deadline: 120s}
  - {name: more, match: {vhost: "/", queue: "billing.*"}, capacity: 16MiB, resume: 8MiB,
     deadline: 120s}
"""
BROKER_CREDIT = 65_536
SAMPLE_EVERY = 4096
"""Transfers between two ready-count samples (every 200 ms at ~20,000 msg/s)."""
SAMPLED_READY = 20_000
"""What each sample says: the firehose queue's x-max-length."""
_U32 = struct.Struct(">I")


def amqp(code: int, channel: int = 0, /, **fields: object) -> bytes:
    return frame(encode_performative(code, **fields), channel)


def transfer_template(body: bytes) -> tuple[bytes, int, int]:
    """As ``bench.amqp10.transfer_template``: handle 0, unsettled, one data section."""
    perf = (b"\x00\x53\x14\xc0\x0f\x05\x43\x70\x00\x00\x00\x00\xa0\x04\x00\x00\x00\x00"
            b"\x43\x42")
    payload = perf + b"\x00\x53\x75\xb0" + _U32.pack(len(body)) + body
    return struct.pack(">IBBH", 8 + len(payload), 2, 0, 0) + payload, 16, 22


ACCEPTED = Described(ULong(0x24), [])


def broker_settles(first: int, last: int) -> bytes:
    """The broker's disposition for deliveries ``first``..``last`` (settled, accepted)."""
    return amqp(DISPOSITION, 0, role=True, first=UInt(first), last=UInt(last), settled=True,
                state=ACCEPTED)


def broker_flow(delivery_count: int, credit: int, next_incoming: int) -> bytes:
    return amqp(FLOW, 0, next_incoming_id=UInt(next_incoming), incoming_window=UInt(65535),
                next_outgoing_id=UInt(0), outgoing_window=UInt(65535), handle=UInt(0),
                delivery_count=UInt(delivery_count), link_credit=UInt(credit))


def make_core(setup: str) -> tuple[Connection, FlowController | None]:
    """A core with the session and link attached on both sides and broker credit given."""
    topology = Topology()
    topology.declare_queue("/", QUEUE)
    topology.bind_queue("/", QUEUE, "amq.direct", QUEUE)
    controller: FlowController | None = None
    if setup != "gate off":
        clock = time.monotonic
        controller = FlowController(topology, parse_policies(POLICIES))
        name = QUEUE if setup == "policed" else OTHER
        if setup != "policed":
            topology.declare_queue("/", OTHER)
        if setup == "held-free":
            topology.declare_queue("/", HELD)
            topology.bind_queue("/", HELD, "amq.direct", HELD)
            controller.queue_seen(("/", HELD), clock())
        controller.queue_seen(("/", name), clock())
        for key in list(controller.queues):
            controller.sampled_management(key, ManagementSample(clock(), 0, 0, 0, 0, 0),
                                          clock())
    gate = None if controller is None else CreditFlow(Enforcement(controller), 1)
    core = Connection(AMQP_HEADER, gate, conn_id=1)
    address = f"/exchange/amq.direct/{QUEUE}"
    core.receive_from_client(
        amqp(OPEN, 0, container_id="client", hostname="localhost")
        + amqp(BEGIN, 0, next_outgoing_id=UInt(0), incoming_window=UInt(65535),
               outgoing_window=UInt(65535))
        + amqp(ATTACH, 0, name="sender", handle=UInt(0), role=False,
               snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
               source=performative(SOURCE, address="client"),
               target=performative(TARGET, address=address),
               initial_delivery_count=UInt(0)), time.monotonic())
    core.receive_from_server(
        AMQP_HEADER + amqp(OPEN, 0, container_id="broker")
        + amqp(BEGIN, 0, remote_channel=UShort(0), next_outgoing_id=UInt(0),
               incoming_window=UInt(65535), outgoing_window=UInt(65535))
        + amqp(ATTACH, 0, name="sender", handle=UInt(0), role=True,
               snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
               source=performative(SOURCE, address="client"),
               target=performative(TARGET, address=address))
        + broker_flow(0, BROKER_CREDIT, 0), time.monotonic())
    core.data_for_server()
    if setup == "held-free":
        hold_neighbour(core, controller)
    return core, controller


def hold_neighbour(core: Connection, controller: FlowController | None) -> None:
    """``held-free``: a second sender link (handle 1) to the ``HELD`` queue, given credit by
    the broker, the queue tripped, and one transfer of it (delivery-id 0) that finds it so:
    the link is held from then on."""
    assert controller is not None
    address = f"/exchange/amq.direct/{HELD}"
    core.receive_from_client(amqp(ATTACH, 0, name="held", handle=UInt(1), role=False,
                                  snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
                                  source=performative(SOURCE, address="client"),
                                  target=performative(TARGET, address=address),
                                  initial_delivery_count=UInt(0)), time.monotonic())
    core.receive_from_server(
        amqp(ATTACH, 0, name="held", handle=UInt(1), role=True, snd_settle_mode=UByte(0),
             rcv_settle_mode=UByte(0), source=performative(SOURCE, address="client"),
             target=performative(TARGET, address=address))
        + amqp(FLOW, 0, next_incoming_id=UInt(0), incoming_window=UInt(65535),
               next_outgoing_id=UInt(0), outgoing_window=UInt(65535), handle=UInt(1),
               delivery_count=UInt(0), link_credit=UInt(BROKER_CREDIT)), time.monotonic())
    now = time.monotonic()
    controller.sampled_management(("/", HELD), ManagementSample(
        now, HELD_READY, 0, HELD_READY * 1024, HELD_READY * 1024, 0), now)
    assert ("/", HELD) in controller.tripped
    body = b"\xab" * 1024
    core.receive_from_client(frame(encode_performative(
        TRANSFER, handle=UInt(1), delivery_id=UInt(0), delivery_tag=b"held",
        message_format=UInt(0), settled=False) + b"\x00\x53\x75\xb0" + _U32.pack(len(body))
        + body, 0), now)
    core.data_for_server()


def make_first_flows(core: Connection) -> bytes:
    """What the client was sent during the set-up: its first credit."""
    return core.data_for_client()


def client_credit(data: bytes, sent: int, credit: int) -> int:
    """The link credit the client has after reading ``data`` (flows for handle 0)."""
    pos = 8 if data.startswith(b"AMQP") else 0
    while pos < len(data):
        size, doff = struct.unpack_from(">IB", data, pos)
        body, end = pos + doff * 4, pos + size
        if end > body and data[body + 2] == FLOW:
            _, fields, _ = decode_composite(data, body, end)
            if len(fields) > 6 and fields[4] == 0:
                count = fields[5]
                assert isinstance(count, int) and isinstance(fields[6], int)
                credit = (count + fields[6] - sent) & 0xFFFFFFFF
        pos = end
    return credit


def runner(setup: str, transfers: int, batch: int, size: int,
           per_transfer: bool = False, one_read: bool = False) -> Callable[[], float]:
    """A function that relays ``transfers`` transfers and returns the seconds spent in the
    core (the client's own work is not counted). The client sends at most ``batch``
    transfers per read and never more than its link credit, as ``bench.amqp10`` does."""
    core, controller = make_core(setup)
    template, id_at, tag_at = transfer_template(b"\xab" * size)
    step = len(template)
    buf = bytearray(template * batch)
    state = {"sent": 0, "credit": 0, "broker": BROKER_CREDIT}
    base = 1 if setup == "held-free" else 0  # the session's delivery-ids: the held one's 0
    clock = time.thread_time  # CPU time: steadier than the wall clock on a shared machine

    def run() -> float:
        d, credit, broker = state["sent"], state["credit"], state["broker"]
        spent = 0.0
        stop = d + transfers
        while d < stop:
            n = min(batch, credit, stop - d)
            if n == 0:
                raise RuntimeError(f"{setup}: the client has no credit after {d} transfers")
            for i in range(n):
                struct.pack_into(">I", buf, i * step + id_at, base + d + i)
                struct.pack_into(">I", buf, i * step + tag_at, d + i)
            data = bytes(buf[:n * step])
            t0 = clock()
            core.receive_from_client(data, time.monotonic())
            core.data_for_server()
            to_client = core.data_for_client()
            spent += clock() - t0
            # the broker settles what it got: per transfer, or the whole read at once
            first = base + d
            settles = ([broker_settles(first + i, first + i) for i in range(n)]
                       if per_transfer else [broker_settles(first, first + n - 1)])
            if one_read:  # a disposition per transfer, all in one read (RabbitMQ's)
                settles = [b"".join(settles)]
            t0 = clock()
            for one in settles:
                core.receive_from_server(one, time.monotonic())
            core.data_for_server()
            to_client += core.data_for_client()
            spent += clock() - t0
            d += n
            broker -= n
            if broker <= BROKER_CREDIT // 2:  # the broker tops its credit up
                flow = broker_flow(d, BROKER_CREDIT, base + d)
                broker = BROKER_CREDIT
                t0 = clock()
                core.receive_from_server(flow, time.monotonic())
                core.data_for_server()
                to_client += core.data_for_client()
                spent += clock() - t0
            credit = client_credit(to_client, d, credit - n)
            if core.failure is not None:
                raise RuntimeError(f"{setup}: {core.failure}")
            if controller is not None and d % SAMPLE_EVERY < n:  # the depth probe answers
                t0 = clock()
                for key in controller.queues:
                    ready = HELD_READY if key[1] == HELD else SAMPLED_READY
                    controller.sampled_ready_count(key, time.monotonic(), ready, 0.001,
                                                   time.monotonic())
                spent += clock() - t0
                if controller.tripped - {("/", HELD)}:
                    raise RuntimeError(f"{setup}: {sorted(controller.tripped)} tripped")
        state.update(sent=d, credit=credit, broker=broker)
        return spent

    state["credit"] = client_credit(make_first_flows(core), 0, 0)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.gate10", description=__doc__.split("\n")[0])
    ap.add_argument("--transfers", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32, help="transfers per read")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--setups", default="policed,unpoliced,gate off")
    ap.add_argument("--profile", metavar="SETUP", help="run SETUP once under cProfile")
    ap.add_argument("--settle-each", action="store_true",
                    help="the broker settles each transfer with a disposition of its own "
                    "(default: one disposition per read)")
    ap.add_argument("--one-read", action="store_true",
                    help="with --settle-each: the read's dispositions in one read, as "
                    "RabbitMQ 3.10 sends them for messages it routes nowhere")
    opts = ap.parse_args(argv)
    if opts.profile:
        run = runner(opts.profile, opts.transfers, opts.batch, opts.size, opts.settle_each,
                     opts.one_read)
        prof = cProfile.Profile()
        prof.runcall(run)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    for setup in opts.setups.split(","):
        run = runner(setup, opts.transfers, opts.batch, opts.size, opts.settle_each,
                     opts.one_read)
        run()  # warm-up
        best = min(run() for _ in range(opts.repeat))
        print(f"{setup:<10} {best / opts.transfers * 1e6:6.2f} us/transfer "
              f"(best of {opts.repeat} x {opts.transfers:,})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
