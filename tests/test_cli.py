"""The command line: flags, FLOODWALL_* variables and --config, in that order of precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import proxy.io.app
from proxy.cli import main
from proxy.config import ProxySettings


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[ProxySettings]:
    runs: list[ProxySettings] = []
    monkeypatch.setattr(proxy.io.app, "run_proxy", runs.append)
    for var in ("FLOODWALL_LISTEN", "FLOODWALL_UPSTREAM", "FLOODWALL_ADMIN", "FLOODWALL_CONFIG",
                "FLOODWALL_DEPTH_INTERVAL", "FLOODWALL_MANAGEMENT_INTERVAL",
                "FLOODWALL_HOLD_BUDGET", "FLOODWALL_AMQP_USERNAME", "FLOODWALL_AMQP_PASSWORD",
                "FLOODWALL_AMQP_PASSWORD_FILE", "FLOODWALL_MANAGEMENT_USERNAME",
                "FLOODWALL_MANAGEMENT_PASSWORD", "FLOODWALL_MANAGEMENT_PASSWORD_FILE"):
        monkeypatch.delenv(var, raising=False)
    return runs


def test_flags(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--listen", "127.0.0.1:6000", "--upstream",
                                       "broker:5672", "--admin", "off"])
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert settings.listen == ("127.0.0.1", 6000)
    assert settings.upstream == ("broker", 5672)
    assert settings.admin is None


def test_precedence_flag_over_env_over_file(captured: list[ProxySettings], tmp_path: Path) -> None:
    cfg = tmp_path / "floodwall.yaml"
    cfg.write_text("listen: 127.0.0.1:7000\nupstream: filebroker:5672\nconnect-timeout: 2.5\n")
    env = {"FLOODWALL_UPSTREAM": "envbroker:5672"}
    result = CliRunner().invoke(
        main, ["run", "--config", str(cfg), "--listen", "127.0.0.1:7001"], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert settings.listen == ("127.0.0.1", 7001)  # flag beats file
    assert settings.upstream == ("envbroker", 5672)  # env beats file
    assert settings.connect_timeout == 2.5  # file beats default


def test_unknown_config_key_is_refused_by_name(captured: list[ProxySettings],
                                               tmp_path: Path) -> None:
    cfg = tmp_path / "floodwall.yaml"
    cfg.write_text("listn: 127.0.0.1:7000\n")
    result = CliRunner().invoke(main, ["run", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "unknown setting 'listn'" in result.output
    assert not captured


def test_bad_address_is_a_usage_error(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--upstream", "broker:notaport"])
    assert result.exit_code == 2
    assert "--upstream" in result.output
    assert not captured


def test_flow_flags_take_units(captured: list[ProxySettings], tmp_path: Path) -> None:
    env = {"FLOODWALL_HOLD_BUDGET": "1MiB", "FLOODWALL_AMQP_USERNAME": "prober",
           "FLOODWALL_MANAGEMENT_PASSWORD": "mgmt-secret"}
    result = CliRunner().invoke(main, ["run", "--upstream", "mq:5672", "--depth-interval",
                                       "100ms", "--management-interval", "2.5"], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert (settings.depth_interval, settings.management_interval) == (0.1, 2.5)
    assert settings.hold_budget == 1024**2
    assert settings.effective_management_url == "http://mq:15672"
    creds = settings.effective_amqp_credentials
    assert (creds.username, creds.password) == ("prober", "mgmt-secret")


def test_defaults_of_flow_flags(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--management", "http://m:15672"])
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert (settings.depth_interval, settings.management_interval) == (0.2, 5.0)
    assert settings.hold_budget == 16 * 1024**2
    assert settings.effective_management_url == "http://m:15672"


@pytest.mark.parametrize(("flag", "value", "reason"), [
    ("--depth-interval", "0", "more than 0"),
    ("--depth-interval", "5 parsecs", "unknown unit"),
    ("--hold-budget", "16mb", "did you mean 'MB'"),
])
def test_bad_flow_flags_are_usage_errors(captured: list[ProxySettings], flag: str, value: str,
                                         reason: str) -> None:
    result = CliRunner().invoke(main, ["run", flag, value])
    assert result.exit_code == 2
    assert flag in result.output and reason in result.output
    assert not captured
