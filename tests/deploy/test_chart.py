"""The Helm chart helm/floodwall.

Three layers, each used where it can run:
1. Always (no Helm): values.schema.json validates values.yaml and the examples (jsonschema);
   the templates parse as Go-template-wrapped YAML with the expected keys; every
   ``.Values.x`` a template reads exists, every value is used and is in the README; the
   worked example's objects (examples/sidecar/rendered.yaml, plain YAML) validate offline
   against the Kubernetes schemas (kubernetes-validate); the policies in the examples load.
2. Helm's own engine, in-process (the ``helm_python`` package of helm-python-sdk, which
   binds Helm's Go SDK): lint, render default/standalone/sidecar/native, validate every
   rendered object, and check that the example still renders exactly rendered.yaml.
3. The ``helm`` binary (PATH, else build/bin/helm, which `make deps` fetches: helm_binary.py):
   ``helm lint --strict`` and ``helm template`` of every values example, output validated.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from floodwall.cli import run as run_command
from floodwall.control.policy import load_policies
from tests.deploy.helm_binary import helm_path

pytestmark = pytest.mark.load_tolerant

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "floodwall"
EXAMPLES = CHART / "examples"
SIDECAR_EXAMPLE = EXAMPLES / "sidecar"
RENDERED = SIDECAR_EXAMPLE / "rendered.yaml"
STANDALONE_VALUES = EXAMPLES / "standalone-values.yaml"
# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion), the first with native
# sidecars on by default, and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", "1.29.0", "1.33.0")
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # not in the Kubernetes
# schemas: checked by hand (tests/deploy/test_monitoring.py)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def values() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(CHART / "values.yaml")
    return doc


def schema() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return doc


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over the chart's defaults (maps merge, rest replace)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def validate_k8s(doc: dict[str, Any], versions: tuple[str, ...] = KUBE_VERSIONS) -> None:
    import kubernetes_validate

    if doc["kind"] in CRD_KINDS:
        return
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} invalid for Kubernetes "
                        f"{version}: {exc.message} at {list(exc.path)}")


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def floodwall_container(spec: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in spec.get("containers", []) + spec.get("initContainers", [])
        if c["name"] == "floodwall"]
    assert len(found) == 1, spec
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def check_floodwall_pod(spec: dict[str, Any], drain: int = 30, margin: int = 10,
                        pre_stop: int = 0) -> dict[str, Any]:
    """What every pod with floodwall in it must have; returns the container."""
    c = floodwall_container(spec)
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "floodwall-admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "floodwall-admin"}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert spec["terminationGracePeriodSeconds"] == pre_stop + drain + margin
    env = env_of(c)
    assert env["FLOODWALL_DRAIN_TIMEOUT"] == f"{drain}s"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for m in mounts:
        assert m in volumes, f"mount {m} has no volume"
    # the policies: the whole ConfigMap as a directory (no subPath: edits reach the pod)
    if "floodwall-policies" in mounts:
        assert "subPath" not in mounts["floodwall-policies"]
        assert env["FLOODWALL_POLICIES"] == mounts["floodwall-policies"]["mountPath"] + \
            "/policies.yaml"
        assert "configMap" in volumes["floodwall-policies"]
    assert mounts["floodwall-spool"]["mountPath"] == env["FLOODWALL_SPOOL_DIR"]
    return c


# --- 1. without Helm -------------------------------------------------------------------
def test_schema_is_valid_draft7_and_accepts_the_defaults() -> None:
    jsonschema.Draft7Validator.check_schema(schema())
    assert schema_errors(values()) == []


def test_schema_accepts_the_examples() -> None:
    sidecar = load_yaml(SIDECAR_EXAMPLE / "values.yaml")["floodwall"]
    assert schema_errors(merged(values(), sidecar)) == []
    assert schema_errors(merged(values(), load_yaml(STANDALONE_VALUES))) == []


def test_schema_accepts_the_values_in_the_kubernetes_walkthrough() -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    section = doc[doc.index("## Deploy as a sidecar"):]
    block = section[section.index("**The values**"):]
    block = block[block.index("```yaml") + len("```yaml"):]
    doc = yaml.safe_load(block[:block.index("```")])
    assert schema_errors(merged(values(), doc["floodwall"])) == []
    assert doc["floodwall"]["policies"] == load_yaml(SIDECAR_EXAMPLE / "values.yaml")[
        "floodwall"]["policies"]


def test_the_readme_quick_start_values_and_policy_are_valid(tmp_path: Path) -> None:
    """README.md's Kubernetes quick start passes the chart's schema, and its policy example
    and the quick start's policies load."""
    readme = (ROOT / "README.md").read_text()

    def block(section: str) -> str:
        text = readme[readme.index(section):]
        text = text[text.index("```yaml") + len("```yaml"):]
        return text[:text.index("```")]

    doc = yaml.safe_load(block("## Quick start: Kubernetes sidecar"))
    assert schema_errors(merged(values(), doc["floodwall"])) == []
    (tmp_path / "chart.yaml").write_text(yaml.safe_dump(doc["floodwall"]["policies"]["config"]))
    (tmp_path / "example.yaml").write_text(block("## A policy"))
    for name in ("chart.yaml", "example.yaml"):
        (p,) = load_policies(str(tmp_path / name)).policies
        assert (p.capacity, p.resume) == (64 * 1024**2, 48 * 1024**2), name


@pytest.mark.parametrize(("override", "fragment"), [
    ({"mdoe": "sidecar"}, "'mdoe' was unexpected"),
    ({"mode": "daemonset"}, "is not one of"),
    ({"upstream": "rabbitmq"}, "does not match"),
    ({"securityContext": {"runAsNonRoot": False}}, "True was expected"),
    ({"drain": {"timeoutSeconds": -1}}, "less than the minimum"),
    ({"policies": {"config": {"version": 2}}}, "1 was expected"),
    ({"spool": {"persistence": {"size": "lots"}}}, "does not match"),
    ({"listen": {"port": 70000}}, "greater than the maximum"),
])
def test_schema_refuses_mistakes(override: dict[str, Any], fragment: str) -> None:
    errors = schema_errors(merged(values(), override))
    assert any(fragment in e for e in errors), errors


def test_policies_in_the_values_and_examples_load(tmp_path: Path) -> None:
    texts = {
        "values.yaml": yaml.safe_dump(values()["policies"]["config"]),
        "sidecar example": yaml.safe_dump(
            load_yaml(SIDECAR_EXAMPLE / "values.yaml")["floodwall"]["policies"]["config"]),
        "standalone example": load_yaml(STANDALONE_VALUES)["policies"]["text"],
    }
    for name, text in texts.items():
        path = tmp_path / "policies.yaml"
        path.write_text(text)
        assert load_policies(str(path)) is not None, name


# Go-template-wrapped YAML: a line that is only actions is dropped; an action inside a line
# becomes a placeholder scalar. Both branches of an if/else stay, so keys may repeat.
_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.S)
_ACTION = re.compile(r"\{\{-?(.*?)-?\}\}", re.S)


def skeleton(text: str) -> str:
    text = _COMMENT.sub("", text)
    lines = []
    for line in text.splitlines():
        if _ACTION.search(line) and not _ACTION.sub("", line).strip():
            continue
        lines.append(_ACTION.sub("TPL", line))
    return "\n".join(lines)


def defines(text: str) -> dict[str, str]:
    """``{{ define "name" }}`` bodies of a helpers file, nested blocks counted."""
    text = _COMMENT.sub("", text)
    found: dict[str, str] = {}
    depth, name, start = 0, "", 0
    for m in _ACTION.finditer(text):
        words = m.group(1).split()
        if not words:
            continue
        if words[0] == "define" and depth == 0:
            name, start, depth = words[1].strip('"'), m.end(), 1
        elif words[0] in ("if", "with", "range", "define", "block") and depth:
            depth += 1
        elif words[0] == "end" and depth:
            depth -= 1
            if depth == 0:
                found[name] = text[start:m.start()]
    return found


def template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir())}


EXPECTED_OBJECTS = {
    "configmap.yaml": ("v1", "ConfigMap", [["data", "policies.yaml"]]),
    "deployment.yaml": ("apps/v1", "Deployment", [
        ["spec", "replicas"], ["spec", "selector", "matchLabels"],
        ["spec", "template", "spec", "terminationGracePeriodSeconds"],
        ["spec", "template", "spec", "securityContext"],
        ["spec", "template", "spec", "containers"], ["spec", "template", "spec", "volumes"]]),
    "service.yaml": ("v1", "Service", [["spec", "ports"], ["spec", "selector"]]),
    "poddisruptionbudget.yaml": ("policy/v1", "PodDisruptionBudget", [
        ["spec", "maxUnavailable"], ["spec", "selector", "matchLabels"]]),
    "servicemonitor.yaml": ("monitoring.coreos.com/v1", "ServiceMonitor", [
        ["spec", "endpoints"], ["spec", "selector", "matchLabels"]]),
    "pvc.yaml": ("v1", "PersistentVolumeClaim", [
        ["spec", "accessModes"], ["spec", "resources", "requests", "storage"]]),
}


def dig(doc: Any, path: list[str]) -> Any:
    for key in path:
        assert isinstance(doc, dict) and key in doc, f"missing {'.'.join(path)} at {key!r}"
        doc = doc[key]
    return doc


def test_templates_parse_as_yaml_with_the_expected_keys() -> None:
    texts = template_texts()
    assert set(EXPECTED_OBJECTS) <= set(texts), sorted(texts)
    for name, (api, kind, paths) in EXPECTED_OBJECTS.items():
        doc = yaml.safe_load(skeleton(texts[name]))
        assert (doc["apiVersion"], doc["kind"]) == (api, kind), name
        dig(doc, ["metadata", "name"])
        dig(doc, ["metadata", "labels"])
        for path in paths:
            dig(doc, path)
    service = yaml.safe_load(skeleton(texts["service.yaml"]))
    assert [p["name"] for p in service["spec"]["ports"]] == ["amqp", "amqps", "admin"]
    monitor = yaml.safe_load(skeleton(texts["servicemonitor.yaml"]))
    assert monitor["spec"]["endpoints"][0]["port"] == "admin"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_helpers_parse_with_the_expected_keys() -> None:
    helpers = defines(texts := (CHART / "templates" / "_helpers.tpl").read_text())
    assert {"floodwall.sidecar", "floodwall.container", "floodwall.volumes",
            "floodwall.fullname", "floodwall.podAnnotations",
            "floodwall.terminationGracePeriodSeconds"} <= set(helpers), sorted(helpers)
    container = yaml.safe_load(skeleton(helpers["floodwall.container"]))
    for key in ("name", "image", "ports", "env", "volumeMounts", "readinessProbe",
                "livenessProbe", "resources", "securityContext", "lifecycle", "restartPolicy"):
        assert key in container, key
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"] for e in container["env"]}
    assert {"FLOODWALL_UPSTREAM", "FLOODWALL_LISTEN", "FLOODWALL_ADMIN",
            "FLOODWALL_DRAIN_TIMEOUT", "FLOODWALL_POLICIES", "FLOODWALL_MANAGEMENT",
            "FLOODWALL_MANAGEMENT_USERNAME", "FLOODWALL_MANAGEMENT_PASSWORD",
            "FLOODWALL_MANAGEMENT_PASSWORD_FILE", "FLOODWALL_SPOOL_DIR",
            "FLOODWALL_TELEMETRY_DIR"} <= env, env
    secret_refs = [e for e in container["env"] if "valueFrom" in e]
    assert all("secretKeyRef" in e["valueFrom"] for e in secret_refs)
    volumes = {v["name"] for v in yaml.safe_load(skeleton(helpers["floodwall.volumes"]))}
    assert {"floodwall-policies", "floodwall-spool", "floodwall-telemetry",
            "floodwall-management"} <= volumes
    sidecar = yaml.safe_load(skeleton(helpers["floodwall.sidecar"]))
    assert set(sidecar) == {"containers", "initContainers", "volumes", "annotations",
                            "terminationGracePeriodSeconds"}
    grace = helpers["floodwall.terminationGracePeriodSeconds"]
    for part in ("drain.preStopSleepSeconds", "drain.timeoutSeconds", "drain.graceMarginSeconds"):
        assert part in grace
    assert "subPath" not in texts


def _values_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Leaf paths of values.yaml; empty maps, lists and free-form maps are leaves."""
    free_form = {"resources", "securityContext", "policies.config", "standalone.podSecurityContext",
                 "standalone.affinity", "metrics.grafanaDashboard.labels"}
    if isinstance(node, dict) and node and prefix not in free_form:
        for key, value in node.items():
            yield from _values_paths(value, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix


def test_every_value_read_exists_is_used_and_is_documented() -> None:
    texts = _COMMENT.sub("", "\n".join(template_texts().values()))
    read = set(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", texts))
    defaults = values()
    for path in sorted(read):
        dig(defaults, path.lstrip(".").split("."))
    readme = (CHART / "README.md").read_text()
    for path in _values_paths(defaults):
        assert any(r.lstrip(".") == path or r.lstrip(".").startswith(path + ".")
                   for r in read), f"value {path} is not used by any template"
        assert f"`{path}`" in readme, f"value {path} is not in helm/floodwall/README.md"


def test_includes_name_defined_templates() -> None:
    defined = set(defines((CHART / "templates" / "_helpers.tpl").read_text()))
    sources = list(template_texts().values())
    sources += [p.read_text() for p in (SIDECAR_EXAMPLE / "templates").iterdir()]
    for text in sources:
        for name in re.findall(r'include\s+"([^"]+)"', text):
            assert name in defined, name


def rendered_example() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RENDERED.read_text()) if d]


def test_worked_example_objects_validate_offline() -> None:
    docs = rendered_example()
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "ConfigMap", "Deployment"]
    for doc in docs:
        validate_k8s(doc)
    network_policy, configmap, deployment = docs
    # the admin port only from Prometheus's namespace, on the application's pods
    selector = network_policy["spec"]["podSelector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector and all(labels.get(k) == v for k, v in selector.items())
    (rule,) = network_policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9090, "protocol": "TCP"}]
    spec = pod_spec(deployment)
    c = check_floodwall_pod(spec)
    assert [x["name"] for x in spec["containers"]] == ["orders-api", "floodwall"]
    app_env = env_of(spec["containers"][0])
    assert (app_env["AMQP_HOST"], app_env["AMQP_PORT"]) == ("127.0.0.1", "5673")
    env = env_of(c)
    assert env["FLOODWALL_LISTEN"] == "127.0.0.1:5673"  # only the pod's containers
    assert env["FLOODWALL_MANAGEMENT_PASSWORD"] == {
        "secretKeyRef": {"name": "rabbitmq-management", "key": "password"}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["floodwall-policies"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert "emptyDir" in volumes["floodwall-spool"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert "orders.*" in configmap["data"]["policies.yaml"]


def test_worked_example_policies_load(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    (configmap,) = [d for d in rendered_example() if d["kind"] == "ConfigMap"]
    path.write_text(configmap["data"]["policies.yaml"])
    found = load_policies(str(path)).for_queue("/", "orders.created")
    assert found is not None and found.name == "orders"


# --- 2. Helm's engine, in-process ------------------------------------------------------
def _helm() -> Any:
    """helm_python, imported here so that layer 1 runs without it."""
    return pytest.importorskip(
        "helm_python", reason="helm-python-sdk (Helm's Go SDK in-process) not installed")


def render(chart: Path, overrides: dict[str, Any] | None = None, name: str = "demo",
           namespace: str = "default") -> list[dict[str, Any]]:
    helm = _helm()
    with helm.Chart.load(str(chart)) as loaded:
        out = loaded.render(overrides, name=name, namespace=namespace)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {d["kind"]: d for d in docs}
    assert len(out) == len(docs), [d["kind"] for d in docs]
    return out


@pytest.fixture
def example_chart(tmp_path: Path) -> Path:
    """examples/sidecar with this chart as its dependency (what `helm dependency build`
    makes: the chart under charts/)."""
    app = tmp_path / "orders-app"
    shutil.copytree(SIDECAR_EXAMPLE, app)
    (app / "rendered.yaml").unlink()
    shutil.copytree(CHART, app / "charts" / "floodwall",
                    ignore=shutil.ignore_patterns("examples"))
    return app


@pytest.mark.parametrize("overrides", [None, load_yaml(STANDALONE_VALUES),
                                       {"sidecar": {"native": True}}])
def test_helm_lint_is_clean(overrides: dict[str, Any] | None) -> None:
    helm = _helm()
    report = helm.lint(str(CHART), overrides, strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_default_render_is_the_policies_configmap() -> None:
    docs = render(CHART)
    assert [d["kind"] for d in docs] == ["ConfigMap"]
    validate_k8s(docs[0])


def test_standalone_render() -> None:
    overrides = load_yaml(STANDALONE_VALUES)
    objs = by_kind(render(CHART, overrides, name="floodwall", namespace="messaging"))
    assert set(objs) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                         "ServiceMonitor"}
    for doc in objs.values():
        validate_k8s(doc)
    spec = pod_spec(objs["Deployment"])
    c = check_floodwall_pod(spec, drain=60, pre_stop=5)
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    env = env_of(c)
    assert env["FLOODWALL_LISTEN"] == "0.0.0.0:5673"
    assert env["FLOODWALL_MANAGEMENT_PASSWORD_FILE"] == "/etc/floodwall/management/password"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert objs["Deployment"]["spec"]["replicas"] == 2
    selector = objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert objs["Service"]["spec"]["selector"] == selector
    assert objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    monitor = objs["ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    assert objs["Service"]["metadata"]["labels"].items() >= selector.items()
    assert monitor["spec"]["endpoints"][0]["port"] == "admin"
    # the policies text goes in verbatim, comments and all, and loads
    assert objs["ConfigMap"]["data"]["policies.yaml"].startswith("# floodwall policies")


def test_standalone_spool_on_a_claim() -> None:
    overrides = {"mode": "standalone", "standalone": {"replicas": 1},
                 "spool": {"persistence": {"enabled": True, "storageClass": "fast"}}}
    objs = by_kind(render(CHART, overrides))
    claim = objs["PersistentVolumeClaim"]
    validate_k8s(claim)
    assert claim["spec"]["storageClassName"] == "fast"
    volumes = {v["name"]: v for v in pod_spec(objs["Deployment"])["volumes"]}
    assert volumes["floodwall-spool"]["persistentVolumeClaim"]["claimName"] == \
        claim["metadata"]["name"]
    assert objs["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}


def test_standalone_refuses_a_shared_spool() -> None:
    helm = _helm()
    with pytest.raises(helm.HelmError, match="a spool belongs to one process"):
        render(CHART, {"mode": "standalone",
                       "spool": {"persistence": {"enabled": True}}})


def test_helm_applies_the_schema() -> None:
    helm = _helm()
    with pytest.raises(helm.HelmError, match="mdoe"):
        render(CHART, {"mdoe": "standalone"})


def test_worked_example_renders_exactly_rendered_yaml(example_chart: Path) -> None:
    docs = render(example_chart, name="orders", namespace="shop")
    # in file order here; in helm's install order (by kind) in rendered.yaml
    assert sorted(docs, key=str) == sorted(rendered_example(), key=str)


def test_worked_example_as_native_sidecar(example_chart: Path) -> None:
    objs = by_kind(render(example_chart, {"floodwall": {"sidecar": {"native": True}}},
                          name="orders", namespace="shop"))
    spec = pod_spec(objs["Deployment"])
    assert [c["name"] for c in spec["containers"]] == ["orders-api"]
    (init,) = spec["initContainers"]
    assert init["restartPolicy"] == "Always"
    check_floodwall_pod(spec)
    validate_k8s(objs["Deployment"], ("1.29.0", "1.33.0"))  # native sidecars: 1.29+


def test_worked_example_variants(example_chart: Path) -> None:
    """Secret as a file, no policies, no telemetry, no annotations: still valid pods."""
    objs = by_kind(render(example_chart, {"floodwall": {
        "management": {"passwordAsFile": True}, "policies": {"enabled": False},
        "metrics": {"podAnnotations": False}, "probes": {"readiness": {"enabled": False}},
        "extraEnv": [{"name": "FLOODWALL_HOLD_BUDGET", "value": "32MiB"}]}}))
    assert set(objs) == {"Deployment", "NetworkPolicy"}
    validate_k8s(objs["Deployment"])
    spec = pod_spec(objs["Deployment"])
    c = floodwall_container(spec)
    env = env_of(c)
    assert "FLOODWALL_POLICIES" not in env
    assert env["FLOODWALL_TELEMETRY_DIR"] == ""  # telemetry needs policies
    assert env["FLOODWALL_MANAGEMENT_PASSWORD_FILE"] == "/etc/floodwall/management/password"
    assert env["FLOODWALL_HOLD_BUDGET"] == "32MiB"
    assert "readinessProbe" not in c
    assert "annotations" not in objs["Deployment"]["spec"]["template"]["metadata"]
    assert {v["name"] for v in spec["volumes"]} == {
        "floodwall-spool", "floodwall-telemetry", "floodwall-tmp", "floodwall-management"}


# --- 3. the helm binary ----------------------------------------------------------------
def helm_cli(*args: str) -> str:
    helm = helm_path()
    if helm is None:
        pytest.fail("no helm binary: `make build/bin/helm` fetches it (make deps does)")
    done = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def helm_template(chart: Path, values_doc: dict[str, Any] | None, tmp_path: Path,
                  *args: str) -> list[dict[str, Any]]:
    cmd = ["template", "demo", str(chart), *args]
    if values_doc is not None:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values_doc))
        cmd += ["-f", str(path)]
    return [d for d in yaml.safe_load_all(helm_cli(*cmd)) if d]


def network_policy_values(mode: str) -> dict[str, Any]:
    return {"mode": mode, "networkPolicy": {
        "enabled": True, "podSelector": {"app": "orders"} if mode == "sidecar" else {},
        "adminFrom": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "monitoring"}}}],
        "extraIngress": [{"ports": [{"port": 8080, "protocol": "TCP"}]}]}}


#: Every values example: the defaults, standalone-values.yaml, a native sidecar, the
#: README's TLS example (standalone), the NetworkPolicy in both modes, every optional object.
VALUES_EXAMPLES: dict[str, Any] = {
    "default": None,
    "standalone": load_yaml(STANDALONE_VALUES),
    "native-sidecar": {"sidecar": {"native": True}},
    "tls-standalone": "readme-tls",
    "networkpolicy-sidecar": network_policy_values("sidecar"),
    "networkpolicy-standalone": network_policy_values("standalone"),
    "everything-standalone": {"mode": "standalone", "metrics": {
        "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        "spool": {"persistence": {"enabled": True}}, "standalone": {"replicas": 1},
        "drain": {"preStopSleepSeconds": 5}},
}


@pytest.mark.parametrize("example", sorted(VALUES_EXAMPLES))
def test_helm_binary_lint_and_template(example: str, tmp_path: Path) -> None:
    """`helm lint --strict` and `helm template` of every values example; every object valid
    (strict) for Kubernetes 1.25, 1.29 and 1.33."""
    doc = VALUES_EXAMPLES[example]
    if doc == "readme-tls":
        doc = merged(readme_tls_values(), {"mode": "standalone"})
    args: tuple[str, ...] = ()
    if doc is not None:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(doc))
        args = ("-f", str(path))
    helm_cli("lint", "--strict", str(CHART), *args)
    docs = helm_template(CHART, doc, tmp_path)
    assert docs
    for rendered in docs:
        validate_k8s(rendered)


def test_helm_binary_renders_the_worked_example(example_chart: Path) -> None:
    docs = [d for d in yaml.safe_load_all(helm_cli("template", "orders", str(example_chart),
                                                   "--namespace", "shop")) if d]
    assert docs == rendered_example()
    for doc in docs:
        validate_k8s(doc)
    # as a native sidecar: valid from 1.29 (restartPolicy on an init container), refused
    # by 1.25's schema, which has no such field
    native = [d for d in yaml.safe_load_all(helm_cli(
        "template", "orders", str(example_chart), "--namespace", "shop",
        "--set", "floodwall.sidecar.native=true")) if d]
    (deployment,) = [d for d in native if d["kind"] == "Deployment"]
    assert floodwall_container(pod_spec(deployment))["restartPolicy"] == "Always"
    for doc in native:
        validate_k8s(doc, ("1.29.0", "1.33.0"))
    import kubernetes_validate

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.25.0", strict=True)


def test_network_policy_admits_only_the_admin_peers(tmp_path: Path) -> None:
    """Sidecar: the application's pods, the admin port from adminFrom only, the extra rule
    verbatim, nothing else; standalone adds the AMQP port from any source."""
    (np,) = [d for d in helm_template(CHART, network_policy_values("sidecar"), tmp_path)
             if d["kind"] == "NetworkPolicy"]
    assert np["spec"]["podSelector"] == {"matchLabels": {"app": "orders"}}
    admin, extra = np["spec"]["ingress"]
    assert admin["ports"] == [{"port": 9090, "protocol": "TCP"}]
    assert admin["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}
    assert extra == {"ports": [{"port": 8080, "protocol": "TCP"}]}
    (np,) = [d for d in helm_template(CHART, network_policy_values("standalone"), tmp_path)
             if d["kind"] == "NetworkPolicy"]
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "floodwall"
    assert np["spec"]["ingress"][1] == {"ports": [{"port": 5673, "protocol": "TCP"}]}
    # nobody listed: the admin port is closed to all but the node; no rule, no null
    closed = {"mode": "sidecar", "networkPolicy": {"enabled": True,
                                                   "podSelector": {"app": "orders"}}}
    (np,) = [d for d in helm_template(CHART, closed, tmp_path)
             if d["kind"] == "NetworkPolicy"]
    assert np["spec"]["ingress"] == []
    validate_k8s(np)


def test_network_policy_in_sidecar_mode_needs_the_application_pods(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True}}))
    helm = helm_path()
    assert helm is not None
    done = subprocess.run([helm, "template", "demo", str(CHART), "-f", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "needs networkPolicy.podSelector" in done.stderr


def test_admin_host_is_a_value_and_loopback_is_refused(tmp_path: Path) -> None:
    docs = helm_template(CHART, {"mode": "standalone", "admin": {"host": "10.0.0.7"}},
                         tmp_path)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = env_of(floodwall_container(pod_spec(deployment)))
    assert env["FLOODWALL_ADMIN"] == "10.0.0.7:9090"
    assert schema_errors(merged(values(), {"admin": {"host": "127.0.0.1"}}))
    assert not schema_errors(merged(values(), {"admin": {"host": "0.0.0.0"}}))


# --- TLS ---------------------------------------------------------------------------------
def readme_tls_values() -> dict[str, Any]:
    """The TLS example in helm/floodwall/README.md, as values."""
    text = (CHART / "README.md").read_text()
    block = text[text.index("## TLS"):]
    block = block[block.index("```yaml") + len("```yaml"):]
    doc: dict[str, Any] = yaml.safe_load(block[:block.index("```")])
    return doc


def test_the_readme_tls_example_is_valid() -> None:
    assert schema_errors(merged(values(), readme_tls_values())) == []


def test_standalone_with_tls_render() -> None:
    """The README's TLS example, standalone: every certificate mounted whole from its
    Secret, the FLOODWALL_* variables name the files, the Service offers amqps only, the
    probes stay plain HTTP on the admin port, and every variable is one floodwall reads."""
    overrides = merged(readme_tls_values(), {"mode": "standalone"})
    objs = by_kind(render(CHART, overrides, name="floodwall", namespace="messaging"))
    for doc in objs.values():
        validate_k8s(doc)
    spec = pod_spec(objs["Deployment"])
    c = check_floodwall_pod(spec)
    env = env_of(c)
    assert env["FLOODWALL_UPSTREAM"] == "amqps://rabbitmq.messaging.svc.cluster.local:5671"
    assert env["FLOODWALL_LISTEN"] == "off"
    assert env["FLOODWALL_LISTEN_TLS"] == "0.0.0.0:5671"
    assert env["FLOODWALL_UPSTREAM_TLS_CA"] == "/etc/floodwall/tls/upstream-ca/ca.crt"
    assert env["FLOODWALL_UPSTREAM_TLS_CERT"] == "/etc/floodwall/tls/upstream-client/tls.crt"
    assert env["FLOODWALL_UPSTREAM_TLS_KEY"] == "/etc/floodwall/tls/upstream-client/tls.key"
    assert env["FLOODWALL_UPSTREAM_TLS_SASL_EXTERNAL"] == "true"
    assert env["FLOODWALL_LISTEN_TLS_CERT"] == "/etc/floodwall/tls/listener/tls.crt"
    assert env["FLOODWALL_LISTEN_TLS_CLIENT_CA"] == "/etc/floodwall/tls/listener-client-ca/ca.crt"
    assert "FLOODWALL_UPSTREAM_TLS_RELAY_EXTERNAL" not in env
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for directory, secret in (("upstream-ca", "rabbitmq-ca"),
                              ("upstream-client", "floodwall-client"),
                              ("listener", "floodwall-listener"),
                              ("listener-client-ca", "clients-ca")):
        name = f"floodwall-tls-{directory}"
        assert mounts[name] == {"name": name, "mountPath": f"/etc/floodwall/tls/{directory}",
                                "readOnly": True}
        assert volumes[name]["secret"] == {"secretName": secret}
    assert [p["name"] for p in objs["Service"]["spec"]["ports"]] == ["amqps", "admin"]
    assert [p["name"] for p in c["ports"]] == ["floodwall-admin", "floodwall-amqps"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "floodwall-admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "floodwall-admin"}
    known = {p.envvar for p in run_command.params if getattr(p, "envvar", None)}
    tls_vars = {k for k in env if "TLS" in k}
    assert tls_vars <= known, tls_vars - known


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"tls": {"upstream": {"ca": {"existingSecret": "ca"}}}}, "upstream is not amqps"),
    ({"tls": {"listener": {"enabled": True}}}, "needs tls.listener.certificate"),
])
def test_tls_settings_that_cannot_work_are_refused(overrides: dict[str, Any],
                                                   fragment: str) -> None:
    helm = _helm()
    with pytest.raises(helm.HelmError, match=fragment):
        render(CHART, merged(overrides, {"mode": "standalone"}))


# --- the policies inside the values --------------------------------------------------------
def test_values_schema_carries_the_policy_schema() -> None:
    """values.schema.json's policies.config is policies/schema.json (as draft 7): a change to
    one is a change to both (``python -m tests.deploy.chart_schema`` rewrites the chart's)."""
    from tests.deploy.chart_schema import policies_config_schema

    assert schema()["properties"]["policies"]["properties"]["config"] == \
        policies_config_schema()


@pytest.mark.parametrize(("policy", "fragment"), [
    ({"name": "orders", "match": {"queue": "orders.*"}, "capcity": "64MiB"},
     "'capcity' was unexpected"),
    ({"name": "orders", "match": {"queue": "orders.*"}, "capacity": "64mib"},
     "is not valid under any of the given schemas"),
    ({"name": "orders", "match": {"queue": "orders.*"}, "overflow": "drop"}, "is not one of"),
    ({"name": "orders"}, "'match' is a required property"),
    ({"name": "has space", "match": {"queue": "a"}}, "does not match"),
])
def test_schema_refuses_a_bad_policy(policy: dict[str, Any], fragment: str) -> None:
    bad = {"policies": {"config": {"version": 1, "policies": [policy]}}}
    errors = schema_errors(merged(values(), bad))
    assert any(fragment in e for e in errors), errors


def test_schema_takes_plain_numbers_as_helm_reads_them() -> None:
    """Helm reads values YAML into float64: 67108864 arrives as 6.7108864e+07."""
    good = {"policies": {"config": {"version": 1, "policies": [{
        "name": "orders", "match": {"queue": "orders.*"}, "capacity": 6.7108864e+07,
        "resume": 50331648, "max_messages": 1e6}]}}}
    assert schema_errors(merged(values(), good)) == []


def test_helm_refuses_a_bad_policy_at_render_time() -> None:
    helm = _helm()
    with pytest.raises(helm.HelmError, match="capcity"):
        render(CHART, {"policies": {"config": {"version": 1, "policies": [
            {"name": "orders", "match": {"queue": "orders.*"}, "capcity": "64MiB"}]}}})


def test_plain_numbers_survive_helm_into_the_policies_file(tmp_path: Path) -> None:
    """Plain byte and message counts in a values file reach floodwall as the same whole
    numbers. Helm 3 reads them as float64 and renders 6.7108864e+07 and 1e+06 (the form
    tests/policy_corpus/helm_rendered.yaml has, which the loader reads back exactly);
    the Helm 4 engine here keeps them whole."""
    chart = tmp_path / "floodwall"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("examples"))
    doc = values()
    doc["policies"]["config"] = {"version": 1, "policies": [{
        "name": "orders", "match": {"queue": "orders.*"}, "capacity": 67108864,
        "resume": 50331648, "max_messages": 1000000, "resume_messages": 750000,
        "spool": {"max_bytes": 10000000000}}]}
    (chart / "values.yaml").write_text(yaml.safe_dump(doc))  # as a user's values file is read
    (configmap,) = render(chart)
    path = tmp_path / "policies.yaml"
    path.write_text(configmap["data"]["policies.yaml"])
    (p,) = load_policies(str(path)).policies
    assert (p.capacity, p.resume) == (64 * 1024**2, 48 * 1024**2)
    assert (p.max_messages, p.resume_messages) == (1_000_000, 750_000)
    assert p.spool.max_bytes == 10**10


def test_the_documented_kubernetes_commands_run(tmp_path: Path) -> None:
    """docs/kubernetes.md "Run it in Kubernetes": its helm commands, as written, succeed from
    a copy of helm/ (so `helm dependency build` writes nothing into the checkout)."""
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    section = doc[doc.index("## Run it in Kubernetes"):]
    block = section[section.index("```sh") + 5:]
    commands = [line.split("#")[0].split()[1:] for line in block[:block.index("```")]
                .splitlines() if line.startswith("build/bin/helm ")]
    assert {c[0] for c in commands} == {"lint", "template", "dependency"}
    shutil.copytree(ROOT / "helm", tmp_path / "helm")
    helm = helm_path()
    assert helm is not None, "no helm binary: `make build/bin/helm` fetches it"
    kinds: set[str] = set()
    for command in commands:
        done = subprocess.run([helm, *command], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (command, done.stdout + done.stderr)
        if command[0] == "template":
            kinds |= {d["kind"] for d in yaml.safe_load_all(done.stdout) if d}
    assert {"Deployment", "Service", "NetworkPolicy", "ConfigMap"} <= kinds
