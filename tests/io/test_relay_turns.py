"""A client that floods the relay yields the event loop every ``READ_TURN_BYTES``
(floodwall/io/relay.py ``take_turn``): libuv reads a socket up to 32 times per wake-up, so a
full-speed producer's whole hold budget (8 MiB) would go through in one turn of the loop and
no timer would run meanwhile (members of a fleet would fall silent)."""

from __future__ import annotations

import asyncio
from typing import cast

import uvloop

from floodwall.io.relay import (
    READ_TURN_BYTES,
    Paused,
    RelayedConnection,
    RelaySettings,
    take_turn,
)
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats


class Transport:
    def __init__(self) -> None:
        self.reading = True
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.reading = False
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.reading = True
        self.calls.append("resume")


def _conn() -> tuple[RelayedConnection, Transport]:
    conn = RelayedConnection(RelaySettings(Upstreams([("127.0.0.1", 5672)])), RelayStats(), 1)
    t = Transport()
    conn.client = cast(asyncio.Transport, t)
    conn._loop = asyncio.get_running_loop()  # as connection_made sets it
    return conn, t


def test_a_connection_stops_reading_for_a_turn_past_its_bytes() -> None:
    async def run() -> list[tuple[bool, list[str]]]:
        conn, t = _conn()
        seen = []
        take_turn(conn, READ_TURN_BYTES - 1)
        seen.append((t.reading, list(t.calls)))  # under the turn's bytes: reading on
        take_turn(conn, 1)
        take_turn(conn, 64 * 1024)  # libuv's next read of the same wake-up, had it one
        seen.append((t.reading, list(t.calls)))
        await asyncio.sleep(0)  # the loop's next turn
        seen.append((t.reading, list(t.calls)))
        assert conn.turn_bytes == 0
        return seen

    assert uvloop.run(run()) == [(True, []), (False, ["pause"]), (True, ["pause", "resume"])]


def test_a_turn_does_not_resume_a_connection_paused_for_another_reason() -> None:
    async def run() -> Transport:
        conn, t = _conn()
        take_turn(conn, READ_TURN_BYTES)
        conn._pause_client(Paused.HOLD_BUDGET)  # its hold budget ran out meanwhile
        await asyncio.sleep(0)
        return t

    t = uvloop.run(run())
    assert not t.reading and t.calls == ["pause"]

