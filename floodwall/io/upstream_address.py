"""The broker's addresses for the relay's upstream connections, looked up once and reused.

``loop.create_connection(name, port)`` asks the system resolver for ``name`` every time: with
a DNS name as ``--upstream`` (``rabbitmq.prod.svc``, where a pod's ``ndots: 5`` turns one
lookup into several queries) each new client would pay a lookup before its upstream could
connect. So one lookup serves every connection for ``ttl`` seconds (concurrent connects
wait on the same one), a failed connect forgets the answer so the next client looks up
again (a broker that moved is found at once), and an IP address is never looked up (the
handshake at 1,000 new connections a second).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

#: Seconds one lookup's answer is used: resolvers do not hand the DNS TTL to getaddrinfo,
#: so this is short; a failed connect forgets it sooner.
ADDRESS_TTL = 5.0

Lookup = Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class UpstreamAddresses:
    """The addresses of ``host`` to connect to, in the resolver's order."""

    def __init__(self, host: str, port: int, ttl: float = ADDRESS_TTL,
                 clock: Callable[[], float] = time.monotonic,
                 lookup: Lookup | None = None) -> None:
        self.host = host
        self.port = port
        self.ttl = ttl
        self._clock = clock
        self._lookup_fn = lookup
        self.numeric = _is_ip(host)
        self._addresses: list[str] = [host] if self.numeric else []
        self._expires = 0.0
        self._pending: asyncio.Task[list[str]] | None = None
        self.lookups = 0  # lookups made (for tests and /state)

    async def resolve(self) -> list[str]:
        """The addresses to try, at most ``ttl`` seconds old (an IP address: itself)."""
        if self.numeric or (self._addresses and self._clock() < self._expires):
            return self._addresses
        if self._pending is None:
            self._pending = asyncio.get_running_loop().create_task(self._look_up())
            self._pending.add_done_callback(self._looked_up)
        # shielded: a client that goes away does not cancel the lookup others wait on
        return await asyncio.shield(self._pending)

    def failed(self) -> None:
        """A connect to what ``resolve`` gave failed: look up again for the next one."""
        if not self.numeric:
            self._addresses, self._expires = [], 0.0

    def worked(self, address: str) -> None:
        """A connect to ``address`` worked after the ones before it failed: try it first."""
        if address in self._addresses:
            self._addresses = [address, *(a for a in self._addresses if a != address)]

    async def _look_up(self) -> list[str]:
        if self._lookup_fn is not None:
            infos = await self._lookup_fn(self.host, self.port)
        else:
            infos = await asyncio.get_running_loop().getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM)
        self.lookups += 1
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise OSError(f"no address for {self.host}")
        self._addresses, self._expires = addresses, self._clock() + self.ttl
        return addresses

    def _looked_up(self, task: asyncio.Task[list[str]]) -> None:
        self._pending = None
        if not task.cancelled():
            task.exception()  # retrieved: the waiters got it; no "never retrieved" warning

    def close(self) -> None:
        """Cancel a lookup under way (shutdown)."""
        if self._pending is not None:
            self._pending.cancel()


__all__ = ["ADDRESS_TTL", "UpstreamAddresses"]
