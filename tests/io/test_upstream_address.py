"""The broker's name is looked up once for many connections, with the system
resolver behind it (``localhost``), not once per client."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from floodwall.io.upstream_address import UpstreamAddresses


class _Counted:
    """The real resolver, counted."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, host: str, port: int) -> list[tuple[Any, ...]]:
        self.calls += 1
        await asyncio.sleep(0)  # let concurrent connects pile up on it
        return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)


def test_concurrent_connects_share_one_lookup_until_it_expires() -> None:
    async def run() -> None:
        now = [100.0]
        lookup = _Counted()
        addresses = UpstreamAddresses("localhost", 5672, ttl=5.0, clock=lambda: now[0],
                                      lookup=lookup)
        answers = await asyncio.gather(*(addresses.resolve() for _ in range(50)))
        assert lookup.calls == 1 and addresses.lookups == 1
        assert all(a == answers[0] for a in answers)
        assert {"127.0.0.1", "::1"} & set(answers[0])
        now[0] += 4.9
        await addresses.resolve()
        assert lookup.calls == 1  # still fresh
        now[0] += 0.2
        await addresses.resolve()
        assert lookup.calls == 2  # older than ttl: looked up again

    asyncio.run(run())


def test_a_failed_connect_forgets_the_answer_and_a_later_address_that_worked_goes_first(
) -> None:
    async def run() -> None:
        lookup = _Counted()
        addresses = UpstreamAddresses("localhost", 5672, lookup=lookup)
        first = await addresses.resolve()
        addresses.failed()
        assert await addresses.resolve() == first
        assert lookup.calls == 2
        addresses.worked(first[-1])
        assert (await addresses.resolve())[0] == first[-1]
        assert lookup.calls == 2

    asyncio.run(run())


def test_an_ip_address_is_never_looked_up() -> None:
    async def run() -> None:
        lookup = _Counted()
        for host in ("127.0.0.1", "::1"):
            addresses = UpstreamAddresses(host, 5672, lookup=lookup)
            assert await addresses.resolve() == [host]
            addresses.failed()
            assert await addresses.resolve() == [host]
        assert lookup.calls == 0

    asyncio.run(run())


def test_a_name_that_does_not_resolve_fails_every_waiter_and_is_asked_again() -> None:
    async def run() -> None:
        lookup = _Counted()
        addresses = UpstreamAddresses("no-such-host.invalid", 5672, lookup=lookup)
        results = await asyncio.gather(*(addresses.resolve() for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, OSError) for r in results), results
        assert lookup.calls == 1
        with pytest.raises(OSError):
            await addresses.resolve()
        assert lookup.calls == 2

    asyncio.run(run())
