"""Settings parsing: addresses and the management API's credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, ManagementCredentials, parse_hostport


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
