"""Incremental runs: file names, the date/sidecar layout, and --since/--until reading only the
files that can hold records of the range."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from floodwall.ops.telemetry import file_name
from floodwall_pipeline.files import (
    LAG,
    TimeRange,
    TimeRangeError,
    parse_name,
    parse_time,
    partition_dir,
    select,
)
from floodwall_pipeline.load import load
from floodwall_pipeline.partition import lay_out
from tests.pipeline.test_aggregate import sample

pytestmark = pytest.mark.load_tolerant

HOUR = 3600.0
DAY1 = float(calendar.timegm((2026, 1, 1, 0, 0, 0)))  # 2026-01-01T00:00:00Z


def test_names_the_proxy_writes_parse_back() -> None:
    name = file_name("orders-api-7d9f-x2", DAY1 + 5025.7, 42)
    assert name == "telemetry-orders-api-7d9f-x2-20260101T012345-000042.ndjson"
    parsed = parse_name(name)
    assert parsed is not None
    assert (parsed.sidecar, parsed.opened_at, parsed.seq) == ("orders-api-7d9f-x2",
                                                               DAY1 + 5025, 42)
    assert parse_name(f"s3a://b/date=2026-01-01/sidecar=x/{name}.gz") is not None
    assert parse_name("a.ndjson") is None and parse_name("telemetry-x.ndjson") is None
    assert partition_dir("orders-api", DAY1 + 86_399) == "date=2026-01-01/sidecar=orders-api"


def test_times_are_utc_dates_or_date_and_time() -> None:
    assert parse_time("2026-01-01") == DAY1
    assert parse_time("2026-01-01T06:30") == DAY1 + 6.5 * HOUR
    assert parse_time("2026-01-01T06:30:15Z") == parse_time("2026-01-01T06:30:15+00:00")
    for bad in ("yesterday", "2026-13-01", "2026-01-01T06:30+02:00"):
        with pytest.raises(TimeRangeError):
            parse_time(bad)
    with pytest.raises(TimeRangeError):
        TimeRange(DAY1, DAY1)
    # the day before --since (a file opened then can reach past midnight) to --until's day
    assert TimeRange(DAY1 + 86_400, DAY1 + 2 * 86_400).dates() == [
        "2026-01-01", "2026-01-02", "2026-01-03"]
    assert TimeRange(DAY1, None).dates() is None


def _hourly(sidecar: str, first: float, n: int) -> list[str]:
    return [f"d/{file_name(sidecar, first + i * HOUR, i + 1)}" for i in range(n)]


def test_select_keeps_the_files_that_can_hold_the_range() -> None:
    files = _hourly("a", DAY1, 6)  # opened 00:00, 01:00 ... 05:00
    late = f"d/{file_name('a', DAY1 + 2 * HOUR + 25 * 60, 99)}"  # a restart at 02:25
    other = "d/copied-by-hand.ndjson"  # not the proxy's name: nothing says what it holds
    rng = TimeRange(DAY1 + 1.5 * HOUR, DAY1 + 2.5 * HOUR)  # [01:30, 02:30)
    chosen = select([*files, late, other], rng)
    # 00:00 ends when 01:00 opens (before 01:30); 03:00 starts at 03:00 - LAG, after 02:30
    assert chosen == sorted([files[1], files[2], late, other])
    assert LAG < 0.5 * HOUR
    # the newest file of a sidecar may run on for up to a day
    assert select(files, TimeRange(DAY1 + 20 * HOUR, None)) == [files[-1]]
    assert select(files, TimeRange(None, DAY1 + 30)) == [files[0]]
    assert select(files, TimeRange()) == sorted(files)


def _records(sidecar: str, opened: float) -> list[dict[str, object]]:
    return [sample(sidecar, opened + dt, 0, 100, False, 0) for dt in (0.0, 600.0, 3000.0)]


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """Two sidecars, hourly files over 2026-01-01..03, laid out by date and sidecar. The files
    a run over 2026-01-02 must not read hold a line that is not JSON: read, it would count."""
    root = tmp_path_factory.mktemp("layout")
    rng = TimeRange(DAY1 + 86_400, DAY1 + 2 * 86_400)
    needed: set[str] = set()
    for sidecar in ("app-a", "app-b"):
        opened = [DAY1 + i * HOUR for i in range(72)]
        for i, t in enumerate(opened):
            name = file_name(sidecar, t, i + 1)
            path = root / partition_dir(sidecar, t) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            # needed: 2026-01-02's files, and 2026-01-03 00:00's (it may hold records from
            # LAG before); 2026-01-01 23:00's ends when 2026-01-02 00:00's opens
            wanted = DAY1 + 24 * HOUR <= t <= DAY1 + 48 * HOUR
            lines = ([json.dumps(r) for r in _records(sidecar, t)] if wanted
                     else ["this file is outside the range and must not be read"])
            path.write_text("\n".join(lines) + "\n")
            if wanted:
                needed.add(path.name)
    assert select([f"x/{n}" for n in needed], rng) == sorted(f"x/{n}" for n in needed)
    # a later day that is not even listed: a directory that cannot be read would fail
    (root / "date=2026-01-09").mkdir()
    (root / "date=2026-01-09" / "sidecar=app-a").write_text("not a directory")
    return root, needed


def test_since_until_reads_only_the_partitions_and_files_needed(
        spark: SparkSession, layout: tuple[Path, set[str]]) -> None:
    root, needed = layout
    t = load(spark, [str(root)], TimeRange(parse_time("2026-01-02"), parse_time("2026-01-03")))
    q = t.quality
    assert q.corrupt == 0  # no garbage file was parsed
    assert {f.rsplit("/", 1)[-1] for f in t.files} == needed and q.files == 2 * 25
    # 24 hourly files a day, 3 samples each, per sidecar; the next day's 00:00 file is read
    # and its samples are outside the range
    assert (q.used, q.outside) == (2 * 24 * 3, 2 * 3)
    ts = [r["ts_ms"] for r in t.samples.select("ts_ms").collect()]
    assert min(ts) == (DAY1 + 86_400) * 1000 and max(ts) < (DAY1 + 2 * 86_400) * 1000
    t.unpersist()
    with pytest.raises(FileNotFoundError):
        load(spark, [str(root)], TimeRange(parse_time("2026-02-01"), parse_time("2026-02-02")))


def test_lay_out_copies_closed_files_once(tmp_path: Path) -> None:
    src, dest = tmp_path / "flat", tmp_path / "shipped"
    src.mkdir()
    for sidecar in ("a", "b"):
        for i in range(3):
            (src / file_name(sidecar, DAY1 + 23 * HOUR + i * HOUR, i + 1)).write_text("{}\n")
    (src / "notes.txt").write_text("left alone")
    first = lay_out(src, dest)
    # the newest file of each sidecar is still being written
    assert sorted(p.target.relative_to(dest).as_posix() for p in first) == [
        "date=2026-01-01/sidecar=a/telemetry-a-20260101T230000-000001.ndjson",
        "date=2026-01-01/sidecar=b/telemetry-b-20260101T230000-000001.ndjson",
        "date=2026-01-02/sidecar=a/telemetry-a-20260102T000000-000002.ndjson",
        "date=2026-01-02/sidecar=b/telemetry-b-20260102T000000-000002.ndjson"]
    assert all(p.copied for p in first)
    again = lay_out(src, dest, move=True)
    assert [p.copied for p in again] == [False] * 4
    assert len(list(src.iterdir())) == 3  # the two newest and notes.txt
