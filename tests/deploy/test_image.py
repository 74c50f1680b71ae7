"""floodwall/dev/image.py without building anything: podman's containers.conf settings, the
host's pip settings mounted into a build, and the content hash that finds a built image."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from floodwall.dev import image

pytestmark = pytest.mark.load_tolerant


def test_containers_conf_made_when_absent(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    assert image.ensure_containers_conf(conf)
    text = conf.read_text()
    assert '[engine]\nruntime = "runc"' in text
    assert '[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]' in text
    assert not image.ensure_containers_conf(conf)  # a second run changes nothing
    assert conf.read_text() == text


def test_containers_conf_keeps_what_is_there(tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\nlog_size_max = 100\n\n[engine]\nruntime_path = ["x"]\n'
                    'runtime = "crun"\n')
    assert image.ensure_containers_conf(conf)
    lines = conf.read_text().splitlines()
    assert lines[:2] == ["[containers]", image.CONTAINERS_CONF_SETTINGS["containers"]]
    assert 'runtime = "crun"' in lines and 'runtime = "runc"' not in lines  # the owner's
    assert "log_size_max = 100" in lines


def test_host_pip_settings_are_read_only_mounts_with_the_pip_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    index = tmp_path / "pypi" / "simple"
    index.mkdir(parents=True)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{index}")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "it's 180")
    mounts = image.host_pip_settings(tmp_path)
    assert all(m.startswith("-v=") and m.endswith(":ro") for m in mounts)
    pairs = dict(m[3:-3].split(":", 1) for m in mounts)
    assert pairs[str(wheels)] == str(wheels)
    assert pairs[str(index.parent)] == str(index.parent)  # the index's files beside it
    assert pairs[str(tmp_path / "host-pip.env")] == "/run/host-pip.env"
    env = dict(line.split("=", 1) for line in (tmp_path / "host-pip.env").read_text()
               .splitlines())
    assert shlex.split(env["PIP_DEFAULT_TIMEOUT"]) == ["it's 180"]


def test_the_content_hash_follows_the_context_and_the_base() -> None:
    one = image.context_digest("sha256:aaa")
    assert image.context_digest("sha256:aaa") == one
    assert image.context_digest("sha256:bbb") != one
    files = {str(p.relative_to(image.ROOT)) for p in image._context_files()}
    assert {"Dockerfile", "pyproject.toml", "floodwall/cli/__init__.py"} <= files
    assert not any(f.startswith(("tests/", "helm/", "bench/", "floodwall/dev/")) for f in files)


def test_recipes_differ_per_broker_and_pin_the_suites() -> None:
    assert image.RABBITMQ["3.10"].suite == "bookworm"
    assert image.RABBITMQ["4.0"].suite == "trixie"
    assert image.RABBITMQ["3.10"].tag != image.RABBITMQ["4.0"].tag
    assert image.BASE.packages == ("python3", "python3-venv")
    assert image.registry_base().startswith("docker.io/library/python:3.11-slim-bookworm@")
