"""``floodwall check FILE...``: validates, prints the effective policies, reports every error
(``FILE:LINE:COLUMN: reason``) and warnings, exits 1 on a bad file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from floodwall.cli import main
from floodwall.control.policy import PolicyError, load_policies, parse_policies

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
    assert result.stderr == (f"{path}:6:13: policies[0] (a).resume: 2MiB is more than capacity "
                             "(1MiB); resume must be <= capacity\n")


def test_check_missing_file_exits_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1
    assert "none.yaml: cannot read: No such file or directory" in result.stderr


# --- every error in one run: the corpus of broken files ---------------------------------

CORPUS = Path(__file__).resolve().parent / "policy_corpus"
CORPUS_FILES = sorted(p.name for p in CORPUS.glob("*.yaml"))


def _has_errors(expected: str) -> bool:
    return any(line and ": warning: " not in line for line in expected.splitlines())


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_file_reports_every_problem(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``floodwall check`` on each file of tests/policy_corpus/: exactly the problems in
    its ``.expected`` file (``FILE:LINE:COLUMN: reason``, one per line, in file order),
    exit 1 when there is an error, 0 for warnings alone."""
    monkeypatch.chdir(CORPUS)
    expected = (CORPUS / name).with_suffix(".expected").read_text()
    result = CliRunner().invoke(main, ["check", name])
    assert result.stderr == expected
    assert result.exit_code == (1 if _has_errors(expected) else 0), result.output
    for line in result.stderr.splitlines():
        assert re.match(rf"{re.escape(name)}:\d+:\d+: ", line), line
    if result.exit_code == 0:
        assert result.stdout.startswith(f"# {name}: valid")


def test_many_errors_are_all_reported() -> None:
    expected = (CORPUS / "many_errors.expected").read_text().splitlines()
    assert len(expected) >= 15  # one run, not one error per run
    with pytest.raises(PolicyError) as caught:
        load_policies(CORPUS / "many_errors.yaml")
    assert len(caught.value.problems) == len(expected)
    assert caught.value.line == 6 and caught.value.column == 13  # the first one's place


def test_several_files_and_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CORPUS)
    stdin = (POLICIES_DIR / "demo.yaml").read_text()
    result = CliRunner().invoke(main, ["check", str(POLICIES_DIR / "example.yaml"),
                                       "bad_version.yaml", "-", "shadowed.yaml"], input=stdin)
    assert result.exit_code == 1  # one file is bad ...
    assert result.stderr == ((CORPUS / "bad_version.expected").read_text()
                             + (CORPUS / "shadowed.expected").read_text())
    # ... and the good ones are still printed, in order
    headers = [line for line in result.stdout.splitlines() if ": valid, " in line]
    assert [h.split(":")[0] for h in headers] == [f"# {POLICIES_DIR / 'example.yaml'}",
                                                  "# <stdin>", "# shadowed.yaml"]


def test_json_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CORPUS)
    result = CliRunner().invoke(main, ["check", "--output", "json", "many_errors.yaml",
                                       "shadowed.yaml", "--queue", "orders.eu.1"])
    assert result.exit_code == 1 and result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["valid"] is False
    bad, shadowed = doc["files"]
    assert bad["valid"] is False and bad["policies"] is None
    assert [f"{e['file']}:{e['line']}:{e['column']}: {e['reason']}" for e in bad["errors"]] \
        == (CORPUS / "many_errors.expected").read_text().splitlines()
    assert {e["severity"] for e in bad["errors"]} == {"error"}
    assert shadowed["valid"] is True and shadowed["errors"] == []
    assert len(shadowed["warnings"]) == 5
    assert {w["severity"] for w in shadowed["warnings"]} == {"warning"}
    invoices = shadowed["warnings"][0]
    assert (invoices["line"], invoices["column"]) == (7, 5)
    assert "'invoices'" in invoices["reason"] and "can never match" in invoices["reason"]
    by_name = {p["name"]: p for p in shadowed["policies"]}
    assert by_name["orders"]["capacity"] == 64 * 1024**2
    assert by_name["exact"]["policed"] is False
    assert shadowed["queues"] == [{"vhost": "/", "queue": "orders.eu.1", "policy": "orders"}]


def test_helm_style_numbers_are_whole_bytes_and_counts() -> None:
    """Helm renders plain numbers as floats (6.7108864e+07; 1e+06 even reads as a string):
    whole ones are accepted as the numbers they are."""
    policies = load_policies(CORPUS / "helm_rendered.yaml")
    (p,) = policies.policies
    assert (p.capacity, p.resume) == (64 * 1024**2, 48 * 1024**2)
    assert (p.max_messages, p.resume_messages) == (1_000_000, 750_000)
    assert p.spool.max_bytes == 1024**3
    for bad, reason in (("1.5", "whole number"), ("2.5e+00", "whole number")):
        with pytest.raises(PolicyError, match=reason):
            parse_policies(f"version: 1\npolicies:\n  - name: a\n    match: {{queue: a}}\n"
                           f"    capacity: {bad}\n")


# -- YAML the loader must turn into problems, never into a traceback --------------------------

LAUGHS = "version: 1\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True))
HOSTILE_YAML = [
    ("version: 1\npolicies:\n  - {name: a, match: {queue: q}, mode: !!bool maybe}\n",
     "3:40: YAML: 'maybe' is not a valid !!bool"),
    ("version: 1\npolicies:\n  - name: a\n    match: {queue: q}\n    capacity: !!int one\n",
     "5:15: YAML: 'one' is not a valid !!int"),
    ("version: !!timestamp x\n", "1:10: YAML: 'x' is not a valid !!timestamp"),
    ("version: !!float x\n", "1:10: YAML: 'x' is not a valid !!float"),
    ("version: 1\n!!int k: 3\n", "2:1: YAML: 'k' is not a valid !!int"),
    ("version: 1\npolicies:\n  - {name: !!binary '*', match: {queue: q}}\n",
     "3:12: policies[0] (*).name: expected a non-empty string, got a bytes"),
    ("version: 1\npolicies: !!python/object:os.system x\n",
     "2:11: YAML: could not determine a constructor"),
    ("version: 1\npolicies: &a [*a]\n", "2:11: policies[0]: expected a mapping, got a list"),
    ("version: 1\npolicies: " + "[" * 3000 + "]" * 3000 + "\n", "1:1: YAML: nested too deeply"),
    ("version: 1\npolicies: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
     "1:1: YAML: nested too deeply"),
    (LAUGHS, "2:1: top level: unknown key 'a'"),
    ("version: 1\npolicies:\n  - {name: a, match: {queue: *nothing}}\n",
     "3:30: YAML syntax: found undefined alias 'nothing'"),
    ("version: 1\x00\n", "1:11: YAML: character U+0000 is not allowed"),
]


@pytest.mark.parametrize(("text", "expected"), HOSTILE_YAML)
def test_hostile_yaml_is_a_file_line_problem(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policies(text, "p.yaml")
    assert any(str(p).startswith(f"p.yaml:{expected}") for p in caught.value.problems), \
        [str(p) for p in caught.value.problems]


@pytest.mark.parametrize(("text", "expected"), HOSTILE_YAML)
def test_check_prints_the_problem_and_no_traceback(text: str, expected: str,
                                                   tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"{path}:{expected}" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize("tag", ["int", "float", "bool", "null", "timestamp", "binary", "str",
                                 "seq", "map", "set", "omap", "pairs", "merge", "value",
                                 "python/tuple", "nonsense"])
@pytest.mark.parametrize("value", ["x", "1", "''", "[1]", "{a: 1}", "2001-13-45", "=",
                                   "0x", "~", "<<"])
def test_any_tag_on_any_field_is_a_policy_error(tag: str, value: str) -> None:
    for text in (f"version: !!{tag} {value}\n",
                 f"version: 1\npolicies:\n  - {{name: a, match: {{queue: q}}, "
                 f"capacity: !!{tag} {value}}}\n",
                 f"version: 1\npolicies:\n  - {{name: !!{tag} {value}, match: {{queue: q}}}}\n",
                 f"version: 1\n!!{tag} {value}: 1\n"):
        try:
            parse_policies(text, "p.yaml")
        except PolicyError as exc:
            assert all(p.line is not None for p in exc.problems)
