"""bytecode_from_cache.py + bytecode.start_while_installing on a fake uv cache and venv (this Python): the listed files
are compiled from the cache's copies while the "install" runs, and what they left from the venv once it is done; a
copy that is not the venv's file is never run; no worker outlives the row."""

from __future__ import annotations

import json
import marshal
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from pyc_paths import pyc

from mtpmatrix.runner import bytecode
from mtpmatrix.runner import bytecode_from_cache as from_cache

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def installed(tmp_path):
    """A uv cache with two wheels (pkg 1 and pkg 2, both ``pkg/``) and a top-level module, and a venv whose
    site-packages links pkg 2's files and the module from it (as uv installs: hard links), plus ``pkg/own.py``, a
    file its wheel lacks, and ``other/thing.py``, a folder no wheel has. Returns (venv, site, cache)."""
    cache = tmp_path / "uv-cache"
    old, new = cache / "archive-v0" / "aaa", cache / "archive-v0" / "bbb"
    for archive, value in ((old, 1), (new, 2)):
        (archive / "pkg").mkdir(parents=True)
        (archive / "pkg" / "__init__.py").write_text("")
        (archive / "pkg" / "mod.py").write_text(f"VALUE = {value}\n")
    (new / "single.py").write_text("ONE = 1\n")
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    for rel in ("pkg/__init__.py", "pkg/mod.py", "single.py"):
        os.link(new / rel, site / rel)
    (site / "pkg" / "own.py").write_text("OWN = 3\n")
    (site / "other").mkdir()
    (site / "other" / "thing.py").write_text("THING = 4\n")
    return venv, site, cache


LISTED = ["pkg/__init__.py", "pkg/mod.py", "single.py", "pkg/own.py", "other/thing.py"]
VENV_OWN = LISTED[3:]  # no copy of them in the cache: compiled from the venv once it is installed


def _recorded(tmp_path, site, names=("sglang",)):
    """A lists folder as a row leaves it: ``sglang.txt`` naming LISTED and the ``sources.json`` written for
    ``names``. Returns (lists, sources.json's folders)."""
    lists = tmp_path / "lists"
    lists.mkdir(exist_ok=True)
    (lists / "sglang.txt").write_text("".join(f"{p}\n" for p in LISTED))
    bytecode.write_sources(lists, site, list(names))
    return lists, json.loads((lists / bytecode.SOURCES).read_text())["folders"]


def _copies(sources, cache):
    """(relative path, its copy in the cache or None) for LISTED, as a worker plans them."""
    return from_cache.plan(LISTED, from_cache.folder_sources(sources, from_cache.archive_index(str(cache))))


def _fake_uv(tmp_path, cache) -> str:
    """A uv that answers what the runner asks it, `uv cache dir`, with ``cache``."""
    uv = tmp_path / "uv"
    uv.write_text(f"#!/bin/sh\necho {cache}\n")
    uv.chmod(0o755)
    return str(uv)


def test_each_folder_finds_the_wheel_whose_copy_is_the_venvs_file(installed, tmp_path):
    venv, site, cache = installed
    _lists, sources = _recorded(tmp_path, site)
    assert set(sources) == {"pkg", "single.py", "other"}  # a folder, or a top-level module by itself
    index = from_cache.archive_index(str(cache))
    old, new = str(cache / "archive-v0" / "aaa"), str(cache / "archive-v0" / "bbb")
    assert sorted(index["pkg"]) == [old, new] and index["single.py"] == [new] and "other" not in index
    # pkg/ is in both wheels: the one whose file has the venv's inode, in whichever order the cache lists them
    for order in ([old, new], [new, old]):
        found = from_cache.folder_sources(sources, {**index, "pkg": order})
        assert found == {"pkg": new, "single.py": new}
    assert from_cache.plan(LISTED, found)[1] == ("pkg/mod.py", str(cache / "archive-v0" / "bbb" / "pkg" / "mod.py"))
    # a cache without archive-v0 (another uv layout): nothing found, every file compiled from the venv later
    assert from_cache.archive_index(str(tmp_path / "nowhere")) == {}


def test_a_copy_that_is_not_the_venvs_file_is_never_run(installed, tmp_path):
    """The old wheel's pkg/mod.py (VALUE = 1) compiled as if it were the venv's (VALUE = 2): Python checks the hash
    of the venv's source and compiles that instead. With an unchecked pyc (PEP 552's other kind) the old code runs:
    this test then fails with VALUE == 1."""
    venv, site, cache = installed
    prefix = tmp_path / "pyc"
    sys.pycache_prefix, saved = str(prefix), sys.pycache_prefix
    try:
        assert from_cache.compile_one("pkg/mod.py", str(cache / "archive-v0" / "aaa" / "pkg" / "mod.py"), str(site))
        assert from_cache.compile_one(
            "pkg/__init__.py", str(cache / "archive-v0" / "bbb" / "pkg" / "__init__.py"), str(site)
        )
        assert not from_cache.compile_one(
            "pkg/mod.py", str(cache / "archive-v0" / "bbb" / "pkg" / "mod.py"), str(site)
        )  # there already: skipped
        assert not from_cache.compile_one("pkg/gone.py", str(cache / "pruned.py"), str(site))  # unreadable: skipped
    finally:
        sys.pycache_prefix = saved
    wrong = pyc(prefix, site / "pkg" / "mod.py")
    assert wrong.read_bytes()[4:8] == (3).to_bytes(4, "little")  # flags: hash-based, checked
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "2", done.stderr


def test_the_right_copy_is_what_the_import_runs(installed, tmp_path):
    """Proof the compiled copy is used at all: its code swapped for other code under the same source hash."""
    venv, site, cache = installed
    prefix = tmp_path / "pyc"
    sys.pycache_prefix, saved = str(prefix), sys.pycache_prefix
    try:
        from_cache.compile_one("pkg/mod.py", str(cache / "archive-v0" / "bbb" / "pkg" / "mod.py"), str(site))
    finally:
        sys.pycache_prefix = saved
    cached = pyc(prefix, site / "pkg" / "mod.py")
    cached.write_bytes(
        cached.read_bytes()[:16] + marshal.dumps(compile("VALUE = 43\n", str(site / "pkg" / "mod.py"), "exec"))
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE, pkg.mod.__file__)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.stdout.split() == ["43", str(site / "pkg" / "mod.py")], done.stderr


def _start(venv, tmp_path, cache, names=("sglang",)):
    lists, _sources = _recorded(tmp_path, bytecode.site_packages(venv), names)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    return (
        lists,
        env,
        bytecode.start_while_installing(venv, Path(sys.executable), lists, env, list(names), _fake_uv(tmp_path, cache)),
    )


@pytest.fixture
def started(installed, tmp_path):
    """(venv, site, lists, env, Installing), stopped after the test whatever happened in it."""
    venv, site, cache = installed
    lists, env, installing = _start(venv, tmp_path, cache)
    assert installing is not None
    yield venv, site, lists, env, installing
    installing.stop()


def test_a_worker_compiles_the_copies_until_the_install_is_done(installed, tmp_path, monkeypatch):
    """The install's end is the worker's standard input ending (here a pipe the test closes)."""
    venv, site, cache = installed
    _lists, sources = _recorded(tmp_path, site)
    todo = _copies(sources, cache)
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read))
    prefix = tmp_path / "pyc"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    pycs = {p: pyc(prefix, site / p) for p in LISTED}
    assert from_cache.work(todo[3:], str(site)) == 0  # the venv's own files are not its to compile
    os.close(write)  # the install is done: nothing more
    assert from_cache.work(todo, str(site)) == 0 and not any(p.exists() for p in pycs.values())
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read))
    assert from_cache.work(todo, str(site)) == 3  # installing: the three copies
    assert all(pycs[p].read_bytes()[4:8] == (3).to_bytes(4, "little") for p in LISTED[:3])  # checked hash
    assert not any(pycs[p].exists() for p in VENV_OWN)
    os.close(write)


def test_the_suite_compiles_what_the_workers_left(started, tmp_path):
    venv, site, lists, env, installing = started
    prefix = installing.folder / "pyc"
    with_copies = _copies(json.loads((lists / bytecode.SOURCES).read_text())["folders"], tmp_path / "uv-cache")
    saved, sys.pycache_prefix = sys.pycache_prefix, str(prefix)
    try:  # as if the workers had got through their shares (they may be writing the same files: each is skipped)
        for rel, copy in with_copies[:3]:
            from_cache.compile_one(rel, copy, str(site))
    finally:
        sys.pycache_prefix = saved
    by_workers = {p for p in LISTED if pyc(prefix, site / p).exists()}
    assert by_workers == set(LISTED[:3])  # the copies
    pre = bytecode.start(venv, Path(sys.executable), lists, env, ["sglang"], installing=installing)
    assert pre.env["PYTHONPYCACHEPREFIX"] == str(prefix) and "PYTHONDONTWRITEBYTECODE" not in pre.env
    # the suite's compiler is given only what they left (compileall would redo their hash-based pycs)
    listing = (installing.folder / "compile.txt").read_text().splitlines()
    assert listing == [str(site / p) for p in LISTED if p not in by_workers]
    assert pre.compiler.wait() == 0
    assert all(pyc(prefix, site / p).read_bytes()[4:8] == bytes(4) for p in VENV_OWN)  # timestamp, from the venv
    pre.finish()
    assert not installing.folder.exists() and (lists / bytecode.SOURCES).is_file()


def test_stopping_ends_every_worker_and_removes_the_folder(started):
    venv, site, lists, env, installing = started
    assert len(installing.workers) == bytecode.INSTALL_WORKERS
    ends = [os.pidfd_open(w.pid) for w in installing.workers]  # readable once each has ended
    installing.stop()  # the install failed
    # a hang limit, not a margin: a killed worker ends within milliseconds, or never
    assert all(select.select([fd], [], [], 60)[0] for fd in ends)
    assert all(w.returncode is not None for w in installing.workers) and not installing.folder.exists()


def test_a_row_whose_install_fails_leaves_no_worker(installed, tmp_path, monkeypatch):
    """run_row's wiring: the install fails (a uv that exits 1), and the workers it started are gone with their
    folder. Without run_row's stop, this fails on the workers left running."""
    from mtpmatrix.core.rows import load_rows
    from mtpmatrix.runner import matrix, uv_install

    venv, site, cache = installed
    lists, env, _installing = _start(venv, tmp_path, cache)
    _installing.stop()
    made = []
    real = bytecode.start_while_installing

    def spy(*args, **kwargs):
        made.append(real(venv, Path(sys.executable), lists, env, ["sglang"], str(tmp_path / "uv")))
        return made[-1]

    monkeypatch.setattr(bytecode, "start_while_installing", spy)
    failing = tmp_path / "failing-uv"
    failing.write_text("#!/bin/sh\necho 'error: no solution found' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(uv_install, "find_uv", lambda: str(failing))
    row = load_rows(Path(__file__).resolve().parents[2] / "constraints")[0]
    record = matrix.run_row(
        row, venv, matrix.Options(results=tmp_path / "results", tiers="contract"), log=lambda _m: None
    )
    assert record["install"]["verdict"] == "failed"
    assert made and made[0] is not None
    assert all(w.returncode is not None for w in made[0].workers) and not made[0].folder.exists()


def test_nothing_starts_without_what_it_needs(installed, tmp_path):
    venv, site, cache = installed
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "sglang.txt").write_text("pkg/mod.py\n")
    uv = _fake_uv(tmp_path, cache)
    env = {"PATH": "/bin"}
    # no sources.json (the first row of a release, or one from before this): bytecode.start compiles as before
    assert bytecode.start_while_installing(venv, Path(sys.executable), lists, env, ["sglang"], uv) is None
    bytecode.write_sources(lists, site, ["sglang"])
    assert (
        bytecode.start_while_installing(venv, Path(sys.executable), lists, env, ["sglang"], str(tmp_path / "no-uv"))
        is None
    )
    assert (
        bytecode.start_while_installing(
            venv, Path(sys.executable), lists, {"MTPMATRIX_PRECOMPILE": "0"}, ["sglang"], uv
        )
        is None
    )
    assert bytecode.start_while_installing(venv, tmp_path / "no-python", lists, env, ["sglang"], uv) is None


def test_each_kind_of_run_adds_its_folders(installed, tmp_path):
    """A one-tier probe's lists name fewer folders than a row's: writing its sources must not drop the row's."""
    venv, site, cache = installed
    lists, _sources = _recorded(tmp_path, site)
    (lists / "one-gsm8k.txt").write_text("single.py\n")
    bytecode.write_sources(lists, site, ["one-gsm8k"])
    assert set(json.loads((lists / bytecode.SOURCES).read_text())["folders"]) == {"pkg", "single.py", "other"}


def test_a_worker_whose_runner_died_removes_the_folder(installed, tmp_path):
    """The runner (here a stand-in that starts one worker, says its pid and exits) dies during the install: the
    worker's input ends, and with nobody left to remove the suite's folder, worker 0 does. Without that, the folder
    (up to ~200 MB in /dev/shm) outlives the row."""
    venv, site, cache = installed
    lists, env, installing = _start(venv, tmp_path, cache)
    installing.stop()
    folder = tmp_path / "suite-folder"
    folder.mkdir()
    spec = {
        "prefix": str(folder / "pyc"),
        "site": str(site),
        "files": LISTED,
        "sources": str(lists / "sources.json"),
        "cache": str(cache),
    }
    script = Path(from_cache.__file__)
    runner = (
        "import json, os, subprocess, sys\n"
        f"spec = json.loads({json.dumps(spec)!r})\n"
        f"open({str(tmp_path / 'spec.json')!r}, 'w').write(json.dumps({{**spec, 'runner': os.getpid()}}))\n"
        f"w = subprocess.Popen([sys.executable, '-I', {str(script)!r}, {str(tmp_path / 'spec.json')!r}, '0',"
        " '1'], stdin=subprocess.PIPE)\n"
        "print(w.pid, flush=True)\n"
    )  # exits at once: its end of the worker's input closes with it
    said = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, check=True)
    worker = os.pidfd_open(int(said.stdout))
    assert select.select([worker], [], [], 60)[0], "the worker did not end"  # a hang limit: it ends at once
    os.close(worker)
    assert not folder.exists()
