"""The broker's alarms as the flow supervisor hands them to the controller (``BrokerAlarms``, a
part the supervisor owns): the management API's node alarms and the own connections'
connection.blocked notices, one reason (``ops.supervision.broker_alarm``) that holds every
publish while it is set."""

from __future__ import annotations

from collections.abc import Callable

from floodwall.control.controller import FlowController
from floodwall.io.switchboard import Switchboard
from floodwall.ops.supervision import broker_alarm, management_alarm


class BrokerAlarms:
    """The node alarms last read (this sidecar's or the fleet's alarm poller's) and each
    vhost's connection.blocked; every change goes to the controller at once."""

    def __init__(self, controller: FlowController, board: Switchboard,
                 clock: Callable[[], float]) -> None:
        self.controller = controller
        self.board = board
        self.clock = clock
        self._management: str | None = None  # the node alarms, as one reason
        self._blocked: dict[str, str] = {}  # vhost -> connection.blocked reason

    def node_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """The nodes in a memory and in a disk alarm, as the management API said."""
        self._management = management_alarm(memory, disk)
        self._update()

    def blocked(self, vhost: str, reason: str | None) -> None:
        """The own connection of ``vhost`` got connection.blocked (``reason``) or unblocked
        (None)."""
        if reason is None:
            self._blocked.pop(vhost, None)
        else:
            self._blocked[vhost] = f"connection.blocked: {reason}"
        self._update()

    def connection_lost(self, vhost: str) -> None:
        """The own connection of ``vhost`` is gone: its connection.blocked with it."""
        if self._blocked.pop(vhost, None) is not None:
            self._update()

    def _update(self) -> None:
        self.controller.set_alarm(broker_alarm(self._management, self._blocked), self.clock())
        self.board.settle()
