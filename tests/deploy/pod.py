"""A pod without Kubernetes: the chart's sidecar render turned into containers.

The floodwall container is laid out from the ``floodwall.sidecar`` template's render (the
worked example chart, ``helm template``): its args, env, ports, probes, volumes, memory limit
and security context are read from the rendered Deployment, never written here a second
time. Containers share one network namespace, as a pod's do: the broker's container owns it
(and publishes the pod's ports to the host), floodwall joins it (``container:ID``).

The containers are driven by testcontainers through the Docker API: Docker's, or podman's
(``podman system service`` on a private unix socket) where podman is installed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.helm_binary import helm_path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "floodwall"
SIDECAR_EXAMPLE = CHART / "examples" / "sidecar"
_QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}


class PodError(AssertionError):
    """The pod could not be laid out or started; the message says why."""


@contextlib.contextmanager
def container_api() -> Iterator[str]:
    """DOCKER_HOST for the tests: the environment's, else podman's API served on a private
    socket for the session (stopped after), else Docker's own socket."""
    if os.environ.get("DOCKER_HOST"):
        yield os.environ["DOCKER_HOST"]
        return
    podman = shutil.which("podman")
    if podman is None:
        if Path("/var/run/docker.sock").exists():
            yield "unix:///var/run/docker.sock"
            return
        raise PodError("neither podman nor a Docker socket: `make deps` installs podman")
    with tempfile.TemporaryDirectory(prefix="floodwall-podman-") as tmp, \
            open(Path(tmp) / "service.log", "wb") as log:
        sock = Path(tmp) / "podman.sock"
        proc = subprocess.Popen([podman, "system", "service", "--time=0", f"unix://{sock}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise PodError("podman system service did not start: "
                                   + (Path(tmp) / "service.log").read_text()[-2000:])
                time.sleep(0.05)
            yield f"unix://{sock}"
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def quantity(text: str | int) -> int:
    """A Kubernetes quantity ("256Mi") in bytes."""
    match = re.fullmatch(r"(\d+)([KMG]i?|k)?", str(text))
    if match is None:
        raise PodError(f"unsupported quantity {text!r}")
    return int(match[1]) * _QUANTITY.get(match[2] or "", 1)


def render_example(values: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    """`helm template` of the worked example chart (this chart as its dependency) with the
    values given over its own."""
    helm = helm_path()
    if helm is None:
        raise PodError("no helm binary: `make build/bin/helm` fetches it (make deps does)")
    app = workdir / "app"
    shutil.copytree(SIDECAR_EXAMPLE, app)
    shutil.copytree(CHART, app / "charts" / "floodwall",
                    ignore=shutil.ignore_patterns("examples"))
    overrides = workdir / "pod-values.yaml"
    overrides.write_text(yaml.safe_dump(values))
    done = subprocess.run([helm, "template", "pod", str(app), "-f", str(overrides)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PodError(f"helm template: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@dataclass
class SidecarLayout:
    """The floodwall container of a rendered pod, as a container engine needs it."""

    container: dict[str, Any]
    pod_spec: dict[str, Any]
    config_maps: dict[str, dict[str, str]]
    ports: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.ports = {p["name"]: int(p["containerPort"]) for p in self.container["ports"]}

    @classmethod
    def from_render(cls, docs: list[dict[str, Any]]) -> SidecarLayout:
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        spec = deployment["spec"]["template"]["spec"]
        found = [c for c in spec.get("containers", []) + spec.get("initContainers", [])
                 if c["name"] == "floodwall"]
        if len(found) != 1:
            raise PodError(f"one floodwall container expected, found {len(found)}")
        maps = {d["metadata"]["name"]: dict(d.get("data") or {})
                for d in docs if d["kind"] == "ConfigMap"}
        return cls(found[0], spec, maps)

    @property
    def args(self) -> list[str]:
        return [str(a) for a in self.container.get("args", [])]

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in self.container["env"]:
            if "value" not in item:
                raise PodError(f"env {item['name']} is not a plain value: {item}")
            out[item["name"]] = str(item["value"])
        return out

    @property
    def memory_limit(self) -> int:
        return quantity(self.container["resources"]["limits"]["memory"])

    @property
    def grace_seconds(self) -> int:
        return int(self.pod_spec["terminationGracePeriodSeconds"])

    def probe_path(self, kind: str) -> tuple[str, int]:
        """(path, container port) of the readiness or liveness probe's httpGet."""
        get = self.container[f"{kind}Probe"]["httpGet"]
        port = get["port"]
        return get["path"], self.ports[port] if isinstance(port, str) else int(port)

    def volumes(self, prefix: str, config_root: Path) -> list[tuple[str, str, str]]:
        """(source, mount path, mode) per volumeMount: a ConfigMap's data as files in a
        host directory (read-only), an emptyDir as a named volume that outlives a restart
        of the container (as an emptyDir outlives a container restart in a pod)."""
        by_name = {v["name"]: v for v in self.pod_spec["volumes"]}
        out: list[tuple[str, str, str]] = []
        for mount in self.container["volumeMounts"]:
            volume = by_name[mount["name"]]
            mode = "ro" if mount.get("readOnly") else "rw"
            if "configMap" in volume:
                directory = config_root / mount["name"]
                directory.mkdir(parents=True, exist_ok=True)
                for key, text in self.config_maps[volume["configMap"]["name"]].items():
                    (directory / key).write_text(text)
                directory.chmod(0o755)
                out.append((str(directory), mount["mountPath"], mode))
            elif "emptyDir" in volume:
                out.append((f"{prefix}-{mount['name']}", mount["mountPath"], mode))
            else:
                raise PodError(f"volume {mount['name']}: only configMap and emptyDir here")
        return out

    def security(self) -> dict[str, Any]:
        """The securityContext as Docker API arguments."""
        ctx = self.container["securityContext"]
        out: dict[str, Any] = {"user": f"{ctx['runAsUser']}:{ctx['runAsGroup']}",
                               "read_only": bool(ctx["readOnlyRootFilesystem"])}
        if ctx.get("capabilities", {}).get("drop") == ["ALL"]:
            out["cap_drop"] = ["ALL"]
        if ctx.get("allowPrivilegeEscalation") is False:
            out["security_opt"] = ["no-new-privileges"]
        return out
