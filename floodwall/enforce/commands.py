"""The outbox: what a gate hands the I/O layer instead of doing it.

A gate appends, in order: frames the proxy itself sends a peer (``ToClient``, ``ToServer``),
commands for its core (0-9-1 ``ForgetChannel``, 1.0 ``ReadEveryFrame``), topology changes it
read (1.0 links that declare a queue) and typed events (``floodwall.enforce.events``). The core
moves the frames into its outgoing data where the gate made them and keeps the rest for the
I/O layer (``RelayCore.events``), which logs the events (``floodwall.ops.logs``), shows them to
the telemetry and applies the topology changes; ``RelayedConnection._flush`` writes the frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from floodwall.enforce.events import GateEvent
from floodwall.wire.amqp091.hooks import ForgetChannel
from floodwall.wire.amqp10.hooks import ReadEveryFrame
from floodwall.wire.relaycore import ToClient, ToServer
from floodwall.wire.topology import TopologyChange


@dataclass(frozen=True, slots=True)
class SendHeld:
    """1.0: a message the gate held for a queue (``enforce.amqp10.held``) may go now: the
    I/O layer sends it through the proxy's own 1.0 sender to ``address`` in ``vhost``, in
    the order these commands come, and hands the broker's outcome back
    (``CreditFlow.held_settled(token, state, now)``)."""

    token: int
    vhost: str
    address: str
    message_format: int
    payload: bytes


Command = (ToClient | ToServer | ForgetChannel | ReadEveryFrame | TopologyChange | GateEvent
           | SendHeld)
"""One entry of a gate's outbox."""

Outbox = list[Command]


__all__ = ["Command", "ForgetChannel", "Outbox", "ReadEveryFrame", "SendHeld", "ToClient",
           "ToServer"]
