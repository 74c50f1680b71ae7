"""Tasks an io/ part starts and keeps: every one held in its set until done (asyncio keeps only
weak references), a failure logged once with the part's event name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from floodwall.ops.logs import event

T = TypeVar("T")


def spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, T], name: str,
          log: logging.Logger, failed: str,
          reason: Callable[[BaseException], str] = repr) -> asyncio.Task[T]:
    """Start ``coro`` as a task named ``name`` kept in ``tasks`` until it ends; an exception
    it ends with is logged as ``failed`` (``task``, ``reason``)."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    tasks.add(task)

    def done(task: asyncio.Task[T]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            event(log, failed, logging.ERROR, task=task.get_name(),
                  reason=reason(exc) if exc is not None else "?")

    task.add_done_callback(done)
    return task


Spawn = Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]
"""How a part starts a task with the ``spawn`` its owner hands it: the owner keeps the task
(and cancels it on stop), a failure is logged under the owner's event name."""
