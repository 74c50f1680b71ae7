"""The trip/release engine: a pure function of a queue's depth, its limits and whether it is
tripped."""

from __future__ import annotations

from floodwall.control.policy.model import Policy, QueueLimits, UnknownDepth

# --- the engine -----------------------------------------------------------------------

def should_trip(policy: Policy | QueueLimits, depth_bytes: int | None, depth_messages: int | None,
           tripped: bool) -> bool:
    """Whether the queue should be tripped now, given its depth and whether it is tripped.

    Trips when bytes > capacity (capacity > 0) or messages > max_messages; once tripped,
    releases only when bytes <= resume AND messages <= resume_messages. A known figure over
    its limit trips even if the other is unknown. Otherwise an unknown figure (None) of a
    limited dimension decides by ``on_unknown_depth``: keep -> ``tripped``, block -> True,
    allow -> False. A figure whose dimension is not limited is ignored.
    """
    limits = policy.limits if isinstance(policy, Policy) else policy
    check_bytes = limits.capacity > 0
    check_messages = limits.max_messages is not None
    if not check_bytes and not check_messages:
        return False
    if check_bytes and depth_bytes is not None and depth_bytes > limits.capacity:
        return True
    if (limits.max_messages is not None and depth_messages is not None
            and depth_messages > limits.max_messages):
        return True
    if (check_bytes and depth_bytes is None) or (check_messages and depth_messages is None):
        if limits.on_unknown_depth is UnknownDepth.BLOCK:
            return True
        if limits.on_unknown_depth is UnknownDepth.ALLOW:
            return False
        return tripped
    if not tripped:
        return False
    bytes_low = not check_bytes or (depth_bytes is not None and depth_bytes <= limits.resume)
    messages_low = (not check_messages or (
        depth_messages is not None and limits.resume_messages is not None
        and depth_messages <= limits.resume_messages))
    return not (bytes_low and messages_low)
