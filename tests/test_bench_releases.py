"""Benchmarks over several brokers (``--broker 3.10,4.0``, ``bench.pace --statistics``): the
option parsing and the side-by-side tables, from documents shaped as the runs write them (no
brokers here)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import pace, relay
from bench.report import release_lines


def test_a_comma_list_of_releases_in_the_order_given() -> None:
    assert relay.parse_releases("3.10,4.0") == ("3.10", "4.0")
    assert relay.parse_releases("4.0, 3.10,4.0") == ("4.0", "3.10")  # each once
    args = relay.parse_args(["--broker", "4.0"])[1]
    assert args.broker == ("4.0",)
    assert relay.parse_args([])[1].broker == ("3.10",)  # as before
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown release '3\.9'"):
        relay.parse_releases("3.10,3.9")
    with pytest.raises(argparse.ArgumentTypeError, match="no release"):
        relay.parse_releases(",")


def _relay_doc(version: str, direct: float, floodwall: float) -> dict[str, Any]:
    runs = {"direct": [{"round": 0, "msgs_per_s": direct}],
            "floodwall": [{"round": 0, "msgs_per_s": floodwall}]}
    return {"meta": {"options": {"rounds": 1, "seconds": 1.0, "warmup": 0.2, "size": 1024,
                                 "latency_rate": 5000, "idle_connections": 20},
                     "environment": {"rabbitmq": version}, "notes": [], "elapsed_s": 30.0},
            "results": {"firehose": {"title": "0-9-1 firehose", "runs": runs, "median": {
                "direct": {"msgs_per_s": direct, "broker_cpu_us_per_msg": 40.0},
                "floodwall": {"msgs_per_s": floodwall, "relay_cpu_us_per_msg": 2.5}}}},
            "summary": {"firehose": {"floodwall_over_direct_paired": floodwall / direct},
                        "goals": {"cpu_per_msg_floodwall_le_5x_pump": {
                            "value": 1.2, "estimate": "", "met": True}}}}


def test_releases_side_by_side_with_ratios_within_each() -> None:
    both = {"meta": {"started": "2026-11-29T21:00:00+00:00", "elapsed_s": 61.0},
            "releases": {"3.10": _relay_doc("3.10.8", 20000.0, 19000.0),
                         "4.0": _relay_doc("4.0.5", 25000.0, 20000.0)}}
    lines = release_lines(both)
    assert "RabbitMQ 3.10 (3.10.8), 4.0 (4.0.5)" in lines[0]
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("firehose:"))
    assert "3.10: msgs/s" in lines[head + 1] and "4.0: msgs/s" in lines[head + 1]
    floodwall = next(line for line in lines if line.startswith("  floodwall "))
    cells = [c.split() for c in floodwall.split("|")[1:]]
    assert cells[0][:2] == ["19,000", "0.950"]  # against 3.10's direct
    assert cells[1][:2] == ["20,000", "0.800"]  # against 4.0's direct
    assert not any(line.strip().startswith(("pump", "haproxy")) for line in lines)  # not run
    assert any("met 1.200 | met 1.200" in line for line in lines)


def test_configurations_of_releases_and_statistics() -> None:
    assert pace.configurations(("3.10",), "on") == {"3.10": ("3.10", True)}
    assert pace.configurations(("3.10", "4.0"), "both") == {
        "3.10 stats on": ("3.10", True), "3.10 stats off": ("3.10", False),
        "4.0 stats on": ("4.0", True), "4.0 stats off": ("4.0", False)}
    assert pace.configurations(("4.0",), "off") == {"4.0 stats off": ("4.0", False)}
    opts = pace.parse_args(["--broker", "3.10,4.0", "--statistics", "both"])
    assert (opts.broker, opts.statistics) == (("3.10", "4.0"), "both")
    with pytest.raises(SystemExit):
        pace.parse_args(["--scenarios", "cpu,overshoot"])


def _cpu(source: str | None, cores: float) -> dict[str, Any]:
    out = {label: {"broker_cores": cores + i * 0.01, "counts_per_s": 5.0 + i * 100,
                   "depth_source": source} for i, label in enumerate(pace.HOT_INTERVALS)}
    return pace.added_cores(out)


def test_a_run_that_read_depth_from_the_wrong_source_is_named() -> None:
    results = {"cpu": _cpu("management", 0.01),
               "pace": {"rounds": [{"new 1GiB": {"depth_source": "prometheus"}}],
                        "stopped": {"new": {"depth_source": "prometheus"}}}}
    assert pace.wrong_sources(results, statistics_on=False) == [
        f"cpu {label}: management (expected prometheus)" for label in pace.HOT_INTERVALS]
    assert pace.wrong_sources(results, statistics_on=True) == [
        "pace round 0 new 1GiB: prometheus (expected management)",
        "pace stopped new: prometheus (expected management)"]


def test_statistics_on_and_off_side_by_side() -> None:
    doc = {"meta": {"configurations": {
        "4.0 stats on": {"broker": "4.0", "statistics": "on", "rabbitmq": "4.0.5"},
        "4.0 stats off": {"broker": "4.0", "statistics": "off", "rabbitmq": "4.0.5"}}},
        "results": {
            "4.0 stats on": {"cpu": _cpu("management", 0.02), "pace": {
                "rounds": [{"new 1GiB": {"rate": 900.0, "ratio": 1.0,
                                         "over_capacity_bytes": -1000, "depth_source":
                                         "management"}}],
                "stopped": {"new": {"over_capacity_bytes": 64 * 1024, "tripped": True,
                                    "depth_source": "management"}}}},
            "4.0 stats off": {"cpu": _cpu("prometheus", 0.03)}}}
    lines = pace.side_by_side_lines(doc)
    assert "| --hot-interval | 4.0 stats on (4.0.5) | 4.0 stats off (4.0.5) |" in lines
    one = next(line for line in lines if line.startswith("| 1ms |"))
    assert one == ("| 1ms | 0.05 / 0.03 / 305.0 / management | "
                   "0.06 / 0.03 / 305.0 / prometheus |")
    assert "| 0 | new 1GiB | 900.0 (1.0), -1 KiB, management | - |" in lines
    assert "| stopped | new | 64 KiB, tripped True, management | - |" in lines
