"""Synthetic telemetry: N sidecars in front of one broker over T hours, for tests and benchmarks.

Each queue is shared by every sidecar (the application's pods publish to the same queues).
Per second: each sidecar's producers want a rate with bursts; the consumers drain at their
own rate; the fleet's policy trips above ``capacity`` and releases at ``resume``. While
tripped a sidecar holds what its producers send (ingress 0) and flushes it on release;
a publish held past ``deadline`` expires. Records have exactly the fields the proxy writes
(floodwall/ops/telemetry.py), files are named as the proxy names them and rotated every
``file_age`` seconds (hourly, as the proxy's default); ``partitioned`` lays them out by date
and sidecar (pipeline/files.py) instead of in one directory. ``version``: the schema version
to write (docs/telemetry.md), the current one unless told; ``1`` writes the same samples
with version 1's fields (the lines every benchmark before version 2 read, byte for byte),
``2`` without version 1's unread fields (the lines of the benchmarks before version 3).

    python -m floodwall_pipeline.synthetic OUT --sidecars 10 --hours 1 --queues 4 [--corrupt 0.001]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from floodwall.ops.telemetry import SCHEMA_VERSION, V1_ONLY, file_name, sparse
from floodwall_pipeline.files import partition_dir

KIB = 1024
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass
class QueueSim:
    name: str
    capacity: int
    resume: int
    consume_rate: float  # bytes/s
    produce_rate: float  # bytes/s per sidecar, before bursts
    deadline: float = 30.0
    depth: float = 0.0
    tripped: bool = False
    trips: int = 0
    tripped_seconds: float = 0.0


@dataclass
class SidecarState:
    name: str
    seq: int = 0
    held: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (since, bytes)
    burst_left: dict[str, int] = field(default_factory=dict)
    deadline_total: int = 0

    def next(self) -> int:
        self.seq += 1
        return self.seq


def _common(kind: str, sc: SidecarState, vhost: str, queue: str, ts: float) -> dict[str, object]:
    """A record as version 1 wrote it (``_encode`` leaves out what a later version does not)."""
    return {"v": 1, "type": kind, "ts": round(ts, 3),
            "mono": round(ts - START + 1000.0, 3), "seq": sc.next(), "sidecar": sc.name,
            "vhost": vhost, "queue": queue}


VERSIONS = (1, 2, SCHEMA_VERSION)


def _encode(rec: dict[str, object], version: int) -> str:
    """One line of schema ``version`` (``VERSIONS``) from a version 1 record."""
    if version not in VERSIONS:
        raise ValueError(f"cannot write telemetry version {version}")
    if version != 1:
        rec = {k: v for k, v in rec.items() if k not in V1_ONLY  # and the defaults:
               and (k, v) not in (("depth_known", True), ("delivered_messages", 0))}
        rec["v"] = version
        if version >= 3 and rec["type"] != "event":
            rec = sparse(rec)
    return json.dumps(rec, separators=(",", ":"))


def generate(out: Path, sidecars: int = 4, hours: float = 1.0, queues: int = 3,
             interval: float = 1.0, seed: int = 7, corrupt: float = 0.0,
             body: int = 1024, file_age: float = 3600.0, partitioned: bool = False,
             start: float = START, jitter: bool = False, version: int = SCHEMA_VERSION
             ) -> int:
    """Write the telemetry; returns how many lines (records and corrupt lines) it wrote.

    ``jitter``: as real sidecars, each samples on its own clock (some at the same instants
    as others), a few milliseconds early or late, with intervals to match, and estimates
    the depth a little differently (its own ledger). Without it (the benchmark's data)
    every sidecar samples at the same instants and sees the same depth.
    """
    rng = random.Random(seed)
    jrng = random.Random(seed + 1)  # its own draws: the data without jitter stays the same
    out.mkdir(parents=True, exist_ok=True)
    qs = []
    for i in range(queues):
        consume = rng.choice([20, 40, 80, 160]) * KIB
        capacity = rng.choice([256, 512, 1024]) * KIB
        qs.append(QueueSim(f"orders.{i}", capacity, capacity * 3 // 4, consume,
                           consume * rng.uniform(0.6, 1.3) / sidecars))
    fleet = [SidecarState(f"app-{i:03d}-{rng.randrange(16**5):05x}") for i in range(sidecars)]
    steps = int(hours * 3600 / interval)
    offset = {sc.name: jrng.choice([0.0, 0.0, 0.25, 0.5]) for sc in fleet} if jitter else {}
    last_ts: dict[tuple[str, str], float] = {}  # (sidecar, queue) -> its last sample's ts
    handles: dict[str, tuple[int, IO[str]]] = {}  # sidecar -> (file number, open file)
    lines = 0
    vhost = "/"
    for step in range(steps):
        ts = start + (step + 1) * interval
        period = int((ts - start) // file_age)
        per_sidecar: dict[str, list[dict[str, object]]] = {sc.name: [] for sc in fleet}
        for q in qs:
            ingress: dict[str, int] = {}
            held_now: dict[str, int] = {}
            was = q.tripped
            q.depth = max(0.0, q.depth - q.consume_rate * interval * rng.uniform(0.85, 1.15))
            if q.tripped and q.depth <= q.resume:
                q.tripped = False  # released: held publishes leave first, re-checked one by one
            for sc in rng.sample(fleet, len(fleet)):
                left = sc.burst_left.get(q.name, 0)
                if left == 0 and rng.random() < 0.002:
                    left = rng.randint(20, 120)  # a burst: 3x the usual rate for a while
                sc.burst_left[q.name] = max(left - 1, 0)
                want = q.produce_rate * interval * (3.0 if left else 1.0) * rng.uniform(0.8, 1.2)
                held = sc.held.setdefault(q.name, [])
                n = int(want // body) * body
                if n:
                    held.append((ts, n))
                sent = 0
                while held and not q.tripped:  # the publish that passes capacity trips it
                    since, nbytes = held[0]
                    room = int(q.capacity - q.depth) // body * body + body
                    take = min(nbytes, room)
                    sent += take
                    q.depth += take
                    if take == nbytes:
                        held.pop(0)
                    else:
                        held[0] = (since, nbytes - take)
                    if q.depth > q.capacity:
                        q.tripped, q.trips = True, q.trips + 1
                ingress[sc.name] = sent
                for since, nbytes in [h for h in held if ts - h[0] >= q.deadline]:
                    held.remove((since, nbytes))
                    sc.deadline_total += 1
                    ev = _common("event", sc, vhost, q.name, ts)
                    ev.update({"event": "deadline", "conn": 1, "channel": 1,
                               "body_bytes": nbytes, "waited": round(ts - since, 3)})
                    per_sidecar[sc.name].append(ev)
                held_now[sc.name] = sum(b for _, b in held)
            if q.tripped:
                q.tripped_seconds += interval
            for sc in fleet:
                recs = per_sidecar[sc.name]
                if q.tripped != was:
                    ev = _common("event", sc, vhost, q.name, ts)
                    ev.update({"event": "trip" if q.tripped else "release",
                               "policy": f"p-{q.name}", "depth_bytes": int(q.depth),
                               "depth_messages": int(q.depth) // body,
                               **({"capacity": q.capacity} if q.tripped else
                                  {"resume": q.resume, "reason": "depth"})})
                    recs.append(ev)
                    if q.tripped:
                        hold = _common("event", sc, vhost, q.name, ts)
                        hold.update({"event": "hold", "conn": 1, "channel": 1})
                        recs.append(hold)
                own_ts, own_interval, estimate = ts, interval, int(q.depth)
                if jitter:
                    own_ts = round(ts + offset[sc.name] + jrng.randint(-3, 3) / 1000, 3)
                    previous = last_ts.get((sc.name, q.name), own_ts - interval)
                    own_interval = round(own_ts - previous, 3)
                    last_ts[(sc.name, q.name)] = own_ts
                    estimate = max(0, estimate + jrng.randint(-512, 512))
                s = _common("sample", sc, vhost, q.name, own_ts)
                held_b = held_now[sc.name]
                s.update({
                    "interval": own_interval, "policy": f"p-{q.name}", "capacity": q.capacity,
                    "resume": q.resume, "max_messages": 0, "resume_messages": 0,
                    "overflow": "hold", "deadline": q.deadline,
                    "depth_bytes": estimate, "depth_messages": estimate // body,
                    "broker_depth_bytes": int(q.depth), "broker_depth_messages":
                        int(q.depth) // body,
                    "ready_count": int(q.depth) // body, "depth_known": True,
                    "ingress_bytes": ingress[sc.name],
                    "ingress_messages": ingress[sc.name] // body, "delivered_messages": 0,
                    "tripped": q.tripped, "trips": q.trips,
                    "tripped_seconds": round(q.tripped_seconds, 3),
                    "blocked_publishers": 1 if q.tripped else 0,
                    "held_bytes": held_b, "held_messages": held_b // body, "spooled_bytes": 0})
                recs.append(s)
        for sc in fleet:
            held_total = sum(sum(b for _, b in h) for h in sc.held.values())
            side = _common("sidecar", sc, "", "", ts)
            side.update({
                "interval": interval, "policed_queues": len(qs),
                "tripped_queues": sum(1 for q in qs if q.tripped),
                "blocked_channels": sum(1 for q in qs if q.tripped),
                "held_bytes": held_total, "held_messages": held_total // body,
                "spooled_bytes": 0, "alarm": None, "flow_off_total": 0, "flow_on_total": 0,
                "rejects_total": 0, "deadline_expiries_total": sc.deadline_total,
                "dropped_records": 0})
            per_sidecar[sc.name].append(side)
            current = handles.get(sc.name)
            if current is None or current[0] != period:  # a new file every file_age
                if current is not None:
                    current[1].close()
                where = out / partition_dir(sc.name, ts) if partitioned else out
                where.mkdir(parents=True, exist_ok=True)
                current = (period, open(where / file_name(sc.name, ts, period + 1), "w"))
                handles[sc.name] = current
            fh = current[1]
            for rec in per_sidecar[sc.name]:
                line = _encode(rec, version)
                if corrupt and rng.random() < corrupt:
                    line = line[: rng.randrange(1, len(line))]  # a truncated line
                fh.write(line + "\n")
                lines += 1
    for _, h in handles.values():
        h.close()
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--sidecars", type=int, default=4)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--queues", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--corrupt", type=float, default=0.0, help="share of lines truncated")
    p.add_argument("--file-age", type=float, default=3600.0, help="seconds per file")
    p.add_argument("--version", type=int, default=SCHEMA_VERSION,
                   help="the telemetry schema version to write (1, 2 or 3, the current one)")
    p.add_argument("--partitioned", action="store_true",
                   help="lay files out as date=YYYY-MM-DD/sidecar=NAME/ (docs/pipeline.md)")
    a = p.parse_args()
    n = generate(a.out, a.sidecars, a.hours, a.queues, a.interval, a.seed, a.corrupt,
                 file_age=a.file_age, partitioned=a.partitioned, version=a.version)
    print(f"{n} lines in {a.out}")


if __name__ == "__main__":
    main()
