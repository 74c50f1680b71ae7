"""A TCP relay that records every byte each way, per connection: put one between a client and
floodwall and one between floodwall and the broker, and compare what each side sent with what
the other side got."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Recorded:
    """One relayed connection: ``up`` (client to target) and ``down`` (target to client)."""

    up: bytearray = field(default_factory=bytearray)
    down: bytearray = field(default_factory=bytearray)
    up_done: threading.Event = field(default_factory=threading.Event)
    down_done: threading.Event = field(default_factory=threading.Event)

    @property
    def closed(self) -> bool:
        return self.up_done.is_set() and self.down_done.is_set()


class RecordingRelay:
    """Listens on 127.0.0.1 (``port``); each accepted connection is relayed to ``target`` by
    two threads, every byte recorded (``connections``, in accept order)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.connections: list[Recorded] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._spawn(self._accept)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            rec = Recorded()
            with self._lock:
                self.connections.append(rec)
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream, rec.up, rec.up_done)
            self._spawn(self._pump, upstream, client, rec.down, rec.down_done)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, log: bytearray,
              done: threading.Event) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                log += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            done.set()
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def find(self, up: bytes, down: bytes) -> Recorded | None:
        """A connection that carried exactly ``up`` one way and ``down`` the other."""
        with self._lock:
            conns = list(self.connections)
        for rec in conns:
            if bytes(rec.up) == up and bytes(rec.down) == down:
                return rec
        return None

    def close(self) -> None:
        self._stopping = True
        self.server.close()
        with self._lock:
            for s in self._sockets:
                s.close()
