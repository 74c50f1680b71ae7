"""Recommended policies: the documented method, by hand, and files `floodwall check` accepts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from floodwall.cli import main
from floodwall.control.policy import parse_policies
from floodwall_pipeline.recommend import recommend, recommend_all, render

pytestmark = pytest.mark.load_tolerant

KIB = 1024


def row(**over: object) -> dict[str, object]:
    base: dict[str, object] = {
        "vhost": "/", "queue": "orders", "policy": "orders", "sidecars": 2,
        "capacity": 256 * KIB, "resume": 192 * KIB, "max_messages": 0, "resume_messages": 0,
        "deadline": 30.0, "overflow": "hold", "observed_seconds": 3600.0,
        "tripped_seconds": 360.0, "tripped_share": 0.1, "trips": 12,
        "drain_rate": 10 * KIB, "drain_rate_messages": 10.0, "backlog_seconds": 900.0,
        "ingress_rate_p99": 20 * KIB, "ingress_messages_rate_p99": 20.0,
        "held_at_release_p90": 40 * KIB, "held_messages_at_release_p90": 40.0,
        "deadline_expiries": 0, "trip_seconds_p90": 50.0}
    base.update(over)
    return base


def test_capacity_from_drain_rate_and_resume_from_burst() -> None:
    r = recommend(row(), target_drain=30)
    assert r.capacity == 300 * KIB  # 10 KiB/s x 30 s
    assert r.resume == 240 * KIB  # 300 KiB - (40 KiB held at release + 20 KiB of 1 s ingress)
    assert (r.deadline, r.changed, r.name) == (30.0, True, "rec-orders")
    assert any("drain 10.0 KiB/s x 30s" in line for line in r.reasons)


def test_rounding_floors_and_minimums() -> None:
    r = recommend(row(drain_rate=1000.0, held_at_release_p90=0, ingress_rate_p99=0))
    assert r.capacity == 64 * KIB  # 30000 B is under the 64 KiB minimum
    assert r.resume == 64 * KIB  # no burst: no hysteresis needed
    big = recommend(row(held_at_release_p90=1000 * KIB))
    assert big.resume == 72 * KIB  # a quarter of capacity, 75 KiB, rounded down to 4 KiB
    odd = recommend(row(drain_rate=1001.0 * 100))  # 3,003,000 B -> next 4 KiB multiple
    assert odd.capacity == 3_006_464 and odd.capacity % 4096 == 0


def test_messages_and_deadline() -> None:
    r = recommend(row(max_messages=500, resume_messages=400, deadline_expiries=3))
    assert (r.max_messages, r.resume_messages) == (300, 240)  # 10 msg/s x 30 s; 300 - 60
    assert r.deadline == 75.0  # 50 s p90 trip x 1.5


def test_no_backlog_keeps_the_policy() -> None:
    r = recommend(row(drain_rate=None, drain_rate_messages=None))
    assert (r.capacity, r.resume, r.changed) == (256 * KIB, 192 * KIB, False)


def test_rendered_file_is_valid_and_matches_odd_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [row(), row(queue="weird*name[1]", vhost="billing"), row(queue="orders", vhost="x y")]
    recs = recommend_all(rows)
    text = render(recs, ["test header"])
    ps = parse_policies(text)
    assert len(ps.policies) == 3
    assert ps.for_queue("billing", "weird*name[1]") is not None
    assert ps.for_queue("billing", "weirdXname1") is None  # the glob is literal
    assert ps.for_queue("/", "orders").capacity == 300 * KIB  # type: ignore[union-attr]
    assert len({p.name for p in ps.policies}) == 3
    assert "#   capacity 300KiB (was 256KiB)" in text
    path = tmp_path / "recommended-policies.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert parse_policies(render([])).policies == ()
