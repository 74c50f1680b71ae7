"""Connection lifecycle through the relay: either side closing closes the other, an
unreachable or silent broker, a client that never sends its header."""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from proton import Described, uint, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container

from floodwall.dev.devbroker import BrokerEndpoint, free_port
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    AMQP091_HEADER,
    AMQP10_HEADER,
    Raw091,
    amqp10_login,
    broker_connection_named,
    broker_connections,
    delete_queue,
    encode_performative,
    http_status,
    log_lines,
    pika_connection,
    pika_params,
    read_until_eof,
    split_frames10,
    temp_queue,
    unique,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]

# The management plugin lists a new connection once its stats are first emitted (every 5 s).
LISTED = 20.0


def _proxy_conn_ids(proxy: ProxyProcess) -> set[int]:
    conns = proxy.state()["connections"]
    assert isinstance(conns, list)
    return {c["id"] for c in conns}


def test_client_dropping_its_socket_closes_the_broker_connection(
        floodwall: ProxyProcess, broker: BrokerEndpoint) -> None:
    name = unique("dropped-by-client")
    raw = Raw091.connect(floodwall.port)
    raw.handshake(name=name)
    peer = raw.local_address
    wait_for(lambda: broker_connection_named(broker, name), LISTED,
             what="the broker to list the connection")
    assert peer in _proxy_peers(floodwall)
    raw.close()  # no connection.close: the TCP connection just goes away
    wait_for(lambda: broker_connection_named(broker, name) is None, LISTED,
             what="the broker connection to disappear")
    wait_for(lambda: peer not in _proxy_peers(floodwall), 5,
             what="the proxy to forget the connection")


def _proxy_peers(proxy: ProxyProcess) -> set[str]:
    conns = proxy.state()["connections"]
    assert isinstance(conns, list)
    return {c["peer"] for c in conns}


def _amqp10_names(broker: BrokerEndpoint) -> set[str]:
    # RabbitMQ 3.10's plugin shows a 1.0 client as a "direct" connection once it has a link,
    # protocol "AMQP 1.0"; RabbitMQ 4 (native 1.0) as a "network" one, protocol "AMQP 1-0"
    protocol = "AMQP 1-0" if broker.version >= (4, 0) else "AMQP 1.0"
    return {c["name"] for c in broker_connections(broker) if c.get("protocol") == protocol}


def test_client_dropping_an_amqp10_socket_closes_the_broker_connection(
        floodwall: ProxyProcess, broker: BrokerEndpoint) -> None:
    before = _amqp10_names(broker)
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as pc:
        ch = pc.channel()
        with socket.create_connection(("127.0.0.1", floodwall.port), timeout=10) as sock:
            amqp10_login(sock, broker)  # RabbitMQ 4 wants SASL first
            sock.sendall(AMQP10_HEADER)
            sock.sendall(encode_performative(0x10, [unique("amqp10-dropped")]))  # open
            sock.sendall(encode_performative(0x11, [None, uint(0), uint(100), uint(100)]))
            sock.sendall(encode_performative(0x12, [  # attach a receiver: a consumer
                "drop-me", uint(0), True, None, None,
                Described(ulong(0x28), [f"/amq/queue/{queue}"]), Described(ulong(0x29), [])]))
            got = b""
            while "attach" not in [f.performative for f in split_frames10(got)[1]]:
                chunk = sock.recv(65536)
                assert chunk, f"closed during the handshake after {split_frames10(got)}"
                got += chunk
            wait_for(lambda: ch.queue_declare(queue, passive=True).method.consumer_count == 1,
                     10, what="the broker to register the 1.0 link as a consumer")
            listed = wait_for(lambda: _amqp10_names(broker) - before, LISTED,
                              what="the broker to list the connection")
        # the socket is gone without detach, end or close
        wait_for(lambda: ch.queue_declare(queue, passive=True).method.consumer_count == 0, 10,
                 what="the broker to drop the dropped client's consumer")
        wait_for(lambda: not (_amqp10_names(broker) & listed), LISTED,
                 what="the broker's AMQP 1.0 connection to disappear")


@pytest.fixture
def named_pika(floodwall: ProxyProcess, broker: BrokerEndpoint
               ) -> Iterator[tuple[pika.BlockingConnection, dict[str, Any], int]]:
    name = unique("closed-by-broker")
    before = _proxy_conn_ids(floodwall)
    conn = pika.BlockingConnection(pika_params(floodwall.port, client_properties={
        "connection_name": name}))
    record = wait_for(lambda: broker_connection_named(broker, name), LISTED,
                      what="the broker to list the connection")
    assert isinstance(record, dict)
    (proxy_id,) = _proxy_conn_ids(floodwall) - before
    yield conn, record, proxy_id
    if conn.is_open:
        conn.close()


def test_broker_closing_the_connection_closes_the_client(
        floodwall: ProxyProcess, broker: BrokerEndpoint, named_pika: Any) -> None:
    conn, record, proxy_id = named_pika
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)
    broker.api("DELETE", "/api/connections/" + urllib.parse.quote(record["name"], safe=""))
    closed_by: list[BaseException] = []

    def client_saw_close() -> bool:
        try:
            conn.process_data_events(time_limit=0.1)
        except pika.exceptions.AMQPConnectionError as exc:
            closed_by.append(exc)
        return conn.is_closed

    wait_for(client_saw_close, 10, what="the client to see its connection closed")
    assert closed_by, "pika did not report why"
    exc = closed_by[0]
    assert isinstance(exc, pika.exceptions.ConnectionClosedByBroker), repr(exc)
    assert exc.reply_code == 320  # CONNECTION_FORCED
    wait_for(lambda: proxy_id not in _proxy_conn_ids(floodwall), 5,
             what="the proxy to drop both of its sockets")


class _ForceClosedReceiver(MessagingHandler):
    """Reactor-API client: opens a receiver, has the broker force-close its connection, and
    records the error the broker sends back."""

    def __init__(self, url: str, broker: BrokerEndpoint, queue: str) -> None:
        super().__init__()
        self.url, self.broker, self.queue = url, broker, queue
        self.before = _amqp10_names(broker)
        self.deadline = time.monotonic() + LISTED + 10
        self.forced: str | None = None
        self.error: tuple[str, str] | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN")
        event.container.create_receiver(self.conn, f"/queue/{self.queue}")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            event.container.schedule(0.2, self)

    def on_timer_task(self, event: Any) -> None:
        if self.error is not None:
            return
        if time.monotonic() > self.deadline:
            self.conn.close()
            return
        if self.forced is None:
            new = _amqp10_names(self.broker) - self.before
            if len(new) == 1:
                self.forced = new.pop()
                self.broker.api("DELETE", "/api/connections/"
                                + urllib.parse.quote(self.forced, safe=""))
        event.container.schedule(0.2, self)

    def _record(self, endpoint: Any) -> None:
        cond = endpoint.remote_condition
        if cond is not None and self.error is None:
            self.error = (cond.name, cond.description or "")
            self.conn.close()

    def on_session_error(self, event: Any) -> None:
        self._record(event.session)

    def on_connection_error(self, event: Any) -> None:
        self._record(event.connection)

    def on_link_error(self, event: Any) -> None:
        self._record(event.link)


def test_broker_closing_an_amqp10_connection_reaches_the_client(
        floodwall: ProxyProcess, broker: BrokerEndpoint) -> None:
    """RabbitMQ 3.10's plugin answers a forced close of a 1.0 client's connection by ending
    its session with an error that carries 320 (CONNECTION_FORCED); RabbitMQ 4 closes the
    connection with amqp:internal-error, 'Connection forced: "Closed via management
    plugin"'. Either reaches the client through floodwall as the broker sent it."""
    queue = unique("amqp10-forced")
    handler = _ForceClosedReceiver(f"amqp://guest:guest@127.0.0.1:{floodwall.port}", broker,
                                   queue)
    try:
        Container(handler).run()
    finally:
        delete_queue(broker, queue)
    assert handler.forced is not None, "the broker never listed the 1.0 connection"
    assert handler.error is not None, "the client never heard of the forced close"
    condition, description = handler.error
    # the broker's own words for a forced close: 3.10's plugin quotes AMQP 0-9-1's code
    forced = "320" if broker.version < (4, 0) else "Connection forced"
    assert condition.startswith("amqp:") and forced in description, handler.error


# -- the broker side unreachable -----------------------------------------------------------
def test_upstream_refusing_connections(start_floodwall: Any) -> None:
    dead = free_port()
    proxy: ProxyProcess = start_floodwall(upstream=f"127.0.0.1:{dead}", wait_ready=False)
    started = time.monotonic()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_params(proxy.port, socket_timeout=10))
    elapsed = time.monotonic() - started
    assert elapsed < 3.0, f"failing took {elapsed:.1f}s (connect timeout is 5 s)"
    line = wait_for(lambda: log_lines(proxy.logfile, "upstream_unreachable"), 5,
                    what="an upstream_unreachable log line")
    assert isinstance(line, list)
    assert f"upstream=127.0.0.1:{dead}" in line[0] and "reason=" in line[0]
    assert proxy.metric("floodwall_upstream_connect_failures_total") >= 1
    status, body = http_status(proxy.admin_url + "/readyz")
    assert status == 503 and b'"ready": false' in body
    assert http_status(proxy.admin_url + "/healthz")[0] == 200
    assert proxy.metric("floodwall_upstream_up") == 0
    wait_for(lambda: proxy.state()["connections"] == [], 5,
             what="the failed connection to leave the proxy's table")
    assert proxy.metric("floodwall_connections", protocol="amqp091") == 0


@pytest.fixture
def silent_upstream() -> Iterator[int]:
    """A port that accepts no more TCP handshakes: its accept queue is full, SYNs are dropped."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    for _ in range(4):  # the queue takes backlog+1; later connects hang in SYN_SENT
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
        pytest.skip("this kernel completes handshakes past a full accept queue")
    except (TimeoutError, OSError):
        pass
    finally:
        probe.close()
    yield port
    for s in fillers:
        s.close()
    listener.close()


def test_upstream_not_answering_fails_after_the_connect_timeout(
        start_floodwall: Any, silent_upstream: int) -> None:
    proxy: ProxyProcess = start_floodwall("--connect-timeout", "1",
                                          upstream=f"127.0.0.1:{silent_upstream}",
                                          wait_ready=False)
    started = time.monotonic()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika_params(proxy.port, socket_timeout=10))
    elapsed = time.monotonic() - started
    assert 0.8 < elapsed < 4.0, f"failing took {elapsed:.1f}s with --connect-timeout 1"
    lines = wait_for(lambda: log_lines(proxy.logfile, "upstream_unreachable"), 5,
                     what="an upstream_unreachable log line")
    assert isinstance(lines, list) and "no connection within 1s" in lines[0], lines
    assert http_status(proxy.admin_url + "/readyz")[0] == 503


def test_client_that_never_sends_a_header_is_closed(start_floodwall: Any) -> None:
    proxy: ProxyProcess = start_floodwall("--handshake-timeout", "1")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(AMQP091_HEADER[:3])
        assert read_until_eof(sock, timeout=8) == b""
        elapsed = time.monotonic() - started
    assert 0.8 < elapsed < 4.0, elapsed
    wait_for(lambda: log_lines(proxy.logfile, "handshake_timeout"), 5,
             what="a handshake_timeout log line")
    with pika_connection(proxy.port) as conn:  # the proxy itself is fine
        assert conn.channel().is_open
