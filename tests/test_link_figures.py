"""The 1.0 sender links feeding each policed queue, summed for the metrics and telemetry."""

from __future__ import annotations

from prometheus_client import generate_latest

from floodwall.control.controller import IN_FLIGHT_ALLOWANCE
from floodwall.enforce.amqp10.links import ROOM_WINDOW_BYTES, LinkView, room_window
from floodwall.ops.link_figures import LinkCollector, LinkFigures, link_figures
from floodwall.ops.metrics import make_registry
from tests.amqp10.test_credit_gate import (
    ANON_H,
    CAPPED_H,
    VHOST,
    Setup,
    broker_flow,
)

# The windows from the 1 MiB queue's room (more than ROOM_WINDOW_BYTES) and its in-flight
# allowance (the whole IN_FLIGHT_ALLOWANCE: 1 MiB / 512 is less), each shared by the links
# given a window from the queue: the first link's while alone (512 KiB, ROOM_WINDOW_BYTES: the
# most such a window is), the second's shared with it (256 KiB).
FIRST_WINDOW_BYTES = room_window(ROOM_WINDOW_BYTES, 1) + IN_FLIGHT_ALLOWANCE
SHARED_WINDOW_BYTES = room_window(ROOM_WINDOW_BYTES, 2) + IN_FLIGHT_ALLOWANCE // 2


class _Conn:
    def __init__(self, s: Setup | None) -> None:
        self.s = s

    def sender_links(self) -> tuple[str, list[LinkView]] | None:
        return None if self.s is None else (VHOST, self.s.gate.link_views())


def _two_senders() -> Setup:
    """A capped link (a window from the 1 MiB queue's room and its in-flight allowance) and
    an anonymous link that sent to the capped queue and to the free one."""
    s = Setup(capacity=1 << 20)
    s.server(broker_flow(7, 0, 100_000) + broker_flow(9, 0, 100_000))
    s.take()
    s.send(CAPPED_H, 1024)
    s.send(ANON_H, 1024, to="/amq/queue/capped")
    s.send(ANON_H, 1024, to="/amq/queue/free")
    s.take()
    return s


def test_the_capped_links_feeding_a_policed_queue_are_summed() -> None:
    s = _two_senders()
    views = {v.handle: v for v in s.gate.link_views()}
    figures = link_figures([_Conn(s), _Conn(None)], s.fc.queues)
    assert list(figures) == [(VHOST, "capped")]  # the free queue is not policed
    assert figures[(VHOST, "capped")] == LinkFigures(
        2, sum(views[h].window_bytes or 0 for h in (CAPPED_H, ANON_H)),
        views[CAPPED_H].credit + views[ANON_H].credit, 0)
    assert s.fc.queues[(VHOST, "capped")].allowance_bytes() == IN_FLIGHT_ALLOWANCE
    assert views[CAPPED_H].window_bytes == FIRST_WINDOW_BYTES  # the lone first link's part
    assert views[ANON_H].window_bytes == SHARED_WINDOW_BYTES  # shared with it


def test_the_metrics_show_them_per_queue() -> None:
    s = _two_senders()
    registry = make_registry([LinkCollector(lambda: link_figures([_Conn(s)], s.fc.queues))])
    text = generate_latest(registry).decode()
    assert 'floodwall_amqp10_sender_links{queue="capped",vhost="/"} 2.0' in text
    window_bytes = FIRST_WINDOW_BYTES + SHARED_WINDOW_BYTES
    assert f'floodwall_amqp10_window_bytes{{queue="capped",vhost="/"}} {window_bytes}.0' in text
    assert 'floodwall_amqp10_admitted_credit{queue="capped",vhost="/"} 0.0' in text
    assert 'queue="free"' not in text
