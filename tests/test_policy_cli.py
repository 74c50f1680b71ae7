"""``floodwall check FILE``: validates, prints the effective policies, exits 1 on a bad file."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from floodwall.cli import main
from floodwall.control.policy import load_policies, parse_policies

POLICIES_DIR = Path(__file__).resolve().parent.parent / "policies"


def test_check_prints_effective_policies() -> None:
    path = POLICIES_DIR / "example.yaml"
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"# {path}: valid, 3 policies, defaults for 1 vhost." in out
    assert "capacity: 64MiB" in out and "67108864 bytes" in out
    assert "resume: 48MiB" in out
    assert "overflow: spool" in out
    assert "NOTE: spool needs --spool-dir at run time (acts as hold without it)" in out
    # the audit policy's inherited and defaulted fields are resolved
    audit = out[out.index('name: "audit"'):out.index('name: "scratch-exempt"')]
    assert "resume: 512KiB" in audit and "deadline: 500ms" in audit
    assert "spool: {max_bytes: 1GiB, fsync: group, group_commit_ms: 10}" in audit
    assert "NOTE" not in audit
    assert "exempt (not policed)" in out
    assert result.stderr == ""
    # the output is itself a policy file with the same effect
    assert parse_policies(out) == load_policies(path)


def test_check_demo_and_queue_lookup() -> None:
    result = CliRunner().invoke(main, ["check", str(POLICIES_DIR / "demo.yaml"),
                                       "--queue", "demo.orders", "--queue", "other"])
    assert result.exit_code == 0, result.output
    assert "capacity: 256KiB" in result.stdout and "resume: 192KiB" in result.stdout
    assert "deadline: 2m" in result.stdout
    assert "# queue 'demo.orders' in vhost '/': policy 'demo-orders'" in result.stdout
    assert "# queue 'other' in vhost '/': not policed" in result.stdout


def test_check_bad_file_exits_1_with_file_line_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\npolicies:\n  - name: a\n    match: {queue: a}\n"
                    "    capacity: 1MiB\n    resume: 2MiB\n")
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"{path}:6: policies[0] (a).resume: 2MiB is more than capacity "
                             "(1MiB); resume must be <= capacity\n")


def test_check_missing_file_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1
    assert "none.yaml: cannot read: No such file or directory" in result.stderr
