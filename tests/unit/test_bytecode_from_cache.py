"""bytecode_from_cache.py + bytecode.start_while_installing on a fake uv cache and venv (this Python): the listed files
are compiled from the cache's copies while the "install" runs, the venv's own once it is done; a copy that is not
the venv's file is never run; stopping kills every worker."""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.runner import bytecode, bytecode_from_cache as from_cache

SRC = Path(__file__).resolve().parents[2] / "src"


def _pyc(prefix: Path, source: Path) -> Path:
    """Where Python looks for ``source``'s bytecode under PYTHONPYCACHEPREFIX=prefix."""
    return prefix / str(source.parent).lstrip("/") / Path(importlib.util.cache_from_source(str(source))).name


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


def test_each_folder_finds_the_wheel_whose_copy_is_the_venvs_file(installed, tmp_path):
    venv, site, cache = installed
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "sglang.txt").write_text("".join(f"{p}\n" for p in LISTED))
    bytecode.write_sources(lists, site, ["sglang"])
    sources = json.loads((lists / bytecode.SOURCES).read_text())["folders"]
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
        assert from_cache.compile_one("pkg/__init__.py", str(cache / "archive-v0" / "bbb" / "pkg" / "__init__.py"),
                                      str(site))
        assert not from_cache.compile_one("pkg/mod.py", None, str(site))  # there already: skipped
        assert not from_cache.compile_one("pkg/gone.py", str(cache / "pruned.py"), str(site))  # unreadable: skipped
    finally:
        sys.pycache_prefix = saved
    wrong = _pyc(prefix, site / "pkg" / "mod.py")
    assert wrong.read_bytes()[4:8] == (3).to_bytes(4, "little")  # flags: hash-based, checked
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"], env=env,
                          capture_output=True, text=True)
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
    pyc = _pyc(prefix, site / "pkg" / "mod.py")
    pyc.write_bytes(pyc.read_bytes()[:16] + marshal.dumps(compile("VALUE = 43\n", str(site / "pkg" / "mod.py"),
                                                                  "exec")))
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE, pkg.mod.__file__)"],
                          env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["43", str(site / "pkg" / "mod.py")], done.stderr


def _start(venv, tmp_path, cache, names=("sglang",)):
    lists = tmp_path / "lists"
    lists.mkdir(exist_ok=True)
    (lists / "sglang.txt").write_text("".join(f"{p}\n" for p in LISTED))
    bytecode.write_sources(lists, bytecode.site_packages(venv), list(names))
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"}
    return lists, env, bytecode.start_while_installing(venv, Path(sys.executable), lists, env, list(names), cache)


def test_a_worker_compiles_the_copies_while_installing_and_the_venvs_own_after(installed, tmp_path, monkeypatch):
    """The install's end is the worker's standard input ending (here a pipe the test closes)."""
    venv, site, cache = installed
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "sglang.txt").write_text("".join(f"{p}\n" for p in LISTED))
    bytecode.write_sources(lists, site, ["sglang"])
    sources = json.loads((lists / bytecode.SOURCES).read_text())["folders"]
    todo = from_cache.plan(LISTED, from_cache.folder_sources(sources, from_cache.archive_index(str(cache))))
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read))
    prefix = tmp_path / "pyc"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    pycs = {p: _pyc(prefix, site / p) for p in LISTED}
    assert from_cache.work(todo, str(site), keep_on=False) == 3  # installing: the three copies, no venv file
    assert not any(pycs[p].exists() for p in VENV_OWN)
    assert all(pycs[p].read_bytes()[4:8] == (3).to_bytes(4, "little") for p in LISTED[:3])  # checked hash
    os.close(write)  # the install is done
    assert from_cache.work(todo, str(site), keep_on=False) == 0  # a worker that does not go on stops
    assert from_cache.work(todo, str(site), keep_on=True) == 2  # the one that does: the venv's own files
    assert all(pycs[p].read_bytes()[4:8] == bytes(4) for p in VENV_OWN)  # as Python writes them: timestamp


def test_the_runner_hands_the_compiler_to_the_suite(installed, tmp_path):
    venv, site, cache = installed
    lists, env, installing = _start(venv, tmp_path, cache)
    assert installing is not None
    pre = bytecode.start(venv, Path(sys.executable), lists, env, ["sglang"], installing=installing)
    prefix = installing.folder / "pyc"
    assert pre.compiler is installing.compiler and pre.env["PYTHONPYCACHEPREFIX"] == str(prefix)
    assert "PYTHONDONTWRITEBYTECODE" not in pre.env
    assert installing.compiler.wait() == 0  # start() said the install is done: it compiled all and ended
    flags = {p: _pyc(prefix, site / p).read_bytes()[4:8] for p in LISTED}
    assert flags == {**{p: (3).to_bytes(4, "little") for p in LISTED[:3]}, **{p: bytes(4) for p in VENV_OWN}}
    pre.finish()
    assert not installing.folder.exists() and (lists / bytecode.SOURCES).is_file()


def test_stopping_kills_every_worker(installed, tmp_path):
    """A compiler that forked a worker (here a stand-in: a child that sleeps, its pid said on stdout, the event the
    test waits on) is killed with its worker; killing only the compiler leaves the worker: ProcessLookupError not
    raised."""
    venv, site, cache = installed
    _lists, _env, installing = _start(venv, tmp_path, cache)
    assert os.getpgid(installing.compiler.pid) == installing.compiler.pid  # a process group of its own
    installing.stop()
    code = "import os, sys, time\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\n    time.sleep(3600)\n" \
           "time.sleep(3600)\n"
    stand_in = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, process_group=0)
    worker = os.pidfd_open(int(stand_in.stdout.readline()))  # readable once the worker has ended
    folder = tmp_path / "stand-in"
    folder.mkdir()
    bytecode.Installing(folder=folder, compiler=stand_in).stop()
    # a hang limit, not a margin: the worker ends within milliseconds of the kill, or never without it
    assert select.select([worker], [], [], 60)[0], "the compiler's worker outlived stop()"
    os.close(worker)
    assert not folder.exists()


def test_nothing_starts_without_what_it_needs(installed, tmp_path):
    venv, site, cache = installed
    env = {"PATH": "/bin"}
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "sglang.txt").write_text("pkg/mod.py\n")
    # no sources.json (the first row of a release, or one from before this): bytecode.start compiles as before
    assert bytecode.start_while_installing(venv, Path(sys.executable), lists, env, ["sglang"], cache) is None
    bytecode.write_sources(lists, site, ["sglang"])
    assert bytecode.start_while_installing(venv, Path(sys.executable), lists, env, ["sglang"], None) is None
    assert bytecode.start_while_installing(venv, Path(sys.executable), lists, {"MTPMATRIX_PRECOMPILE": "0"},
                                           ["sglang"], cache) is None
    assert bytecode.start_while_installing(venv, tmp_path / "no-python", lists, env, ["sglang"], cache) is None


def test_a_compiler_that_failed_while_installing_is_replaced(installed, tmp_path):
    venv, site, cache = installed
    lists, env, installing = _start(venv, tmp_path, cache)
    installing.stop()  # as if it had died: killed, exit status not 0
    installing.folder.mkdir(parents=True)
    (installing.folder / "imported").mkdir()
    pre = bytecode.start(venv, Path(sys.executable), lists, env, ["sglang"], installing=installing)
    assert pre.compiler is not installing.compiler and pre.compiler.wait() == 0  # compileall, as before
    assert _pyc(Path(pre.env["PYTHONPYCACHEPREFIX"]), site / "pkg" / "own.py").is_file()
    pre.finish()
