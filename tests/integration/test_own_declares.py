"""floodwall's own connections on a broker with RabbitMQ 4.3's stricter defaults.

4.3 refuses by default what 4.0 only deprecates: transient non-exclusive queues,
``basic.qos`` with global=true, the v1 AMQP 1.0 addresses. 4.0 has the switches
(``deprecated_features.permit.*``), so its node here runs with all three off, as 4.3 would;
3.10 knows none of them and runs as is. A real ``floodwall run`` (fleet, topology events,
depth probes, management poller, spool and its replayer) polices a queue through a trip, a
spool and its replay on that node, while the broker's event exchange records every queue and
exchange floodwall itself declares; each must be one 4.3 takes: a queue exclusive or durable,
never transient and shared.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from floodwall.dev.devbroker import BrokerRelease, LocalBroker
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    direct_params,
    drain_direct,
    metric_sum,
    numbered,
    pika_params,
    policy_file,
    seq_of,
    start_flow,
    unique,
)

pytestmark = pytest.mark.load_tolerant

KIB = 1024
#: What RabbitMQ 4.3 refuses by default; RabbitMQ 4.0 permits each unless told otherwise.
STRICT_4_3 = ("deprecated_features.permit.transient_nonexcl_queues = false\n"
              "deprecated_features.permit.global_qos = false\n"
              "deprecated_features.permit.amqp_address_v1 = false\n")


@pytest.fixture(scope="module")
def strict_node(broker_release: BrokerRelease) -> Iterator[LocalBroker]:
    workdir = Path(tempfile.mkdtemp(prefix="floodwall-it-strict-"))
    # 3.10 has no deprecated features to turn off (its config would refuse the keys): the
    # same recording and the same checks, against its defaults.
    extra = STRICT_4_3 if broker_release.version >= (4, 0) else ""
    node = LocalBroker(workdir, config_extra=extra, release=broker_release)
    node.start()
    try:
        yield node
    finally:
        node.remove()


class Declares(threading.Thread):
    """Every ``queue.created`` and ``exchange.created`` the broker's event exchange reports
    (name, and the event's headers), from the moment ``ready`` is set."""

    def __init__(self, node: LocalBroker) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(direct_params(self.node.endpoint))
            ch = conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            for key in ("queue.created", "exchange.created"):
                ch.queue_bind(q, "amq.rabbitmq.event", key)
            self.ready.set()
            while not self.stop.is_set():
                method, props, _ = ch.basic_get(q, auto_ack=True)
                if method is None:
                    conn.sleep(0.05)
                    continue
                self.seen.append((method.routing_key, dict(props.headers or {})))
            conn.close()
        except BaseException as exc:
            self.error = exc
            self.ready.set()


def fleet_heard(proc: ProxyProcess) -> bool:
    """Whether the sidecar has heard its own announcements (an echo through the broker)."""
    doc = proc.state()["flow"]["fleet"]  # type: ignore[index]
    return bool(doc["announcements"]["received"] > 0 and not doc["deaf"])


@pytest.mark.timeout(180)
def test_floodwalls_own_declares_are_valid_on_4_3_defaults(
        strict_node: LocalBroker, start_floodwall: Any, tmp_path: Path) -> None:
    ep = strict_node.endpoint
    queue = unique("strict")
    recorder = Declares(strict_node)
    recorder.start()
    assert recorder.ready.wait(30) and recorder.error is None, recorder.error
    with pika.BlockingConnection(direct_params(ep)) as conn:
        conn.channel().queue_declare(queue, durable=True)
    policies = policy_file(tmp_path / "p.yaml", (
        f'{{name: strict, match: {{queue: "{queue}"}}, capacity: 32KiB, resume: 16KiB, '
        "overflow: spool, deadline: 60s, spool: {max_bytes: 64MiB, fsync: group}}"))
    flow = start_flow(start_floodwall, ep, policies, "--spool-dir", str(tmp_path / "spool"),
                      "--fleet", "strict", "--depth-interval", "50ms",
                      "--management-interval", "1s",
                      upstream=f"{ep.host}:{ep.amqp_port}")
    try:
        wait_for(lambda: flow.policed(queue), 30, what="the queue policed")
        # the fleet hears its own announcements: its queue, exchange and consumer work
        wait_for(lambda: fleet_heard(flow.proc), 30, what="the fleet hearing its own echo")
        # a trip, the spool, its replay through the spool's own connection
        count = 200
        with pika.BlockingConnection(pika_params(flow.port)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(count):
                ch.basic_publish("", queue, numbered(i, KIB))
        assert metric_sum(flow.metrics(), "floodwall_spool_appended_records_total") > 0
        got = drain_direct(ep, queue, count, timeout=90)
        assert [seq_of(b) for b in got] == list(range(count))
        events = flow.proc.state()["flow"]["topology"]["events"]  # type: ignore[index]
        assert events == "up", events
    finally:
        recorder.stop.set()
        recorder.join(30)
    assert recorder.error is None, recorder.error
    own = [(kind, h) for kind, h in recorder.seen if h.get("name") != queue]
    queues = [h for kind, h in own if kind == "queue.created"]
    # the fleet's member queue, the topology event consumer's queue, at the least
    assert len(queues) >= 2, own
    shared_transient = [h for h in queues if not h.get("exclusive") and not h.get("durable")]
    assert not shared_transient, shared_transient
    assert any(h.get("name", "").startswith("floodwall.fleet.strict") for h in queues), own
    errors = flow.log("channel_closed") + flow.log("upstream_error")
    assert not errors, errors
