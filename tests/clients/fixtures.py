"""pytest fixtures that start real foreign AMQP clients (see harness.py).

Registered for the whole suite by ``pytest_plugins`` in tests/conftest.py. Each fixture is a
factory: call it to start one client; every client it started is stopped after the test.

    def test_x(broker, java_producer):
        client = java_producer(broker.host, broker.amqp_port, "q", count=1000, confirm=True)
        client.wait_event("flow", active=False, timeout=10)
        done = client.finish(timeout=60)

A fixture skips, with a one-line reason, only where the toolchain is really absent; on CI
(``CI`` set), where ``make test`` installs everything, the same reason fails the test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.clients import harness
from tests.clients.harness import BuiltProgram, ForeignClient, JavaProgram, ToolchainMissing


def _unavailable(problem: ToolchainMissing) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{problem} (on CI `make test` installs it: nothing may be skipped)",
                    pytrace=False)
    pytest.skip(str(problem))


class _Started:
    """The clients one fixture started in one test, stopped at teardown."""

    def __init__(self) -> None:
        self.clients: list[ForeignClient] = []

    def add(self, client: ForeignClient) -> ForeignClient:
        self.clients.append(client)
        return client

    def stop_all(self) -> None:
        for client in self.clients:
            client.stop()


@pytest.fixture(scope="session")
def java_program(tmp_path_factory: pytest.TempPathFactory) -> JavaProgram:
    """FloodProducer.java compiled once per session (javac, into a session temp dir)."""
    try:
        return harness.compile_java(Path(tmp_path_factory.mktemp("java-classes")))
    except ToolchainMissing as problem:
        _unavailable(problem)


@pytest.fixture
def java_producer(java_program: JavaProgram) -> Iterator[Callable[..., ForeignClient]]:
    """``java_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False)``:
    starts the RabbitMQ Java client 5.0 producer; returns its ForeignClient."""
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_java_producer(java_program, host, port, queue,
                                                       **kwargs))

    yield start
    started.stop_all()


def _node_ready() -> None:
    try:
        harness.node_binary()
    except ToolchainMissing as problem:
        _unavailable(problem)


@pytest.fixture
def node_producer() -> Iterator[Callable[..., ForeignClient]]:
    """``node_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False)``:
    starts the amqplib producer; returns its ForeignClient."""
    _node_ready()
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_node_producer(host, port, queue, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture
def rhea_sender() -> Iterator[Callable[..., ForeignClient]]:
    """``rhea_sender(host, port, address, count=500, rate=0, body_size=100)``: starts the
    AMQP 1.0 sender (address ``/amq/queue/NAME`` for a declared queue); its ForeignClient."""
    _node_ready()
    started = _Started()

    def start(host: str, port: int, address: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_rhea_sender(host, port, address, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture
def rhea_receiver() -> Iterator[Callable[..., ForeignClient]]:
    """``rhea_receiver(host, port, address, count=0, prefetch=100, rate=0)``: starts the
    AMQP 1.0 receiver (count 0 = until stopped); its ForeignClient."""
    _node_ready()
    started = _Started()

    def start(host: str, port: int, address: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_rhea_receiver(host, port, address, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture(scope="session")
def client_builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the compiled clients (Go, C) are built, once per session."""
    return Path(tmp_path_factory.mktemp("client-builds"))


@pytest.fixture(scope="session")
def go_program(client_builds: Path) -> BuiltProgram:
    """go/producer.go built once per session (Debian's Go and amqp091-go, no modules)."""
    try:
        return harness.build_go(client_builds)
    except ToolchainMissing as problem:
        _unavailable(problem)


@pytest.fixture(scope="session")
def c_program(client_builds: Path) -> BuiltProgram:
    """c/producer.c built once per session (gcc, rabbitmq-c)."""
    try:
        return harness.build_c(client_builds)
    except ToolchainMissing as problem:
        _unavailable(problem)


@pytest.fixture
def go_producer(go_program: BuiltProgram) -> Iterator[Callable[..., ForeignClient]]:
    """``go_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False,
    connection_name=None)``: starts the amqp091-go producer; its ForeignClient."""
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_go_producer(go_program, host, port, queue, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture
def c_producer(c_program: BuiltProgram) -> Iterator[Callable[..., ForeignClient]]:
    """``c_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False)``:
    starts the rabbitmq-c producer; its ForeignClient."""
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_c_producer(c_program, host, port, queue, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture
def ruby_producer() -> Iterator[Callable[..., ForeignClient]]:
    """``ruby_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False)``:
    starts the Bunny producer; its ForeignClient."""
    try:
        harness.ruby_binary()
    except ToolchainMissing as problem:
        _unavailable(problem)
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_ruby_producer(host, port, queue, **kwargs))

    yield start
    started.stop_all()


@pytest.fixture
def php_producer() -> Iterator[Callable[..., ForeignClient]]:
    """``php_producer(host, port, queue, count=1000, rate=0, body_size=100, confirm=False)``:
    starts the php-amqplib producer; its ForeignClient."""
    try:
        harness.php_binary()
    except ToolchainMissing as problem:
        _unavailable(problem)
    started = _Started()

    def start(host: str, port: int, queue: str, **kwargs: Any) -> ForeignClient:
        return started.add(harness.start_php_producer(host, port, queue, **kwargs))

    yield start
    started.stop_all()
