"""Settings parsing: addresses and the management API's credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import (
    AmqpCredentials,
    ConfigError,
    ManagementCredentials,
    ProxySettings,
    parse_hostport,
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
    assert ProxySettings(("0.0.0.0", 5673), ("::1", 5672)).effective_management_url == (
        "http://[::1]:15672")
    settings = ProxySettings(("0.0.0.0", 5673), ("mq", 5672), management_url="https://m/")
    assert settings.effective_management_url == "https://m/"
