"""Link credit of one client sender link as the proxy relays it (AMQP 1.0 section 2.6.7).

Pure arithmetic, no frames: ``SenderCredit`` is the state ``floodwall.enforce.amqp10.gate``
keeps per
policed link, in the spirit of h2's ``windows.py``.

The proxy stands between a client *sender* and the broker's *receiver* endpoint of one link.
Towards the client it acts as the receiver (it decides the credit the client sees); towards
the broker it acts as the sender. Both views use *limits*: the delivery-count up to which the
sender may go, ``delivery-count + link-credit`` (2.6.7: ``link-credit_snd := delivery-count_rcv
+ link-credit_rcv - delivery-count_snd``). Limits survive transfers crossing a flow in flight,
which plain credit figures do not.

Numbering: every delivery the client sends is forwarded, so the two sides count the same
deliveries, except where the proxy itself consumed broker credit (it completed a drain for a
client that had fewer credits than the broker granted) or consumed a client delivery (it
dropped and settled one). ``offset`` is ``broker numbering - client numbering``, modulo 2^32.

Every delivery-count, limit and offset is an RFC-1982 serial number: a ``uint`` that wraps at
2^32 and compares within half the range.

A limit the proxy granted is never taken back (``SenderCredit.grant``). Transfers the client
sent under a limit are still on the wire when the proxy decides to lower it, so a flow with a
lower limit can carry a delivery-count behind the client's own and a link-credit smaller than
what the client has in flight: by 2.6.7 the client's credit is then negative. python-qpid-proton
(proton-c, 0.40) keeps that figure in a ``uint32_t`` (``pn_link_state_t.link_credit``,
``pn_do_flow``): it wraps to about 2^32 and the client sends everything its application has
queued, far past every limit it was ever given. So a trip stops the top-ups instead, and the
client's outstanding credit, at most one window, is what reaches the queue after the trip (the
overshoot; ``floodwall.enforce.amqp10.gate``). Only the broker's own flows can lower a limit,
as they would
without the proxy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Final

SERIAL_BITS: Final = 32
MODULUS: Final = 1 << SERIAL_BITS
HALF: Final = 1 << (SERIAL_BITS - 1)
MASK: Final = MODULUS - 1


def serial_add(a: int, n: int) -> int:
    """``a + n`` modulo 2^32 (``n`` may be negative)."""
    return (a + n) & MASK


def serial_diff(a: int, b: int) -> int:
    """``a - b`` as a signed distance in (-2^31, 2^31]: positive when ``a`` is after ``b``."""
    d = (a - b) & MASK
    return d - MODULUS if d > HALF else d


def serial_lt(a: int, b: int) -> bool:
    """RFC 1982 ``a < b``."""
    return serial_diff(a, b) < 0


def serial_min(a: int, b: int) -> int:
    return a if serial_diff(a, b) <= 0 else b


def serial_max(a: int, b: int) -> int:
    return a if serial_diff(a, b) >= 0 else b


@dataclass(frozen=True, slots=True)
class LinkFlow:
    """The link fields of one flow frame: who sent it decides which are meaningful."""

    delivery_count: int | None
    link_credit: int
    drain: bool = False
    echo: bool = False


@dataclass(slots=True)
class SenderCredit:
    """Credit of one client sender link: the broker's grant, capped by the proxy's window.

    ``delivery_count`` counts the client's deliveries as the proxy saw them (its receiver
    view). ``broker_limit`` is how far the broker lets the client go, in client numbering;
    ``granted`` how far the proxy last told the client it may go; ``high_water`` the furthest
    it ever did (a transfer below it can be one sent before a reduction arrived; at or past it,
    the client broke the rules).
    """

    delivery_count: int
    offset: int = 0
    broker_limit: int | None = None  # None: the broker has granted nothing yet
    granted: int | None = None  # None: the proxy has told the client nothing yet
    high_water: int | None = None
    drain: bool = False  # the broker asked the sender to drain

    # -- what the broker says ----------------------------------------------------------------
    def broker_flow(self, flow: LinkFlow) -> None:
        """A flow from the broker (the receiver): its delivery-count is in broker numbering."""
        count = flow.delivery_count
        if count is None:  # the receiver has not heard from the sender yet: initial count
            base = self.delivery_count
        else:
            base = serial_add(count, -self.offset)
        self.broker_limit = serial_add(base, flow.link_credit)
        self.drain = flow.drain

    # -- what the proxy tells the client -----------------------------------------------------
    @property
    def broker_credit(self) -> int:
        """Credit the broker leaves the client now (0 when exhausted or not granted)."""
        if self.broker_limit is None:
            return 0
        return max(0, serial_diff(self.broker_limit, self.delivery_count))

    @property
    def client_credit(self) -> int:
        """Credit the client has left by the proxy's last word (0 when exhausted)."""
        if self.granted is None:
            return 0
        return max(0, serial_diff(self.granted, self.delivery_count))

    def grant(self, window: int | None) -> LinkFlow:
        """The flow the client gets: the broker's credit, at most ``window`` more than the
        client has used (None: no cap; 0: nothing more while the queue is tripped).

        Never below the limit the client already has (see the module's docstring), unless
        the broker lowered its own: the limit is ``max(count + min(broker credit, window),
        min(granted, broker limit))``, and never behind ``count``. Remembers it as granted.
        """
        # The serial arithmetic inline (a top-up per read of a fast sender): d <= HALF is
        # serial_diff(a, b) >= 0 for d = (a - b) & MASK.
        count = self.delivery_count
        broker = self.broker_limit
        credit = 0  # broker_credit
        if broker is not None:
            d = (broker - count) & MASK
            if d <= HALF:
                credit = d
        if window is not None and window < credit:
            credit = window
        limit = (count + credit) & MASK
        kept = self.granted
        if kept is not None:
            if broker is not None and (kept - broker) & MASK <= HALF:
                kept = broker  # serial_min(kept, broker)
            if (limit - kept) & MASK > HALF:  # serial_lt(limit, kept)
                limit = kept
                credit = serial_diff(limit, count)
        self.granted = limit
        high_water = self.high_water
        if high_water is None or (high_water - limit) & MASK > HALF:  # serial_max
            self.high_water = limit
        return LinkFlow(count, credit, self.drain)

    def wants_top_up(self, window: int) -> bool:
        """True when the client is down to half the window and the broker allows more.

        ``client_credit`` and ``broker_credit`` worked out inline (asked after every transfer).
        """
        count = self.delivery_count
        granted = self.granted
        left = 0
        if granted is not None:
            d = (granted - count) & MASK
            if d <= HALF:  # serial_diff(granted, count) >= 0
                left = d
        if left * 2 > window:
            return False
        limit = self.broker_limit
        if limit is None:
            return False
        d = (limit - count) & MASK
        return d <= HALF and d > left

    def has_over_half(self, window: int) -> bool:
        """True when the client has more than half ``window`` left of the proxy's grant:
        ``wants_top_up`` is False for that window and every smaller one."""
        granted = self.granted
        if granted is None:
            return False
        d = (granted - self.delivery_count) & MASK
        return d <= HALF and d * 2 > window

    # -- what the client does -----------------------------------------------------------------
    def transfer(self) -> bool:
        """The first frame of a delivery from the client: count it.

        False when the client had no credit for it: it was at or past every limit the proxy
        ever granted (2.6.7: the receiver may then detach with transfer-limit-exceeded).
        """
        count = self.delivery_count
        high_water = self.high_water
        # serial_lt(count, high_water), inline: this runs for every delivery.
        within = high_water is not None and (count - high_water) & MASK > HALF
        self.delivery_count = (count + 1) & MASK
        return within

    def room(self) -> int:
        """How many more deliveries ``transfer`` would count as within a limit the proxy
        granted (0 when none, or before any grant)."""
        high_water = self.high_water
        if high_water is None:
            return 0
        d = (high_water - self.delivery_count) & MASK
        return d if d <= HALF else 0

    def transferred(self, count: int) -> None:
        """``count`` deliveries ``transfer`` would each have found within ``room``: count them."""
        self.delivery_count = (self.delivery_count + count) & MASK

    def dropped(self) -> None:
        """The proxy consumed (settled itself, never forwarded) the delivery just counted.

        The broker never saw it, so its grant is untouched: the broker's limit, the same in
        its numbering, lies one further in the client's (a broker that renews credit only as
        deliveries reach it, as RabbitMQ 4 does, would otherwise never top the link up)."""
        self.offset = serial_add(self.offset, -1)
        if self.broker_limit is not None:
            self.broker_limit = serial_add(self.broker_limit, 1)

    def client_flow(self, flow: LinkFlow) -> LinkFlow:
        """A flow from the client (the sender), rewritten for the broker.

        The sender may advance its delivery-count (a drain: credit it will not use). When the
        broker asked for a drain and the client has drained what the proxy gave it, the proxy
        drains the rest of the broker's grant too: the broker gets delivery-count at its limit
        and link-credit 0, as if the client had had all of it.
        """
        if flow.delivery_count is not None and serial_diff(flow.delivery_count,
                                                           self.delivery_count) > 0:
            self.delivery_count = flow.delivery_count
            if self.granted is not None and serial_lt(self.granted, self.delivery_count):
                self.granted = self.delivery_count
        count = self.delivery_count
        credit = self.broker_credit
        if flow.drain and self.drain and self.client_credit == 0 and self.broker_limit is not None:
            # Drained by the client: consume the broker's remaining credit on its behalf.
            self.offset = serial_add(self.offset, credit)
            self.broker_limit = self.delivery_count
            credit = 0
        return LinkFlow(serial_add(count, self.offset), credit, flow.drain, flow.echo)


@dataclass(slots=True)
class DeliveryIds:
    """One session's delivery-ids as the client numbers them against the broker's.

    The proxy consumes some of a client's deliveries itself (settled ``rejected`` under
    ``overflow: reject``, written to the spool under ``overflow: spool``, or sent on a link
    the proxy detached): the broker never sees them, so its delivery-ids run on without the
    gaps (2.7.5: a session's delivery-ids are consecutive). ``dropped`` is how many the proxy
    consumed so far: a forwarded delivery's broker id is its client id minus ``dropped`` (as it
    was when the delivery's first frame came).

    ``shifts`` remembers where the difference grew, as (first broker id, client - broker from
    there on); ``base`` is the difference before the oldest entry. Dispositions name ranges,
    and a range of broker ids maps to client ids that skip what the proxy consumed (and the
    other way round). Entries older than ``horizon`` deliveries are forgotten: a disposition
    never reaches that far back in practice (RabbitMQ settles each delivery as it confirms it).
    """

    dropped: int = 0
    base: int = 0
    shifts: deque[tuple[int, int]] = field(default_factory=deque)
    horizon: int = 1 << 20

    def drop(self, client_id: int) -> None:
        """The delivery ``client_id`` (the newest so far) will not reach the broker."""
        start = serial_add(client_id, -self.dropped)  # the broker id the next one gets
        self.dropped += 1
        shifts = self.shifts
        if shifts and shifts[-1][0] == start:
            shifts[-1] = (start, self.dropped)
        else:
            shifts.append((start, self.dropped))
        while len(shifts) > 1 and serial_diff(start, shifts[0][0]) > self.horizon:
            self.base = shifts.popleft()[1]

    def client_ranges(self, first: int, last: int) -> list[tuple[int, int]]:
        """The client ids of the broker ids ``first..last``, as ranges (in order)."""
        shifts = self.shifts
        i = len(shifts) - 1
        while i >= 0 and serial_diff(shifts[i][0], first) > 0:
            i -= 1
        shift = shifts[i][1] if i >= 0 else self.base
        out: list[tuple[int, int]] = []
        start = first
        for j in range(i + 1, len(shifts)):
            at, after = shifts[j]
            if serial_diff(at, last) > 0:
                break
            out.append((serial_add(start, shift), serial_add(at, shift - 1)))
            start, shift = at, after
        out.append((serial_add(start, shift), serial_add(last, shift)))
        return out

    def broker_ranges(self, first: int, last: int) -> list[tuple[int, int]]:
        """The broker ids of the client ids ``first..last``, as ranges: the ids the proxy
        consumed are left out (the list is empty when it consumed them all)."""
        shifts = self.shifts
        i = len(shifts) - 1
        while i >= 0 and serial_diff(serial_add(shifts[i][0], shifts[i][1]), first) > 0:
            i -= 1
        shift = shifts[i][1] if i >= 0 else self.base
        out: list[tuple[int, int]] = []
        cur = first
        for j in range(i + 1, len(shifts)):
            at, after = shifts[j]
            hole_start = serial_add(at, shift)  # client ids the proxy consumed start here
            if serial_diff(hole_start, last) > 0:
                break
            if serial_diff(hole_start, cur) > 0:
                _extend(out, serial_add(cur, -shift), serial_add(hole_start, -shift - 1))
            cur = serial_add(at, after)  # the first client id after the hole
            shift = after
            if serial_diff(cur, last) > 0:
                return out
        _extend(out, serial_add(cur, -shift), serial_add(last, -shift))
        return out


def _extend(ranges: list[tuple[int, int]], first: int, last: int) -> None:
    """Append ``first..last``, joined to the last range when it follows on from it (the ids
    on both sides of a consumed one are consecutive on the broker's side)."""
    if ranges and serial_add(ranges[-1][1], 1) == first:
        ranges[-1] = (ranges[-1][0], last)
    else:
        ranges.append((first, last))
