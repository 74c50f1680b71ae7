"""What the AMQP 1.0 core tells and asks the credit gate, as a Protocol the gate implements
(``floodwall.enforce.amqp10.gate.CreditFlow``).

The core hands the gate the frames it needs. A method returning bytes means "send these
instead of the frame" (b"" drops it). What else the gate makes goes to its outbox: frames for
either peer (``ToClient``, ``ToServer``), ``ReadEveryFrame`` (the gate consumed a delivery, so
both peers' dispositions must be renumbered from now: the core stops passing them by size),
topology changes and typed events. After each call the core moves the frames into its
outgoing data, in order, and keeps the rest for the I/O layer (``events``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from floodwall.wire.amqp10.performatives import Attach, Begin


@dataclass(frozen=True, slots=True)
class ReadEveryFrame:
    """The gate consumed a delivery: the core reads every frame of both peers from now
    (``broker_only``: the gate counts deliveries until the broker settles them, so only the
    broker's dispositions)."""

    broker_only: bool = False


class TransferHooks(Protocol):
    """The credit gate, as the 1.0 core sees it. ``fields`` are a performative's decoded
    fields; ``payload[start:end]`` a transfer's payload."""

    @property
    def outbox(self) -> Sequence[object]:
        """What the gate made since ``take_output`` last emptied it."""

    def take_output(self) -> Sequence[object]: ...

    def vhost_opened(self, vhost: str) -> None: ...

    def client_begin(self, channel: int, begin: Begin) -> None: ...

    def server_begin(self, channel: int, begin: Begin) -> None: ...

    def client_attach(self, channel: int, attach: Attach) -> None: ...

    def server_attach(self, channel: int, attach: Attach) -> None: ...

    def client_detach(self, channel: int, handle: int) -> bytes | None: ...

    def server_detach(self, channel: int, handle: int) -> bytes | None: ...

    def client_end(self, channel: int) -> None: ...

    def server_end(self, channel: int) -> None: ...

    def on_client_transfer(self, channel: int, fields: list[object], payload: bytes,
                           start: int, end: int, now: float) -> bytes | None: ...

    def transfer_run(self, channel: int, handle: int) -> tuple[int, float] | None:
        """After ``on_client_transfer`` took a whole delivery of ``handle`` unchanged (or, at
        the start of a read, after a run the last read ended with): how many more whole
        deliveries of that link, and payload bytes, the gate would book as
        ``on_transfer_run`` does (``floodwall.wire.amqp10.runs``); None: read the next one
        the usual way."""

    def on_transfer_run(self, channel: int, handle: int, count: int, payload_bytes: int,
                        unsettled: list[int], now: float) -> int:
        """A run of ``count`` whole deliveries within what ``transfer_run`` allowed;
        ``unsettled``: the delivery-ids of those sent unsettled. Returns how far the broker's
        delivery-ids run behind the client's on the session (0: the run is relayed
        unchanged; else with each id less that, ``renumber_run``)."""

    def server_transfer_run(self, channel: int, handle: int) -> bool:
        """After ``on_server_transfer`` took a whole delivery of the broker's ``handle``:
        whether the following whole deliveries of that link are read as a run and booked
        with ``on_server_transfer_run``."""

    def on_server_transfer_run(self, channel: int, handle: int, count: int) -> None:
        """A run of ``count`` whole deliveries from the broker on ``handle``, relayed
        unchanged."""

    def on_client_flow(self, channel: int, fields: list[object]) -> bytes | None: ...

    def on_client_disposition(self, channel: int, fields: list[object]) -> bytes | None: ...

    def on_server_transfer(self, channel: int, fields: list[object]) -> None: ...

    def on_server_flow(self, channel: int, fields: list[object], now: float) -> bytes | None: ...

    def on_server_disposition(self, channel: int, fields: list[object],
                              now: float) -> bytes | None: ...

    def server_settle_run(self, channel: int, alone: bool) -> bool:
        """Before ``on_server_settled`` for a broker disposition of ``channel``: whether it
        and the dispositions alike that follow it in the read may be handed over as ranges
        of consecutive ids (``scan_settlements``, ``on_server_settle_run``), as booking them
        one by one would do nothing else (no link whose credit waits on settlements).
        ``alone``: no frame follows it in the read (a run of one: worth it only where the
        session is renumbered, which ``on_server_settled`` cannot do)."""

    def on_server_settle_run(self, channel: int, first: int, last: int, state: int,
                             now: float) -> list[tuple[int, int]] | None:
        """A range of a run of the broker's settlements, booked; the client's ids of it as
        ranges where they differ from the broker's (the run's dispositions are then written
        again, one per range, ``settle_frames``); None: the run passes unchanged."""

    def on_server_settled(self, channel: int, receiver: bool, first: int, last: int,
                          state: int, now: float) -> bool:
        """A broker disposition read by ``peek_disposition`` alone (its role, first, last
        and state's descriptor code). True: the gate took it, the frame passes unchanged;
        False: the gate took nothing, decode the frame and call ``on_server_disposition``."""
