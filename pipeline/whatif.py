"""``floodwall analyze --what-if CANDIDATE.yaml``: recorded load replayed through other policies.

Spark groups each queue's samples into buckets of the telemetry interval (``series``: SQL,
the fleet's sidecars summed) and hands each queue's buckets, in one group, to
``floodwall_pipeline.replay.replay_group`` on an executor, which plays them through the
policy in force and through every candidate with floodwall's own control rules
(pipeline/replay.py). The executors therefore run Python: the job ships the replay's code
(the ``floodwall`` package and ``floodwall_pipeline.replay``, pure Python) as a zip
(``SparkContext.addPyFile``), so they need Python and pyspark, not floodwall.

The driver writes ``what-if.json``, a plot per queue and the report's section per candidate.
The recommendations are checked the same way (``recommended-policies.yaml`` states what
the replay predicts for each).
"""

from __future__ import annotations

import functools
import hashlib
import html
import io
import json
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

import floodwall
import floodwall_pipeline
from floodwall.control.policy import PolicyError, PolicySet, parse_policies
from floodwall_pipeline import replay
from floodwall_pipeline.aggregate import sql

#: The figures compared in the report, with the kind ``report.fmt`` formats them as.
COLUMNS = (("trips", "int"), ("tripped_seconds", "seconds"), ("depth_max", "bytes"),
           ("peak_overshoot", "bytes"), ("held_byte_seconds", "int"),
           ("spooled_bytes_max", "bytes"), ("rejects", "int"), ("deadline_expiries", "int"),
           ("admitted_bytes", "bytes"))


@dataclass(frozen=True)
class Candidate:
    """A candidate policy file: as named on the command line, its text, parsed."""

    file: str
    text: str
    policies: PolicySet


def read_candidate(path: str) -> Candidate:
    """The file parsed as ``floodwall check`` would (raises ``PolicyError`` for a bad file,
    ``OSError`` for an unreadable one)."""
    text = Path(path).read_text()
    return Candidate(path, text, parse_policies(text, path))


def read_candidates(paths: Sequence[str]) -> list[Candidate]:
    """Every candidate, or ``ValueError`` naming each that cannot be used."""
    found, problems = [], []
    for p in paths:
        try:
            found.append(read_candidate(p))
        except PolicyError as exc:
            problems.append(str(exc))
        except OSError as exc:
            problems.append(f"{p}: {exc.strerror or exc}")
    if problems:
        raise ValueError("\n".join(problems))
    return found


def series(samples: DataFrame, events: DataFrame, step: float) -> DataFrame:
    """One row per (vhost, queue, bucket of ``step`` seconds), the fleet's sidecars summed
    (``replay.ROW_FIELDS``): offered = forwarded plus the growth of held publishes, per
    sidecar then summed; the newest depth and policy (ts, then the sidecar's id); the
    sidecars' drain estimates (each one's newest, averaged); rejects
    and deadline expiries (their events); and each sidecar's own offered bytes
    (``member_names``, ``member_offered``, by name: a fleet's breakdown)."""
    step_ms = max(1, round(step * 1000))
    newest = "struct(ts_ms, seq)"
    level1 = sql(f"""
        SELECT q, sq, max(vhost) AS vhost, max(queue) AS queue, max(sidecar) AS sidecar,
               ts_ms div {step_ms} AS b,
               coalesce(sum(ingress_bytes), 0) AS fb,
               coalesce(sum(ingress_messages), 0) AS fm,
               max_by(held_bytes, {newest}) AS held_end,
               max_by(held_messages, {newest}) AS held_m_end,
               max_by(spooled_bytes, {newest}) AS spool_end,
               max({newest}).ts_ms AS last_ms,
               max_by(depth, {newest}) AS depth, max_by(depth_msgs, {newest}) AS depth_msgs,
               max_by(drain_bps, {newest}) AS drain_est,
               max(CASE WHEN tripped THEN 1 ELSE 0 END) AS tripped,
               max_by(struct(policy, capacity, resume, max_messages, resume_messages,
                             overflow, deadline, mode), {newest}) AS pol
        FROM {{samples}} GROUP BY q, sq, ts_ms div {step_ms}""", samples=samples)
    level1 = sql("""
        SELECT *, fb + held_end - coalesce(lag(held_end) OVER w, 0) AS offered,
               fm + held_m_end - coalesce(lag(held_m_end) OVER w, 0) AS offered_m
        FROM {level1} WINDOW w AS (PARTITION BY sq ORDER BY b)""", level1=level1)
    counted = sql(f"""
        SELECT vhost, queue, ts_ms div {step_ms} AS b,
               count(CASE WHEN event = 'reject' THEN 1 END) AS rejects,
               count(CASE WHEN event = 'deadline' THEN 1 END) AS expiries
        FROM {{events}} WHERE event IN ('reject', 'deadline')
        GROUP BY vhost, queue, ts_ms div {step_ms}""", events=events)
    newest_q = "struct(last_ms, sq)"
    queue = sql(f"""
        SELECT max(vhost) AS vhost, max(queue) AS queue, b,
               sum(offered) AS offered, sum(offered_m) AS offered_m,
               sum(fb) AS fb, sum(fm) AS fm, sum(held_end) AS held_end,
               max_by(depth, {newest_q}) AS depth, max_by(depth_msgs, {newest_q}) AS depth_msgs,
               avg(drain_est) AS drain_est,
               max(tripped) AS tripped, count(1) AS sidecars,
               max_by(pol, {newest_q}) AS pol, sum(spool_end) AS spool_end,
               array_sort(collect_list(struct(sidecar, offered))) AS members
        FROM {{level1}} GROUP BY q, b""", level1=level1)
    return sql("""
        SELECT s.* EXCEPT (members), coalesce(e.rejects, 0) AS rejects,
               coalesce(e.expiries, 0) AS expiries,
               transform(members, m -> m.sidecar) AS member_names,
               transform(members, m -> m.offered) AS member_offered
        FROM {queue} s LEFT JOIN {counted} e
          ON s.vhost = e.vhost AND s.queue = e.queue AND s.b = e.b""",
               queue=queue, counted=counted)


def code_zip(directory: Path) -> Path:
    """The replay's code as a zip for the executors: the ``floodwall`` package and
    ``floodwall_pipeline.replay`` (pure Python; nothing they import needs I/O). Named by
    its content, so a session adds each version once."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        root = Path(floodwall.__file__).parent
        for f in sorted(root.rglob("*.py")):
            z.writestr(zipfile.ZipInfo(f"floodwall/{f.relative_to(root).as_posix()}"),
                       f.read_bytes())
        pipe = Path(floodwall_pipeline.__file__).parent
        for name in ("__init__.py", "replay.py"):
            z.writestr(zipfile.ZipInfo(f"floodwall_pipeline/{name}"),
                       (pipe / name).read_bytes())
    data = buf.getvalue()
    path = directory / f"floodwall-replay-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        path.write_bytes(data)
    return path


_SHIPPED: set[tuple[int, str]] = set()


def ship_code(spark: SparkSession) -> None:
    """Add the replay's code to the session's Python path on the executors (once)."""
    path = code_zip(Path(tempfile.gettempdir()))
    key = (id(spark.sparkContext), path.name)
    if key not in _SHIPPED:
        spark.sparkContext.addPyFile(str(path))
        _SHIPPED.add(key)


def run(samples: DataFrame, events: DataFrame, step: float,
        texts: Sequence[str]) -> list[dict[str, Any]]:
    """Every queue's replay under the recorded policies and each of ``texts`` (policy files),
    sorted by (vhost, queue): ``replay.replay_group``'s dicts."""
    ship_code(samples.sparkSession)
    rows = series(samples, events, step)
    group = functools.partial(replay.replay_group, step=step, candidates=tuple(texts))
    found = rows.rdd.map(replay.keyed).groupByKey().map(group).collect()
    return sorted(found, key=lambda r: (r["vhost"], r["queue"]))


def what_if_doc(candidates: Sequence[Candidate], replays: Sequence[Mapping[str, Any]],
                first: int = 1) -> dict[str, Any]:
    """``what-if.json``: per candidate, every queue it polices, predicted and replayed under
    the policy in force. ``first``: where the candidates start in each replay's list."""
    doc: list[dict[str, Any]] = []
    for i, c in enumerate(candidates):
        queues = []
        for r in replays:
            mine = r["candidates"][first + i]
            if mine is None:
                continue
            queues.append({"vhost": r["vhost"], "queue": r["queue"], "policy": mine["policy"],
                           "policy_recorded": r["policy"], "predicted": mine["predicted"],
                           "replayed_recorded": r["replayed_recorded"]})
        doc.append({"file": c.file, "queues": queues})
    return {"candidates": doc}


def caveats(replays: Sequence[Mapping[str, Any]], sidecars: Sequence[Mapping[str, Any]],
            queues: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the replay cannot know (docs/pipeline.md, "What if")."""
    out = ["Offered load while a queue was held is what its producers handed to the proxy "
           "(forwarded, plus the growth of held publishes, plus rejects and deadline "
           "expiries at the mean body size), not what they would have sent unhindered: a "
           "producer blocked by TCP or Channel.Flow offers less, so a candidate that holds "
           "less than the recorded policy is predicted with that lower load."]
    for r in replays:
        name = f"{r['queue']} (vhost {r['vhost']})"
        if r["held_share"] > 0:
            out.append(f"{name}: {100 * r['held_share']:.0f} % of its offered bytes were "
                       "offered while it was held (estimated as above).")
        if r["gap_seconds"] > 0:
            out.append(f"{name}: {r['gap_seconds']:g}s of its timeline has no sample (a "
                       "telemetry gap): nothing is offered or drained there in the replay.")
    fleets = [f"{r['queue']} (vhost {r['vhost']})" for r in replays if r["sidecars_max"] > 1]
    if fleets:
        out.append(f"{', '.join(fleets)}: policed by a fleet. The fleet trips when its first "
                   "member passes its share of the room (the fleet's rule) and is fed at the "
                   "fleet's rate; each sidecar is admitted its share of what the queue "
                   "admitted, settled per bucket, but the members trip and release together. "
                   "A member counting a cold queue (200 ms apart) may trip well below the "
                   "limit by when its counts fall, which the telemetry cannot tell: a burst "
                   "that comes near the fleet's trip point may trip it or not.")
    seen = len(sidecars)
    most = max((int(q.get("fleet_members_max") or 0) for q in queues), default=0)
    if most > seen:
        out.append(f"The fleet counted up to {most} sidecars, the telemetry has {seen}: the "
                   "missing sidecars' load is not in the replay.")
    dropped = sum(int(s.get("dropped_records") or 0) for s in sidecars)
    if dropped:
        out.append(f"{dropped} telemetry records were dropped by the sidecars (a slow disk): "
                   "their intervals are gaps.")
    return out


def predicted_reasons(replays: Sequence[Mapping[str, Any]], index: int
                      ) -> dict[tuple[str, str], str]:
    """Per queue, what the replay predicts for the policy at ``index`` of each replay's
    candidates (the recommendations): a line for the policies file."""
    out = {}
    for r in replays:
        c = r["candidates"][index]
        if c is None:
            continue
        p = c["predicted"]
        out[(r["vhost"], r["queue"])] = (
            f"predicted by replaying the telemetry: {p['trips']} trip(s), "
            f"{p['tripped_seconds']:g}s tripped, producers waited {p['wait_mean_seconds']:g}s "
            f"on average ({p['wait_max_seconds']:g}s at most), "
            f"{p['deadline_expiries']} deadline expiries, {p['rejects']} rejects "
            f"(recorded policy replayed: {r['replayed_recorded']['trips']} trip(s), "
            f"{r['replayed_recorded']['tripped_seconds']:g}s)")
    return out


def plot(out: Path, r: Mapping[str, Any], names: Sequence[str], first: int) -> str | None:
    """The queue's depth over the timeline: recorded, the recorded policy replayed, and each
    candidate that polices it. The file written (relative to ``out``), or None."""
    import matplotlib.pyplot as plt

    from floodwall_pipeline.report import slug

    recorded = [(t, d) for t, d in r["recorded_depth"] if d is not None]
    if not recorded:
        return None
    t0 = recorded[0][0]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([(t - t0) / 1000 for t, _ in recorded], [d / 1024 for _, d in recorded],
            color="black", lw=1.5, label="recorded")
    rep = r["replayed_depth"]
    ax.plot([(t - t0) / 1000 for t, _ in rep], [d / 1024 for _, d in rep], color="grey",
            lw=1, ls="--", label="recorded policy, replayed")
    for name, c in zip(names, r["candidates"][first:], strict=True):
        if c is None:
            continue
        ax.plot([(t - t0) / 1000 for t, _ in c["depth"]], [d / 1024 for _, d in c["depth"]],
                lw=1, label=f"{name}: {c['policy']}")
    ax.set_xlabel("seconds from the first sample")
    ax.set_ylabel("depth, KiB")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{r['queue']} (vhost {r['vhost']}): depth under each candidate", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    (out / "plots").mkdir(exist_ok=True)
    name = f"plots/what-if-{slug(r['vhost'], r['queue'])}.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    return name


def section(doc: Mapping[str, Any], recorded: Sequence[Mapping[str, Any]],
            plots: Mapping[tuple[str, str], str], notes: Sequence[str]) -> str:
    """The report's "What if" section: per candidate a table of each queue it polices,
    what happened, the recorded policy replayed and the prediction side by side."""
    from floodwall_pipeline.report import fmt

    happened = {(q["vhost"], q["queue"]): q for q in recorded}
    parts = ["<h2>What if</h2><p>Each candidate's policies, replayed over the recorded "
             "load with floodwall's own control rules (docs/pipeline.md, \"What if\"). "
             "<i>recorded</i>: what happened; <i>replayed</i>: the model under the policy in "
             "force (its error against <i>recorded</i> is the model's); <i>predicted</i>: "
             "under the candidate. Also in <code>what-if.json</code>.</p>"]
    if notes:
        parts.append("<div class='caveat'><b>What the replay cannot know</b><ul>"
                     + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></div>")
    head = "".join(f"<th>{html.escape(k.replace('_', ' '))}</th>" for k, _ in COLUMNS)
    for c in doc["candidates"]:
        parts.append(f"<h3>{html.escape(c['file'])}</h3>")
        if not c["queues"]:
            parts.append("<p>None of its policies matches a queue in the telemetry.</p>")
            continue
        body = []
        for q in c["queues"]:
            key = (q["vhost"], q["queue"])
            for label, figures in (("recorded", happened.get(key, {})),
                                   ("replayed", q["replayed_recorded"]),
                                   (f"predicted ({q['policy']})", q["predicted"])):
                cells = "".join(f"<td class='n'>{html.escape(fmt(figures.get(k), kind))}</td>"
                                for k, kind in COLUMNS)
                body.append(f"<tr><td class='t'>{html.escape(q['queue'])}</td>"
                            f"<td class='t'>{html.escape(label)}</td>{cells}</tr>")
        parts.append("<div class='wide'><table><tr><th>queue</th><th></th>" + head + "</tr>"
                     + "".join(body) + "</table></div>")
        parts.extend(_per_sidecar(q) for q in c["queues"] if q["predicted"].get("sidecars"))
        for q in c["queues"]:
            name = plots.get((q["vhost"], q["queue"]))
            if name:
                parts.append(f"<img src='{html.escape(name)}' alt='depth of "
                             f"{html.escape(q['queue'])} under each candidate'>")
    return "\n".join(parts)


def _per_sidecar(q: Mapping[str, Any]) -> str:
    """A fleet's queue: each sidecar's part under the policy in force (replayed) and the
    candidate (predicted), side by side."""
    from floodwall_pipeline.report import fmt

    replayed = {s["sidecar"]: s for s in q["replayed_recorded"].get("sidecars", ())}
    rows = []
    for s in q["predicted"]["sidecars"]:
        r = replayed.get(s["sidecar"], {})
        cells = "".join(
            f"<td class='n'>{html.escape(fmt(x.get(k), kind))}</td>"
            for x in (r, s) for k, kind in (("admitted_bytes", "bytes"),
                                            ("admitted_share", "share"),
                                            ("wait_mean_seconds", "seconds"),
                                            ("wait_max_seconds", "seconds"),
                                            ("deadline_expiries", "int")))
        rows.append(f"<tr><td class='t'>{html.escape(s['sidecar'])}</td>{cells}</tr>")
    head = "".join(f"<th>{k}</th>" for _ in range(2)
                   for k in ("admitted", "share", "wait mean", "wait max", "expiries"))
    return (f"<p>{html.escape(q['queue'])}, per sidecar (replayed | predicted):</p>"
            "<div class='wide'><table><tr><th>sidecar</th>" + head + "</tr>" + "".join(rows)
            + "</table></div>")


def write(out: Path, doc: Mapping[str, Any]) -> Path:
    path = out / "what-if.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path
