"""Upstream TLS: clients speak plain AMQP to floodwall, floodwall speaks amqps to a
RabbitMQ that has no plain listener (and https-only management), with certificates made at
test time. pika, aio-pika, kombu and proton through it; a tripped policy held within its
bound (the depth probes and the management API over TLS); the spool replayed over TLS, by
the proxy (0-9-1 and 1.0) and by ``floodwall spool replay``; and the ways verification fails
(wrong CA, expired certificate, wrong name, a plain port), each within the connect timeout,
with a log line and /readyz saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import kombu
import pika
import pika.exceptions
import proton
import pytest
from pamqp.commands import Basic
from proton import Message
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint, LocalBroker, free_port
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    http_status,
    log_lines,
    metric_sum,
    numbered,
    payload,
    pika_connection,
    policy_file,
    seq_of,
    sha,
    start_flow,
    unique,
)
from tests.integration.test_spool_end_to_end import FAST, spool_state, spooled
from tests.integration.tls_fixtures import Pki, amqps, tls_pika_params, upstream_args

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180), pytest.mark.load_tolerant]

KIB = 1024
SIZES = [0, 1, 4096, 131072 - 8, 131073, 1 << 20, *range(100, 30_000, 1997)]
CONNECT_TIMEOUT = 3.0


# -- the TLS broker, seen directly -------------------------------------------------------
@contextlib.contextmanager
def direct(ep: BrokerEndpoint, pki: Pki) -> Iterator[pika.adapters.blocking_connection.
                                                     BlockingChannel]:
    conn = pika.BlockingConnection(tls_pika_params(ep, pki))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def ready(ep: BrokerEndpoint, pki: Pki, queue: str) -> int:
    with direct(ep, pki) as ch:
        return int(ch.queue_declare(queue, passive=True).method.message_count)


def drain(ep: BrokerEndpoint, pki: Pki, queue: str, count: int, timeout: float = 90
          ) -> list[bytes]:
    """Consume from the broker itself until ``count`` bodies came (or the deadline)."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    with direct(ep, pki) as ch:
        ch.basic_qos(prefetch_count=500)
        for method, _, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.2):
            if method is not None:
                got.append(body)
            if len(got) >= count or time.monotonic() > deadline:
                break
        ch.cancel()
    return got


def connection_named(ep: BrokerEndpoint, name: str) -> dict[str, Any] | None:
    doc = ep.api("GET", "/api/connections")
    assert isinstance(doc, list)
    for conn in doc:
        props = conn.get("client_properties") or {}
        if props.get("connection_name") == name:
            return dict(conn)
    return None


def floodwall_connections(ep: BrokerEndpoint) -> list[dict[str, Any]]:
    """The proxy's own connections (depth probes, replayers) as the broker lists them (its
    list follows the statistics, every 5 s: wait for one to show)."""

    def own() -> list[dict[str, Any]]:
        doc = ep.api("GET", "/api/connections")
        assert isinstance(doc, list)
        return [c for c in doc
                if (c.get("client_properties") or {}).get("product") == "floodwall"]

    found = wait_for(own, 15, what="the proxy's own connections at the broker")
    assert isinstance(found, list)
    return found


@pytest.fixture
def tls_proxy(start_floodwall: Callable[..., ProxyProcess], tls_broker: BrokerEndpoint,
              pki: Pki) -> ProxyProcess:
    """floodwall with --upstream amqps://localhost:PORT --upstream-tls-ca CA."""
    return start_floodwall(*upstream_args(tls_broker, pki), upstream=amqps(tls_broker))


@pytest.fixture
def tls_queue(tls_broker: BrokerEndpoint, pki: Pki) -> Iterator[str]:
    queue = unique("tls")
    with direct(tls_broker, pki) as ch:
        ch.queue_declare(queue)
    yield queue
    with direct(tls_broker, pki) as ch:
        ch.queue_delete(queue)


# -- clients through to an amqps-only broker ---------------------------------------------
def test_the_broker_has_no_plain_listener(tls_broker: BrokerEndpoint) -> None:
    """What makes the tests below mean something: plain AMQP to the broker is refused."""
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", tls_broker.amqp_port, connection_attempts=1, socket_timeout=5))


def test_pika_publish_confirm_consume(tls_proxy: ProxyProcess, tls_broker: BrokerEndpoint,
                                      tls_queue: str) -> None:
    name = unique("pika-conn")
    with pika_connection(tls_proxy.port, client_properties={"connection_name": name}) as conn:
        ch = conn.channel()
        ch.confirm_delivery()  # basic_publish raises on a nack or a return
        bodies = [payload(size, seed=i) for i, size in enumerate(SIZES)]
        for i, body in enumerate(bodies):
            ch.basic_publish("", tls_queue, body, pika.BasicProperties(message_id=str(i)),
                             mandatory=True)
        got = []
        for method, props, body in ch.consume(tls_queue, inactivity_timeout=10):
            assert method is not None, f"only {len(got)} of {len(bodies)} came back"
            ch.basic_ack(method.delivery_tag)
            got.append((props.message_id, sha(body)))
            if len(got) == len(bodies):
                break
        ch.cancel()
        assert got == [(str(i), sha(b)) for i, b in enumerate(bodies)]
        # the broker saw this client's connection arrive over TLS, from the proxy
        seen = wait_for(lambda: connection_named(tls_broker, name), 10,
                        what="the connection at the broker")
        assert isinstance(seen, dict)
        assert seen["ssl"] is True, seen
        assert seen["ssl_protocol"] in ("tlsv1.2", "tlsv1.3"), seen


def test_aio_pika_publish_confirm_consume(tls_proxy: ProxyProcess, tls_queue: str) -> None:
    async def scenario() -> None:
        url = f"amqp://guest:guest@127.0.0.1:{tls_proxy.port}/"
        async with await aio_pika.connect(url, timeout=10) as conn:
            ch = await conn.channel(publisher_confirms=True)
            queue = await ch.get_queue(tls_queue)
            bodies = [payload(size, seed=i) for i, size in enumerate(SIZES)]
            for i, body in enumerate(bodies):
                confirm = await ch.default_exchange.publish(
                    aio_pika.Message(body, message_id=str(i)), routing_key=tls_queue)
                assert isinstance(confirm, Basic.Ack), confirm
            got = []
            async with queue.iterator() as it:
                async for message in it:
                    await message.ack()
                    got.append((message.message_id, sha(message.body)))
                    if len(got) == len(bodies):
                        break
            assert got == [(str(i), sha(b)) for i, b in enumerate(bodies)]

    asyncio.run(asyncio.wait_for(scenario(), 90))


def test_kombu_publish_confirm_consume(tls_proxy: ProxyProcess, tls_queue: str) -> None:
    queue = kombu.Queue(tls_queue, routing_key=tls_queue, no_declare=True)
    bodies = [payload(size, seed=i) for i, size in enumerate(SIZES[:12])]
    received: list[bytes] = []
    url = f"pyamqp://guest:guest@127.0.0.1:{tls_proxy.port}//"
    with kombu.Connection(url, transport_options={"confirm_publish": True},
                          connect_timeout=10) as conn:
        channel = conn.channel()
        producer = kombu.Producer(channel, serializer=None)
        for body in bodies:  # confirm_publish: returns once the broker acked
            producer.publish(body, routing_key=tls_queue,
                             content_type="application/octet-stream", content_encoding="binary")

        def on_message(body: Any, message: Any) -> None:
            raw = message.body
            received.append(raw.encode() if isinstance(raw, str) else raw)
            message.ack()

        with kombu.Consumer(channel, queues=[queue], callbacks=[on_message], accept=None):
            while len(received) < len(bodies):
                conn.drain_events(timeout=10)
    assert [sha(b) for b in received] == [sha(b) for b in bodies]


def test_proton_send_receive(tls_proxy: ProxyProcess, tls_queue: str) -> None:
    conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{tls_proxy.port}", timeout=15,
                              allowed_mechs="PLAIN")
    try:
        sender = conn.create_sender(f"/amq/queue/{tls_queue}")
        bodies = [payload(size, seed=i) for i, size in enumerate(SIZES[:12])]
        for body in bodies:  # waits for the broker's disposition (accepted)
            sender.send(Message(body=body, durable=False))
        receiver = conn.create_receiver(f"/amq/queue/{tls_queue}", credit=20)
        got = []
        for _ in bodies:
            msg = receiver.receive(timeout=15)
            got.append(sha(bytes(msg.body)))
            receiver.accept()
        assert got == [sha(b) for b in bodies]
    finally:
        conn.close()


# -- flow control with depth probes and the management API over TLS ----------------------
@pytest.mark.load_tolerant(False)  # timed: a depth bound under load
def test_tripped_policy_holds_within_its_bound_over_tls(
        start_floodwall: Callable[..., ProxyProcess], tls_broker: BrokerEndpoint, pki: Pki,
        tls_queue: str, tmp_path: Path) -> None:
    """Capacity 64 KiB, 600 publishes of 1 KiB and no consumer: the broker gets at most
    capacity + 256 KiB (the flow control's bound), the rest is held at the proxy; a consumer drains
    and everything arrives once, in order. The depth probes run on the proxy's own amqps
    connection, the management API is read over https."""
    policies = policy_file(tmp_path / "p.yaml", f'{{name: capped, match: {{queue: '
                           f'"{tls_queue}"}}, capacity: 64KiB, resume: 32KiB}}')
    flow = start_flow(start_floodwall, tls_broker, policies, *upstream_args(tls_broker, pki),
                      "--depth-interval", "50ms", "--management-interval", "1s",
                      management=tls_broker.management_url, upstream=amqps(tls_broker))
    wait_for(lambda: flow.policed(tls_queue), 20, what="the queue policed (first sample)")
    total = 600
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        for i in range(total):
            ch.basic_publish("", tls_queue, numbered(i, KIB))
        wait_for(lambda: flow.held()["messages"] > 0 and
                 flow.held()["messages"] + ready(tls_broker, pki, tls_queue) == total, 30,
                 what="every publish either at the broker or held")
        depth = ready(tls_broker, pki, tls_queue)
        tripped = flow.tripped(tls_queue)
        got = drain(tls_broker, pki, tls_queue, total)  # before asserting: nothing stays held
        assert tripped
        assert depth * KIB <= 64 * KIB + 256 * KIB, f"{depth} KiB at the broker"
        assert [seq_of(b) for b in got] == list(range(total))
    # the proxy's own connection (the depth probes) is TLS too
    own = floodwall_connections(tls_broker)
    assert all(c["ssl"] for c in own), own
    text = flow.metrics()
    assert metric_sum(text, "floodwall_management_errors_total") == 0, text


# -- the spool, replayed over TLS ---------------------------------------------------------
def seq_in(body: bytes) -> int:
    """The number in a proton sender's message as a 0-9-1 consumer gets it (RabbitMQ hands
    over the encoded AMQP 1.0 body section)."""
    message = Message()
    message.decode(body)
    return seq_of(bytes(message.body))


def test_spool_replays_over_tls_by_the_proxy_and_by_the_cli(
        start_floodwall: Callable[..., ProxyProcess], tls_broker: BrokerEndpoint, pki: Pki,
        tmp_path: Path) -> None:
    q091, q10 = unique("tls-spool"), unique("tls-spool10")
    with direct(tls_broker, pki) as ch:
        for q in (q091, q10):
            ch.queue_declare(q)
    spool_dir = tmp_path / "spool"
    policies = policy_file(tmp_path / "p.yaml", spooled("a", q091), spooled("b", q10))
    flow = start_flow(start_floodwall, tls_broker, policies, *upstream_args(tls_broker, pki),
                      "--spool-dir", str(spool_dir), "--drain-timeout", "0", *FAST,
                      management=tls_broker.management_url, upstream=amqps(tls_broker))
    wait_for(lambda: flow.policed(q091) and flow.policed(q10), 20, what="queues policed")
    count = 300
    with pika_connection(flow.port) as conn:  # 0-9-1, confirms: acked from the spool
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", q091, numbered(i, KIB))
    sender_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{flow.port}", timeout=30,
                                     allowed_mechs="PLAIN")
    try:  # AMQP 1.0: settled accepted from the spool
        sender = sender_conn.create_sender(f"/amq/queue/{q10}")
        for i in range(count):
            sender.send(Message(body=numbered(i, KIB), durable=False))
    finally:
        sender_conn.close()
    text = flow.metrics()
    assert metric_sum(text, "floodwall_spool_records", queue=q091) > 0, text
    assert metric_sum(text, "floodwall_spool_records", queue=q10) > 0, text

    # 1. the proxy replays over amqps (both replayers) as consumers drain
    got091 = drain(tls_broker, pki, q091, count)
    got10 = drain(tls_broker, pki, q10, count)
    assert [seq_of(b) for b in got091] == list(range(count))
    assert [seq_in(b) for b in got10] == list(range(count))
    wait_for(lambda: spool_state(flow.proc)["records"] == 0, 20, what="an empty spool")
    own = floodwall_connections(tls_broker)
    assert all(c["ssl"] for c in own), own

    # 2. spooled again, the proxy stopped with the backlog on disk: `floodwall spool
    #    replay` delivers it over amqps
    with pika_connection(flow.port) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", q091, numbered(count + i, KIB))
    left = spool_state(flow.proc)["records"]
    assert left > 0
    flow.proc.stop(drain=0.5)
    at_broker = ready(tls_broker, pki, q091)
    replay = subprocess.run(
        [sys.executable, "-m", "floodwall", "spool", "replay", q091, "--spool-dir", str(spool_dir),
         "--upstream", amqps(tls_broker), "--upstream-tls-ca", str(pki.ca)],
        capture_output=True, text=True, timeout=60, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"to amqps://localhost:{tls_broker.amqp_port}" in replay.stdout
    got = drain(tls_broker, pki, q091, at_broker + left)
    assert [seq_of(b) for b in got] == list(range(count, 2 * count))
    with direct(tls_broker, pki) as ch:
        for q in (q091, q10):
            ch.queue_delete(q)


# -- verification failures ---------------------------------------------------------------
@pytest.fixture(scope="session")
def expired_port(tls_node: LocalBroker, pki: Pki) -> int:
    """A second amqps listener on the TLS broker, serving a certificate that expired. Its
    files go in the node's work directory: the one host directory a node in a Debian root
    (RabbitMQ 4.0) sees."""
    port = free_port()
    cert, key = tls_node.workdir / "expired-cert.pem", tls_node.workdir / "expired-key.pem"
    shutil.copyfile(pki.expired_cert, cert)
    shutil.copyfile(pki.expired_key, key)
    tls_node.ctl("eval", f'rabbit_networking:start_ssl_listener({{"127.0.0.1", {port}}}, '
                 f'[{{certfile, "{cert}"}}, {{keyfile, "{key}"}}, '
                 "{verify, verify_none}], 1, 1).")
    return port


FAILURES = {
    # case: (what the log and /readyz must name)
    "wrong-ca": ("certificate verify failed", "self-signed certificate in certificate chain",
                 "verified name 'localhost'", "other-ca.pem"),
    "expired": ("certificate verify failed", "certificate has expired",
                "verified name 'localhost'", "ca.pem"),
    "wrong-name": ("certificate verify failed", "Hostname mismatch",
                   "verified name 'wrong.example'", "ca.pem"),
    "plain-port": ("TLS handshake failed", "wrong version number",
                   "does not speak TLS"),
}


@pytest.mark.load_tolerant(False)  # timed: fails within the connect timeout
@pytest.mark.parametrize("case", list(FAILURES))
def test_verification_failures_fail_fast_and_say_why(
        case: str, start_floodwall: Callable[..., ProxyProcess], tls_broker: BrokerEndpoint,
        broker: BrokerEndpoint, pki: Pki, request: pytest.FixtureRequest) -> None:
    upstream, ca = amqps(tls_broker), pki.ca
    extra: list[str] = []
    if case == "wrong-ca":
        ca = pki.other_ca
    elif case == "expired":
        upstream = f"amqps://localhost:{request.getfixturevalue('expired_port')}"
    elif case == "wrong-name":
        extra = ["--upstream-tls-server-name", "wrong.example"]
    elif case == "plain-port":
        upstream = f"amqps://localhost:{broker.amqp_port}"
    proc = start_floodwall("--upstream-tls-ca", str(ca), *extra, "--connect-timeout",
                           str(CONNECT_TIMEOUT), upstream=upstream, wait_ready=False)
    expected = FAILURES[case]

    # readiness does the handshake: 503, and the reason
    def unready() -> str | None:
        status, body = http_status(proc.admin_url + "/readyz")
        text = body.decode()
        return text if status == 503 and expected[0] in text else None

    readyz = wait_for(unready, 15, what="/readyz saying why")
    assert isinstance(readyz, str)
    for fragment in expected:
        assert fragment in readyz, readyz

    # a 0-9-1 client's connection fails at once, within the connect timeout
    started = time.monotonic()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, connection_attempts=1, socket_timeout=CONNECT_TIMEOUT * 3))
    assert time.monotonic() - started < CONNECT_TIMEOUT
    # and a 1.0 client's
    started = time.monotonic()
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqp://guest:guest@127.0.0.1:{proc.port}",
                           timeout=CONNECT_TIMEOUT * 3, allowed_mechs="PLAIN")
    assert time.monotonic() - started < CONNECT_TIMEOUT

    lines = wait_for(lambda: len(log_lines(proc.logfile, "upstream_tls_failed")) >= 2
                     and log_lines(proc.logfile, "upstream_tls_failed"), 10,
                     what="two upstream_tls_failed lines")
    assert isinstance(lines, list)
    for line in lines:
        for fragment in expected:
            assert fragment in line, line
    # nothing hangs: no connection is left, the failures are counted
    assert proc.state()["connections"] == []
    assert proc.metric("floodwall_upstream_tls_failures_total") >= 2


def test_insecure_is_loud(start_floodwall: Callable[..., ProxyProcess],
                          tls_broker: BrokerEndpoint, pki: Pki, tls_queue: str) -> None:
    """--upstream-tls-insecure connects to a broker it cannot verify (here: the name is
    wrong), and says so at start-up and in /readyz."""
    proc = start_floodwall("--upstream-tls-insecure", "--upstream-tls-server-name",
                           "wrong.example", upstream=amqps(tls_broker))
    status, body = http_status(proc.admin_url + "/readyz")
    assert status == 200
    assert "insecure" in body.decode()
    assert log_lines(proc.logfile, "upstream_tls_insecure")
    with pika_connection(proc.port) as conn:
        ch = conn.channel()
        ch.basic_publish("", tls_queue, b"insecure but encrypted")
        _, _, body2 = ch.basic_get(tls_queue, auto_ack=True)
        assert body2 == b"insecure but encrypted"


def test_management_api_with_the_wrong_ca_is_reported(
        start_floodwall: Callable[..., ProxyProcess], tls_broker: BrokerEndpoint, pki: Pki,
        tls_queue: str, tmp_path: Path) -> None:
    """https to the management API verified against another CA: each failure is counted as
    kind tls and /readyz's flow section says why; the relay still works."""
    policies = policy_file(tmp_path / "p.yaml", f'{{name: c, match: {{queue: "{tls_queue}"}}, '
                           "capacity: 64KiB}")
    flow = start_flow(start_floodwall, tls_broker, policies, *upstream_args(tls_broker, pki),
                      "--management-tls-ca", str(pki.other_ca),
                      management=tls_broker.management_url, upstream=amqps(tls_broker))
    wait_for(lambda: flow.metric("floodwall_management_errors_total", kind="tls") > 0, 20,
             what="a management error of kind tls")
    _, body = http_status(flow.proc.admin_url + "/readyz")
    assert "certificate verify failed" in body.decode(), body
    with pika_connection(flow.port) as conn:
        conn.channel().basic_publish("", tls_queue, b"relayed")
    wait_for(lambda: ready(tls_broker, pki, tls_queue) == 1, 10, what="the publish relayed")


def test_a_client_thread_is_not_left_waiting(tls_proxy: ProxyProcess) -> None:
    """Many connections at once over TLS: each gets through and closes (no leaked task)."""
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with pika_connection(tls_proxy.port) as conn:
                conn.channel().queue_declare("", exclusive=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    wait_for(lambda: tls_proxy.state()["connections"] == [], 10, what="all connections gone")
