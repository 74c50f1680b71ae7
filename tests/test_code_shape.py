"""The code's shape: no function over 60 lines in the product (``floodwall/``), so that each
reads at once. Lines are counted from the ``def`` line (decorators excluded) to the last line
of the body, docstrings and comments included.

Classes have no line limit: a class is split where the design has a seam, never to meet a
count (a count split them into inheritance chains nobody could see whole). What is limited
is how deep a class stands on the project's own classes: at most two in-project bases
(composition over inheritance chains), but for the gates' chains named in
``CHAINS_BEING_TAKEN_APART``, which may only shrink."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "floodwall"
MAX_FUNCTION_LINES = 60
MAX_PROJECT_BASES = 2
#: The two gates' chains (``GateBase`` -> ``ShadowWatch`` -> the parts -> the gate), deeper
#: than the rule allows: to be recomposed as parts the gate owns. A class leaves this list
#: when it is no longer deeper; none joins it.
CHAINS_BEING_TAKEN_APART = {
    "floodwall.enforce.amqp091.gate.PublishFlow": 5,
    "floodwall.enforce.amqp091.runs.PublishRuns": 4,
    "floodwall.enforce.amqp091.refusals.Refusing": 3,
}


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


def project_base_depths() -> dict[str, int]:
    """Every class defined in floodwall/ (``module.Name``): how many of the project's own
    classes it stands on (its method resolution order, itself aside)."""
    import floodwall

    depths: dict[str, int] = {}
    for info in pkgutil.walk_packages(floodwall.__path__, "floodwall."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                depths[f"{module.__name__}.{name}"] = sum(
                    1 for base in cls.__mro__[1:] if base.__module__.startswith("floodwall."))
    return depths


def test_no_class_stands_on_more_than_two_of_the_projects_classes() -> None:
    depths = project_base_depths()
    assert len(depths) > 100  # (the walk found the package)
    deep = {name: n for name, n in depths.items() if n > MAX_PROJECT_BASES}
    new = sorted(f"{name}: {n}" for name, n in deep.items()
                 if n > CHAINS_BEING_TAKEN_APART.get(name, MAX_PROJECT_BASES))
    assert not new, (f"classes on more than {MAX_PROJECT_BASES} of the project's classes "
                     "(compose parts instead):\n" + "\n".join(new))
    # The list only shrinks: a chain taken apart leaves it.
    gone = sorted(name for name, n in CHAINS_BEING_TAKEN_APART.items()
                  if depths.get(name, 0) < n)
    assert not gone, f"shallower now, lower or drop them in CHAINS_BEING_TAKEN_APART: {gone}"
