"""The crash inputs of defects known when the harnesses were written (``tests/fuzz/known/``):
each must keep the harness's rule once its fix is in. Until then they fail, by design: a
short content header (struct.error out of the 0-9-1 gate), the frame limit taken from the
client's tune-ok, spool captures past the spool's limit (0-9-1 and 1.0), YAML tags past the
policy loader, stray entries in a spool directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.harnesses import TARGETS
from tests.fuzz.test_corpus import inputs

KNOWN = inputs("known")


def test_the_known_inputs_are_there() -> None:
    assert {target for target, _ in KNOWN} == set(TARGETS)
    assert all(path.stat().st_size for _, path in KNOWN)


@pytest.mark.parametrize(("target", "path"), KNOWN, ids=lambda v: getattr(v, "name", v))
def test_a_known_defect_keeps_the_rule(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())
