"""TLS for the integration tests: certificates made at test time (``trustme``) and RabbitMQ
nodes that speak only TLS (amqps and https), started from Debian's package like the plain
session broker. Registered for the whole suite by ``pytest_plugins`` in tests/conftest.py.

- ``pki``: one CA, the broker's certificate (localhost, 127.0.0.1), the proxy's client
  certificate (CN ``floodwall-proxy``), a client certificate for applications, another CA
  that signed none of them, an expired broker certificate from the right CA, and a second
  listener certificate (for rotation), all as PEM files.
- ``tls_broker``: amqps-only, https-only management; client certificates verified when
  given, not required.
- ``mtls_broker``: the same with ``fail_if_no_peer_cert = true`` and
  ``rabbitmq_auth_mechanism_ssl``: EXTERNAL logs in as the certificate's common name; user
  ``floodwall-proxy`` exists there without a password.
"""

from __future__ import annotations

import contextlib
import datetime
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
import trustme

from floodwall.dev.devbroker import BrokerEndpoint, BrokerRelease, BrokerTls, LocalBroker

PROXY_CN = "floodwall-proxy"
APP_CN = "orders-app"


@dataclass(frozen=True)
class Pki:
    """PEM files of one test PKI (see the module docstring)."""

    directory: Path
    ca: Path  # the CA everything below (but other_ca and rotated) comes from
    server_cert: Path  # localhost / 127.0.0.1, chain
    server_key: Path
    proxy_cert: Path  # CN floodwall-proxy: the proxy's client certificate
    proxy_key: Path
    app_cert: Path  # CN orders-app: an application's client certificate (listener mTLS)
    app_key: Path
    other_ca: Path  # a CA that signed nothing the brokers use
    other_cert: Path  # a client certificate from other_ca
    other_key: Path
    expired_cert: Path  # localhost, from ``ca``, expired in 2021
    expired_key: Path
    rotated_ca: Path  # the CA of the rotated listener certificate
    rotated_cert: Path  # localhost, from rotated_ca
    rotated_key: Path


def _write(leaf: trustme.LeafCert, directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    leaf.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return cert, key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other, rotated = trustme.CA(), trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    rotated.cert_pem.write_to_path(str(directory / "rotated-ca.pem"))
    server = _write(ca.issue_cert("localhost", "127.0.0.1"), directory, "server")
    proxy = _write(ca.issue_cert(PROXY_CN, common_name=PROXY_CN), directory, "proxy")
    app = _write(ca.issue_cert(APP_CN, common_name=APP_CN), directory, "app")
    other_leaf = _write(other.issue_cert(APP_CN, common_name=APP_CN), directory, "other")
    expired = _write(ca.issue_cert(
        "localhost", "127.0.0.1", not_before=datetime.datetime(2020, 1, 1),
        not_after=datetime.datetime(2021, 1, 1)), directory, "expired")
    rotated_leaf = _write(rotated.issue_cert("localhost", "127.0.0.1"), directory, "rotated")
    return Pki(directory, directory / "ca.pem", *server, *proxy, *app,
               directory / "other-ca.pem", *other_leaf, *expired,
               directory / "rotated-ca.pem", *rotated_leaf)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.contextmanager
def _tls_node(pki: Pki, require_client_cert: bool, release: BrokerRelease
              ) -> Iterator[LocalBroker]:
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-rabbit-tls-"))
    node = LocalBroker(workdir, tls=BrokerTls(pki.ca, pki.server_cert, pki.server_key,
                                              require_client_cert), release=release)
    node.start()
    try:
        yield node
    finally:
        node.remove()


@pytest.fixture(scope="session")
def tls_node(pki: Pki, broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    """The node behind ``tls_broker`` (for ``ctl``)."""
    with _tls_node(pki, require_client_cert=False, release=broker_release) as node:
        yield node


@pytest.fixture(scope="session")
def tls_broker(tls_node: LocalBroker) -> BrokerEndpoint:
    """amqps and https only; client certificates verified when presented."""
    return tls_node.endpoint


@pytest.fixture(scope="session")
def mtls_broker(pki: Pki, broker_release: BrokerRelease) -> Iterator[BrokerEndpoint]:
    """amqps with fail_if_no_peer_cert = true and SASL EXTERNAL; user floodwall-proxy."""
    with _tls_node(pki, require_client_cert=True, release=broker_release) as node:
        ep = node.endpoint
        quoted = urllib.parse.quote(PROXY_CN, safe="")
        ep.api("PUT", f"/api/users/{quoted}", {"password_hash": "", "tags": "monitoring"})
        ep.api("PUT", f"/api/permissions/%2F/{quoted}",
               {"configure": ".*", "write": ".*", "read": ".*"})
        yield ep


def tls_pika_params(ep: BrokerEndpoint, pki: Pki, cert: tuple[Path, Path] | None = None,
                    **kwargs: Any) -> pika.ConnectionParameters:
    """pika parameters for a TLS broker itself (not through the proxy)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    kwargs.setdefault("connection_attempts", 1)
    kwargs.setdefault("socket_timeout", 10)
    return pika.ConnectionParameters(
        "localhost", ep.amqp_port, ssl_options=pika.SSLOptions(context, "localhost"),
        credentials=pika.PlainCredentials(ep.username, ep.password), **kwargs)


def upstream_args(ep: BrokerEndpoint, pki: Pki, *more: str, client_cert: bool = False
                  ) -> tuple[str, ...]:
    """``floodwall run`` flags for amqps to ``ep`` (the name verified is localhost)."""
    args = ["--upstream-tls-ca", str(pki.ca)]
    if client_cert:
        args += ["--upstream-tls-cert", str(pki.proxy_cert), "--upstream-tls-key",
                 str(pki.proxy_key)]
    return (*args, *more)


def amqps(ep: BrokerEndpoint) -> str:
    return f"amqps://localhost:{ep.amqp_port}"
