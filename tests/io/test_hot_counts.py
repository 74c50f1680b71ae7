"""The own connection's counts of a hot queue, with a client that answers at once (no broker):
an untripped queue is counted as often as its ingress needs, and its trip is counted at once,
not at the end of the interval it was waiting out."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest

from floodwall.control.schedule import (
    COUNTS_PER_FILL,
    RATE_WINDOW,
    STILL_INTERVAL,
    fill_time,
    held_interval,
)
from floodwall.io.supervisor import FlowSupervisor
from tests.conftest import eventually
from tests.io.test_flow import nowhere_settings, write_policies

POLICY = """
version: 1
policies:
  - name: orders
    match: {vhost: "/", queue: "orders.a"}
    capacity: 100000
    resume: 50000
"""
KEY = ("/", "orders.a")
SLOW = 10.0  # the depth interval: long, so that an untripped hot queue's interval is seconds
HOT = 0.002


class AnsweringClient:
    """Answers each passive declare at once with ``ready`` messages and notes when."""

    def __init__(self, ready: int) -> None:
        self.connected = True
        self.ready = ready
        self.asked: list[float] = []

    async def queue_counts(self, name: str, timeout: float,
                           lane: str = "probe") -> types.SimpleNamespace:
        assert name == KEY[1]
        self.asked.append(asyncio.get_running_loop().time())
        return types.SimpleNamespace(messages=self.ready, consumers=1)


def test_an_untripped_hot_queue_waits_out_its_interval_and_a_trip_is_counted_at_once(
        tmp_path: Path) -> None:
    async def body() -> None:
        # alone (no fleet: a member that does not hear its fleet counts every hot interval)
        flow = FlowSupervisor(nowhere_settings(write_policies(tmp_path / "p.yaml", POLICY),
                                               depth_interval=SLOW, hot_interval=HOT,
                                               fleet=None))
        c = flow.controller
        flow.queue_declared(*KEY)
        start = flow.clock() - RATE_WINDOW
        c.sampled_ready_count(KEY, start, 0, 0.001, start)
        for i in range(100):  # 10,000 bytes in, spread over half the rate window, none lately:
            at = start + 0.1 + i * 0.005  # 10,000 B/s over it, whatever a rise would show
            c.forwarded(KEY[0], frozenset({KEY[1]}), 100, at)
        q = c.queues[KEY]
        fill = fill_time(q.depth, q.policy, flow.clock())
        assert 5.0 < fill < SLOW  # predicted to fill before the next slow count: hot
        client = AnsweringClient(ready=100)  # the counts show what was forwarded
        task = asyncio.create_task(flow.own_connections._probe_hot(client, KEY))  # type: ignore[arg-type]
        try:
            await eventually(lambda: len(client.asked) == 1, 5, "the first count")
            interval = flow.stats.sampling_interval[KEY]  # the one it waits out now
            after = fill_time(q.depth, q.policy, flow.clock())  # (the count rebased it)
            assert interval == pytest.approx(after / COUNTS_PER_FILL, rel=0.05)
            assert interval > 100 * HOT  # a part of the fill time, not the hot interval
            await asyncio.sleep(0.05)
            assert len(client.asked) == 1  # waiting out its interval
            c.forwarded(KEY[0], frozenset({KEY[1]}), 100_000, flow.clock())
            flow.board.settle()
            assert KEY in c.tripped
            await eventually(lambda: len(client.asked) >= 2, interval / 2,
                             "a count right after the trip")
            # held: counted as a held queue is (hot, or up to STILL_INTERVAL for consumers
            # slow for its limit, as these are: 100 ready whatever is forwarded)
            await eventually(lambda: flow.stats.sampling_interval.get(KEY, SLOW)
                             <= STILL_INTERVAL, 5, "the tripped queue counted as a held one")
            held = held_interval(q.depth, q.policy, flow.clock(), HOT)
            assert HOT < held <= STILL_INTERVAL
            assert flow.stats.sampling_interval[KEY] == pytest.approx(held, rel=0.2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(body())
