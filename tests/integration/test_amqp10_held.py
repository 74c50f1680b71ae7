"""A per-message 1.0 link under ``overflow: hold`` through floodwall, on both releases: its
messages to a tripped queue are held per message (``enforce.amqp10.held``) while its messages
to a free queue keep flowing on the same link; once the tripped queue drains the held ones
reach it in order through the proxy's own sender, and every delivery gets exactly one outcome.

RabbitMQ 4: a null-target link, each message's ``to`` its queue. RabbitMQ 3.10's amqp1_0 plugin
refuses a null target: its per-message form instead (``/exchange/amq.direct``, each message's
subject its queue's binding key).
"""

from __future__ import annotations

import collections
import re
import threading
from pathlib import Path
from typing import Any

import pika
import pytest
from proton import Message
from proton.reactor import Container

from floodwall.dev.devbroker import BrokerEndpoint
from tests.conftest import wait_for
from tests.integration.proton_senders import RecordingSender
from tests.integration.support import capped, direct_params, flow_with, numbered, seq_of
from tests.integration.test_amqp10_v2 import address

pytestmark = pytest.mark.broker

COUNT = 120  # 60 to each queue, alternating
PREFILL = 100  # 1 KiB messages: over the capped queue's 64 KiB


class MixedSender(RecordingSender):
    """One sender link, its messages alternating between two queues; every outcome event
    recorded (delivery tag, queue, kind)."""

    def __init__(self, port: int, target: str | None, routes: tuple[tuple[str, str], ...]
                 ) -> None:
        super().__init__(port, auto_settle=True)
        self.target = target
        self.routes = routes  # per queue: (to, subject) of its messages
        self.sent = 0
        self.queue_of: dict[str, int] = {}  # delivery tag -> index into routes
        self.events: list[tuple[str, int, str]] = []

    def on_start(self, event: Any) -> None:
        event.container.create_sender(self.connect(event), self.target, name="mixed")

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit > 0 and self.sent < COUNT:
            which = self.sent % 2
            to, subject = self.routes[which]
            delivery = sender.send(Message(body=numbered(self.sent), address=to or None,
                                           subject=subject or None))
            self.queue_of[str(delivery.tag)] = which
            self.sent += 1

    def outcome(self, event: Any, kind: str) -> None:
        tag = str(event.delivery.tag)
        self.events.append((tag, self.queue_of.get(tag, -1), kind))

    def outcomes(self, which: int) -> int:
        return sum(1 for _, q, _ in self.events if q == which)


@pytest.mark.timeout(120)
def test_null_target_on_4_per_message_address_on_3_10_holds_per_message(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    qcap, qfree = queues("held-cap"), queues("held-free")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        for q in (qcap, qfree):
            ch.queue_declare(q)
            ch.queue_bind(q, "amq.direct", q)
        for i in range(PREFILL):
            ch.basic_publish("", qcap, numbered(10_000 + i))
    flow = flow_with(start_floodwall, broker, tmp_path, capped("held", qcap))
    wait_for(lambda: flow.tripped(qcap), 30, 0.05, f"{qcap} tripped")
    if broker.version >= (4, 0):
        target, routes = None, ((address(broker, qcap), ""), (address(broker, qfree), ""))
    else:
        target, routes = "/exchange/amq.direct", (("", qcap), ("", qfree))
    sender = MixedSender(flow.port, target, routes)
    thread = threading.Thread(target=lambda: Container(sender).run(), daemon=True)
    thread.start()
    try:
        # The free queue's messages all go while the capped queue stays tripped; the capped
        # queue's are held by the proxy, unsettled.
        wait_for(lambda: sender.outcomes(1) >= COUNT // 2 or sender.errors, 30, 0.05,
                 "every message to the free queue settled")
        assert not sender.errors, sender.errors
        assert flow.tripped(qcap)
        assert sender.outcomes(0) == 0, "a message to the tripped queue was settled"
        held = [h for c in flow.proc.state()["connections"] for h in c.get("held", [])]
        assert [h["queue"] for h in held] == [qcap] and held[0]["waiting"] == COUNT // 2
        with pika.BlockingConnection(direct_params(broker)) as conn:
            conn.channel().queue_purge(qcap)  # drained: the held messages go
        wait_for(lambda: sender.outcomes(0) >= COUNT // 2 or sender.errors, 30, 0.05,
                 "every held message settled")
    finally:
        sender.stop.set()
        thread.join(10)
    assert not sender.errors, sender.errors
    per_tag = collections.Counter(tag for tag, _, _ in sender.events)
    assert len(per_tag) == COUNT and set(per_tag.values()) == {1}, "one outcome each"
    assert {kind for _, _, kind in sender.events} == {"accepted"}
    with pika.BlockingConnection(direct_params(broker)) as conn:
        ch = conn.channel()
        bodies = []
        while (got := ch.basic_get(qcap, auto_ack=True))[0] is not None:
            bodies.append(got[2])
        free = ch.queue_declare(qfree, passive=True).method.message_count
    # (through 0-9-1 a 1.0 message's body may read as its encoded section: the number in it)
    seqs = [seq_of(m.group()) if (m := re.search(rb"\d{10}", b)) else -1 for b in bodies]
    assert seqs == list(range(0, COUNT, 2)), "held ones in order"
    assert free == COUNT // 2
