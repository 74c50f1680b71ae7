"""The depth figures the flow supervisor feeds the controller (``DepthFeed``, a part the
supervisor owns): management samples (dated back by the broker's statistics interval) and
passive declares' ready counts, and the unknown-depth rules: no management figures for too
long, or none fresh since a reconnect of the own connection or of the management API."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.routing import QueueType, Topology
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.switchboard import Switchboard
from floodwall.ops.flow_metrics import FlowStats
from floodwall.ops.logs import event
from floodwall.ops.supervision import depth_is_unknown

log = logging.getLogger("floodwall.flow")


class DepthFeed:
    """What is known of each policed queue's depth, and the figures fed to the controller.

    Per queue: when the management API (or the broker's Prometheus endpoints) last gave
    figures for it (``sampled_at``), whether it was asked about it (``asked``) and ever gave
    real figures (``had_figures``), whether the own connection's passive declare of it is
    refused (``probe_refused``: depth from management samples only), and since when its
    figures are from before a reconnect (``stale``)."""

    def __init__(self, settings: FlowSettings, clock: Callable[[], float],
                 controller: FlowController, board: Switchboard, stats: FlowStats,
                 topology: Topology) -> None:
        self.settings = settings
        self.clock = clock
        self.controller = controller
        self.board = board
        self.stats = stats
        self.topology = topology
        self.sampled_at: dict[QueueKey, float] = {}  # last good management sample
        self.asked: set[QueueKey] = set()  # the management API was asked about these
        self.probe_refused: dict[QueueKey, str] = {}  # passive declare refused (not 404)
        self.stale: dict[QueueKey, float] = {}  # figures from before a reconnect (since)
        self.had_figures: set[QueueKey] = set()  # the management API gave real figures

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample of ``key``, dated back by the broker's statistics interval."""
        if key not in self.controller.queues:
            return
        self.asked.add(key)
        now = self.sampled_at[key] = self.clock()
        if not self._fresh_figure(key, sample.taken_at, management=True):
            return
        self.controller.sampled_management(
            key, replace(sample, taken_at=sample.taken_at - self.settings.management_stats_age),
            now)
        self.board.settle()

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        """A passive declare's (or declare-ok's) ready count of ``key``, if policed.

        A stream's count is the broker's statistics figure, up to its statistics interval
        old: it is dated back by ``management_stats_age``, so the ledger adds what was
        forwarded since (the estimate errs high, never low); a stream does not drain.
        """
        if key not in self.controller.queues or not self._fresh_figure(key, requested_at):
            return
        stream = self.topology.queue_type(*key) is QueueType.STREAM
        if stream:
            requested_at -= self.settings.management_stats_age
            rtt = None
        self.stats.ready_counts[key] += 1
        self.controller.sampled_ready_count(key, requested_at, ready, rtt, self.clock(),
                                            drains=not stream)
        self.board.settle()

    def forget(self, key: QueueKey) -> None:
        """``key`` is no longer policed: nothing of it is kept."""
        self.sampled_at.pop(key, None)
        self.asked.discard(key)
        self.probe_refused.pop(key, None)
        self.stale.pop(key, None)
        self.had_figures.discard(key)
        self.stats.depth_known.pop(key, None)
        self.stats.ready_counts.pop(key, None)

    # -- unknown depth ---------------------------------------------------------------------
    def depth_is_unknown(self, key: QueueKey, now: float | None = None) -> bool:
        """No management figures for ``key`` for too long (``depth_unknown_after``)."""
        return depth_is_unknown(key in self.asked, self.sampled_at.get(key),
                                self.clock() if now is None else now,
                                self.settings.depth_unknown_after)

    def depth_unknown_now(self, key: QueueKey, now: float | None = None) -> bool:
        """Unknown: no management figure for too long, or none fresh since a reconnect."""
        return key in self.stale or self.depth_is_unknown(key, now)

    def apply_unknown_depth(self) -> None:
        """Tell the controller of every policed queue whose depth is unknown now."""
        now = self.clock()
        for key in list(self.controller.queues):
            unknown = self.depth_unknown_now(key, now)
            self.stats.depth_known[key] = not unknown
            if unknown:
                self.controller.depth_unknown(key, now)
        self.board.settle()

    # -- depth after a reconnect: unknown until a fresh figure -----------------------------
    def mark_stale(self, keys: list[QueueKey], why: str) -> None:
        """The own connection or the management API came back (or went): whatever was known
        of ``keys`` is from before, perhaps before a broker restart (whose management API
        answers "empty" while the queues recover). Their depth is unknown (the policies'
        on_unknown_depth applies, the spool does not replay) until a figure asked for after
        now arrives (``_fresh_figure``)."""
        now = self.clock()
        keys = [k for k in keys if k in self.controller.queues]
        if not keys:
            return
        newly = [k for k in keys if k not in self.stale]
        for key in keys:
            self.stale[key] = now
            self.stats.depth_known[key] = False
            self.controller.depth_unknown(key, now)
        self.board.settle()
        if newly:
            event(log, "depth_unknown_until_fresh", logging.WARNING, reason=why,
                  queues=len(newly), action="on_unknown_depth applies and the spool waits "
                  "until a ready count asked for after this arrives")

    def _fresh_figure(self, key: QueueKey, asked_at: float, management: bool = False) -> bool:
        """Whether a figure asked for at ``asked_at`` may be fed: the depth is not stale, or
        this figure was asked for after the reconnect (which ends the staleness). A
        management figure ends it only for queues the passive declare cannot read."""
        since = self.stale.get(key)
        if since is None:
            return True
        if asked_at < since or (management and key not in self.probe_refused):
            return False
        del self.stale[key]
        self.stats.depth_known[key] = True
        event(log, "depth_known_again", vhost=key[0], queue=key[1],
              unknown_seconds=round(self.clock() - since, 3))
        return True
