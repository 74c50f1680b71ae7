"""The proxy's own AMQP 1.0 sender of held messages (``floodwall.enforce.amqp10.held``): the
``SendHeld`` commands of every connection go out over one own 1.0 connection per vhost (the
proxy's AMQP credentials, as the spool's replay), a sender link per address, in the order
they were handed over; each one's outcome goes back to the connection it came from.

The broker's outcome is handed back as the broker sent it (accepted, rejected with its error,
released, modified). A message the broker did not settle because the own link or connection
went (``Confirm.LOST``), or that could not be sent because the connection could not be made,
is handed back ``released`` (the client may send it again: at-least-once); one whose link
the broker refused (a node that is not there) is handed back ``rejected`` with the broker's
reason. RabbitMQ 4 ends the own session over such an address, so a new address is attached
only once what is in flight on the connection has settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

from floodwall.enforce.amqp10.links import rejected_outcome
from floodwall.enforce.commands import SendHeld
from floodwall.io.amqp10_client import RELEASED, Amqp10Client, Amqp10Sender
from floodwall.io.amqp_client import AmqpClientError, Confirm
from floodwall.io.tasks import spawn
from floodwall.io.tls import UpstreamTlsContext
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials
from floodwall.ops.logs import event
from floodwall.wire.amqp10.types import Described, ULong

log = logging.getLogger("floodwall.held")

Settled = Callable[[int, Described], None]
"""Where a held message's outcome goes: its token and the delivery state."""

_RELEASED: Final = Described(ULong(RELEASED), [])
CONTAINER_ID: Final = "floodwall-held"


def _outcome(token: int, settled: Settled
             ) -> tuple[Callable[[object], None], Callable[[asyncio.Future[Confirm]], None]]:
    """The two ways a sent message's outcome comes (the broker's state; else its future:
    lost, or refused before it went), told to ``settled`` once."""
    told: list[bool] = []

    def on_state(state: object) -> None:
        if not told:
            told.append(True)
            settled(token, state if isinstance(state, Described) else _RELEASED)

    def done(fut: asyncio.Future[Confirm]) -> None:
        if not told:
            told.append(True)
            result = Confirm.LOST if fut.cancelled() else fut.result()
            settled(token, rejected_outcome(
                "floodwall: the message is larger than the broker takes")
                if result is Confirm.NACK else _RELEASED)

    return on_state, done


class HeldSender:
    """Sends held messages, per vhost one after another (``send``); ``close`` at shutdown."""

    def __init__(self, upstreams: Upstreams, credentials: AmqpCredentials,
                 tls: UpstreamTlsContext | None = None, connect_timeout: float = 5.0) -> None:
        self.upstreams = upstreams
        self.credentials = credentials
        self.tls = tls
        self.connect_timeout = connect_timeout
        self._queues: dict[str, asyncio.Queue[tuple[SendHeld, Settled]]] = {}
        self._clients: dict[str, Amqp10Client] = {}
        self._senders: dict[tuple[str, str], Amqp10Sender] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sent = 0
        self.failed = 0

    def send(self, command: SendHeld, settled: Settled) -> None:
        """Queue ``command`` for its vhost; ``settled(token, state)`` is told its outcome."""
        queue = self._queues.get(command.vhost)
        if queue is None:
            queue = self._queues[command.vhost] = asyncio.Queue()
            spawn(self._tasks, self._run(command.vhost, queue), f"held-sender:{command.vhost}",
                  log, "held_sender_failed")
        queue.put_nowait((command, settled))

    async def _run(self, vhost: str, queue: asyncio.Queue[tuple[SendHeld, Settled]]) -> None:
        in_flight: set[asyncio.Future[Confirm]] = set()  # sent, not settled yet
        while True:
            command, settled = await queue.get()
            try:
                client = await self._client(vhost)
            except (AmqpClientError, OSError, TimeoutError) as exc:
                self._failed(vhost, command, settled, str(exc) or repr(exc), _RELEASED)
                continue
            try:
                sender = self._senders.get((vhost, command.address))
                if sender is None or not sender.open:
                    # RabbitMQ 4 ends the session when the address is not there: what is
                    # in flight on it settles first, so only this message pays for it.
                    if in_flight:
                        await asyncio.wait(in_flight)
                    sender = await client.open_sender(command.address, self.connect_timeout)
                    self._senders[(vhost, command.address)] = sender
            except AmqpClientError as exc:
                self._failed(vhost, command, settled, str(exc), rejected_outcome(
                    f"floodwall: the broker refused the held message's address: {exc}"))
                continue
            except (OSError, TimeoutError) as exc:
                self._failed(vhost, command, settled, str(exc) or repr(exc), _RELEASED)
                continue
            on_state, done = _outcome(command.token, settled)
            try:
                fut = await sender.send(command.payload, command.message_format, on_state)
            except (AmqpClientError, OSError) as exc:
                self._failed(vhost, command, settled, str(exc), _RELEASED)
                continue
            self.sent += 1
            in_flight.add(fut)
            fut.add_done_callback(in_flight.discard)
            fut.add_done_callback(done)

    async def _client(self, vhost: str) -> Amqp10Client:
        """The vhost's own 1.0 connection, (re)connected if need be."""
        client = self._clients.get(vhost)
        if client is not None and client.connected:
            return client
        if client is not None:
            self._forget(vhost)
            with contextlib.suppress(Exception):
                await client.close()
        client = Amqp10Client(self.upstreams, self.credentials.username,
                              self.credentials.password, vhost, CONTAINER_ID, tls=self.tls)
        await client.connect(self.connect_timeout)
        self._clients[vhost] = client
        return client

    def _failed(self, vhost: str, command: SendHeld, settled: Settled, reason: str,
                state: Described) -> None:
        self.failed += 1
        event(log, "held_message_not_sent", logging.WARNING, vhost=vhost,
              address=command.address, reason=reason,
              action="settled released" if state is _RELEASED else "settled rejected")
        settled(command.token, state)

    def _forget(self, vhost: str) -> None:
        self._clients.pop(vhost, None)
        for key in [k for k in self._senders if k[0] == vhost]:
            del self._senders[key]

    async def close(self) -> None:
        """Stop sending; close the own connections (what they had in flight is lost: the
        connections it came from are closing too)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        self._senders.clear()
