"""Settings parsing: addresses and the management API's credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from floodwall.ops.config import (
    AmqpCredentials,
    ConfigError,
    ListenerTls,
    ManagementCredentials,
    ProxySettings,
    TlsVersion,
    UpstreamTls,
    parse_hostport,
    parse_management_url,
    parse_upstream,
    parse_upstreams,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:5673", ("0.0.0.0", 5673)),
        ("rabbitmq:5672", ("rabbitmq", 5672)),
        (":5673", ("0.0.0.0", 5673)),
        ("5673", ("0.0.0.0", 5673)),
        ("[::1]:5673", ("::1", 5673)),
    ],
)
def test_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, "--listen") == expected


@pytest.mark.parametrize("text", ["rabbitmq", "host:port", "host:70000"])
def test_bad_hostport_names_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match="--upstream"):
        parse_hostport(text, "--upstream")


def test_credentials_default_to_guest() -> None:
    creds = ManagementCredentials.from_environment({})
    assert (creds.username, creds.password) == ("guest", "guest")


def test_password_file_wins_and_is_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    creds = ManagementCredentials.from_environment({
        "FLOODWALL_MANAGEMENT_USERNAME": "ops",
        "FLOODWALL_MANAGEMENT_PASSWORD": "ignored",
        "FLOODWALL_MANAGEMENT_PASSWORD_FILE": str(secret),
    })
    assert (creds.username, creds.password) == ("ops", "s3cret")
    assert "s3cret" not in repr(creds)


def test_missing_password_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PASSWORD_FILE"):
        ManagementCredentials.from_environment(
            {"FLOODWALL_MANAGEMENT_PASSWORD_FILE": str(tmp_path / "nope")})


def test_amqp_credentials_fall_back_to_management_ones_one_by_one(tmp_path: Path) -> None:
    secret = tmp_path / "amqp-password"
    secret.write_text("amqp-secret\n")
    mgmt = ManagementCredentials("ops", "mgmt-secret")
    assert AmqpCredentials.from_environment({}, mgmt) == AmqpCredentials("ops", "mgmt-secret")
    creds = AmqpCredentials.from_environment(
        {"FLOODWALL_AMQP_PASSWORD_FILE": str(secret)}, mgmt)
    assert creds == AmqpCredentials("ops", "amqp-secret")
    assert "secret" not in repr(creds)
    with pytest.raises(ConfigError, match="FLOODWALL_AMQP_PASSWORD_FILE"):
        AmqpCredentials.from_environment(
            {"FLOODWALL_AMQP_PASSWORD_FILE": str(tmp_path / "nope")}, mgmt)


def test_management_url_defaults_to_the_upstream_host() -> None:
    assert ProxySettings(("0.0.0.0", 5673), (("::1", 5672),)).effective_management_urls == (
        "http://[::1]:15672",)
    settings = ProxySettings(("0.0.0.0", 5673), (("mq", 5672),), management_url="https://m/")
    assert settings.effective_management_urls == ("https://m/",)
    cluster = ProxySettings(None, (("a", 5672), ("b", 5672)))
    assert cluster.effective_management_urls == ("http://a:15672", "http://b:15672")
    listed = ProxySettings(None, (("a", 5672),), management_url="http://a:15672, http://b:1/")
    assert listed.effective_management_urls == ("http://a:15672", "http://b:1/")


def test_prometheus_urls_default_to_each_management_host() -> None:
    cluster = ProxySettings(None, (("a", 5672), ("b", 5672)))
    assert cluster.effective_prometheus_urls == ("http://a:15692", "http://b:15692")
    same_host = ProxySettings(None, (("a", 5672),),
                              management_url="https://a:15671, https://a:15672")
    assert same_host.effective_prometheus_urls == ("https://a:15692",)  # once per host
    given = ProxySettings(None, (("a", 5672),), prometheus_url="http://p:1, http://q:2/")
    assert given.effective_prometheus_urls == ("http://p:1", "http://q:2/")
    assert ProxySettings(None, (("a", 5672),), prometheus_url="").effective_prometheus_urls \
        == ()


# -- TLS ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rabbitmq:5672", ("rabbitmq", 5672, False)),
        ("amqp://rabbitmq", ("rabbitmq", 5672, False)),
        ("amqp://rabbitmq:5673/", ("rabbitmq", 5673, False)),
        ("amqps://rabbitmq", ("rabbitmq", 5671, True)),
        ("AMQPS://mq.example.com:15671", ("mq.example.com", 15671, True)),
        ("amqps://[::1]", ("::1", 5671, True)),
    ],
)
def test_upstream_schemes(text: str, expected: tuple[str, int, bool]) -> None:
    assert parse_upstream(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("https://rabbitmq:5671", "scheme 'https'"),
        ("amqps://guest:guest@rabbitmq", "no login in the URL"),
        ("amqps://rabbitmq/orders", "clients choose their vhost"),
        ("amqps://rabbitmq:99999", "port out of range"),
        ("amqps://", "names no host"),
    ],
)
def test_bad_upstreams_are_refused_with_the_reason(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="--upstream") as info:
        parse_upstream(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://rabbitmq:15672", "http://rabbitmq:15672"),
        ("https://mq.example.com/rabbitmq/", "https://mq.example.com/rabbitmq"),
        (" HTTP://[::1]:15672 ", "HTTP://[::1]:15672"),
    ],
)
def test_management_urls(text: str, expected: str) -> None:
    assert parse_management_url(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("http://admin:s3cr3t@rabbitmq:15672", "FLOODWALL_MANAGEMENT_PASSWORD_FILE"),
        ("https://admin@rabbitmq", "no login in the URL"),
        ("http://:s3cr3t@rabbitmq", "no login in the URL"),
        ("http://admin:s3cr3t@rabbitmq:99999", "valid port"),
        ("amqp://rabbitmq:15672", "scheme 'amqp'"),
        ("rabbitmq:15672", "scheme 'rabbitmq'"),
        ("http://", "names no host"),
        ("http://rabbitmq:15672/?x=s3cr3t", "no query"),
    ],
)
def test_bad_management_urls_are_refused_without_repeating_them(text: str,
                                                                 fragment: str) -> None:
    with pytest.raises(ConfigError, match="--management") as info:
        parse_management_url(text)
    assert fragment in str(info.value)
    assert "s3cr3t" not in str(info.value)


# -- a cluster's nodes ------------------------------------------------------------------------
def test_a_list_of_nodes_keeps_its_order() -> None:
    assert parse_upstreams("a:5672, b.mq.svc:5673,10.0.0.3:5672,[::1]:5674") == (
        (("a", 5672), ("b.mq.svc", 5673), ("10.0.0.3", 5672), ("::1", 5674)), False)
    assert parse_upstreams("amqps://a,amqps://b:5676") == ((("a", 5671), ("b", 5676)), True)
    assert parse_upstreams("rabbitmq:5672") == ((("rabbitmq", 5672),), False)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a:5672,,b:5672", "empty item"),
        ("a:5672,", "empty item"),
        ("", "names no broker"),
        ("a:5672 b:5672", "is not a host name"),
        ("a_b!:5672", "is not a host name"),
        ("-a:5672", "is not a host name"),
        ("amqps://a,b:5672", "mixes amqps:// and plain"),
        ("a:5672,a:5672", "named twice"),
        ("a:5672,https://b", "scheme 'https'"),
        ("a:5672,b:x", "is not HOST:PORT"),
    ],
)
def test_a_bad_list_of_nodes_is_refused_at_start(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="--upstream") as info:
        parse_upstreams(text)
    assert fragment in str(info.value)


def test_upstream_tls_refuses_what_cannot_work(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="go together"):
        UpstreamTls.checked(cert=cert)
    with pytest.raises(ConfigError, match="sasl-external needs"):
        UpstreamTls.checked(sasl_external=True)
    with pytest.raises(ConfigError, match="relay-external needs"):
        UpstreamTls.checked(relay_external=True)
    with pytest.raises(ConfigError, match="--upstream-tls-ca: cannot read"):
        UpstreamTls.checked(ca=tmp_path / "missing.pem")
    tls = UpstreamTls.checked(ca=cert, server_name="mq.internal")
    assert tls.name_for("10.0.0.1") == "mq.internal"
    assert UpstreamTls().name_for("rabbitmq") == "rabbitmq"
    assert TlsVersion.parse("1.3", "--x") is TlsVersion.TLS1_3
    with pytest.raises(ConfigError, match=r"1\.1"):
        TlsVersion.parse("1.1", "--upstream-tls-min-version")


def test_management_url_is_https_on_15671_with_an_amqps_upstream(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    settings = ProxySettings(("0.0.0.0", 5673), (("mq", 5671),), upstream_tls=UpstreamTls(ca=ca))
    assert settings.effective_management_urls == ("https://mq:15671",)
    assert settings.effective_management_tls.ca == ca  # the upstream's CA by default
    assert ListenerTls.checked(ca, ca).files == (ca, ca)
    with pytest.raises(ConfigError, match="--listen-tls needs"):
        ListenerTls.checked(None, ca)
