"""Shadow mode in a gate: what it would have done to a publish or transfer, recorded and
counted, while the frames pass untouched.

The verdict is made once, by ``enforce.decision.decide`` given the shadow trips
(``FlowController.shadow_blocking``) besides the enforced ones; the gate acts on
``Decision.verdict`` as always and hands ``Decision.shadow`` here, the one place a shadow
verdict is acted upon: counted in ``GateCounters.shadow`` by protocol and action, and told
as ``WouldHave`` events when a channel or link would start to be held, be signalled, be
released, and for each publish it would have refused or spooled.

A would-be hold lasts, per channel (0-9-1) or link (1.0), while a shadow queue it would wait
on stays tripped (``ShadowHold.on``); its end is noticed at that publisher's next publish or
transfer (the gate holds nothing, so nothing else asks), and counted then (``flow_on``,
``credit_restored``). While it lasts, the publisher's other publishes count as held too, as
they would wait behind the held ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from floodwall.control.controller import QueueKey
from floodwall.enforce import events as ev
from floodwall.enforce.decision import Verdict, should_signal
from floodwall.enforce.events import ShadowAction
from floodwall.enforce.shared import GateContext

_NOTHING: frozenset[QueueKey] = frozenset()
_A = ShadowAction


@dataclass
class ShadowHold:
    """One channel's or link's would-be hold: the shadow queues it would wait on (empty: not
    held) and whether its client would have been told to stop."""

    on: frozenset[QueueKey] = _NOTHING
    signalled: bool = False
    spool_told: bool = False  # its first would-be spooled publish was told


class ShadowRecorder:
    """The shadow-mode part each gate owns: what a shadow verdict would have done, counted and
    told, over the gate's context."""

    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx

    def would_wait_on(self, at: ev.At, hold: ShadowHold,
                      queues: frozenset[str]) -> frozenset[QueueKey]:
        """The shadow queues a publish to ``queues`` would wait on: the tripped shadow queues
        among them, and those its publisher would still be held on. A would-be hold whose
        queues all released ends here."""
        if hold.on:
            still = self.ctx.controller.trips.still_shadow(hold.on)
            if not still:
                self.would_release(at, hold)
            hold.on = still
        found = self.ctx.controller.shadow_blocking(self.ctx.vhost, queues)
        return found | hold.on if hold.on else found

    def would_have(self, at: ev.At, hold: ShadowHold, verdict: Verdict | None,
                   would: frozenset[QueueKey], client_may_signal: bool | None) -> None:
        """Record ``verdict``, what the decision would have been had ``would`` been enforced
        (``Decision.shadow``; None: the same as acted upon, nothing to record).

        ``client_may_signal``: 0-9-1, whether the client may be sent Channel.Flow (each
        publish held counts ``held``); None for 1.0 (a link's credit is withheld, once per
        would-be hold; the caller makes a fixed link's refused transfer a hold, as enforced).
        """
        if verdict is None:
            return
        if verdict is Verdict.REJECT:
            self.record(at, _A.REJECTED, would, event=True)
            return
        if verdict is Verdict.SPOOL:  # told once per publisher, as NotSpooled is
            self.record(at, _A.SPOOLED, would, event=not hold.spool_told)
            hold.spool_told = True
            return
        if client_may_signal is not None:
            self.record(at, _A.HELD, would, event=not hold.on)
        if hold.on:
            hold.on |= would
            return
        hold.on = would
        if client_may_signal is None:
            hold.signalled = True
            self.record(at, _A.CREDIT_WITHHELD, would, event=True)
        elif should_signal(self.ctx.controller.queues, would, client_may_signal):
            hold.signalled = True
            self.record(at, _A.FLOW_OFF, would, event=True)

    def would_release(self, at: ev.At, hold: ShadowHold) -> None:
        if hold.signalled:
            hold.signalled = False
            action = _A.CREDIT_RESTORED if at.protocol is ev.ProtocolName.AMQP10 else _A.FLOW_ON
            self.record(at, action, hold.on, event=True)

    def record(self, at: ev.At, action: ShadowAction, queues: frozenset[QueueKey],
                event: bool) -> None:
        self.ctx.counters.shadow[(at.protocol.value, action.value)] += 1
        if event:
            self.ctx.outbox.append(ev.WouldHave(at, action, queues))

