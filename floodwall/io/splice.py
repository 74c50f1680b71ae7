"""Bodies moved in the kernel: one direction of a connection moving opaque runs with splice(2).

The core says how many of a peer's next bytes are the body of a frame whose head has left
(an opaque run: ``FrameRelay.opaque_min``). While it lasts, the reading side's transport is
paused and a ``SpliceLane`` moves those bytes socket -> pipe -> socket with
``os.splice(SPLICE_F_MOVE | SPLICE_F_NONBLOCK)``, non-blocking, on the event loop's
readiness of its own duplicates of the two sockets (a transport's descriptor cannot be
watched twice). It never reads them into Python. After a run it reads a little itself
(``HEAD_READ``: the frame end, the next method, content header and body frame head) and
hands it to the core, which may open the next run; when a whole ``HEAD_READ`` opens none,
the transport reads again.

Bounds: at most ``pipe_size`` bytes sit in the lane's pipe (counted by the owner as held
memory); nothing is taken from the reading socket while the pipe is full, and nothing is
written while the writing side's transport still has bytes buffered (they go first: the
stream stays in order). A slow receiver fills the pipe and stops the reading: TCP's own
backpressure does the rest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
from enum import Enum
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import asyncio

    from floodwall.wire.relaycore import Side

#: The flags of every splice(2): move pages where the kernel can, never block on the pipe
#: (the sockets are non-blocking already).
SPLICE_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
#: More of the run follows (the socket may wait to fill a segment, as MSG_MORE).
SPLICE_MORE: Final = getattr(os, "SPLICE_F_MORE", 4)
#: What a lane reads itself after a run: a frame end, a basic.publish or basic.deliver, its
#: content header and the next body frame's head fit with room to spare; more would copy
#: the next body's first bytes.
HEAD_READ: Final = 1024
#: A lane's pipe (F_SETPIPE_SZ): one read's worth, the relay's write high-water mark.
PIPE_SIZE: Final = 256 * 1024
#: Bytes a lane moves in one wake-up at most (its pipe's worth).
TURN_BYTES: Final = 256 * 1024
_F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ: Final = getattr(fcntl, "F_GETPIPE_SZ", 1032)


def splice_available() -> bool:
    """splice(2) is there: Linux, and an ``os`` with ``splice`` (Python 3.10+)."""
    return sys.platform.startswith("linux") and hasattr(os, "splice")


class LaneOwner(Protocol):
    """The connection a lane moves bytes for (``floodwall.io.relay.RelayedConnection``)."""

    def lane_moved(self, side: Side, n: int) -> None:
        """``n`` bytes of ``side``'s run reached the other peer (the core counts them)."""

    def lane_piped(self, delta: int) -> None:
        """The bytes in the lane's pipe changed by ``delta`` (the memory budget counts them)."""

    def lane_head(self, side: Side, data: bytes) -> None:
        """Bytes the lane read itself after a run: into the core, as any read of ``side``."""

    def lane_may_read(self, side: Side) -> bool:
        """Nothing but the lane keeps ``side``'s socket from being read now."""

    def lane_idle(self, side: Side) -> None:
        """No run follows: ``side``'s transport reads again."""

    def lane_failed(self, side: Side, reason: str, mid_frame: bool, dropped: int) -> None:
        """A socket of the lane ended or failed (``reason``); ``mid_frame``: inside a run,
        the other peer has part of a frame; ``dropped``: bytes of the run that were in the
        pipe."""


    def lane_broken(self, side: Side, exc: Exception) -> None:
        """The lane or the owner raised (the proxy's fault): the connection ends."""


class LaneState(Enum):
    """Where a lane is."""

    IDLE = "idle"  # the transport reads
    RUN = "run"  # moving an opaque run through the pipe
    HEAD = "head"  # the run has left; reading the next frames' heads itself
    CLOSED = "closed"


class SpliceLane:
    """One direction of one connection: its pipe and its duplicates of the two sockets."""

    __slots__ = ("dst", "dst_transport", "left", "loop", "owner", "pipe_r", "pipe_size",
                 "pipe_w", "piped", "reading", "side", "src", "state", "writing")

    def __init__(self, loop: asyncio.AbstractEventLoop, owner: LaneOwner, side: Side,
                 src_fd: int, dst_fd: int, dst_transport: asyncio.Transport,
                 pipe_size: int = PIPE_SIZE) -> None:
        """Duplicates ``src_fd`` and ``dst_fd`` and makes the pipe (OSError: no lane)."""
        self.loop, self.owner, self.side = loop, owner, side
        self.dst_transport = dst_transport
        self.src = self.dst = self.pipe_r = self.pipe_w = -1
        try:
            self.src = os.dup(src_fd)
            self.dst = os.dup(dst_fd)
            self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            with contextlib.suppress(OSError):  # past pipe-user-pages-soft: what it gives
                fcntl.fcntl(self.pipe_w, _F_SETPIPE_SZ, pipe_size)
            self.pipe_size = fcntl.fcntl(self.pipe_w, _F_GETPIPE_SZ)
        except OSError:
            self._close_fds()
            raise
        self.left = 0  # run bytes not yet in the pipe
        self.piped = 0  # bytes in the pipe
        self.reading = self.writing = False
        self.state = LaneState.IDLE

    def start(self, n: int) -> None:
        """Move the next ``n`` bytes of the reading socket (the transport is paused)."""
        self.left = n
        self.state = LaneState.RUN
        self._want_read(True)

    def close(self) -> int:
        """Stop watching and close the duplicates and the pipe; returns how many bytes of
        the run were in the pipe (dropped)."""
        dropped = self.piped
        if self.state is LaneState.CLOSED:
            return 0
        self.state = LaneState.CLOSED
        self._want_read(False)
        self._want_write(False)
        if self.piped:
            self.owner.lane_piped(-self.piped)
            self.piped = 0
        self._close_fds()
        return dropped

    # -- readiness ---------------------------------------------------------------------
    def _readable(self) -> None:
        """Runs and heads one after another while the socket has bytes, up to
        ``TURN_BYTES`` a wake-up (then the loop's other callbacks go first): a wake-up
        per step cost more than the copy it saves."""
        budget = TURN_BYTES
        try:
            while budget > 0:
                if self.state is LaneState.RUN:
                    n = self._fill()
                elif self.state is LaneState.HEAD:
                    n = self._head()
                else:
                    return
                if n <= 0:
                    return
                budget -= n
        except Exception as exc:  # the proxy's fault: this connection alone ends
            self._broken(exc)

    def _writable(self) -> None:
        try:
            if self.state is LaneState.RUN:
                self._push()
        except Exception as exc:
            self._broken(exc)

    def _broken(self, exc: Exception) -> None:
        self.close()
        self.owner.lane_broken(self.side, exc)

    def _fill(self) -> int:
        """Socket -> pipe, as much of the run as there is and the pipe has room for, then
        onwards in one piece (a peer that gets a body in fewer, larger pieces spends less
        on it). Returns the bytes taken (0: none now)."""
        taken = 0
        ended, error = False, None  # the socket ended (error: how), after what it gave
        while (want := min(self.left, self.pipe_size - self.piped)) > 0:
            try:
                got = os.splice(self.src, self.pipe_w, want, flags=SPLICE_FLAGS)
            except BlockingIOError:
                break
            except OSError as exc:
                ended, error = True, exc
                break
            if got == 0:
                ended = True
                break
            self.left -= got
            self.piped += got
            taken += got
        if taken:
            self.owner.lane_piped(taken)
        if ended:
            self._failed(error)
            return 0
        self._push()
        if self.state is LaneState.RUN and (not self.left or self.piped >= self.pipe_size):
            self._want_read(False)
            return 0
        return taken

    def _push(self) -> None:
        """Pipe -> socket, once what the writing transport buffered has left."""
        if not self.piped:
            return
        if self.dst_transport.get_write_buffer_size():
            self._want_write(True)  # the transport's own writes go first
            return
        flags = SPLICE_FLAGS | SPLICE_MORE if self.left else SPLICE_FLAGS
        try:
            put = os.splice(self.pipe_r, self.dst, self.piped, flags=flags)
        except BlockingIOError:
            self._want_write(True)
            return
        except OSError as exc:
            self._failed(exc)
            return
        self.piped -= put
        self.owner.lane_piped(-put)
        self.owner.lane_moved(self.side, put)
        if self.piped:
            self._want_write(True)
            return
        self._want_write(False)
        if self.left:
            self._want_read(True)
        else:  # the run has left: its frame end and what follows, read here
            self.state = LaneState.HEAD
            self._want_read(True)

    def _head(self) -> int:
        """After a run: read the next frames' heads into the core; a new run, or idle.
        Returns the bytes read (0: none now, or no run follows)."""
        if not self.owner.lane_may_read(self.side):
            self._idle()
            return 0
        try:
            data = os.read(self.src, HEAD_READ)
        except BlockingIOError:
            return 0
        except OSError as exc:
            self._failed(exc)
            return 0
        if not data:
            self._failed(None)
            return 0
        self.owner.lane_head(self.side, data)  # may start() the next run, or close us
        if self.state is LaneState.HEAD:
            # A whole HEAD_READ and no run: frames that are not bodies, the transport's
            # large reads take them. Less: the socket is drained (the peer is between
            # writes), the next bytes are waited for here (small reads: as small as
            # what comes).
            if len(data) == HEAD_READ:
                self._idle()
            return 0
        return len(data)

    def _idle(self) -> None:
        self.state = LaneState.IDLE
        self._want_read(False)
        self.owner.lane_idle(self.side)

    def _failed(self, exc: OSError | None) -> None:
        reason = "end of stream" if exc is None else (
            errno.errorcode.get(exc.errno or 0, "") or type(exc).__name__) + f": {exc.strerror}"
        mid_frame = self.state is LaneState.RUN
        dropped = self.close()
        self.owner.lane_failed(self.side, reason, mid_frame, dropped)

    def _want_read(self, on: bool) -> None:
        if on and not self.reading and self.state is not LaneState.CLOSED:
            self.loop.add_reader(self.src, self._readable)
            self.reading = True
        elif not on and self.reading:
            self.loop.remove_reader(self.src)
            self.reading = False

    def _want_write(self, on: bool) -> None:
        if on and not self.writing and self.state is not LaneState.CLOSED:
            self.loop.add_writer(self.dst, self._writable)
            self.writing = True
        elif not on and self.writing:
            self.loop.remove_writer(self.dst)
            self.writing = False

    def _close_fds(self) -> None:
        for fd in (self.src, self.dst, self.pipe_r, self.pipe_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.src = self.dst = self.pipe_r = self.pipe_w = -1
