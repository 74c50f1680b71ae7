"""The depth estimate: samples reconciled with the ledger of forwarded publishes."""

from __future__ import annotations

import math

import pytest

from floodwall.control.depth import (
    IN_FLIGHT_MARGIN,
    Depth,
    DepthSource,
    ManagementSample,
    QueueDepth,
)


def _mgmt(at: float, ready: int, unacked: int = 0, body: int = 100) -> ManagementSample:
    return ManagementSample(at, ready, unacked, (ready + unacked) * body, ready * body,
                            unacked * body)


def test_unknown_until_a_sample_arrives() -> None:
    q = QueueDepth()
    q.forwarded(1.0, 100)
    assert q.estimate() is None


def test_management_sample_plus_what_was_forwarded_after_it() -> None:
    q = QueueDepth()
    q.forwarded(0.0, 100)  # long before the sample: already in it
    q.sampled_management(_mgmt(10.0, ready=5))
    assert q.estimate() == Depth(500, 5)
    q.forwarded(10.5, 100)
    q.forwarded(10.6, 300)
    assert q.estimate() == Depth(900, 7)


def test_publishes_in_flight_when_sampled_are_counted_not_missed() -> None:
    q = QueueDepth()
    q.forwarded(10.0 - IN_FLIGHT_MARGIN / 2, 100)  # maybe not yet enqueued at 10.0
    q.sampled_management(_mgmt(10.0, ready=0))
    assert q.estimate() == Depth(100, 1)


def test_ready_count_is_fresher_than_management_and_uses_its_sizes() -> None:
    q = QueueDepth()
    q.sampled_management(_mgmt(10.0, ready=50, unacked=2, body=200))
    q.sampled_ready_count(12.0, ready=10)
    assert q.estimate() == Depth(10 * 200, 10)  # ready only: the 2 unacked are not counted
    q.forwarded(12.5, 200)
    assert q.estimate() == Depth(11 * 200, 11)


def test_capacity_counts_ready_messages_not_the_consumers_unacknowledged() -> None:
    """A consumer's prefetch (delivered, not yet acknowledged) is not depth: 200 unacked
    x 1 KiB must not eat 200 KiB of a 256 KiB capacity. From the management
    API alone the estimate takes its ready figures; the broker's word is the same."""
    q = QueueDepth()
    q.sampled_management(_mgmt(10.0, ready=5, unacked=200, body=1024))
    assert q.estimate() == Depth(5 * 1024, 5)
    assert q.broker_depth() == Depth(5 * 1024, 5)
    q.sampled_ready_count(10.5, ready=7)
    assert q.estimate() == Depth(7 * 1024, 7)


def test_ready_messages_without_ready_bytes_take_the_mean_size() -> None:
    """Counts without byte statistics (a fresh queue, a stream) are not a depth of 0 bytes."""
    q = QueueDepth()
    for t in range(3):
        q.forwarded(float(t), 300)
    q.sampled_management(ManagementSample(10.0, 4, 1, 0, 0, 0, bytes_known=False))
    assert q.estimate() == Depth(4 * 300, 4)
    q.sampled_management(ManagementSample(11.0, 4, 0, 0, 0, 0))  # counts before bytes
    assert q.estimate() == Depth(4 * 300, 4)


def test_an_older_answer_never_replaces_a_newer_one() -> None:
    q = QueueDepth()
    q.sampled_ready_count(5.0, ready=3)
    q.sampled_ready_count(4.0, ready=99)
    est = q.estimate()
    assert est is not None and est.messages == 3


def test_average_size_falls_back_to_the_ledger() -> None:
    q = QueueDepth()
    for t in range(4):
        q.forwarded(float(t), 250)
    q.sampled_ready_count(100.0, ready=4)
    assert q.estimate() == Depth(1000, 4)


def test_ledger_stays_small_under_a_firehose() -> None:
    q = QueueDepth()
    t = 0.0
    for i in range(100_000):
        t = i * 0.0001  # 10k msg/s for 10 s
        q.forwarded(t, 1024)
        if i % 2000 == 0:
            q.sampled_ready_count(t, ready=i)
    assert len(q._ledger) < 2_000
    est = q.estimate()
    assert est is not None and est.messages >= 98_000


def test_the_in_flight_margin_follows_the_probes_round_trip() -> None:
    fast, slow = QueueDepth(), QueueDepth()
    for q in (fast, slow):
        q.forwarded(9.9, 100)  # 100 ms before the probe was sent
        q.forwarded(9.995, 100)  # 5 ms before
    fast.sampled_ready_count(10.0, ready=2, rtt=0.001)  # 20 ms margin: the 2nd counts again
    slow.sampled_ready_count(10.0, ready=2, rtt=0.2)  # margin 400 ms: both counted again
    assert fast.estimate() == Depth(300, 3)
    assert slow.estimate() == Depth(400, 4)


@pytest.mark.parametrize("rtt", [0.001, 0.05, 0.4])
def test_a_burst_inside_the_margin_is_counted_twice_at_most(rtt: float) -> None:
    """The trip estimate errs high by what was forwarded inside a count's margin and is
    already in the count: at most once more. So a queue a count showed empty, fed by one
    fast sender with no consumer, trips again past half its capacity of real messages, not
    past all of it (tests/integration/test_amqp10_flow.py's released 1.0 link: 38-66 of its
    1,040-byte messages before the 64 KiB queue's second trip; never fewer than 32)."""
    capacity, size = 64 * 1024, 1040
    q = QueueDepth()
    q.forwarded(5.0, size)  # before the queue was emptied: long out of every margin
    q.sampled_ready_count(10.0, ready=0, rtt=rtt)
    n = capacity // 2 // size  # 31 messages of a burst, 0.2 ms apart
    for i in range(n):
        q.forwarded(10.001 + i * 0.0002, size)
    for seen in range(n + 1):  # a count asked for right after it, holding ``seen`` of them
        q.sampled_ready_count(10.01 + seen * 1e-6, ready=seen, rtt=rtt)
        est = q.estimate()
        assert est is not None and n <= est.messages <= 2 * n
        assert est.bytes <= 2 * n * size <= capacity  # not over: no trip on real n
    assert q.estimate() == Depth(2 * n * size, 2 * n)  # every one of them counted twice


def test_headroom_is_where_the_estimate_crosses_the_limits() -> None:
    import math

    q = QueueDepth()
    assert q.headroom(1000, 10) is None  # depth unknown
    q.forwarded(0.0, 100)
    q.sampled_management(_mgmt(10.0, ready=5))  # 500 bytes, 5 messages
    rebases = q.rebases
    headroom = q.headroom(1000, 8)
    assert headroom is not None
    max_bytes_total, max_messages_total = headroom
    while q.forwarded_messages_total < max_messages_total:
        q.forwarded(10.5, 100)
        est = q.estimate()
        assert est is not None and est.messages <= 8 and est.bytes <= 1000
    q.forwarded(10.5, 100)
    est = q.estimate()
    assert est is not None and est.messages == 9  # one past the limit: past the headroom
    assert q.forwarded_messages_total > max_messages_total
    for over in (False, True):  # bytes: 1000 is at the limit, 1100 past it
        q.forwarded(10.5, 100)
        est = q.estimate()
        assert est is not None and (est.bytes > 1000) is over
        assert (q.forwarded_bytes_total > max_bytes_total) is over
    assert q.headroom(None, None) == (math.inf, math.inf)
    assert q.rebases == rebases
    q.sampled_ready_count(11.0, 0)
    assert q.rebases == rebases + 1


def test_release_decisions_do_not_trust_a_count_taken_right_after_a_burst() -> None:
    """A burst forwarded 50 ms before a ready count may not all be in it (the broker is still
    enqueueing it): the settled estimate keeps it, the fast one (for trips) trusts the count."""
    from floodwall.control.depth import SETTLE

    q = QueueDepth()
    q.sampled_ready_count(10.0, ready=0, rtt=0.001)
    for i in range(10):
        q.forwarded(10.2 + i * 0.001, 100)  # a burst of 10
    q.sampled_ready_count(10.25, ready=4, rtt=0.001)  # 50 ms later: 4 of them enqueued
    fast, settled = q.estimate(), q.estimate(settled=True)
    assert fast is not None and settled is not None
    assert fast.messages == 4  # everything up to 10.23 taken as counted
    assert settled.messages == 14  # the burst is within SETTLE: counted on top
    q.sampled_ready_count(10.2 + 0.01 + SETTLE, ready=10, rtt=0.001)  # all in by now
    assert q.estimate(settled=True) == q.estimate() == Depth(10 * q.average_body_bytes(), 10)


@pytest.mark.parametrize("rtt", [0.001, 0.05, 0.4])
def test_tracked_deliveries_count_once_whatever_the_round_trip(rtt: float) -> None:
    """A queue fed by 1.0 deliveries the broker settles one by one: a count asked for with
    ``unsettled`` of them not settled holds every other one forwarded before it, so the
    estimate is the count, those unsettled and what came after, whatever the count's margin
    (the margin alone would count every delivery of the last 2 x rtt twice)."""
    q = QueueDepth()
    q.forwarded(5.0, 100, tracked=1)
    q.sampled_ready_count(6.0, ready=0, rtt=rtt)
    for i in range(200):  # 200 over the second before the count, 5 ms apart
        q.forwarded(9.0 + i * 0.005, 100, tracked=1)
    q.count_asked(10.0, unsettled=7)
    q.forwarded(10.002, 100, tracked=1)  # while the count is on its way
    q.sampled_ready_count(10.0, ready=30, rtt=rtt)
    assert q.estimate() == Depth(3800, 38)  # 30 counted + 7 unsettled + 1 after the ask
    assert q.estimate(settled=True) == Depth(3800, 38)
    untracked = QueueDepth()  # the same publishes, not tracked: the margin counts them again
    untracked.forwarded(5.0, 100)
    untracked.sampled_ready_count(6.0, ready=0, rtt=rtt)
    for i in range(200):
        untracked.forwarded(9.0 + i * 0.005, 100)
    untracked.count_asked(10.0, unsettled=0)
    untracked.forwarded(10.002, 100)
    untracked.sampled_ready_count(10.0, ready=30, rtt=rtt)
    margin = min(max(2 * rtt, 0.02), 1.0)
    in_margin = sum(1 for i in range(200) if 9.0 + i * 0.005 >= 10.0 - margin)
    est = untracked.estimate()
    assert est is not None
    assert abs(est.messages - (30 + in_margin + 1)) <= 2  # (the ledger's 5 ms entries)


def test_a_count_takes_up_to_its_allowance_of_the_unsettled_to_be_in_it() -> None:
    """With an ``allowance``, that many of the deliveries unsettled when the count was asked
    for are taken to be in it (the rest counted on top): a broker that keeps a sender's
    whole credit unsettled does not make an empty queue look full."""
    def counted(unsettled: int, allowance: int) -> Depth | None:
        q = QueueDepth()
        q.forwarded(5.0, 100, tracked=1)
        q.sampled_ready_count(6.0, ready=0, rtt=0.001)
        for i in range(50):
            q.forwarded(9.0 + i * 0.01, 100, tracked=1)
        q.count_asked(10.0, unsettled=unsettled, allowance=allowance)
        q.sampled_ready_count(10.0, ready=0, rtt=0.001)
        assert q.excluded == min(unsettled, allowance)
        return q.estimate()

    assert counted(40, 0) == Depth(4000, 40)  # all counted (no allowance)
    assert counted(40, 30) == Depth(1000, 10)  # 30 taken to be in the count
    assert counted(40, 50) == Depth(0, 0)  # all of them


def test_what_the_count_took_in_is_counted_back_as_fewer_are_unsettled() -> None:
    """As the broker settles, at most the deliveries unsettled now can be among those the
    count took in without seeing them: the others are counted back (never taken back by
    more deliveries in flight), and the headroom shrinks with them; the next count starts
    afresh."""
    q = QueueDepth()
    q.forwarded(5.0, 100, tracked=1)
    q.sampled_ready_count(6.0, ready=0, rtt=0.001)
    for i in range(40):
        q.forwarded(9.0 + i * 0.01, 100, tracked=1)
    q.count_asked(10.0, unsettled=40, allowance=30)
    q.sampled_ready_count(10.0, ready=0, rtt=0.001)
    assert q.estimate() == Depth(1000, 10) and q.headroom(5000, None) == (4000 + 4100, math.inf)
    assert q.count_back(35) == 0  # 35 unsettled: all 30 may still be among them
    assert q.count_back(25) == 5 and q.estimate() == Depth(1500, 15)
    assert q.headroom(5000, None) == (3500 + 4100, math.inf)
    assert q.count_back(28) == 0 and q.count_back(0) == 25  # (more in flight: none back)
    assert q.estimate() == Depth(4000, 40) == q.estimate(settled=True)
    q.count_asked(11.0, unsettled=0, allowance=30)
    q.sampled_ready_count(11.0, ready=40, rtt=0.001)
    assert q.counted_back == 0 and q.estimate() == Depth(4000, 40)


def test_untracked_publishes_inside_the_margin_still_count_beside_tracked_ones() -> None:
    """Mixed: 0-9-1 publishes (untracked) forwarded within the margin may not be in the
    count, whatever the tracked deliveries say; those before the margin are taken as in it."""
    q = QueueDepth()
    q.forwarded(1.0, 100, tracked=1)
    q.sampled_ready_count(2.0, ready=0, rtt=0.01)  # margin 20 ms
    q.forwarded(9.0, 100)  # untracked, long before: in the count
    for i in range(10):
        q.forwarded(9.99 + i * 0.001, 100, tracked=1)  # inside the margin, all settled
    for i in range(4):
        q.forwarded(9.995 + i * 0.001, 100)  # untracked, inside the margin
    q.count_asked(10.0, unsettled=0)
    q.sampled_ready_count(10.0, ready=11, rtt=0.01)
    assert q.estimate() == Depth(1500, 15)  # the count + the 4 untracked of the margin


def test_a_count_asked_without_a_note_keeps_the_margin() -> None:
    """A count whose asker noted nothing (a stream's, dated back; a management sample) is
    reconciled by the margin alone, tracked deliveries or not."""
    noted, plain = QueueDepth(), QueueDepth()
    for q in (noted, plain):
        q.forwarded(9.995, 100, tracked=1)
    noted.count_asked(10.0, unsettled=0)
    noted.sampled_ready_count(10.0, ready=1, rtt=0.001)
    plain.sampled_ready_count(10.0, ready=1, rtt=0.001)
    assert noted.estimate() == Depth(100, 1)
    assert plain.estimate() == Depth(200, 2)  # inside the 20 ms margin: counted again


def test_unanswered_counts_are_forgotten() -> None:
    q = QueueDepth()
    q.forwarded(1.0, 100, tracked=1)
    for i in range(20):  # counts that never come back
        q.count_asked(2.0 + i, unsettled=1)
    assert len(q._asked) <= 8
    q.count_asked(30.0, unsettled=0)
    q.sampled_ready_count(30.0, ready=1, rtt=0.001)
    assert q._asked == {}
    assert q.estimate() == Depth(100, 1)


def test_a_stream_has_counts_without_bytes_so_bytes_come_from_the_ledger_mean() -> None:
    q = QueueDepth()
    for i in range(4):
        q.forwarded(1.0 + i, 250)
    q.sampled_management(ManagementSample(20.0, 40, 0, 0, 0, 0, bytes_known=False))
    assert q.average_body_bytes() == 250
    assert q.estimate() == Depth(40 * 250, 40)


def test_management_documents_of_a_stream_say_the_bytes_are_unknown() -> None:
    from floodwall.io.management import sample_from_queue_doc

    stream = sample_from_queue_doc({"name": "s", "messages_ready": 30,
                                    "messages_unacknowledged": 0}, 1.0)
    classic = sample_from_queue_doc({"name": "c", "messages_ready": 30, "message_bytes": 30,
                                     "message_bytes_ready": 30,
                                     "messages_unacknowledged": 0}, 1.0)
    empty = sample_from_queue_doc({"name": "e", "messages_ready": 0, "message_bytes": 0,
                                   "messages_unacknowledged": 0}, 1.0)
    assert stream is not None and classic is not None and empty is not None
    assert not stream.bytes_known and classic.bytes_known and empty.bytes_known
    # no statistics yet (just declared, or a restarted broker recovering): no figure at all,
    # not "empty"
    assert sample_from_queue_doc({"name": "f"}, 1.0) is None


def test_counts_ahead_of_their_byte_figures_are_not_read_as_empty() -> None:
    """The management plugin collects a queue's counts and its byte figures in separate
    passes (one collector per core metrics table): a loaded broker answers "33 ready, 0
    bytes" for a queue that just filled. Those bytes are unknown, not 0: the estimate takes
    the mean body size from the ledger and stays at the queue's real depth (it read 0 and
    released a full queue: the spool end-to-end test's 192-222 KiB in a 32 KiB queue)."""
    from floodwall.io.management import sample_from_queue_doc

    q = QueueDepth()
    for i in range(33):
        q.forwarded(1.0 + i * 0.01, 1024)
    stale = sample_from_queue_doc({"name": "q", "messages_ready": 33, "messages": 33,
                                   "messages_unacknowledged": 0, "message_bytes": 0,
                                   "message_bytes_ready": 0,
                                   "message_bytes_unacknowledged": 0}, 2.0)
    assert stale is not None and not stale.bytes_known
    q.sampled_management(stale)
    assert q.estimate() == Depth(33 * 1024, 33)
    q.sampled_ready_count(3.0, ready=33, rtt=0.001)  # a real-time count, newer
    assert q.average_body_bytes() == 1024
    assert q.estimate() == q.estimate(settled=True) == Depth(33 * 1024, 33)


def test_falling_for_counts_the_run_of_counts_each_below_the_one_before() -> None:
    """A fall longer than ``FALL_AFTER`` is how long the counts have fallen; a count that
    does not fall (the same, a rise, or an empty queue after an empty one) ends it."""
    d = QueueDepth()
    seen = []
    for at, ready in ((1.0, 900), (1.008, 880), (1.016, 850), (1.024, 820), (1.032, 790),
                      (1.04, 790), (1.048, 700), (1.056, 650), (1.064, 651), (1.072, 0),
                      (1.08, 0)):
        d.sampled_ready_count(at, ready, rtt=0.001)
        seen.append(round(d.falling_for(at), 3))
    # from the first fall (1.008): 8 ms (not past FALL_AFTER, 15 ms), 16, 24; 1.04 did not
    # fall; ...
    assert seen == [0.0, 0.0, 0.0, 0.016, 0.024, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    d.sampled_ready_count(1.2, 0, rtt=0.001)
    for at, ready in ((1.3, 100), (1.31, 90), (1.33, 80), (1.36, 60)):
        d.sampled_ready_count(at, ready, rtt=0.001)
    assert d.falling_for(1.36) == pytest.approx(0.05)  # since the first count that fell


def test_drain_rate_from_successive_ready_counts_and_the_ledger() -> None:
    """Messages that left the ready state between two counts: what was ready, plus what the
    ledger forwarded in between, less what is ready now; averaged, with the interval."""
    d = QueueDepth()
    d.sampled_ready_count(10.0, 100, rtt=0.005)  # margin 0.02 s
    assert d.drain_rate is None and d.sample_interval is None
    for i in range(30):  # 30 publishes forwarded between the counts
        d.forwarded(10.05 + i * 0.001, 1024)
    d.sampled_ready_count(10.2, 80, rtt=0.005)  # 100 + 30 - 80 = 50 drained in 0.2 s
    assert d.drain_rate == pytest.approx(250.0)
    assert d.sample_interval == pytest.approx(0.2)
    d.sampled_ready_count(10.4, 80, rtt=0.005)  # nothing forwarded, nothing drained
    assert d.drain_rate == pytest.approx(0.7 * 250.0)
    d.sampled_ready_count(10.3, 0, rtt=0.005)  # an older answer: ignored
    assert d.drain_rate == pytest.approx(0.7 * 250.0)
    d.sampled_ready_count(10.6, 200, rtt=0.005)  # grew without publishes: never negative
    assert d.drain_rate == pytest.approx(0.49 * 250.0)


def test_a_stream_does_not_drain_whatever_its_lagging_counts_say() -> None:
    """A stream's count is a statistics figure refreshed every few seconds: while it lags,
    what was forwarded meanwhile looks gone between two counts. For a queue that would be a
    drain rate (and publishes admitted while tripped); a stream drains nothing."""
    for drains, expected in ((True, 150.0), (False, 0.0)):
        d = QueueDepth()
        d.sampled_ready_count(10.0, 100, rtt=0.005, drains=drains)
        for i in range(30):  # forwarded, not in the stale figure yet
            d.forwarded(10.05 + i * 0.001, 1024)
        d.sampled_ready_count(10.2, 100, rtt=0.005, drains=drains)  # the same, not refreshed
        assert d.drain_rate == pytest.approx(expected)


def test_ready_messages_without_ready_bytes_are_not_a_mean_of_zero() -> None:
    """The management API can give a fresh queue's counts before its byte statistics: 800
    ready, 0 bytes. The mean body size then comes from the ledger, so a count of 800 reads as
    800 x 1 KiB, not as an empty queue (a fleet member released on that and flooded it)."""
    q = QueueDepth()
    for i in range(10):
        q.forwarded(1.0 + i * 0.01, 1024)
    q.sampled_management(ManagementSample(2.0, 800, 0, 0, 0, 0))
    assert q.average_body_bytes() == 1024
    q.sampled_ready_count(3.0, 800, 0.001)
    est = q.estimate()
    assert est is not None and est.bytes >= 800 * 1024


def test_prometheus_bytes_behind_their_counts_are_not_believed_below_the_ledgers_mean() -> None:
    """A Prometheus page's counts and bytes are two metric families a queue writes apart;
    while a cluster member hangs, a RabbitMQ 3.10 quorum queue writes its counts and not its
    bytes (52 KiB throughout while its ready messages went 51, 148, 0). Such a figure's bytes
    count no lower than its messages times the ledger's mean, and the passive declare's count
    takes that mean, not 52 KiB / 148; the management API's own figures are believed as
    they are."""

    def sample(at: float, ready: int, ready_bytes: int, source: DepthSource
               ) -> ManagementSample:
        return ManagementSample(at, ready, 0, ready_bytes, ready_bytes, 0, source=source)

    q = QueueDepth()
    for i in range(400):
        q.forwarded(1.0 + i * 0.01, 1024)
    q.sampled_management(sample(10.0, 148, 52_224, DepthSource.PROMETHEUS))
    assert q.average_body_bytes() == 1024
    assert q.estimate() == Depth(148 * 1024, 148)
    q.sampled_ready_count(11.0, 232, rtt=0.001)
    assert q.estimate() == Depth(232 * 1024, 232)
    q.sampled_management(sample(12.0, 51, 52_224, DepthSource.PROMETHEUS))  # true bytes
    assert q.estimate() == Depth(52_224, 51)
    q.sampled_management(sample(13.0, 148, 52_224, DepthSource.MANAGEMENT))
    assert q.estimate() == Depth(52_224, 148)
