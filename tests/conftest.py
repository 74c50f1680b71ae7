"""Fixtures shared by the whole suite: a real RabbitMQ and a real floodwall process."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker
from floodwall.dev.devproxy import ProxyProcess

# java_producer, node_producer, rhea_sender, rhea_receiver: real foreign clients;
# pki, tls_broker, mtls_broker: certificates and TLS-only brokers.
pytest_plugins = ("tests.clients.fixtures", "tests.integration.tls_fixtures")

BROKER_ENV = "FLOODWALL_TEST_BROKER"  # HOST:AMQP_PORT:MANAGEMENT_PORT[:USER:PASSWORD]


def wait_for(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02,
             what: str = "condition") -> object:
    """Poll ``condition`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def record_calls(obj: Any, name: str) -> list[tuple[Any, ...]]:
    """Replace method ``name`` of ``obj`` with one that records each call's arguments in the
    list returned, then does what it did (so a test can see that a path was taken)."""
    calls: list[tuple[Any, ...]] = []
    method = getattr(obj, name)

    def recorded(*args: Any) -> Any:
        calls.append(args)
        return method(*args)
    setattr(obj, name, recorded)
    return calls


async def eventually(condition: Callable[[], object], timeout: float, what: str) -> object:
    """``wait_for`` on the event loop: poll ``condition`` until truthy, fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run the coroutine function ``body`` on a fresh event loop."""
    asyncio.run(body())


def _docker_broker() -> tuple[BrokerEndpoint, Callable[[], None]] | None:
    """A broker from testcontainers, when FLOODWALL_TEST_DOCKER=1 and an engine answers."""
    if os.environ.get("FLOODWALL_TEST_DOCKER") != "1":
        return None
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = DockerContainer("rabbitmq:3.10-management")
    container.with_exposed_ports(5672, 15672)
    container.with_command(
        "bash -c 'rabbitmq-plugins enable --offline rabbitmq_amqp1_0 rabbitmq_prometheus "
        "rabbitmq_event_exchange "
        "&& exec docker-entrypoint.sh rabbitmq-server'")
    container.start()
    wait_for_logs(container, "Server startup complete", timeout=120)
    host = container.get_container_host_ip()
    ep = BrokerEndpoint(host, int(container.get_exposed_port(5672)),
                        int(container.get_exposed_port(15672)))
    return ep, container.stop


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerEndpoint]:
    """A RabbitMQ 3.10 with management, prometheus and amqp1_0 plugins.

    FLOODWALL_TEST_BROKER points the suite at an existing one; FLOODWALL_TEST_DOCKER=1 uses
    testcontainers; otherwise Debian's rabbitmq-server runs from a temporary directory.
    """
    existing = os.environ.get(BROKER_ENV)
    if existing:
        yield BrokerEndpoint.from_env(existing)
        return
    docker = _docker_broker()
    if docker is not None:
        ep, stop = docker
        yield ep
        stop()
        return
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-rabbit-"))
    node = LocalBroker(workdir)
    node.start()
    try:
        yield node.endpoint
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def floodwall(broker: BrokerEndpoint, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[ProxyProcess]:
    """One floodwall process in front of the session broker, shared by relay tests."""
    logdir = tmp_path_factory.mktemp("floodwall")
    proc = ProxyProcess(f"{broker.host}:{broker.amqp_port}", logdir / "floodwall.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def start_floodwall(broker: BrokerEndpoint, tmp_path: Path
                    ) -> Iterator[Callable[..., ProxyProcess]]:
    """Start a private floodwall (extra flags, env) for one test; stopped afterwards."""
    started: list[ProxyProcess] = []

    def start(*args: str, upstream: str | None = None, wait_ready: bool = True,
              env: dict[str, str] | None = None) -> ProxyProcess:
        proc = ProxyProcess(upstream or f"{broker.host}:{broker.amqp_port}",
                            tmp_path / f"floodwall-{len(started)}.log", list(args), env or {})
        started.append(proc)
        return proc.start(wait_ready=wait_ready)

    yield start
    for proc in started:
        proc.stop()
