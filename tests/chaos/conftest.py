"""The chaos suite's fixtures: fault-injecting TCP relays (the broker the tests freeze, kill
and restart is the suite's ``spare``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.faults import FaultyRelay
from tests.integration.conftest import queues

__all__ = ["queues", "relay"]  # queues: the integration tests' own


@pytest.fixture
def relay() -> Iterator[type[FaultyRelay]]:
    """``relay(host, port)`` starts a FaultyRelay; all are closed after the test."""
    started: list[FaultyRelay] = []

    class Tracked(FaultyRelay):
        def __init__(self, host: str, port: int) -> None:
            super().__init__(host, port)
            started.append(self)

    yield Tracked
    for r in started:
        r.close()
