"""The whole job on synthetic fleet telemetry: report, plots, policies, summary, the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from floodwall.cli import main
from floodwall.control.policy import load_policies
from floodwall.ops.telemetry import SCHEMA_VERSION, V1_ONLY
from floodwall_pipeline.analyze import (
    DRIVER_GC,
    PYSPARK_DEBUGGING,
    analyze,
    driver_java_options,
)
from floodwall_pipeline.synthetic import generate

pytestmark = pytest.mark.load_tolerant


def _bad_lines(directory: Path) -> int:
    bad = 0
    for path in directory.iterdir():
        for line in path.read_text().splitlines():
            try:
                json.loads(line)
            except ValueError:
                bad += 1
    return bad


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    generate(out, sidecars=2, hours=0.1, queues=2, corrupt=0.005, seed=3)
    return out


def test_analyze_writes_report_plots_and_policies(spark: SparkSession, telemetry: Path,
                                                  tmp_path: Path) -> None:
    a = analyze([str(telemetry)], tmp_path / "report", spark=spark, resolution=5)
    assert a.quality.corrupt == _bad_lines(telemetry) > 0
    assert a.quality.files == 2 and a.quality.used > 0
    assert {(q["vhost"], q["queue"]) for q in a.queues} == {("/", "orders.0"), ("/", "orders.1")}
    assert {s["sidecar"] for s in a.sidecars} == {q["sidecar"] for q in a.sidecar_queues}
    html = a.report.read_text()
    for png in ["plots/overview.png", "plots/orders.0.png", "plots/orders.1.png"]:
        assert f"src='{png}'" in html
        assert (a.out / png).stat().st_size > 10_000
    assert "malformed or truncated" in html and "Recommended policies" in html
    policies = load_policies(a.policies)
    assert {p.queue for p in policies.policies} == {"orders.0", "orders.1"}
    summary = json.loads(a.summary.read_text())
    assert summary["input"]["corrupt"] == a.quality.corrupt
    assert any(q["trips"] > 0 for q in a.queues)


def test_floodwall_analyze_command(spark: SparkSession, telemetry: Path, tmp_path: Path) -> None:
    # The command builds its session with getOrCreate(): here it is the tests' one.
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["analyze", str(telemetry), "--out", str(out),
                                       "--resolution", "10s", "--target-drain", "1m"])
    assert result.exit_code == 0, result.output
    assert "malformed" in result.output and f"report: {out}/report.html" in result.output
    assert "target drain time 60s" in (out / "recommended-policies.yaml").read_text()
    missing = CliRunner().invoke(main, ["analyze", str(tmp_path / "nothing-here"),
                                        "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2
    assert "cannot read the telemetry" in missing.output


def test_figures_and_recommendations_do_not_move_with_the_plot_resolution(
        spark: SparkSession, telemetry: Path, tmp_path: Path) -> None:
    # make demo's report draws at 1 s, a plain analyze at 5 s: the same advice, to the byte
    # (the plots are the only use of the resolution: each run draws them)
    runs = {res: analyze([str(telemetry)], tmp_path / f"r{res:g}", spark=spark, resolution=res)
            for res in (1.0, 5.0, 30.0)}
    for name in ("recommended-policies.yaml", "summary.json"):
        texts = {res: (a.out / name).read_bytes() for res, a in runs.items()}
        assert texts[1.0] == texts[5.0] == texts[30.0], name
    yaml = runs[1.0].policies.read_text()
    assert "Rates in 5s buckets (whatever the report's --resolution)" in yaml
    assert any(r.changed for r in runs[1.0].recommendations)  # there is advice to move
    for res, a in runs.items():  # the plots' own
        assert f"{res:g}s buckets" in (a.out / "report.html").read_text()


def test_driver_java_options_given_add_to_the_jobs_and_may_choose_the_collector() -> None:
    ours = driver_java_options()
    assert "-Dlog4j2.configurationFile=file:" in ours and ours.endswith(DRIVER_GC)
    assert driver_java_options("-XX:TieredStopAtLevel=1") == f"{ours} -XX:TieredStopAtLevel=1"
    g1 = driver_java_options("-XX:+UseG1GC")  # two collectors: the JVM would not start
    assert DRIVER_GC not in g1 and g1.endswith("-XX:+UseG1GC") and "log4j2" in g1


def test_the_jobs_session_does_not_capture_python_call_sites(spark: SparkSession) -> None:
    # PySpark's DataFrame debugging costs a job some 7,000 py4j round trips (analyze.py)
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get(PYSPARK_DEBUGGING) == "false"
    assert is_debugging_enabled() is False


def test_every_schema_version_gives_the_same_summary_and_advice(
        spark: SparkSession, tmp_path: Path) -> None:
    # The same fleet and samples, written as version 1 (every field), version 2 (without
    # V1_ONLY) and version 3 (sparse: no nulls, no zero counts): the same summary.json and
    # recommended-policies.yaml bytes.
    dirs = {v: tmp_path / f"v{v}" for v in (1, 2, SCHEMA_VERSION)}
    for v, d in dirs.items():
        generate(d, sidecars=3, hours=0.1, queues=2, seed=5, version=v)
    sizes = {v: sum(p.stat().st_size for p in d.iterdir()) for v, d in dirs.items()}
    assert sizes[SCHEMA_VERSION] < 0.8 * sizes[2] and sizes[2] < 0.85 * sizes[1]
    for v, d in dirs.items():
        lines = [json.loads(line) for line in next(iter(sorted(d.iterdir()))).read_text()
                 .splitlines()]
        assert lines[0]["v"] == v and bool(V1_ONLY & lines[0].keys()) == (v == 1)
        # version 3 leaves out what is 0 or null: an idle queue's sample has no ingress
        assert all("ingress_bytes" in r for r in lines if r["type"] == "sample") == (v < 3)
        assert any(None in r.values() for r in lines if r["type"] != "event") == (v < 3)
    runs = {v: analyze([str(d)], tmp_path / f"out{v}", spark=spark, plots=False)
            for v, d in dirs.items()}
    assert runs[1].quality == runs[2].quality == runs[SCHEMA_VERSION].quality
    assert runs[1].quality.bad == 0 and runs[1].quality.used > 0
    assert any(r.changed for r in runs[1].recommendations)  # there is advice to compare
    for name in ("recommended-policies.yaml", "summary.json"):
        assert ((runs[1].out / name).read_bytes() == (runs[2].out / name).read_bytes()
                == (runs[SCHEMA_VERSION].out / name).read_bytes())
