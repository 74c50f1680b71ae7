"""The proxy's file descriptor limit, and how many client connections it allows.

Each relayed connection holds two descriptors (the client's socket and its upstream), so a
sidecar with ``RLIMIT_NOFILE`` soft limit ``S`` relays at most ``(S - FD_RESERVE) / 2``
connections; past that, accepting a client or connecting its upstream fails with EMFILE.
Many runtimes start processes with a soft limit of 1,024 and a hard limit far above it, so
the proxy raises its soft limit to the hard one at start (as Go's runtime and the JVM do),
and says in its start-up line how many connections that allows (10,000
connections need a limit of at least 20,064).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Final

#: Descriptors the proxy needs besides two per connection: listeners, the admin server,
#: the event loop, its own broker connections (probes, policing, fleet), spool and
#: telemetry files, stdio.
FD_RESERVE: Final = 64
#: Below this many connections the start-up line is a warning.
FEW_CONNECTIONS: Final = 1000


@dataclass(frozen=True)
class FdLimit:
    """The soft and hard ``RLIMIT_NOFILE`` in force, and what it was before the raise."""

    soft: int
    hard: int
    was: int

    @property
    def connections(self) -> int:
        """Client connections this limit allows: two descriptors each, after the reserve."""
        return connection_capacity(self.soft)


def connection_capacity(soft: int) -> int:
    """``(soft - FD_RESERVE) // 2``, at least 0; a soft limit of RLIM_INFINITY is huge."""
    if soft == resource.RLIM_INFINITY:
        return 2**31
    return max(0, (soft - FD_RESERVE) // 2)


def raise_fd_limit() -> FdLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (never lowers it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    was = soft
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        # an infinite hard limit: ask for what Linux allows by default (fs.nr_open)
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # the kernel caps it lower: keep what there is
            pass
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FdLimit(soft, hard, was)


__all__ = ["FD_RESERVE", "FEW_CONNECTIONS", "FdLimit", "connection_capacity", "raise_fd_limit"]
