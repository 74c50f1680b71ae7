"""Packaging beyond pyproject.toml: which folders install under which import names.

The repository's folders ``floodwall/`` and ``pipeline/`` install as ``floodwall`` and
``floodwall_pipeline`` (the name ``pipeline`` belongs to another distribution on the package
index: docs/architecture.md, "Layers"). The dev tooling (``floodwall/dev/``) stays out of the
wheel. A folder that is not there (the Docker build
context has no ``pipeline/``) is simply not packaged.
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
FOLDERS = {"floodwall": "floodwall", "floodwall_pipeline": "pipeline"}
NOT_SHIPPED = ("floodwall.dev",)


def packages() -> list[str]:
    found: list[str] = []
    for name, folder in FOLDERS.items():
        if not (HERE / folder / "__init__.py").exists():
            continue
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(str(HERE / folder))]
    return [p for p in found
            if not any(p == n or p.startswith(n + ".") for n in NOT_SHIPPED)]


setup(
    package_dir={name: folder for name, folder in FOLDERS.items()
                 if (HERE / folder).is_dir()},
    packages=packages(),
    package_data={"floodwall_pipeline": ["log4j2.properties"]},
)
