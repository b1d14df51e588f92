"""Environment rows: one constraints file per row in ``constraints/``.

A row file is a plain pip/uv constraints file whose leading ``# key: value`` comments carry the row's metadata::

    # python: 3.11
    # torch-backend: pypi        (pypi = PyPI's default wheel; cu126/cu128/cu130/cpu = uv --torch-backend)
    # tags: floor, ci
    # default: true              (optional; rows with default: false run only when named or selected by tag)
    # description: the release the seed tests were written against
    sglang==0.5.13
    transformers==5.8.1
    torch==2.11.0

Everything is validated up front so a typo fails in one line before any venv is made.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mtpmatrix.core.record_types import RowInfo
from mtpmatrix.core.schema import comma_list
from mtpmatrix.core.settings import MIN_TRANSFORMERS

REQUIRED_PINS = ("sglang", "transformers", "torch")
HEADER_KEYS = {"python", "torch-backend", "tags", "default", "description", "gpus"}
TORCH_BACKENDS = {"pypi", "auto", "cpu"} | {f"cu{v}" for v in (118, 121, 124, 126, 128, 129, 130, 131, 132)}
ROW_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_HEADER = re.compile(r"^#\s*([a-z\-]+)\s*:\s*(.*?)\s*$")


class RowError(ValueError):
    """A row file or a row selection is malformed; the message is one line meant for the user."""


@dataclass(frozen=True)
class Row:
    id: str
    path: Path
    python: str
    torch_backend: str
    pins: dict[str, str]  # canonical name -> exact version, in file order
    tags: tuple[str, ...] = ()
    default: bool = True
    description: str = ""
    gpus: int = 1
    extra_lines: tuple[str, ...] = field(default=())  # other constraint lines, kept verbatim

    @property
    def sglang(self) -> str:
        return self.pins["sglang"]

    @property
    def transformers(self) -> str:
        return self.pins["transformers"]

    @property
    def torch(self) -> str:
        return self.pins["torch"]

    def as_dict(self) -> RowInfo:
        """row.json's ``row``."""
        return {
            "id": self.id,
            "constraints": self.path.name,
            "python": self.python,
            "torch_backend": self.torch_backend,
            "pins": dict(self.pins),
            "tags": list(self.tags),
            "default": self.default,
            "description": self.description,
            "gpus": self.gpus,
        }


def requirement_lines(
    path: Path, lines: list[str], header_keys: Collection[str], meta: dict[str, str], at: dict[str, int]
) -> Iterator[tuple[int, str, Requirement]]:
    """Walk a row-style constraints file (a row, a canary): fill ``meta`` / ``at`` (key -> line number) from its header,
    the ``# key: value`` comments before the first requirement line, each key one of ``header_keys``; yield every
    requirement line as (line number, text without its trailing comment, Requirement). A malformed line is one
    RowError naming file:line, raised when the walk reaches it."""
    seen_requirement = False
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        where = f"{path}:{lineno}"
        if not line:
            continue
        if line.startswith("#"):
            m = _HEADER.match(line)
            if m and not seen_requirement:  # the header is the comment block before the first requirement
                if m.group(1) not in header_keys:
                    raise RowError(
                        f"{where}: unknown header key {m.group(1)!r} (known: {', '.join(sorted(header_keys))})"
                    )
                meta[m.group(1)] = m.group(2)
                at[m.group(1)] = lineno
            continue
        line = line.split(" #", 1)[0].strip()
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise RowError(f"{where}: not a requirement line: {line!r} ({str(exc).splitlines()[0]})") from None
        seen_requirement = True
        yield lineno, line, req


def constrained_name(line: str) -> str | None:
    """The canonical name of the package a constraints file's line constrains; None for a blank line, a comment or a
    line that is no requirement."""
    body = line.split(" #", 1)[0].strip()
    if not body or body.startswith("#"):
        return None
    try:
        return canonicalize_name(Requirement(body).name)
    except InvalidRequirement:
        return None


def parse_row(path: Path) -> Row:
    path = Path(path)
    row_id = path.stem
    if not ROW_ID.match(row_id):
        raise RowError(f"{path}: row id {row_id!r} must be lower-case letters, digits, '.' and '-'")
    meta: dict[str, str] = {}
    pins: dict[str, str] = {}
    extra: list[str] = []
    at: dict[str, int] = {}  # header key / pin name -> line number, so every error names file:line
    lines = path.read_text().splitlines()
    for lineno, line, req in requirement_lines(path, lines, HEADER_KEYS, meta, at):
        where = f"{path}:{lineno}"
        name = canonicalize_name(req.name)
        specs = list(req.specifier)
        if name in REQUIRED_PINS:
            if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
                raise RowError(f"{where}: {req.name} must be pinned exactly (name==version), got {line!r}")
            if name in pins:
                raise RowError(f"{where}: {req.name} is pinned twice")
            pins[name] = specs[0].version
            at[name] = lineno
        else:
            extra.append(line)

    def line_of(key: str) -> str:
        return f"{path}:{at.get(key, 1)}"

    missing = [p for p in REQUIRED_PINS if p not in pins]
    if missing:  # points at the last line: the pin belongs in the pin block
        raise RowError(f"{path}:{max(len(lines), 1)}: missing exact pin(s) for {', '.join(missing)}")
    for key in ("python", "torch-backend"):
        if key not in meta:
            raise RowError(f"{path}:1: missing header '# {key}: ...'")
    if not re.fullmatch(r"3\.\d+", meta["python"]):
        raise RowError(f"{line_of('python')}: python must look like 3.11, got {meta['python']!r}")
    backend = meta["torch-backend"]
    if backend not in TORCH_BACKENDS:
        raise RowError(
            f"{line_of('torch-backend')}: torch-backend {backend!r} is not one of {', '.join(sorted(TORCH_BACKENDS))}"
        )
    for p in REQUIRED_PINS:
        try:
            Version(pins[p])
        except InvalidVersion as exc:
            raise RowError(f"{line_of(p)}: {exc}") from None
    if Version(pins["transformers"]) < Version(MIN_TRANSFORMERS):
        raise RowError(
            f"{line_of('transformers')}: transformers {pins['transformers']} predates gemma4_assistant "
            f"(needs >= {MIN_TRANSFORMERS})"
        )
    default = meta.get("default", "true").lower()
    if default not in ("true", "false"):
        raise RowError(f"{line_of('default')}: default must be true or false, got {default!r}")
    tags = tuple(comma_list(meta.get("tags")))
    gpus = meta.get("gpus", "1")
    if not gpus.isdigit():
        raise RowError(f"{line_of('gpus')}: gpus must be an integer, got {gpus!r}")
    return Row(
        id=row_id,
        path=path,
        python=meta["python"],
        torch_backend=backend,
        pins=pins,
        tags=tags,
        default=default == "true",
        description=meta.get("description", ""),
        gpus=int(gpus),
        extra_lines=tuple(extra),
    )


def load_rows(directory: Path) -> list[Row]:
    """Every row in ``directory``, sorted by id; raises RowError on the first malformed file."""
    directory = Path(directory)
    files = sorted(directory.glob("*.txt"), key=lambda f: f.stem)  # by id: "a-x.txt" sorts before "a.txt" by name
    if not files:
        raise RowError(f"{directory}: no row files (*.txt)")
    return [parse_row(f) for f in files]


def parse_override(spec: str) -> Requirement:
    """A ``--with`` spec such as ``transformers==5.20.0``: one package, an exact or range version."""
    try:
        req = Requirement(spec)
    except InvalidRequirement as exc:
        raise RowError(f"--with {spec!r}: not a requirement ({str(exc).splitlines()[0]})") from None
    if not req.specifier:
        raise RowError(f"--with {spec!r}: give a version, e.g. {req.name}==X.Y.Z")
    if req.url or req.marker:
        raise RowError(f"--with {spec!r}: URLs and markers are not supported")
    return req
