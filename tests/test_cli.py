"""The command line: flags, FLOODWALL_* variables and --config, in that order of precedence."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import floodwall.io.app
from floodwall.cli import main, run
from floodwall.ops.config import ProxySettings


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[ProxySettings]:
    runs: list[ProxySettings] = []
    monkeypatch.setattr(floodwall.io.app, "run_proxy", runs.append)
    for var in ("FLOODWALL_LISTEN", "FLOODWALL_UPSTREAM", "FLOODWALL_ADMIN", "FLOODWALL_CONFIG",
                "FLOODWALL_DEPTH_INTERVAL", "FLOODWALL_MANAGEMENT_INTERVAL",
                "FLOODWALL_HOLD_BUDGET", "FLOODWALL_AMQP_USERNAME", "FLOODWALL_AMQP_PASSWORD",
                "FLOODWALL_AMQP_PASSWORD_FILE", "FLOODWALL_MANAGEMENT_USERNAME",
                "FLOODWALL_MANAGEMENT_PASSWORD", "FLOODWALL_MANAGEMENT_PASSWORD_FILE",
                "FLOODWALL_LISTEN_TLS", "FLOODWALL_UPSTREAM_TLS_CA", "FLOODWALL_UPSTREAM_TLS_CERT",
                "FLOODWALL_UPSTREAM_TLS_KEY", "FLOODWALL_UPSTREAM_TLS_INSECURE",
                "FLOODWALL_MANAGEMENT_TLS_CA"):
        monkeypatch.delenv(var, raising=False)
    return runs


def test_flags(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--listen", "127.0.0.1:6000", "--upstream",
                                       "broker:5672", "--admin", "off"])
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert settings.listen == ("127.0.0.1", 6000)
    assert settings.upstreams == (("broker", 5672),)
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
    assert settings.upstreams == (("envbroker", 5672),)  # env beats file
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
    assert settings.effective_management_urls == ("http://mq:15672",)
    creds = settings.effective_amqp_credentials
    assert (creds.username, creds.password) == ("prober", "mgmt-secret")


def test_defaults_of_flow_flags(captured: list[ProxySettings]) -> None:
    result = CliRunner().invoke(main, ["run", "--management", "http://m:15672"])
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert (settings.depth_interval, settings.management_interval) == (0.2, 5.0)
    assert settings.hold_budget == 8 * 1024**2
    assert settings.effective_management_urls == ("http://m:15672",)


def test_a_login_in_the_management_url_is_refused(captured: list[ProxySettings]) -> None:
    for args, env in ((["--management", "http://admin:s3cr3t@m:15672"], {}),
                      ([], {"FLOODWALL_MANAGEMENT": "http://admin:s3cr3t@m:15672"})):
        result = CliRunner().invoke(main, ["run", *args], env=env)
        assert result.exit_code == 2 and captured == []
        assert "no login in the URL" in result.output
        assert "FLOODWALL_MANAGEMENT_PASSWORD_FILE" in result.output
        assert "s3cr3t" not in result.output


def test_memory_budget_from_the_cgroup_limit(captured: list[ProxySettings], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` (the default): a third of the container's limit (v2's ``memory.max`` first,
    then v1's ``memory.limit_in_bytes``); "max" and v1's near-2**63 mean no limit."""
    import floodwall.cli as cli

    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(cli, "CGROUP_FILES", (v2, v1))
    cases = [(None, None, 96 * 1024**2), ("268435456\n", None, 268435456 // 3),
             ("max\n", "536870912", 536870912 // 3), (None, "9223372036854771712", 96 * 1024**2),
             ("max", None, 96 * 1024**2)]
    for v2_text, v1_text, expected in cases:
        for path, text in ((v2, v2_text), (v1, v1_text)):
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(text)
        captured.clear()
        result = CliRunner().invoke(main, ["run"])
        assert result.exit_code == 0, result.output
        assert captured[0].memory_budget == expected, (v2_text, v1_text)
        assert ("of the cgroup" in captured[0].memory_budget_source) == \
            (expected != 96 * 1024**2)
    captured.clear()
    result = CliRunner().invoke(main, ["run", "--memory-budget", "200MiB"])
    assert result.exit_code == 0, result.output
    assert captured[0].memory_budget == 200 * 1024**2
    result = CliRunner().invoke(main, ["run", "--memory-budget", "lots"])
    assert result.exit_code == 2 and "--memory-budget" in result.output


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


def test_amqps_upstream_and_tls_flags(captured: list[ProxySettings], tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "c.pem", "c.key"))
    for f in (ca, cert, key):
        f.write_text("x")
    result = CliRunner().invoke(main, [
        "run", "--upstream", "amqps://mq.example.com", "--upstream-tls-ca", str(ca),
        "--upstream-tls-cert", str(cert), "--upstream-tls-key", str(key),
        "--upstream-tls-server-name", "rabbit.internal", "--listen", "off",
        "--listen-tls", "0.0.0.0:5671", "--listen-tls-cert", str(cert), "--listen-tls-key",
        str(key), "--listen-tls-client-ca", str(ca)],
        env={"FLOODWALL_UPSTREAM_TLS_SASL_EXTERNAL": "true"})
    assert result.exit_code == 0, result.output
    (settings,) = captured
    assert settings.upstreams == (("mq.example.com", 5671),)
    tls = settings.upstream_tls
    assert tls is not None and tls.ca == ca and tls.cert == cert and tls.sasl_external
    assert tls.name_for("mq.example.com") == "rabbit.internal" and not tls.relay_external
    assert settings.listen is None and settings.listen_tls == ("0.0.0.0", 5671)
    assert settings.listener_tls is not None and settings.listener_tls.client_ca == ca
    assert settings.effective_management_urls == ("https://mq.example.com:15671",)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--upstream", "ftp://mq"], "is not amqp:// or amqps://"),
        (["--upstream", "mq:5672", "--upstream-tls-insecure"], "is plain: write amqps://"),
        (["--upstream", "amqps://mq", "--upstream-tls-relay-external"], "relay-external needs"),
        (["--listen", "off"], "--listen off needs --listen-tls"),
        (["--listen-tls", ":5671"], "--listen-tls needs --listen-tls-cert"),
        (["--listen-tls-cert", "x.pem"], "without --listen-tls"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused(captured: list[ProxySettings],
                                                   args: list[str], fragment: str) -> None:
    result = CliRunner().invoke(main, ["run", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert not captured


def test_a_key_that_does_not_load_refuses_to_start(tmp_path: Path) -> None:
    """The contexts are built before anything listens: a bad file is exit 1 with its flag."""
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    result = CliRunner().invoke(main, [
        "run", "--listen", "127.0.0.1:0", "--admin", "off", "--listen-tls", "127.0.0.1:0",
        "--listen-tls-cert", str(cert), "--listen-tls-key", str(key)])
    assert result.exit_code == 1, result.output
    assert "refusing to start: --listen-tls-cert/-key/-client-ca:" in result.output


# --- the README's flag table -----------------------------------------------------------------
def _flag_table() -> list[list[str]]:
    """The rows of README.md's `floodwall run` table, as cells (``\\|`` is a literal bar)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("| flag | variable | default | meaning |"):]
    table = table[:table.index("\n\n")]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows.append(cells)
    return rows


def _variables(cell: str) -> set[str]:
    """``FLOODWALL_X_CERT``, ``_KEY``: the abbreviation takes the previous name's prefix."""
    found: set[str] = set()
    previous = ""
    for name in re.findall(r"`(FLOODWALL_[A-Z0-9_]+|_[A-Z0-9_]+)`", cell):
        if name.startswith("_"):
            name = previous.rsplit("_", 1)[0] + name
        found.add(name)
        previous = name
    return found


def test_every_run_flag_is_in_the_readme_table() -> None:
    """Each option of `floodwall run` has a row: its flag, its variable, its default."""
    rows = _flag_table()
    assert all(len(r) == 4 for r in rows), [r for r in rows if len(r) != 4]
    by_flag = {flag: row for row in rows for flag in re.findall(r"`(--[a-z0-9-]+)", row[0])}
    options = [p for p in run.params if isinstance(p, click.Option)]
    for option in options:
        (flag,) = [o for o in option.opts if o.startswith("--")]
        assert flag in by_flag, f"{flag} has no row in README.md's flag table"
        row = by_flag[flag]
        assert option.envvar in _variables(row[1]), f"{flag}: {option.envvar} not in {row[1]}"
        default = option.default
        if option.is_flag:
            assert "off" in row[2], f"{flag}: default {row[2]!r}"
        elif isinstance(default, str | int | float) and not isinstance(default, bool):
            text = f"{default:g}" if isinstance(default, float) else str(default)
            assert f"`{text}`" in row[2], f"{flag}: default {text!r}, README says {row[2]!r}"
    documented = set(by_flag)
    known = {o for p in options for o in p.opts}
    assert documented <= known, f"README lists flags `floodwall run` lacks: {documented - known}"
