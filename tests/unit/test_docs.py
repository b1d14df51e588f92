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


# Paths and module names the pages give, in backticks: each must name what the checkout holds. A path is taken from
# the repository root (src/..., tests/..., docs/...), from src/mtpmatrix (core/..., pairs/...) or from
# src/mtpmatrix/core (evidence/...); `mtpmatrix.a.b` and `module.NAME` (module a file or package of the package) must
# import or be defined there (read with ast, nothing imported). A pattern (<...>, {...}, *, ...) is not checked.
SRC = REPO / "src" / "mtpmatrix"
ROOTS = ("src/", "tests/", "tools/", "benchmarks/", "docs/", "constraints/", ".ci/", ".github/")
PACKAGE_DIRS = ("core/", "serving/", "pairs/", "tiers/", "runner/", "faults/", "report/")
CODE = re.compile(r"`([^`]+)`")
# record fields spelled like module attributes (row.json's build, install, canary, candidate)
RECORD_FIELDS = {"build", "install", "canary", "candidate"}


def _path_exists(text: str) -> bool | None:
    """Whether a path the page names exists; None when ``text`` is no path of the project."""
    path = text.split(":")[0].split("#")[0].rstrip("/.,;")
    if any(c in path for c in "<>{}*") or "..." in path:
        return None
    if path.startswith(ROOTS):
        return (REPO / path).exists()
    if path.startswith(PACKAGE_DIRS):
        return (SRC / path).exists()
    if path.startswith("evidence/"):
        return (SRC / "core" / path).exists()
    return None


def _defined_names(path: Path) -> set[str]:
    """Names a module defines: top-level functions, classes and assignments, and what it imports."""
    import ast

    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _modules_named(name: str) -> list[Path]:
    """Modules (file or package) of mtpmatrix whose last name is ``name``."""
    out = [p for p in SRC.rglob(f"{name}.py") if "__pycache__" not in p.parts]
    return out + [p / "__init__.py" for p in SRC.rglob(name) if (p / "__init__.py").exists()]


def _resolves(module: Path, rest: list[str]) -> bool:
    """Whether ``rest`` (submodules, then one name) is reached from ``module``."""
    for i, part in enumerate(rest):
        folder = module.parent
        if module.name == "__init__.py" and (folder / f"{part}.py").exists():
            module = folder / f"{part}.py"
        elif module.name == "__init__.py" and (folder / part / "__init__.py").exists():
            module = folder / part / "__init__.py"
        else:
            return part in _defined_names(module) and i == len(rest) - 1
    return True


def _dotted_exists(text: str) -> bool | None:
    """Whether `mtpmatrix.a.b` or `module.NAME` resolves; None when ``text`` names no module of the package."""
    dotted = text.removesuffix("()")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", dotted) or dotted.endswith((".py", ".json", ".md")):
        return None
    head, *rest = dotted.split(".")
    if head == "mtpmatrix":
        return _resolves(SRC / "__init__.py", rest)
    if head in RECORD_FIELDS:
        return None
    modules = _modules_named(head)
    if not modules:
        return None
    return any(_resolves(m, rest) for m in modules)


@pytest.mark.parametrize("page", [*PAGES, REPO / "docs" / "runs" / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_named_paths_and_modules_exist(page):
    stale = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for text in CODE.findall(line):
            for word in re.split(r"[\s(]", text):  # a call's name too: `tiny.build.build_pair(name, ...)`
                if _path_exists(word) is False or _dotted_exists(word) is False:
                    stale.append(f"{page.name}:{n}: {word}")
    assert not stale, "names no file or module of this checkout:\n" + "\n".join(stale)


def test_layout_names_every_module():
    """docs/layout.md is the code map: every module of the package, tools/ and benchmarks/ is in it by its file name
    (a request family of tiers/surface/ by its name, as the family is called)."""
    text = (REPO / "docs" / "layout.md").read_text()
    words = set(re.findall(r"[\w.]+", text))
    missing = []
    for folder in (SRC, REPO / "tools", REPO / "benchmarks"):
        for f in sorted(folder.rglob("*")):
            if not f.is_file() or f.suffix not in (".py", ".sh", ".json") or f.name == "__init__.py":
                continue
            if {"__pycache__", "mutant_hook", "gsm8k_data"} & set(f.parts):
                continue
            named = f.stem if f.parent.name == "surface" else f.name
            if named not in words and f"{f.stem}.py/.json" not in text:
                missing.append(str(f.relative_to(REPO)))
    assert not missing, f"docs/layout.md does not name {missing}"


def test_the_evidence_page_lists_every_known_upstream_entry():
    # docs/evidence.md's table of entries is the reader's list: an entry missing there is a bug nobody reads of
    from mtpmatrix.core import known_upstream

    text = (REPO / "docs" / "evidence.md").read_text()
    table = text.split("| id | package | what |\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.M)
    assert sorted(listed) == sorted(k.id for k in known_upstream.load())
