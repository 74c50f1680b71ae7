"""What a gate may assemble in memory for the spool: one rule for both protocols.

``overflow: spool`` writes whole messages, so a message bound for a spool is gathered in
memory first (0-9-1: its frames until its body is in; 1.0: a delivery's transfer frames).
Before any of it is kept, and as it grows, ``capture_refusal`` says whether it may be: it
must fit the spool (the queue's ``spool.max_bytes``, the spool's total and the free disk:
the spool's own checks, ``SpoolPort.room``) and, while it is in memory, the connection's hold
budget and the process' memory budget. Captured bytes count as held bytes (the hold and
memory budgets' measure) until the record is written or dropped.

Bound: captures together stay under the memory budget's *resume* level, so they alone can
never keep the budget engaged (the connections that capture are paused with the others and
read again once held publishes drain); one connection's captures stay under its hold budget.
"""

from __future__ import annotations

from floodwall.control.memory import MemoryBudget
from floodwall.enforce.ports import QueueKey, SpoolPort


def capture_refusal(spool: SpoolPort, key: QueueKey, size: int, max_bytes: int, adding: int,
                    conn_held: int, hold_budget: int, process_held: int,
                    memory: MemoryBudget | None) -> str | None:
    """Why a message of ``size`` bytes (announced, or gathered so far) may not be captured
    for ``key``'s spool (``max_bytes``: its queue's limit) when ``adding`` more bytes of it
    would be kept in memory now; None if it may. ``conn_held``: what the connection holds
    (its captures included), against ``hold_budget``; ``process_held``: what every
    connection holds, against ``memory``'s resume level."""
    why = spool.room(key, size, max_bytes)
    if why is not None:
        return why
    if hold_budget and conn_held + adding > hold_budget:
        return (f"a message of {size} bytes does not fit the connection's hold budget "
                f"({hold_budget} bytes, {conn_held} held) while it is assembled for the spool")
    if memory is not None and process_held + adding > memory.resume:
        return (f"a message of {size} bytes does not fit the memory budget ({memory.limit} "
                f"bytes, {process_held} held) while it is assembled for the spool")
    return None
