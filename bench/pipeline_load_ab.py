"""Two versions of the pipeline's reader (``pipeline/load.py``) side by side in one SparkSession.

    .venv/bin/python -m bench.pipeline_load_ab A/pipeline/load.py B/pipeline/load.py DATA --rounds 8

Each file is imported as a module of its own next to this checkout's ``floodwall_pipeline``
(so a variant may change ``load`` and what it calls in that file, nothing else), and
``load()`` runs on the telemetry in DATA (``python -m floodwall_pipeline.synthetic DATA
--sidecars 64 --hours 1 --queues 4 --seed 64``: the pipeline benchmark's input) on
``local[1]``, rounds alternating A, B then B, A after one warm-up round of each. The time
of a round is the reader's job (parse, keep, count): the part of ``floodwall analyze`` that
Spark's JIT and the session's heap set more than the code, which is why the two share one
session. Prints each round, then the best and the median of each, and the input account of
each (the same lines must give the same counts).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"floodwall_pipeline.load_{name}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, help="the first load.py")
    p.add_argument("b", type=Path, help="the second load.py")
    p.add_argument("data", help="a directory of telemetry")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    from floodwall_pipeline.analyze import spark_session

    spark = spark_session("local[1]")
    modules = {"A": _module("A", args.a), "B": _module("B", args.b)}
    times: dict[str, list[float]] = {"A": [], "B": []}
    accounts: dict[str, tuple[int, int, int]] = {}
    for r in range(args.rounds + 1):
        for name in ("AB" if r % 2 else "BA"):
            started = time.perf_counter()
            telemetry = modules[name].load(spark, [args.data])
            seconds = time.perf_counter() - started
            telemetry.unpersist()
            q = telemetry.quality
            accounts[name] = (q.lines, q.bad, q.used)
            if r:  # round 0 warms both up
                times[name].append(seconds)
            print(f"{name} round {r}: {seconds:.2f} s (lines, bad, used: {accounts[name]})",
                  flush=True)
    for name, values in times.items():
        print(f"{name}: best {min(values):.2f} s, median {statistics.median(values):.2f} s, "
              f"lines/bad/used {accounts[name]}")
    spark.stop()


if __name__ == "__main__":
    main()
