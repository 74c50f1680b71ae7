"""Every seed of the corpus and every crash input the fuzzer found (and that was fixed) keeps
the harnesses' rule, replayed without atheris: plain bytes into ``tests.fuzz.harnesses``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.harnesses import TARGETS

HERE = Path(__file__).parent


def inputs(folder: str) -> list[tuple[str, Path]]:
    return [(path.parent.name, path) for path in sorted((HERE / folder).glob("*/*"))
            if path.parent.name in TARGETS and path.is_file()]


def test_every_target_has_seeds() -> None:
    assert {target for target, _ in inputs("corpus")} == set(TARGETS)


@pytest.mark.parametrize(("target", "path"), inputs("corpus"), ids=lambda v: getattr(v, "name", v))
def test_a_seed_keeps_the_rule(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())


@pytest.mark.parametrize(("target", "path"), inputs("crashes"),
                         ids=lambda v: getattr(v, "name", v))
def test_a_crash_found_stays_fixed(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())
