"""Fixtures shared by the integration tests (broker and floodwall ones: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from floodwall.dev.devbroker import BrokerEndpoint
from tests.integration.support import delete_queue, unique


@pytest.fixture
def queues(broker: BrokerEndpoint) -> Iterator[Callable[[str], str]]:
    """``new(prefix)``: a unique queue name, deleted at the broker after the test."""
    made: list[str] = []

    def new(prefix: str) -> str:
        made.append(unique(prefix))
        return made[-1]

    yield new
    for q in made:
        delete_queue(broker, q)
