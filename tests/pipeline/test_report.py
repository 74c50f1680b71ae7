"""The report tells the truth: trips and releases marked on the plots, shadow trips beside
enforced ones, caveats when there is too little to recommend from, tables that fit a page.

The pure parts (no Spark) first; then one bounded run of the whole job on a small synthetic
fleet whose second queue was watched in shadow mode.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from floodwall.control.policy import Mode, load_policies
from floodwall_pipeline import report
from floodwall_pipeline.analyze import analyze
from floodwall_pipeline.report import (
    MAX_COLUMNS,
    MIN_SPAN_SECONDS,
    MIN_TRIPS,
    QUEUE_COLUMNS,
    SIDECAR_QUEUE_COLUMNS,
    Marker,
    caveats,
    markers,
    with_modes,
)
from floodwall_pipeline.synthetic import generate

pytestmark = pytest.mark.load_tolerant


def _queue(name: str, trips: int, mode: str | None = None, capacity: int = 65536
           ) -> dict[str, object]:
    return {"vhost": "/", "queue": name, "trips": trips, "capacity": capacity, "mode": mode}


def _header_widths(html: str) -> list[int]:
    """Columns of each table's first row."""
    return [len(re.findall(r"<th>", row))
            for row in re.findall(r"<table><tr>(.*?)</tr>", html)]


def test_wide_tables_are_split_with_their_keys_repeated() -> None:
    rows = with_modes([_queue("a", 5), _queue("b", 2, "shadow")])
    html = report._table(rows, QUEUE_COLUMNS, keys=2)
    widths = _header_widths(html)
    assert len(QUEUE_COLUMNS) > MAX_COLUMNS and len(widths) > 1
    assert all(w <= MAX_COLUMNS for w in widths)
    assert sum(w - 2 for w in widths) == len(QUEUE_COLUMNS) - 2  # every column, once
    assert html.count("<th>queue</th>") == len(widths)  # the key in every part
    narrow = report._table(rows, SIDECAR_QUEUE_COLUMNS[:MAX_COLUMNS], keys=3)
    assert _header_widths(narrow) == [MAX_COLUMNS]


def test_shadow_trips_are_shown_beside_enforced_ones() -> None:
    a, b, old = with_modes([_queue("a", 5, "enforce"), _queue("b", 2, "shadow"),
                            _queue("c", 1)])
    assert (a["enforced_trips"], a["shadow_trips"]) == (5, 0)
    assert (b["enforced_trips"], b["shadow_trips"]) == (0, 2)
    assert (old["enforced_trips"], old["shadow_trips"]) == (1, 0)  # before shadow mode


def test_caveats_for_a_short_span_few_trips_and_shadow_queues() -> None:
    plenty = [_queue("a", MIN_TRIPS)]
    assert caveats(MIN_SPAN_SECONDS, plenty) == []
    short = caveats(MIN_SPAN_SECONDS - 1, plenty)
    assert len(short) == 1 and "less than 1 hour" in short[0]
    few = caveats(MIN_SPAN_SECONDS, [_queue("a", MIN_TRIPS - 1), _queue("free", 0, capacity=0)])
    assert len(few) == 1 and few[0].startswith("a (vhost /) tripped 2 time(s)")
    watched = caveats(MIN_SPAN_SECONDS, [_queue("w", MIN_TRIPS, "shadow")])
    assert len(watched) == 1 and "shadow mode" in watched[0] and "w" in watched[0]


def test_trips_and_releases_become_markers_in_time_order() -> None:
    events = [{"ts_ms": 3000, "event": "release", "mode": "shadow"},
              {"ts_ms": 1000, "event": "trip", "mode": "shadow"},
              {"ts_ms": 2000, "event": "hold"}, {"ts_ms": 5000, "event": "trip"},
              {"ts_ms": 5000, "event": "release", "mode": None}]
    at = [dt.datetime.fromtimestamp(s, dt.UTC) for s in (1, 3, 5, 5)]
    assert markers(events) == [Marker(at[0], True, True), Marker(at[1], False, True),
                               Marker(at[2], True, False), Marker(at[3], False, False)]


def _shadowed(directory: Path, queue: str) -> None:
    """The telemetry as if ``queue``'s policy had been in shadow mode."""
    for path in directory.iterdir():
        lines = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("queue") == queue and (rec["type"] == "sample"
                                              or rec.get("event") in ("trip", "release")):
                rec["mode"] = "shadow"
            lines.append(json.dumps(rec))
        path.write_text("\n".join(lines) + "\n")


def _events(directory: Path, queue: str, kind: str) -> int:
    return sum(1 for path in directory.iterdir() for line in path.read_text().splitlines()
               if (r := json.loads(line)).get("queue") == queue and r.get("event") == kind)


@pytest.mark.timeout(300)
def test_the_report_of_a_short_run_with_a_shadow_queue(spark: SparkSession, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry = tmp_path / "telemetry"
    generate(telemetry, sidecars=1, hours=0.1, queues=2, seed=3)
    _shadowed(telemetry, "orders.1")
    drawn: dict[str, list[Marker]] = {}
    plot = report.plot_queue

    def spy(rows: Any, resolution: float, title: str, path: Path,
            marks: list[Marker] = []) -> None:  # noqa: B006 - read only
        drawn[title.split(" ")[0]] = list(marks)
        plot(rows, resolution, title, path, marks)

    monkeypatch.setattr(report, "plot_queue", spy)
    a = analyze([str(telemetry)], tmp_path / "report", spark=spark, resolution=5)

    modes = {q["queue"]: q["mode"] for q in a.queues}
    assert modes == {"orders.0": None, "orders.1": "shadow"}
    for queue, marks in drawn.items():  # every trip marked, shadow ones as such
        assert sum(m.trip for m in marks) == _events(telemetry, queue, "trip") > 0
        assert all(m.shadow == (queue == "orders.1") for m in marks)
    assert set(drawn) == {"orders.0", "orders.1"}
    html = a.report.read_text()
    assert "<th>shadow trips</th>" in html
    assert all(w <= MAX_COLUMNS for w in _header_widths(html))
    # 6 minutes of telemetry: said in the report, the file and the summary
    assert any("less than 1 hour" in c for c in a.caveats)
    for q in a.queues:  # a queue with few trips is named (the pure test above builds one)
        named = any(c.startswith(f"{q['queue']} (vhost /) tripped") for c in a.caveats)
        assert named == (q["trips"] < MIN_TRIPS), (q["trips"], a.caveats)
    assert any("shadow mode" in c and "orders.1" in c for c in a.caveats)
    assert "Before you use the recommendations" in html
    assert "# CAVEAT: The telemetry covers" in a.policies.read_text()
    assert json.loads(a.summary.read_text())["caveats"] == a.caveats
    modes_out = {p.queue: p.mode for p in load_policies(a.policies)}
    assert modes_out == {"orders.0": Mode.ENFORCE, "orders.1": Mode.SHADOW}
