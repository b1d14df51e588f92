"""A candidate: an sglang that is not a release yet, qualified as a row beside its base release.

    nox -s gemma4_mtp -- --patch FILE          a unified diff applied to each row's pinned sglang after its install
    nox -s gemma4_mtp -- --sglang WHEEL        that wheel instead of the pinned release
    nox -s gemma4_mtp -- --sglang CHECKOUT     sglang built from a git checkout (python/pyproject.toml, or a
                                               pyproject.toml, whose project is sglang) instead of the pinned release

Every other pin of the row stays. The row is filed under the candidate's own id, ``<row>+patch-<sha7>``,
``<row>+wheel-<sha7>`` or ``<row>+checkout-<commit7>[-dirty]``, and its record says what was qualified
(``candidate``: kind, sha256, files, commit, dirty, version, draft_phase, base_row), so the report can set it beside
its base release and the evidence judge can hold its versions to the candidate's.

The draft phase. The smoke tier's sglang-phase witnesses are built for the draft phase the installed release drafts
at (pairs/witness/phase.py). A candidate that moves it says so, ``Draft-Phase: +1`` in a patch's header or
``--draft-phase +1``; the suite then builds them for that phase (MTPMATRIX_DRAFT_PHASE), a knob the judge accepts
only for a candidate that declares the same phase.

Bad input is one line before anything installs: a patch that does not parse or names a file outside sglang, a path
that is neither a wheel nor an sglang checkout, a wheel built for another Python or platform than the row's. Whether
a patch's hunks apply is checked against the installed files, after the install and before the suite: the pinned
release's files are on disk only once uv has fetched them. A mismatch names the file and the hunk, and the row is
"not run" with that line, never a record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging import tags as wheel_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from mtpmatrix.core import schema, unidiff
from mtpmatrix.core.evidence import manifest
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import Row, RowError, parse_override

PATCH, WHEEL, CHECKOUT = "patch", "wheel", "checkout"
DRAFT_PHASE_TRAILER = "Draft-Phase"
MAX_DRAFT_PHASE = 3  # the witness reads keys up to this many positions away (a larger one is a typo)


@dataclass(frozen=True)
class Candidate:
    kind: str  # PATCH, WHEEL, CHECKOUT
    path: str  # the patch or wheel file, the checkout's project folder (absolute)
    sha256: str | None  # the patch's or wheel's bytes; a dirty checkout's uncommitted change
    files: tuple[str, ...] = ()  # a patch's files, package-relative (sglang/srt/...)
    commit: str | None = None  # a checkout's HEAD
    dirty: bool | None = None  # a checkout with uncommitted changes under its project folder
    version: str | None = None  # the sglang release a wheel or checkout installs (a dynamic version: once built)
    draft_phase: int | None = None  # declared: the draft phase this candidate drafts at
    wheel_tags: frozenset = frozenset()
    warnings: tuple[str, ...] = ()
    patch: tuple = field(default=(), compare=False, repr=False)  # the parsed unidiff.FilePatch list

    @property
    def suffix(self) -> str:
        if self.kind == CHECKOUT:
            return f"checkout-{(self.commit or '')[:7]}" + ("-dirty" if self.dirty else "")
        return f"{self.kind}-{(self.sha256 or '')[:7]}"

    def row_id(self, base: str) -> str:
        return f"{base}+{self.suffix}"

    def record(self, base_row: str) -> dict:
        """row.json's ``candidate``."""
        out = {"kind": self.kind, "path": self.path, "sha256": self.sha256, "base_row": base_row}
        if self.kind == PATCH:
            out["files"] = list(self.files)
        if self.kind == CHECKOUT:
            out.update(commit=self.commit, dirty=self.dirty)
        if self.kind in (WHEEL, CHECKOUT):
            out["version"] = self.version
        if self.draft_phase is not None:
            out["draft_phase"] = self.draft_phase
        return out

    # what each step of a row does with its candidate (NoCandidate: the same steps for the pinned release)

    def record_entry(self, base_row: str) -> dict:
        """What row.json carries of it: ``candidate``."""
        return {"candidate": self.record(base_row)}

    def identity(self) -> dict | None:
        return manifest.candidate_identity(self.record(""))

    def for_row(self, row: Row) -> Row:
        if self.kind == WHEEL and not self.wheel_tags & supported_tags(row.python):
            built = ", ".join(sorted(str(t) for t in self.wheel_tags))
            raise RowError(
                f"--sglang {Path(self.path).name}: built for {built}, not for {row.id}'s Python {row.python} "
                f"on {sys.platform}"
            )
        return dataclasses.replace(row, id=self.row_id(row.id))

    def own_venv(self, row: Row, default: Path, nox_dir: Path) -> Path:
        from mtpmatrix.runner import venvs

        return venvs.make_venv(row, Path(nox_dir) / "candidates" / self.row_id(row.id), RowError)

    def dropped_pins(self) -> set[str]:
        return {"sglang"} if self.kind in (WHEEL, CHECKOUT) else set()

    def install_source(self) -> str | None:
        return self.path if self.kind in (WHEEL, CHECKOUT) else None

    def install_flags(self) -> list[str]:
        # uv keeps a local folder's build until its pyproject.toml changes: a checkout's edited sources would not be
        # seen
        return ["--reinstall-package", "sglang"] if self.kind == CHECKOUT else []

    def after_install(self, venv: Path, record: RowRecord, log=print) -> None:
        got = (record.get("versions") or {}).get("sglang")
        if self.kind == PATCH:
            from mtpmatrix.runner.bytecode import site_packages

            site = site_packages(venv)
            if site is None:
                raise RowError(f"{venv}: no site-packages to apply --patch to")
            record["candidate"]["applied"] = apply_to(self, site, log)
        elif self.version is None:  # a checkout with a dynamic version: what it built
            record["candidate"]["version"] = got
        elif got and got.split("+")[0] != self.version.split("+")[0]:
            raise RowError(f"--sglang {self.path}: installed sglang {got}, the candidate is {self.version}")

    def suite_env(self) -> dict[str, str]:
        return {} if self.draft_phase is None else {schema.DRAFT_PHASE_ENV: f"{self.draft_phase:+d}"}


class NoCandidate:
    """No candidate: the row's pinned release. Each step of a row asks its candidate the same questions; this one
    answers "nothing changes", so the steps need no ``if cand is None`` of their own."""

    warnings: tuple[str, ...] = ()

    def row_id(self, base: str) -> str:
        return base

    def record_entry(self, base_row: str) -> dict:
        return {}

    def identity(self) -> dict | None:
        return None

    def for_row(self, row: Row) -> Row:
        return row

    def own_venv(self, row: Row, default: Path, nox_dir: Path) -> Path:
        return Path(default)

    def dropped_pins(self) -> set[str]:
        return set()

    def install_source(self) -> str | None:
        return None

    def install_flags(self) -> list[str]:
        return []

    def after_install(self, venv: Path, record: RowRecord, log=print) -> None:
        return None

    def suite_env(self) -> dict[str, str]:
        return {}


NO_CANDIDATE = NoCandidate()


def of(cand: Candidate | NoCandidate | None) -> Candidate | NoCandidate:
    """The candidate the options hold (``Options.candidate``, None for none), as an object every step can ask."""
    return NO_CANDIDATE if cand is None else cand


def filed_id(row_id: str, cand: Candidate | NoCandidate | None) -> str:
    """The id a row is filed under: its own, or its candidate's."""
    return of(cand).row_id(row_id)


def identity(cand: Candidate | NoCandidate | None) -> dict | None:
    """What a run's plan fixes of the candidate (manifest.candidate_identity)."""
    return of(cand).identity()


def parse_draft_phase(text: str, where: str) -> int:
    try:
        phase = int(str(text).strip())
    except ValueError:
        raise RowError(f"{where}: draft phase {text!r} is not a whole number (e.g. +1)") from None
    if abs(phase) > MAX_DRAFT_PHASE:
        raise RowError(f"{where}: draft phase {phase:+d} is outside -{MAX_DRAFT_PHASE}..+{MAX_DRAFT_PHASE}")
    return phase


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# reading the candidate (before anything installs)
# ---------------------------------------------------------------------------------------------------------------


def from_options(
    patch: str | None, sglang: str | None, draft_phase: str | None, overrides: list[str] = ()
) -> Candidate | None:
    """The candidate the session options name, None for none; RowError (one line) for bad input."""
    if patch and sglang:
        raise RowError("--patch and --sglang each name a candidate: give one")
    if draft_phase is not None and not (patch or sglang):
        raise RowError("--draft-phase declares a candidate's draft phase: give --patch or --sglang with it")
    if not (patch or sglang):
        return None
    if any(canonicalize_name(parse_override(o).name) == "sglang" for o in overrides):
        raise RowError("--with sglang... and a candidate both replace the row's sglang: give one")
    declared = parse_draft_phase(draft_phase, "--draft-phase") if draft_phase is not None else None
    cand = read_patch(Path(patch)) if patch else read_sglang(Path(sglang))
    if declared is not None:
        if cand.draft_phase is not None and cand.draft_phase != declared:
            raise RowError(
                f"--draft-phase {declared:+d}: the patch declares {DRAFT_PHASE_TRAILER}: {cand.draft_phase:+d}"
            )
        cand = dataclasses.replace(cand, draft_phase=declared)
    return cand


def read_patch(path: Path) -> Candidate:
    """A patch candidate: its sha256, files and declared draft phase; RowError when it cannot be read or parsed."""
    try:
        data = Path(path).read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RowError(f"--patch {path}: unreadable ({type(exc).__name__}: {exc})") from None
    try:
        files = unidiff.parse(text)
    except unidiff.PatchError as exc:
        raise RowError(f"--patch {path}: {exc}") from None
    phase = unidiff.trailers(text).get(DRAFT_PHASE_TRAILER)
    return Candidate(
        PATCH,
        str(Path(path).resolve()),
        hashlib.sha256(data).hexdigest(),
        files=tuple(fp.path for fp in files),
        draft_phase=parse_draft_phase(phase, f"--patch {path}") if phase is not None else None,
        patch=tuple(files),
        warnings=tuple(_untouched(files, path)),
    )


def _untouched(files: list, path: Path) -> list[str]:
    """A warning when the patch touches nothing the tiers run: no file under sglang/srt/."""
    if any(fp.path.startswith("sglang/srt/") for fp in files):
        return []
    return [
        f"--patch {path} touches nothing under sglang/srt/ ({', '.join(fp.path for fp in files)}): nothing the "
        "MTP path imports changes, so the candidate runs as its base release"
    ]


def read_sglang(path: Path) -> Candidate:
    """``--sglang PATH``: a wheel file or a checkout; RowError for anything else."""
    if path.is_file() and path.suffix == ".whl":
        return read_wheel(path)
    if path.is_dir():
        return read_checkout(path)
    raise RowError(f"--sglang {path}: neither a wheel file (.whl) nor a folder")


def read_wheel(path: Path) -> Candidate:
    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise RowError(f"--sglang {path}: not a wheel file name ({exc})") from None
    if name != "sglang":
        raise RowError(f"--sglang {path}: a wheel of {name}, not of sglang")
    return Candidate(WHEEL, str(path.resolve()), _sha256(path), version=str(version), wheel_tags=frozenset(tags))


def project_folder(path: Path) -> Path | None:
    """The folder holding sglang's pyproject.toml in ``path``: ``python/`` of sglang's repository, or ``path``."""
    for folder in (path / "python", path):
        try:
            project = tomllib.loads((folder / "pyproject.toml").read_text()).get("project") or {}
        except (OSError, ValueError):
            continue
        if canonicalize_name(str(project.get("name", ""))) == "sglang":
            return folder
    return None


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, timeout=120)


def read_checkout(path: Path) -> Candidate:
    """A checkout candidate: its project folder, commit and whether it is dirty (and then the sha256 of the change)."""
    folder = project_folder(path)
    if folder is None:
        raise RowError(
            f"--sglang {path}: not an sglang checkout (no python/pyproject.toml or pyproject.toml whose "
            "project is sglang)"
        )
    try:
        head = _git(folder, "rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError) as exc:
        raise RowError(f"--sglang {path}: git cannot read it ({exc})") from None
    if head.returncode != 0:
        raise RowError(
            f"--sglang {path}: not a git checkout (a candidate checkout is named by its commit): build "
            "a wheel and give --sglang WHEEL"
        )
    # what the build takes: tracked changes and untracked files under the project folder
    status = _git(folder, "status", "--porcelain", "--", ".").stdout
    change = _git(folder, "diff", "HEAD", "--binary", "--", ".").stdout + status if status.strip() else b""
    project = tomllib.loads((folder / "pyproject.toml").read_text()).get("project") or {}
    return Candidate(
        CHECKOUT,
        str(folder.resolve()),
        hashlib.sha256(change).hexdigest() if change else None,
        commit=head.stdout.decode().strip(),
        dirty=bool(status.strip()),
        version=project.get("version") if "version" not in (project.get("dynamic") or []) else None,
    )


# ---------------------------------------------------------------------------------------------------------------
# the candidate's row and install
# ---------------------------------------------------------------------------------------------------------------


def supported_tags(python: str) -> set:
    """The wheel tags a venv of Python ``python`` (the row's, "3.11") on this machine installs."""
    version = tuple(int(x) for x in python.split(".")[:2])
    return set(wheel_tags.cpython_tags(version)) | set(wheel_tags.compatible_tags(version))


def for_row(cand: Candidate | NoCandidate | None, row: Row) -> Row:
    """``row`` filed as its candidate (the same pins, the candidate's id); RowError when the candidate cannot run
    in it (a wheel for another Python or platform)."""
    return of(cand).for_row(row)


def own_venv(cand: Candidate | NoCandidate | None, row: Row, default: Path, nox_dir: Path) -> Path:
    """Where the row installs: ``default`` (its nox venv) for a release; for a candidate a fresh venv of its own,
    ``<nox_dir>/candidates/<row>+<suffix>``, so the row's venv never holds a patched or foreign sglang afterwards.
    One folder down: what looks for a row's release among the venvs (the mutants' unit tests glob
    ``.nox/*sglang-0?5?*``) must not find a candidate's files there. RowError (one line) when uv cannot make it."""
    return of(cand).own_venv(row, default, nox_dir)


def dropped_pins(cand: Candidate | NoCandidate | None) -> set[str]:
    """Pins a candidate replaces (they leave the row's constraints): sglang, for a wheel or checkout."""
    return of(cand).dropped_pins()


def install_source(cand: Candidate | NoCandidate | None) -> str | None:
    """What the install command names instead of ``sglang==<pin>``: the wheel file or the project folder."""
    return of(cand).install_source()


def install_flags(cand: Candidate | NoCandidate | None) -> list[str]:
    return of(cand).install_flags()


def after_install(cand: Candidate | NoCandidate | None, venv: Path, record: RowRecord, log=print) -> None:
    """The candidate in the installed venv: a patch applied to its sglang (RowError naming the file and the hunk),
    a wheel's or checkout's installed version held to the candidate's."""
    of(cand).after_install(venv, record, log)


def apply_to(cand: Candidate, site: Path, log=print) -> list[str]:
    """Apply the patch to the sglang files under ``site`` (site-packages): every file checked first, then each
    written whole. Returns the files written."""
    site = Path(site)
    results: dict[str, str | None] = {}
    for fp in cand.patch:
        f = site / fp.path
        try:
            original = f.read_text(encoding="utf-8") if f.is_file() else None
            results[fp.path] = unidiff.apply(fp, original)
        except (OSError, UnicodeDecodeError) as exc:
            raise RowError(f"--patch {cand.path}: {fp.path}: unreadable ({exc})") from None
        except unidiff.PatchError as exc:
            raise RowError(f"--patch {Path(cand.path).name}: {exc}") from None
    for rel, text in results.items():
        f = site / rel
        if text is None:
            f.unlink()
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            # a new file, renamed over the old: uv installs each file as a hard link to its copy in uv's cache, so
            # writing into it would patch the cache (and every venv linked to it) too
            tmp = f.with_name(f".{f.name}.mtpmatrix-patch")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, f)
        _drop_bytecode(f)
        log(f"[candidate] patched {rel}")
    return list(results)


def _drop_bytecode(source: Path) -> None:
    """Remove the pycs beside ``source`` (none in a fresh venv; a pip-compiled one would be stale). Bytecode
    compiled elsewhere is safe already: runner/bytecode.py's are checked hash-based or timestamp pycs, both of which
    Python checks against the patched source."""
    for pyc in (source.parent / "__pycache__").glob(f"{source.stem}.*.pyc"):
        pyc.unlink(missing_ok=True)


def suite_env(cand: Candidate | NoCandidate | None) -> dict[str, str]:
    """What the suite's environment carries of the candidate: its declared draft phase."""
    return of(cand).suite_env()


# ---------------------------------------------------------------------------------------------------------------
# a patch served at import on a GPU box (tools/gpu_box.sh PATCH=FILE)
# ---------------------------------------------------------------------------------------------------------------


def box_patch(path: Path, draft_phase: str | None = None) -> dict:
    """What tools/gpu_box.sh records of ``PATCH=FILE`` (invocation.json's ``patch``), once the patch is shown to
    apply to the sglang this interpreter imports, as the hook (faults/mutant_hook) will serve it: existing .py files
    only, every hunk in place. RowError (one line) otherwise."""
    import importlib.util

    cand = from_options(str(path), None, draft_phase)
    spec = importlib.util.find_spec(unidiff.PACKAGE)  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RowError(f"PATCH={path}: no sglang on this python's path to apply it to")
    site = Path(list(spec.submodule_search_locations)[0]).parent
    for fp in cand.patch:
        if fp.kind != "modify" or fp.module is None:
            raise RowError(
                f"PATCH={path}: {fp.path}: served at import, a patch may only change existing .py files "
                "(give it to nox -s gemma4_mtp -- --patch, which patches the installed files)"
            )
        try:
            unidiff.apply(fp, (site / fp.path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise RowError(f"PATCH={path}: {fp.path}: unreadable ({exc})") from None
        except unidiff.PatchError as exc:
            raise RowError(f"PATCH={Path(path).name}: {exc} (sglang at {site})") from None
    return {
        "path": cand.path,
        "sha256": cand.sha256,
        "files": list(cand.files),
        "draft_phase": cand.draft_phase,
        "warnings": list(cand.warnings),
    }


def main(argv: list[str]) -> int:
    """``python -m mtpmatrix.runner.candidate PATCH OUT.json [DRAFT_PHASE]`` (tools/gpu_box.sh): check PATCH
    against this python's sglang, write ``box_patch`` to OUT.json and print the suite's environment as one shell
    ``export`` line; exit 2 with one line on bad input."""
    import json
    import shlex

    try:
        info = box_patch(Path(argv[0]), argv[2] if len(argv) > 2 and argv[2] else None)
    except RowError as exc:
        print(f"gpu_box.sh: {exc}", file=sys.stderr)
        return 2
    for warning in info["warnings"]:
        print(f"gpu_box.sh: warning: {warning}", file=sys.stderr)
    Path(argv[1]).write_text(json.dumps(info, indent=2) + "\n")
    env = {schema.PATCH_ENV: info["path"], schema.PATCH_SHA256_ENV: info["sha256"]}
    if info["draft_phase"] is not None:
        env[schema.DRAFT_PHASE_ENV] = f"{info['draft_phase']:+d}"
    print("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
