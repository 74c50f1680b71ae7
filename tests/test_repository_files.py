"""The files around the code: the licence, the changelog, and docs that cite only files the
repository has."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: A repository path as the docs cite one: under a top folder, or a root-level NAME.md.
CITED = re.compile(r"(?<![\w/.-])((?:docs|policies|helm|tests|proxy|pipeline|bench|floodwall)"
                   r"/[A-Za-z0-9_./-]*[A-Za-z0-9_]|[A-Z][A-Za-z_]*\.md)")
#: Docs checked for stale citations (bench/RESULTS.md cites result files that `make bench`
#: writes, and the files of past runs).
DOCS = ["README.md", "CHANGELOG.md", "Dockerfile", "Makefile", "helm/floodwall/README.md",
        "docs/architecture.md", "docs/operations.md", "docs/telemetry.md", "docs/pipeline.md",
        "docs/configuration.md", "docs/kubernetes.md", "docs/performance.md",
        "docs/development.md", "docs/compatibility.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "design").glob("*.md"))]


def test_license_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    for section in ("1. Definitions.", "4. Redistribution.", "9. Accepting Warranty",
                    "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply"):
        assert section in text, section
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()


def test_changelog_has_the_current_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog")
    headings = re.findall(r"^## (\S+)", changelog, re.M)
    assert headings[0] == "Unreleased" and version in headings


@pytest.mark.parametrize("doc", DOCS)
def test_docs_cite_only_files_that_exist(doc: str) -> None:
    path = ROOT / doc
    missing = [cited for cited in sorted(set(CITED.findall(path.read_text())))
               if not (ROOT / cited).exists() and not (path.parent / cited).exists()]
    assert not missing, f"{doc} cites files the repository does not have: {missing}"


def test_the_citation_check_can_fail(tmp_path: Path) -> None:
    assert CITED.findall("see DESIGN.md and docs/nothing.md, not e.g. proxy") == [
        "DESIGN.md", "docs/nothing.md"]


#: Markdown pages whose relative links must resolve.
PAGES = ["README.md", "bench/README.md", "bench/RESULTS.md", "helm/floodwall/README.md",
         *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    """The targets of a page's Markdown links that are paths, code blocks left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [t.split("#")[0] for t in LINK.findall(prose)
            if not re.match(r"[a-z]+:", t) and t.split("#")[0]]


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page: str) -> None:
    path = ROOT / page
    broken = [t for t in relative_links(path.read_text()) if not (path.parent / t).exists()]
    assert not broken, f"{page} links to paths that do not exist: {broken}"


def test_the_link_check_can_fail() -> None:
    text = "[a](docs/a.md) [b](https://x.org/b) [c](#here) [d](../d.md#s)\n```\n[e](e.md)\n```"
    assert relative_links(text) == ["docs/a.md", "../d.md"]


def test_the_readme_is_a_product_page() -> None:
    """At most 200 lines, what floodwall is in the first ten, no issue numbers, and the two
    commands it documents are the Makefile's."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    assert "sidecar proxy" in " ".join(lines[:10])
    assert not [line for line in lines if re.search(r"\bissue \d+", line, re.I)]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target} " in "\n".join(lines)
        assert re.search(rf"^{target}:", makefile, re.M), target
