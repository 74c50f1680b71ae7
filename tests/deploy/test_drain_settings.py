"""--drain-timeout / FLOODWALL_DRAIN_TIMEOUT: parsed like every duration,
0 allowed (do not wait), negative refused."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import floodwall.io.app
from floodwall.cli import main
from floodwall.ops.config import DEFAULT_DRAIN_TIMEOUT, ProxySettings

pytestmark = pytest.mark.load_tolerant


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[ProxySettings]:
    runs: list[ProxySettings] = []
    monkeypatch.setattr(floodwall.io.app, "run_proxy", runs.append)
    monkeypatch.delenv("FLOODWALL_DRAIN_TIMEOUT", raising=False)
    monkeypatch.delenv("FLOODWALL_CONFIG", raising=False)
    return runs


@pytest.mark.parametrize(("args", "env", "seconds"), [
    ([], {}, DEFAULT_DRAIN_TIMEOUT),
    (["--drain-timeout", "45s"], {}, 45.0),
    (["--drain-timeout", "1m"], {"FLOODWALL_DRAIN_TIMEOUT": "5s"}, 60.0),  # flag wins
    ([], {"FLOODWALL_DRAIN_TIMEOUT": "1500ms"}, 1.5),
    ([], {"FLOODWALL_DRAIN_TIMEOUT": "0"}, 0.0),
])
def test_drain_timeout(captured: list[ProxySettings], args: list[str], env: dict[str, str],
                       seconds: float) -> None:
    result = CliRunner().invoke(main, ["run", "--admin", "off", *args], env=env)
    assert result.exit_code == 0, result.output
    assert captured[-1].drain_timeout == seconds
    assert DEFAULT_DRAIN_TIMEOUT == 30.0


def test_bad_drain_timeout_is_refused(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--drain-timeout", "-1s"])
    assert result.exit_code == 2
    assert "--drain-timeout" in result.output
    assert not captured
