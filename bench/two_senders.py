"""The two-senders benchmark, through floodwall with policies loaded, for AMQP 1.0 and
its 0-9-1 equivalent (the credit gate's test, as a benchmark figure).

``python -m bench.two_senders [--rounds 6] [--seconds 3] [--protocols amqp10,amqp091]``

One connection through ``floodwall run --policies FILE --management URL`` carries two
senders: one to a capped queue (``two.capped``, 256 KiB, no consumer) and one to a free
queue (``two.free``, not policed, ``x-max-length`` 20,000). The free sender is a firehose
the whole time; its rate (messages the broker confirmed / accepted per second) is measured
in alternating windows while its neighbour is

- **idle**: the capped sender sends nothing and its queue is released;
- **held**: the capped sender has filled its queue past capacity and is held there for the
  whole window (no consumer drains it): for 1.0 its link has no credit; for 0-9-1 it keeps
  publishing at ``--capped-rate`` msg/s and the proxy holds every publish.

Windows alternate idle/held, held/idle, ... (ABBA, so drift falls on both alike); after a
held window the capped queue is purged until the proxy holds nothing and has released it.
Reported: the free sender's rate held / idle, by medians, per round (paired) and by the
noise-adjusted fit of bench.relay. Target: >= 0.9.

- 1.0: one connection, one session, two sender links (handle 0 free, handle 1 capped);
  pre-encoded unsettled transfers as in bench/amqp10.py (at most 10,000 unsettled on the
  free link), ``accepted`` dispositions counted per link.
- 0-9-1: one connection, channel 1 to the capped queue (no confirms, paced), channel 2 to
  the free queue (confirm mode, pre-encoded batches as in bench.relay's firehose,
  confirms counted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import struct
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from pamqp import commands
from proton import Data, Described, uint, ulong

from bench import amqp091, amqp10
from bench.flow import (
    QUIET_CORES,
    Progress,
    Stack,
    blocked_channels,
    fmt,
    held,
    judge_ratio,
    noise_fit,
    policed,
    policy_entry,
    ratio,
    run_main,
    tripped,
    until,
    verdict,
    write_policies,
)
from bench.meters import CpuMeter, median
from bench.relay import BATCH, beam_of

CAPPED, FREE = "two.capped", "two.free"
FREE10_ADDRESS = f"/exchange/amq.direct/{FREE}"  # the queue has x-max-length
CAPPED10_ADDRESS = f"/amq/queue/{CAPPED}"
_U32 = struct.Struct(">I")
_FRAME = struct.Struct(">IBBH")


# -- AMQP 1.0: two sender links on one session ---------------------------------------------
def transfer_template(body: bytes, handle: int) -> tuple[bytes, int, int]:
    """One unsettled transfer on ``handle`` (smalluint) and where its delivery id and
    4-byte tag go (as bench.amqp10.transfer_template, with the handle spelled out)."""
    perf = (b"\x00\x53\x14"  # transfer
            + b"\xc0\x10\x05"  # list8, 16 bytes, 5 fields
            + b"\x52" + bytes([handle])  # handle: smalluint
            + b"\x70\x00\x00\x00\x00"  # delivery-id: uint
            + b"\xa0\x04\x00\x00\x00\x00"  # delivery-tag: vbin8, 4 bytes
            + b"\x43"  # message-format: uint0
            + b"\x42")  # settled: false
    section = b"\x00\x53\x75" + b"\xb0" + _U32.pack(len(body)) + body
    payload = perf + section
    id_at = 8 + 3 + 3 + 2 + 1
    return _FRAME.pack(8 + len(payload), 2, 0, 0) + payload, id_at, id_at + 4 + 2


class TwoLinks(amqp10.Amqp10Client):
    """Handle 0 and 1, one session; credit, sends and settlements kept per link."""

    def __init__(self) -> None:
        super().__init__()
        self.delivery_count = [0, 0]  # as the broker last told it, per link
        self.credit = [0, 0]
        self.sent = [0, 0]
        self.accepted_by = [0, 0]
        self.rejected_by = [0, 0]
        # per session delivery id: 1 + handle while unsettled, 0xff once settled (RabbitMQ
        # 3.10 may settle a delivery in two overlapping disposition ranges)
        self.owner = bytearray()

    def _performative(self, raw: bytes) -> None:
        data = Data()
        data.decode(raw)
        data.rewind()
        data.next()
        obj: Any = data.get_object()
        code, fields = int(obj.descriptor), list(obj.value or [])
        fields += [None] * (12 - len(fields))
        if code == amqp10.DISPOSITION:
            first = int(fields[1])
            last = int(fields[2]) if fields[2] is not None else first
            seg = self.owner[first:last + 1]
            state = fields[4]
            ok = isinstance(state, Described) and state.descriptor == amqp10.ACCEPTED
            counts = self.accepted_by if ok else self.rejected_by
            counts[0] += seg.count(1)
            counts[1] += seg.count(2)
            self.owner[first:first + len(seg)] = b"\xff" * len(seg)
            self.flowed.set()
            return
        if code == amqp10.FLOW:
            self.remote_next_incoming = fields[0] or 0
            self.remote_incoming_window = fields[1] or 0
            handle = fields[4]
            if handle is not None and int(handle) < 2:
                self.delivery_count[int(handle)] = int(fields[5] or 0)
                self.credit[int(handle)] = int(fields[6] or 0)
            self.flowed.set()
            return
        super()._performative(raw)

    def sendable_on(self, handle: int, max_unsettled: int) -> int:
        credit = self.delivery_count[handle] + self.credit[handle] - self.sent[handle]
        window = self.remote_next_incoming + self.remote_incoming_window - self.next_delivery
        unsettled = max_unsettled - (self.sent[handle] - self.accepted_by[handle]
                                     - self.rejected_by[handle])
        return max(0, min(credit, window, unsettled))

    async def open_two(self, free: str, capped: str) -> None:
        await self.open_sender(free)  # SASL, open, begin, attach handle 0
        source = Described(ulong(0x28), ["bench-source-capped"])
        target = Described(ulong(0x29), [capped])
        self.write(amqp10.frame(amqp10.ATTACH, ["bench-capped", uint(1), False, None, None,
                                                source, target, None, None, uint(0)]))
        await self.expect(amqp10.ATTACH)
        if self.error:
            raise amqp10.Amqp10Error(self.error)


class Sender10:
    """The 1.0 pair: the free link always sending, the capped one when ``active``."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.size = port, size
        self.active = asyncio.Event()
        self.stop = False
        self.tasks: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.c = await asyncio.wait_for(
            loop.create_connection(TwoLinks, "127.0.0.1", self.port), 10)
        await self.c.open_two(FREE10_ADDRESS, CAPPED10_ADDRESS)
        self.tasks = [loop.create_task(self._writer(0, 10_000)),
                      loop.create_task(self._writer(1, 10_000))]

    @property
    def free_count(self) -> int:
        return self.c.accepted_by[0]

    @property
    def capped_count(self) -> int:
        return self.c.accepted_by[1]

    def errors(self) -> list[str]:
        out = [self.c.error] if self.c.error else []
        if any(self.c.rejected_by):
            out.append(f"rejected (free, capped): {self.c.rejected_by}")
        return out

    async def _writer(self, handle: int, max_unsettled: int) -> None:
        c = self.c
        template, id_at, tag_at = transfer_template(b"\xab" * self.size, handle)
        step = len(template)
        buf = bytearray(template * BATCH)
        pack = _U32.pack_into
        mark = bytes([handle + 1])
        while not self.stop and not c.lost.done() and c.error is None:
            if handle == 1 and not self.active.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.active.wait(), 0.1)
                continue
            n = min(BATCH, c.sendable_on(handle, max_unsettled))
            if n == 0:
                c.flowed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c.flowed.wait(), 0.1)
                continue
            d = c.next_delivery
            for i in range(n):
                pack(buf, i * step + id_at, d + i)
                pack(buf, i * step + tag_at, d + i)
            c.write(bytes(buf[:n * step]) if n < BATCH else bytes(buf))
            c.next_delivery = d + n
            c.sent[handle] += n
            c.owner += mark * n
            if not c._writable.is_set():
                await c._writable.wait()
            else:
                await asyncio.sleep(0)

    def hold(self) -> None:
        self.active.set()

    def idle(self) -> None:
        self.active.clear()

    async def close(self) -> None:
        self.stop = True
        self.c.flowed.set()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.c.close()


# -- AMQP 0-9-1: two channels on one connection ---------------------------------------------
class Sender091:
    """Channel 2: confirm-mode firehose to the free queue. Channel 1: no confirms, paced at
    ``capped_rate`` to the capped queue while ``active``."""

    def __init__(self, port: int, size: int, capped_rate: float) -> None:
        self.port, self.size, self.capped_rate = port, size, capped_rate
        self.active = asyncio.Event()
        self.stop = False
        self.capped_sent = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        self.c = await amqp091.connect("127.0.0.1", self.port)  # channel 1 open
        await self.c.call(commands.Channel.Open(), commands.Channel.OpenOk, 2)
        await self.c.call(commands.Confirm.Select(), commands.Confirm.SelectOk, 2)
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._free()), loop.create_task(self._capped())]

    @property
    def free_count(self) -> int:
        return self.c.confirmed  # only channel 2 is in confirm mode

    @property
    def capped_count(self) -> int:
        return self.capped_sent

    def errors(self) -> list[str]:
        out = []
        if self.c.lost.done():
            out.append("connection lost")
        if self.c.nacked:
            out.append(f"{self.c.nacked} nacked")
        return out

    async def _free(self) -> None:
        batch = amqp091.publish_frames(FREE, b"\xab" * self.size, channel=2) * BATCH
        c = self.c
        while not self.stop and not c.lost.done():
            c.write(batch)
            if c.paused:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(c.writable(), 0.1)
            else:
                await asyncio.sleep(0)

    async def _capped(self) -> None:
        one = amqp091.publish_frames(CAPPED, b"\xcd" * self.size, channel=1)
        rate = self.capped_rate
        while not self.stop and not self.c.lost.done():
            if not self.active.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.active.wait(), 0.1)
                continue
            start, base = time.perf_counter(), self.capped_sent
            while self.active.is_set() and not self.stop:
                due = int((time.perf_counter() - start) * rate) - (self.capped_sent - base)
                if due > 0:
                    self.c.write(one * min(due, 50))
                    self.capped_sent += min(due, 50)
                await asyncio.sleep(0.001)

    def hold(self) -> None:
        self.active.set()

    def idle(self) -> None:
        self.active.clear()

    async def close(self) -> None:
        self.stop = True
        self.active.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.c.close()


# -- the benchmark --------------------------------------------------------------------------
async def run_protocol(st: Stack, fw: Any, proto: str, opts: argparse.Namespace,
                       progress: Progress) -> dict[str, Any]:
    ep = st.endpoint
    control = await amqp091.connect(ep.host, ep.amqp_port)
    sender: Sender10 | Sender091 = (Sender10(fw.port, opts.size) if proto == "amqp10"
                                    else Sender091(fw.port, opts.size, opts.capped_rate))
    cpu = CpuMeter(beam_of(st.broker))
    fw_proc = psutil.Process(fw.process.pid)
    windows: list[dict[str, Any]] = []

    async def release() -> None:
        """Capped sender idle; purge its queue until the proxy holds nothing and released."""
        sender.idle()
        deadline = time.monotonic() + 60
        calm = 0  # consecutive checks with nothing held and the queue released
        while calm < 3:
            await control.purge(CAPPED)
            await asyncio.sleep(0.25)
            h = await asyncio.to_thread(held, fw)
            calm = calm + 1 if h["messages"] == 0 and not await asyncio.to_thread(
                tripped, fw, CAPPED) else 0
            if time.monotonic() > deadline:
                raise TimeoutError(f"capped queue not released: {h}")

    await sender.open()
    try:
        await until(lambda: sender.free_count > 1000, 20, "the free sender running")
        for r in range(opts.rounds):
            order = ("idle", "held") if r % 2 == 0 else ("held", "idle")
            for phase in order:
                if phase == "held":
                    sender.hold()
                    await until(lambda: tripped(fw, CAPPED), 20, "capped queue tripped")
                    await until(lambda: len(blocked_channels(fw)) >= 1, 10,
                                "the capped sender blocked")
                    await asyncio.sleep(0.3)  # what it sent on credit before the trip settles
                await control.purge(FREE)
                await asyncio.sleep(opts.warmup)
                h0 = await asyncio.to_thread(held, fw)
                f0, k0, s0 = sender.free_count, sender.capped_count, cpu.snapshot(fw_proc)
                await asyncio.sleep(opts.seconds)
                f1, k1, s1 = sender.free_count, sender.capped_count, cpu.snapshot(fw_proc)
                h1 = await asyncio.to_thread(held, fw)
                still = await asyncio.to_thread(tripped, fw, CAPPED)
                d = CpuMeter.delta(s0, s1)
                w = {"round": r, "phase": phase, "msgs": f1 - f0,
                     "msgs_per_s": (f1 - f0) / d["wall_s"],
                     "capped_progress": k1 - k0,  # 1.0: accepted; 0-9-1: written (held)
                     "held_messages": [h0["messages"], h1["messages"]],
                     "capped_tripped_at_end": still,
                     "relay_cpu_us_per_msg": d["relay_cpu_s"] / max(1, f1 - f0) * 1e6,
                     "broker_cpu_us_per_msg": d["broker_cpu_s"] / max(1, f1 - f0) * 1e6,
                     "client_cpu_us_per_msg": d["client_cpu_s"] / max(1, f1 - f0) * 1e6,
                     "other_cores": d["other_cpu_s"] / d["wall_s"]}
                windows.append(w)
                progress(f"   {proto} round {r + 1}/{opts.rounds} {phase:<4}: free "
                         f"{w['msgs_per_s']:>8,.0f} msg/s, capped "
                         f"{'written' if proto == 'amqp091' else 'accepted'} "
                         f"{k1 - k0}, held {h0['messages']}->{h1['messages']}, "
                         f"capped tripped {still}, noise {w['other_cores']:.2f} cores")
                if phase == "held":
                    await release()
    finally:
        errors = sender.errors()
        await sender.close()
        await control.close()
    return summarize(windows, errors)


def summarize(windows: list[dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    idle = [w for w in windows if w["phase"] == "idle"]
    hold = [w for w in windows if w["phase"] == "held"]
    mi = median([w["msgs_per_s"] for w in idle])
    mh = median([w["msgs_per_s"] for w in hold])
    by_round = {w["round"]: w["msgs_per_s"] for w in idle}
    paired = median([w["msgs_per_s"] / by_round[w["round"]] for w in hold
                     if by_round.get(w["round"])])
    fit, slope = noise_fit({"idle": [(w["other_cores"], w["msgs_per_s"]) for w in idle],
                            "held": [(w["other_cores"], w["msgs_per_s"]) for w in hold]})
    medians = ratio(mh, mi)
    value, how, met = judge_ratio(ratio(fit["held"], fit["idle"]), medians,
                                  [w["other_cores"] for w in windows], 0.9)
    quiet_i = [w["msgs_per_s"] for w in idle if w["other_cores"] <= QUIET_CORES]
    quiet_h = [w["msgs_per_s"] for w in hold if w["other_cores"] <= QUIET_CORES]
    quiet = ratio(median(quiet_h), median(quiet_i))
    if met is None and min(len(quiet_i), len(quiet_h)) >= 2:
        value, how, met = quiet, (f"medians of the quiet windows only ({len(quiet_i)} idle, "
                                  f"{len(quiet_h)} held)"), quiet >= 0.9
    elif met is None and not math.isnan(paired):
        # Paired ratios cancel drift between rounds, not fast noise: indicative only.
        value, how, met = paired, (f"paired per-round ratio, NOISY: indicative only "
                                   f"(medians {medians:.3f})"), paired >= 0.9
    held_ok = all(w["capped_tripped_at_end"] for w in hold)

    def cpu_total(ws: list[dict[str, Any]]) -> float:
        return sum(median([w.get(k, math.nan) for w in ws]) for k in (
            "relay_cpu_us_per_msg", "broker_cpu_us_per_msg", "client_cpu_us_per_msg"))

    # The rate ratio the machine's CPU predicts when its two cores are the limit: all CPU a
    # free message costs (client, floodwall, broker) idle / held. Barely moved by noise.
    cpu_model = ratio(cpu_total(idle), cpu_total(hold))
    return {"windows": windows, "idle_msgs_per_s": mi, "held_msgs_per_s": mh,
            "ratio_medians": medians, "ratio_paired": paired,
            "ratio_noise_adjusted": ratio(fit["held"], fit["idle"]), "noise_slope": slope,
            "ratio_quiet_windows": quiet, "ratio_cpu_model": cpu_model,
            "relay_cpu_us_per_msg": {
                "idle": median([w["relay_cpu_us_per_msg"] for w in idle]),
                "held": median([w["relay_cpu_us_per_msg"] for w in hold])},
            "noise_cores": {"idle": median([w["other_cores"] for w in idle]),
                            "held": median([w["other_cores"] for w in hold])},
            "capped_held_every_window": held_ok, "errors": errors,
            "goal": {"value": value, "estimate": how,
                     "met": None if met is None else (met and held_ok and not errors)}}


async def amqp10_two(st: Stack, opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    return await _both(st, opts, progress, "amqp10")


async def amqp091_two(st: Stack, opts: argparse.Namespace, progress: Progress
                      ) -> dict[str, Any]:
    return await _both(st, opts, progress, "amqp091")


async def _both(st: Stack, opts: argparse.Namespace, progress: Progress, proto: str
                ) -> dict[str, Any]:
    ep = st.endpoint
    control = await amqp091.connect(ep.host, ep.amqp_port)
    await control.declare(CAPPED)
    await control.declare(FREE, {"x-max-length": 20_000})
    await control.bind(FREE, "amq.direct", FREE)
    await control.close()
    policies = write_policies(st.workdir / f"two-{proto}.yaml",
                              policy_entry("two-capped", CAPPED, "256KiB", "128KiB"),
                              policy_entry("elsewhere", "orders.*", "64MiB", "48MiB"))
    fw = st.floodwall(f"floodwall-two-{proto}", policies)
    try:
        await until(lambda: policed(fw, CAPPED), 30, f"{CAPPED} policed")
        return await run_protocol(st, fw, proto, opts, progress)
    finally:
        st.stop_proxy(fw)


SCENARIOS = {"amqp10": amqp10_two, "amqp091": amqp091_two}


def report(doc: dict[str, Any]) -> None:
    print(f"\nfloodwall two-senders benchmark, {doc['meta']['started']} "
          f"({doc['meta']['command']})")
    print("free sender's rate with its neighbour idle vs held at capacity, one connection")
    print(f"  {'protocol':<9}{'idle msg/s':>11}{'held msg/s':>11}{'medians':>9}{'paired':>8}"
          f"{'fit':>7}{'quiet':>7}{'noise idle/held':>17}  verdict (>= 0.9)")
    for proto, s in doc["results"].items():
        g = s["goal"]
        print(f"  {proto:<9}{fmt(s['idle_msgs_per_s'], ',.0f'):>11}"
              f"{fmt(s['held_msgs_per_s'], ',.0f'):>11}{fmt(s['ratio_medians'], '.3f'):>9}"
              f"{fmt(s['ratio_paired'], '.3f'):>8}{fmt(s['ratio_noise_adjusted'], '.3f'):>7}"
              f"{fmt(s['ratio_quiet_windows'], '.3f'):>7}"
              f"{fmt(s['noise_cores']['idle'], '.2f'):>9}/{fmt(s['noise_cores']['held'], '.2f')}"
              f"     {verdict(g['met'])}: {fmt(g['value'], '.3f')} ({g['estimate']})"
              + (f"; errors {s['errors']}" if s["errors"] else "")
              + ("" if s["capped_held_every_window"] else "; CAPPED QUEUE RELEASED IN A WINDOW"))
        cpu = s["relay_cpu_us_per_msg"]
        print(f"  {'':<9}floodwall CPU per free message: idle {fmt(cpu['idle'], '.2f')} us, "
              f"held {fmt(cpu['held'], '.2f')} us; cpu-model ratio "
              f"{fmt(s.get('ratio_cpu_model'), '.3f')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.two_senders",
                                description=__doc__.split("\n")[0])
    p.add_argument("--protocols", default="amqp10,amqp091")
    p.add_argument("--rounds", type=int, default=6, help="idle+held window pairs (default 6)")
    p.add_argument("--seconds", type=float, default=3.0, help="measured s per window")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--capped-rate", type=float, default=500.0,
                   help="0-9-1: msg/s the held channel keeps publishing (default 500)")
    p.add_argument("--out", type=Path, default=None)
    opts = p.parse_args(argv)
    names = [n for n in opts.protocols.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            p.error(f"unknown protocol {n!r}")
    return run_main("two_senders", argv, SCENARIOS, opts, names, report)


if __name__ == "__main__":
    sys.exit(main())
