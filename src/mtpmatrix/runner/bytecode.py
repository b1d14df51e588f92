"""A row's imports compiled on the spare core, ahead of the pytest processes that import them.

Why: a row's venv is new, so it holds no bytecode (and this machine sets PYTHONDONTWRITEBYTECODE=1, so none is ever
kept), and compiling is about half of ``import sglang.srt.models.gemma4_mtp``: 21.6 s of CPU from source, 10.3 s from
bytecode (0.5.17 row, ~6,700 files). Compiling needs no import, so while the pytest processes start,
``python -m compileall`` in the row's venv compiles the files the row's suite imported last time, in import order,
into a folder that the pytest processes read as their PYTHONPYCACHEPREFIX; a file not compiled yet they compile
themselves and leave there for the other process. The contract tier's one long import then runs at the pace of
executing modules, not compiling them (its process: 33 s of CPU without, 19 s with, same machine).

Nothing outlives the suite: the folder is new for every suite and removed after it, and Python checks each cached
file against its source (mtime and size) before using it. What persists is only the list of files
(``.cache/bytecode/sglang-<version>-py<python>.txt``, paths relative to site-packages, so every probe of a bisect
shares it), rewritten from what the suite imported (mtpmatrix.tiers.imported); without it (the first row of a
release) the suite runs as before. ``MTPMATRIX_PRECOMPILE=0`` turns this off.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.runner.rows import Row, RowError
from mtpmatrix.tiers.imported import ENV as IMPORTED_ENV

ENV_KNOB = "MTPMATRIX_PRECOMPILE"
CACHE = Path(__file__).resolve().parents[3] / ".cache" / "bytecode"
PLUGIN_ARGS = ["-p", "mtpmatrix.tiers.imported"]


def enabled(env: dict | None = None) -> bool:
    """``MTPMATRIX_PRECOMPILE``: unset or "1" on, "0" off; RowError (one line) for anything else."""
    value = (os.environ if env is None else env).get(ENV_KNOB, "").strip()
    if value not in ("", "0", "1"):
        raise RowError(f"{ENV_KNOB}={value!r}: use 1 (compile the row's imports on the spare core) or 0")
    return value != "0"


def manifest_path(row: Row, cache: Path = CACHE) -> Path:
    return cache / f"sglang-{row.pins.get('sglang', 'none')}-py{row.python}.txt"


def site_packages(venv: Path) -> Path | None:
    found = sorted(Path(venv).glob("lib/python*/site-packages")) + sorted(Path(venv).glob("Lib/site-packages"))
    return found[0] if found else None


@dataclass
class Prefetch:
    """What the suite runs with: ``env`` and ``pytest_args`` for its pytest processes; ``finish()`` after it."""

    env: dict
    pytest_args: list[str] = field(default_factory=list)
    folder: Path | None = None
    manifest: Path | None = None
    site: Path | None = None
    compiler: subprocess.Popen | None = None

    def finish(self) -> None:
        """Stop the compiler if it still runs, keep what the suite imported as the next list, remove the folder."""
        if self.folder is None:
            return
        if self.compiler is not None and self.compiler.poll() is None:
            self.compiler.kill()
        if self.compiler is not None:
            self.compiler.wait()
        lists = [[rel for rel in map(self._relative, part.read_text().splitlines()) if rel]
                 for part in sorted((self.folder / "imported").glob("imported-*.txt"))]
        # each process's files in turn (its 1st, the other's 1st, its 2nd, ...): every process imports in this
        # order, at the same time, so the compiler stays ahead of both rather than of one
        imported = dict.fromkeys(rel for rank in itertools.zip_longest(*lists) for rel in rank if rel)
        if imported and self.manifest is not None:
            self.manifest.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.manifest.with_name(self.manifest.name + ".tmp")
            tmp.write_text("".join(f"{p}\n" for p in imported))
            os.replace(tmp, self.manifest)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


    def _relative(self, path: str) -> str | None:
        """``path`` relative to the venv's site-packages; None outside it (the standard library, this project)."""
        for root in {os.path.join(str(self.site), ""), os.path.join(os.path.realpath(self.site), "")}:
            if path.startswith(root):
                return path[len(root):]
        return None


def start(venv: Path, python: Path, manifest: Path, env: dict) -> Prefetch:
    """Start compiling ``manifest``'s files (those still in the venv) in ``venv``'s Python; the returned Prefetch
    carries the pytest processes' environment. A no-op Prefetch (``env`` unchanged) when turned off or the venv
    has no site-packages."""
    site = site_packages(venv)
    if not enabled(env) or site is None:
        return Prefetch(env=env)
    folder = Path(tempfile.mkdtemp(prefix="mtpmatrix-bytecode-"))
    (folder / "imported").mkdir()
    run_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}  # the folder is temporary
    run_env.update(PYTHONPYCACHEPREFIX=str(folder / "pyc"), **{IMPORTED_ENV: str(folder / "imported")})
    compiler = None
    files = [site / p for p in manifest.read_text().splitlines() if p] if manifest.is_file() else []
    files = [str(f) for f in files if f.is_file()]  # a file gone since (another release) is skipped
    if files:
        listing = folder / "compile.txt"
        listing.write_text("".join(f"{f}\n" for f in files))
        compiler = subprocess.Popen([str(python), "-m", "compileall", "-qq", "-i", str(listing)], env=run_env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Prefetch(env=run_env, pytest_args=list(PLUGIN_ARGS), folder=folder, manifest=manifest, site=site,
                    compiler=compiler)
