"""bench.speed's verdicts, from figures shaped as its four runs write them (no runs here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import speed


def _versus(scn_figures: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    return {"summary": {scn: {"median": med} for scn, med in scn_figures.items()}}


def test_ratios_against_direct_and_the_pump() -> None:
    docs = {"versus": _versus({
        "drain": {"direct": {"msgs_per_s": 1000.0}, "new": {"msgs_per_s": 940.0},
                  "pump": {"msgs_per_s": 990.0}},
        "firehose10": {"direct": {"msgs_per_s": 100.0},
                       "new-policed": {"msgs_per_s": 96.0, "relay_cpu_us_per_msg": 4.5},
                       "pump": {"msgs_per_s": 99.0, "relay_cpu_us_per_msg": 1.5}},
        "latency": {"direct": {"p99_us": 300.0}, "new": {"p99_us": 450.0},
                    "pump": {"p99_us": 350.0}}})}
    rows = {r["target"]: r for r in (t.judge(docs) for t in speed.TARGETS)}
    drain = rows["consumer drain, 0-9-1 (x direct)"]
    assert (round(drain["value"], 3), round(drain["pump"], 3), drain["met"]) == (0.94, 0.99,
                                                                                   False)
    assert rows["policed publish, 1.0 (x direct)"]["met"] is True
    cpu = rows["policed CPU per message, 1.0 (x the pump's)"]
    assert (cpu["value"], cpu["met"]) == (3.0, True)  # at most 3x: 3.0 is within
    lat = rows["added latency at 5,000 msg/s, p99"]
    assert (lat["value"], lat["pump"], lat["met"]) == (150.0, 50.0, True)
    # a run that did not happen: not measured, never met or failed by default
    assert rows["1 MiB messages, drain (x direct)"]["met"] is None
    assert "not measured" in speed.report(list(rows.values()))


def test_haproxy_beside_the_pump_and_its_own_targets() -> None:
    docs = {"versus": _versus({
        "firehose": {"direct": {"msgs_per_s": 1000.0},
                     "new-policed": {"msgs_per_s": 960.0, "relay_cpu_us_per_msg": 1.6},
                     "pump": {"msgs_per_s": 980.0, "relay_cpu_us_per_msg": 1.0},
                     "haproxy": {"msgs_per_s": 990.0, "relay_cpu_us_per_msg": 0.7}},
        "firehose10": {"direct": {"msgs_per_s": 100.0},
                       "new-policed": {"msgs_per_s": 96.0, "relay_cpu_us_per_msg": 4.5},
                       "haproxy": {"msgs_per_s": 99.0, "relay_cpu_us_per_msg": 1.5}}}),
        "mib": _versus({"firehose": {"direct": {"msgs_per_s": 100.0},
                                     "new": {"msgs_per_s": 67.0},
                                     "haproxy": {"msgs_per_s": 70.0}}})}
    rows = {r["target"]: r for r in (t.judge(docs) for t in speed.TARGETS)}
    publish = rows["policed publish, 0-9-1 (x direct)"]
    assert (publish["haproxy"], publish["met"]) == (0.99, True)
    cpu = rows["policed CPU per message, 0-9-1 (x HAProxy's)"]
    assert (round(cpu["value"], 3), cpu["met"]) == (2.286, False)  # at most 2x
    stated = rows["policed CPU per message, 1.0 (x HAProxy's; stated)"]
    assert (stated["value"], stated["met"]) == (3.0, True)
    mib = rows["1 MiB messages, firehose (x HAProxy)"]
    assert (round(mib["value"], 3), mib["met"]) == (0.957, False)  # at least HAProxy's
    table = speed.report(list(rows.values()))
    assert "| HAProxy, same run |" in table.splitlines()[0]
    assert "| stated | 3.000 | - | - | stated |" in table


def test_one_mib_against_both_pumps_in_the_same_run() -> None:
    docs = {"mib": _versus({
        "firehose": {"direct": {"msgs_per_s": 100.0}, "new": {"msgs_per_s": 60.0},
                     "pump": {"msgs_per_s": 57.0}, "splice": {"msgs_per_s": 66.0}},
        "drain": {"direct": {"msgs_per_s": 100.0}, "new": {"msgs_per_s": 52.0},
                  "pump": {"msgs_per_s": 53.0}, "splice": {"msgs_per_s": 54.0}}})}
    rows = {r["target"]: r for r in (t.judge(docs) for t in speed.TARGETS)}
    firehose = rows["1 MiB messages, firehose (x the pump)"]
    assert (round(firehose["value"], 3), firehose["met"]) == (1.053, True)  # at least 1.0x
    spliced = rows["1 MiB messages, firehose (x the splice pump)"]
    assert (round(spliced["value"], 3), spliced["met"]) == (0.909, False)  # at least 0.95x
    drain = rows["1 MiB messages, drain (x the splice pump)"]
    assert (round(drain["value"], 3), drain["met"]) == (0.963, True)
    assert rows["1 MiB messages, drain (x the pump)"]["met"] is False
    assert "--splice-pump" in speed.commands(Path("out"), 3, quick=True)["mib"]
