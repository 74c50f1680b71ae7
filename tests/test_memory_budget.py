"""The process-wide memory budget (floodwall.control.memory): when it engages and lets go,
who it pauses and in which order it resumes them, and its default."""

from __future__ import annotations

from floodwall.control.memory import (
    DEFAULT_MEMORY_BUDGET,
    MIN_MEMORY_BUDGET,
    MemoryBudget,
    cgroup_limit,
    default_budget,
)

MIB = 1024 * 1024


def test_engages_at_the_limit_and_lets_go_at_seven_eighths() -> None:
    b = MemoryBudget(8 * MIB)
    assert b.resume == 7 * MIB
    assert not b.reached(8 * MIB - 1)
    assert b.reached(8 * MIB) and b.engagements_total == 1
    assert b.reached(7 * MIB + 1)  # hysteresis: still engaged between resume and limit
    assert not b.reached(7 * MIB)
    assert not b.reached(8 * MIB - 1)
    assert b.reached(9 * MIB) and b.engagements_total == 2


def test_pauses_each_holder_once_and_resumes_smallest_first_once_let_go() -> None:
    b = MemoryBudget(10 * MIB)
    assert b.reached(10 * MIB)
    assert b.pause(1, 5 * MIB) and b.pause(2, 1 * MIB) and b.pause(3, 4 * MIB)
    assert not b.pause(1, 6 * MIB)  # already paused: counted once, figure updated
    assert b.pauses_total == 3
    assert b.largest(2) == [(1, 6 * MIB), (3, 4 * MIB)]
    assert b.take_resumed() == []  # still engaged: nobody resumes
    b.forget(3)
    assert not b.reached(8 * MIB)
    assert b.take_resumed() == [2, 1]
    assert b.paused == {} and b.take_resumed() == []


def test_cgroup_limit_files() -> None:
    assert cgroup_limit("268435456\n") == 268435456
    assert cgroup_limit("max\n") is None  # v2: no limit
    assert cgroup_limit("9223372036854771712") is None  # v1: no limit
    assert cgroup_limit("") is None and cgroup_limit("garbage") is None
    assert cgroup_limit("0") is None


def test_default_budget_is_a_third_of_the_limit() -> None:
    assert default_budget(None) == DEFAULT_MEMORY_BUDGET
    assert default_budget(256 * MIB) == 256 * MIB // 3
    assert default_budget(16 * MIB) == MIN_MEMORY_BUDGET
