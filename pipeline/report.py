"""report.html: the tables and matplotlib PNGs (depth vs capacity, trips, ingress vs egress)."""

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

from floodwall.control.policy import format_bytes_approx
from floodwall_pipeline.load import InputQuality
from floodwall_pipeline.recommend import Recommendation

Row = Mapping[str, object]
KIB = 1024.0


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: str = "int"  # int | bytes | rate | seconds | share | time | text | float


QUEUE_COLUMNS = [
    Column("vhost", "vhost", "text"), Column("queue", "queue", "text"),
    Column("policy", "policy", "text"), Column("sidecars", "sidecars"),
    Column("capacity", "capacity", "bytes"),
    Column("tripped_seconds", "time tripped", "seconds"),
    Column("tripped_share", "tripped", "share"), Column("trips", "trips"),
    Column("depth_p50", "depth p50", "bytes"), Column("depth_p90", "p90", "bytes"),
    Column("depth_p99", "p99", "bytes"), Column("depth_max", "max", "bytes"),
    Column("peak_overshoot", "peak overshoot", "bytes"),
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
    Column("tripped_share", "tripped", "share"), Column("trips", "trips"),
    Column("depth_p50", "depth p50", "bytes"), Column("depth_p90", "p90", "bytes"),
    Column("depth_p99", "p99", "bytes"), Column("depth_max", "max", "bytes"),
    Column("peak_overshoot", "peak overshoot", "bytes"),
    Column("ingress_rate", "ingress", "rate"), Column("ingress_rate_p99", "ingress p99", "rate"),
    Column("ingress_share", "share of the queue's ingress", "share"),
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


def plot_queue(rows: Sequence[Row], resolution: float, title: str, path: Path) -> None:
    """Depth against capacity (tripped shaded), trips, and ingress against egress (with
    what was admitted while held against the estimated drain, when the queue was held)."""
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
    ax1.set_title(title)
    ax1.legend(loc="upper left", fontsize=8)
    tripped = [min(_f(r, "tripped_seconds") / resolution, 1.0) for r in rows]
    ax2.fill_between(t, tripped, step="mid", color="#ff7f0e", alpha=0.7)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("tripped\n(share)")
    ax3.plot(t, [_f(r, "ingress_bytes") / resolution / KIB for r in rows], color="#9467bd",
             lw=1, label="ingress (publishes forwarded)")
    ax3.plot(t, [_f(r, "egress_bytes") / resolution / KIB for r in rows], color="#8c564b",
             lw=1, label="egress (derived)")
    if any(_f(r, "tripped_seconds") > 0 for r in rows):  # issue 14: the pace while held
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
    ax.barh(labels[::-1], shares[::-1], color="#ff7f0e")
    for i, r in enumerate(top[::-1]):
        ax.text(shares[::-1][i], i, f"  {int(_f(r, 'trips') or 0)} trips", va="center",
                fontsize=8)
    ax.set_xlabel("% of the observed time tripped")
    ax.set_xlim(0, max([*shares, 1.0]) * 1.25)
    ax.set_title("Time tripped per queue")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
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
.wide{overflow-x:auto}"""


def write_html(path: Path, *, title: str, meta: Mapping[str, str], quality: InputQuality,
               queues: Sequence[Row], sidecar_queues: Sequence[Row], sidecars: Sequence[Row],
               plots: Sequence[tuple[str, str]], overview: str | None,
               recommendations: Sequence[Recommendation], policies_file: str,
               policies_text: str) -> None:
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
    parts.append("<h2>Per queue (whole fleet)</h2>" + _table(queues, QUEUE_COLUMNS))
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
    parts.append("<h2>Queues over time</h2>")
    for name, caption in plots:
        parts.append(f"<h3>{html.escape(caption)}</h3><img src='{html.escape(name)}' "
                     f"alt='{html.escape(caption)}'>")
    parts.append("<h2>Per sidecar and queue</h2>" + _table(sidecar_queues, SIDECAR_QUEUE_COLUMNS))
    parts.append("<h2>Per sidecar</h2>" + _table(sidecars, SIDECAR_COLUMNS))
    parts.append("<p>Definitions: docs/pipeline.md. Held bytes per queue are the sidecar's held "
                 "bytes shared out by blocked channels (docs/telemetry.md). Egress is derived: "
                 "ingress minus the change in depth.</p></body></html>")
    path.write_text("\n".join(parts))
