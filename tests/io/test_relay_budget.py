"""A connection past its hold budget is read no more until it is back under
(floodwall/io/relay.py ``_check_budgets``); ``hold_budget_exceeded`` is logged once until it
holds nothing again, not each time a producer held at its consumers' pace is stopped again
(tens of times a second while each count lets some of its publishes go)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, cast

import pytest

from floodwall.enforce.shared import ConnectionGate
from floodwall.io.relay import RelayedConnection, RelaySettings
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats
from tests.io.test_relay_turns import Transport


@dataclass
class Gate:
    held_bytes: int = 0
    hold_budget: int = 1000

    @property
    def over_budget(self) -> bool:
        return self.held_bytes > self.hold_budget

    @property
    def holding(self) -> bool:
        return self.held_bytes > 0


def _logged(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if "hold_budget_exceeded" in r.getMessage())


def test_past_the_hold_budget_it_stops_reading_and_says_so_once_until_it_holds_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    conn = RelayedConnection(RelaySettings(Upstreams([("127.0.0.1", 5672)])), RelayStats(), 1)
    t = Transport()
    conn.client = cast(asyncio.Transport, t)
    gate = Gate()
    seen: list[Any] = []
    # a held producer at its consumers' pace: over, under (a count let some go), over again
    for held in (1500, 900, 1200, 800, 1100, 0, 1300):
        gate.held_bytes = held
        conn._check_budgets(cast(ConnectionGate, gate))
        seen.append((t.reading, _logged(caplog)))
    assert seen == [(False, 1), (True, 1), (False, 1), (True, 1), (False, 1),
                    (True, 1),  # it holds nothing: the next time is a new episode
                    (False, 2)]
