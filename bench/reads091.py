"""What one broker read costs the 0-9-1 consumer path: the relay's read handler, no sockets.

``RelayedConnection.server_data`` (the I/O layer's handler for a read from the broker: the
sans-IO core, then ``_flush`` and ``_write`` to a transport that only counts bytes) fed
``--messages`` deliveries of ``--size`` bytes (``basic.deliver`` + header + body, as
``bench.core091`` builds them) cut into reads of ``--read`` bytes. ``--read msg`` cuts at
each delivery's end (one delivery per read, never a frame held across reads); a size a few
bytes off it (1,100 for 1 KiB bodies) cuts almost every read inside a frame, which is what a
consumer's reads look like on a quiet machine. ``--policed``: the connection has the publish
gate and a switchboard with a memory budget, as with ``--policies``.

Reports the thread's CPU time per read (best of ``--repeat``; noisy on a shared machine)
or, with ``--opcodes``, the Python bytecodes executed per read by function (deterministic).
Instructions per read, deterministic too, with cachegrind (the run minus the set-up)::

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        python -m bench.reads091 --read 1100 --messages 3000 --repeat 1 [--setup-only]

Another checkout: ``cd /tmp && PYTHONPATH=/path/to/checkout python /this/bench/reads091.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from types import FrameType
from typing import Any, cast

from bench import core091
from floodwall.control.memory import MemoryBudget
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.enforce.shared import Enforcement
from floodwall.io.relay import RelayedConnection, RelaySettings
from floodwall.io.switchboard import Switchboard
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats


class CountingTransport:
    """Takes what the relay writes and counts the bytes."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += len(data)

    def writelines(self, pieces: Any) -> None:
        self.written += sum(len(p) for p in pieces)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def relay(policed: bool) -> tuple[RelayedConnection, CountingTransport]:
    """A relayed connection past the handshake (channels 1-3 open), its client a counter."""
    core, controller = core091.make_core(policed)
    board = None
    if controller is not None:
        board = Switchboard(Enforcement(controller), time.monotonic)
        board.memory = MemoryBudget(1 << 30)
        core.gate = PublishFlow(board.enforcement, 1)
        controller.lookups.take_due()  # the app's lookup starter would have taken them
    settings = RelaySettings(Upstreams([("broker", 5672)]), board=board)
    conn = RelayedConnection(settings, RelayStats(), 1)
    conn.core, conn.gate = core, core.gate
    client = CountingTransport()
    conn.client = cast(asyncio.Transport, client)
    conn.upstream = cast(asyncio.Transport, CountingTransport())
    return conn, client


def opcodes(conn: RelayedConnection, reads: list[bytes]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts[frame.f_code.co_name] += 1
        return tracer

    sys.settrace(tracer)
    try:
        for data in reads:
            conn.server_data(data)
    finally:
        sys.settrace(None)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.reads091", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--read", default="1100", help="bytes per read, or 'msg'")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--policed", action="store_true")
    ap.add_argument("--opcodes", action="store_true", help="count bytecodes per read")
    ap.add_argument("--setup-only", action="store_true", help="build the input, relay nothing")
    opts = ap.parse_args(argv)
    payload = b"\xab" * opts.size
    one = len(core091.deliver(1, payload))
    read = one if opts.read == "msg" else int(opts.read)
    stream = b"".join(core091.deliver(n + 1, payload) for n in range(opts.messages))
    reads = core091.cut(stream, read)
    label = f"{'policed' if opts.policed else 'plain'}, {read:,} B reads ({one:,} B deliveries)"
    if opts.setup_only:
        return 0
    if opts.opcodes:
        conn, _ = relay(opts.policed)
        counts = opcodes(conn, reads)
        print(f"{label}: {sum(counts.values()) / len(reads):.0f} bytecodes per read")
        print("\n".join(f"  {name:<24} {n / len(reads):7.1f}"
                        for name, n in counts.most_common(12)), flush=True)
        return 0
    best = float("inf")
    for _ in range(opts.repeat):
        conn, client = relay(opts.policed)
        t0 = time.thread_time()
        for data in reads:
            conn.server_data(data)
        best = min(best, time.thread_time() - t0)
        if client.written != len(stream):
            raise RuntimeError(f"relayed {client.written} of {len(stream)} bytes")
    print(f"{label}: {best / len(reads) * 1e6:.2f} us per read, "
          f"{best / opts.messages * 1e6:.2f} us per delivery (best of {opts.repeat})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
