"""Every speed target of the relay in one command: each benchmark run, then one verdict table.

``python -m bench.speed [--rounds 5] [--quick] [--out DIR]``

Runs, one after another, each as a child process that starts its own RabbitMQ:

1. ``bench.versus`` with this checkout's floodwall plain (``new``) and with policies loaded,
   nothing tripped (``new-policed``), beside direct, the byte pump (``bench.pump``) and
   Debian's HAProxy in TCP mode (one thread, like floodwall's one event loop), alternated
   round by round: the 0-9-1 and AMQP 1.0 firehose, drain and latency figures;
2. the same at 1 MiB bodies (firehose and drain, plain floodwall, the pump, the splice pump
   (``bench.pump --splice``: no copy into user space) and HAProxy);
3. ``bench.connections``: 10,000 idle connections (memory each, a new client served with
   them open) and 1,000 new connections a second (what the relay adds to the handshake);
4. ``bench.two_senders``: the free sender beside a held one, both protocols.

Then it reads their JSON and prints each target of the relay's speed with its figure, the
byte pump's and HAProxy's in the same run where there are, and a verdict; ``DIR/speed.json``
keeps the table and the four raw files beside it. A whole run takes about 20 minutes;
``--quick`` (one round each, a shorter hold, 2,000 connections) about 6, for a check that it
all runs.
Measure on a quiet machine: the ratios are side by side in one run, but a loaded machine moves
them (bench/README.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.meters import median

REPO = Path(__file__).resolve().parents[1]
KIB = 1024


@dataclass(frozen=True)
class Target:
    """One target of the issue: a figure taken from the runs, judged against ``limit``."""

    name: str
    figure: Callable[[dict[str, Any]], float]
    limit: float
    at_least: bool  # the figure must be >= limit (else <=)
    unit: str = ""
    pump: Callable[[dict[str, Any]], float] | None = None  # the byte pump's same figure
    haproxy: Callable[[dict[str, Any]], float] | None = None  # HAProxy's same figure

    def judge(self, docs: dict[str, Any]) -> dict[str, Any]:
        value = _safe(self.figure, docs)
        pump = _safe(self.pump, docs) if self.pump else math.nan
        haproxy = _safe(self.haproxy, docs) if self.haproxy else math.nan
        met = None if math.isnan(value) else (
            value >= self.limit if self.at_least else value <= self.limit)
        return {"target": self.name, "value": value, "pump": pump, "haproxy": haproxy,
                "limit": self.limit, "at_least": self.at_least, "unit": self.unit, "met": met}


def _safe(fn: Callable[[dict[str, Any]], float] | None, docs: dict[str, Any]) -> float:
    if fn is None:
        return math.nan
    try:
        v = fn(docs)
    except (KeyError, TypeError, ZeroDivisionError, IndexError):
        return math.nan
    return math.nan if v is None else float(v)


def _med(doc: dict[str, Any], scn: str, target: str, key: str) -> float:
    return float(doc["summary"][scn]["median"][target][key])


def _x_direct(run: str, scn: str, target: str) -> Callable[[dict[str, Any]], float]:
    return lambda d: (_med(d[run], scn, target, "msgs_per_s")
                      / _med(d[run], scn, "direct", "msgs_per_s"))


def _cpu_x(scn: str, target: str, yardstick: str = "pump") -> Callable[[dict[str, Any]], float]:
    return lambda d: (_med(d["versus"], scn, target, "relay_cpu_us_per_msg")
                      / _med(d["versus"], scn, yardstick, "relay_cpu_us_per_msg"))


def _x_yardstick(run: str, scn: str, yardstick: str) -> Callable[[dict[str, Any]], float]:
    """floodwall's throughput over ``yardstick``'s (pump, splice, haproxy) in the same run."""
    return lambda d: (_med(d[run], scn, "new", "msgs_per_s")
                      / _med(d[run], scn, yardstick, "msgs_per_s"))


def _added(key: str, target: str) -> Callable[[dict[str, Any]], float]:
    return lambda d: (_med(d["versus"], "latency", target, key)
                      - _med(d["versus"], "latency", "direct", key))


def _idle(target: str, fn: Callable[[dict[str, Any]], float]) -> Callable[[dict[str, Any]],
                                                                          float]:
    return lambda d: median([fn(r) for r in d["connections"]["results"]["idle"]
                             if r["target"] == target])


def _handshake_added(target: str, pct: str) -> Callable[[dict[str, Any]], float]:
    def f(d: dict[str, Any]) -> float:
        runs = d["connections"]["results"]["rate"]
        mine = median([r["handshake_ms"][pct] for r in runs if r["target"] == target])
        ref = median([r["handshake_ms"][pct] for r in runs if r["target"] == "responder"])
        return mine - ref
    return f


def _two(proto: str) -> Callable[[dict[str, Any]], float]:
    return lambda d: float(d["two_senders"]["results"][proto]["goal"]["value"])


TARGETS = (
    Target("consumer drain, 0-9-1 (x direct)", _x_direct("versus", "drain", "new"), 0.95,
           True, pump=_x_direct("versus", "drain", "pump"),
           haproxy=_x_direct("versus", "drain", "haproxy")),
    Target("consumer drain, 1.0 (x direct)", _x_direct("versus", "drain10", "new"), 0.95, True,
           pump=_x_direct("versus", "drain10", "pump"),
           haproxy=_x_direct("versus", "drain10", "haproxy")),
    Target("policed publish, 0-9-1 (x direct)", _x_direct("versus", "firehose", "new-policed"),
           0.95, True, pump=_x_direct("versus", "firehose", "pump"),
           haproxy=_x_direct("versus", "firehose", "haproxy")),
    Target("policed publish, 1.0 (x direct)", _x_direct("versus", "firehose10", "new-policed"),
           0.95, True, pump=_x_direct("versus", "firehose10", "pump"),
           haproxy=_x_direct("versus", "firehose10", "haproxy")),
    Target("policed CPU per message, 0-9-1 (x the pump's)", _cpu_x("firehose", "new-policed"),
           3.0, False),
    Target("policed CPU per message, 1.0 (x the pump's)", _cpu_x("firehose10", "new-policed"),
           3.0, False),
    Target("policed CPU per message, 0-9-1 (x HAProxy's)",
           _cpu_x("firehose", "new-policed", "haproxy"), 2.0, False),
    Target("policed CPU per message, 1.0 (x HAProxy's; stated)",
           _cpu_x("firehose10", "new-policed", "haproxy"), math.inf, False),
    Target("two senders, the free one, 0-9-1 (x its rate alone)", _two("amqp091"), 0.95, True),
    Target("two senders, the free one, 1.0 (x its rate alone)", _two("amqp10"), 0.95, True),
    Target("idle connections: memory each", _idle("floodwall", lambda r: r[
        "bytes_per_connection"] / KIB), 16.0, False, "KiB",
           pump=_idle("pump", lambda r: r["bytes_per_connection"] / KIB)),
    Target("a new client with them open: pika, median", _idle("floodwall", lambda r: median(
        r["served_at_n"]["pika_ms"])), 10.0, False, "ms",
           pump=_idle("pump", lambda r: median(r["served_at_n"]["pika_ms"]))),
    Target("1,000 new connections/s: added to the handshake, median",
           _handshake_added("floodwall>responder", "p50"), 1.0, False, "ms",
           pump=_handshake_added("pump>responder", "p50")),
    Target("1,000 new connections/s: added to the handshake, 99th percentile",
           _handshake_added("floodwall>responder", "p99"), 1.0, False, "ms",
           pump=_handshake_added("pump>responder", "p99")),
    Target("added latency at 5,000 msg/s, p99", _added("p99_us", "new"), 200.0, False, "us",
           pump=_added("p99_us", "pump")),
    Target("added latency at 5,000 msg/s, p99.9", _added("p999_us", "new"), 1000.0, False,
           "us", pump=_added("p999_us", "pump")),
    Target("1 MiB messages, firehose (x direct)", _x_direct("mib", "firehose", "new"), 0.95,
           True, pump=_x_direct("mib", "firehose", "pump"),
           haproxy=_x_direct("mib", "firehose", "haproxy")),
    Target("1 MiB messages, drain (x direct)", _x_direct("mib", "drain", "new"), 0.95, True,
           pump=_x_direct("mib", "drain", "pump"), haproxy=_x_direct("mib", "drain", "haproxy")),
    Target("1 MiB messages, firehose (x HAProxy)", _x_yardstick("mib", "firehose", "haproxy"),
           1.0, True),
    Target("1 MiB messages, drain (x HAProxy)", _x_yardstick("mib", "drain", "haproxy"), 1.0,
           True),
    Target("1 MiB messages, firehose (x the pump)", _x_yardstick("mib", "firehose", "pump"),
           1.0, True),
    Target("1 MiB messages, drain (x the pump)", _x_yardstick("mib", "drain", "pump"), 1.0,
           True),
    Target("1 MiB messages, firehose (x the splice pump)",
           _x_yardstick("mib", "firehose", "splice"), 0.95, True),
    Target("1 MiB messages, drain (x the splice pump)", _x_yardstick("mib", "drain", "splice"),
           0.95, True),
)


def commands(out: Path, rounds: int, quick: bool) -> dict[str, list[str]]:
    """The benchmark runs, by the name their JSON is read under."""
    py = [sys.executable, "-m"]
    drain = "20000" if quick else "100000"
    hold = ["--connections", "2000", "--hold-seconds", "10", "--probe-seconds", "2"] if quick \
        else ["--hold-seconds", "35", "--probe-seconds", "5"]
    return {
        "versus": [*py, "bench.versus", "--base", str(REPO), "--pump", "--haproxy", "--targets",
                   "new,new-policed", "--scenarios", "firehose,drain,firehose10,drain10,latency",
                   "--rounds", str(rounds), "--drain-messages", drain,
                   "--out", str(out / "versus.json")],
        "mib": [*py, "bench.versus", "--base", str(REPO), "--pump", "--splice-pump",
                "--haproxy", "--targets", "new",
                "--size", "1048576", "--max-length", "200", "--scenarios", "firehose,drain",
                "--rounds", str(max(1, rounds - 2)), "--drain-messages", "2000",
                "--out", str(out / "mib.json")],
        "connections": [*py, "bench.connections", "--targets", "direct,floodwall,pump",
                        *hold, "--rate-seconds", "3", "--rounds", "1",
                        "--out", str(out / "connections.json")],
        "two_senders": [*py, "bench.two_senders", "--rounds", str(max(2, rounds + 1)),
                        "--out", str(out / "two_senders.json")],
    }


def fmt(v: float, unit: str) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:.3f}" if not unit else f"{v:,.2f} {unit}" if abs(v) < 100 else f"{v:,.0f} {unit}"


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | limit | floodwall | byte pump, same run | HAProxy, same run | verdict |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        stated = math.isinf(r["limit"])
        limit = "stated" if stated else (
            ("at least " if r["at_least"] else "at most ") + fmt(r["limit"], r["unit"]))
        verdict = {True: "stated" if stated else "met", False: "**not met**",
                   None: "not measured"}[r["met"]]
        lines.append(f"| {r['target']} | {limit} | {fmt(r['value'], r['unit'])} | "
                     f"{fmt(r.get('pump', math.nan), r['unit'])} | "
                     f"{fmt(r.get('haproxy', math.nan), r['unit'])} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds of each alternated run")
    p.add_argument("--quick", action="store_true",
                   help="one round each, 2,000 connections: checks that every run works")
    p.add_argument("--only", default="", help="comma-separated subset of: versus, mib, "
                   "connections, two_senders (the others' JSON is read if DIR has it)")
    p.add_argument("--out", type=Path, default=None, help="directory for the JSON files "
                   "(default bench/out/speed-DATE)")
    a = p.parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out = a.out or REPO / "bench" / "out" / f"speed-{started:%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    runs = commands(out, 1 if a.quick else a.rounds, a.quick)
    only = {s for s in a.only.split(",") if s} or set(runs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    loads: dict[str, tuple[float, float]] = {}
    for name, cmd in runs.items():
        if name not in only:
            continue
        print(f"== {name}: {' '.join(cmd[1:])} (load {os.getloadavg()[0]:.2f})", flush=True)
        before = os.getloadavg()[0]
        rc = subprocess.call(cmd, cwd=REPO, env=env)
        loads[name] = (before, os.getloadavg()[0])
        if rc != 0:
            print(f"== {name} failed with exit code {rc}", flush=True)
    docs = {}
    for name in runs:
        f = out / f"{name}.json"
        if f.exists():
            docs[name] = json.loads(f.read_text())
    rows = [t.judge(docs) for t in TARGETS]
    table = report(rows)
    (out / "speed.json").write_text(json.dumps({
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", "bench.speed", *(sys.argv[1:] if argv is None
                                                               else argv)]),
        "load_before_after": loads, "targets": rows}, indent=1, default=str))
    print(f"\nthe relay's speed targets, {started:%Y-%m-%d %H:%M} UTC "
          f"(load before/after each run: "
          + ", ".join(f"{k} {b:.1f}/{e:.1f}" for k, (b, e) in loads.items()) + ")\n")
    print(table)
    print(f"\nraw figures: {out}")
    return 0 if all(r["met"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
