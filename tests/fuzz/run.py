"""Run one harness under atheris (libFuzzer, coverage-guided):
``python -m tests.fuzz.run TARGET [libFuzzer flags...]``.

TARGET is one of ``tests.fuzz.harnesses.TARGETS``. The corpus it grows is kept under
``build/fuzz/corpus/TARGET`` (not in the tree), seeded from the tree's
``tests/fuzz/corpus/TARGET``; a crash input is written to ``build/fuzz/crashes/TARGET/``
(keep it in ``tests/fuzz/crashes/TARGET/`` as a regression test); ``tests/fuzz/dicts/
TARGET.dict`` is its dictionary of tokens. Flags the caller does not
give default to: ``-max_len=16384 -timeout=20 -rss_limit_mb=2048``. ``make fuzz`` runs every
target for ``FUZZ_SECONDS`` (``-max_total_time``). ``FUZZ_SKIP_KNOWN=1`` takes a failure
like one of ``tests/fuzz/known/`` as a pass (``harnesses.past_known``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {"-max_len": "16384", "-timeout": "20", "-rss_limit_mb": "2048"}

# Coverage is taken of the layers the harnesses drive (and the codecs under them), not of
# io/ and ops/, which the fakes import but no harness runs.
INSTRUMENTED = ["floodwall.wire", "floodwall.enforce", "floodwall.control", "floodwall.spool",
                "pamqp", "yaml"]

with atheris.instrument_imports(include=INSTRUMENTED):
    from tests.fuzz.harnesses import TARGETS, past_known


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in TARGETS:
        print(f"usage: python -m tests.fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags]",
              file=sys.stderr)
        return 2
    target = argv[1]
    flags = argv[2:]
    given = {f.split("=", 1)[0] for f in flags if f.startswith("-")}
    flags += [f"{k}={v}" for k, v in DEFAULTS.items() if k not in given]
    work = ROOT / "build" / "fuzz" / "corpus" / target
    crashes = ROOT / "build" / "fuzz" / "crashes" / target
    work.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(parents=True, exist_ok=True)
    if "-artifact_prefix" not in given:
        flags.append(f"-artifact_prefix={crashes}/")
    tokens = ROOT / "tests" / "fuzz" / "dicts" / f"{target}.dict"
    if "-dict" not in given and tokens.exists():
        flags.append(f"-dict={tokens}")
    seeds = ROOT / "tests" / "fuzz" / "corpus" / target
    dirs = [] if any(not f.startswith("-") for f in flags) else [str(work), str(seeds)]
    harness = TARGETS[target]
    if os.environ.get("FUZZ_SKIP_KNOWN") == "1":
        harness = past_known(harness)
    atheris.Setup([argv[0], *flags, *dirs], harness)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
