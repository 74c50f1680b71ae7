"""The Grafana dashboard and the Prometheus alerts as tested artefacts.

- Every metric the dashboard and the alerts name is exported by a running floodwall, with
  samples: a real proxy in front of the real broker, a queue tripped and spooling, /metrics
  scraped.
- The alerts are valid rules (``promtool check rules``: PromQL and annotation templates) and
  fire on the series they are meant for, not on healthy neighbours (``promtool test rules``
  with tests/deploy/alerts_test.yaml).
- Every dashboard query is valid PromQL (checked by promtool as recording rules, Grafana's
  variables substituted); the layout fits Grafana's 24-column grid without overlaps.
- The chart renders them (PrometheusRule, dashboard ConfigMap) and a PodMonitor for sidecar
  mode; the copies in docs/monitoring/ are the chart's.

promtool is Debian's ``prometheus`` package (``make deps`` installs it). Without it the
promtool tests skip, with the reason; on CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.deploy.test_chart import CHART, _helm, by_kind, render
from tests.integration.support import metric_samples, pika_params, policy_file, start_flow

pytestmark = pytest.mark.load_tolerant

ROOT = Path(__file__).resolve().parents[2]
MONITORING = CHART / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
DASHBOARD = MONITORING / "dashboard.json"
ALERTS_TEST = Path(__file__).with_name("alerts_test.yaml")
DOCS = ROOT / "docs" / "monitoring"
#: Metric names the artefacts may use: floodwall's own and the process collector's.
METRIC = re.compile(r"\b(?:floodwall|process|python)_[a-z0-9_]+\b")
#: Grafana's variables, as a query would see them (promtool reads plain PromQL).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$instance": ".*",
                     "$vhost": ".*", "$queue": ".*"}


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query the dashboard runs: panels, annotations, the
    variables' ``label_values`` selectors."""
    doc = dashboard()
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]
    for annotation in doc["annotations"]["list"]:
        yield f"annotation {annotation['name']!r}", annotation["expr"]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert m, variable["query"]
            yield f"variable {variable['name']}", m.group(1)


def grafana_free(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def names_used() -> dict[str, set[str]]:
    """Metric name -> where the dashboard or the alerts use it."""
    used: dict[str, set[str]] = {}
    sources = [*dashboard_queries(), *((f"alert {r['alert']}", r["expr"]) for r in alert_rules())]
    for where, expr in sources:
        for name in METRIC.findall(expr):
            used.setdefault(name, set()).add(where)
    return used


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        reason = ("no promtool on PATH (Debian's prometheus package; `make deps` installs "
                  "it)")
        if os.environ.get("CI"):
            pytest.fail(reason + ": nothing may be skipped on CI", pytrace=False)
        pytest.skip(reason)
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- the artefacts themselves -----------------------------------------------------------

def test_docs_copies_are_the_charts() -> None:
    assert (DOCS / "floodwall-dashboard.json").read_bytes() == DASHBOARD.read_bytes()
    assert (DOCS / "floodwall-alerts.yaml").read_bytes() == ALERTS.read_bytes()


def test_the_alerts_asked_for_are_there() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    for alert in ("FloodwallUpstreamDown", "FloodwallQueueTrippedTooLong",
                  "FloodwallHeldBytesNearBudget", "FloodwallDeadlineExpiries",
                  "FloodwallSpoolFilling", "FloodwallDepthUnknown",
                  "FloodwallManagementApiFailing"):
        assert alert in rules, alert
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
    # docs/operations.md explains each one
    operations = (ROOT / "docs" / "operations.md").read_text()
    for alert in rules:
        assert alert in operations, f"{alert} is not explained in docs/operations.md"


def test_dashboard_layout() -> None:
    doc = dashboard()
    assert doc["uid"] == "floodwall-overview" and doc["title"] == "floodwall"
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource", "instance",
                                                              "vhost", "queue"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    taken: set[tuple[int, int]] = set()
    for panel in doc["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


# --- promtool ---------------------------------------------------------------------------

def test_alerts_are_valid_rules() -> None:
    out = run_promtool("check", "rules", str(ALERTS))
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


def test_alerts_fire_on_what_they_are_for(tmp_path: Path) -> None:
    """promtool test rules: each alert fires on its series at the time it should, and not
    on healthy neighbours (tests/deploy/alerts_test.yaml)."""
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # compared verbatim by promtool; templates checked above
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(doc))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yaml")
    tested = {t["alertname"] for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for r in alert_rules()}, "every alert has a firing test"
    out = run_promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert "SUCCESS" in out


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The firing test can fail: the same series, expecting a healthy instance to alert."""
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(doc))
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    tests["tests"][0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["instance"] = \
        "b:9090"
    (tmp_path / "broken_test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([promtool(), "test", "rules", "broken_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "FloodwallUpstreamDown" in done.stdout + done.stderr


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    rules = [{"record": f"dashboard:query_{i}", "expr": grafana_free(expr)}
             for i, (_, expr) in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = run_promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in out


def test_promtool_refuses_a_bad_query(tmp_path: Path) -> None:
    """The check above can fail: a query with a typo is refused."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "x:y", "expr": "sum by (queue (floodwall_queue_tripped)"}]}]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0


# --- against a running proxy ------------------------------------------------------------

@pytest.mark.broker
def test_every_metric_named_is_exported_by_a_running_proxy(
        start_floodwall: Callable[..., ProxyProcess], broker: BrokerEndpoint,
        tmp_path: Path) -> None:
    """A floodwall with a policy and a spool, one queue tripped and spooling: every metric
    name in the dashboard and the alerts has samples on /metrics."""
    queue = f"monitoring-{os.getpid()}-{tmp_path.name[-6:]}"
    policy = (f'{{name: orders, match: {{queue: "{queue}"}}, capacity: 4KiB, resume: 2KiB, '
              'overflow: spool, deadline: 60s}')
    flow = start_flow(start_floodwall, broker, policy_file(tmp_path / "p.yaml", policy),
                      "--spool-dir", str(tmp_path / "spool"), "--depth-interval", "50ms",
                      "--management-interval", "1s")
    conn = pika.BlockingConnection(pika_params(flow.port))
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        wait_for(lambda: flow.policed(queue), 15, what="the queue policed")
        ch.confirm_delivery()
        for _ in range(24):
            ch.basic_publish("", queue, b"x" * 1024)  # acked by the broker, then the spool
        wait_for(lambda: flow.metric("floodwall_spool_records") > 0, 15,
                 what="records in the spool")
        wait_for(lambda: flow.metric("floodwall_queue_depth_sample_age_seconds",
                                     source="management") > 0, 15,
                 what="a management figure")
        text = flow.metrics()
    finally:
        ch.queue_delete(queue)
        conn.close()
    exported = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
                if line and not line.startswith("#")}
    used = names_used()
    assert len(used) > 40, sorted(used)
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"named but not exported: {missing}"
    # and they carry the labels the dashboard's variables read
    assert metric_samples(text, "floodwall_queue_tripped")[0][0]["queue"] == queue
    assert metric_samples(text, "floodwall_build_info")[0][0]["version"]


# --- the chart --------------------------------------------------------------------------

def test_chart_renders_the_rules_the_dashboard_and_a_sidecar_podmonitor() -> None:
    _helm()
    objs = by_kind(render(CHART, {"metrics": {
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "podMonitor": {"enabled": True, "selector": {"app": "orders-api"}}}}))
    assert set(objs) == {"ConfigMap", "PrometheusRule", "PodMonitor"}
    rule = objs["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    monitor = objs["PodMonitor"]
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "orders-api"}}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "floodwall-admin", "path": "/metrics", "interval": "30s",
                        "scrapeTimeout": "10s"}


def test_chart_dashboard_configmap_carries_the_dashboard() -> None:
    _helm()
    docs = render(CHART, {"metrics": {"grafanaDashboard": {"enabled": True}}})
    (board,) = [d for d in docs if d["kind"] == "ConfigMap"
                and d["metadata"]["name"].endswith("-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["floodwall.json"]) == dashboard()


def test_sidecar_podmonitor_needs_a_selector() -> None:
    helm = _helm()
    with pytest.raises(helm.HelmError, match=re.escape("needs metrics.podMonitor.selector")):
        render(CHART, {"metrics": {"podMonitor": {"enabled": True}}})


def test_standalone_podmonitor_selects_the_charts_pods() -> None:
    _helm()
    objs = by_kind(render(CHART, {"mode": "standalone",
                                  "metrics": {"podMonitor": {"enabled": True}}}))
    selector = objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert objs["PodMonitor"]["spec"]["selector"] == {"matchLabels": selector}
    ports = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert "floodwall-admin" in [p["name"] for p in ports]
