"""The spool benchmark: append with group commit, replay to the broker, recovery scan.

``python -m bench.spool_bench [--rounds 3] [--append-mib 512] [--replay-messages 200000]
[--recovery-gib 1] [--dir DIR] [--broker HOST:AMQP:MGMT] [--out FILE.json]``

- **append**: the real ``SpoolService`` (its group-commit loop, ``fsync: group``,
  ``group_commit_ms: 10``, replay kept off) and one producer appending 1 KiB records
  through ``SpoolManager.append`` as the 0-9-1 gate does, yielding to the loop every 64
  records. Timed from the first append until the last record is durable (the gate was told
  through ``spool_durable``). MB/s counts body bytes (10^6).
- **replay**: ``--replay-messages`` 1 KiB records on disk, then ``SpoolService.start()``
  replays them to a queue of a private RabbitMQ (``x-max-length`` 20,000 so the broker's
  memory stays flat; it confirms dropped messages too) until the spool is empty: publisher
  confirms, window 1,000, records deleted as confirmed. msg/s.
- **replay10**: the same with AMQP 1.0 records (one data section of 1 KiB each, as an AMQP
  1.0 client's transfer would be spooled), replayed by the proxy's own AMQP 1.0 sender
  (``floodwall/io/amqp10_client.py``) to ``/amq/queue/Q``, each record deleted once settled
  ``accepted``.
- **recovery**: a spool of ``--recovery-gib`` GiB of 1 KiB records (64 MiB segments), then
  ``SpoolManager.recover()`` in a fresh process state: warm (in the page cache) and, when
  ``/proc/sys/vm/drop_caches`` can be written (root), cold.

Medians of ``--rounds``. The spool directory defaults to a temporary directory under
``/var/tmp`` (on disk, not tmpfs). Figures go to stdout and ``bench/out/spool-DATE.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
from pamqp import header as pamqp_header
from pamqp.commands import Basic

from bench.meters import CpuMeter
from floodwall.control.controller import FlowController
from floodwall.control.policy import EMPTY_POLICIES, parse_policies
from floodwall.control.routing import Topology
from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker
from floodwall.enforce.shared import Enforcement
from floodwall.io.spool import SpoolService, SpoolServiceSettings
from floodwall.io.switchboard import Switchboard
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials
from floodwall.spool.manager import SpoolLimits, SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.types import Described, ULong, encode

REPO = Path(__file__).resolve().parents[1]
BODY = 1024
KEY = ("/", "bench.spool")
DATA = 0x75  # an AMQP 1.0 data section
GROUP_POLICY = """
version: 1
policies:
  - name: spooled
    match: {vhost: "/", queue: "bench.*"}
    capacity: 1GiB
    overflow: spool
    spool: {max_bytes: 100GiB, fsync: group, group_commit_ms: 10}
"""


def header(size: int) -> bytes:
    props = Basic.Properties(content_type="application/octet-stream", delivery_mode=2)
    return bytes(pamqp_header.ContentHeader(0, size, props).marshal())


def body(i: int) -> bytes:
    return f"{i:012d}".encode().ljust(BODY, b"b")


class Owner:
    """The gate as the spool service sees it: told what is durable."""

    conn_id = 1

    def __init__(self) -> None:
        self.durable = 0
        self.calls = 0
        self.event = asyncio.Event()

    def channel_released(self, channel: int, now: float) -> None:
        pass

    def spool_durable(self, durable: dict[tuple[str, str], int]) -> None:
        self.calls += 1
        self.durable = max(self.durable, durable.get(KEY, 0))
        self.event.set()


def service_settings(root: Path, ep: BrokerEndpoint | None) -> SpoolServiceSettings:
    host, port = (ep.host, ep.amqp_port) if ep else ("127.0.0.1", 1)
    return SpoolServiceSettings(root, Upstreams([(host, port)]),
                                AmqpCredentials(ep.username, ep.password) if ep else
                                AmqpCredentials(), SpoolLimits(min_free_bytes=0))


async def append_round(root: Path, mib: int) -> dict[str, float]:
    controller = FlowController(Topology(), parse_policies(GROUP_POLICY))
    owner = Owner()
    board = Switchboard(Enforcement(controller), time.monotonic)
    board.attach(owner)
    svc = SpoolService(service_settings(root, None), board, ready=lambda: False)
    await svc.start()
    count = mib * 1024 * 1024 // BODY
    hdr = header(BODY)
    payload = body(0)
    append = svc.port.append  # the gates' spool port
    started = time.perf_counter()
    cpu0 = time.process_time()
    for i in range(count):
        append(KEY, SpoolRecord(0, time.time(), "", KEY[1], hdr, payload), 1 << 50)
        if i % 64 == 63:
            await asyncio.sleep(0)
    appended = time.perf_counter() - started
    while owner.durable < count:
        owner.event.clear()
        await owner.event.wait()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    record_bytes = svc.manager.spools[KEY].pending_bytes
    commits = svc.commits
    await svc.stop()
    return {"records": count, "seconds": seconds, "append_seconds": appended,
            "body_mb_s": count * BODY / 1e6 / seconds,
            "record_mb_s": record_bytes / 1e6 / seconds, "commits": commits,
            "cpu_s": cpu, "records_per_commit": count / max(commits, 1)}


def fill(root: Path, count: int, amqp10: bool = False) -> None:
    m = SpoolManager(root, SpoolLimits(min_free_bytes=0))
    hdr = header(BODY)
    address = f"/amq/queue/{KEY[1]}"
    for i in range(count):
        rec = (SpoolRecord.amqp10_message(0, time.time(), address, 0,
                                          encode(Described(ULong(DATA), body(i))))
               if amqp10 else SpoolRecord(0, time.time(), "", KEY[1], hdr, body(i)))
        m.append(KEY, rec, 1 << 50)
    m.sync()
    m.close()


def broker_process(ep: BrokerEndpoint) -> psutil.Process | None:
    """The process listening on the broker's AMQP port (for its CPU time), if visible."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == ep.amqp_port \
                    and c.pid:
                return psutil.Process(c.pid)
    except (psutil.Error, OSError):
        pass
    return None


async def replay_round(root: Path, ep: BrokerEndpoint, count: int,
                       amqp10: bool = False) -> dict[str, float]:
    fill(root, count, amqp10)
    ep.api("PUT", "/api/queues/%2F/" + KEY[1],
           {"durable": False, "auto_delete": False, "arguments": {"x-max-length": 20000}})
    topology = Topology()
    topology.declare_queue("/", KEY[1])
    controller = FlowController(topology, EMPTY_POLICIES)
    svc = SpoolService(service_settings(root, ep),
                       Switchboard(Enforcement(controller), time.monotonic), topology)
    meter = CpuMeter(broker_process(ep))
    cpu0 = time.process_time()
    await svc.start()
    spool = svc.manager.spools[KEY]
    before = meter.snapshot(None)
    started = time.perf_counter()
    while True:
        if spool.empty:
            break
        await asyncio.sleep(0.01)
    seconds = time.perf_counter() - started
    used = CpuMeter.delta(before, meter.snapshot(None))
    cpu = time.process_time() - cpu0
    replayed = svc.replays[KEY].replayed
    await svc.stop()
    ep.api("DELETE", "/api/queues/%2F/" + KEY[1])
    return {"records": replayed, "seconds": seconds, "msg_s": replayed / seconds,
            "cpu_s": cpu, "cpu_us_per_msg": cpu / replayed * 1e6,
            "floodwall_cores": used["client_cpu_s"] / used["wall_s"],
            "broker_cores": used["broker_cpu_s"] / used["wall_s"],
            "noise_cores": used["other_cpu_s"] / used["wall_s"]}


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def recovery_round(root: Path, cold: bool) -> dict[str, float] | None:
    if cold and not drop_caches():
        return None
    started = time.perf_counter()
    m = SpoolManager(root, SpoolLimits(min_free_bytes=0))
    reports = m.recover()
    seconds = time.perf_counter() - started
    r = reports[KEY]
    m.close()
    return {"seconds": seconds, "records": r.records, "bytes": r.bytes,
            "segments": r.segments, "mb_s": r.bytes / 1e6 / seconds}


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--append-mib", type=int, default=512)
    ap.add_argument("--replay-messages", type=int, default=200_000)
    ap.add_argument("--recovery-gib", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=None, help="where spools are written")
    ap.add_argument("--broker", default=os.environ.get("FLOODWALL_TEST_BROKER"),
                    help="HOST:AMQP_PORT:MGMT_PORT of a running broker (default: start one)")
    ap.add_argument("--skip", default="",
                    help="comma-separated: append,replay,replay10,recovery")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.getLogger("floodwall").setLevel(logging.ERROR)  # (the spool's own log lines)
    skip = set(filter(None, args.skip.split(",")))
    base = Path(tempfile.mkdtemp(prefix="floodwall-spool-bench-",
                                 dir=args.dir or "/var/tmp"))
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release(), "dir": str(base),
                    "loadavg_start": os.getloadavg()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    node: LocalBroker | None = None
    try:
        if "append" not in skip:
            rows = []
            for i in range(args.rounds):
                d = base / f"append-{i}"
                rows.append(asyncio.run(append_round(d, args.append_mib)))
                shutil.rmtree(d)
                print(f"append round {i + 1}: {rows[-1]['body_mb_s']:.1f} MB/s "
                      f"({rows[-1]['records_per_commit']:.0f} records per commit)", flush=True)
            results["append"] = {"rounds": rows, "median_body_mb_s": med(rows, "body_mb_s"),
                                 "median_record_mb_s": med(rows, "record_mb_s")}
        for name, amqp10 in (("replay", False), ("replay10", True)):
            if name in skip:
                continue
            if node is None and args.broker:
                ep = BrokerEndpoint.from_env(args.broker)
            elif node is None:
                node = LocalBroker(base / "rabbit")
                ep = node.start()
            rows = []
            for i in range(args.rounds):
                d = base / f"{name}-{i}"
                rows.append(asyncio.run(replay_round(d, ep, args.replay_messages, amqp10)))
                shutil.rmtree(d)
                r = rows[-1]
                print(f"{name} round {i + 1}: {r['msg_s']:.0f} msg/s "
                      f"({r['cpu_us_per_msg']:.1f} us CPU per message in floodwall; cores: "
                      f"floodwall {r['floodwall_cores']:.2f}, broker {r['broker_cores']:.2f}, "
                      f"noise {r['noise_cores']:.2f})", flush=True)
            results[name] = {"rounds": rows, "median_msg_s": med(rows, "msg_s"),
                             "median_cpu_us_per_msg": med(rows, "cpu_us_per_msg")}
        if "recovery" not in skip:
            d = base / "recovery"
            one = SpoolRecord(1, time.time(), "", KEY[1], header(BODY), body(0)).size
            count = -(-int(args.recovery_gib * 1024**3) // one)
            t0 = time.perf_counter()
            fill(d, count)
            print(f"recovery: wrote {count} records in {time.perf_counter() - t0:.1f}s",
                  flush=True)
            warm = [r for r in (recovery_round(d, False) for _ in range(args.rounds)) if r]
            cold = [r for r in (recovery_round(d, True) for _ in range(args.rounds)) if r]
            results["recovery"] = {"warm": warm, "cold": cold,
                                   "median_warm_s": med(warm, "seconds"),
                                   "median_cold_s": med(cold, "seconds") if cold else None}
            print(f"recovery: {warm[0]['bytes'] / 2**30:.2f} GiB, {warm[0]['records']} records "
                  f"in {warm[0]['segments']} segments: warm {med(warm, 'seconds'):.2f}s"
                  + (f", cold {med(cold, 'seconds'):.2f}s" if cold else ", cold: n/a"),
                  flush=True)
    finally:
        if node is not None:
            node.stop()
        shutil.rmtree(base, ignore_errors=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    out = args.out or REPO / "bench" / "out" / (
        f"spool-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print("\n| figure | target | median |\n|---|---|---|")
    if "append" in results:
        print(f"| append 1 KiB, group commit 10 ms | >= 100 MB/s | "
              f"{results['append']['median_body_mb_s']:.0f} MB/s |")
    if "replay" in results:
        print(f"| replay to the broker, confirms | >= 20,000 msg/s | "
              f"{results['replay']['median_msg_s']:,.0f} msg/s |")
    if "replay10" in results:
        print(f"| replay of AMQP 1.0 records, settled accepted | (>= 20,000 msg/s) | "
              f"{results['replay10']['median_msg_s']:,.0f} msg/s |")
    if "recovery" in results:
        r = results["recovery"]
        cold_s = f", cold {r['median_cold_s']:.2f} s" if r["median_cold_s"] is not None else ""
        print(f"| recovery scan, {args.recovery_gib:g} GiB | < 10 s | "
              f"warm {r['median_warm_s']:.2f} s{cold_s} |")
    print(f"\nraw figures: {out}  (run id {uuid.uuid4().hex[:6]})")


if __name__ == "__main__":
    main()
