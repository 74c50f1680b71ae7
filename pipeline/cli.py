"""``floodwall analyze`` and ``spark-submit pipeline/submit.py``: run the job, print a summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession
from rich.console import Console

from floodwall_pipeline.files import TimeRange, TimeRangeError, parse_time
from floodwall_pipeline.recommend import DEFAULT_TARGET_DRAIN


def time_range(since: str | None, until: str | None) -> TimeRange:
    """``--since``/``--until`` as given on the command line (raises TimeRangeError)."""
    return TimeRange(parse_time(since) if since else None, parse_time(until) if until else None)


def run_analysis(paths: Sequence[str], out: Path, *, master: str | None = None,
                 resolution: float = 5.0, target_drain: float = DEFAULT_TARGET_DRAIN,
                 conf: Mapping[str, str] | None = None, spark: SparkSession | None = None,
                 since: str | None = None, until: str | None = None,
                 what_if: Sequence[str] = ()) -> int:
    """Run the job with a progress display; 0 if it wrote the report, 2 if it could not."""
    from pyspark.errors import AnalysisException, PySparkException

    from floodwall_pipeline.analyze import analyze, print_summary
    from floodwall_pipeline.whatif import read_candidates

    console = Console(stderr=False)
    try:
        rng = time_range(since, until)
    except TimeRangeError as exc:
        console.print(f"[red]bad time range[/]: {exc}", soft_wrap=True)
        return 2
    try:
        candidates = read_candidates(what_if)
    except ValueError as exc:
        console.print(f"[red]cannot use the --what-if policies[/]:\n{exc}", soft_wrap=True)
        return 2
    console.print(f"[bold]floodwall analyze[/]: {', '.join(paths)} -> {out}"
                  + (f" ({rng.describe()})" if rng.bounded else ""), soft_wrap=True)
    try:
        result = analyze(paths, out, master=master, resolution=resolution,
                         target_drain=target_drain, console=console, conf=conf,
                         spark=spark, time_range=rng, what_if=candidates)
    except FileNotFoundError as exc:  # --since/--until: no such path, or no file in range
        console.print(f"[red]cannot read the telemetry[/]: {exc}", soft_wrap=True)
        return 2
    except AnalysisException as exc:  # e.g. no such path
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        console.print(f"[red]cannot read the telemetry[/]: {first}", soft_wrap=True)
        return 2
    except PySparkException as exc:  # e.g. no Java, or the cluster cannot be reached
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        console.print(f"[red]Spark failed[/]: {first} (its log: {out / 'spark.log'})",
                      soft_wrap=True)
        return 2
    print_summary(console, result)
    return 0
