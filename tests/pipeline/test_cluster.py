"""`floodwall analyze` on a real Spark standalone cluster, and the same bytes on every master.

A master and one worker from the installed pyspark (pipeline/devcluster.py) run the job as
a user would: ``floodwall analyze DIR --master spark://...`` in its own process, the
telemetry read by an executor JVM the worker launched, with no Python to start. The same
telemetry, split into many files and, per run, into different partitions, gives
byte-identical ``recommended-policies.yaml``, ``summary.json`` and, replayed through two
candidate policy files (``--what-if``), ``what-if.json`` on ``local[1]``, ``local[*]`` and
the cluster, also with another plotting ``--resolution``. The replay runs in Python on the
executors, from the code the job ships them (pipeline/whatif.py).

Bounded for ``make test``: 6 MB of telemetry, one worker, the JVMs on their quick compiler
(``QUICK_JIT``): 3 to 5 minutes on two cores shared with other test runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from floodwall_pipeline.devcluster import StandaloneCluster, start
from floodwall_pipeline.synthetic import generate

pytestmark = pytest.mark.load_tolerant

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = ("recommended-policies.yaml", "summary.json", "what-if.json")
#: Two candidates for ``--what-if``: one tighter than the fleet's policies, one looser, by
#: a glob and by a default.
CANDIDATES = {
    "tight.yaml": "version: 1\npolicies:\n  - {name: tight, match: {queue: \"*\"}, "
                  "capacity: 128KiB, resume: 64KiB, deadline: 5s}\n",
    "loose.yaml": "version: 1\npolicies:\n  - {name: loose, match: {queue: \"orders.*\"}, "
                  "capacity: 2MiB, resume: 1MiB, max_messages: 5000}\n",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    c = start(tmp_path_factory.mktemp("spark-cluster"), workers=1, cores=2, memory="1g")
    assert len(c.alive()) == 2  # the master and the worker, each its own JVM
    yield c
    c.stop()
    assert c.alive() == [], "JVMs of the cluster outlived it"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 sidecars on 3 queues for 12 minutes, a file every 2 minutes (28 files, about
    225 KB each), laid out by date and sidecar, each sidecar on its own clock: 12,798
    lines, 6.3 MB."""
    out = tmp_path_factory.mktemp("fleet")
    generate(out, sidecars=4, hours=0.2, queues=3, seed=11, corrupt=0.001, file_age=120,
             partitioned=True, jitter=True)
    return out


#: The JVMs compile only with C1, the quick compiler: on telemetry this small, C2's
#: compilations of Spark's planner and of the generated code are half the CPU of a run
#: (a cold run here: 50 s of CPU with C2, 26 s without), and the figures do not depend on
#: which compiler ran them. A real run keeps C2 (docs/performance.md, "Pipeline").
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def analyze(telemetry: Path, out: Path, master: str, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``floodwall analyze`` in a process of its own, with this checkout's code."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1", **(env or {}))
    full_env.pop("FLOODWALL_SPARK_MASTER", None)
    cands = out.parent / "candidates"
    cands.mkdir(exist_ok=True)
    what_if = []
    for name, text in CANDIDATES.items():
        (cands / name).write_text(text)
        what_if += ["--what-if", str(cands / name)]
    result = subprocess.run(
        [sys.executable, "-m", "floodwall", "analyze", str(telemetry), "--out", str(out),
         *what_if,
         "--master", master, "--conf", f"spark.driver.extraJavaOptions={QUICK_JIT}", *args],
        env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:],
                                    (out / "spark.log").read_text()[-3000:]
                                    if (out / "spark.log").exists() else "")
    return result


@pytest.mark.timeout(600)  # three Spark applications, each its own JVMs, on a shared machine
def test_same_bytes_on_local_one_local_all_and_the_cluster(
        cluster: StandaloneCluster, fleet: Path, tmp_path: Path) -> None:
    files = sorted(fleet.rglob("*.ndjson"))
    assert len(files) >= 20 and len({f.parent for f in files}) == 4
    runs = {
        "local[1]": analyze(fleet, tmp_path / "one", "local[1]"),
        # a split per file (28): each sidecar's records in 7 tasks; an odd number of
        # shuffle partitions
        "local[*]": analyze(fleet, tmp_path / "all", "local[*]",
                            "--conf", "spark.sql.files.maxPartitionBytes=1m",
                            "--conf", "spark.sql.shuffle.partitions=7"),
        # several files in each split (about 7), 3 shuffle partitions, and the plots at
        # 1 s: the figures and recommendations must not move with them. The executor
        # starts this Python for the replay (PYSPARK_PYTHON); the replay's code comes from
        # the zip the job ships (first on the executor's Python path).
        cluster.url: analyze(fleet, tmp_path / "cluster", cluster.url, "--resolution", "1s",
                             "--conf", "spark.sql.files.maxPartitionBytes=1m",
                             "--conf", "spark.sql.files.openCostInBytes=0",
                             "--conf", "spark.sql.shuffle.partitions=3",
                             "--conf", "spark.executor.memory=768m",
                             "--conf", f"spark.executor.extraJavaOptions={QUICK_JIT}",
                             env={"PYSPARK_PYTHON": sys.executable}),
    }
    outs = [tmp_path / "one", tmp_path / "all", tmp_path / "cluster"]
    for name in OUTPUTS:
        texts = [(o / name).read_bytes() for o in outs]
        assert texts[0] == texts[1] == texts[2], name
    summary = json.loads((outs[0] / "summary.json").read_text())
    assert summary["input"]["files"] == len(files) and summary["input"]["corrupt"] > 0
    assert len(summary["queues"]) == 3 and len(summary["sidecars"]) == 4
    assert any(q["trips"] > 0 for q in summary["queues"])
    what_if = json.loads((outs[0] / "what-if.json").read_text())
    assert [c["file"].rsplit("/", 1)[-1] for c in what_if["candidates"]] == list(CANDIDATES)
    tight, loose = what_if["candidates"]
    assert len(tight["queues"]) == 3 and 1 <= len(loose["queues"]) <= 3
    # tighter limits trip more often than the ones in force, looser ones hold for less
    assert sum(q["predicted"]["trips"] for q in tight["queues"]) > sum(
        q["replayed_recorded"]["trips"] for q in tight["queues"])
    assert sum(q["predicted"]["tripped_seconds"] for q in loose["queues"]) < sum(
        q["replayed_recorded"]["tripped_seconds"] for q in loose["queues"])
    # the four sidecars are a fleet: each one's part of what the queue admitted
    for q in tight["queues"]:
        p = q["predicted"]
        assert [s["sidecar"] for s in p["sidecars"]] == sorted(
            s["sidecar"] for s in summary["sidecars"])
        if p["admitted_bytes"] > 0:
            assert sum(s["admitted_share"] for s in p["sidecars"]) == pytest.approx(1, abs=1e-3)
            assert sum(s["admitted_bytes"] for s in p["sidecars"]) == pytest.approx(
                p["admitted_bytes"], rel=0.02)
    timings = [json.loads((o / "timings.json").read_text()) for o in outs]
    assert [t["master"] for t in timings] == ["local[1]", "local[*]", cluster.url]
    # the work was split three ways: input splits and shuffle partitions
    assert [t["shuffle_partitions"] for t in timings] == [1, 7, 3]
    inputs = [t["input_partitions"] for t in timings]
    assert inputs[1] >= 28 and inputs[2] <= 10 and len(set(inputs)) == 3, inputs
    assert "report: " in runs[cluster.url].stdout
    # Its malformed lines failed each master's strict read, the cluster's in an executor
    # JVM, and each read the telemetry again to count them (pipeline/load.py).
    assert [t["reads"] for t in timings] == [2, 2, 2]
    assert "read again to count and show each" in runs[cluster.url].stdout

    # The cluster's executor, a JVM of its own launched by the worker, read the files.
    logs = cluster.executor_logs()
    assert logs, list(cluster.directory.rglob("*"))
    read = "".join(log.read_text(errors="replace") for log in logs)
    assert sum(f"Reading File path: file://{f}" in read for f in files) == len(files)
