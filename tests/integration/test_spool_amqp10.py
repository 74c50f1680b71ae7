"""The spool's AMQP 1.0 part end to end: ``overflow: spool`` in front of the real RabbitMQ 3.10.

A python-qpid-proton sender keeps its credit while its queue is tripped; what it sends is
spooled, settled ``accepted`` by the proxy once durable, and replayed over AMQP 1.0 in order
when a consumer drains the queue. A second link on the same session, to a free queue, is
settled by the broker throughout: the session's delivery-ids and transfer-ids are translated
around the deliveries the proxy kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    drain_direct,
    metric_sum,
    policy_file,
    ready_count,
    seq_of,
    start_flow,
)
from tests.integration.test_amqp10_flow import LinkStats, ProtonSenders
from tests.integration.test_spool_end_to_end import FAST, declare_through, spool_state, spooled

pytestmark = pytest.mark.broker

KIB = 1024


def seq_in(body: bytes) -> int:
    """The number in a message a proton sender sent, as a 0-9-1 consumer gets it: RabbitMQ
    hands over the encoded AMQP 1.0 body section (proton sends bytes as amqp-value)."""
    message = Message()
    message.decode(body)
    return seq_of(bytes(message.body))


@pytest.mark.timeout(180)
def test_amqp10_sender_to_a_tripped_queue_is_spooled_settled_and_replayed_in_order(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    capped, free = queues("spool10-cap"), queues("spool10-free")
    flow = start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml",
                                                            spooled("s", capped)),
                      "--spool-dir", str(tmp_path / "spool"), *FAST)
    declare_through(flow.port, capped, free)
    wait_for(lambda: flow.policed(capped), 15, what="the queue policed")

    count = 600
    links = [LinkStats("cap", f"/amq/queue/{capped}", 3000, count),
             LinkStats("free", f"/amq/queue/{free}", 3000, count)]
    sender = ProtonSenders(flow.port, links)
    sender.start()
    wait_for(lambda: sender.errors or all(len(s.settled) == count for s in links), 90,
             what="every delivery settled")
    sender.finish()
    assert not sender.errors
    for s in links:
        assert (s.accepted, s.rejected) == (count, []), s.name
    # the queue tripped and the rest of what the sender sent went to the spool
    assert flow.tripped(capped)
    text = flow.metrics()
    appended = metric_sum(text, "floodwall_spool_appended_records_total")
    assert 0 < appended < count
    assert metric_sum(text, "floodwall_spool_records", queue=capped) == appended
    # the broker was protected: about capacity (32 KiB) plus a credit window, not 600 KiB
    assert ready_count(broker, capped) * KIB < 160 * KIB
    assert ready_count(broker, free) == count

    # a consumer drains the queue; the spool replays behind it, in order
    got: list[bytes] = []
    drainer = threading.Thread(target=lambda: got.extend(
        drain_direct(broker, capped, count, timeout=120)))
    drainer.start()
    drainer.join(150)
    assert [seq_in(b) for b in got] == list(range(count))
    wait_for(lambda: spool_state(flow.proc)["records"] == 0, 15, what="an empty spool")
    assert metric_sum(flow.metrics(), "floodwall_spool_replayed_records_total") == appended
    assert flow.log("spool_replay_started")
    assert not flow.log("spool_replay_rerouted")
    assert [seq_in(b) for b in drain_direct(broker, free, count)] == list(range(count))


@pytest.mark.timeout(180)
def test_amqp10_deliveries_settled_from_the_spool_survive_kill_9(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint, queues: Any,
        tmp_path: Path) -> None:
    """``accepted`` from the proxy means durable: every delivery the proxy settled is on disk
    when it is killed with SIGKILL, and the next process replays it over AMQP 1.0."""
    capped = queues("spool10-kill")
    spool_dir = tmp_path / "spool"
    flow = start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml",
                                                            spooled("k", capped, group_ms=5)),
                      "--spool-dir", str(spool_dir), *FAST)
    proc = flow.proc
    declare_through(flow.port, capped)
    wait_for(lambda: flow.policed(capped), 15, what="the queue policed")
    count = 400
    link = LinkStats("cap", f"/amq/queue/{capped}", 3000, count)
    sender = ProtonSenders(flow.port, [link])
    sender.start()
    wait_for(lambda: sender.errors or len(link.settled) == count, 90,
             what="every delivery settled")
    sender.finish()
    assert not sender.errors and (link.accepted, link.rejected) == (count, [])
    spooled_at_kill = int(spool_state(proc)["records"])
    assert spooled_at_kill > 0
    assert proc.process is not None
    proc.process.kill()  # SIGKILL: no drain, no flush, no cursor write
    proc.process.wait(10)
    proc.process = None
    proc.start()  # same port, same spool directory: recovers, replays once drained
    assert flow.log("spool_recovered")
    got = drain_direct(broker, capped, count, timeout=120)
    assert [seq_in(b) for b in got] == list(range(count))
    wait_for(lambda: spool_state(proc)["records"] == 0, 15, what="an empty spool")
    print(f"\n{count} deliveries accepted, {spooled_at_kill} of them in the spool at the "
          f"kill, all delivered in order after the restart")
