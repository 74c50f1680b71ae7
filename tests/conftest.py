"""Fixtures shared by the whole suite: a real RabbitMQ and a real floodwall process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from floodwall.dev.devbroker import (
    RELEASE_NAMES,
    BrokerEndpoint,
    BrokerRelease,
    LocalBroker,
    release_named,
)
from floodwall.dev.devproxy import ProxyProcess

# java_producer, node_producer, rhea_sender, rhea_receiver: real foreign clients;
# pki, tls_broker, mtls_broker: certificates and TLS-only brokers.
pytest_plugins = ("tests.clients.fixtures", "tests.integration.tls_fixtures")

BROKER_ENV = "FLOODWALL_TEST_BROKER"  # HOST:AMQP_PORT:MANAGEMENT_PORT[:USER:PASSWORD]
# Which RabbitMQ releases the broker-facing tests run against: "3.10", "4.0" or both
# ("3.10,4.0", the default); `pytest --broker 4.0` says the same for one run.
RELEASES_ENV = "FLOODWALL_TEST_BROKERS"
RELEASES = RELEASE_NAMES


#: Where the tests that start a broker, a container image or a Spark cluster live besides
#: the broker-facing ones (those that take ``broker_release``): they share what they start,
#: so they run in one process, one at a time.
SERVICE_DIRS = ("cluster", "deploy", "integration", "pipeline")
#: services-timed and services-tolerant split the services part by the ``load_tolerant``
#: marker: ``make test`` runs the tolerant ones beside the others at a low priority.
PARTS = ("standalone", "services", "services-timed", "services-tolerant")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--broker", action="append", choices=RELEASES, default=None,
                     help="run the broker-facing tests against this RabbitMQ only "
                          f"(repeatable; default: ${RELEASES_ENV} or both)")
    parser.addoption("--part", choices=PARTS, default=None,
                     help="standalone: only the tests that start no broker, image or Spark "
                          "(each needs nothing but its own process: pytest-xdist's -n may "
                          "spread them); services: only the others; services-timed / "
                          "services-tolerant: those of them without / with the "
                          "load_tolerant marker; default: all")


def uses_services(item: pytest.Item) -> bool:
    """Whether ``item`` starts (or shares) a broker, a container image or a Spark cluster."""
    if "broker_release" in getattr(item, "fixturenames", ()):
        return True
    parts = item.path.relative_to(item.config.rootpath).parts
    return len(parts) > 2 and parts[0] == "tests" and parts[1] in SERVICE_DIRS


def part_of(item: pytest.Item) -> str:
    """The narrowest part ``item`` is in: standalone, services-timed or services-tolerant."""
    if not uses_services(item):
        return "standalone"
    marker = item.get_closest_marker("load_tolerant")  # a test's own marker before its module's
    if marker is not None and marker.args[:1] != (False,):
        return "services-tolerant"
    return "services-timed"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = config.getoption("--part")
    if part is None:
        return

    def wanted(item: pytest.Item) -> bool:
        narrow = part_of(item)
        return narrow == part or (part == "services" and narrow != "standalone")

    keep = [item for item in items if wanted(item)]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if not wanted(i)])
        items[:] = keep


def _releases(config: pytest.Config) -> list[str]:
    chosen: list[str] | None = config.getoption("--broker")
    if chosen:
        return chosen
    named = os.environ.get(RELEASES_ENV)
    if named:
        wanted = [r.strip() for r in named.split(",") if r.strip()]
        unknown = set(wanted) - set(RELEASES)
        if unknown:
            raise pytest.UsageError(f"{RELEASES_ENV}={named!r}: expected some of {RELEASES}")
        return wanted
    return ["3.10"] if os.environ.get(BROKER_ENV) else list(RELEASES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that reaches a broker (through ``broker_release``) runs once per release;
    one marked ``one_release(NAME)`` (what it measures is floodwall's alone, and it is long)
    runs on that release when it is among those chosen."""
    if "broker_release" in metafunc.fixturenames:
        names = _releases(metafunc.config)
        marker = metafunc.definition.get_closest_marker("one_release")
        if marker is not None and marker.args[0] in names:
            names = [marker.args[0]]
        metafunc.parametrize("broker_release", names, indirect=True, scope="session",
                             ids=[f"rabbitmq{n}" for n in names])


@pytest.fixture(scope="session")
def broker_release(request: pytest.FixtureRequest) -> BrokerRelease:
    """The RabbitMQ release this test runs against: the host's 3.10 or the 4.0 root. Give
    it to a private ``LocalBroker(..., release=broker_release)``."""
    return release_named(request.param)


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


def _docker_broker(version: tuple[int, int]
                   ) -> tuple[BrokerEndpoint, Callable[[], None]] | None:
    """A broker from testcontainers, when FLOODWALL_TEST_DOCKER=1 and an engine answers."""
    if os.environ.get("FLOODWALL_TEST_DOCKER") != "1":
        return None
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = DockerContainer("rabbitmq:{}.{}-management".format(*version))
    container.with_exposed_ports(5672, 15672)
    container.with_command(
        "bash -c 'rabbitmq-plugins enable --offline rabbitmq_amqp1_0 rabbitmq_prometheus "
        "rabbitmq_event_exchange "
        "&& exec docker-entrypoint.sh rabbitmq-server'")
    container.start()
    wait_for_logs(container, "Server startup complete", timeout=120)
    host = container.get_container_host_ip()
    ep = BrokerEndpoint(host, int(container.get_exposed_port(5672)),
                        int(container.get_exposed_port(15672)), version=version)
    return ep, container.stop


@pytest.fixture(scope="session")
def broker(broker_release: BrokerRelease) -> Iterator[BrokerEndpoint]:
    """A RabbitMQ with management, prometheus, amqp1_0 and event exchange plugins, one per
    release (3.10, the host's package; 4.0, Debian 13's in its root), shared by the session.
    ``broker.version`` says which.

    FLOODWALL_TEST_BROKER points the suite at an existing one; FLOODWALL_TEST_DOCKER=1 uses
    testcontainers; otherwise Debian's rabbitmq-server runs from a temporary directory.
    """
    existing = os.environ.get(BROKER_ENV)
    if existing:
        ep = BrokerEndpoint.from_env(existing)
        overview = ep.api("GET", "/api/overview")
        assert isinstance(overview, dict)
        major, minor = str(overview["rabbitmq_version"]).split(".")[:2]
        ep.version = (int(major), int(minor))
        yield ep
        return
    docker = _docker_broker(broker_release.version)
    if docker is not None:
        ep, stop = docker
        yield ep
        stop()
        return
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-rabbit-"))
    node = LocalBroker(workdir, release=broker_release)
    node.start()
    try:
        yield node.endpoint
    finally:
        node.remove()


@pytest.fixture(scope="session")
def spare_broker(broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    """A RabbitMQ of the tests' own beside the session broker, one per release, for the
    tests that freeze it, kill -9 it and start it again, or raise its resource alarms (the
    session broker's other users would stall): use it through ``spare``."""
    node = LocalBroker(Path(tempfile.mkdtemp(prefix="floodwall-spare-")), release=broker_release)
    node.start()
    try:
        yield node
    finally:
        node.remove()


@pytest.fixture
def spare(spare_broker: LocalBroker) -> Iterator[LocalBroker]:
    """The spare broker, running (started again if an earlier test left it dead), and
    thawed after the test, whatever it did."""
    if spare_broker.process is None:
        spare_broker.start()
    yield spare_broker
    with contextlib.suppress(Exception):
        spare_broker.thaw()


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
