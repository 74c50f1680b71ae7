"""The whole job: telemetry in; report.html, plots, recommended-policies.yaml, summary.json out.

``analyze()`` is what ``floodwall analyze`` and ``pipeline/submit.py`` (spark-submit) call. It
runs on the SparkSession it is given, else builds one for ``master`` (``local[*]`` by default).
The report is written on the driver, to a local directory; the telemetry may be anywhere
Spark reads (``s3a://bucket/prefix`` with hadoop-aws configured: docs/pipeline.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from floodwall_pipeline import aggregate, recommend, report, whatif
from floodwall_pipeline.files import TimeRange
from floodwall_pipeline.load import InputQuality, load

DEFAULT_MASTER = "local[*]"
DEFAULT_RESOLUTION = 5.0  # the plots' (--resolution)
#: The buckets of the per-queue figures and the recommendations (``advice_resolution``).
ADVICE_RESOLUTION = 5.0
MAX_PLOTS = 8
PLOT_POINTS = 1500
LOG4J = Path(__file__).with_name("log4j2.properties")
#: Shuffle partitions on a cluster unless --conf spark.sql.shuffle.partitions says otherwise
#: (adaptive execution merges small ones); raise it for fleets of many thousand sidecars.
CLUSTER_SHUFFLE_PARTITIONS = 32
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
#: PySpark's call-site capture for error messages (off for the job: spark_session).
PYSPARK_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
#: The driver JVM's collector unless the user's options choose one: the throughput
#: collector (no concurrent work beside the job's; within the noise of G1 on the bench's
#: input here: 31.3 against 32.0 CPU seconds).
DRIVER_GC = "-XX:+UseParallelGC"


def driver_java_options(given: str = "") -> str:
    """The driver JVM's options: the job's log4j settings and ``DRIVER_GC``, then those
    ``given`` with ``--conf spark.driver.extraJavaOptions=...`` (a JVM takes the later of
    two values of one flag; a collector given replaces ``DRIVER_GC``: two would not start)."""
    ours = [f"-Dlog4j2.configurationFile=file:{LOG4J}"]
    if not re.search(r"-XX:\+Use\w+GC\b", given):
        ours.append(DRIVER_GC)
    return " ".join([*ours, given.strip()] if given.strip() else ours)


@dataclass
class Analysis:
    """What the job found and wrote."""

    out: Path
    quality: InputQuality
    queues: list[dict[str, Any]]
    sidecar_queues: list[dict[str, Any]]
    sidecars: list[dict[str, Any]]
    recommendations: list[recommend.Recommendation]
    report: Path
    policies: Path
    summary: Path
    timings: dict[str, float] = field(default_factory=dict)
    resolution: float = 0.0  # of the per-queue figures and the recommendations
    caveats: list[str] = field(default_factory=list)  # why the recommendations may not hold
    what_if: Path | None = None  # what-if.json, with --what-if
    replays: list[dict[str, Any]] = field(default_factory=list)  # replay.replay_group's


@contextlib.contextmanager
def _stderr_to(path: Path | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` meanwhile: a JVM started now keeps writing there."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def local_cores(master: str) -> int:
    """The threads of a ``local``, ``local[N]``, ``local[*]`` or ``local[N, F]`` master."""
    inside = master[len("local"):].strip("[]").split(",")[0].strip()
    if inside == "*":
        return os.cpu_count() or 1
    return max(int(inside), 1) if inside else 1


def spark_session(master: str | None = None, app: str = "floodwall-analyze",
                  conf: Mapping[str, str] | None = None,
                  shuffle_partitions: int | None = None,
                  jvm_log: Path | None = None) -> SparkSession:
    """A session for the job: quiet, UTC; on a local master no UI and few shuffle partitions.

    ``jvm_log``: when this call starts the JVM, its console output goes to that file.
    """
    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    conf = dict(conf or {})
    driver_options = driver_java_options(conf.pop(DRIVER_OPTIONS, ""))
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.showConsoleProgress", "false")
         # A table cached (by a caller: the job keeps local checkpoints) is kept for
         # seconds: uncompressed batches are cheaper to build.
         .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
         # The job generates a few hundred classes: with Spark's default cache of 100
         # they evict each other and a warm session compiles them all again.
         .config("spark.sql.codegen.cache.maxEntries", "2000")
         # Adaptive execution re-plans after every shuffle, a job per stage, for nothing
         # to gain on this job's joins of small aggregated tables.
         .config("spark.sql.adaptive.enabled", "false")
         # PySpark's DataFrame debugging records the Python call site of every Column
         # function (about 5 py4j round trips each: 7,000 of a job's 12,000 on the bench's
         # telemetry) for error messages that name the line; the job's plans need none.
         .config(PYSPARK_DEBUGGING, "false")
         .config(DRIVER_OPTIONS, driver_options))
    if local:
        cores = local_cores(master)
        # One shuffle partition per core: every task costs planning, code generation and
        # (de)serialization, which on small inputs is most of the job. The input in at
        # least 4 splits per core, so that the last wave of tasks keeps every core busy.
        b = (b.config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions or cores))
             .config("spark.sql.files.minPartitionNum", str(4 * cores))
             .config("spark.driver.memory", "2g"))
    else:
        b = b.config("spark.sql.shuffle.partitions",
                     str(shuffle_partitions or CLUSTER_SHUFFLE_PARTITIONS))
    for key, value in conf.items():
        b = b.config(key, value)
    with _stderr_to(jvm_log):
        spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _rows(df: DataFrame, order: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of a small table, sorted by ``order`` (a key of it) on the driver: Spark's
    global sort would cost a sampling job and a shuffle for a few hundred rows."""
    rows = [r.asDict() for r in df.collect()]
    rows.sort(key=lambda r: tuple(r[k] for k in order))
    return rows


class _Stages:
    """A rich progress line per stage while Spark works (a spinner keeps turning)."""

    def __init__(self, console: Console | None, total: int) -> None:
        self.console = console
        self.total = total
        self.timings: dict[str, float] = {}
        self._progress: Progress | None = None
        self._task: Any = None

    @contextlib.contextmanager
    def running(self) -> Iterator[_Stages]:
        if self.console is None:
            yield self
            return
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                  BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                  TimeElapsedColumn(), console=self.console, transient=True)
        with self._progress:
            self._task = self._progress.add_task("starting", total=self.total)
            yield self

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._progress is not None:
            self._progress.update(self._task, description=name)
        started = time.perf_counter()
        yield
        self.timings[name] = round(time.perf_counter() - started, 3)
        if self._progress is not None:
            self._progress.advance(self._task)
            self._progress.console.print(f"  [green]✓[/] {name} ({self.timings[name]:.1f}s)")

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"  [yellow]![/] {text}", soft_wrap=True)


def advice_resolution(interval: float) -> float:
    """The buckets the per-queue figures and the recommendations are computed in:
    ``ADVICE_RESOLUTION``, or the sidecars' telemetry interval (``interval``, the longest
    in their records) if longer, in whole seconds, so that every bucket holds a sample of
    each sidecar. Never ``--resolution``."""
    return float(max(ADVICE_RESOLUTION, math.ceil(interval)))


def analyze(paths: Sequence[str], out: Path, *, master: str | None = None,
            spark: SparkSession | None = None, resolution: float = DEFAULT_RESOLUTION,
            target_drain: float = recommend.DEFAULT_TARGET_DRAIN,
            console: Console | None = None, conf: Mapping[str, str] | None = None,
            plots: bool = True, time_range: TimeRange | None = None,
            what_if: Sequence[whatif.Candidate] = ()) -> Analysis:
    """The job. ``resolution`` sets the plots' buckets only: every figure in the tables,
    summary.json and recommended-policies.yaml comes from ``advice_resolution`` buckets.
    ``what_if``: candidate policy files to replay the telemetry through (what-if.json)."""
    rng = time_range or TimeRange()
    out.mkdir(parents=True, exist_ok=True)
    stages = _Stages(console, 7 if spark is None else 6)
    with stages.running(), ThreadPoolExecutor(1, thread_name_prefix="plots") as drawing:
        if spark is None:
            with stages.stage(f"starting Spark ({master or DEFAULT_MASTER})"):
                spark = spark_session(master, conf=conf, jvm_log=out / "spark.log")
        with stages.stage("reading telemetry"):
            t = load(spark, list(paths), rng)
            # how Spark split the work (timings.json): the figures do not depend on it
            split = {"input_partitions": t.kept[0].rdd.getNumPartitions(),
                     "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")
                                               or 0),
                     "reads": t.reads}
            if t.reads > 1:
                stages.note("a malformed line failed the strict read: read again to count "
                            "and show each (the first read's error is in Spark's log)")
        with stages.stage("aggregating per queue and sidecar"):
            advice = advice_resolution(t.interval)
            tables = aggregate.Tables.of(t.samples, t.events, advice)
            psq_rows = sorted(({k: v for k, v in r.items() if k not in ("sq", "q")}
                               for r in tables.psq_rows),
                              key=lambda r: (r["sidecar"], r["vhost"], r["queue"]))
            aggregate.check_ids(psq_rows)
            sidecar_queues = [{k: v for k, v in r.items() if k != "_clash"} for r in psq_rows]
            queues = _rows(tables.queues, ["vhost", "queue"])
            ranked = sorted(queues, key=lambda r: (-(r.get("tripped_seconds") or 0),
                                                   -(r.get("depth_max") or 0),
                                                   r["vhost"], r["queue"]))
            plotted: Future[tuple[list[tuple[str, str]], str]] | None = None
            if plots and ranked:
                # The plots' rows now; matplotlib draws them in a thread while Spark
                # computes the per-sidecar table and the policies are written (the
                # driver's Python only waits on Spark meanwhile).
                plotted = drawing.submit(_draw, out, ranked, *_plot_rows(
                    t.samples, t.events, tables, ranked[:MAX_PLOTS], resolution))
            sidecars = _rows(aggregate.per_sidecar(t.sidecars, tables.psq, tables.events),
                             ["sidecar"])
        with stages.stage("recommending policies"):
            recs = recommend.recommend_all(queues, target_drain)
            span = _span(queues)
            warnings = report.caveats(_span_seconds(queues), queues)
            header = [f"From {t.quality.used} telemetry records of {len(sidecars)} sidecar(s), "
                      f"{span}" + (f" (--since/--until: {rng.describe()})" if rng.bounded
                                   else "") + ".",
                      f"Rates in {advice:g}s buckets (whatever the report's --resolution); "
                      f"target drain time {target_drain:g}s.",
                      *(f"CAVEAT: {w}" for w in warnings)]
            policies_text = recommend.render(recs, header)
        with stages.stage("replaying the telemetry through the policies"):
            # The recommendations first, then each candidate (pipeline/replay.py).
            step = replay_step(t.interval)
            replays = whatif.run(t.samples, t.events, step,
                                 [policies_text, *(c.text for c in what_if)])
            predicted = whatif.predicted_reasons(replays, 0)
            recs = [dataclasses.replace(r, reasons=[*r.reasons, predicted[(r.vhost, r.queue)]])
                    if (r.vhost, r.queue) in predicted else r for r in recs]
            policies_text = recommend.render(recs, header)
            policies = out / "recommended-policies.yaml"
            policies.write_text(policies_text)
            what_if_path: Path | None = None
            if what_if:
                doc = whatif.what_if_doc(what_if, replays)
                what_if_path = whatif.write(out, doc)
        drawn: list[tuple[str, str]] = []
        overview: str | None = None
        with stages.stage("plotting"):  # what is left of the drawing after the rest
            if plotted is not None:
                drawn, overview = plotted.result()
        with stages.stage("writing the report"):
            what_if_html = ""
            if what_if:  # drawn now: pyplot is not for two threads at once
                names = [c.file for c in what_if]
                drawn_what_if = {(r["vhost"], r["queue"]): name for r in replays
                                 if any(c is not None for c in r["candidates"][1:])
                                 and (name := whatif.plot(out, r, names, 1)) is not None}
                what_if_html = whatif.section(doc, queues, drawn_what_if,
                                              whatif.caveats(replays, sidecars, queues))
            meta = {"telemetry": ", ".join(paths), "period": span,
                    **({"since / until": rng.describe()} if rng.bounded else {}),
                    "sidecars": str(len(sidecars)), "queues": str(len(queues)),
                    "plot resolution": f"{resolution:g}s",
                    "figures and recommendations": f"{advice:g}s buckets",
                    "target drain time": f"{target_drain:g}s",
                    "spark": f"{spark.version} on {spark.sparkContext.master}",
                    "written": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}
            html_path = out / "report.html"
            report.write_html(html_path, title="floodwall telemetry report", meta=meta,
                              quality=t.quality, queues=ranked, sidecar_queues=sidecar_queues,
                              sidecars=sidecars, plots=drawn, overview=overview,
                              recommendations=recs, policies_file=policies.name,
                              policies_text=policies_text, warnings=warnings,
                              what_if=what_if_html)
            summary = out / "summary.json"
            q = t.quality
            # Only what the telemetry determines: the same records give the same bytes
            # (timings, the master and the clock go to timings.json and the report).
            summary.write_text(json.dumps({
                "input": {"lines": q.lines, "used": q.used, "corrupt": q.corrupt,
                          "unsupported_version": q.unsupported_version,
                          "incomplete": q.incomplete, "outside_range": q.outside,
                          "files": q.files, "examples": q.examples,
                          "since": rng.since, "until": rng.until},
                "resolution": advice, "caveats": warnings,
                "queues": queues, "sidecar_queues": sidecar_queues, "sidecars": sidecars},
                indent=1, default=str) + "\n")
        tables.unpersist()
        t.unpersist()
    (out / "timings.json").write_text(json.dumps(
        {"master": spark.sparkContext.master, **split, "stages": stages.timings},
        indent=1) + "\n")
    return Analysis(out, t.quality, queues, sidecar_queues, sidecars, recs, html_path, policies,
                    summary, stages.timings, advice, warnings, what_if_path, replays)


#: The replay's buckets when the sidecars' records do not say their interval (seconds).
DEFAULT_REPLAY_STEP = 1.0


def replay_step(interval: float) -> float:
    """The replay's buckets: the sidecars' telemetry interval (the longest, whole ms), so
    that each bucket holds a sample of every sidecar."""
    return round(interval, 3) if interval > 0 else DEFAULT_REPLAY_STEP


def _span_seconds(queues: Sequence[Mapping[str, Any]]) -> float:
    firsts = [q["first_ts"] for q in queues if q.get("first_ts") is not None]
    lasts = [q["last_ts"] for q in queues if q.get("last_ts") is not None]
    return float(max(lasts) - min(firsts)) if firsts and lasts else 0.0


def _span(queues: Sequence[Mapping[str, Any]]) -> str:
    firsts = [q["first_ts"] for q in queues if q.get("first_ts") is not None]
    lasts = [q["last_ts"] for q in queues if q.get("last_ts") is not None]
    if not firsts:
        return "no samples"
    a, b = min(firsts), max(lasts)
    return f"{report.fmt(a, 'time')} to {report.fmt(b, 'time')} UTC ({b - a:.0f}s)"


_Rows = list[dict[str, Any]]


def _plot_rows(samples: DataFrame, events: DataFrame, tables: aggregate.Tables,
               queues: Sequence[Mapping[str, Any]], resolution: float
               ) -> tuple[float, list[tuple[str, str]], _Rows, _Rows]:
    """What the plots of ``queues`` show: a series coarse enough to stay under
    ~PLOT_POINTS points (the figures' series when it is at that resolution), and the
    queues' trips and releases. Returns the series' resolution, the queues, the two."""
    span = max((q["last_ts"] or 0) - (q["first_ts"] or 0) for q in queues)
    res = max(resolution, span / PLOT_POINTS)
    keys = [(q["vhost"], q["queue"]) for q in queues]
    wanted = F.lit(False)
    for vhost, queue in keys:
        wanted = wanted | ((F.col("vhost") == vhost) & (F.col("queue") == queue))
    if res == tables.resolution:
        series = tables.series.filter(wanted)
    else:
        level1 = aggregate.sidecar_series(samples.filter(wanted), res)
        series = aggregate.queue_series(level1, tables.psq, res)
    rows = _rows(series, ["vhost", "queue", "bucket_index"])
    moments = _rows(events.filter(wanted & F.col("event").isin("trip", "release"))
                    .select("vhost", "queue", "ts_ms", "event", "mode"),
                    ["vhost", "queue", "ts_ms"])
    return res, keys, rows, moments


def _draw(out: Path, ranked: Sequence[Mapping[str, Any]], res: float,
          keys: Sequence[tuple[str, str]], rows: _Rows, moments: _Rows
          ) -> tuple[list[tuple[str, str]], str]:
    """One PNG per queue of ``keys`` (``_plot_rows``), its trips and releases marked, and
    the overview of ``ranked``: the files written and their captions, the overview's."""
    (out / "plots").mkdir(exist_ok=True)
    drawn: list[tuple[str, str]] = []
    for vhost, queue in keys:
        mine = [r for r in rows if r["vhost"] == vhost and r["queue"] == queue]
        if not mine:
            continue
        name = f"plots/{report.slug(vhost, queue)}.png"
        if any(name == d[0] for d in drawn):
            name = f"plots/{report.slug(vhost, queue)}-{len(drawn)}.png"
        caption = f"{queue} (vhost {vhost}), {res:g}s buckets"
        marks = report.markers([e for e in moments
                                if e["vhost"] == vhost and e["queue"] == queue])
        report.plot_queue(mine, res, caption, out / name, marks)
        drawn.append((name, caption))
    report.plot_overview(ranked, out / "plots" / "overview.png")
    return drawn, "plots/overview.png"


def print_summary(console: Console, a: Analysis) -> None:
    """A short terminal summary: input, the queues that tripped most, where the files are."""
    q = a.quality
    style = "red" if q.bad else "green"
    console.print(f"[bold]telemetry[/]: {q.lines} lines in {q.files} file(s), {q.used} used, "
                  f"[{style}]{q.corrupt} malformed, {q.unsupported_version} unsupported "
                  f"version, {q.incomplete} incomplete[/]", soft_wrap=True)
    table = Table(title="queues (most tripped first)")
    for col in ("queue", "tripped", "trips", "depth p99 / capacity", "drain", "recommended"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    recs = {(r.vhost, r.queue): r for r in a.recommendations}
    ranked = sorted(a.queues, key=lambda r: -(r.get("tripped_seconds") or 0))
    for row in ranked[:10]:
        r = recs.get((row["vhost"], row["queue"]))
        table.add_row(f"{row['queue']}@{row['vhost']}",
                      report.fmt(row.get("tripped_share"), "share"),
                      report.fmt(row.get("trips"), "int"),
                      f"{report.fmt(row.get('depth_p99'), 'bytes')} / "
                      f"{report.fmt(row.get('capacity'), 'bytes')}",
                      report.fmt(row.get("drain_rate"), "rate"),
                      (f"{report.fmt(r.capacity, 'bytes')} / {report.fmt(r.resume, 'bytes')}"
                       if r else "-"))
    console.print(table)
    for caveat in a.caveats:
        console.print(f"[yellow]caveat[/]: {caveat}", soft_wrap=True)
    console.print(f"report: {a.report}\nrecommended policies: {a.policies}", soft_wrap=True)
    if a.what_if is not None:
        doc = json.loads(a.what_if.read_text())
        for c in doc["candidates"]:
            trips = sum(q["predicted"]["trips"] for q in c["queues"])
            console.print(f"what if {c['file']}: {len(c['queues'])} queue(s) policed, "
                          f"{trips} trip(s) predicted", soft_wrap=True)
        console.print(f"what if: {a.what_if}", soft_wrap=True)
