"""report.html: the tables and matplotlib PNGs (depth vs capacity, trips, ingress vs egress).

What the report must not hide: every trip and release is marked on its queue's plots (from
the telemetry's events, so a trip shorter than a bucket still shows), shadow-mode trips
beside enforced ones (``mode``), the caveats when the telemetry is too short or saw too few
trips to recommend from (``caveats``), and tables no wider than a page (``MAX_COLUMNS``).
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.collections import LineCollection

from floodwall.control.policy import format_bytes_approx
from floodwall_pipeline.load import InputQuality
from floodwall_pipeline.recommend import Recommendation

Row = Mapping[str, object]
KIB = 1024.0
#: Columns per table: a wider one is split, its key columns repeated in each part.
MAX_COLUMNS = 10
#: Less telemetry than this, or fewer trips of a queue, and the recommendations say so.
MIN_SPAN_SECONDS = 3600.0
MIN_TRIPS = 3
#: Trips and releases marked on one queue's plot at most (more are counted in its caption).
MAX_MARKERS = 200


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: str = "int"  # int | bytes | rate | seconds | share | time | text | float


QUEUE_COLUMNS = [
    Column("vhost", "vhost", "text"), Column("queue", "queue", "text"),
    Column("policy", "policy", "text"), Column("sidecars", "sidecars"),
    Column("fleet_members_max", "fleet size"), Column("capacity", "capacity", "bytes"),
    Column("tripped_seconds", "time tripped", "seconds"),
    Column("tripped_share", "tripped", "share"), Column("enforced_trips", "trips"),
    Column("shadow_trips", "shadow trips"),
    Column("depth_p50", "depth p50", "bytes"), Column("depth_p90", "p90", "bytes"),
    Column("depth_p99", "p99", "bytes"), Column("depth_max", "max", "bytes"),
    Column("peak_overshoot", "peak overshoot", "bytes"),
    Column("admitted_fairness", "fairness while tripped", "float"),
    Column("ingress_rate", "ingress", "rate"), Column("egress_rate", "egress", "rate"),
    Column("drain_rate", "drain (backlog)", "rate"),
    Column("drain_seconds_p50", "time to drain p50", "seconds"),
    Column("drain_seconds_max", "max", "seconds"),
    Column("held_bytes_max", "held max", "bytes"),
    Column("spooled_bytes_max", "spooled max", "bytes"),
    Column("deadline_expiries", "deadline expiries"), Column("rejects", "rejects"),
]
SIDECAR_QUEUE_COLUMNS = [
    Column("sidecar", "sidecar", "text"), Column("vhost", "vhost", "text"),
    Column("queue", "queue", "text"), Column("samples", "samples"),
    Column("tripped_seconds", "time tripped", "seconds"),
    Column("tripped_share", "tripped", "share"), Column("enforced_trips", "trips"),
    Column("shadow_trips", "shadow trips"),
    Column("depth_p50", "depth p50", "bytes"), Column("depth_p90", "p90", "bytes"),
    Column("depth_p99", "p99", "bytes"), Column("depth_max", "max", "bytes"),
    Column("peak_overshoot", "peak overshoot", "bytes"),
    Column("ingress_rate", "ingress", "rate"), Column("ingress_rate_p99", "ingress p99", "rate"),
    Column("ingress_share", "share of the queue's ingress", "share"),
    Column("admitted_share", "share admitted while tripped", "share"),
    Column("fleet_share_bytes_mean", "fleet share mean", "bytes"),
    Column("fleet_demand_rate_mean", "fleet demand mean", "rate"),
    Column("held_bytes_max", "held max", "bytes"), Column("held_bytes_mean", "held mean", "bytes"),
    Column("deadline_expiries", "deadline expiries"), Column("rejects", "rejects"),
]
SIDECAR_COLUMNS = [
    Column("sidecar", "sidecar", "text"), Column("first_ts", "from", "time"),
    Column("last_ts", "to", "time"), Column("queues", "queues"),
    Column("tripped_queue_seconds", "queue-seconds tripped", "seconds"),
    Column("trips", "trips"), Column("held_bytes_max", "held max", "bytes"),
    Column("held_bytes_mean", "held mean", "bytes"),
    Column("blocked_channels_max", "blocked channels max"),
    Column("spooled_bytes_max", "spooled max", "bytes"),
    Column("alarm_seconds", "broker alarm", "seconds"),
    Column("deadline_expiries", "deadline expiries"), Column("rejects", "rejects"),
    Column("dropped_records", "records dropped"),
]


def fmt(value: object, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "text":
        return str(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if kind == "bytes":
        return format_bytes_approx(int(value))
    if kind == "rate":
        return f"{format_bytes_approx(int(value))}/s"
    if kind == "seconds":
        return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"
    if kind == "share":
        return f"{100 * value:.1f}%"
    if kind == "time":
        return dt.datetime.fromtimestamp(float(value), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    if kind == "float":
        return f"{value:.2f}"
    return f"{int(value)}"


def is_shadow(row: Row) -> bool:
    """Whether a queue's (latest) policy is in shadow mode: its trips held nothing."""
    return row.get("mode") == "shadow"


def with_modes(rows: Sequence[Row]) -> list[dict[str, object]]:
    """Rows with ``enforced_trips`` and ``shadow_trips``: a queue's trips under the mode of
    its policy (telemetry written before shadow mode has no mode: enforced)."""
    out = []
    for r in rows:
        trips = r.get("trips")
        shadow = is_shadow(r)
        out.append({**r, "enforced_trips": 0 if shadow and trips is not None else trips,
                    "shadow_trips": trips if shadow else (0 if trips is not None else None)})
    return out


def caveats(span_seconds: float, queues: Sequence[Row]) -> list[str]:
    """Why the recommendations may not hold: too little time observed, too few trips (of a
    queue with a byte limit), or a queue only watched in shadow mode."""
    found = []
    if span_seconds < MIN_SPAN_SECONDS:
        found.append(f"The telemetry covers {fmt(span_seconds, 'seconds')}, less than "
                     f"{MIN_SPAN_SECONDS / 3600:g} hour: it has not seen a day's peaks. Treat "
                     "the recommendations as a first guess and collect more before enforcing "
                     "them.")
    for r in queues:
        trips = r.get("trips")
        n = int(trips) if isinstance(trips, (int, float)) else 0
        limited = isinstance(r.get("capacity"), (int, float)) and r["capacity"] > 0  # type: ignore[operator]
        if limited and n < MIN_TRIPS:
            found.append(f"{r['queue']} (vhost {r['vhost']}) tripped {n} time(s), fewer than "
                         f"{MIN_TRIPS}: its resume level (the burst at a release) rests on "
                         "too few releases.")
    shadow = [f"{r['queue']}" for r in queues if is_shadow(r)]
    if shadow:
        found.append(f"In shadow mode (nothing was held): {', '.join(shadow[:10])}"
                     + (" ..." if len(shadow) > 10 else "") + ". Their depth is what the "
                     "traffic does unchecked; their trips say what enforcing would have held.")
    return found


@dataclass(frozen=True)
class Marker:
    """A trip or release of a queue, at ``at`` (UTC), of a shadow-mode policy or not."""

    at: dt.datetime
    trip: bool
    shadow: bool


def markers(events: Sequence[Row]) -> list[Marker]:
    """The trips and releases among a queue's telemetry events (``ts_ms``, ``event``,
    ``mode``), in time order."""
    found = [Marker(dt.datetime.fromtimestamp(float(e["ts_ms"]) / 1000,  # type: ignore[arg-type]
                                              dt.UTC), e["event"] == "trip",
                    e.get("mode") == "shadow")
             for e in events if e.get("event") in ("trip", "release")
             and isinstance(e.get("ts_ms"), (int, float))]
    return sorted(found, key=lambda m: (m.at, not m.trip))


def _mark(axes: Sequence[object], marks: Sequence[Marker]) -> None:
    """Vertical lines: trips red, releases green; shadow ones dotted. One collection of
    lines per kind and axes (an ``axvline`` each cost more than the rest of the plot)."""
    shown = marks[:MAX_MARKERS]
    for trip, shadow in ((True, False), (False, False), (True, True), (False, True)):
        xs = [float(mdates.date2num(m.at)) for m in shown  # type: ignore[no-untyped-call]
              if m.trip == trip and m.shadow == shadow]
        if not xs:
            continue
        for ax in axes:
            ax.add_collection(LineCollection(  # type: ignore[attr-defined]
                [[(x, 0.0), (x, 1.0)] for x in xs],
                transform=ax.get_xaxis_transform(),  # type: ignore[attr-defined]
                colors="#d62728" if trip else "#2ca02c", linestyles=":" if shadow else "-",
                linewidths=0.8, alpha=0.8), autolim=False)


def slug(vhost: str, queue: str) -> str:
    """A file name for a queue's plot: ``orders.eu``, ``audit@billing`` (other vhosts)."""
    text = queue if vhost == "/" else f"{queue}@{vhost}"
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", text)[:120] or "queue"


def _times(rows: Sequence[Row]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(float(r["bucket"]), dt.UTC)  # type: ignore[arg-type]
            for r in rows]


def _f(row: Row, key: str) -> float:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def plot_queue(rows: Sequence[Row], resolution: float, title: str, path: Path,
               marks: Sequence[Marker] = ()) -> None:
    """Depth against capacity (tripped shaded), trips, and ingress against egress (with
    what was admitted while held against the estimated drain, when the queue was held);
    each trip and release of ``marks`` a vertical line on the depth and the trips panels."""
    t = _times(rows)
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 7.5), sharex=True,
                                        gridspec_kw={"height_ratios": [3, 1, 2]})
    ax1.plot(t, [_f(r, "depth_max") / KIB for r in rows], color="#1f77b4", lw=1,
             label="depth (max in bucket)")
    ax1.plot(t, [_f(r, "capacity") / KIB for r in rows], color="#d62728", lw=1.2, ls="--",
             label="capacity")
    ax1.plot(t, [_f(r, "resume") / KIB for r in rows], color="#2ca02c", lw=1, ls=":",
             label="resume")
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("KiB")
    ax1.set_title(title, y=1.0)
    ax1.legend(loc="upper left", fontsize=8)
    tripped = [min(_f(r, "tripped_seconds") / resolution, 1.0) for r in rows]
    ax2.fill_between(t, tripped, step="mid", color="#ff7f0e", alpha=0.7)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("tripped\n(share)")
    _mark((ax1, ax2), marks)
    if marks:
        shadow = sum(1 for m in marks if m.shadow and m.trip)
        trips = sum(1 for m in marks if m.trip)
        more = f", {len(marks) - MAX_MARKERS} not marked" if len(marks) > MAX_MARKERS else ""
        ax2.set_title(f"{trips} trip(s) (red) and releases (green)"
                      + (f", {shadow} in shadow mode (dotted)" if shadow else "") + more,
                      fontsize=8, loc="left", y=1.0)
    ax3.plot(t, [_f(r, "ingress_bytes") / resolution / KIB for r in rows], color="#9467bd",
             lw=1, label="ingress (publishes forwarded)")
    ax3.plot(t, [_f(r, "egress_bytes") / resolution / KIB for r in rows], color="#8c564b",
             lw=1, label="egress (derived)")
    if any(_f(r, "tripped_seconds") > 0 for r in rows):  # the pace while held
        ax3.plot(t, [_f(r, "admitted_bytes") / resolution / KIB for r in rows],
                 color="#ff7f0e", lw=1, ls="--", label="admitted while held")
        ax3.plot(t, [_f(r, "drained_bytes") / resolution / KIB for r in rows],
                 color="#17becf", lw=1, ls=":", label="drain (the proxy's estimate)")
    ax3.set_ylabel("KiB/s")
    ax3.legend(loc="upper left", fontsize=8)
    ax3.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax3.set_xlabel("time (UTC)")
    # Fixed margins rather than tight_layout (a third of the time of a plot), and light
    # PNG compression: the report's plots in a quarter of the time.
    fig.subplots_adjust(left=0.09, right=0.98, top=0.95, bottom=0.08, hspace=0.12)
    fig.savefig(path, dpi=90, pil_kwargs={"compress_level": 1})
    plt.close(fig)


def plot_overview(queues: Sequence[Row], path: Path) -> None:
    """Share of time tripped and trips, per queue (the most tripped first)."""
    top = list(queues)[:20]
    labels = [f"{r['queue']}@{r['vhost']}" for r in top]
    fig, ax = plt.subplots(figsize=(10, max(2.0, 0.35 * len(top) + 1)))
    shares = [100 * _f(r, "tripped_share") if r.get("tripped_share") is not None else 0
              for r in top]
    ax.barh(labels[::-1], shares[::-1],
            color=["#c7c7c7" if is_shadow(r) else "#ff7f0e" for r in top[::-1]],
            hatch=["//" if is_shadow(r) else "" for r in top[::-1]])
    for i, r in enumerate(top[::-1]):
        kind = "shadow trips (nothing held)" if is_shadow(r) else "trips"
        ax.text(shares[::-1][i], i, f"  {int(_f(r, 'trips') or 0)} {kind}", va="center",
                fontsize=8)
    ax.set_xlabel("% of the observed time tripped")
    ax.set_xlim(0, max([*shares, 1.0]) * 1.25)
    ax.set_title("Time tripped per queue", y=1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _table(rows: Sequence[Row], columns: Sequence[Column], keys: int = 0) -> str:
    """An HTML table; wider than ``MAX_COLUMNS``, several, each with the first ``keys``
    columns (what names a row) and the next columns that fit."""
    if len(columns) > MAX_COLUMNS and 0 < keys < MAX_COLUMNS:
        rest, per = columns[keys:], MAX_COLUMNS - keys
        return "".join(_table(rows, [*columns[:keys], *rest[i:i + per]])
                       for i in range(0, len(rest), per))
    head = "".join(f"<th>{html.escape(c.title)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = "".join(
            f"<td class='{'t' if c.kind == 'text' else 'n'}'>"
            f"{html.escape(fmt(r.get(c.key), c.kind))}</td>" for c in columns)
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='wide'><table><tr>{head}</tr>{''.join(body)}</table></div>"


CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 7px}th{background:#f3f3f3}td.n{text-align:right}
img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}
pre{background:#f7f7f7;padding:1em;overflow-x:auto;font-size:12px}.bad{color:#b00}
.wide{overflow-x:auto}
.caveat{border-left:4px solid #b00;padding:0.3em 1em;background:#fff4f4}
@media print{body{margin:0}table{font-size:10px}tr{page-break-inside:avoid}}"""


def write_html(path: Path, *, title: str, meta: Mapping[str, str], quality: InputQuality,
               queues: Sequence[Row], sidecar_queues: Sequence[Row], sidecars: Sequence[Row],
               plots: Sequence[tuple[str, str]], overview: str | None,
               recommendations: Sequence[Recommendation], policies_file: str,
               policies_text: str, warnings: Sequence[str] = (), what_if: str = "") -> None:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    parts.append("<table>" + "".join(
        f"<tr><th>{html.escape(k)}</th><td class='t'>{html.escape(v)}</td></tr>"
        for k, v in meta.items()) + "</table>")
    q = quality
    cls = " class='bad'" if q.bad else ""
    parts.append(f"<h2>Input</h2><p{cls}>{q.lines} lines in {q.files} file(s): {q.used} used; "
                 f"{q.corrupt} malformed or truncated, {q.unsupported_version} of an "
                 f"unsupported schema version, {q.incomplete} incomplete (left out).</p>")
    if q.examples:
        parts.append("<pre>" + html.escape("\n".join(f"{f}: {line}" for f, line in q.examples))
                     + "</pre>")
    if warnings:
        parts.append("<div class='caveat'><b>Before you use the recommendations</b><ul>"
                     + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
                     + "</ul></div>")
    parts.append("<h2>Per queue (whole fleet)</h2>"
                 + _table(with_modes(queues), QUEUE_COLUMNS, keys=2))
    if overview:
        parts.append(f"<img src='{html.escape(overview)}' alt='time tripped per queue'>")
    parts.append("<h2>Recommended policies</h2>"
                 f"<p>Written to <code>{html.escape(policies_file)}</code> (method: "
                 "docs/pipeline.md). Changes:</p><ul>")
    for r in recommendations:
        parts.append(f"<li><b>{html.escape(r.queue)}</b> ({html.escape(r.vhost)}): capacity "
                     f"{format_bytes_approx(r.capacity)}, resume "
                     f"{format_bytes_approx(r.resume)}"
                     + ("" if r.changed else " (unchanged)") + "</li>")
    parts.append("</ul><details><summary>the file</summary><pre>"
                 + html.escape(policies_text) + "</pre></details>")
    if what_if:  # pipeline/whatif.py, ``section``
        parts.append(what_if)
    parts.append("<h2>Queues over time</h2>")
    for name, caption in plots:
        parts.append(f"<h3>{html.escape(caption)}</h3><img src='{html.escape(name)}' "
                     f"alt='{html.escape(caption)}'>")
    parts.append("<h2>Per sidecar and queue</h2>"
                 + _table(with_modes(sidecar_queues), SIDECAR_QUEUE_COLUMNS, keys=3))
    parts.append("<h2>Per sidecar</h2>" + _table(sidecars, SIDECAR_COLUMNS, keys=1))
    parts.append("<p>Definitions: docs/pipeline.md. Held bytes per queue are the sidecar's held "
                 "bytes shared out by blocked channels (docs/telemetry.md). Egress is derived: "
                 "ingress minus the change in depth. Shadow trips: trips of a policy in "
                 "shadow mode, which held nothing (docs/operations.md).</p></body></html>")
    path.write_text("\n".join(parts))
