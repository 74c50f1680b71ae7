"""Listener TLS: clients reach floodwall over TLS (``--listen-tls``), beside the
plain listener; protocol detection works behind TLS (0-9-1 and 1.0 on one TLS port); client
certificates are required and refused with ``--listen-tls-client-ca``; the certificate is
rotated in place while a connection stays up.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import proton
import pytest
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint, free_port
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import direct_params, log_lines, pika_connection, temp_queue
from tests.integration.tls_fixtures import Pki

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120), pytest.mark.load_tolerant]


def start_tls(start_floodwall: Callable[..., ProxyProcess], cert: Path, key: Path,
              *more: str) -> tuple[ProxyProcess, int]:
    port = free_port()
    proc = start_floodwall("--listen-tls", f"127.0.0.1:{port}", "--listen-tls-cert", str(cert),
                           "--listen-tls-key", str(key), *more)
    return proc, port


def client_context(*cas: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for ca in cas:
        context.load_verify_locations(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def tls_params(port: int, context: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("localhost", port,
                                     ssl_options=pika.SSLOptions(context, "localhost"),
                                     connection_attempts=1, socket_timeout=10)


def proton_domain(pki: Pki, cert: tuple[Path, Path] | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None:
        domain.set_credentials(str(cert[0]), str(cert[1]), None)
    return domain


def served_certificate(port: int) -> bytes:
    """The DER of the certificate a new TLS handshake on ``port`` gets."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), 10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def leaf_der(pem_file: Path) -> bytes:
    text = pem_file.read_text()
    first = text[:text.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")]
    return ssl.PEM_cert_to_DER_cert(first)


def pika_round_trip(params: pika.ConnectionParameters, queue: str, body: bytes) -> None:
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, body)
        _, _, got = ch.basic_get(queue, auto_ack=True)
        assert got == body


def proton_round_trip(url: str, domain: SSLDomain, queue: str, body: bytes) -> None:
    conn = BlockingConnection(url, timeout=15, ssl_domain=domain, allowed_mechs="PLAIN")
    try:
        conn.create_sender(f"/amq/queue/{queue}").send(Message(body=body, durable=False))
        receiver = conn.create_receiver(f"/amq/queue/{queue}", credit=1)
        msg = receiver.receive(timeout=15)
        receiver.accept()
        assert bytes(msg.body) == body
    finally:
        conn.close()


def test_pika_and_proton_over_tls_beside_the_plain_listener(
        start_floodwall: Callable[..., ProxyProcess], pki: Pki) -> None:
    proc, port = start_tls(start_floodwall, pki.server_cert, pki.server_key)
    with temp_queue(proc.port) as queue:  # the plain listener
        # 0-9-1 and 1.0 on the one TLS port: detection runs on what TLS decrypts
        pika_round_trip(tls_params(port, client_context(pki.ca)), queue, b"0-9-1 over TLS")
        proton_round_trip(f"amqps://guest:guest@localhost:{port}", proton_domain(pki), queue,
                          b"1.0 over TLS")
        assert log_lines(proc.logfile, "started")[-1].count("listen_tls=127.0.0.1:") == 1
        # plain AMQP on the TLS port is a failed handshake, logged, nothing relayed
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", port, connection_attempts=1, socket_timeout=5))
        wait_for(lambda: log_lines(proc.logfile, "client_tls_failed"), 10,
                 what="client_tls_failed")
        assert proc.metric("floodwall_client_tls_failures_total") >= 1
        wait_for(lambda: proc.state()["connections"] == [], 10, what="no connection left")


def test_client_certificates_required_and_refused(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        pki: Pki) -> None:
    """With --listen off only the TLS listener is there, and it requires a certificate from
    --listen-tls-client-ca."""
    proc, port = start_tls(start_floodwall, pki.server_cert, pki.server_key,
                           "--listen-tls-client-ca", str(pki.ca), "--listen", "off")
    assert "listen=" not in log_lines(proc.logfile, "started")[-1]
    app = (pki.app_cert, pki.app_key)
    queue = queues("tls-listener")
    with pika.BlockingConnection(direct_params(broker)) as direct:
        direct.channel().queue_declare(queue)
    pika_round_trip(tls_params(port, client_context(pki.ca, cert=app)), queue,
                    b"with a certificate")
    proton_round_trip(f"amqps://guest:guest@localhost:{port}", proton_domain(pki, app),
                      queue, b"1.0 with a certificate")
    refused = 0
    for cert in (None, (pki.other_cert, pki.other_key)):  # none, and one of another CA
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(tls_params(port, client_context(pki.ca, cert=cert)))
        refused += 1
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqps://guest:guest@localhost:{port}", timeout=15,
                           ssl_domain=proton_domain(pki), allowed_mechs="PLAIN")
    refused += 1
    lines = wait_for(lambda: len(log_lines(proc.logfile, "client_tls_failed")) >= refused
                     and log_lines(proc.logfile, "client_tls_failed"), 10,
                     what="a client_tls_failed line per refused client")
    assert isinstance(lines, list)
    assert any("certificate" in line for line in lines), lines
    assert proc.metric("floodwall_client_tls_failures_total") == refused


def test_certificate_rotation_keeps_open_connections(
        start_floodwall: Callable[..., ProxyProcess], pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    proc, port = start_tls(start_floodwall, cert, key)
    assert served_certificate(port) == leaf_der(pki.server_cert)
    trusting_both = client_context(pki.ca, pki.rotated_ca)
    with temp_queue(proc.port) as queue, \
            pika.BlockingConnection(tls_params(port, trusting_both)) as before:
        ch = before.channel()
        ch.basic_publish("", queue, b"before")

        # rotate as the kubelet does: new files renamed into place
        for new, path in ((pki.rotated_key, key), (pki.rotated_cert, cert)):
            staged = path.with_suffix(".new")
            shutil.copy(new, staged)
            os.replace(staged, path)
        wait_for(lambda: log_lines(proc.logfile, "tls_reloaded"), 15, what="tls_reloaded")
        assert served_certificate(port) == leaf_der(pki.rotated_cert)

        # the connection made before the rotation carries on
        ch.basic_publish("", queue, b"after")
        got = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(2)]
        assert got == [b"before", b"after"]
        # a new one is made with the new certificate (verified against its CA only)
        pika_round_trip(tls_params(port, client_context(pki.rotated_ca)), queue, b"new")

        # a broken rotation (a key that does not load) keeps the certificate in force
        key.write_text("not a key\n")
        wait_for(lambda: log_lines(proc.logfile, "tls_reload_failed"), 15,
                 what="tls_reload_failed")
        assert served_certificate(port) == leaf_der(pki.rotated_cert)
        pika_round_trip(tls_params(port, client_context(pki.rotated_ca)), queue, b"still")
        with pika_connection(proc.port) as plain:
            assert plain.is_open
