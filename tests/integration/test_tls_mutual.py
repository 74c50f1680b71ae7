"""Mutual TLS: a RabbitMQ with ``fail_if_no_peer_cert = true`` and the
``rabbitmq_auth_mechanism_ssl`` plugin (EXTERNAL logs in as the certificate's common name).

- Without a client certificate the broker refuses the proxy: /readyz and the log say so, a
  client fails at once.
- With one, relayed clients log in as themselves (PLAIN), and the broker sees the proxy's
  certificate on their connections; the proxy's own connections (depth probes, both spool
  replayers' clients) can log in with SASL EXTERNAL as the certificate's subject.
- A relayed client's SASL EXTERNAL would log in as the proxy's certificate: refused by
  default (0-9-1 connection.close 403, 1.0 sasl-outcome auth), allowed with
  ``--upstream-tls-relay-external``, and then the broker logs it in as ``floodwall-proxy``.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.credentials
import pika.exceptions
import proton
import pytest
from proton import SSLDomain
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from floodwall.io.amqp10_client import Amqp10Client
from floodwall.io.amqp_client import AmqpClient, AmqpClientError, Confirm
from floodwall.io.tls import TlsFailure, UpstreamTlsContext
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import UpstreamTls
from floodwall.wire.relaycore import EXTERNAL_REFUSED
from tests.conftest import wait_for
from tests.integration.support import (
    http_status,
    log_lines,
    pika_connection,
    policy_file,
    start_flow,
    unique,
)
from tests.integration.tls_fixtures import PROXY_CN, Pki, amqps, tls_pika_params, upstream_args

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120), pytest.mark.load_tolerant]


def connections(ep: BrokerEndpoint, match: Callable[[dict[str, Any]], bool]
                ) -> list[dict[str, Any]]:
    """The broker's connections that ``match`` (its list follows the 5 s statistics)."""

    def found() -> list[dict[str, Any]]:
        doc = ep.api("GET", "/api/connections")
        assert isinstance(doc, list)
        return [c for c in doc if match(c)]

    got = wait_for(found, 15, what="the connection at the broker")
    assert isinstance(got, list)
    return got


def named(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda c: (c.get("client_properties") or {}).get("connection_name") == name


def test_without_a_client_certificate_the_broker_refuses_and_it_is_said(
        start_floodwall: Callable[..., ProxyProcess], mtls_broker: BrokerEndpoint,
        pki: Pki) -> None:
    proc = start_floodwall(*upstream_args(mtls_broker, pki), "--connect-timeout", "3",
                           upstream=amqps(mtls_broker), wait_ready=False)

    def unready() -> str | None:
        status, body = http_status(proc.admin_url + "/readyz")
        error = str(json.loads(body).get("upstream_error", ""))
        # TLS 1.3: the broker's alert, or (when our header crossed it) a bare reset or EOF
        # right after the handshake, named as the refusal it is (floodwall/io/tls.py)
        return error if status == 503 and ("client certificate" in error
                                           or "handshake failure" in error) else None

    readyz = wait_for(unready, 15, what="/readyz naming the missing certificate")
    assert str(readyz).startswith(("TLS handshake failed",
                                   "the broker closed the connection right after")), readyz
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, connection_attempts=1, socket_timeout=10))
    line = wait_for(lambda: log_lines(proc.logfile, "upstream_tls_failed"), 10,
                    what="upstream_tls_failed")
    assert "client certificate" in str(line) or "handshake failure" in str(line), line


def test_relayed_clients_log_in_as_themselves_over_the_proxys_certificate(
        start_floodwall: Callable[..., ProxyProcess], mtls_broker: BrokerEndpoint, pki: Pki,
        tmp_path: Path) -> None:
    """PLAIN through the proxy: the broker's user is the client's (guest); the certificate
    it sees is the proxy's. The depth probes log in with EXTERNAL as floodwall-proxy."""
    queue = unique("mtls")
    with pika.BlockingConnection(tls_pika_params(mtls_broker, pki, (pki.app_cert,
                                                                    pki.app_key))) as direct:
        direct.channel().queue_declare(queue)
    policies = policy_file(tmp_path / "p.yaml",
                           f'{{name: c, match: {{queue: "{queue}"}}, capacity: 1MiB}}')
    flow = start_flow(start_floodwall, mtls_broker, policies,
                      *upstream_args(mtls_broker, pki, "--upstream-tls-sasl-external",
                                     client_cert=True),
                      management=mtls_broker.management_url, upstream=amqps(mtls_broker))
    wait_for(lambda: flow.policed(queue), 20, what="the queue policed over EXTERNAL")
    name = unique("plain-through-mtls")
    with pika_connection(flow.port, client_properties={"connection_name": name}) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"over mutual TLS")
        _, _, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"over mutual TLS"
        (seen,) = connections(mtls_broker, named(name))
        assert seen["user"] == "guest" and seen["auth_mechanism"] == "PLAIN", seen
        assert seen["ssl"] is True and f"CN={PROXY_CN}" in seen["peer_cert_subject"], seen
    own = connections(mtls_broker, lambda c: (c.get("client_properties") or {}).get(
        "product") == "floodwall")
    assert all(c["user"] == PROXY_CN and c["auth_mechanism"] == "EXTERNAL" for c in own), own
    with pika.BlockingConnection(tls_pika_params(mtls_broker, pki, (pki.app_cert,
                                                                    pki.app_key))) as direct:
        direct.channel().queue_delete(queue)


def test_own_clients_log_in_with_external_on_both_protocols(mtls_broker: BrokerEndpoint,
                                                            pki: Pki) -> None:
    """What the depth probes and both spool replayers use: AmqpClient and Amqp10Client with
    the proxy's certificate and SASL EXTERNAL; without EXTERNAL offered they say so."""
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=pki.ca, cert=pki.proxy_cert,
                                                 key=pki.proxy_key, sasl_external=True))
    queue = unique("mtls-own")

    async def scenario() -> None:
        client = AmqpClient(Upstreams([("localhost", mtls_broker.amqp_port)]), "", "", tls=tls)
        await client.connect(10)
        try:
            assert await client.queue_counts(queue + "-none") is None  # a 404, not an error
            publisher = await client.open_publisher()
            props = bytes.fromhex("003c0000") + (2).to_bytes(8, "big") + b"\x00\x00"
            confirm = await publisher.publish("", queue, props, b"hi")
            assert await confirm is Confirm.ACK
            client10 = Amqp10Client(Upstreams([("localhost", mtls_broker.amqp_port)]), "", "",
                                    "/", tls=tls)
            await client10.connect(10)
            try:
                # the address as each broker takes it: v2 from RabbitMQ 4; 3.10 has only v1,
                # where /queue/Q would declare it (transient, refused: it is durable)
                address = (f"/queues/{queue}" if mtls_broker.version >= (4, 0)
                           else f"/amq/queue/{queue}")
                sender = await client10.open_sender(address, 10)
                # one data section (descriptor 0x75) holding vbin8 b"hi"
                message = bytes.fromhex("005375a0") + bytes([2]) + b"hi"
                confirm10 = await sender.send(message)
                assert await confirm10 is Confirm.ACK
            finally:
                await client10.close()
            counts = await client.queue_counts(queue)
            assert counts is not None and counts.messages == 2, counts
        finally:
            await client.close()

    # a queue for both to publish to (RabbitMQ 4 releases an unroutable 1.0 message where
    # 3.10's plugin accepted it); durable: 4.x deprecates transient shared queues, and it
    # may not be exclusive, since 4.0 refuses a 1.0 link to another connection's one
    path = "/api/queues/%2F/" + queue
    mtls_broker.api("PUT", path, {"durable": True, "auto_delete": False})
    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        mtls_broker.api("DELETE", path)

    # a proxy without its certificate: the TLS refusal, named
    no_cert = UpstreamTlsContext(UpstreamTls.checked(ca=pki.ca))

    async def refused() -> None:
        client = AmqpClient(Upstreams([("localhost", mtls_broker.amqp_port)]), "guest", "guest",
                            tls=no_cert)
        with pytest.raises(TlsFailure, match=r"client certificate|handshake failure"):
            await client.connect(10)
        await client.close()

    asyncio.run(asyncio.wait_for(refused(), 30))


def test_plain_broker_does_not_offer_external(tls_broker: BrokerEndpoint, pki: Pki) -> None:
    """EXTERNAL chosen against a broker without the plugin: a clear refusal, not a hang."""
    tls = UpstreamTlsContext(UpstreamTls.checked(ca=pki.ca, cert=pki.proxy_cert,
                                                 key=pki.proxy_key, sasl_external=True))

    async def scenario() -> None:
        client = AmqpClient(Upstreams([("localhost", tls_broker.amqp_port)]), "", "", tls=tls)
        with pytest.raises(AmqpClientError, match="does not offer SASL EXTERNAL"):
            await client.connect(10)
        await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_relayed_external_is_refused_by_default(
        start_floodwall: Callable[..., ProxyProcess], mtls_broker: BrokerEndpoint,
        pki: Pki) -> None:
    proc = start_floodwall(*upstream_args(mtls_broker, pki, client_cert=True),
                           "--listen-tls", "127.0.0.1:0", "--listen-tls-cert",
                           str(pki.server_cert), "--listen-tls-key", str(pki.server_key),
                           "--listen-tls-client-ca", str(pki.ca), upstream=amqps(mtls_broker))
    # 0-9-1: pika picks EXTERNAL because the broker (through the proxy) offers it
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, credentials=pika.credentials.ExternalCredentials(),
            connection_attempts=1, socket_timeout=10))
    assert "403" in str(info.value) and "proxy's own TLS certificate" in str(info.value)
    # 1.0: a proton client with its own certificate on the TLS listener, SASL EXTERNAL
    port = _tls_listen_port(proc)
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_credentials(str(pki.app_cert), str(pki.app_key), None)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqps://localhost:{port}", timeout=15, ssl_domain=domain,
                           allowed_mechs="EXTERNAL")
    lines = wait_for(lambda: len(log_lines(proc.logfile, "client_refused")) >= 2
                     and log_lines(proc.logfile, "client_refused"), 10,
                     what="two client_refused lines")
    assert isinstance(lines, list)
    assert any("protocol=amqp091" in line for line in lines)
    assert any("protocol=amqp10" in line for line in lines)
    assert all(EXTERNAL_REFUSED[:40] in line for line in lines), lines
    assert proc.metric("floodwall_protocol_errors_total", protocol="amqp091",
                       side="client") == 0


def _tls_listen_port(proc: ProxyProcess) -> int:
    line = log_lines(proc.logfile, "started")[-1]
    value = line.split("listen_tls=", 1)[1].split()[0]
    return int(value.rpartition(":")[2])


def test_relayed_external_when_allowed_logs_in_as_the_proxy(
        start_floodwall: Callable[..., ProxyProcess], mtls_broker: BrokerEndpoint,
        pki: Pki) -> None:
    proc = start_floodwall(*upstream_args(mtls_broker, pki, "--upstream-tls-relay-external",
                                          client_cert=True), upstream=amqps(mtls_broker))
    assert log_lines(proc.logfile, "relayed_external_allowed")
    name = unique("external-through")
    with pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", proc.port, credentials=pika.credentials.ExternalCredentials(),
            client_properties={"connection_name": name}, connection_attempts=1,
            socket_timeout=10)) as conn:
        conn.channel().queue_declare("", exclusive=True)
        (seen,) = connections(mtls_broker, named(name))
    # the client presented nothing: it is logged in as the proxy's certificate
    assert seen["user"] == PROXY_CN and seen["auth_mechanism"] == "EXTERNAL", seen


def test_ssl_module_agrees_the_broker_needs_a_certificate(mtls_broker: BrokerEndpoint,
                                                          pki: Pki) -> None:
    """The broker really is fail_if_no_peer_cert: a direct TLS client without a certificate
    gets no AMQP answer (what makes the tests above mean something)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            "localhost", mtls_broker.amqp_port, ssl_options=pika.SSLOptions(context, "localhost"),
            connection_attempts=1, socket_timeout=10))
