"""The README and docs/ pages: links that resolve, the test command CI runs, every environment variable listed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces as dashes)."""
    out = set()
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and (m := re.match(r"#{1,6} (.+)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve(page):
    text = page.read_text()
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
            bad.append(target)
    assert not bad, f"{page.name}: links that do not resolve: {bad}"


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    # .ci/run runs the README's test command
    assert "nox -t ci" in readme and "nox -t ci" in (REPO / ".ci" / "run").read_text()


def test_every_environment_variable_is_documented():
    """Each MTPMATRIX_* name the code reads is in docs/variables.md (a pair's knobs as MTPMATRIX_<PAIR>_...)."""
    code = set()
    for folder in ("src", "tools", "benchmarks", ".github"):
        for f in (REPO / folder).rglob("*"):
            if f.is_file() and f.suffix in (".py", ".sh", ".yml", ".yaml") and "egg-info" not in str(f):
                code |= set(re.findall(r"MTPMATRIX_[A-Z0-9_]*[A-Z0-9]", f.read_text(errors="replace")))
    documented = (REPO / "docs" / "variables.md").read_text()
    from mtpmatrix.core import settings

    pair_knobs = {
        settings.pair_env_key(p, w) for p in settings.PAIRS for w in ("TARGET", "ASSISTANT", "TP", "THRESHOLD")
    }
    missing = sorted(v for v in code - pair_knobs if f"`{v}" not in documented and not v.endswith("_"))
    assert not missing, f"docs/variables.md does not list {missing}"
