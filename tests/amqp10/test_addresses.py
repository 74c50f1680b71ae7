"""AMQP 1.0 addresses as RabbitMQ reads them (floodwall.wire.amqp10.addresses): every v1 form
of 3.10, every v2 form of RabbitMQ 4 with percent-encoded names, and what fits no form."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.wire.amqp10.addresses import (
    Destination,
    declared_queue,
    parse_target,
    queue_address,
    queues_for,
    source_queue,
    vhost_of,
)


@pytest.mark.parametrize(("address", "destination"), [
    # RabbitMQ 4 (v2)
    ("/queues/orders", Destination("", "orders")),
    ("/queues/a%2Fb%20c", Destination("", "a/b c")),
    ("/queues/%C3%A9t%C3%A9", Destination("", "été")),
    ("/exchanges/amq.direct/orders", Destination("amq.direct", "orders")),
    ("/exchanges/ex%2F1/key%2Fwith%2Fslashes", Destination("ex/1", "key/with/slashes")),
    ("/exchanges/amq.default/orders", Destination("", "orders")),
    ("/exchanges/amq.topic", Destination("amq.topic", None)),  # each message's subject
    ("/exchanges/x/", Destination("x", "")),
    # RabbitMQ 3.10 (v1), deprecated in 4.0, refused by default from 4.3
    ("/queue/orders", Destination("", "orders")),
    ("/amq/queue/orders", Destination("", "orders")),
    ("/queue", Destination("", None)),
    ("/exchange/amq.direct/orders", Destination("amq.direct", "orders")),
    ("/exchange/amq.direct/a/b", Destination("amq.direct", "a/b")),
    ("/exchange/amq.direct", Destination("amq.direct", None)),
    ("/topic/a.b", Destination("amq.topic", "a.b")),
    ("orders", Destination("", "orders")),
])
def test_every_form(address: str, destination: Destination) -> None:
    assert parse_target(address) == destination


@pytest.mark.parametrize("address", [
    "", "/", "/queues", "/queues/", "/queues/a/b", "/queues/%FF", "/exchanges",
    "/exchanges/", "/exchanges/%FF/k", "/exchanges/x/%FF", "/exchanges/x/k/more",
    "/exchange/", "/queue/a/b", "/amq/queue/", "/nothing/x",
])
def test_what_fits_no_form_resolves_to_nothing(address: str) -> None:
    assert parse_target(address) is None


def test_per_message_destinations_route_by_subject() -> None:
    class Router:
        def destinations(self, vhost: str, exchange: str, routing_key: str,
                         headers: dict[str, object] | None = None) -> frozenset[str]:
            return frozenset({f"{vhost}|{exchange}|{routing_key}"})

    router = Router()
    assert queues_for(router, "/", parse_target("/exchanges/amq.direct"), "q1") \
        == {"/|amq.direct|q1"}
    assert queues_for(router, "/", parse_target("/exchanges/amq.direct"), None) == set()
    assert queues_for(router, "v", parse_target("/queues/q"), "ignored") == {"v||q"}
    assert queues_for(router, "/", None) == set()


def test_sources_and_declared_queues() -> None:
    assert source_queue("/queues/a%2Fb") == "a/b"
    assert source_queue("/queue/q") == source_queue("/amq/queue/q") == source_queue("q") == "q"
    assert source_queue("/exchanges/x/k") is None
    assert source_queue(None) is None
    # 3.10 declares /queue/Q and bare names on attach; RabbitMQ 4's v2 forms declare nothing
    assert declared_queue("/queue/q") == declared_queue("q") == "q"
    assert declared_queue("/queues/q") is None
    assert declared_queue("/amq/queue/q") is None


def test_vhost_of_the_open() -> None:
    assert vhost_of("vhost:prod") == "prod"
    assert vhost_of("vhost:") == "/"
    assert vhost_of("broker.example") == "/"
    assert vhost_of(None) == "/"


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30))
def test_v2_names_round_trip_through_percent_encoding(name: str) -> None:
    assert parse_target("/queues/" + quote(name, safe="")) == Destination("", name)
    assert parse_target(f"/exchanges/{quote(name, safe='')}/{quote(name, safe='')}") \
        == Destination("" if name == "amq.default" else name, name)


@pytest.mark.parametrize(("version", "v2"), [
    ("4.0.5", True), ("4.3.0", True), ("3.13.7", False), ("3.10.8", False), (None, False),
    ("", False), ("x.y", False),
])
def test_the_queue_address_follows_the_brokers_version(version: str | None, v2: bool) -> None:
    name = "a/b c" if v2 else "a b.c"  # (a v1 address cannot name a queue with a slash)
    address = queue_address(name, version)
    assert address == ("/queues/a%2Fb%20c" if v2 else "/amq/queue/a b.c")
    # the proxy's routing model reads it back as the same queue
    assert parse_target(address) == Destination("", name)
