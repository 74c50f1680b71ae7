"""The proxy's start-up objects leave the collector's generations (``freeze_start_up``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from floodwall.io.app import freeze_start_up


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def tracked(nodes: list[Node]) -> bool:
    """Whether any of ``nodes`` is in a generation the collector walks."""
    ids = {id(n) for n in nodes}
    return any(id(o) in ids for o in gc.get_objects())


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite runs with the collector as it was


def test_start_up_objects_are_frozen_and_later_garbage_is_still_collected(
        unfrozen: None) -> None:
    kept = [Node() for _ in range(1000)]
    frozen = freeze_start_up()
    assert frozen >= len(kept)
    assert not tracked(kept)  # in the permanent generation, outside every collected one
    assert gc.get_count()[0] < 100  # generation 0 emptied
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after start-up: the collector's to find
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
    assert not tracked(kept)  # nothing moved back
    # A frozen object that dies leaves the permanent generation (the count only falls:
    # the interpreter's own temporaries caught by the freeze go at once); none joins it.
    assert gc.get_freeze_count() <= frozen
