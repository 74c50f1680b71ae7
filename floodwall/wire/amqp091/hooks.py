"""What the 0-9-1 core tells and asks the publish gate, as a Protocol the gate implements
(``floodwall.enforce.amqp091.PublishFlow``), and what the core knows about its client.

The core calls the gate only through ``PublishHooks``. The gate answers by return value
(whether it took frames out of the stream) and appends what it makes to its outbox: frames
for either peer (``ToClient``, ``ToServer``), ``ForgetChannel`` when a channel the proxy closed
on both sides is free again, and typed events. After each call the core moves the frames into
its outgoing data in order and keeps the events for the I/O layer (``events``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pamqp.common import FieldTable

from floodwall.wire.amqp091.framing import Buffer


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """What a client says about itself in connection.start-ok's client_properties."""

    product: str | None
    version: str | None
    platform: str | None
    information: str | None
    properties: FieldTable  # all of them, e.g. ``capabilities``

    @classmethod
    def from_properties(cls, properties: FieldTable) -> ClientInfo:
        """Read the well-known keys; absent ones are None, non-text ones are str()-ed."""

        def text(key: str) -> str | None:
            value = properties.get(key)
            if value is None:
                return None
            if isinstance(value, bytes | bytearray):
                return bytes(value).decode("utf-8", "replace")
            return str(value)

        return cls(
            product=text("product"),
            version=text("version"),
            platform=text("platform"),
            information=text("information"),
            properties=properties,
        )


@dataclass(frozen=True, slots=True)
class ForgetChannel:
    """A channel the proxy closed on both sides is closed: the core forgets it."""

    channel: int


class PublishHooks(Protocol):
    """The publish gate, as the 0-9-1 core sees it. Offsets are into ``buf``; a method
    returning an offset (or True) took frames up to it (or the frame) out of the stream."""

    @property
    def slow_channels(self) -> frozenset[int]:
        """The channels whose every client frame the gate must see now (a channel holds, a
        publish waits for its content): the core reads their frames one at a time, and
        the connection's other channels stay on its scan. Asked at every method frame the
        core stops at; empty, and cheap, while no channel needs it."""

    @property
    def outbox(self) -> Sequence[object]:
        """What the gate made since ``take_output`` last emptied it."""

    def take_output(self) -> Sequence[object]: ...

    def client_identified(self, client: ClientInfo) -> None: ...

    def vhost_opened(self, vhost: str) -> None: ...

    def on_publish(self, channel: int, buf: Buffer, offset: int, end: int,
                   header_end: int | None, now: float) -> int | None: ...

    def publish_run(self, channel: int, buf: Buffer, header_offset: int, now: float
                    ) -> tuple[float, float] | None:
        """After a publish whose content header is at ``buf[header_offset]`` passed
        ``on_publish`` untouched: at most how many more whole publishes of the channel with
        the same method frame, and how many body bytes, the gate books at once with
        ``on_publish_run`` as it would one at a time (``floodwall.wire.amqp091.runs``); None:
        read the next one the usual way."""

    def on_publish_run(self, channel: int, count: int, body_bytes: int, now: float) -> None:
        """A run of ``count`` whole publishes within what ``publish_run`` allowed, relayed
        untouched; ``body_bytes``: the body sizes their content headers give, in all."""

    def hold_run(self, channel: int, buf: Buffer, header_offset: int, now: float) -> bool:
        """After ``on_publish`` held a publish whose content header is at
        ``buf[header_offset]`` (its body still to come): True if the gate holds the
        channel's next whole publishes with the same method frame at once with
        ``on_hold_run``, as it would hold them one at a time; False: read them the usual
        way."""

    def on_hold_run(self, channel: int, buf: Buffer, body_offset: int, body_end: int,
                    ends: list[int], now: float) -> None:
        """The held publish's body frames ``buf[body_offset:body_end]``, then whole publishes
        with its method frame ending at each of ``ends`` (``hold_run`` allowed them):
        all held, as ``on_content`` and ``on_publish`` would have held them."""

    def on_content(self, channel: int, buf: Buffer, offset: int, end: int,
                   now: float) -> bool: ...

    def on_method_while_held(self, channel: int, key: int, buf: Buffer, offset: int,
                             end: int) -> bool: ...

    def hold_connection_close(self, frame: bytes) -> bool: ...

    def on_flow_reply(self, channel: int) -> bool: ...

    def on_confirm_select(self, channel: int) -> None: ...

    def on_tx_select(self, channel: int) -> None: ...

    def on_channel_gone(self, channel: int) -> None: ...

    def on_broker_confirm(self, channel: int, buf: Buffer, offset: int, end: int,
                          nack: bool) -> bool: ...

    def on_broker_close_ok(self, channel: int) -> bool: ...
