"""The soak's verdict (bench/soak.py): what leaks fails it, what comes and goes does not."""

from __future__ import annotations

from typing import Any

from bench.soak import TASK_ALLOWANCE, verdict


def _doc(tasks: list[int], fds: list[int] | None = None) -> dict[str, Any]:
    fds = fds or [24] * len(tasks)
    samples = [{"minute": i / 6, "rss_mib": 56.0, "fds": f, "tasks": t, "trips": float(i + 1),
                "admin_seconds": 0.02} for i, (t, f) in enumerate(zip(tasks, fds, strict=True))]
    return {"samples": samples, "end": {"confirmed": 100, "delivered": 100, "nacked": 0}}


def test_tasks_that_come_and_go_with_the_phase_pass() -> None:
    """The two-minute soak on RabbitMQ 4.0 once sampled 34 tasks last (the spool replaying,
    a hot queue counted) between samples of 30: not a leak."""
    result = verdict(_doc([30, 32, 33, 30, 32, 30, 30, 31, 32, 30, 30, 34]), warmup=0.5)
    assert result["ok"] and result["task_growth"]["value"] == 0


def test_tasks_that_stay_fail() -> None:
    leak = TASK_ALLOWANCE + 1
    tasks = [30, 32, 33, 30, 32, 30, 30, 31, *(t + leak for t in (32, 30, 30, 31))]
    result = verdict(_doc(tasks), warmup=0.5)
    assert not result["ok"] and result["task_growth"] == {
        "value": leak, "limit": TASK_ALLOWANCE, "ok": False}


def test_descriptors_that_stay_fail() -> None:
    result = verdict(_doc([30] * 12, fds=[24] * 8 + [28] * 4), warmup=0.5)
    assert not result["ok"] and result["fd_growth"]["value"] == 4
