"""A row's imports compiled on the spare core, ahead of the pytest processes that import them.

Why: a row's venv is new, so it holds no bytecode (and this machine sets PYTHONDONTWRITEBYTECODE=1, so none is ever
kept), and compiling is about half of ``import sglang.srt.models.gemma4_mtp``: 21.6 s of CPU from source, 10.3 s from
bytecode (0.5.17 row, ~6,700 files). Compiling needs no import, so while the pytest processes start,
``python -m compileall`` in the row's venv compiles the files the row's suite imported last time, in import order,
into a folder that the pytest processes share as their PYTHONPYCACHEPREFIX; a file not compiled yet they compile
themselves and write there, and the compiler skips it. The contract tier's one long import then runs at the pace of
executing modules, not compiling them (its process: 33 s of CPU without, 19 s with, same machine).

Nothing outlives the suite: the folder is new for every suite and removed after it, and Python checks each cached
file against its source (mtime and size) before using it. What persists is only one list of files per pytest
process (``.cache/bytecode/sglang-<version>-py<python>/<process>.txt``, paths relative to site-packages, so every
probe of a bisect shares them), rewritten from what that process imported (mtpmatrix.tiers.imported); without
one (the first row of a release) the suite runs as before. ``MTPMATRIX_PRECOMPILE=0`` turns this off.
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
from mtpmatrix.schema import parse_tiers
from mtpmatrix.tiers.imported import ENV as IMPORTED_ENV, PROCESS_ENV

ENV_KNOB = "MTPMATRIX_PRECOMPILE"
CACHE = Path(__file__).resolve().parents[3] / ".cache" / "bytecode"
PLUGIN_ARGS = ["-p", "mtpmatrix.tiers.imported"]


def enabled(env: dict | None = None) -> bool:
    """``MTPMATRIX_PRECOMPILE``: unset or "1" on, "0" off; RowError (one line) for anything else."""
    value = (os.environ if env is None else env).get(ENV_KNOB, "").strip()
    if value not in ("", "0", "1"):
        raise RowError(f"{ENV_KNOB}={value!r}: use 1 (compile the row's imports on the spare core) or 0")
    return value != "0"


def lists_folder(row: Row, cache: Path = CACHE) -> Path:
    """Where the row's lists live: one per pytest process of its suite (``process_names``)."""
    return cache / f"sglang-{row.pins.get('sglang', 'none')}-py{row.python}"


def process_names(groups: list, tiers: str) -> list[str]:
    """The names of a suite's pytest processes: its side-by-side groups', or ``one-<tiers>`` for one process (a
    one-tier bisect probe imports less than a whole row, so each kind of run keeps its own list)."""
    return [g.name for g in groups] or ["one-" + "+".join(parse_tiers(tiers))]


def site_packages(venv: Path) -> Path | None:
    found = sorted(Path(venv).glob("lib/python*/site-packages")) + sorted(Path(venv).glob("Lib/site-packages"))
    return found[0] if found else None


@dataclass
class Prefetch:
    """What the suite runs with: ``env`` and ``pytest_args`` for its pytest processes; ``finish()`` after it."""

    env: dict
    pytest_args: list[str] = field(default_factory=list)
    folder: Path | None = None
    lists: Path | None = None
    names: list[str] = field(default_factory=list)
    site: Path | None = None
    compiler: subprocess.Popen | None = None

    def finish(self) -> None:
        """Stop the compiler if it still runs, keep what each process imported as its next list, remove the
        folder."""
        if self.folder is None:
            return
        if self.compiler is not None and self.compiler.poll() is None:
            self.compiler.kill()
        if self.compiler is not None:
            self.compiler.wait()
        for part in sorted((self.folder / "imported").glob("imported-*.txt")):
            name = part.stem.removeprefix("imported-")
            kept = [rel for rel in map(self._relative, part.read_text().splitlines()) if rel]
            if kept and self.lists is not None and name in self.names:
                self.lists.mkdir(parents=True, exist_ok=True)
                tmp = self.lists / f"{name}.txt.tmp"
                tmp.write_text("".join(f"{p}\n" for p in kept))
                os.replace(tmp, self.lists / f"{name}.txt")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _relative(self, path: str) -> str | None:
        """``path`` relative to the venv's site-packages; None outside it (the standard library, this project)."""
        for root in {os.path.join(str(self.site), ""), os.path.join(os.path.realpath(self.site), "")}:
            if path.startswith(root):
                return path[len(root):]
        return None


def compile_order(per_process: list[list[str]], forked: bool = False) -> list[str]:
    """The files of the processes' lists, each once: each process's in turn (its 1st, the other's 1st, its 2nd,
    ...: the processes import side by side, so the compiler stays ahead of each). ``forked`` (the processes are
    forked from one interpreter that first imports what they share, mtpmatrix.tiers.pytest_fork): first the files
    one process alone imports, so the compiler gets ahead of the child that imports the most after the fork
    (sglang's 4,400 files) while that interpreter compiles the shared ones itself; then the shared ones last
    imported first, so the compiler, done early, takes the interpreter's tail until the two meet (past that it
    finds each file compiled and skips it)."""
    ranked = list(dict.fromkeys(p for rank in itertools.zip_longest(*per_process) for p in rank if p))
    if not forked:
        return ranked
    counts: dict[str, int] = {}
    for files in per_process:
        for p in set(files):
            counts[p] = counts.get(p, 0) + 1
    return [p for p in ranked if counts[p] == 1] + [p for p in reversed(ranked) if counts[p] > 1]


def start(venv: Path, python: Path, lists: Path, env: dict, names: list[str], forked: bool = False) -> Prefetch:
    """Start compiling the files of the lists ``names`` (``process_names``) in ``lists`` that are still in the venv,
    in ``compile_order``, in ``venv``'s Python. The returned Prefetch carries the pytest processes' environment.
    A no-op Prefetch (``env`` unchanged) when turned off or the venv has no site-packages."""
    site = site_packages(venv)
    if not enabled(env) or site is None:
        return Prefetch(env=env)
    # in memory where the system has a tmpfs: ~200 MB written and read back within the suite, never kept
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="mtpmatrix-bytecode-", dir=shm if shm.is_dir() else None))
    (folder / "imported").mkdir()
    run_env = {**env, "PYTHONPYCACHEPREFIX": str(folder / "pyc"), IMPORTED_ENV: str(folder / "imported")}
    if len(names) == 1:  # one process; side by side, each group's process is named by side_by_side.run
        run_env[PROCESS_ENV] = names[0]
    per_process = [(lists / f"{n}.txt").read_text().splitlines() if (lists / f"{n}.txt").is_file() else []
                   for n in names]
    files = [str(site / p) for p in compile_order(per_process, forked)]
    files = [f for f in files if os.path.isfile(f)]  # a file gone since (another release) is skipped
    compiler = None
    if files:
        listing = folder / "compile.txt"
        listing.write_text("".join(f"{f}\n" for f in files))
        # everyone writes into the (temporary) folder: the compiler skips what a pytest process compiled first, and
        # so gets ahead of it (with the processes not writing, it trailed them: contract probe 23 s, not 14 s);
        # with no list to compile, the processes write as the machine says (here not: ~4 s of CPU a process)
        run_env.pop("PYTHONDONTWRITEBYTECODE", None)
        compiler = subprocess.Popen([str(python), "-m", "compileall", "-qq", "-i", str(listing)], env=run_env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Prefetch(env=run_env, pytest_args=list(PLUGIN_ARGS), folder=folder, lists=lists, names=list(names),
                    site=site, compiler=compiler)
