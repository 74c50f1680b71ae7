"""The chaos suite's fixtures: a private RabbitMQ of its own (frozen, killed and restarted
by the tests, so never the session broker) and fault-injecting TCP relays."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from floodwall.dev.devbroker import BrokerRelease, LocalBroker
from tests.chaos.faults import FaultyRelay
from tests.integration.conftest import queues

__all__ = ["alive", "chaos_broker", "queues", "relay"]  # queues: the integration tests' own


@pytest.fixture(scope="module")
def chaos_broker(broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    """A RabbitMQ for this module only: the tests freeze it, kill -9 it and start it again
    (on the same ports and data directory)."""
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-chaos-"))
    node = LocalBroker(workdir / "rabbit", release=broker_release)
    node.start()
    try:
        yield node
    finally:
        with contextlib.suppress(Exception):
            node.thaw()
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def alive(chaos_broker: LocalBroker) -> Iterator[LocalBroker]:
    """The chaos broker, running (started again if an earlier test left it dead), and
    thawed and running again after the test whatever it did."""
    if chaos_broker.process is None:
        chaos_broker.start()
    yield chaos_broker
    with contextlib.suppress(Exception):
        chaos_broker.thaw()
    if chaos_broker.process is None:
        chaos_broker.start()


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
