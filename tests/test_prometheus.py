"""The Prometheus text format parser (floodwall.wire.prometheus): whole pages, one byte at a
time, random cuts, a real RabbitMQ 4.0.5 page, every error a line-numbered ExpositionError."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.control.depth import ManagementSample
from floodwall.wire.prometheus import (
    QUEUE_METRICS,
    ExpositionError,
    ExpositionParser,
    QueueFigures,
    Sample,
    parse_line,
    parse_page,
    queue_figures,
)

# What RabbitMQ 4.0.5 answers /metrics/detailed?vhost=%2F&family=queue_coarse_metrics&
# family=queue_metrics with (cut to two queues and a few families).
PAGE_405 = b"""# TYPE rabbitmq_detailed_queue_messages_ready gauge
# HELP rabbitmq_detailed_queue_messages_ready Messages ready to be delivered to consumers
rabbitmq_detailed_queue_messages_ready{vhost="/",queue="pq1"} 50
rabbitmq_detailed_queue_messages_ready{vhost="/",queue="pq2"} 0
# TYPE rabbitmq_detailed_queue_messages_unacked gauge
rabbitmq_detailed_queue_messages_unacked{vhost="/",queue="pq1"} 0
rabbitmq_detailed_queue_messages_unacked{vhost="/",queue="pq2"} 0
# TYPE rabbitmq_detailed_queue_process_reductions_total counter
rabbitmq_detailed_queue_process_reductions_total{vhost="/",queue="pq1"} 30505
# TYPE rabbitmq_detailed_queue_messages_ready_bytes gauge
rabbitmq_detailed_queue_messages_ready_bytes{vhost="/",queue="pq1"} 50000
rabbitmq_detailed_queue_messages_ready_bytes{vhost="/",queue="pq2"} 0
# TYPE rabbitmq_detailed_queue_messages_unacked_bytes gauge
rabbitmq_detailed_queue_messages_unacked_bytes{vhost="/",queue="pq1"} 0
# TYPE rabbitmq_detailed_queue_head_message_timestamp gauge
rabbitmq_detailed_queue_head_message_timestamp{vhost="/",queue="pq1"} NaN
# TYPE rabbitmq_build_info untyped
rabbitmq_build_info{rabbitmq_version="4.0.5",prometheus_plugin_version="4.0.5",\
prometheus_client_version="4.11.0",erlang_version="27.3.4.1"} 1
# TYPE telemetry_scrape_size_bytes summary
telemetry_scrape_size_bytes_count{registry="detailed",content_type="text/plain; version=0.0.4"} 4
"""


def by_pieces(data: bytes, cuts: list[int], names: frozenset[str] | None = None
              ) -> list[Sample]:
    parser = ExpositionParser(names)
    out: list[Sample] = []
    last = 0
    for cut in [*sorted(cuts), len(data)]:
        out += parser.feed(data[last:cut])
        last = cut
    return out + parser.close()


def test_a_real_page_whole_byte_by_byte_and_cut_anywhere() -> None:
    whole = parse_page(PAGE_405)
    assert len(whole) == 11
    assert whole[0] == Sample("rabbitmq_detailed_queue_messages_ready",
                              (("vhost", "/"), ("queue", "pq1")), 50.0)
    assert whole[-1].label("content_type") == "text/plain; version=0.0.4"
    assert by_pieces(PAGE_405, list(range(1, len(PAGE_405)))) == whole
    rng = random.Random(7)
    for _ in range(50):
        cuts = rng.sample(range(1, len(PAGE_405)), rng.randint(1, 20))
        assert by_pieces(PAGE_405, cuts) == whole
    # trailing data without its newline is the last line once the page is over
    assert parse_page(PAGE_405 + b'x{queue="q"} 3') == [*whole, Sample("x", (("queue", "q"),), 3)]


def test_only_the_names_asked_for() -> None:
    wanted = parse_page(PAGE_405, QUEUE_METRICS)
    assert {s.name for s in wanted} == set(QUEUE_METRICS)
    assert by_pieces(PAGE_405, list(range(1, len(PAGE_405))), QUEUE_METRICS) == wanted


def test_queue_figures_of_one_vhost() -> None:
    samples = parse_page(PAGE_405 + b'rabbitmq_detailed_queue_messages_ready{vhost="other",'
                         b'queue="pq1"} 7\n')
    figures = queue_figures(samples, "/")
    assert figures["pq1"] == QueueFigures(50, 50000, 0, 0)
    assert figures["pq1"].complete
    assert figures["pq2"] == QueueFigures(0, 0, 0, None)
    assert queue_figures(samples, "other") == {"pq1": QueueFigures(ready_messages=7)}
    assert not queue_figures(samples, "other")["pq1"].complete
    assert queue_figures(samples, "none") == {}


def test_values_escapes_and_timestamps() -> None:
    assert parse_line("a 1.5e3").value == 1500.0
    assert parse_line("a -Inf").value == -math.inf
    assert math.isnan(parse_line("a NaN").value)
    assert parse_line("a{} 2 1700000000000").value == 2.0
    sample = parse_line(r'a{q="x\"y\\z\nw", b="" ,} 1')
    assert sample.labels == (("q", 'x"y\\z\nw'), ("b", ""))
    assert parse_line('a{q="é ü"} 1').label("q") == "é ü"


@pytest.mark.parametrize(("line", "reason"), [
    ("1a 1", "no metric name"),
    ("a", "expected a value"),
    ("a 1 2 3", "expected a value"),
    ("a x", "is not a number"),
    ("a 1 x", "timestamp"),
    ("a{q=1} 1", "expected =\""),
    ('a{q="1} 1', "closing quote"),
    ('a{q="\\t"} 1', "bad escape"),
    ('a{1="x"} 1', "bad label name"),
    ('a{q="x" r="y"} 1', "expected , or }"),
    ('a{q="x"}1', "expected a value"),
])
def test_bad_lines_say_why_and_where(line: str, reason: str) -> None:
    page = b"# fine\nok 1\n" + line.encode() + b"\n"
    with pytest.raises(ExpositionError) as caught:
        parse_page(page)
    assert caught.value.line == 3
    assert reason in str(caught.value)


def test_not_utf8_and_too_long() -> None:
    with pytest.raises(ExpositionError, match="line 1: not UTF-8"):
        parse_page(b'a{q="\xff"} 1\n')
    parser = ExpositionParser()
    with pytest.raises(ExpositionError, match="longer than"):
        parser.feed(b"a" * (1 << 17))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8))
def test_fuzz_bytes_parse_or_raise_the_module_error(data: bytes, cuts: list[int]) -> None:
    try:
        whole = parse_page(data)
    except ExpositionError:
        whole = None
    try:
        pieces = by_pieces(data, [c for c in cuts if 0 < c < len(data)])
    except ExpositionError:
        pieces = None
    assert (whole is None) == (pieces is None)
    if whole is not None:
        assert [(s.name, s.labels) for s in whole] == [(s.name, s.labels) for s in pieces or []]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='ab{}=",\\ .\n1e+-#NaInf_', max_size=120))
def test_fuzz_near_misses(text: str) -> None:
    try:
        parse_page(text.encode())
    except ExpositionError:
        pass


def test_the_nodes_pages_merged_each_queue_from_the_node_that_runs_it() -> None:
    from floodwall.io.prometheus import PagesMerged, sample_of

    def page(figures: dict[str, QueueFigures]) -> dict[str, ManagementSample]:
        out = {q: sample_of(f, 1.0) for q, f in figures.items()}
        return {q: s for q, s in out.items() if s is not None}

    a = page({"q1": QueueFigures(5, 5000, 0, 0), "q2": QueueFigures(0, 0, 0, 0)})
    b = page({"q3": QueueFigures(1, 10, 0, 0), "q2": QueueFigures(7, 7000, 1, 100)})
    merged = PagesMerged()
    assert merged.take(a) == a  # the first page: all news
    assert merged.take(b) == b  # q3 first seen, q2 higher
    assert merged.samples == {"q1": a["q1"], "q2": b["q2"], "q3": b["q3"]}
    other = PagesMerged()
    assert other.take(b) == b
    assert other.take(a) == {"q1": a["q1"]}  # q2 lower than the node before said: not news
    assert other.samples["q2"] == b["q2"]  # whichever node answered first
    assert PagesMerged().take({}) == {}
