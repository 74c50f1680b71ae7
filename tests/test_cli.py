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
    for var in ("FLOODWALL_LISTEN", "FLOODWALL_UPSTREAM", "FLOODWALL_ADMIN", "FLOODWALL_CONFIG"):
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
