"""How fast ``floodwall analyze`` runs on local masters and on a standalone cluster.

    .venv/bin/python -m bench.pipeline_bench                  # 64 sidecars x 1 h, 4 masters
    .venv/bin/python -m bench.pipeline_bench --masters 'local[2]' --baseline /tmp/old-checkout
    .venv/bin/python -m bench.pipeline_bench --record         # writes bench/RESULTS.md's section

It writes synthetic fleet telemetry once (pipeline/synthetic.py: N sidecars feeding 4
queues, one sample a second, plus sidecar records and events; the same seed as every
earlier run of this benchmark, so the same lines) and runs the whole job (read,
aggregate, recommend, plot, report) on each master, each in a process of its own with one
SparkSession: a warm-up run on the fleet's telemetry (not counted: the JVM compiles the
job's generated code and Spark's own on the first big run, as a long fleet job would once),
then ``--rounds`` runs on it; the best is kept (the session's start-up is reported apart). Masters:
``local[N]``, and ``cluster:N``, a standalone cluster of N one-core workers started from the
installed pyspark (pipeline/devcluster.py) for the run. ``--baseline DIR`` also runs the
local masters with the ``pipeline`` package of another checkout (an older commit), side
by side. The load average before and after each run is in the output: the machine may be
shared.

The telemetry is written in the current schema version for this checkout and, for the
baseline (which reads version 1 only), in version 1: the same fleet and samples, the lines
with every field version 1 had (docs/telemetry.md, "Versions"). ``--old-encoding`` also runs
this checkout on the version 1 lines (the local masters). Every run's ``summary.json`` and
``recommended-policies.yaml`` are hashed (md5): the same samples must give the same bytes
whatever the encoding and the master.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN, END = "<!-- pipeline-bench:begin -->", "<!-- pipeline-bench:end -->"
EXECUTOR_MEMORY = "2g"
#: The job's outputs that only the telemetry's records determine (pipeline/analyze.py).
DETERMINED = ("summary.json", "recommended-policies.yaml")
OLD = "this, v1 lines"  # this checkout on the version 1 lines
WORKER_MEMORY = "3g"


# -- one master, in its own process (run with the code under test on PYTHONPATH) ---------
def _cpu(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used, 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _md5s(out: Path) -> str:
    """The md5 of each of ``DETERMINED`` in ``out``, shortened, joined with ``/``."""
    return "/".join(hashlib.md5((out / name).read_bytes()).hexdigest()[:8] for name in DETERMINED)


def _executors(groups: list[int]) -> list[int]:
    """The executor JVMs of a standalone cluster's workers (process groups ``groups``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (int(stat[stat.rindex(")") + 2:].split()[2]) in groups
                and b"CoarseGrainedExecutorBackend" in cmdline):
            found.append(int(entry.name))
    return found


def _package(code: Path) -> str:
    """The pipeline's import name in checkout ``code``: floodwall_pipeline, or pipeline
    before the two were told apart (an older checkout, the baseline)."""
    return "floodwall_pipeline" if (code / "floodwall_pipeline").exists() else "pipeline"


def child(spec: dict[str, Any]) -> dict[str, Any]:
    code = Path(spec["code"]).resolve()
    job = importlib.import_module(f"{_package(code)}.analyze")
    if not Path(job.__file__ or "").resolve().is_relative_to(code):
        raise RuntimeError(f"{job.__name__} is {job.__file__}, not from {code}")
    work = Path(spec["work"])
    started = time.perf_counter()
    spark = job.spark_session(spec["master"], app="floodwall-pipeline-bench",
                              conf=spec.get("conf") or {}, jvm_log=work / "spark.log")
    startup = time.perf_counter() - started
    gateway = spark.sparkContext._gateway
    assert gateway is not None and gateway.proc is not None
    driver = gateway.proc.pid
    t0 = time.perf_counter()
    job.analyze([spec["data"]], work / "warm-out", spark=spark)
    warm_s = time.perf_counter() - t0
    md5s = [_md5s(work / "warm-out")]
    # the executors (a cluster's) live as long as the session: the same JVMs every round
    executors = _executors(spec.get("groups") or [])
    rounds = []
    for i in range(spec["rounds"]):
        load = os.getloadavg()[0]
        cpu0 = {pid: _cpu(pid) for pid in (driver, *executors)}
        t0 = time.perf_counter()
        a = job.analyze([spec["data"]], work / f"out-{i}", spark=spark)
        seconds = time.perf_counter() - t0
        cpu = {pid: _cpu(pid) - before for pid, before in cpu0.items()}
        md5s.append(_md5s(work / f"out-{i}"))
        rounds.append({"seconds": round(seconds, 2), "load": [load, os.getloadavg()[0]],
                       "driver_cpu": round(cpu[driver], 1),
                       "executor_cpu": round(sum(cpu.values()) - cpu[driver], 1),
                       "jvm_cpu": round(sum(cpu.values()), 1), "stages": a.timings})
    spark.stop()
    return {"startup_s": round(startup, 2), "warm_s": round(warm_s, 2), "rounds": rounds,
            "spark": spark.version, "md5": sorted(set(md5s)),
            "executors": len(executors), "module": job.__file__}


# -- the parent ----------------------------------------------------------------------------
def _run_child(spec: dict[str, Any], code: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code), SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                           json.dumps(spec)], cwd=code, env=env, capture_output=True,
                          text=True, timeout=3600)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{spec['master']} with {code} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run(sidecars: int, hours: float, queues: int, masters: list[str], rounds: int,
        baseline: Path | None, old_encoding: bool = False) -> dict[str, Any]:
    from floodwall.ops.telemetry import SCHEMA_VERSION
    from floodwall_pipeline.synthetic import generate

    work = Path(tempfile.mkdtemp(prefix="floodwall-pipeline-bench-"))
    try:
        data, data_v1 = work / "data", work / "data-v1"
        lines = generate(data, sidecars=sidecars, hours=hours, queues=queues, seed=sidecars)
        size = sum(p.stat().st_size for p in data.iterdir())
        size_v1 = None
        if baseline or old_encoding:  # the same samples, every field version 1 had
            assert generate(data_v1, sidecars=sidecars, hours=hours, queues=queues,
                            seed=sidecars, version=1) == lines
            size_v1 = sum(p.stat().st_size for p in data_v1.iterdir())
        runs = []
        codes = ([("this", ROOT, data)] + ([(OLD, ROOT, data_v1)] if old_encoding else [])
                 + ([("baseline", baseline, data_v1)] if baseline else []))
        for master in masters:
            for label, code, lines_at in codes:
                if label != "this" and not master.startswith("local"):
                    continue
                runs.append(_one(master, label, code, work, lines_at, rounds))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"sidecars": sidecars, "hours": hours, "queues": queues, "lines": lines,
            "bytes": size, "bytes_v1": size_v1, "version": SCHEMA_VERSION,
            "runs": runs, "baseline": str(baseline) if baseline else None,
            "commit": _commit(ROOT),
            "baseline_commit": (_commit(baseline) or baseline.name) if baseline else None,
            "machine": f"{platform.machine()}, {platform.system()}, python "
                       f"{platform.python_version()}, {os.cpu_count()} cores",
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _commit(path: Path | None) -> str | None:
    if path is None:
        return None
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def _one(master: str, label: str, code: Path, work: Path, data: Path, rounds: int
         ) -> dict[str, Any]:
    out = work / (f"{label.replace(', ', '-').replace(' ', '-')}-"
                  f"{master.replace('[', '').replace(']', '').replace(':', '')}")
    out.mkdir()
    spec: dict[str, Any] = {"master": master, "work": str(out), "data": str(data),
                            "rounds": rounds, "code": str(code)}
    if master.startswith("cluster:"):
        from floodwall_pipeline.devcluster import running  # this checkout's, for both

        workers = int(master.split(":", 1)[1])
        with running(out / "cluster", workers=workers, cores=1, memory=WORKER_MEMORY) as c:
            spec["master"] = c.url
            spec["groups"] = [w.process.pid for w in c.workers]  # each leads its group
            spec["conf"] = {"spark.executor.memory": EXECUTOR_MEMORY,
                            "spark.executor.extraJavaOptions": "-XX:+UseParallelGC",
                            "spark.sql.shuffle.partitions": str(workers),
                            "spark.sql.files.minPartitionNum": str(4 * workers)}
            result = _run_child(spec, code)
            cores = workers
    else:
        result = _run_child(spec, code)
        inside = master[len("local"):].strip("[]").split(",")[0].strip()
        cores = (os.cpu_count() or 1) if inside == "*" else int(inside or 1)
    best = min(r["seconds"] for r in result["rounds"])
    return {"master": master, "code": label, "cores": cores, "best_s": best, **result}


def _best_cpu(r: dict[str, Any]) -> float | None:
    return min((rd["jvm_cpu"] for rd in r["rounds"] if rd.get("jvm_cpu")), default=None)


def markdown(result: dict[str, Any]) -> str:
    lines_n = result["lines"]
    runs = result["runs"]
    loads = [x for r in runs for rd in r["rounds"] for x in rd["load"]]
    out = [BEGIN, "## Pipeline", "",
           f"`python -m bench.pipeline_bench` ({result['when']}; {result['machine']}; "
           f"commit {result['commit']}). The whole `floodwall analyze` job (read, aggregate, "
           "recommend, plot, report) on the synthetic telemetry of "
           f"{result['sidecars']} sidecars x {result['hours']:g} h feeding {result['queues']} "
           f"queues (pipeline/synthetic.py, seed {result['sidecars']}): {lines_n:,} lines, "
           f"{result['bytes'] / 2**20:.0f} MiB of NDJSON"
           + (f" in schema version {result['version']} ({result['bytes_v1'] / 2**20:.0f} MiB "
              "as version 1's lines, which the baseline reads)" if result.get("bytes_v1")
              else "") + ". Each master in a process of its own "
           "with one SparkSession (start-up not counted), warmed up by a first run on the same "
           "telemetry (not counted); best "
           f"of {len(runs[0]['rounds'])} rounds. `cluster:N`: a standalone master and N "
           "workers of one core each, started from the installed pyspark "
           "(pipeline/devcluster.py), executors in JVMs of their own. First run: the warm-up, "
           "what a one-off `floodwall analyze` costs past its start-up. CPU: user and system "
           "seconds of the driver's JVM and the executors' (the best round). **The machine "
           "is shared** with other engineers' test runs: load average "
           f"{min(loads):.1f} to {max(loads):.1f} on its {os.cpu_count()} cores during the "
           "runs, so a wall-clock time here is the job's plus its share of waiting; CPU "
           "seconds are less sensitive to the sharing (not immune: caches and memory are "
           "shared too).", "",
           "| code | master | cores | first run | job | lines/s | lines/s per core | CPU | "
           "lines per CPU second |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        cpu = _best_cpu(r)
        rate = lines_n / r["best_s"]
        first = f"{r['warm_s']:.1f} s" if "warm_s" in r else "-"
        out.append(f"| {r['code']} | `{r['master']}` | {r['cores']} | {first} | "
                   f"{r['best_s']:.1f} s | {rate:,.0f} | {rate / r['cores']:,.0f} | "
                   + (f"{cpu:.1f} s | {lines_n / cpu:,.0f} |" if cpu else "- | - |"))
    base = {r["master"]: r for r in runs if r["code"] == "baseline"}
    if base:
        out += ["", f"Side by side with the baseline (`{result['baseline_commit']}`, the same "
                "samples, the same process setup, one after the other in this run):", ""]
        for t in runs:
            b = base.get(t["master"])
            if b is None or t is b:
                continue
            cpu_t, cpu_b = _best_cpu(t), _best_cpu(b)
            out.append(f"- `{t['master']}`, {t['code']}: {b['best_s'] / t['best_s']:.1f}x the "
                       "lines per second per core"
                       + (f", {cpu_b / cpu_t:.1f}x the lines per CPU second"
                          if cpu_t and cpu_b else "") + ".")
    md5s = sorted({m for r in runs if r["code"] != "baseline" for m in r.get("md5", [])})
    if md5s:
        out += ["", f"{' and '.join(DETERMINED)} (md5, every run and round of this checkout): "
                + ", ".join(f"`{m}`" for m in md5s)
                + (" (the same bytes)" if len(md5s) == 1 else " (**not the same bytes**)")]
    out.append(END)
    return "\n".join(out) + "\n"


def record(result: dict[str, Any]) -> None:
    section = markdown(result)
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + "\n" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sidecars", type=int, default=64)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--masters", default="local[1],local[2],cluster:1,cluster:2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline", type=Path, help="a checkout whose pipeline/ to compare with")
    p.add_argument("--baseline-label", help="what the baseline is (default: its commit)")
    p.add_argument("--old-encoding", action="store_true",
                   help="also run this checkout on the version 1 lines (local masters)")
    p.add_argument("--out", type=Path, default=Path("bench/out"))
    p.add_argument("--record", action="store_true", help="write bench/RESULTS.md's section")
    p.add_argument("--from-json", type=Path, help="re-render (and --record) a past run")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))), flush=True)
        return
    if a.from_json:
        result = json.loads(a.from_json.read_text())
        path = a.from_json
    else:
        result = run(a.sidecars, a.hours, a.queues, a.masters.split(","), a.rounds,
                     a.baseline.resolve() if a.baseline else None, a.old_encoding)
        if a.baseline_label:
            result["baseline_commit"] = a.baseline_label
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / time.strftime("pipeline-%Y%m%d-%H%M%S.json")
        path.write_text(json.dumps(result, indent=1))
    print(markdown(result))
    print(f"raw figures: {path}")
    if a.record:
        record(result)
        print(f"recorded in {RESULTS}")


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a file (--child): the code under test decides
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    main()
