"""Telemetry: records from controller snapshots and events, rotation, the writer thread."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from floodwall.control.controller import FlowController
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import parse_policies
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.shared import Enforcement
from floodwall.io.switchboard import Switchboard
from floodwall.io.telemetry import Telemetry, TelemetrySettings, TelemetryWriter
from floodwall.ops.link_figures import LinkFigures
from floodwall.ops.telemetry import (
    SCHEMA_VERSION,
    V1_ONLY,
    ZERO_WHEN_ABSENT,
    RotationPolicy,
    Sampler,
    event_fields,
    file_name,
    sidecar_identity,
)

POLICIES = parse_policies("""
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.*"}
    capacity: 1000
    resume: 500
    deadline: 5s
""")
from tests.fakes import Clock  # noqa: E402

COMMON = {"v", "type", "ts", "seq", "sidecar", "vhost", "queue"}
#: What a sample and a sidecar record can carry (docs/telemetry.md), without --fleet and with
#: the depth known; version 3 leaves out those that are null, and 0 counts (``sparse``).
SAMPLE = COMMON | {
    "interval", "policy", "capacity", "resume", "max_messages", "resume_messages", "overflow",
    "deadline", "mode", "depth_bytes", "depth_messages", "broker_depth_bytes",
    "broker_depth_messages", "ingress_bytes", "ingress_messages", "tripped", "trips",
    "blocked_publishers", "held_bytes", "held_messages", "spooled_bytes", "sampling_interval",
    "drain_bytes_per_second"}
SIDECAR = COMMON | {"interval", "blocked_channels", "held_bytes", "held_messages",
                    "spooled_bytes", "alarm", "dropped_records"}


class Router:
    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset({routing_key})

    generation = 0

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


def _controller() -> tuple[FlowController, Clock]:
    clock = Clock(100.0)
    fc = FlowController(Router(), POLICIES)
    for q in ("orders.a", "orders.b"):
        fc.queue_seen(("/", q), clock.t)
        fc.sampled_management(("/", q), ManagementSample(clock.t, 0, 0, 0, 0, 0), clock.t)
    return fc, clock


def _board(fc: FlowController, clock: Clock) -> tuple[Switchboard, GateCounters]:
    """What io/ has around the controller: the gates' counters, where events go."""
    board = Switchboard(Enforcement(fc), clock)
    return board, board.enforcement.counters


def test_identity_is_the_pod_name_else_the_host_name() -> None:
    assert sidecar_identity({"POD_NAME": "app-7f9c-x2"}, "host1") == "app-7f9c-x2"
    assert sidecar_identity({}, "host1") == "host1"
    assert sidecar_identity({"POD_NAME": " "}, "host1") == "host1"


def test_samples_carry_depth_ingress_and_trips() -> None:
    fc, clock = _controller()
    _, counters = _board(fc, clock)
    sampler = Sampler("pod-1", interval=1.0)
    first = sampler.snapshot(fc, counters, 1_000.0, clock.t)
    assert [r["type"] for r in first] == ["sample", "sample", "sidecar"]
    assert all(r["v"] == SCHEMA_VERSION == 3 for r in first)
    # version 3 writes exactly these: none of version 1's unread fields (V1_ONLY), and of an
    # idle queue not the counts that are 0, nor the rates not measured yet (null)
    unknown = {"sampling_interval", "drain_bytes_per_second"}
    assert [set(r) for r in first] == [SAMPLE - ZERO_WHEN_ABSENT - unknown] * 2 + [
        SIDECAR - ZERO_WHEN_ABSENT - {"alarm"}]
    assert not any(V1_ONLY & r.keys() for r in first)
    assert all(r["depth_bytes"] == 0 for r in first[:2])  # a depth of 0 is a figure: written
    assert [r["seq"] for r in first] == [1, 2, 3]

    clock.t += 1.0
    for _ in range(3):  # 3 x 400 bytes: the third takes orders.a over capacity (1000)
        fc.forwarded("/", frozenset({"orders.a"}), 400, clock.t)
    fc.block(7, 1, frozenset({("/", "orders.a")}), clock.t)
    counters.held_bytes, counters.held_messages = 800, 2
    clock.t += 0.5
    a, b, side = sampler.snapshot(fc, counters, 1_001.5, clock.t)
    assert (a["queue"], a["interval"], a["ingress_bytes"], a["ingress_messages"]) == (
        "orders.a", 1.5, 1200, 3)
    assert (a["depth_bytes"], a["depth_messages"], a["broker_depth_bytes"]) == (1200, 3, 0)
    assert (a["tripped"], a["trips"]) == (True, 1)
    assert (a["capacity"], a["resume"], a["deadline"], a["overflow"]) == (1000, 500, 5.0, "hold")
    assert (a["blocked_publishers"], a["held_bytes"], a["held_messages"]) == (1, 800, 2)
    assert not {"ingress_bytes", "tripped", "held_bytes"} & b.keys()  # 0, false, 0: left out
    assert set(a) == SAMPLE - {"max_messages", "resume_messages", "spooled_bytes",
                               "sampling_interval", "drain_bytes_per_second"}
    assert (side["vhost"], side["queue"], side["held_bytes"], side["blocked_channels"]) == (
        "", "", 800, 1)
    # the signals, rejects and expiries: one event each; no alarm, drop or spool: left out
    assert set(side) == SIDECAR - {"alarm", "dropped_records", "spooled_bytes"}
    # The next interval counts only what came since.
    clock.t += 1.0
    a2 = sampler.snapshot(fc, counters, 1_002.5, clock.t)[0]
    assert (a2.get("ingress_bytes", 0), a2["interval"]) == (0, 1.0)


def test_held_bytes_are_shared_by_blocked_channels() -> None:
    fc, clock = _controller()
    _, counters = _board(fc, clock)
    for q in ("orders.a", "orders.b"):
        for _ in range(3):
            fc.forwarded("/", frozenset({q}), 400, clock.t)
    fc.block(1, 1, frozenset({("/", "orders.a")}), clock.t)
    fc.block(2, 1, frozenset({("/", "orders.a"), ("/", "orders.b")}), clock.t)
    counters.held_bytes, counters.held_messages = 1000, 4
    a, b, _ = Sampler("s").snapshot(fc, counters, 0.0, 0.0)
    assert (a["blocked_publishers"], a["held_bytes"], a["held_messages"]) == (2, 1000, 4)
    assert (b["blocked_publishers"], b["held_bytes"], b["held_messages"]) == (1, 500, 2)


def test_spooled_bytes_per_queue_and_in_total() -> None:
    fc, clock = _controller()
    _, counters = _board(fc, clock)
    a, b, side = Sampler("s").snapshot(fc, counters, 0.0, 0.0,
                                       spooled={("/", "orders.b"): 4096})
    assert ("spooled_bytes" in a, b["spooled_bytes"], side["spooled_bytes"]) == (
        False, 4096, 4096)
    a, b, side = Sampler("s").snapshot(fc, counters, 0.0, 0.0)  # no spool
    assert not any("spooled_bytes" in r for r in (a, b, side))


def test_a_queues_capped_1_0_links_are_summed_in_its_sample() -> None:
    fc, clock = _controller()
    _, counters = _board(fc, clock)
    a, b, _ = Sampler("s").snapshot(fc, counters, 0.0, 0.0,
                                    links={("/", "orders.b"): LinkFigures(2, 327680, 180, 0)})
    assert not any(k.startswith("amqp10_") for k in a)  # none feeds it
    assert {k: v for k, v in b.items() if k.startswith("amqp10_")} == {
        "amqp10_links": 2, "amqp10_window_bytes": 327680, "amqp10_credit": 180}  # (0: absent)


def test_spool_and_replay_events_keep_their_fields() -> None:
    sampler = Sampler("s")
    [spool] = sampler.event("spool", {"vhost": "/", "queue": "orders.a"}, 1.0)
    assert (spool["event"], spool["queue"]) == ("spool", "orders.a")
    fields = {"reason": "empty", "replayed": 7, "replayed_bytes": 700, "seconds": 0.25,
              "records_left": 0, "bytes_left": 0}
    [replay] = sampler.event("replay", {"vhost": "/", "queue": "orders.a", **fields}, 2.0)
    assert {k: replay[k] for k in fields} == fields


def test_events_become_one_record_per_queue() -> None:
    fc, clock = _controller()
    seen: list[tuple[str, dict[str, object]]] = []
    board, _ = _board(fc, clock)
    board.observe(lambda ev: seen.extend(filter(None, [event_fields(ev)])))
    for _ in range(3):
        fc.forwarded("/", frozenset({"orders.a"}), 400, clock.t)
    fc.sampled_management(("/", "orders.a"), ManagementSample(clock.t + 1, 0, 0, 0, 0, 0),
                          clock.t)
    board.settle()
    assert [name for name, _ in seen] == ["trip", "release"]
    assert seen[0][1]["depth_bytes"] == 1200 and seen[0][1]["capacity"] == 1000
    assert seen[1][1]["reason"] == "depth"

    sampler = Sampler("s")
    recs = sampler.event("hold", {"vhost": "/", "conn": 3, "channel": 1,
                                  "queues": ["orders.b", "orders.a"]}, 5.0)
    assert [(r["queue"], r["event"], r["conn"], r["channel"]) for r in recs] == [
        ("orders.a", "hold", 3, 1), ("orders.b", "hold", 3, 1)]
    signal = sampler.event("signal", {"vhost": "/", "conn": 3, "channel": 1, "active": False},
                           5.0)
    assert (signal[0]["queue"], signal[0]["active"]) == ("", False)
    assert [r["seq"] for r in recs + signal] == [1, 2, 3]


def test_rotation_by_size_and_age_and_total() -> None:
    r = RotationPolicy(max_file_bytes=100, max_file_age=60, max_total_bytes=350)
    assert not r.should_rotate(0, 0, 1000, 500)  # an empty file takes anything once
    assert not r.should_rotate(60, 0, 10, 40)
    assert r.should_rotate(60, 0, 10, 41)
    assert r.should_rotate(1, 0, 60)
    # closed files may hold 350 - 100 = 250 bytes: delete oldest first until they fit
    files = [("telemetry-x-3.ndjson", 100), ("telemetry-x-1.ndjson", 100),
             ("telemetry-x-2.ndjson", 100)]
    assert r.to_delete(files) == ["telemetry-x-1.ndjson"]
    assert r.to_delete(files[:2]) == []
    with pytest.raises(ValueError):
        RotationPolicy(max_file_bytes=100, max_total_bytes=50)


def test_file_names_sort_by_time() -> None:
    assert file_name("pod/1", 0.0, 2) == "telemetry-pod_1-19700101T000000-000002.ndjson"
    assert file_name("p", 60.0, 1) > file_name("p", 59.0, 9)


def test_writer_rotates_and_bounds_the_directory(tmp_path: Path) -> None:
    wall = Clock(1_000.0)
    rotation = RotationPolicy(max_file_bytes=300, max_file_age=10, max_total_bytes=700)
    w = TelemetryWriter(tmp_path, "pod", rotation, wall=wall)
    rec = {"v": 1, "type": "sample", "pad": "x" * 67}  # 100 bytes a line with its newline
    assert len(json.dumps(rec, separators=(",", ":"))) + 1 == 100
    for i in range(20):
        wall.t += 1
        w.write([rec])
        if i == 2:
            wall.t += 10  # the first file is now old: the next write starts another
    files = sorted(tmp_path.iterdir())
    total = sum(p.stat().st_size for p in files)
    assert total <= 700
    assert all(p.stat().st_size <= 300 for p in files)
    assert w.files_deleted > 0 and w.records_written == 20
    assert files[-1].read_text().count("\n") == 2  # 20 lines: files of 3, 3, 3 ... 2


def test_telemetry_task_writes_off_the_loop(tmp_path: Path) -> None:
    fc, clock = _controller()
    board, _ = _board(fc, clock)
    writers: set[str] = set()

    async def scenario() -> None:
        t = Telemetry(TelemetrySettings(tmp_path, interval=0.05, sidecar="pod-9"), board)
        write = t.writer.write

        def spy(batch: list[dict[str, object]]) -> None:
            writers.add(threading.current_thread().name)
            write(batch)

        t.writer.write = spy  # type: ignore[method-assign]
        await t.start()
        assert board._observers == [t._on_event]
        for _ in range(3):
            fc.forwarded("/", frozenset({"orders.a"}), 400, clock.t)  # trips: an event
        board.settle()  # as the relay does after a read
        await asyncio.sleep(0.2)
        await t.stop()
        assert board._observers == []

    asyncio.run(scenario())
    assert writers == {"floodwall-telemetry"}  # never the event loop's thread
    lines = [json.loads(line) for p in sorted(tmp_path.iterdir())
             for line in p.read_text().splitlines()]
    kinds = {r["type"] for r in lines}
    assert kinds == {"sample", "sidecar", "event"}
    assert [r["event"] for r in lines if r["type"] == "event"] == ["trip"]
    assert all(r["sidecar"] == "pod-9" for r in lines)
    seqs = [r["seq"] for r in lines]
    assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))
    ingress = sum(r.get("ingress_bytes", 0) for r in lines if r["type"] == "sample")
    assert ingress == 1200


def test_a_failing_observer_never_breaks_the_gate(tmp_path: Path) -> None:
    fc, clock = _controller()
    board, _ = _board(fc, clock)
    t = Telemetry(TelemetrySettings(tmp_path, sidecar="s"), board)
    t.sampler.event = None  # type: ignore[assignment,method-assign]  # a bug in telemetry
    board.observe(t._on_event)
    for _ in range(3):
        fc.forwarded("/", frozenset({"orders.a"}), 400, clock.t)
    board.settle()
    assert ("/", "orders.a") in fc.tripped


def test_telemetry_flags_and_wiring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from click.testing import CliRunner

    import floodwall.io.app
    from floodwall.cli import main
    from floodwall.io.app import Proxy
    from floodwall.ops.config import ProxySettings

    runs: list[ProxySettings] = []
    monkeypatch.setattr(floodwall.io.app, "run_proxy", runs.append)
    result = CliRunner().invoke(main, [
        "run", "--telemetry-interval", "500ms", "--telemetry-file-size", "1MiB",
        "--telemetry-file-age", "10m", "--telemetry-max-total", "8MiB"],
        env={"FLOODWALL_TELEMETRY_DIR": str(tmp_path / "t")})
    assert result.exit_code == 0, result.output
    (s,) = runs
    assert (s.telemetry_dir, s.telemetry_interval) == (tmp_path / "t", 0.5)
    assert (s.telemetry_file_bytes, s.telemetry_file_age, s.telemetry_total_bytes) == (
        1024**2, 600.0, 8 * 1024**2)
    bad = CliRunner().invoke(main, ["run", "--telemetry-dir", "x", "--telemetry-max-total",
                                    "1MiB", "--telemetry-file-size", "2MiB"])
    assert bad.exit_code == 2 and "--telemetry-max-total" in bad.output

    policies = tmp_path / "p.yaml"
    policies.write_text("version: 1\npolicies:\n  - {name: p, match: {queue: q}, capacity: 1}\n")
    with_policies = Proxy(ProxySettings(("127.0.0.1", 0), (("127.0.0.1", 1),), policies=policies,
                                        telemetry_dir=tmp_path / "t", telemetry_interval=0.5))
    assert with_policies.telemetry is not None and with_policies.flow is not None
    assert with_policies.telemetry.controller is with_policies.flow.controller
    assert with_policies.telemetry.settings.interval == 0.5
    without = Proxy(ProxySettings(("127.0.0.1", 0), (("127.0.0.1", 1),),
                                  telemetry_dir=tmp_path / "t"))
    assert without.telemetry is None  # nothing policed: nothing to record (a warning says so)


def test_depth_known_and_deliveries_are_written_only_when_they_say_something() -> None:
    fc, clock = _controller()
    _, counters = _board(fc, clock)
    sampler = Sampler("s")
    fc.queues[("/", "orders.a")].depth.delivered(3)  # a 1.0 link's deliveries
    a, b, _ = sampler.snapshot(fc, counters, 0.0, clock.t,
                               depth_known={("/", "orders.b"): False})
    assert "depth_known" not in a and b["depth_known"] is False
    assert a["delivered_messages"] == 3 and "delivered_messages" not in b
    clock.t += 1.0
    a, b, _ = sampler.snapshot(fc, counters, 1.0, clock.t)  # nothing says: known
    assert "depth_known" not in a and "depth_known" not in b
    assert "delivered_messages" not in a  # none since the last sample
