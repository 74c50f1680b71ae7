"""The benchmark's printed table, from the JSON document the run writes."""

from __future__ import annotations

import math
from typing import Any

TARGETS = ("direct", "floodwall", "pump", "haproxy")
GOAL_TEXT = {
    "firehose_1k_floodwall_over_direct_ge_0.90":
        "1 KiB firehose through floodwall >= 0.90 x direct",
    "cpu_per_msg_floodwall_le_5x_pump": "floodwall CPU per message <= 5 x the pump's",
    "added_p99_le_1ms_at_5k": "added p99 latency <= 1 ms at 5,000 msg/s",
    "idle_conn_le_64KiB": "<= 64 KiB per idle connection",
}


def _f(value: Any, fmt: str, dash: str = "-") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return dash
    return format(value, fmt)


def _n(value: Any) -> float:
    """A figure as a float; None (NaN written to JSON as null) and absent as NaN."""
    return math.nan if value is None else float(value)


def _div(a: Any, b: Any) -> float:
    a, b = _n(a), _n(b)
    return a / b if b else math.nan


def _errors(runs: list[dict[str, Any]]) -> str:
    errs = [r["error"] for r in runs if "error" in r]
    return f"  ({len(errs)} failed: {errs[0][:60]})" if errs else ""


def print_report(doc: dict[str, Any]) -> None:
    meta, results, summary = doc["meta"], doc["results"], doc["summary"]
    env, opts = meta["environment"], meta["options"]
    print()
    print(f"floodwall relay benchmark, {meta['started']}: {env.get('cpus')} CPUs "
          f"({env.get('cpu', '?')}), RabbitMQ {env.get('rabbitmq', '?')}, Python "
          f"{env['python']}, uvloop {env['uvloop']}")
    print("msgs/s: median over rounds; x direct: ratio of medians; paired: median of per-round "
          "ratios;\ncpu-model: ratio predicted from CPU per message when the cores are the "
          "limit; noise cores: CPU\nused by other processes on the machine during the "
          "measured window (median)")
    print(f"{opts['rounds']} rounds alternating targets, {opts['seconds']:g} s measured per "
          f"run after {opts['warmup']:g} s warm-up, {opts['size']} B bodies; medians shown; "
          f"load average before {meta['loadavg_before'][0]:.2f}")
    if "floodwall_event_loop" in meta:
        print(f"floodwall event loop: {meta['floodwall_event_loop']}")
    for note in meta.get("notes", []):
        print("note:", note)

    for scn in ("firehose", "drain", "firehose10"):
        if scn not in results:
            continue
        r = results[scn]
        print(f"\n{scn}: {r['title']}")
        print(f"  {'target':<10}{'msgs/s':>10}{'x direct':>10}{'paired':>8}{'cpu-model':>10}"
              f"{'relay us/msg':>14}{'broker us/msg':>15}{'noise cores':>13}")
        direct = r["median"].get("direct", {}).get("msgs_per_s", math.nan)
        s = summary.get(scn, {})
        for t in TARGETS:
            m = r["median"].get(t, {})
            if not m:
                print(f"  {t:<10}{'n/a':>10}{_errors(r['runs'].get(t, []))}")
                continue
            rate = m.get("msgs_per_s", math.nan)
            paired = s.get(f"{t}_over_direct_paired") if t != "direct" else None
            model = s.get(f"{t}_over_direct_cpu_model") if t != "direct" else None
            print(f"  {t:<10}{_f(rate, ',.0f'):>10}{_f(_div(rate, direct), '.3f'):>10}"
                  f"{_f(paired, '.3f'):>8}{_f(model, '.3f'):>10}"
                  f"{_f(m.get('relay_cpu_us_per_msg') if t != 'direct' else None, '.2f'):>14}"
                  f"{_f(m.get('broker_cpu_us_per_msg'), '.2f'):>15}"
                  f"{_f(m.get('other_cores'), '.2f'):>13}{_errors(r['runs'].get(t, []))}")
        print(f"  CPU per message floodwall / pump: "
              f"{_f(s.get('cpu_ratio_floodwall_over_pump'), '.2f')}x, floodwall / HAProxy: "
              f"{_f(s.get('cpu_ratio_floodwall_over_haproxy'), '.2f')}x; msgs/s floodwall / "
              f"HAProxy: {_f(s.get('floodwall_over_haproxy'), '.3f')}; relay ceiling on one "
              f"core (1 / CPU per msg): floodwall "
              f"{_f(_div(1e6, s.get('floodwall_cpu_us_per_msg')), ',.0f')}, pump "
              f"{_f(_div(1e6, s.get('pump_cpu_us_per_msg')), ',.0f')}, HAProxy "
              f"{_f(_div(1e6, s.get('haproxy_cpu_us_per_msg')), ',.0f')} msg/s")
        fit = s.get("msgs_per_s_noise_adjusted", {})
        print(f"  noise-adjusted msgs/s (zero foreign load, common slope "
              f"{_f(s.get('noise_slope_msgs_per_s_per_core'), ',.0f')} msg/s per core of noise):"
              f" direct {_f(fit.get('direct'), ',.0f')}, floodwall "
              f"{_f(fit.get('floodwall'), ',.0f')} "
              f"({_f(s.get('floodwall_over_direct_noise_adjusted'), '.3f')}), pump "
              f"{_f(fit.get('pump'), ',.0f')} "
              f"({_f(s.get('pump_over_direct_noise_adjusted'), '.3f')}), HAProxy "
              f"{_f(fit.get('haproxy'), ',.0f')} "
              f"({_f(s.get('haproxy_over_direct_noise_adjusted'), '.3f')})")

    if "latency" in results:
        r = results["latency"]
        lat = summary["latency"]
        pooled = r.get("pooled", {})
        print(f"\nlatency: {r['title']} ({opts['latency_rate']:,} msg/s); median of per-run "
              "percentiles, then all runs pooled")
        print(f"  {'target':<10}{'p50 us':>8}{'p99 us':>8}{'p99.9 us':>10}"
              f"{'+p50':>7}{'+p99':>8}{'+p99.9':>8}{'| pooled +p99':>13}{'+p99.9':>8}"
              f"{'relay us/msg':>14}{'noise cores':>13}")
        for t in TARGETS:
            m = r["median"].get(t, {})
            if not m:
                print(f"  {t:<10}{'n/a':>8}{_errors(r['runs'].get(t, []))}")
                continue
            add = [lat.get("added_" + k, {}).get(t) for k in ("p50_us", "p99_us", "p999_us")]
            padd = [lat.get("added_pooled_" + k, {}).get(t) for k in ("p99_us", "p999_us")]
            pool = pooled.get(t, {})
            if t == "direct":
                padd = [pool.get("p99_us"), pool.get("p999_us")]
            print(f"  {t:<10}{_f(m.get('p50_us'), '.0f'):>8}{_f(m.get('p99_us'), '.0f'):>8}"
                  f"{_f(m.get('p999_us'), '.0f'):>10}"
                  f"{_f(add[0], '+.0f'):>7}{_f(add[1], '+.0f'):>8}{_f(add[2], '+.0f'):>8}"
                  f"{_f(padd[0], '+.0f' if t != 'direct' else '.0f'):>13}"
                  f"{_f(padd[1], '+.0f' if t != 'direct' else '.0f'):>8}"
                  f"{_f(m.get('relay_cpu_us_per_msg') if t != 'direct' else None, '.1f'):>14}"
                  f"{_f(m.get('other_cores'), '.2f'):>13}"
                  + _errors(r["runs"].get(t, [])))

        quiet = lat.get("quiet", {})
        print("  quiet runs only (other processes < 0.3 cores): " + "; ".join(
            f"{t} ({int(quiet.get(t, {}).get('runs', 0))}) p50 "
            f"{_f(quiet.get(t, {}).get('p50_us'), '.0f')} p99 "
            f"{_f(quiet.get(t, {}).get('p99_us'), '.0f')} p99.9 "
            f"{_f(quiet.get(t, {}).get('p999_us'), '.0f')}" for t in TARGETS) + " us")

    if "idle" in results:
        r = results["idle"]
        print(f"\nidle: {r['title']} ({opts['idle_connections']} connections)")
        for t in TARGETS[1:]:
            m = r["median"].get(t, {})
            if not m:
                print(f"  {t:<10} n/a{_errors(r['runs'].get(t, []))}")
                continue
            print(f"  {t:<10}{_f(_div(m.get('bytes_per_connection'), 1024), '.1f'):>8}"
                  f" KiB/connection (RSS {_f(_div(m.get('rss_before'), 2**20), '.1f')} -> "
                  f"{_f(_div(m.get('rss_during'), 2**20), '.1f')} MiB)")

    print("\ngoals")
    for key, g in summary["goals"].items():
        ok = g["met"]
        verdict = "met" if ok is True else "NOT MET" if ok is False else "not measured"
        value = g["value"]
        shown = (_f(_div(value, 1024), ".1f") + " KiB" if key.startswith("idle")
                 else _f(value, "+.0f") + " us" if key.startswith("added")
                 else _f(value, ".3f"))
        print(f"  {verdict:<13}{GOAL_TEXT.get(key, key)}: {shown} ({g['estimate']})")
    print(f"\nelapsed {meta.get('elapsed_s')} s; load average after "
          f"{meta['loadavg_after'][0]:.2f}")


# -- several releases side by side (``--broker 3.10,4.0``) -------------------------------------
def _group(cells: list[str], widths: tuple[int, ...]) -> str:
    return " |" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))


def _verdict(goal: dict[str, Any] | None) -> str:
    if goal is None:
        return "-"
    ok = goal.get("met")
    return "met" if ok is True else "NOT MET" if ok is False else "not measured"


def release_lines(both: dict[str, Any]) -> list[str]:
    """The side-by-side table of a run over several releases: per scenario a row per target,
    a column group per release (ratios are against direct on the same release's broker)."""
    docs: dict[str, dict[str, Any]] = both["releases"]
    names = list(docs)
    first = docs[names[0]]["meta"]
    opts = first["options"]
    versions = ", ".join(f"{n} ({docs[n]['meta']['environment'].get('rabbitmq', '?')})"
                         for n in names)
    lines = [f"floodwall relay benchmark, {both['meta']['started']}: RabbitMQ {versions}, a "
             "private broker per release, all up",
             f"{opts['rounds']} rounds, each alternating the releases and within a release the "
             "targets, "
             f"{opts['seconds']:g} s measured per run after {opts['warmup']:g} s warm-up, "
             f"{opts['size']} B bodies; medians; x direct: against direct on the same release"]
    for n in names:
        for note in docs[n]["meta"].get("notes", []):
            lines.append(f"note ({n}): {note}")
    rate_w = (10, 9, 8, 9, 10, 7)

    def ran(scn: str) -> list[str]:  # the targets of the scenario on any release
        return [t for t in TARGETS if any(docs[n]["results"].get(scn, {}).get("runs", {})
                                          .get(t) for n in names)]
    for scn in ("firehose", "drain", "firehose10", "drain10"):
        if not any(scn in docs[n]["results"] for n in names):
            continue
        title = next(docs[n]["results"][scn]["title"] for n in names
                     if scn in docs[n]["results"])
        lines.append(f"\n{scn}: {title}")
        lines.append(f"  {'':<10}" + "".join(
            f" |{n + ': msgs/s':>10}{'x direct':>9}{'paired':>8}{'relay us':>9}"
            f"{'broker us':>10}{'noise':>7}" for n in names))
        for t in ran(scn):
            row = f"  {t:<10}"
            for n in names:
                r = docs[n]["results"].get(scn, {})
                m = r.get("median", {}).get(t, {})
                s = docs[n]["summary"].get(scn, {})
                direct = r.get("median", {}).get("direct", {}).get("msgs_per_s")
                rate = m.get("msgs_per_s")
                row += _group([
                    _f(rate, ",.0f", "n/a"), _f(_div(rate, direct), ".3f"),
                    _f(s.get(f"{t}_over_direct_paired") if t != "direct" else None, ".3f"),
                    _f(m.get("relay_cpu_us_per_msg") if t != "direct" else None, ".2f"),
                    _f(m.get("broker_cpu_us_per_msg"), ".2f"),
                    _f(m.get("other_cores"), ".2f")], rate_w)
            lines.append(row)
    if any("latency" in docs[n]["results"] for n in names):
        lines.append(f"\nlatency: 0-9-1 round trip at {opts['latency_rate']:,} msg/s "
                     "(median of per-run percentiles, us; + is above direct)")
        lines.append(f"  {'':<10}" + "".join(
            f" |{n + ': p50':>9}{'p99':>7}{'+p99':>7}{'quiet +p99':>11}{'relay us':>9}"
            for n in names))
        for t in ran("latency"):
            row = f"  {t:<10}"
            for n in names:
                m = docs[n]["results"].get("latency", {}).get("median", {}).get(t, {})
                lat = docs[n]["summary"].get("latency", {})
                row += _group([
                    _f(m.get("p50_us"), ".0f", "n/a"), _f(m.get("p99_us"), ".0f"),
                    _f(lat.get("added_p99_us", {}).get(t), "+.0f"),
                    _f(lat.get("added_quiet_p99_us", {}).get(t), "+.0f"),
                    _f(m.get("relay_cpu_us_per_msg") if t != "direct" else None, ".1f")],
                    (9, 7, 7, 11, 9))
            lines.append(row)
    if any("idle" in docs[n]["results"] for n in names):
        lines.append(f"\nidle: KiB per idle 0-9-1 connection ({opts['idle_connections']} "
                     "connections)")
        lines.append(f"  {'':<10}" + "".join(f" |{n:>9}" for n in names))
        for t in ran("idle"):
            lines.append(f"  {t:<10}" + "".join(_group([_f(_div(
                docs[n]["results"].get("idle", {}).get("median", {}).get(t, {}).get(
                    "bytes_per_connection"), 1024), ".1f", "n/a")], (9,)) for n in names))
    lines.append("\ngoals" + "".join(f" | {n}" for n in names))
    keys = list(dict.fromkeys(k for n in names for k in docs[n]["summary"].get("goals", {})))
    for key in keys:
        cells = []
        for n in names:
            g = docs[n]["summary"].get("goals", {}).get(key)
            value = None if g is None else g.get("value")
            shown = (_f(_div(value, 1024), ".1f") + " KiB" if key.startswith("idle")
                     else _f(value, "+.0f") + " us" if key.startswith("added")
                     else _f(value, ".3f"))
            cells.append(f"{_verdict(g)} {shown}")
        lines.append(f"  {GOAL_TEXT.get(key, key)}" + "".join(f" | {c}" for c in cells))
    lines.append(f"\nelapsed {both['meta'].get('elapsed_s')} s")
    return lines


def print_releases(both: dict[str, Any]) -> None:
    print()
    print("\n".join(release_lines(both)))
