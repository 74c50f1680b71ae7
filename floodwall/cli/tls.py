"""The ``--upstream`` and ``--upstream-tls-*`` options, shared by ``floodwall run`` and
``floodwall spool replay``, and the one ``UpstreamTls`` value they make."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from floodwall.ops.config import ConfigError, TlsVersion, UpstreamTls, parse_upstreams

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(dir_okay=False)
_VERSIONS = click.Choice([v.value for v in TlsVersion])


def upstream_tls_options(command: F) -> F:
    """Add the ``--upstream-tls-*`` options (each with its FLOODWALL_* variable)."""
    options = [
        click.option("--upstream-tls-ca", type=_FILE, default=None,
                     envvar="FLOODWALL_UPSTREAM_TLS_CA",
                     help="CA file (PEM) the broker's certificate is verified against; "
                          "default: the system's trust store."),
        click.option("--upstream-tls-cert", type=_FILE, default=None,
                     envvar="FLOODWALL_UPSTREAM_TLS_CERT",
                     help="Client certificate (PEM, chain) the proxy presents to the broker."),
        click.option("--upstream-tls-key", type=_FILE, default=None,
                     envvar="FLOODWALL_UPSTREAM_TLS_KEY",
                     help="The client certificate's private key (PEM, unencrypted)."),
        click.option("--upstream-tls-server-name", default=None, metavar="NAME",
                     envvar="FLOODWALL_UPSTREAM_TLS_SERVER_NAME",
                     help="Name sent as SNI and verified in the broker's certificate; "
                          "default: the upstream host."),
        click.option("--upstream-tls-insecure", is_flag=True, default=False,
                     envvar="FLOODWALL_UPSTREAM_TLS_INSECURE",
                     help="Do not verify the broker's certificate (warned at start-up and "
                          "in /readyz). For tests only."),
        click.option("--upstream-tls-min-version", type=_VERSIONS, default="1.2",
                     show_default=True, envvar="FLOODWALL_UPSTREAM_TLS_MIN_VERSION",
                     help="Lowest TLS version accepted from the broker."),
        click.option("--upstream-tls-sasl-external", is_flag=True, default=False,
                     envvar="FLOODWALL_UPSTREAM_TLS_SASL_EXTERNAL",
                     help="The proxy's own connections log in with SASL EXTERNAL (as the "
                          "client certificate's subject) instead of PLAIN."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def upstream_settings(upstream: str, *, upstream_tls_ca: str | None,
                      upstream_tls_cert: str | None, upstream_tls_key: str | None,
                      upstream_tls_server_name: str | None, upstream_tls_insecure: bool,
                      upstream_tls_min_version: str, upstream_tls_sasl_external: bool,
                      relay_external: bool = False
                      ) -> tuple[tuple[tuple[str, int], ...], UpstreamTls | None]:
    """The nodes ((host, port), ...) and the TLS settings (None: plain) from ``--upstream``
    and the ``--upstream-tls-*`` options; ``ConfigError`` for what cannot work together."""
    nodes, tls = parse_upstreams(upstream)
    given = {
        "--upstream-tls-ca": upstream_tls_ca, "--upstream-tls-cert": upstream_tls_cert,
        "--upstream-tls-key": upstream_tls_key,
        "--upstream-tls-server-name": upstream_tls_server_name,
        "--upstream-tls-insecure": upstream_tls_insecure,
        "--upstream-tls-sasl-external": upstream_tls_sasl_external,
        "--upstream-tls-relay-external": relay_external,
    }
    if not tls:
        named = [flag for flag, value in given.items() if value]
        if named:
            raise ConfigError(f"{', '.join(named)} given, but --upstream {upstream!r} is "
                              "plain: write amqps://HOST[:PORT] for TLS to the broker")
        return nodes, None
    if upstream_tls_insecure and upstream_tls_ca:
        raise ConfigError("--upstream-tls-insecure and --upstream-tls-ca: choose one "
                          "(insecure verifies nothing)")
    settings = UpstreamTls.checked(
        ca=Path(upstream_tls_ca) if upstream_tls_ca else None,
        cert=Path(upstream_tls_cert) if upstream_tls_cert else None,
        key=Path(upstream_tls_key) if upstream_tls_key else None,
        server_name=upstream_tls_server_name, insecure=upstream_tls_insecure,
        min_version=TlsVersion.parse(upstream_tls_min_version, "--upstream-tls-min-version"),
        sasl_external=upstream_tls_sasl_external, relay_external=relay_external)
    return nodes, settings
