"""The proxy's own sender of held 1.0 messages (``floodwall.io.held_sender``) against the real
broker: messages go to their address, each outcome comes back once as the broker gave it; an
address the broker refuses comes back ``rejected`` with its reason; a broker that cannot be
reached, ``released``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from floodwall.dev.devbroker import BrokerEndpoint, free_port
from floodwall.enforce.commands import SendHeld
from floodwall.io.amqp10_client import ACCEPTED, REJECTED, RELEASED
from floodwall.io.held_sender import HeldSender
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials
from floodwall.wire.amqp10.types import Described
from tests.amqp10.streams import data_section
from tests.conftest import wait_for
from tests.integration.support import numbered, ready_count
from tests.io.test_amqp10_client import new_queue  # noqa: F401 (a fixture)

DEADLINE = 20.0


def body(i: int) -> bytes:
    return data_section(numbered(i, 100))


def outcomes(sender: HeldSender, commands: list[SendHeld]) -> dict[int, list[Described]]:
    got: dict[int, list[Described]] = {}

    async def main() -> None:
        every = asyncio.Event()

        def settled(token: int, state: Described) -> None:
            got.setdefault(token, []).append(state)
            if len(got) == len(commands):
                every.set()

        for c in commands:
            sender.send(c, settled)
        try:
            await asyncio.wait_for(every.wait(), DEADLINE)
        finally:
            await sender.close()

    asyncio.run(main())
    return got


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_held_messages_go_in_order_and_each_outcome_comes_back_once(
        broker: BrokerEndpoint, new_queue: Callable[..., str]) -> None:  # noqa: F811
    queue = new_queue("held")
    to = f"/queues/{queue}" if broker.version >= (4, 0) else f"/amq/queue/{queue}"
    missing = "/queues/no-such-queue-x" if broker.version >= (4, 0) \
        else "/amq/queue/no-such-queue-x"
    sender = HeldSender(Upstreams([(broker.host, broker.amqp_port)]),
                        AmqpCredentials(broker.username, broker.password))
    commands = [SendHeld(i, "/", to, 0, body(i)) for i in range(20)]
    commands.append(SendHeld(20, "/", missing, 0, body(20)))
    got = outcomes(sender, commands)
    assert sorted(got) == list(range(21)) and all(len(v) == 1 for v in got.values())
    assert {int(got[i][0].descriptor) for i in range(20)} == {ACCEPTED}  # type: ignore[call-overload]
    # RabbitMQ 4 refuses a link to a queue that is not there (rejected, with its reason);
    # 3.10's plugin takes it and drops the message: `accepted`, its outcome, passed on.
    refused = got[20][0]
    expected = REJECTED if broker.version >= (4, 0) else ACCEPTED
    assert int(refused.descriptor) == expected  # type: ignore[call-overload]
    wait_for(lambda: ready_count(broker, queue) == 20, 10, what="20 messages in the queue")


def test_a_broker_that_cannot_be_reached_releases_them() -> None:
    sender = HeldSender(Upstreams([("127.0.0.1", free_port())]), AmqpCredentials("u", "p"),
                        connect_timeout=1.0)
    got = outcomes(sender, [SendHeld(i, "/", "/queues/q", 0, body(i)) for i in range(2)])
    assert {t: [int(s.descriptor) for s in v] for t, v in got.items()} == {  # type: ignore[call-overload]
        0: [RELEASED], 1: [RELEASED]}
