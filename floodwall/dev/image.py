"""Container images for `make image` and the pod tests: floodwall's, and RabbitMQ's made from
Debian's packages, each built once and reused while its recipe is unchanged.

Every image is tagged by a hash of what goes into it (the Dockerfile and the build context;
a Debian root's suite, packages and hooks), so a second `make image` or test run finds it in
the engine's storage and builds nothing. The engine is podman where installed, else docker.
Where no registry answers, the base is Debian 12 made by mmdebstrap and imported.

    python -m floodwall.dev.image             # build (or find) floodwall's image, print its tag
    python -m floodwall.dev.image rabbitmq 4.0
    python3 floodwall/dev/image.py containers-conf [PATH]   # podman's settings (stdlib only)
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "images"
#: The Dockerfile's default BASE (a registry's Python image pinned by digest).
REGISTRY_BASE_PREFIX = "ARG BASE="
#: What the build context holds (.dockerignore's allow list).
CONTEXT = ("Dockerfile", "pyproject.toml", "setup.py", "README.md", "LICENSE", "floodwall",
           "policies/example.yaml", "policies/schema.json")
#: Left out of a Debian root: no documentation, manual pages or translations in an image.
SLIM_DPKG = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright",
             "path-exclude=/usr/share/man/*", "path-exclude=/usr/share/info/*",
             "path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias")


class ImageError(RuntimeError):
    """An image could not be made; the message says which command failed and its output."""


@dataclass(frozen=True)
class DebianRoot:
    """A Debian root made by mmdebstrap and imported as an image."""

    name: str  # the image's repository, e.g. localhost/floodwall-base
    suite: str  # bookworm, trixie
    packages: tuple[str, ...]
    hooks: tuple[str, ...] = ()  # mmdebstrap --customize-hook commands ("$1" is the root)
    changes: tuple[str, ...] = ()  # podman/docker import --change instructions

    def digest(self) -> str:
        recipe = json.dumps([self.suite, self.packages, self.hooks, self.changes, SLIM_DPKG])
        return hashlib.sha256(recipe.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.suite}-{self.digest()}"


BASE = DebianRoot("localhost/floodwall-base", "bookworm", ("python3", "python3-venv"))

_RABBITMQ_HOOKS = (
    # the management API (queue depths in bytes) and a user that may log in from anywhere
    # (the proxy reaches the broker over the pod's loopback, the tests' checks through it)
    'echo "[rabbitmq_management]." > "$1/etc/rabbitmq/enabled_plugins"',
    'printf "loopback_users = none\\nlisteners.tcp.default = 5672\\n" '
    '> "$1/etc/rabbitmq/rabbitmq.conf"',
    'mkdir -p "$1/var/lib/rabbitmq/mnesia" "$1/var/log/rabbitmq"',
    'chroot "$1" chown -R rabbitmq:rabbitmq /var/lib/rabbitmq /var/log/rabbitmq /etc/rabbitmq',
)
_RABBITMQ_CHANGES = ("USER rabbitmq", "ENV HOME=/var/lib/rabbitmq",
                     "ENV RABBITMQ_LOGS=-",
                     'CMD ["/usr/lib/rabbitmq/bin/rabbitmq-server"]')
#: RabbitMQ from Debian 12 (3.10) and Debian 13 (4.0).
RABBITMQ = {
    "3.10": DebianRoot("localhost/floodwall-rabbitmq", "bookworm", ("rabbitmq-server",),
                       _RABBITMQ_HOOKS, _RABBITMQ_CHANGES),
    "4.0": DebianRoot("localhost/floodwall-rabbitmq", "trixie", ("rabbitmq-server",),
                      _RABBITMQ_HOOKS, _RABBITMQ_CHANGES),
}


#: What podman needs in a sandbox: runc (crun refuses some cgroup layouts) and ulimits under
#: the sandbox's hard limits (podman's default nofile can exceed them).
CONTAINERS_CONF_SETTINGS = {
    "containers": 'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]',
    "engine": 'runtime = "runc"',
}


def ensure_containers_conf(path: Path) -> bool:
    """Add the settings podman needs to containers.conf at ``path`` (made when absent); a
    key already set is left as it is. True when the file was changed."""
    lines = path.read_text().splitlines() if path.exists() else []
    changed = False
    for section, setting in CONTAINERS_CONF_SETTINGS.items():
        key = setting.split("=")[0].strip()
        if any(line.split("=")[0].strip() == key for line in lines if "=" in line):
            continue
        header = f"[{section}]"
        if header in (line.strip() for line in lines):
            at = [line.strip() for line in lines].index(header)
            lines.insert(at + 1, setting)
        else:
            lines += ["", header, setting]
        changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines).lstrip("\n") + "\n")
    return changed


def engine() -> str:
    """podman where installed, else docker (FLOODWALL_IMAGE_ENGINE chooses)."""
    chosen = os.environ.get("FLOODWALL_IMAGE_ENGINE")
    if chosen:
        return chosen
    for name in ("podman", "docker"):
        if shutil.which(name):
            return name
    raise ImageError("neither podman nor docker is installed (`make image` installs podman)")


def _run(*cmd: str, timeout: float = 1800) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ImageError(f"{shlex.join(cmd)} exited {done.returncode}:\n"
                         f"{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def image_id(tag: str) -> str | None:
    """The image's ID in the engine's storage, or None when it is not there."""
    done = subprocess.run([engine(), "image", "inspect", "--format", "{{.Id}}", tag],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or None if done.returncode == 0 else None


def debian_image(root: DebianRoot) -> str:
    """The image of a Debian root: found by its recipe's tag, else made and imported."""
    if image_id(root.tag):
        return root.tag
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap is not installed (`make image` installs it)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        tar = Path(tmp) / "root.tar"
        cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(root.packages)]
        cmd += [f"--dpkgopt={opt}" for opt in SLIM_DPKG]
        cmd += [f"--customize-hook={hook}" for hook in root.hooks]
        cmd += [root.suite, str(tar)]
        _run(*cmd)
        changes = [arg for change in root.changes for arg in ("--change", change)]
        _run(engine(), "import", *changes, str(tar), root.tag)
    return root.tag


def registry_base() -> str:
    """The Dockerfile's default BASE: the registry image, pinned by digest."""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith(REGISTRY_BASE_PREFIX):
            return line[len(REGISTRY_BASE_PREFIX):].strip()
    raise ImageError("the Dockerfile has no ARG BASE=...")


def base_image() -> str:
    """The base for floodwall's image. FLOODWALL_IMAGE_BASE: "registry", "local" (Debian made
    here) or an image reference; unset: the registry's when it is already stored, else the
    local Debian's when it is, else the registry's when one answers, else the local one made."""
    chosen = os.environ.get("FLOODWALL_IMAGE_BASE", "")
    if chosen == "local":
        return debian_image(BASE)
    if chosen == "registry":
        return registry_base()
    if chosen:
        return chosen
    registry = registry_base()
    if image_id(registry):
        return registry
    if image_id(BASE.tag):
        return BASE.tag
    pulled = subprocess.run([engine(), "pull", "-q", registry], capture_output=True,
                            timeout=120)
    if pulled.returncode == 0:
        return registry
    return debian_image(BASE)


def _context_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *CONTEXT],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # floodwall/dev/ is sent but not installed (setup.py leaves it out of the wheel)
    return sorted(ROOT / p for p in listed.split() if "__pycache__" not in p
                  and not p.startswith("floodwall/dev/") and (ROOT / p).is_file())


#: podman's build flags: Docker's image format, whose config keeps the HEALTHCHECK (OCI's
#: drops it).
PODMAN_BUILD_FLAGS = ("--format", "docker")


def context_digest(base_id: str) -> str:
    """Hash of the Dockerfile, the build context, the base image's ID and the build flags."""
    digest = hashlib.sha256(base_id.encode() + " ".join(PODMAN_BUILD_FLAGS).encode())
    for path in _context_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def host_pip_settings(into: Path) -> list[str]:
    """`-v HOST:CONTAINER:ro` arguments that give the build the host's pip settings (config
    files, the CA bundle and local indexes they name) and /run/host-pip.env with its PIP_*
    variables. Mounted for the build only: nothing of it is in any image layer."""
    home = Path.home()
    files = {Path("/etc/pip.conf"): Path("/etc/pip.conf"),
             Path("/etc/xdg/pip"): Path("/etc/xdg/pip"),
             home / ".config" / "pip": Path("/root/.config/pip"),
             home / ".pip": Path("/root/.pip"),
             Path("/etc/ssl/certs"): Path("/etc/ssl/certs")}
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    named = list(env.values())
    shown = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                           capture_output=True, text=True, timeout=60).stdout
    named += [line.partition("=")[2].strip("'") for line in shown.splitlines()]
    for value in named:  # absolute paths and file:// URLs the settings point at
        for word in value.split():
            path = Path(word.removeprefix("file://"))
            if path.name == "simple":  # an index's pages link to files beside it
                path = path.parent
            if path.is_absolute() and path.exists() and not str(path).startswith("/etc/ssl"):
                files.setdefault(path, path)
    env_file = into / "host-pip.env"
    env_file.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())))
    files[env_file] = Path("/run/host-pip.env")
    return [f"-v={host}:{inside}:ro" for host, inside in files.items() if host.exists()]


def floodwall_image(tag: str = "floodwall:0.1.0") -> str:
    """floodwall's image: found by the hash of its inputs, else built; also tagged `tag`.
    Returns the content tag (localhost/floodwall:build-HASH)."""
    base = base_image()
    base_id = image_id(base) or base
    built = f"localhost/floodwall:build-{context_digest(base_id)}"
    if not image_id(built):
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            cmd = [engine(), "build", "--build-arg", f"BASE={base}",
                   "--label", f"org.opencontainers.image.base.name={base}",
                   "--label", f"org.opencontainers.image.base.digest={base_id}", "-t", built]
            if engine() == "podman":  # docker build has no build-time volumes
                cmd += [*PODMAN_BUILD_FLAGS, *host_pip_settings(Path(tmp))]
            _run(*cmd, str(ROOT))
        _forget_older_builds(built)
        (CACHE / "floodwall.json").write_text(json.dumps(
            {"image": built, "id": image_id(built), "base": base, "base_id": base_id},
            indent=2) + "\n")
    _run(engine(), "tag", built, tag)
    return built


def _forget_older_builds(keep: str) -> None:
    """Untag the earlier content-tagged builds (one image per source change adds up)."""
    listed = subprocess.run([engine(), "images", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, timeout=60).stdout.split()
    repository = keep.rpartition(":")[0]
    old = [t for t in listed if t.startswith(repository + ":build-") and t != keep]
    if old:
        subprocess.run([engine(), "rmi", *old], capture_output=True, timeout=300)


def image_config(tag: str) -> dict[str, Any]:
    """The image's config (Entrypoint, Cmd, Healthcheck, ...), as the engine's CLI shows it."""
    config: dict[str, Any] = json.loads(_run(engine(), "image", "inspect", "--format",
                                             "{{json .Config}}", tag))
    # podman keeps the HEALTHCHECK beside the OCI config (its JSON leaves it out)
    config["Healthcheck"] = json.loads(_run(engine(), "image", "inspect", "--format",
                                            "{{json .Config.Healthcheck}}", tag))
    return config


def image_size(tag: str) -> int:
    return int(_run(engine(), "image", "inspect", "--format", "{{.Size}}", tag).strip())


def main(argv: list[str]) -> int:
    if argv[:1] == ["containers-conf"]:
        path = Path(argv[1] if len(argv) > 1 else "/etc/containers/containers.conf")
        print(f"{path}: {'settings added' if ensure_containers_conf(path) else 'as needed'}")
        return 0
    started = time.monotonic()
    try:
        if argv[:1] == ["rabbitmq"]:
            tag = debian_image(RABBITMQ[argv[1] if len(argv) > 1 else "4.0"])
        else:
            tag = floodwall_image()
    except (ImageError, subprocess.TimeoutExpired) as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    print(f"{tag} {image_size(tag) / 1e6:.0f} MB ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
