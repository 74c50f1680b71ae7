"""Old vs new floodwall in one run: ``bench.relay``'s scenarios through two checkouts.

``python -m bench.versus --base DIR [--rounds R] [--seconds N] [--pump] [--splice-pump]
[--haproxy] [--out FILE.json]``

One private RabbitMQ; ``floodwall run`` from ``DIR`` (another checkout, e.g. a worktree of
main before a change: its module is ``proxy`` or ``floodwall``, found from what the checkout
holds) and from this checkout, each twice: plain (``bench.relay``'s floodwall target) and
with policies that police the firehose queues, nothing tripped (``bench.flow``'s
``policed`` target). The relay scenarios run over all of them and direct, alternated round
by round as ``bench.relay`` does, so that noise on a shared machine falls on both versions
alike. The report is each figure side by side and new / old, paired by round. ``--pump``
adds ``bench.pump`` (the byte pump, the floor a relay is measured against) as one more
target in the same rounds, ``--splice-pump`` ``bench.pump --splice`` (``splice``: a relay
that copies nothing into user space, socket to pipe to socket), ``--haproxy`` Debian's
HAProxy in TCP mode (the yardstick a platform team reaches for; ``--haproxy-threads``,
default 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench import amqp091, flow, relay
from bench.meters import CpuMeter, median
from floodwall.dev.devbroker import LocalBroker, free_port
from floodwall.dev.devproxy import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("firehose", "drain", "firehose10", "drain10", "latency")
TARGETS = ("direct", "old", "new", "old-policed", "new-policed")
#: What a relay is measured against, when asked for: the byte pump, the splice pump and
#: HAProxy.
YARDSTICKS = ("pump", "splice", "haproxy")
PAIRS = (("new", "old"), ("new-policed", "old-policed"))
FIGURES = {"firehose": ("msgs_per_s", "relay_cpu_us_per_msg", "relay_reads_per_msg"),
           "drain": ("msgs_per_s", "relay_cpu_us_per_msg", "relay_reads_per_msg"),
           "firehose10": ("msgs_per_s", "relay_cpu_us_per_msg", "relay_reads_per_msg"),
           "drain10": ("msgs_per_s", "relay_cpu_us_per_msg", "relay_reads_per_msg"),
           "latency": ("p50_us", "p99_us", "p999_us", "relay_cpu_us_per_msg")}


def module_of(root: Path) -> str:
    """The import name a checkout runs as: ``floodwall``, or ``proxy`` in an old checkout."""
    return "floodwall" if (root / "floodwall" / "__main__.py").exists() else "proxy"


def start_relays(procs: dict[str, ProxyProcess], upstream: str, base: Path, workdir: Path,
                 management: str, old_args: tuple[str, ...] = (),
                 new_args: tuple[str, ...] = (), names: tuple[str, ...] = TARGETS[1:]
                 ) -> None:
    """Into ``procs``, as each starts (so that the caller stops those that did);
    ``old_args`` / ``new_args``: more arguments of the old / new ``floodwall run``;
    ``names``: which of the relays (default all)."""
    policies = flow.write_policies(
        workdir / "policies.yaml",
        flow.policy_entry("firehose", "bench.firehose*", "256MiB", "192MiB"),
        flow.policy_entry("others", "orders.*", "64MiB", "48MiB"))
    policed = ["--policies", str(policies), "--management", management]
    for name in names:
        root = base if name.startswith("old") else None
        proc = ProxyProcess(upstream=upstream, logfile=workdir / f"{name}.log",
                            extra_args=["--event-loop", "auto", "--log-format", "json",
                                        *(policed if name.endswith("policed") else []),
                                        *(old_args if root else new_args)],
                            root=root, module=module_of(root) if root else "floodwall")
        procs[name] = proc
        proc.start()


async def measure(rig: relay.Rig, procs: dict[str, ProxyProcess],
                  progress: Callable[[str], None]) -> dict[str, Any]:
    control = await amqp091.connect(rig.endpoint.host, rig.endpoint.amqp_port)
    await control.declare(relay.FIREHOSE_QUEUE, {"x-max-length": rig.opts.max_length})
    await control.declare(relay.FIREHOSE10_QUEUE, {"x-max-length": rig.opts.max_length})
    await control.close()
    for name, proc in procs.items():
        if name.endswith("policed"):
            for q in (relay.FIREHOSE_QUEUE, relay.FIREHOSE10_QUEUE):
                await flow.until(lambda p=proc, q=q: flow.policed(p, q), 60,
                                 f"{q} policed by {name}")
    return await relay.run_all(rig, progress)


def paired(scenario: dict[str, Any], new: str, old: str, key: str) -> float:
    """Median over rounds of new / old in the same round: noise that drifts cancels."""
    olds = {r["round"]: r.get(key) for r in scenario["runs"].get(old, []) if "error" not in r}
    return median([r[key] / olds[r["round"]] for r in scenario["runs"].get(new, [])
                   if "error" not in r and r.get(key) and olds.get(r["round"])])


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scn, keys in FIGURES.items():
        if scn not in results:
            continue
        med = results[scn]["median"]
        out[scn] = {"median": {t: {k: med.get(t, {}).get(k) for k in keys}
                               for t in (*TARGETS, *YARDSTICKS) if t in TARGETS or t in med},
                    "new_over_old_paired": {f"{n}/{o}": {k: paired(results[scn], n, o, k)
                                                         for k in keys} for n, o in PAIRS}}
    return out


def report(doc: dict[str, Any]) -> None:
    print(f"\nold ({doc['meta']['base']}) vs new ({doc['meta']['new']}), "
          f"{doc['meta']['started']}: {doc['meta']['command']}")
    for scn, s in doc["summary"].items():
        keys = FIGURES[scn]
        print(f"\n{scn}: {relay.SCENARIOS[scn][0]}")
        print(f"  {'target':<13}" + "".join(f"{k:>22}" for k in keys))
        for t, m in s["median"].items():
            print(f"  {t:<13}" + "".join(f"{flow.fmt(m.get(k), ',.2f'):>22}" for k in keys))
        for pair, ratios in s["new_over_old_paired"].items():
            print(f"  {pair:<13}" + "".join(f"{flow.fmt(ratios[k], '.3f'):>21}x"
                                             for k in keys))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.versus",
                                description="old vs new floodwall, alternated in one run")
    p.add_argument("--base", type=Path, required=True,
                   help="the other checkout (e.g. a worktree of main before the change)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--size", type=int, default=1024,
                   help="message body bytes (1048576: the 1 MiB target)")
    p.add_argument("--drain-messages", type=int, default=50_000)
    p.add_argument("--max-length", type=int, default=20_000,
                   help="x-max-length of the firehose queues")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--old-args", default="",
                   help="more arguments for the old `floodwall run` (with --base the same "
                   "checkout: one setting against another, e.g. '--fleet off')")
    p.add_argument("--new-args", default="", help="more arguments for the new `floodwall run`")
    p.add_argument("--pump", action="store_true",
                   help="the byte pump (bench.pump) as one more target, alternated with the rest")
    p.add_argument("--splice-pump", action="store_true",
                   help="bench.pump --splice (no user-space copy) as one more target, "
                        "alternated with the rest")
    p.add_argument("--haproxy", action="store_true",
                   help="Debian's HAProxy in TCP mode as one more target, alternated with the rest")
    p.add_argument("--haproxy-threads", type=int, default=1,
                   help="HAProxy's nbthread (1: one event loop, like floodwall and the pump)")
    p.add_argument("--targets", default=",".join(TARGETS[1:]),
                   help="which floodwall targets to run (direct always runs), comma-separated "
                        "subset of: " + ", ".join(TARGETS[1:]))
    a = p.parse_args(argv)
    a.targets = tuple(t for t in a.targets.split(",") if t)
    for t in a.targets:
        if t not in TARGETS[1:]:
            p.error(f"unknown target {t!r}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = dt.datetime.now(dt.UTC)
    out = args.out or REPO / "bench" / "out" / f"versus-{started:%Y%m%d-%H%M%S}.json"
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-versus-"))
    t_start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    broker = LocalBroker(workdir / "rabbit", config_extra=f"prometheus.tcp.port = {free_port()}\n")
    procs: dict[str, ProxyProcess] = {}
    pump = splice = haproxy = None
    try:
        progress(f"starting RabbitMQ in {workdir}")
        endpoint = broker.start()
        start_relays(procs, f"{endpoint.host}:{endpoint.amqp_port}", args.base.resolve(),
                     workdir, endpoint.management_url, tuple(args.old_args.split()),
                     tuple(args.new_args.split()), args.targets)
        targets = {"direct": relay.Target("direct", endpoint.host, endpoint.amqp_port)}
        for name, proc in procs.items():
            assert proc.process is not None
            targets[name] = relay.Target(name, "127.0.0.1", proc.port,
                                         psutil.Process(proc.process.pid))
        if args.pump:
            pump, pport = relay.start_pump(f"{endpoint.host}:{endpoint.amqp_port}", workdir)
            targets["pump"] = relay.Target("pump", "127.0.0.1", pport, psutil.Process(pump.pid))
        if args.splice_pump:
            splice, sport = relay.start_pump(f"{endpoint.host}:{endpoint.amqp_port}", workdir,
                                             ["--splice"], name="splice")
            targets["splice"] = relay.Target("splice", "127.0.0.1", sport,
                                             psutil.Process(splice.pid))
        if args.haproxy:
            haproxy, hport = relay.start_haproxy(f"{endpoint.host}:{endpoint.amqp_port}",
                                                 workdir, args.haproxy_threads)
            targets["haproxy"] = relay.Target("haproxy", "127.0.0.1", hport,
                                              psutil.Process(haproxy.pid))
        opts = relay.Options(seconds=args.seconds, rounds=args.rounds, quiet_budget=60.0,
                             size=args.size, drain_messages=args.drain_messages,
                             max_length=args.max_length,
                             scenarios=tuple(s for s in args.scenarios.split(",") if s))
        rig = relay.Rig(endpoint, targets, CpuMeter(relay.beam_of(broker)), opts)
        import uvloop

        results: dict[str, Any] = uvloop.run(measure(rig, procs, progress))
        meta = {"started": started.isoformat(timespec="seconds"),
                "command": " ".join(["python", "-m", "bench.versus",
                                     *(sys.argv[1:] if argv is None else argv)]),
                "base": str(args.base), "new": str(REPO), "notes": rig.notes,
                "elapsed_s": round(time.monotonic() - t_start, 1)}
        doc = {"meta": meta, "results": results, "summary": summarize(results)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(relay._finite(doc), indent=1,
                                  default=relay._json_default, allow_nan=False))
        report(doc)
        print(f"\nraw figures: {out}")
        return 0
    finally:
        for proc in procs.values():
            proc.stop()
        for child in (pump, splice, haproxy):
            if child is not None:
                child.terminate()
                child.wait()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
