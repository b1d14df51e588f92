"""Where Python looks for a source file's bytecode under PYTHONPYCACHEPREFIX: the tests' own reading of importlib's
rule (test_bytecode, test_bytecode_from_cache), kept apart from mtpmatrix.runner.bytecode's so it can check it."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def pyc(prefix: Path, source: Path) -> Path:
    """Where Python looks for ``source``'s bytecode under PYTHONPYCACHEPREFIX=prefix."""
    tail = Path(importlib.util.cache_from_source(str(source))).name
    return prefix / str(source.parent).lstrip("/") / tail
