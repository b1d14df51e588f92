"""The command-line options every command that takes them shares, defined once, as one argparse parent:

    --results DIR     the results root (default: results, env MTPMATRIX_RESULTS_ROOT; paths.results_root)
    --run-id RUN_ID   results/<RUN_ID>/, where the command names a run by option (its default said by the command)
    --with PKG==VER   a package overridden in every selected row (uv --override); repeatable

``python -m mtpmatrix`` builds its subcommands with ``parents=[parent(...)]``, and so does the matrix row session
(``nox -s gemma4_mtp --``, runner.matrix.parse_options).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtpmatrix.core.paths import RESULTS_ROOT_ENV, results_root


def parent(*, run_id: str | None = None, overrides: bool = False) -> argparse.ArgumentParser:
    """The parent parser: ``--results`` always; ``--run-id`` when ``run_id`` says what its default is; ``--with``
    (dest ``overrides``) when ``overrides``. Built at each call: the results root's default reads the environment
    then."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--results", type=Path, default=results_root(), help=f"results root (default: results, env {RESULTS_ROOT_ENV})"
    )
    if run_id is not None:
        p.add_argument("--run-id", help=f"results/<RUN_ID>/ to write (default: {run_id})")
    if overrides:
        p.add_argument(
            "--with",
            dest="overrides",
            action="append",
            default=[],
            metavar="PKG==VER",
            help="override a package in every selected row (uv --override); repeatable",
        )
    return p
