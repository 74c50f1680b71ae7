"""The admin endpoint's answers, and the metrics it exposes."""

from __future__ import annotations

import json

from floodwall.io.admin import AdminEndpoints
from floodwall.ops.metrics import RelayCollector, RelayStats, make_registry
from floodwall.wire.relaycore import FrameCounts


class _Conn:
    def __init__(self, protocol: str, frames: int, nbytes: int) -> None:
        self.protocol = protocol
        self.from_client = FrameCounts(frames, nbytes)
        self.from_server = FrameCounts(1, 10)


def _endpoints(stats: RelayStats, ready: bool = True) -> AdminEndpoints:
    return AdminEndpoints(make_registry([RelayCollector(stats)]),
                          lambda: (ready, {"upstream": ready}), lambda: {"tasks": 3})


def test_metrics_sum_live_and_closed_connections() -> None:
    stats = RelayStats()
    a, b = _Conn("amqp091", 5, 500), _Conn("amqp10", 2, 20)
    stats.live.update({a, b})
    stats.accepted.update({"amqp091": 1, "amqp10": 1})
    closed = _Conn("amqp091", 7, 700)
    stats.live.add(closed)
    stats.retire(closed)
    status, _, body = _endpoints(stats).respond("GET", "/metrics")
    text = body.decode()
    assert status == 200
    assert 'floodwall_connections{protocol="amqp091"} 1.0' in text
    assert 'floodwall_frames_total{direction="client_to_server",protocol="amqp091"} 12.0' in text
    assert ('floodwall_relayed_bytes_total{direction="client_to_server",protocol="amqp091"} 1200.0'
            in text)
    assert 'floodwall_connections_accepted_total{protocol="amqp10"} 1.0' in text


def test_readyz_follows_readiness() -> None:
    status, ctype, body = _endpoints(RelayStats(), ready=False).respond("GET", "/readyz")
    assert status == 503 and ctype == "application/json"
    assert json.loads(body) == {"ready": False, "upstream": False}
    assert _endpoints(RelayStats()).respond("GET", "/readyz")[0] == 200


def test_health_state_and_unknown_paths() -> None:
    ep = _endpoints(RelayStats())
    assert ep.respond("GET", "/healthz")[0] == 200
    assert json.loads(ep.respond("GET", "/state?pretty")[2]) == {"tasks": 3}
    assert ep.respond("GET", "/nope")[0] == 404
    assert ep.respond("POST", "/metrics")[0] == 405
