"""The order in which the broker's nodes take connections, and who is told when one stops
answering (``Upstreams``), with a resolver that answers from a table."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from floodwall.io.upstream_address import UpstreamAddresses
from floodwall.io.upstreams import Endpoint, NodeState, Upstreams


def resolver(table: dict[str, list[str]]) -> Any:
    async def lookup(host: str, port: int) -> list[tuple[Any, ...]]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in table[host]]
    return lookup


def upstreams(nodes: list[tuple[str, int]], table: dict[str, list[str]]) -> Upstreams:
    lookup = resolver(table)
    return Upstreams(nodes, [UpstreamAddresses(h, p, lookup=lookup) for h, p in nodes])


def order(up: Upstreams) -> list[str]:
    return [str(ep) for ep in asyncio.run(up.endpoints())]


def test_nodes_are_tried_in_the_order_given_and_a_name_is_every_address() -> None:
    up = upstreams([("mq", 5672), ("10.0.0.9", 5673)], {"mq": ["10.0.0.1", "10.0.0.2"]})
    assert order(up) == ["mq(10.0.0.1):5672", "mq(10.0.0.2):5672", "10.0.0.9:5673"]
    assert up.label == "mq:5672,10.0.0.9:5673"


def test_nodes_that_answer_go_first_then_unprobed_then_those_that_did_not() -> None:
    up = upstreams([("a", 1), ("b", 2), ("c", 3)], {"a": ["10.0.0.1"], "b": ["10.0.0.2"],
                                                    "c": ["10.0.0.3"]})
    a, b, c = (Endpoint(h, f"10.0.0.{n}", n) for n, h in ((1, "a"), (2, "b"), (3, "c")))
    assert not up.any_up
    assert up.answered(c) and not up.answered(c)  # news once
    assert up.failed(a, "refused") and not up.failed(a, "refused")
    assert order(up) == ["c(10.0.0.3):3", "b(10.0.0.2):2", "a(10.0.0.1):1"]
    assert up.any_up and up.state(b) is NodeState.UNKNOWN
    up.answered(a)  # back: first again, as given
    assert order(up)[0] == "a(10.0.0.1):1"
    assert up.states() == {"c(10.0.0.3):3": "up", "a(10.0.0.1):1": "up"}


def test_a_name_that_does_not_resolve_is_left_out_and_none_is_an_oserror() -> None:
    up = upstreams([("gone", 1), ("b", 2)], {"b": ["10.0.0.2"]})
    assert order(up) == ["b(10.0.0.2):2"]
    with pytest.raises(OSError, match="no address for gone:1: gone: Name or service"):
        asyncio.run(upstreams([("gone", 1)], {}).endpoints())


def test_only_the_probe_ends_the_connections_on_a_node_and_only_once() -> None:
    up = Upstreams([("127.0.0.1", 1), ("127.0.0.2", 1)])
    first, second = Endpoint("127.0.0.1", "127.0.0.1", 1), Endpoint("127.0.0.2", "127.0.0.2", 1)
    told: list[str] = []
    up.answered(first)
    up.watch(first, lambda reason: told.append(f"one: {reason}"))
    forget = up.watch(first, lambda reason: told.append(f"two: {reason}"))
    up.watch(second, lambda reason: told.append(f"other: {reason}"))
    up.failed(first, "refused")  # one client's connect: tells nobody
    assert told == []
    forget()  # that connection ended first
    up.failed(first, "no connection.start within 3s", probed=True)
    assert told == ["one: no connection.start within 3s"]
    up.failed(first, "still silent", probed=True)  # each watch is told once
    assert told == ["one: no connection.start within 3s"]


def test_a_silent_node_keeps_its_connections_when_no_other_may_take_them() -> None:
    """One node, slow to answer through a burst of handshakes (or hung): ending its
    connections would only bring them back to it. Two nodes, the other found down too: the
    same. The other answering again: the next silence ends them."""
    only = Endpoint("127.0.0.1", "127.0.0.1", 1)
    up = Upstreams([("127.0.0.1", 1)])
    told: list[str] = []
    up.answered(only)
    up.watch(only, told.append)
    up.failed(only, "no connection.start within 3s", probed=True)
    assert told == [] and up.state(only) is NodeState.DOWN
    first, second = Endpoint("127.0.0.1", "127.0.0.1", 1), Endpoint("127.0.0.2", "127.0.0.2", 1)
    up = Upstreams([("127.0.0.1", 1), ("127.0.0.2", 1)])
    up.answered(first)
    up.watch(first, told.append)
    up.failed(second, "refused", probed=True)
    up.failed(first, "silent", probed=True)
    assert told == []
    up.answered(second)
    up.failed(first, "silent again", probed=True)
    assert told == ["silent again"]
