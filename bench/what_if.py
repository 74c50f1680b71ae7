"""What ``--what-if`` costs: ``floodwall analyze`` alone and with three candidates, one session.

    .venv/bin/python -m bench.what_if                          # 64 sidecars x 1 h, local[1]
    .venv/bin/python -m bench.what_if --sidecars 16 --master 'local[2]' --rounds 3

The telemetry is pipeline_bench's (pipeline/synthetic.py, 4 queues, seed = sidecars: the
same lines), written once. One SparkSession runs a warm-up (not counted), then ``--rounds``
rounds, each ``analyze`` alone and ``analyze --what-if`` with three candidates (tighter,
looser, and count-limited with ``overflow: reject``), alternated so that load from elsewhere
falls on both; the best of each is kept. The target: the three candidates in under 3x the
time of ``analyze`` alone. ``analyze`` alone replays the recommendations already (one
policy file); the candidates add three to the same pass. The load average is printed: the
machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

CANDIDATES = {
    "tighter.yaml": "version: 1\npolicies:\n  - {name: tighter, match: {queue: \"*\"}, "
                    "capacity: 128KiB, resume: 96KiB, deadline: 10s}\n",
    "looser.yaml": "version: 1\npolicies:\n  - {name: looser, match: {queue: \"*\"}, "
                   "capacity: 1MiB, resume: 768KiB}\n",
    "counted.yaml": "version: 1\npolicies:\n  - {name: counted, match: {queue: \"*\"}, "
                    "capacity: 512KiB, resume: 256KiB, max_messages: 300, "
                    "resume_messages: 200, overflow: reject}\n",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sidecars", type=int, default=64)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--master", default="local[1]")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data", type=Path, default=None, help="keep the telemetry here")
    a = p.parse_args()

    from floodwall_pipeline.analyze import analyze, spark_session
    from floodwall_pipeline.synthetic import generate
    from floodwall_pipeline.whatif import read_candidate

    work = Path(tempfile.mkdtemp(prefix="bench-what-if-"))
    data = a.data or work / "telemetry"
    if not data.exists() or not any(data.rglob("*.ndjson")):
        lines = generate(data, sidecars=a.sidecars, hours=a.hours, queues=4, seed=a.sidecars)
        print(f"telemetry: {lines:,} lines in {data}")
    for name, text in CANDIDATES.items():
        (work / name).write_text(text)
    cands = [read_candidate(str(work / name)) for name in CANDIDATES]
    spark = spark_session(a.master, app="bench-what-if", jvm_log=work / "spark.log")
    best: dict[str, float] = {}
    runs = [("warm-up", True)] + [(kind, False) for _ in range(a.rounds)
                                  for kind in ("analyze", "analyze + 3 what-if")]
    for i, (kind, warm) in enumerate(runs):
        load = os.getloadavg()[0]
        started = time.perf_counter()
        analyze([str(data)], work / f"out-{i}", spark=spark, plots=True,
                what_if=cands if kind != "analyze" else ())
        took = time.perf_counter() - started
        print(f"{kind:22s} {took:7.1f}s  (load {load:.1f} -> {os.getloadavg()[0]:.1f})",
              flush=True)
        if not warm:
            best[kind] = min(best.get(kind, float("inf")), took)
    alone, more = best["analyze"], best["analyze + 3 what-if"]
    print(f"best: analyze {alone:.1f}s, with three candidates {more:.1f}s: "
          f"{more / alone:.2f}x (target < 3x)")
    spark.stop()


if __name__ == "__main__":
    main()
