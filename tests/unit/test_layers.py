"""The package's layers, in order: a module imports only from its own layer or those below it, never above, and
the bottom (mtpmatrix.core) imports nothing of the package but itself; no two modules import each other. Every
import counts, also one inside a function (parsed with ast, nothing imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
# Lowest first. Packages of one layer may not import each other (runner aside: faults and report build on it).
LAYERS = (
    ("mtpmatrix", "mtpmatrix.core"),  # the shared contract: results, store, rows, paths, kinds, expected, evidence
    ("mtpmatrix.serving",),  # sglang servers: launch, talk to, stop; the machine's GPUs and releases
    ("mtpmatrix.pairs",),  # the tiny pairs the tiers serve and generate with
    ("mtpmatrix.tiers",),  # what runs in a row's venv next to sglang
    ("mtpmatrix.runner",),  # rows, installs, bisect, canaries
    ("mtpmatrix.faults", "mtpmatrix.report"),  # fault injection and the report, on the runner
    ("mtpmatrix.__main__",),  # the command line
)
TOP = len(LAYERS)  # noxfile.py, tools/, benchmarks/: may import anything


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every mtpmatrix module ``path`` imports (``from pkg import mod`` as ``pkg.mod``), at any depth."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.update(f"{base}.{a.name}" for a in node.names)
            out.add(base)
    return {m for m in out if m == "mtpmatrix" or m.startswith("mtpmatrix.")}


def layer(module: str) -> tuple[int, str]:
    """(layer index, group) of a module: the longest prefix named in LAYERS."""
    best = None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (i, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


MODULES = sorted(
    p for p in (SRC / "mtpmatrix").rglob("*.py") if "__pycache__" not in p.parts and "mutant_hook" not in p.parts
)  # the hook runs on its own PYTHONPATH, importing no package


def test_every_module_has_a_layer():
    for path in MODULES:
        layer(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_runs_up(path):
    here, group = layer(module_name(path))
    wrong = []
    for target in sorted(imports(path)):
        if target == "mtpmatrix":
            continue  # the package itself (its __init__ holds only the version)
        there, other = layer(target)
        if there > here or (there == here and other != group and here != 0):
            wrong.append(f"{target} (layer {there}: {other})")
    assert not wrong, f"{module_name(path)} (layer {here}: {group}) imports above or beside itself: {wrong}"


def test_the_bottom_imports_only_itself():
    for path in MODULES:
        if layer(module_name(path))[0] == 0:
            up = [t for t in imports(path) if t != "mtpmatrix" and not t.startswith("mtpmatrix.core")]
            assert not up, f"{module_name(path)} is in the bottom layer and imports {up}"


def test_the_layers_name_every_package():
    packages = {module_name(p.parent / "__init__.py") for p in (SRC / "mtpmatrix").glob("*/__init__.py")}
    named = {prefix for names in LAYERS for prefix in names}
    assert packages <= named, f"packages in no layer: {sorted(packages - named)}"


def import_graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports}, each import named by the longest module it reaches (``from pkg
    import name`` is pkg unless ``name`` is a module of it)."""
    modules = {module_name(p): p for p in SRC.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {o for o in (owner(i) for i in imports(p)) if o is not None and o != m} for m, p in modules.items()}


def test_no_modules_import_each_other():
    # a circle (a imports b, b imports a, at any depth or inside a function) ties two modules into one: neither can
    # be read, tested or moved alone (serving.client and serving.abort were one, until the abort item answered itself)
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph.get(m, ()):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert circles == []
