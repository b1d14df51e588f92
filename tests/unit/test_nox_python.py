"""nox's own Python holds nox, uv and what nox depends on, nothing else: the README installs `pip install nox uv` and
no more, and .ci/run installs exactly that. Whatever of this package runs there (the noxfile and everything it
imports, and the ``python -m mtpmatrix`` its python=False sessions start with ``sys.executable``) imports the
standard library, nox and nox's own dependencies only.

The static check reads the imports (ast, as test_layers.py does): those a module runs when it loads, and those inside
its functions too, so an import only a rare session reaches (``--server-url``'s pre-flight) counts; only the
functions of the row's side (tiers/, pairs/: they run in a row's venv next to sglang, README's Layout) are not
followed. The venv check runs the noxfile, that pre-flight and ``python -m mtpmatrix`` in a venv holding what the
README installs, nothing more.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_sglang import FakeSglang, server_info

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
NOXFILE = REPO / "noxfile.py"
# nox's own Requires-Dist that this package imports (nox has required packaging since 2020; the venv check below
# reads nox's metadata and holds this to it)
NOX_REQUIRES = {"packaging"}
# third-party imports that nox's Python reaches only behind a guard, each with the guard
GUARDED = {
    ("mtpmatrix.serving.environment", "torch"): "gpu_count imports it only where importlib finds it (has_module)",
    ("mtpmatrix.report.render", "jinja2"): "one line without it (NO_JINJA2); nox -s report installs it",
    ("mtpmatrix.report.figures", "matplotlib"): "the page says why there are no figures; nox -s report installs it",
}
# the row's side: what runs in a row's venv next to sglang; their modules may load in nox's Python (the report reads
# the smoke tier's names), their functions run in the row
ROW_SIDE = ("mtpmatrix.tiers", "mtpmatrix.pairs")


def _module_file(name: str) -> Path | None:
    p = SRC.joinpath(*name.split("."))
    for f in (p / "__init__.py", p.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imports(path: Path, name: str) -> list[tuple[str, list[str], bool]]:
    """(module, names, inside a function) of every import in ``path``, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name, [], in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.append((base, [a.name for a in node.names], in_function))
        function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or function)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def _entry_modules() -> list[str]:
    """The modules the noxfile runs with nox's own Python: ``session.run(sys.executable, "-m", MODULE, ...)``."""
    found = []
    for node in ast.walk(ast.parse(NOXFILE.read_text())):
        if isinstance(node, ast.Call) and len(node.args) >= 3:
            first, flag, module = node.args[:3]
            if (
                ast.unparse(first) == "sys.executable"
                and isinstance(flag, ast.Constant)
                and flag.value == "-m"
                and isinstance(module, ast.Constant)
            ):
                found.append(module.value)
    return found


def nox_python_imports() -> dict[tuple[str, str], tuple[str, bool]]:
    """{(importing module, top-level name): (the chain of imports from the noxfile, only inside functions)} of every
    import outside this package in what nox's Python runs."""
    todo = [("noxfile", NOXFILE, "noxfile")]
    for module in _entry_modules():
        main = f"{module}.__main__"
        todo.append((main, _module_file(main), f"noxfile: sys.executable -m {module}"))
    seen, outside = set(), {}
    while todo:
        name, path, chain = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        row_side = any(name == p or name.startswith(f"{p}.") for p in ROW_SIDE)
        for module, names, in_function in _imports(path, name):
            if in_function and row_side:
                continue
            if module.split(".")[0] != "mtpmatrix":
                key = (name, module.split(".")[0])
                outside[key] = (chain, outside.get(key, (chain, True))[1] and in_function)
                continue
            parts = module.split(".")
            candidates = [".".join(parts[:i]) for i in range(1, len(parts) + 1)] + [f"{module}.{n}" for n in names]
            todo += [(c, f, f"{chain} -> {c}") for c in candidates if (f := _module_file(c))]
    return outside


def test_the_noxfile_runs_python_m_mtpmatrix_in_nox_python():
    # what the closure below starts from besides the noxfile: the bisect session (a change there must stay seen)
    assert _entry_modules() == ["mtpmatrix"]


def test_nox_python_imports_only_the_standard_library_nox_and_its_dependencies():
    allowed = set(sys.stdlib_module_names) | {"nox", "__future__"} | NOX_REQUIRES
    bad = sorted(
        f"{chain} imports {top}"
        for (who, top), (chain, in_function) in nox_python_imports().items()
        if top not in allowed and not ((who, top) in GUARDED and in_function)  # a guard is a function's
    )
    assert not bad, f"nox's own Python (pip install nox uv, nothing else) cannot import these: {bad}"
    # each guarded import is still there (a stale entry would let a new unguarded one of the same name through)
    assert set(GUARDED) <= set(nox_python_imports())


README_INSTALL = re.compile(r"^pip install ([a-z0-9 ]+?) && nox -s gemma4_mtp", re.M)


def readme_installs() -> list[str]:
    """The packages of the README's first command."""
    m = README_INSTALL.search((REPO / "README.md").read_text())
    assert m, "the README's first command (pip install ... && nox -s gemma4_mtp) is not there"
    return m.group(1).split()


def test_ci_installs_what_the_readme_installs_and_nothing_more():
    run = (REPO / ".ci" / "run").read_text()
    lines = [ln for ln in run.splitlines() if re.search(r"\bpip install\b", ln) and not ln.lstrip().startswith("#")]
    assert len(lines) == 1, lines
    specs = [a.strip("\"'") for a in lines[0].split("install", 1)[1].split() if not a.startswith("-")]
    names = [re.split(r"[<>=!~ \[]", s, maxsplit=1)[0].lower() for s in specs]
    assert names == readme_installs(), f".ci/run installs {names}; the README {readme_installs()}"


@pytest.fixture(scope="module")
def readme_venv(tmp_path_factory) -> Path:
    """A venv holding what the README installs (nox, uv), from uv's cache or the index: nox's Python there."""
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (pip install nox uv)"
    venv = tmp_path_factory.mktemp("readme") / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    for cmd in (
        [uv, "venv", "-q", "--python", sys.executable, str(venv)],
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *readme_installs()],
    ):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return venv


def in_readme_venv(venv: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NOX", "VIRTUAL_ENV", "PYTHON", "MTPMATRIX_"))}
    clean["PATH"] = f"{venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
    return subprocess.run(
        [str(venv / "bin" / "python"), *args],
        cwd=REPO,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.nox
def test_noxfile_and_server_preflight_run_where_only_nox_and_uv_are(readme_venv):
    # nox's dependencies are what the static check allows besides the standard library
    requires = in_readme_venv(
        readme_venv, "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('nox')))"
    ).stdout
    assert NOX_REQUIRES <= {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in requires.splitlines()}
    assert in_readme_venv(readme_venv, "-c", "import requests").returncode != 0  # the venv is what it says
    listed = in_readme_venv(readme_venv, "-m", "nox", "-l")
    assert listed.returncode == 0 and "gemma4_mtp(" in listed.stdout, listed.stderr[-3000:]
    # --server-url's pre-flight, the matrix's own call, from that Python, against a server that answers
    preflight = (
        "import sys; from mtpmatrix.runner import matrix; "
        "print([(s.url, s.case_id, s.version) for s in matrix.preflight_servers(sys.argv[1:])])"
    )
    with FakeSglang(server_info=server_info(topk=1)) as fake:
        proc = in_readme_venv(readme_venv, "-c", preflight, fake.base_url, env={"PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str([(fake.base_url, "E4B-topk1", "0.5.17")])
    # the bisect session's entry, python -m mtpmatrix, loads there
    proc = in_readme_venv(readme_venv, "-m", "mtpmatrix", "bisect", "--help", env={"PYTHONPATH": str(SRC)})
    assert proc.returncode == 0, proc.stderr[-3000:]
