"""The soak's two-minute variant (bench/soak.py; the hour-long one is a benchmark): a queue
tripping and releasing every few seconds with the spool on, publishes confirmed through the
proxy. After the warm-up (its first minute) RSS grows by less than 5%, open fds and asyncio
tasks do not grow, nothing confirmed is lost, and the queue tripped at least once per sample.

It runs on RabbitMQ 4.0 only: what it measures is floodwall's RSS, fds and tasks, which one
broker shows. Two minutes is what the suite's hour affords; the five-minute and hour-long runs
are `python -m bench.soak --minutes N` (docs/performance.md).

The rate is what this suite's machines sustain with the spool in the path (1,500 msg/s of
1 KiB, a 2 MiB capacity): docs/performance.md ("Soak") has the hour-long run's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.soak import parse_args, soak
from floodwall.dev.devbroker import BrokerEndpoint

pytestmark = pytest.mark.broker


@pytest.mark.timeout(360)
@pytest.mark.one_release("4.0")  # floodwall's own growth: one broker shows it
def test_two_minute_soak(broker: BrokerEndpoint, tmp_path: Path) -> None:
    opts = parse_args(["--minutes", "2", "--rate", "1500", "--size", "1024",
                       "--capacity", "2MiB", "--sample", "10",
                       "--warmup", "0.5"])
    doc = soak(broker, tmp_path, opts)
    print(json.dumps({"samples": doc["samples"], "verdict": doc["verdict"]}, indent=1))
    assert doc["verdict"]["ok"], doc["verdict"]
