"""Pace at the 0-9-1 gate, driven by bytes: held publishes leave as a held queue's counts
give it tokens, in channel order, round robin over the channels, without a Channel.Flow, and
the channel stays held until its queue releases."""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody

from tests.amqp091.test_flow import Setup, pub
from tests.amqp091.wire import decode_all

KEY = ("/orders", "capped")
RTT = 0.001


def count(s: Setup, ready: int, after: float = 0.2) -> None:
    """A ready count of capped ``after`` seconds on, carried out as io/ does."""
    s.clock.t += after
    s.fc.sampled_ready_count(KEY, s.clock.t, ready, RTT, s.clock.t)
    s.board.settle()


def tags(data: bytes) -> list[int]:
    """The first body byte of each publish in ``data`` (``pub``'s tag)."""
    return [f.value[0] for _, f in decode_all(data) if isinstance(f, ContentBody)]


def test_held_publishes_leave_as_the_counts_give_tokens_round_robin() -> None:
    s = Setup(signal="flow")
    count(s, 0)
    first = b"".join(pub(1, "capped", 100, i) for i in range(21))  # 2100 > capacity 2000
    s.core.receive_from_client(first, s.clock.t)
    assert s.core.data_for_server() == first
    assert KEY in s.fc.tripped
    held = b"".join(pub(1, "capped", 100, 30 + i) for i in range(5)) \
        + b"".join(pub(2, "capped", 100, 40 + i) for i in range(5))
    s.core.receive_from_client(held, s.clock.t)
    assert s.core.data_for_server() == b""
    flows = [f for _, f in decode_all(s.core.data_for_client())
             if isinstance(f, commands.Channel.Flow)]
    assert [f.active for f in flows] == [False, False]

    count(s, 21)  # full: no tokens
    assert s.core.data_for_server() == b""
    count(s, 16)  # consumers took 5: 2000 - 1600 = 400 bytes of room; the count offers the
    # drain until the next count (a few bytes) and 2c / (m + r) = 12 / 21 of the room
    # beyond it (admission.paced): 3 publishes leave, not 4 or 5
    out = tags(s.core.data_for_server())
    assert len(out) == 3
    # in channel order within each channel; the rotation decides who goes first
    assert out in ([30, 31, 32], [40, 41, 42])
    count(s, 16)  # 3 more taken (the 3 admitted are in the count): the other channel first
    out2 = tags(s.core.data_for_server())
    assert len(out2) == 3 and {out[0], out2[0]} == {30, 40}
    assert s.core.data_for_client() == b""  # no Channel.Flow while held
    assert s.fc.is_blocked(1, 1) and s.fc.is_blocked(1, 2)
    assert s.counters.held_messages == 4


def test_a_held_queue_whose_publishers_leave_tokens_unused_releases_at_resume() -> None:
    s = Setup(signal="flow")
    count(s, 0)
    s.core.receive_from_client(b"".join(pub(1, "capped", 100, i) for i in range(21)),
                               s.clock.t)
    s.core.data_for_server()
    s.core.receive_from_client(pub(1, "capped", 100, 99), s.clock.t)
    s.core.data_for_client()
    count(s, 15)  # 600 bytes of tokens: the one held publish leaves, tokens go unused
    assert tags(s.core.data_for_server()) == [99]
    assert KEY in s.fc.tripped and s.fc.is_blocked(1, 1)  # 1600 > resume 1000
    count(s, 9)  # 900 <= resume, tokens unused: released, Channel.Flow on
    assert KEY not in s.fc.tripped and not s.fc.is_blocked(1, 1)
    flows = [f for _, f in decode_all(s.core.data_for_client())
             if isinstance(f, commands.Channel.Flow)]
    assert [f.active for f in flows] == [True]
