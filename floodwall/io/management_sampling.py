"""The flow supervisor's management sampling (``ManagementSampling``, a part the supervisor
owns): each policed queue's management sample every ``management_interval`` (but those the
fleet's poller samples: ``shared_elsewhere``), the broker's Prometheus endpoints for what the
API has no figures for or does not answer, and the API's state (every call counted, a change
logged once)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import DepthSource, ManagementSample
from floodwall.io.depth_feed import DepthFeed
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.management import (
    NO_STATISTICS,
    ManagementApi,
    ManagementError,
    NoStatistics,
)
from floodwall.io.prometheus import PagesMerged, PrometheusEndpoint
from floodwall.io.tasks import Spawn
from floodwall.io.topology import TopologyFeed
from floodwall.ops.flow_metrics import FlowStats
from floodwall.ops.logs import event
from floodwall.ops.supervision import first_round_in

log = logging.getLogger("floodwall.flow")

T = TypeVar("T")


def error_text(exc: BaseException) -> str:
    """An exception as one line for logs: its type, and its message if it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class SamplingHost(Protocol):
    """What the sampling needs of the flow supervisor."""

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A sample this sidecar asked for: fed (and offered to the fleet)."""

    def shared_elsewhere(self, key: QueueKey) -> bool:
        """Whether another sidecar of the fleet samples ``key`` for this one."""


class ManagementSampling:
    """The depth rounds (``sample_management``) and every management API call (``ask``);
    ``warm`` once the first round is in. Figures go to the owner (``SamplingHost``), which
    feeds them through the ``DepthFeed``; each round ends with its unknown-depth rules."""

    def __init__(self, settings: FlowSettings, clock: Callable[[], float],
                 controller: FlowController, api: ManagementApi,
                 prometheus: PrometheusEndpoint | None, stats: FlowStats, depth: DepthFeed,
                 feed: TopologyFeed, host: SamplingHost, spawn: Spawn) -> None:
        self.settings = settings
        self.clock = clock
        self.controller = controller
        self.api = api
        self.prometheus = prometheus
        self.stats = stats
        self.depth = depth
        self.feed = feed
        self.host = host
        self._spawn = spawn
        self.warm = False  # the first round is in
        self._wake: asyncio.Event | None = None  # set: a round at once (made by start)
        self._prometheus_kind: str | None = None  # the last failure's kind (logged once in a row)
        # While the rounds read Prometheus: the request that finds the management API back.
        self._management_back: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the rounds: one at once, then every ``management_interval``."""
        self._wake = asyncio.Event()
        self._spawn(self._management_loop(), "flow-management")

    # -- the management API ------------------------------------------------------------
    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
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
                self.depth.mark_stale(list(self.controller.queues), "management API back")
            status.since = self.clock()
        status.ok, status.kind, status.error = True, None, None

    def wake_until_warm(self) -> None:
        """Until the first round is complete, a topology answer triggers a depth round."""
        if not self.warm and self._wake is not None:
            self._wake.set()

    # -- depth: management samples -----------------------------------------------------
    async def _management_loop(self) -> None:
        wake = self._wake
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
        keys = sorted(k for k in self.controller.queues if not self.host.shared_elsewhere(k))
        if self.stats.depth_source is DepthSource.PROMETHEUS and keys:
            self._ask_management_back(keys[0])
            await self._from_prometheus(keys, statistics_off=False)
        else:
            await self._management_round(keys)
        self.depth.apply_unknown_depth()
        if not self.warm and first_round_in(self.feed.loaded or self.feed.error is not None,
                                            self.controller.queues, self.depth.asked):
            self.warm = True
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
            self.depth.asked.add(key)
            if isinstance(result, ManagementSample):
                self.depth.had_figures.add(key)
                self.host.feed_management(key, result)
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
                        return await self.ask(functools.partial(self.api.queue_sample, *key))
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
            await self.ask(functools.partial(self.api.queue_sample, *key))
        except ManagementError as exc:
            if exc.node_down:
                return
        self._switch_depth_source(DepthSource.MANAGEMENT, "the management API answers")
        if self._wake is not None:
            self._wake.set()

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
                            self.depth.had_figures.add(key)
                            self.host.feed_management(key, sample)
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
        self.depth.sampled_at[key] = now
        if key not in self.depth.had_figures:
            self.host.feed_management(key, ManagementSample(now, 0, 0, 0, 0, 0))
