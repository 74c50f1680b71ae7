"""The broker's outcomes for a 1.0 sender's deliveries, through floodwall, on both releases:
relayed as the broker sent them (the sender sees them) and counted
(``floodwall_amqp10_outcomes_total{outcome}``, ``/state``'s connection, a ``broker_rejected``
log line with the rejected's error).

- Unroutable (an exchange with no binding for the key): RabbitMQ 4 settles it ``released``;
  RabbitMQ 3.10's amqp1_0 plugin ``accepted`` (it drops the message).
- A queue with ``x-max-length`` and ``x-overflow: reject-publish`` that is full: ``rejected``
  on RabbitMQ 4; RabbitMQ 3.10's plugin closes the connection instead at the first message it
  would reject (straight at the broker too): floodwall passes the close on, and counts the
  ``accepted`` before it.
"""

from __future__ import annotations

import collections
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
from tests.integration.support import capped, direct_params, flow_with, log_lines

pytestmark = [pytest.mark.broker, pytest.mark.load_tolerant]

COUNT = 200
MAX_LENGTH = 50


class OneLink(RecordingSender):
    """One sender link to ``target``: ``count`` messages, each outcome counted by kind; the
    connection stays open until ``stop`` is set."""

    def __init__(self, port: int, target: str, count: int) -> None:
        super().__init__(port, auto_settle=True)
        self.target, self.count = target, count
        self.sent = 0
        self.kinds: collections.Counter[str] = collections.Counter()
        self.done = threading.Event()

    def on_start(self, event: Any) -> None:
        event.container.create_sender(self.connect(event), self.target, name="outcomes")

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit > 0 and self.sent < self.count:
            event.sender.send(Message(body=b"x" * 100))
            self.sent += 1

    def outcome(self, event: Any, kind: str) -> None:
        self.kinds[kind] += 1
        if sum(self.kinds.values()) >= self.count:
            self.done.set()


def send_through(flow: Any, target: str) -> tuple[dict[str, int], dict[str, int]]:
    """``COUNT`` messages to ``target`` through ``flow``: the outcomes the sender saw, and
    the ones ``/state`` shows for its connection (read while it is open)."""
    sender = OneLink(flow.port, target, COUNT)
    thread = threading.Thread(target=lambda: Container(sender).run(), daemon=True)
    thread.start()
    try:
        wait_for(lambda: sender.done.is_set() or sender.errors, 60, 0.05, "every outcome")
        assert not sender.errors, sender.errors

        def of_the_connection() -> dict[str, int] | None:
            for conn in flow.proc.state()["connections"]:
                if conn["protocol"] == "amqp10" and sum(conn["outcomes"].values()) >= COUNT:
                    return dict(conn["outcomes"])
            return None
        wait_for(lambda: of_the_connection() is not None, 30, 0.05, "/state's outcomes")
        shown = of_the_connection()
        assert shown is not None
    finally:
        sender.stop.set()
        thread.join(10)
    return dict(sender.kinds), shown


def counted(flow: Any) -> dict[str, float]:
    return {o: flow.metric("floodwall_amqp10_outcomes_total", outcome=o)
            for o in ("accepted", "released", "rejected", "modified")}


def test_amqp10_unroutable_is_released_on_4_accepted_on_3_10_and_counted(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    flow = flow_with(start_floodwall, broker, tmp_path, capped("other", queues("other")))
    v4 = broker.version >= (4, 0)
    target = "/exchanges/amq.direct/no.such.key" if v4 else "/exchange/amq.direct/no.such.key"
    seen, shown = send_through(flow, target)
    kind = "released" if v4 else "accepted"
    assert seen == {kind: COUNT}
    assert shown == {"accepted": 0, "released": 0, "rejected": 0, "modified": 0,
                     kind: COUNT}
    wait_for(lambda: counted(flow)[kind] >= COUNT, 10, 0.05, "the metric")
    assert counted(flow) == {**dict.fromkeys(("accepted", "released", "rejected",
                                               "modified"), 0.0), kind: float(COUNT)}


def test_amqp10_full_reject_publish_queue_rejected_on_4_connection_closed_on_3_10(
        broker: BrokerEndpoint, start_floodwall: Any, tmp_path: Path, queues: Any) -> None:
    q = queues("rejpub")
    with pika.BlockingConnection(direct_params(broker)) as conn:
        conn.channel().queue_declare(q, arguments={"x-max-length": MAX_LENGTH,
                                                   "x-overflow": "reject-publish"})
    flow = flow_with(start_floodwall, broker, tmp_path, capped("other", queues("other")))
    if broker.version < (4, 0):
        sender = OneLink(flow.port, f"/amq/queue/{q}", COUNT)
        thread = threading.Thread(target=lambda: Container(sender).run(), daemon=True)
        thread.start()
        wait_for(lambda: sender.errors, 60, 0.05, "the broker's close")
        sender.stop.set()
        thread.join(10)
        assert dict(sender.kinds) == {"accepted": MAX_LENGTH}
        assert counted(flow) == {"accepted": MAX_LENGTH, "released": 0.0, "rejected": 0.0,
                                 "modified": 0.0}
        return
    seen, shown = send_through(flow, f"/queues/{q}")
    want = {"accepted": MAX_LENGTH, "rejected": COUNT - MAX_LENGTH}
    assert seen == want
    assert shown == {"released": 0, "modified": 0, **want}
    wait_for(lambda: counted(flow)["rejected"] >= COUNT - MAX_LENGTH, 10, 0.05, "the metric")
    assert counted(flow) == {"released": 0.0, "modified": 0.0,
                             **{k: float(v) for k, v in want.items()}}
    lines = log_lines(flow.proc.logfile, "broker_rejected")
    assert lines, flow.proc.log_tail()
    assert "protocol=amqp10" in lines[0] and "vhost=/" in lines[0], lines[0]
    told = sum(int(line.split(" rejected=")[1].split()[0]) for line in lines)
    assert told <= COUNT - MAX_LENGTH  # the rest since the last line: not told yet
    print(lines[0])
