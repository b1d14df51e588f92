"""A row's imports compiled on the spare core, ahead of the pytest processes that import them.

Why: a row's venv is new, so it holds no bytecode (and this machine sets PYTHONDONTWRITEBYTECODE=1, so none is ever
kept), and compiling is about half of ``import sglang.srt.models.gemma4_mtp``: 21.6 s of CPU from source, 10.3 s from
bytecode (0.5.17 row, ~6,700 files). Compiling needs no import, so while the pytest processes start,
``python -m compileall`` in the row's venv compiles the files the row's suite imported last time, in import order,
into a folder that the pytest processes share as their PYTHONPYCACHEPREFIX; a file not compiled yet they compile
themselves and write there, and the compiler skips it. The contract tier's one long import then runs at the pace of
executing modules, not compiling them (its process: 33 s of CPU without, 19 s with, same machine).

Nothing outlives the suite: the folder is new for every suite and removed after it, and Python checks each cached
file against its source before using it (mtime and size; the hash of its bytes for those compiled from uv's
cache). What persists is one list of files per pytest process (``.cache/bytecode/sglang-<version>-py<python>/
<process>.txt``, paths relative to site-packages, so every probe of a bisect shares them), rewritten from what that
process imported (mtpmatrix.tiers.session.imported), and ``sources.json`` (below); without a list (the first row of a
release) the suite runs as before. ``MTPMATRIX_PRECOMPILE=0`` turns this off.

Most of the compiling can start earlier, while the row installs (``start_while_installing``): the install waits on
the package index with the cores idle, and uv's cache already holds the bytes it will link into the venv
(mtpmatrix.runner.bytecode_from_cache says how, and why a copy that is not the venv's file is never run). For that
the lists folder also keeps ``sources.json``: per folder of listed files, one file's path and inode in the venv. Once
the suite starts, those workers stop and the compiler above takes what they left, from the venv.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.paths import REPO
from mtpmatrix.core.rows import Row, RowError
from mtpmatrix.core.schema import parse_tiers
from mtpmatrix.runner import bytecode_from_cache
from mtpmatrix.tiers.session.imported import ENV as IMPORTED_ENV
from mtpmatrix.tiers.session.imported import PROCESS_ENV

ENV_KNOB = "MTPMATRIX_PRECOMPILE"
SOURCES = "sources.json"
# processes compiling from uv's cache while the install waits on the index (its own work: under half a core, measured)
INSTALL_WORKERS = 2
CACHE = REPO / ".cache" / "bytecode"
PLUGIN_ARGS = ["-p", "mtpmatrix.tiers.session.imported"]


def enabled(env: dict | None = None) -> bool:
    """``MTPMATRIX_PRECOMPILE``: unset or "1" on, "0" off; RowError (one line) for anything else."""
    value = (os.environ if env is None else env).get(ENV_KNOB, "").strip()
    if value not in ("", "0", "1"):
        raise RowError(
            f"{ENV_KNOB}={value!r}: use 1 (compile the row's imports ahead: during the install and on the "
            "spare core) or 0"
        )
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
        if self.lists is not None and self.site is not None and self.lists.is_dir():
            write_sources(self.lists, self.site, self.names)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _relative(self, path: str) -> str | None:
        """``path`` relative to the venv's site-packages; None outside it (the standard library, this project)."""
        for root in {os.path.join(str(self.site), ""), os.path.join(os.path.realpath(self.site), "")}:
            if path.startswith(root):
                return path[len(root) :]
        return None


def write_sources(lists: Path, site: Path, names: list[str]) -> None:
    """``sources.json``: per folder of the files in the lists ``names``, the first one's path and its inode in the
    venv (bytecode_from_cache finds the folder's copy in uv's cache by it), added to what the file held: each kind of
    run (a row, a one-tier probe) keeps only its own lists, and none may drop the others' folders."""
    try:
        folders: dict[str, list] = read_json(lists / SOURCES)["folders"]
    except (OSError, ValueError, KeyError, TypeError):
        folders = {}
    seen: set[str] = set()
    for name in names:
        listed = lists / f"{name}.txt"
        for rel in listed.read_text().splitlines() if listed.is_file() else []:
            folder = bytecode_from_cache.folder_key(rel)
            if folder not in seen:
                try:
                    folders[folder] = [rel, os.stat(site / rel).st_ino]
                except OSError:
                    continue
                seen.add(folder)
    atomic_write_json(lists / SOURCES, {"folders": folders})


def _listed(lists: Path, file: str) -> Path | None:
    """``lists/file`` (a process's list, or sources.json); without it, the same file of the other release of this
    Python whose copy was written last. Why: a bisect probe installs a release no row has run here, and without a
    list its suite compiled as it imported (0.5.13 contract probe with no list of its own: 35.3 s, 1.21 x its floor,
    compiling nothing ahead; 30.1 s, 1.04 x, from 0.5.17's lists). Its torch,
    transformers and the rest are the same files as the other release's; a file the probe's release lacks is skipped,
    one it changed is compiled again by the import (and a cached copy of the other release's fails its hash check)."""
    own = lists / file
    if own.is_file():
        return own
    python = lists.name.rpartition("-py")[2]
    others = [
        d / file
        for d in (lists.parent.iterdir() if lists.parent.is_dir() else [])
        if d != lists and d.name.endswith(f"-py{python}") and (d / file).is_file()
    ]
    return max(others, key=lambda p: p.stat().st_mtime) if others else None


def read_lists(lists: Path, names: list[str]) -> list[list[str]]:
    """Each process's list of files (``_listed``: its release's, or the last written of another release)."""
    found = [_listed(lists, f"{n}.txt") for n in names]
    return [f.read_text().splitlines() if f is not None else [] for f in found]


def compile_order(per_process: list[list[str]], forked: bool = False) -> list[str]:
    """The files of the processes' lists, each once: each process's in turn (its 1st, the other's 1st, its 2nd,
    ...: the processes import side by side, so the compiler stays ahead of each). ``forked`` (the processes are
    forked from one interpreter that first imports what they share, mtpmatrix.tiers.session.fork): first the files
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


def _suite_folder() -> Path:
    # in memory where the system has a tmpfs: ~200 MB written and read back within the suite, never kept
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="mtpmatrix-bytecode-", dir=shm if shm.is_dir() else None))
    (folder / "imported").mkdir()
    return folder


@dataclass
class Installing:
    """The workers ``start_while_installing`` started; ``done()`` when the suite starts (they stop, and
    bytecode.start compiles what they left), ``stop()`` when it failed or the row stops before its suite."""

    folder: Path
    workers: list[subprocess.Popen]

    def done(self) -> None:
        """Close each worker's standard input (its signal: bytecode_from_cache.install_done) and wait for it: each
        ends after the file it is compiling."""
        for worker in self.workers:
            if worker.stdin is not None and not worker.stdin.closed:
                worker.stdin.close()
        for worker in self.workers:
            worker.wait()

    def stop(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.kill()
        self.done()
        shutil.rmtree(self.folder, ignore_errors=True)


def uv_cache_dir(uv: str, env: dict) -> Path | None:
    """uv's cache folder as ``uv`` sees it with ``env`` (UV_CACHE_DIR, --no-cache ...); None when it says none."""
    try:
        done = subprocess.run([uv, "cache", "dir"], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    path = done.stdout.strip()
    return Path(path) if done.returncode == 0 and path else None


def start_while_installing(
    venv: Path, python: Path, lists: Path, env: dict, names: list[str], uv: str
) -> Installing | None:
    """Before the row's install: compile the files of the lists ``names`` from their copies in ``uv``'s cache
    (mtpmatrix.runner.bytecode_from_cache: INSTALL_WORKERS processes of the empty venv's Python) into a new suite
    folder. None (bytecode.start then works as before) when turned off, without a venv Python, the last suite's
    ``sources.json`` or a uv cache."""
    site = site_packages(venv)
    sources = _listed(lists, SOURCES)
    if not enabled(env) or site is None or not Path(python).exists() or sources is None:
        return None
    files = compile_order(read_lists(lists, names))
    cache = uv_cache_dir(uv, env) if files else None
    if cache is None:
        return None
    folder = _suite_folder()
    spec = {
        "prefix": str(folder / "pyc"),
        "site": str(site),
        "files": files,
        "sources": str(sources),
        "cache": str(cache),
        "runner": os.getpid(),
    }
    (folder / "from-cache.json").write_text(json.dumps(spec))
    script = Path(__file__).with_name("bytecode_from_cache.py")
    installing = Installing(folder=folder, workers=[])
    try:
        for k in range(INSTALL_WORKERS):
            # -I: nothing of the row is installed yet, and nothing of this environment's PYTHONPATH may stand in
            installing.workers.append(
                subprocess.Popen(
                    [str(python), "-I", str(script), str(folder / "from-cache.json"), str(k), str(INSTALL_WORKERS)],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    except BaseException:
        installing.stop()
        raise
    return installing


def start(
    venv: Path,
    python: Path,
    lists: Path,
    env: dict,
    names: list[str],
    forked: bool = False,
    installing: Installing | None = None,
) -> Prefetch:
    """Start compiling the files of the lists ``names`` (``process_names``) in ``lists`` that are still in the venv,
    in ``compile_order``, in ``venv``'s Python; given the workers ``start_while_installing`` started, stop them and
    compile only what they left, in their folder. The returned Prefetch carries the pytest processes' environment.
    A no-op Prefetch (``env`` unchanged) when turned off or the venv has no site-packages."""
    site = site_packages(venv)
    if not enabled(env) or site is None:
        if installing is not None:
            installing.stop()
        return Prefetch(env=env)
    folder = installing.folder if installing is not None else _suite_folder()
    run_env = {**env, "PYTHONPYCACHEPREFIX": str(folder / "pyc"), IMPORTED_ENV: str(folder / "imported")}
    if len(names) == 1:  # one process; side by side, each group's process is named by side_by_side.run
        run_env[PROCESS_ENV] = names[0]
    files = [str(site / p) for p in compile_order(read_lists(lists, names), forked)]
    files = [f for f in files if os.path.isfile(f)]  # a file gone since (another release) is skipped
    if installing is not None:
        installing.done()
        # what they compiled is skipped here, not left to compileall: it would redo each (it only recognises the
        # timestamp pycs it writes itself)
        cached, tag = run_env["PYTHONPYCACHEPREFIX"], _cache_tag(site)
        files = [f for f in files if not os.path.exists(_cache_path(cached, f, tag))]
    if files or installing is not None:
        # everyone writes into the (temporary) folder: the compiler skips what a pytest process compiled first, and
        # so gets ahead of it (with the processes not writing, it trailed them: contract probe 23 s, not 14 s);
        # with nothing compiled ahead, the processes write as the machine says (here not: ~4 s of CPU a process)
        run_env.pop("PYTHONDONTWRITEBYTECODE", None)
    compiler = None
    if files:
        listing = folder / "compile.txt"
        listing.write_text("".join(f"{f}\n" for f in files))
        compiler = subprocess.Popen(
            [str(python), "-m", "compileall", "-qq", "-i", str(listing)],
            env=run_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return Prefetch(
        env=run_env,
        pytest_args=list(PLUGIN_ARGS),
        folder=folder,
        lists=lists,
        names=list(names),
        site=site,
        compiler=compiler,
    )


def _cache_tag(site: Path) -> str:
    """The venv's Python's bytecode tag (``cpython-311``), read off its site-packages path (lib/python3.11/...)."""
    found = re.search(r"python(\d+)\.(\d+)", str(site))
    return f"cpython-{found[1]}{found[2]}" if found else sys.implementation.cache_tag


def _cache_path(prefix: str, source: str, tag: str) -> str:
    """Where Python looks for ``source``'s bytecode under PYTHONPYCACHEPREFIX=prefix (importlib's rule)."""
    folder, name = os.path.split(source)
    return os.path.join(prefix, folder.lstrip(os.sep), f"{os.path.splitext(name)[0]}.{tag}.pyc")
