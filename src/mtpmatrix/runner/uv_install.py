"""The row's install with uv: its constraints, the one install command, the companions an override strands, and
the logged subprocess every step of a row runs through."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mtpmatrix.core.paths import REPO
from mtpmatrix.core.rows import Row, RowError, constrained_name, parse_override
from mtpmatrix.runner import candidate, console, venvs


def overridden_names(overrides: list[str]) -> set[str]:
    return {canonicalize_name(parse_override(spec).name) for spec in overrides}


def constraints_text(row: Row, overrides: list[str], cand: candidate.Candidate | None = None) -> str:
    """The row's constraints file minus the pins of overridden packages (and of the sglang a candidate replaces).

    uv applies constraints on top of overrides, so ``-c row.txt`` pinning ``transformers==5.8.1`` together with
    ``--override transformers==5.9.0`` is unsatisfiable: an overridden package's pin must leave the constraints.
    """
    dropped = overridden_names(overrides)
    out = []
    for line in row.path.read_text().splitlines():
        if constrained_name(line) in candidate.dropped_pins(cand):
            out.append(f"# {line}  (dropped: the candidate replaces it)")
        elif constrained_name(line) in dropped:
            out.append(f"# {line}  (dropped: overridden)")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def find_uv(error: type[Exception] = RowError) -> str:
    """uv's path; ``error`` (the caller's one-line error kind) when uv is not on PATH."""
    return venvs.find_uv(error)


def install_command(
    row: Row,
    venv: Path,
    constraints: Path,
    overrides_file: Path | None,
    overrides: Sequence[str] = (),
    cand: candidate.Candidate | None = None,
) -> list[str]:
    """The one install command of a row: sglang (or the candidate's wheel or checkout) + its pins + this package,
    into ``venv``, with uv."""
    uv = find_uv()
    cmd = [uv, "pip", "install", "--python", str(venv_python(venv)), "-c", str(constraints)]
    if overrides_file is not None:
        cmd += ["--override", str(overrides_file)]
    if row.torch_backend != "pypi":
        cmd += ["--torch-backend", row.torch_backend]
    replaced = overridden_names(list(overrides))
    source = candidate.install_source(cand)
    cmd += [
        source if name == "sglang" and source else name if name in replaced else f"{name}=={version}"
        for name, version in row.pins.items()
    ]
    cmd += [*candidate.install_flags(cand), "-e", str(REPO)]
    return cmd


_PIP_CHECK_UNMET = re.compile(r"The package `([^`]+)` requires `([^`]+)`, but `([^`]+)` is installed")


def stranded_by_overrides(check_output: str, overrides: list[str], pinned: Iterable[str]) -> list[str]:
    """Installed packages whose own requirement on an overridden package is unmet, per ``uv pip check``
    (torchvision 0.29.2 needing ``torch>=2.14.0`` under ``--with torch==2.11.0``): canonical names, sorted.

    An override replaces every requirement on its package, so the resolver is free to pick any release of the
    packages released in lock-step with it (the newest torchvision), or keeps the one a row pin names for the old
    release. The row's own pins and the overridden packages are never stranded: sglang's ``torch==2.11.0`` is what
    a torch override is there to break.
    """
    targets = overridden_names(overrides)
    keep = {canonicalize_name(p) for p in pinned} | targets
    out = set()
    for package, requirement, _ in _PIP_CHECK_UNMET.findall(check_output):
        try:
            name = canonicalize_name(Requirement(requirement).name)
        except InvalidRequirement:
            continue
        if name in targets and canonicalize_name(package) not in keep:
            out.add(canonicalize_name(package))
    return sorted(out)


def resolve_companions(
    row: Row, venv: Path, overrides: list[str], names: list[str], env: dict | None = None, log: Path | None = None
) -> list[str]:
    """``name==version`` of each of ``names`` as uv resolves them next to the overrides taken as plain requirements,
    so that each one's own requirement on the overridden packages holds (torch==2.13.0 -> torchvision==0.28.0).
    Raises RowError with uv's first error line when no release fits."""
    uv = find_uv()
    cmd = [uv, "pip", "compile", "-", "--python", str(venv_python(venv)), "--no-header", "--no-annotate"]
    if row.torch_backend != "pypi":  # companions of a CUDA-variant torch come from the same index
        cmd += ["--torch-backend", row.torch_backend]
    done = subprocess.run(
        cmd, input="\n".join([*overrides, *names]) + "\n", capture_output=True, text=True, env=env, cwd=REPO
    )
    if log is not None:
        log.write_text("$ " + " ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        why = next((ln.strip() for ln in done.stderr.splitlines() if ln.strip()), "uv pip compile failed")
        raise RowError(f"no release of {', '.join(names)} fits {', '.join(overrides)}: {why}")
    wanted = set(names)
    pins = []
    for line in done.stdout.splitlines():
        body = line.split("#", 1)[0].strip()
        if "==" in body and canonicalize_name(body.split("==", 1)[0]) in wanted:
            pins.append(body)
    return sorted(pins)


def venv_python(venv: Path) -> Path:
    return Path(venv) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run_logged(
    cmd: list[str], log: Path, env: dict | None = None, echo: bool | console.RowConsole = False
) -> tuple[int, str]:
    """Run ``cmd``, stream its output to ``log`` (and every line to stdout when ``echo`` is True, or what a
    RowConsole keeps); returns (rc, output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    chunks: list[str] = []
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            chunks.append(line)
            if isinstance(echo, console.RowConsole):
                echo.feed(line)
            elif echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    return rc, "".join(chunks)
