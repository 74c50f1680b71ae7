"""What the python-qpid-proton senders of the 1.0 tests share: a connection through the proxy
that stays open until ``stop`` is set, every outcome event handed to ``outcome``, every
error condition kept in ``errors``."""

from __future__ import annotations

import threading
from typing import Any

from proton.handlers import MessagingHandler

OUTCOMES = ("accepted", "rejected", "released", "modified")


class RecordingSender(MessagingHandler):  # type: ignore[misc]
    """A sender's handler without its sending: the test's own class adds ``on_start``
    (``connect``, then its links), ``on_sendable`` and ``outcome``."""

    def __init__(self, port: int, **options: Any) -> None:
        super().__init__(**options)
        self.url = f"amqp://guest:guest@127.0.0.1:{port}"
        self.errors: list[str] = []
        self.stop = threading.Event()

    def connect(self, event: Any) -> Any:
        """Open the connection (PLAIN, no reconnect), watched for ``stop`` every 50 ms."""
        self.conn = event.container.connect(self.url, allowed_mechs="PLAIN", reconnect=False)
        event.container.schedule(0.05, self)
        return self.conn

    def on_timer_task(self, event: Any) -> None:
        if self.stop.is_set():
            self.conn.close()
            return
        event.container.schedule(0.05, self)

    def outcome(self, event: Any, kind: str) -> None:
        """One outcome event (``kind``: one of ``OUTCOMES``) for ``event.delivery``."""
        raise NotImplementedError

    def on_accepted(self, event: Any) -> None:
        self.outcome(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self.outcome(event, "rejected")

    def on_released(self, event: Any) -> None:
        self.outcome(event, "released")

    def on_modified(self, event: Any) -> None:
        self.outcome(event, "modified")

    def on_link_error(self, event: Any) -> None:
        self.errors.append(f"link {event.link.name}: {event.link.remote_condition}")

    def on_session_error(self, event: Any) -> None:
        self.errors.append(f"session: {event.session.remote_condition}")

    def on_connection_error(self, event: Any) -> None:
        self.errors.append(f"connection: {event.connection.remote_condition}")

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(f"transport: {event.transport.condition}")
