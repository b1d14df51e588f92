"""pytest plugin (``-p mtpmatrix.tiers.session.imported``): at the end of the session, the source files this process
imported, in import order, one absolute path a line, written to ``$MTPMATRIX_IMPORTED_DIR/imported-<name>.txt``
(``<name>``: ``$MTPMATRIX_SUITE_PROCESS``, which of the row's pytest processes this is). The runner compiles the ones
in the row's site-packages ahead of the same process of the row's next suite (mtpmatrix.runner.bytecode); without
the variable the plugin writes nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "MTPMATRIX_IMPORTED_DIR"
PROCESS_ENV = "MTPMATRIX_SUITE_PROCESS"


def imported_files(modules=None) -> list[str]:
    """Source files (``.py``) of ``modules`` (default: sys.modules), in import order."""
    out = []
    for module in list((sys.modules if modules is None else modules).values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            out.append(path)
    return list(dict.fromkeys(out))


def pytest_unconfigure(config):
    folder = os.environ.get(ENV)
    if not folder:
        return
    target = Path(folder) / f"imported-{os.environ.get(PROCESS_ENV) or os.getpid()}.txt"
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text("".join(f"{p}\n" for p in imported_files()))
        os.replace(tmp, target)
    except OSError:  # a hint for the row's next suite, never a reason for this one to fail
        pass
