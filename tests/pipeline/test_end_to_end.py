"""End to end: a real ``floodwall run`` in front of the real broker writes telemetry while a
pika producer overfills a policed queue and a slow consumer drains it; ``floodwall analyze``
turns the files into a report and a policies file that ``parse_policies`` accepts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from floodwall.cli import main
from floodwall.control.policy import parse_policies
from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from floodwall_pipeline.analyze import ADVICE_RESOLUTION
from tests.conftest import wait_for
from tests.integration.support import (
    capped,
    delete_queue,
    direct_params,
    pika_connection,
    policy_file,
    unique,
)

pytestmark = pytest.mark.broker

MESSAGES, BODY = 200, 1024
#: The drain spans three of the buckets the per-queue figures are computed in: a drain rate
#: needs two whole buckets in a row with a backlog (one 4 s drain may fall into one bucket).
DRAIN_S = 3 * ADVICE_RESOLUTION


def _queue_policed(proc: ProxyProcess, queue: str) -> bool:
    flow = proc.state().get("flow") or {}
    assert isinstance(flow, dict)
    return any(q["queue"] == queue and q["depth"]["estimate"] is not None
               for q in flow.get("queues", []))


def _samples_after_release(telemetry: Path, queue: str) -> int:
    """Untripped samples of ``queue`` written after its last release event (complete lines
    only: the proxy may be mid-write)."""
    records = [json.loads(line) for f in sorted(telemetry.glob("telemetry-e2e-pod-*.ndjson"))
               for line in f.read_text().split("\n")[:-1]]
    mine = [r for r in records if r["queue"] == queue]
    releases = [i for i, r in enumerate(mine) if r["type"] == "event" and r["event"] == "release"]
    if not releases:
        return 0
    after = [r for r in mine[releases[-1] + 1:] if r["type"] == "sample"]
    return len(after) if after and not after[-1].get("tripped", False) else 0  # absent: false


def test_telemetry_of_a_real_run_to_report_and_policies(
        broker: BrokerEndpoint, start_floodwall: Callable[..., ProxyProcess], spark: SparkSession,
        tmp_path: Path) -> None:
    queue = unique("tel")
    telemetry = tmp_path / "telemetry"
    policies = policy_file(tmp_path / "policies.yaml",
                           capped("tel", queue, "64KiB", "32KiB", deadline="120s"))
    proc = start_floodwall("--policies", str(policies), "--management", broker.management_url,
                           "--telemetry-dir", str(telemetry), "--telemetry-interval", "250ms",
                           env={"POD_NAME": "e2e-pod"})
    try:
        with pika_connection(proc.port) as conn:
            conn.channel().queue_declare(queue)
        wait_for(lambda: _queue_policed(proc, queue), 20, what="the queue policed")

        consumed = 0
        done = threading.Event()

        def consume() -> None:  # straight from the broker, slowly: the drain lasts DRAIN_S
            nonlocal consumed
            c = pika.BlockingConnection(direct_params(broker))
            ch = c.channel()
            deadline = time.monotonic() + 60
            while consumed < MESSAGES and time.monotonic() < deadline:
                method, _, _ = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    c.sleep(0.02)
                    continue
                consumed += 1
                c.sleep(DRAIN_S / MESSAGES)
            c.close()
            done.set()

        with pika_connection(proc.port) as producer:
            ch = producer.channel()
            for _ in range(MESSAGES):  # 200 KiB at once into a 64 KiB queue: most are held
                ch.basic_publish("", queue, b"x" * BODY)
            wait_for(lambda: metric_tripped(proc, queue), 10, what="the queue tripped")
            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            assert done.wait(90), f"consumed only {consumed} of {MESSAGES}"
            consumer.join(5)
            wait_for(lambda: _samples_after_release(telemetry, queue) >= 2, 15,
                     what="two untripped samples written after the release")
        assert proc.stop() == 0
    finally:
        delete_queue(broker, queue)

    files = sorted(telemetry.glob("telemetry-e2e-pod-*.ndjson"))
    assert files, list(telemetry.iterdir())
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    mine = [r for r in records if r["queue"] == queue]
    assert {r["sidecar"] for r in records} == {"e2e-pod"}
    assert {"trip", "release", "hold"} <= {r["event"] for r in mine if r["type"] == "event"}
    samples = [r for r in mine if r["type"] == "sample"]
    # version 3: tripped only when true, a count only when not 0 (absent: false, 0)
    assert any(r.get("tripped") for r in samples) and "tripped" not in samples[-1]
    assert sum(r.get("ingress_bytes", 0) for r in samples) == MESSAGES * BODY  # all booked

    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", str(telemetry), "--out", str(out),
                                       "--resolution", "1s"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["input"]["corrupt"] == 0
    # the proxy's own telemetry: the strict read took every line, once
    assert json.loads((out / "timings.json").read_text())["reads"] == 1
    (q,) = [x for x in summary["queues"] if x["queue"] == queue]
    assert q["trips"] >= 1 and q["tripped_seconds"] > 0
    assert q["ingress_bytes"] == MESSAGES * BODY
    assert q["capacity"] == 64 * 1024 and q["depth_max"] > 32 * 1024
    assert q["drain_rate"] and q["drain_rate"] > 0, _series(samples)
    html = (out / "report.html").read_text()
    assert queue in html and (out / "plots" / f"{queue}.png").stat().st_size > 10_000
    recommended = parse_policies((out / "recommended-policies.yaml").read_text())
    policy = recommended.for_queue("/", queue)
    assert policy is not None and policy.capacity >= 64 * 1024


def _series(samples: list[dict[str, Any]]) -> str:
    """The queue's samples, one line each, for a failure's message: what the drain rate
    was computed from."""
    t0 = float(samples[0]["ts"])
    return "\n".join(
        f"{float(r['ts']) - t0:7.3f}s depth={r.get('depth_bytes')} "
        f"known={r.get('depth_known', True)} ingress={r.get('ingress_bytes', 0)} "
        f"tripped={r.get('tripped', False)} held={r.get('held_bytes', 0)}"
        for r in samples)


def metric_tripped(proc: ProxyProcess, queue: str) -> bool:
    return proc.metric("floodwall_queue_tripped", vhost="/", queue=queue, policy="tel") > 0
