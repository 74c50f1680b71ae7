"""Reading: the explicit schema matches what the proxy writes; bad lines are counted, not fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.enforce.counters import GateCounters
from floodwall.ops.link_figures import LinkFigures
from floodwall.ops.telemetry import EVENT_FIELDS, SCHEMA_VERSION, ZERO_WHEN_ABSENT, Sampler
from floodwall_pipeline.files import TimeRange
from floodwall_pipeline.load import Telemetry, _load, load, malformed, read_raw
from floodwall_pipeline.schema import FIELD_NAMES
from floodwall_pipeline.synthetic import generate
from tests.pipeline.conftest import write_ndjson
from tests.pipeline.test_aggregate import sample

pytestmark = pytest.mark.load_tolerant


class _Router:
    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset({routing_key})


def test_schema_knows_every_field_the_proxy_and_the_generator_write(tmp_path: Path) -> None:
    policies = parse_policies("version: 1\npolicies:\n  - name: p\n    match: {queue: 'q'}\n"
                              "    capacity: 100\n")
    fc = FlowController(_Router(), policies)
    fc.queue_seen(("/", "q"), 1.0)
    fc.sampled_management(("/", "q"), ManagementSample(1.0, 0, 0, 0, 0, 0), 1.0)
    written: set[str] = set()
    for rec in Sampler("s").snapshot(fc, GateCounters(), 1.0, 1.0,
                                     links={("/", "q"): LinkFigures(1, 65536, 30, 2)}):
        written |= rec.keys()
    written |= set(EVENT_FIELDS) | {"event"}
    assert written <= set(FIELD_NAMES), written - set(FIELD_NAMES)
    generate(tmp_path, sidecars=1, hours=0.01, queues=1)
    for path in tmp_path.iterdir():
        for line in path.read_text().splitlines():
            assert json.loads(line).keys() <= set(FIELD_NAMES)


def test_bad_lines_are_counted_and_reported(spark: SparkSession, tmp_path: Path) -> None:
    good = [sample("s1", float(i), 0, 0, False, 0) for i in range(1, 4)]
    truncated = json.dumps(sample("s1", 4.0, 0, 0, False, 0))[:57]
    wrong_type = json.dumps({**sample("s1", 5.0, 0, 0, False, 0), "ts": "yesterday"})
    future = json.dumps({**sample("s1", 6.0, 0, 0, False, 0), "v": SCHEMA_VERSION + 1})
    no_sidecar = json.dumps({k: v for k, v in sample("s1", 7.0, 0, 0, False, 0).items()
                             if k != "sidecar"})
    write_ndjson(tmp_path / "a.ndjson", [*good[:2], truncated, "not json at all", wrong_type,
                                         "", future])
    write_ndjson(tmp_path / "b.ndjson", [good[2], no_sidecar])
    (tmp_path / "ignored.txt").write_text("not telemetry\n")  # only *.ndjson* is read
    t = load(spark, [str(tmp_path)])
    q = t.quality
    assert t.reads == 2  # the strict read failed on the first malformed line
    # blank lines are no records; truncated, not JSON and a wrong type are corrupt
    assert (q.lines, q.used, q.files) == (8, 3, 2)
    assert (q.corrupt, q.unsupported_version, q.incomplete, q.bad) == (3, 1, 1, 5)
    assert t.samples.count() == 3
    assert {f for f, _ in q.examples} == {"a.ndjson", "b.ndjson"}
    assert any(line == truncated for _, line in q.examples)


def test_a_sparse_record_reads_its_absent_counts_as_0(spark: SparkSession,
                                                     tmp_path: Path) -> None:
    # Version 3 leaves out nulls and the counts of ZERO_WHEN_ABSENT that are 0: the reader
    # takes them as 0 (tripped: false), as versions 1 and 2 wrote them; a null stays null.
    full = {**sample("s1", 1.0, 500, 2048, True, 3), "v": 3, "held_bytes": 7,
            "max_messages": 0, "resume_messages": 0, "blocked_publishers": 1}
    absent = {"ingress_bytes", "ingress_messages", "tripped", "trips", "blocked_publishers",
              "held_bytes", "held_messages", "spooled_bytes", "max_messages",
              "resume_messages"}
    assert absent <= ZERO_WHEN_ABSENT
    sparse = {k: v for k, v in full.items() if k not in absent} | {"ts": 2.0, "seq": 2}
    side = {"v": 3, "type": "sidecar", "ts": 1.0, "seq": 3, "sidecar": "s1", "vhost": "",
            "queue": "", "interval": 1.0}
    write_ndjson(tmp_path / "a.ndjson", [json.dumps(full), json.dumps(sparse),
                                         json.dumps(side)])
    t = load(spark, [str(tmp_path)])
    assert (t.quality.used, t.quality.bad) == (3, 0)
    rows = sorted(t.samples.collect(), key=lambda r: r["ts_ms"])
    counts = ("ingress_bytes", "ingress_messages", "trips", "blocked_publishers",
              "held_bytes", "held_messages", "spooled_bytes", "max_messages",
              "resume_messages")
    assert rows[0]["tripped"] is True and rows[0]["held_bytes"] == 7
    assert rows[1]["tripped"] is False
    assert {c: rows[1][c] for c in counts} == dict.fromkeys(counts, 0)
    assert rows[1]["depth"] == rows[0]["depth"] == 500  # written: read as it is
    assert rows[1]["drain_bps"] is None  # absent and not a count: null
    (s,) = t.sidecars.collect()
    assert (s["held_bytes"], s["held_messages"], s["blocked_channels"], s["spooled_bytes"],
            s["dropped_records"], s["alarm"]) == (0, 0, 0, 0, 0, None)


_RECORD = {**sample("s1", 1.0, 10, 100, False, 0), "v": 3}
_GOOD = json.dumps(_RECORD)
#: Every kind of line, and whether Spark's PERMISSIVE reader sets it aside as malformed.
_LINES = {
    "truncated": (_GOOD[:-9], True),
    "not JSON": ("hello", True),
    "a string for a number": (json.dumps({**_RECORD, "seq": "1"}), True),
    "an object for a number": (json.dumps({**_RECORD, "seq": {"a": 1}}), True),
    "a fraction for an integer": (json.dumps({**_RECORD, "seq": 1.5}), True),
    "an integer beyond a long": (json.dumps({**_RECORD, "seq": 10**20}), True),
    "an int for a boolean": (json.dumps({**_RECORD, "tripped": 0}), True),
    "a raw control character in a string": (_GOOD.replace('"s1"', '"s\x01"'), True),
    "an array of numbers": ("[1, 2]", True),
    "null": ("null", True),
    "a bare number": ("5", True),
    "a bare string": ('"s"', True),
    "true": ("true", True),
    "an empty object": ("{}", False),
    "an array of an object": (f"[{_GOOD}]", False),
    "two objects on a line": (_GOOD + _GOOD, False),
    "trailing text": (_GOOD + " x", False),
    "a key twice": (_GOOD[:-1] + ', "seq": 2}', False),
    "NaN": (json.dumps({**_RECORD, "drain_bytes_per_second": float("nan")}), False),
    "blank": ("   ", False),
}


def _rows(t: Telemetry) -> list[tuple[str, ...]]:
    return sorted(tuple(repr(v) for v in r) for df in t.kept for r in df.collect())


@pytest.mark.parametrize("name", list(_LINES))
def test_the_strict_read_gives_what_the_permissive_one_does(spark: SparkSession, tmp_path: Path,
                                                            name: str) -> None:
    # A malformed line fails the strict read, which is then done again in PERMISSIVE mode:
    # the same lines give the same tables and account as that mode alone, kind by kind.
    line, bad = _LINES[name]
    later = json.dumps({**_RECORD, "ts": 2.0, "seq": 20})
    files = [str(write_ndjson(tmp_path / "a.ndjson", [_GOOD, line, later]))]
    got = load(spark, files)
    alone = _load(spark, files, TimeRange(), strict=False)
    assert got.reads == (2 if bad else 1)
    assert got.quality.corrupt == int(bad) == alone.quality.corrupt
    assert got.quality == alone.quality
    assert _rows(got) == _rows(alone)


def test_only_a_malformed_line_is_taken_for_one(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(Exception) as other:
        spark.sql("SELECT no_such_column").collect()
    assert not malformed(other.value)
    assert not malformed(ValueError("MALFORMED_RECORD_IN_PARSING"))
    write_ndjson(tmp_path / "a.ndjson", ["hello"])
    with pytest.raises(Exception) as failed:
        read_raw(spark, [str(tmp_path)], strict=True).collect()
    assert malformed(failed.value)
