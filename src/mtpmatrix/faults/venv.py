"""The row venv ``nox -s mutants`` runs fault injection in (``.nox/mutants-<row>``), built with the matrix's one
install command (mtpmatrix.runner.matrix.install_command), so the mutants run against exactly the sglang a row
qualifies. The noxfile only runs what ``prepare`` returns.

    nox -s mutants -- --row ROW [python -m mtpmatrix mutants options]    (--row: default the row tagged 'ci')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core.paths import CI_TAG
from mtpmatrix.faults.mutation import MutantsError


@dataclass
class MutantsVenv:
    """What the session runs: ``commands`` (uv venv when missing, the install), then ``mutants`` (python -m
    mtpmatrix mutants in the venv), each with ``env`` alone."""

    row_id: str
    venv: Path
    commands: list[list[str]]
    mutants: list[str]
    env: dict[str, str]


def split_row_arg(posargs: list[str]) -> tuple[str | None, list[str]]:
    """``--row ROW`` (or ``--row=ROW``) out of nox posargs; the rest goes to ``python -m mtpmatrix mutants``."""
    rest, row = [], None
    it = iter(posargs)
    for a in it:
        if a == "--row":
            row = next(it, None)
            if row is None:
                raise MutantsError("--row needs a row id")
        elif a.startswith("--row="):
            row = a.split("=", 1)[1]
        else:
            rest.append(a)
    return row, rest


def row_venv_commands(row, venv: Path, constraints: Path) -> list[list[str]]:
    """uv venv (when missing) + the matrix's one install command for ``row`` into ``venv``."""
    from mtpmatrix.runner import matrix

    uv = matrix.find_uv(MutantsError)
    cmds = []
    if not matrix.venv_python(venv).exists():
        cmds.append([uv, "venv", "--python", row.python, str(venv)])
    cmds.append(matrix.install_command(row, venv, constraints, None))
    return cmds


def prepare(rows: dict, posargs: list[str], nox_dir: Path, environ: dict | None = None) -> MutantsVenv:
    """The session's plan for ``posargs``: the row (``--row``, else the one tagged 'ci'), its venv under
    ``nox_dir`` and constraints file beside it (written here), the commands and their environment (this process's,
    without PYTHONPATH: the venv sees only what the row installed). MutantsError (one line) for an unknown row or
    no uv."""
    from mtpmatrix.runner import matrix

    row_id, rest = split_row_arg(posargs)
    row_id = row_id or next((r.id for r in rows.values() if CI_TAG in r.tags), None)
    if row_id not in rows:
        raise MutantsError(f"unknown row {row_id!r}; known: {', '.join(rows)}")
    venv = Path(nox_dir) / f"mutants-{row_id}"
    constraints = venv.parent / f"mutants-{row_id}.constraints.txt"
    constraints.parent.mkdir(parents=True, exist_ok=True)
    constraints.write_text(matrix.constraints_text(rows[row_id], []))
    commands = row_venv_commands(rows[row_id], venv, constraints)
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = matrix.venv_python(venv)
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{python.parent}{os.pathsep}{environ.get('PATH', '')}")
    return MutantsVenv(
        row_id=row_id, venv=venv, commands=commands, mutants=[str(python), "-m", "mtpmatrix", "mutants", *rest], env=env
    )
