"""Each harness under atheris for a few seconds (``FUZZ_SMOKE_SECONDS``, default 8): the
instrumented run starts, reads its seeds and mutates them without breaking the rule. The long
runs are ``make fuzz`` (docs/fuzzing.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.harnesses import TARGETS

ROOT = Path(__file__).resolve().parents[2]
SECONDS = int(os.environ.get("FUZZ_SMOKE_SECONDS", "8"))


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is in the test extra; not installed here")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", target, f"-max_total_time={SECONDS}",
         "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(corpus),
         str(ROOT / "tests" / "fuzz" / "corpus" / target)],
        cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 120)
    found = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    kept = ROOT / "build" / "fuzz" / "crashes" / target
    for name in found:  # kept where `make fuzz` keeps them: the temporary folder goes
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, kept / name)
    tail = "\n".join(run.stderr.splitlines()[-40:])
    assert run.returncode == 0 and not found, \
        f"{target}: exit {run.returncode}, kept in {kept}: {found}\n{tail}"
    executed = [line for line in run.stderr.splitlines()
                if line.startswith("stat::number_of_executed_units:")]
    assert executed and int(executed[0].split(":")[-1]) > 0, tail
