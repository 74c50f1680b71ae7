"""The code's shape: no function over 60 lines in the product (``floodwall/``), so that each
reads at once. Lines are counted from the ``def`` line (decorators excluded) to the last line
of the body, docstrings and comments included.

Classes have no line limit: a class is split where the design has a seam, never to meet a
count (a count split them into inheritance chains nobody could see whole)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "floodwall"
MAX_FUNCTION_LINES = 60


def sizes() -> list[tuple[str, str, int]]:
    """(kind, where, lines) of every class and function (methods included) under floodwall/."""
    found: list[tuple[str, str, int]] = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(ROOT.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                kind = "class"
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "function"
            else:
                continue
            assert node.end_lineno is not None
            found.append((kind, f"{rel}:{node.lineno} {node.name}",
                          node.end_lineno - node.lineno + 1))
    return found


def test_the_product_has_classes_and_functions() -> None:
    kinds = {kind for kind, _, _ in sizes()}
    assert kinds == {"class", "function"}


@pytest.mark.parametrize(("kind", "limit"), [("function", MAX_FUNCTION_LINES)])
def test_nothing_is_longer_than_its_limit(kind: str, limit: int) -> None:
    too_long = sorted((f"{where}: {n} lines" for k, where, n in sizes()
                       if k == kind and n > limit))
    assert not too_long, f"{kind}es over {limit} lines:\n" + "\n".join(too_long)
