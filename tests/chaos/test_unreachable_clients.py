"""Chaos: the broker cannot be reached. Clients used to be accepted and then cut off, so
pika reported ``IncompatibleProtocolError``, and the proxy wrote one ERROR line per
attempt. Now each client is told in its protocol (0-9-1: connection.close 320, 1.0: close
with ``amqp:connection:forced``) that the broker is unreachable and why, and the line is
written once per 10 s with a count of those left out."""

from __future__ import annotations

import socket
import time
from typing import Any

import pika
import pika.exceptions
import pytest

from floodwall.dev.devbroker import free_port
from tests.conftest import wait_for
from tests.integration.support import (
    AMQP10_HEADER,
    close_condition,
    log_lines,
    read_until_eof,
    split_frames10,
)

pytestmark = pytest.mark.broker


@pytest.fixture
def nowhere(start_floodwall: Any) -> Any:
    """A floodwall whose upstream port has nothing listening."""
    return start_floodwall(upstream=f"127.0.0.1:{free_port()}", wait_ready=False)


def test_pika_reads_why_the_broker_is_unreachable(nowhere: Any) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError) as raised:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", nowhere.port, connection_attempts=1, socket_timeout=10))
    text = repr(raised.value)
    print(text)
    assert not isinstance(raised.value, pika.exceptions.IncompatibleProtocolError)
    assert "320" in text and "floodwall: broker unreachable" in text
    assert "refused" in text.lower()


def test_amqp10_client_gets_open_then_close_with_an_error(nowhere: Any) -> None:
    with socket.create_connection(("127.0.0.1", nowhere.port), timeout=10) as sock:
        sock.sendall(AMQP10_HEADER)
        headers, frames = split_frames10(read_until_eof(sock))
    assert headers == [AMQP10_HEADER]
    assert [f.performative for f in frames] == ["open", "close"]
    assert close_condition(frames) == "amqp:connection:forced"
    assert "floodwall: broker unreachable" in str(frames[1].fields[0])


def test_proton_reports_the_condition(nowhere: Any) -> None:
    from proton import ConnectionException
    from proton.utils import BlockingConnection

    with pytest.raises(ConnectionException) as raised:
        BlockingConnection(f"amqp://127.0.0.1:{nowhere.port}", timeout=10)
    print(repr(raised.value))
    assert "broker unreachable" in str(raised.value)


def test_repeated_failures_are_logged_once_per_window(nowhere: Any) -> None:
    for _ in range(20):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", nowhere.port, connection_attempts=1, socket_timeout=10))
    lines = log_lines(nowhere.logfile, "upstream_unreachable")
    assert len(lines) == 10, lines  # 20 attempts within the 10 s window: 10 lines
    started = time.monotonic()
    wait_for(lambda: time.monotonic() - started > 10.5, 12, interval=0.5, what="the window")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", nowhere.port, connection_attempts=1, socket_timeout=10))
    lines = log_lines(nowhere.logfile, "upstream_unreachable")
    assert len(lines) == 11 and "suppressed=10" in lines[10], lines
