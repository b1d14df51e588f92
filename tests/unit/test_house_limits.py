"""The package's size limits (issue #42): no module over 550 lines, no function over 100 lines and at most 4 over
80. ruff holds the rest (complexity, arguments, statements: pyproject.toml, with its written-down exceptions); line
counts are not a ruff rule, so they are held here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MODULE_LINES = 550
FUNCTION_LINES = 100
LONG_FUNCTION_LINES, LONG_FUNCTIONS_ALLOWED = 80, 4


def sizes(src: Path) -> tuple[dict[str, int], dict[str, int]]:
    """({module path: lines}, {path:function: lines}) of every .py file under ``src``."""
    modules, functions = {}, {}
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(src))
        modules[name] = text.count("\n")
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, functions


def test_no_module_over_the_limit():
    modules, _ = sizes(SRC)
    assert {m: n for m, n in modules.items() if n > MODULE_LINES} == {}


def test_no_function_over_the_limit_and_few_near_it():
    _, functions = sizes(SRC)
    assert {f: n for f, n in functions.items() if n > FUNCTION_LINES} == {}
    long = {f: n for f, n in functions.items() if n > LONG_FUNCTION_LINES}
    assert len(long) <= LONG_FUNCTIONS_ALLOWED, long
