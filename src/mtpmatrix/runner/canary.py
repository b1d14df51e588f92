"""Canary rows: rows that float to the newest releases on the index instead of pinning them.

One file per canary in ``constraints/canary/`` (a folder of its own, so ``nox -s gemma4_mtp`` and every tool that
reads ``constraints/*.txt`` keep seeing only the pinned rows)::

    # from: sglang-0.5.23          the pinned row it floats from (its python, torch backend and other pins)
    # mode: canary-override        canary | canary-override
    # description: torch past sglang 0.5.23's pin
    torch>=2.14                    each named package floats: the newest release on the index inside the range

``canary`` takes what ``pip install sglang`` gives a user today: uv resolves the floating packages inside their
ranges *and* sglang's own requirements, the other packages stay at the row's pins; the run installs that as an
ordinary pinned row. ``canary-override`` goes past sglang's requirements: each floating package at its newest
release inside its range becomes a ``--with`` override of the pinned row (what sglang has not upgraded to yet), with
the override rules of ``runner/overrides.py`` (sglang's exact pins held, moved packages recorded with why).

Resolution runs before any venv exists: an unreachable index or a range no release satisfies is one line.
``runner/culprit.py`` takes over when the canary fails a tier its pinned row passes.
"""

from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix.core.rows import ROW_ID, Row, RowError, constrained_name, parse_row, requirement_lines
from mtpmatrix.runner import releases
from mtpmatrix.runner.matrix import find_uv
from mtpmatrix.runner.overrides import compiled_versions

MODES = ("canary", "canary-override")
HEADER_KEYS = {"from", "mode", "description", "tags"}
CANARY_DIR = "canary"  # under constraints/


@dataclass(frozen=True)
class Canary:
    id: str
    path: Path
    base: Row  # the pinned row it floats from
    mode: str
    floats: dict[str, str]  # canonical name -> specifier text ('' = any release), in file order
    description: str = ""
    tags: tuple[str, ...] = ()

    @property
    def override(self) -> bool:
        return self.mode == "canary-override"

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "file": str(self.path.name),
            "from": self.base.id,
            "mode": self.mode,
            "floats": dict(self.floats),
            "description": self.description,
        }


@dataclass
class Resolution:
    """What a canary resolved to today: every floating package's release, and what moved from the row's pins."""

    canary: Canary
    versions: dict[str, str]  # floating package -> release
    moved: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # package -> (row's pin, release)

    @property
    def overrides(self) -> list[str]:
        return [f"{p}=={v}" for p, (_, v) in self.moved.items()]

    def as_dict(self) -> dict:
        return {
            **self.canary.as_dict(),
            "resolved": dict(self.versions),
            "moved": {p: {"from": a, "to": b} for p, (a, b) in self.moved.items()},
        }


def parse_canary(path: Path, rows: dict[str, Row]) -> Canary:
    path = Path(path)
    cid = path.stem
    if not ROW_ID.match(cid):
        raise RowError(f"{path}: canary id {cid!r} must be lower-case letters, digits, '.' and '-'")
    if cid in rows:
        raise RowError(f"{path}: canary id {cid!r} is already a pinned row's id")
    meta: dict[str, str] = {}
    at: dict[str, int] = {}
    floats: dict[str, str] = {}
    for lineno, body, req in requirement_lines(path, path.read_text().splitlines(), HEADER_KEYS, meta, at):
        where = f"{path}:{lineno}"
        if req.url or req.marker or req.extras:
            raise RowError(f"{where}: a floating package is a name and a range, got {body!r}")
        name = canonicalize_name(req.name)
        if name in floats:
            raise RowError(f"{where}: {req.name} floats twice")
        floats[name] = str(req.specifier)
    if "from" not in meta:
        raise RowError(f"{path}:1: missing header '# from: ROW' (the pinned row it floats from)")
    if meta["from"] not in rows:
        raise RowError(f"{path}:{at['from']}: from {meta['from']!r} is not a row (known: {', '.join(sorted(rows))})")
    mode = meta.get("mode", "canary")
    if mode not in MODES:
        raise RowError(f"{path}:{at.get('mode', 1)}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not floats:
        raise RowError(f"{path}: no floating package (a line such as 'transformers>=5.8')")
    tags = tuple(t.strip() for t in meta.get("tags", "").split(",") if t.strip())
    return Canary(cid, path, rows[meta["from"]], mode, floats, meta.get("description", ""), tags)


def load_canaries(constraints: Path, rows: list[Row]) -> dict[str, Canary]:
    """Every canary in ``constraints/canary/``, by id (none when the folder is absent)."""
    by_id = {r.id: r for r in rows}
    folder = Path(constraints) / CANARY_DIR
    return {c.id: c for c in (parse_canary(f, by_id) for f in sorted(folder.glob("*.txt"), key=lambda f: f.stem))}


# ---------------------------------------------------------------------------------------------------------------
# resolution
# ---------------------------------------------------------------------------------------------------------------


def resolve(canary: Canary, *, fetch: releases.Fetch | None = None, compile_=None) -> Resolution:
    """Today's releases for ``canary``. Every range is first checked against the index (one line naming the range
    and the newest releases seen when none fits); ``canary`` mode then asks uv what sglang's requirements allow."""
    newest = {p: str(releases.newest(p, spec, fetch=fetch)) for p, spec in canary.floats.items()}
    if canary.override:
        versions = newest
    else:
        versions = (compile_ or compile_within_sglang)(canary)
    pins = canary.base.pins
    moved = {p: (pins.get(p), v) for p, v in versions.items() if pins.get(p) != v}
    return Resolution(canary, versions, moved)


def compile_within_sglang(canary: Canary) -> dict[str, str]:
    """``uv pip compile`` of the floating ranges plus the row's other pins, for the row's Python: the releases
    ``pip install sglang`` would pick today. RowError with uv's reason when nothing fits."""
    uv = find_uv()
    reqs = [f"{p}{s}" for p, s in canary.floats.items()]
    reqs += [f"{p}=={v}" for p, v in canary.base.pins.items() if p not in canary.floats]
    reqs += list(canary.base.extra_lines)
    cmd = [uv, "pip", "compile", "-", "--python-version", canary.base.python, "--no-header", "--no-annotate"]
    if canary.base.torch_backend != "pypi":
        cmd += ["--torch-backend", canary.base.torch_backend]
    done = subprocess.run(cmd, input="\n".join(reqs) + "\n", capture_output=True, text=True)
    if done.returncode != 0:
        why = " ".join(ln.strip() for ln in done.stderr.splitlines() if ln.strip())[:400] or "uv pip compile failed"
        raise RowError(
            f"{canary.id}: no set of releases fits {', '.join(reqs[: len(canary.floats)])} within "
            f"{canary.base.id}'s other pins and sglang's requirements: {why}"
        )
    return {name: ver for name, ver in compiled_versions(done.stdout).items() if name in canary.floats}


def canary_row(res: Resolution, folder: Path) -> Row:
    """The row a canary installs. ``canary-override``: the pinned row itself (the moved packages go in as overrides).
    ``canary``: the pinned row's file with the resolved releases as its pins, written to ``folder/<id>.txt``."""
    c = res.canary
    if c.override:
        return dataclasses.replace(c.base, id=c.id)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for line in c.base.path.read_text().splitlines():
        name = constrained_name(line)
        if name in res.versions:
            out.append(f"{name}=={res.versions[name]}  # floats: {name}{c.floats[name] or ' (any)'}")
            continue
        out.append(line)
    out += [
        f"{p}=={v}  # floats: {p}{c.floats[p] or ' (any)'}" for p, v in res.versions.items() if p not in c.base.pins
    ]
    f = folder / f"{c.id}.txt"
    f.write_text("\n".join(out) + "\n")
    return parse_row(f)


def describe_resolution(res: Resolution) -> str:
    c = res.canary
    if not res.moved:
        return (
            f"{c.id} ({c.mode} of {c.base.id}): nothing moved, "
            + ", ".join(f"{p} {v}" for p, v in res.versions.items())
            + " are the row's own pins"
        )
    return (
        f"{c.id} ({c.mode} of {c.base.id}): "
        + ", ".join(f"{p} {a or '-'} -> {b}" for p, (a, b) in res.moved.items())
        + "".join(f", {p} {v} (unmoved)" for p, v in res.versions.items() if p not in res.moved)
    )
