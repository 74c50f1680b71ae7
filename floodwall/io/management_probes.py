"""The management API side of the flow supervisor's depth (``ManagementProbes``, which
``DepthProbes`` extends): each policed queue's management sample every
``management_interval`` (or the fleet's poller's, ``shared_elsewhere``), the broker's
Prometheus endpoints for what the API has no figures for or does not answer, the API's
state, and the unknown-depth rules: no figures for too long, or none fresh since a
reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import DepthSource, ManagementSample
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.management import (
    NO_STATISTICS,
    ManagementApi,
    ManagementError,
    NoStatistics,
)
from floodwall.io.prometheus import PagesMerged, PrometheusEndpoint
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import spawn
from floodwall.io.topology import TopologyFeed
from floodwall.ops.flow_metrics import FlowStats
from floodwall.ops.logs import event
from floodwall.ops.supervision import depth_is_unknown, first_round_in

log = logging.getLogger("floodwall.flow")

T = TypeVar("T")


def error_text(exc: BaseException) -> str:
    """An exception as one line for logs: its type, and its message if it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ManagementProbes:
    """Management samples and the unknown-depth rules; ``DepthProbes`` adds the own
    connections' ready counts and the alarms."""

    settings: FlowSettings
    clock: Callable[[], float]
    controller: FlowController
    board: Switchboard
    api: ManagementApi
    prometheus: PrometheusEndpoint | None
    stats: FlowStats
    feed: TopologyFeed
    _sampled_at: dict[QueueKey, float]
    _asked: set[QueueKey]
    _probe_refused: dict[QueueKey, str]
    _stale: dict[QueueKey, float]
    _had_figures: set[QueueKey]
    _warm: bool
    _wake_management: asyncio.Event | None
    _prometheus_kind: str | None = None  # the last failure's kind (logged once in a row)
    _tasks: set[asyncio.Task[Any]]
    # While the rounds read Prometheus: the request that finds the management API back.
    _management_back: asyncio.Task[None] | None = None

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return spawn(self._tasks, coro, name, log, "flow_task_failed", error_text)

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample of ``key``, dated back by the broker's statistics interval."""
        if key not in self.controller.queues:
            return
        self._asked.add(key)
        now = self._sampled_at[key] = self.clock()
        if not self._fresh_figure(key, sample.taken_at, management=True):
            return
        self.controller.sampled_management(
            key, replace(sample, taken_at=sample.taken_at - self.settings.management_stats_age),
            now)
        self.board.settle()

    # -- the management API ------------------------------------------------------------
    async def _ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """One management API call, counted, with the API's state logged when it changes."""
        try:
            result = await call()
        except ManagementError as exc:
            self._management_failed(exc)
            raise
        except Exception as exc:  # e.g. http.client's protocol errors
            error = ManagementError("bad_reply", f"{self.api.url}: {error_text(exc)}")
            self._management_failed(error)
            raise error from exc
        finally:
            self.stats.management_requests = self.api.requests
        self._management_ok()
        return result

    def _management_failed(self, exc: ManagementError) -> None:
        self.stats.management_errors[exc.kind] += 1
        status = self.stats.management
        if status.ok is not False or status.kind != exc.kind:
            event(log, "management_api_failed", logging.WARNING, kind=exc.kind,
                  reason=str(exc), url=self.api.url,
                  action=(f"depth of policed queues becomes unknown after "
                          f"{self.settings.depth_unknown_after:g}s without figures; "
                          "their policies' on_unknown_depth applies"))
            if status.ok is not False:
                status.since = self.clock()
        status.ok, status.kind, status.error = False, exc.kind, str(exc)

    def _management_ok(self) -> None:
        status = self.stats.management
        if status.ok is not True:
            if status.ok is False:
                event(log, "management_api_recovered", url=self.api.url,
                      after_seconds=round(self.clock() - (status.since or self.clock()), 1))
                self._mark_stale(list(self.controller.queues), "management API back")
            status.since = self.clock()
        status.ok, status.kind, status.error = True, None, None

    def _wake_until_warm(self) -> None:
        """Until the first round is complete, a topology answer triggers a depth round."""
        if not self._warm and self._wake_management is not None:
            self._wake_management.set()

    # -- depth: management samples -----------------------------------------------------
    async def _management_loop(self) -> None:
        wake = self._wake_management
        assert wake is not None
        while True:
            wake.clear()
            await self.sample_management()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.settings.management_interval)

    async def sample_management(self) -> None:
        """One depth round of every policed queue (but those the fleet's poller samples:
        ``shared_elsewhere``), then the unknown-depth rule. The round asks the management
        API; while the API does not answer, the broker's Prometheus endpoints
        (``stats.depth_source``), until it answers again (``_ask_management_back``)."""
        keys = sorted(k for k in self.controller.queues if not self.shared_elsewhere(k))
        if self.stats.depth_source is DepthSource.PROMETHEUS and keys:
            self._ask_management_back(keys[0])
            await self._from_prometheus(keys, statistics_off=False)
        else:
            await self._management_round(keys)
        self.apply_unknown_depth()
        if not self._warm and first_round_in(self.feed.loaded or self.feed.error is not None,
                                             self.controller.queues, self._asked):
            self._warm = True
            event(log, "flow_ready", policed_queues=len(self.controller.queues),
                  management="ok" if self.stats.management.ok else
                  f"failing ({self.stats.management.kind})")

    async def _management_round(self, keys: list[QueueKey]) -> None:
        """Each queue's management sample. The queues the API has no figures for (statistics
        off) and those it did not answer for in time are read from the Prometheus
        endpoints; when it answered for none, the rounds after read them too."""
        results = await self._management_samples(keys)
        answered = any(not (isinstance(r, ManagementError) and r.node_down) for r in results)
        without: list[QueueKey] = []
        unanswered: list[QueueKey] = []
        for key, result in zip(keys, results, strict=True):
            if key not in self.controller.queues:
                continue  # dropped while we asked
            self._asked.add(key)
            if isinstance(result, ManagementSample):
                self._had_figures.add(key)
                self.feed_management(key, result)
            elif result is NO_STATISTICS:
                without.append(key)
            elif isinstance(result, ManagementError) and result.node_down:
                unanswered.append(key)
            # None: the API does not know it; the passive declare decides whether it is gone
        if without:
            await self._from_prometheus(without, statistics_off=True)
        if results and not answered and self.prometheus is not None:
            self._switch_depth_source(DepthSource.PROMETHEUS,
                                      self.stats.management.error or "no answer")
        if unanswered and self.prometheus is not None:
            await self._from_prometheus(unanswered, statistics_off=False)

    async def _management_samples(self, keys: list[QueueKey]
                                  ) -> list[ManagementSample | NoStatistics | ManagementError
                                            | None]:
        """Each key's management sample (or why not), in order. With Prometheus endpoints
        to turn to, a request not answered within ``management_timeout`` is given up, and
        the requests of the round not started yet with it: a hung node stalls every node's
        API (RabbitMQ gathers queue figures across the cluster) until the cluster counts it
        gone, so the next URL would not answer either."""
        limit = asyncio.Semaphore(self.settings.management_connections)
        deadline = None if self.prometheus is None else self.settings.management_timeout
        silent: list[ManagementError] = []

        async def one(key: QueueKey) -> ManagementSample | NoStatistics | ManagementError | None:
            async with limit:
                if silent:
                    return silent[0]
                try:
                    async with asyncio.timeout(deadline):
                        return await self._ask(functools.partial(self.api.queue_sample, *key))
                except ManagementError as exc:
                    return exc
                except TimeoutError:
                    error = ManagementError("timeout", f"{self.api.url}: no answer in "
                                                       f"{deadline:g}s")
                    if not silent:
                        self._management_failed(error)
                    silent.append(error)
                    return error

        return await asyncio.gather(*(one(k) for k in keys))

    def _switch_depth_source(self, source: DepthSource, reason: str) -> None:
        """The depth rounds read ``source`` from now on; logged when that is a change."""
        if self.stats.depth_source is source:
            return
        self.stats.depth_source = source
        self.stats.depth_source_switches += 1
        if source is DepthSource.PROMETHEUS:
            event(log, "depth_source_switched", logging.WARNING, source=source.value,
                  reason=reason, urls=",".join(self.prometheus.urls if self.prometheus
                                               else ()),
                  action="each round reads every node's Prometheus endpoint (a queue on a "
                         "node that does not answer has no figures); the management API "
                         "is asked again meanwhile")
        else:
            event(log, "depth_source_switched", source=source.value, reason=reason,
                  url=self.api.url)

    def _ask_management_back(self, key: QueueKey) -> None:
        """While the rounds read Prometheus: one management request at a time (every URL
        tried, each within the API's timeout) finds when the API answers again."""
        task = self._management_back
        if task is None or task.done():
            self._management_back = self._spawn(self._management_answers(key),
                                                "flow-management-back")

    async def _management_answers(self, key: QueueKey) -> None:
        try:
            await self._ask(functools.partial(self.api.queue_sample, *key))
        except ManagementError as exc:
            if exc.node_down:
                return
        self._switch_depth_source(DepthSource.MANAGEMENT, "the management API answers")
        if self._wake_management is not None:
            self._wake_management.set()

    async def _from_prometheus(self, keys: list[QueueKey], *, statistics_off: bool) -> None:
        """``keys``' figures from the broker's Prometheus endpoints, each fed as its node's
        page arrives. ``statistics_off``: the management API answered without figures, and
        a queue the endpoints have none for either is ``_no_statistics``; else the API did
        not answer, and a queue no endpoint reports (its node is the one lost) gets none:
        its depth becomes unknown in time."""
        fed: set[QueueKey] = set()
        if self.prometheus is not None:
            for vhost in sorted({k[0] for k in keys}):
                fed |= await self._prometheus_pages(vhost, {k for k in keys if k[0] == vhost})
        if statistics_off:
            now = self.clock()
            for key in keys:
                if key in self.controller.queues and key not in fed:
                    self._no_statistics(key, now)

    async def _prometheus_pages(self, vhost: str, wanted: set[QueueKey]) -> set[QueueKey]:
        """Each node's page of ``vhost`` as it arrives, the ``wanted`` queues it adds fed
        (``PagesMerged``); the queues fed."""
        assert self.prometheus is not None
        merged = PagesMerged()
        errors: list[ManagementError] = []
        answered = False
        try:
            async with contextlib.aclosing(self.prometheus.vhost_pages(vhost)) as pages:
                async for page in pages:
                    if isinstance(page, ManagementError):
                        errors.append(page)
                        continue
                    answered = True
                    for queue, sample in merged.take(page).items():
                        key = (vhost, queue)
                        if key in wanted and key in self.controller.queues:
                            self._had_figures.add(key)
                            self.feed_management(key, sample)
        finally:
            self.stats.prometheus_requests = self.prometheus.requests
        if not answered:
            self._prometheus_failed(errors[0])
        for error in errors if answered else ():  # nodes that did not answer; others did
            self._prometheus_failed(error, every_node=False)
        return {(vhost, queue) for queue in merged.samples} & wanted

    def _prometheus_failed(self, exc: ManagementError, every_node: bool = True) -> None:
        """The Prometheus endpoint (``every_node``; else one node of it) did not answer:
        counted, logged once per kind in a row."""
        kind = exc.kind
        if not self.stats.prometheus_errors or self._prometheus_kind != kind:
            which = "queues" if every_node else "the queues that node runs,"
            event(log, "prometheus_depth_failed", logging.WARNING, kind=kind, reason=str(exc),
                  action=f"{which} without management figures count as they would without "
                         "it (the passive declare's ready count, the ledger's sizes)")
        self._prometheus_kind = kind
        self.stats.prometheus_errors[kind] += 1

    def _no_statistics(self, key: QueueKey, now: float) -> None:
        """The API answered, without figures for ``key`` (no statistics yet). A queue that
        never had any is new: empty, the ledger adds what was forwarded since. One that had
        some is on a broker that restarted and is recovering its messages: not "empty" (that
        would release tripped queues into a full broker); the passive declare's ready count
        decides until the figures are back."""
        self._sampled_at[key] = now
        if key not in self._had_figures:
            self.feed_management(key, ManagementSample(now, 0, 0, 0, 0, 0))

    def shared_elsewhere(self, key: QueueKey) -> bool:
        """Whether another sidecar of the fleet samples ``key`` for this one (see
        ``FlowSupervisor``); alone, never."""
        return False

    def depth_is_unknown(self, key: QueueKey, now: float | None = None) -> bool:
        return depth_is_unknown(key in self._asked, self._sampled_at.get(key),
                                self.clock() if now is None else now,
                                self.settings.depth_unknown_after)

    def apply_unknown_depth(self) -> None:
        now = self.clock()
        for key in list(self.controller.queues):
            unknown = self.depth_unknown_now(key, now)
            self.stats.depth_known[key] = not unknown
            if unknown:
                self.controller.depth_unknown(key, now)
        self.board.settle()

    # -- depth after a reconnect: unknown until a fresh figure ---------------------------
    def depth_unknown_now(self, key: QueueKey, now: float | None = None) -> bool:
        """Unknown: no management figure for too long, or none fresh since a reconnect."""
        return key in self._stale or self.depth_is_unknown(key, now)

    def _mark_stale(self, keys: list[QueueKey], why: str) -> None:
        """The own connection or the management API came back (or went): whatever was known
        of ``keys`` is from before, perhaps before a broker restart (whose management API
        answers "empty" while the queues recover). Their depth is unknown (the policies'
        on_unknown_depth applies, the spool does not replay) until a figure asked for after
        now arrives (``_fresh_figure``)."""
        now = self.clock()
        keys = [k for k in keys if k in self.controller.queues]
        if not keys:
            return
        newly = [k for k in keys if k not in self._stale]
        for key in keys:
            self._stale[key] = now
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
        since = self._stale.get(key)
        if since is None:
            return True
        if asked_at < since or (management and key not in self._probe_refused):
            return False
        del self._stale[key]
        self.stats.depth_known[key] = True
        event(log, "depth_known_again", vhost=key[0], queue=key[1],
              unknown_seconds=round(self.clock() - since, 3))
        return True
