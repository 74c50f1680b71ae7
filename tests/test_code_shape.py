"""The code's shape: no function over 60 lines in the product (``floodwall/``), so that each
reads at once. Lines are counted from the ``def`` line (decorators excluded) to the last line
of the body, docstrings and comments included.

Classes have no line limit: a class is split where the design has a seam, never to meet a
count (a count split them into inheritance chains nobody could see whole). What is limited
is how deep a class stands on the project's own classes: at most two in-project bases
(composition over inheritance chains), and which of them hold state: a class takes state
from a class of another module only where ``STATEFUL_BASES_ACROSS_MODULES`` says so (a list
that may only shrink; exceptions and bases without ``__init__`` or fields are free)."""

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
#: Classes that take state (an ``__init__``, fields) from a class of another module: none. A
#: class composes parts it owns instead (``CoreOutput``, ``BatchedWrites``, the supervisor's);
#: none joins the set.
STATEFUL_BASES_ACROSS_MODULES: set[tuple[str, str]] = set()


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


def _project_classes() -> list[tuple[str, type]]:
    """Every class defined in floodwall/, as (``module.Name``, class)."""
    import floodwall

    found: list[tuple[str, type]] = []
    for info in pkgutil.walk_packages(floodwall.__path__, "floodwall."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found.extend((f"{module.__name__}.{name}", cls) for name, cls in vars(module).items()
                     if inspect.isclass(cls) and cls.__module__ == module.__name__)
    return found


def project_base_depths() -> dict[str, int]:
    """Every class defined in floodwall/ (``module.Name``): how many of the project's own
    classes it stands on (its method resolution order, itself aside)."""
    return {name: sum(1 for base in cls.__mro__[1:] if base.__module__.startswith("floodwall."))
            for name, cls in _project_classes()}


def test_no_class_stands_on_more_than_two_of_the_projects_classes() -> None:
    depths = project_base_depths()
    assert len(depths) > 100  # (the walk found the package)
    deep = {name: n for name, n in depths.items() if n > MAX_PROJECT_BASES}
    assert not deep, (f"classes on more than {MAX_PROJECT_BASES} of the project's classes "
                      "(compose parts instead):\n" + "\n".join(sorted(deep)))


def _holds_state(cls: type) -> bool:
    if getattr(cls, "_is_protocol", False):  # an interface (typing gives it an __init__)
        return False
    return "__init__" in vars(cls) or bool(getattr(cls, "__dataclass_fields__", None)) \
        or bool(vars(cls).get("__annotations__"))


def test_no_class_takes_state_from_another_modules_class() -> None:
    found = {(name, f"{base.__module__}.{base.__name__}")
             for name, cls in _project_classes() if not issubclass(cls, BaseException)
             for base in cls.__mro__[1:]
             if base.__module__.startswith("floodwall.") and base.__module__ != cls.__module__
             and _holds_state(base)}
    assert not found - STATEFUL_BASES_ACROSS_MODULES, (
        "state taken from another module's class (compose a part instead): "
        f"{sorted(found - STATEFUL_BASES_ACROSS_MODULES)}")
    gone = STATEFUL_BASES_ACROSS_MODULES - found
    assert not gone, f"no longer so, drop them from STATEFUL_BASES_ACROSS_MODULES: {sorted(gone)}"
