"""bytecode.py + tiers/session/imported.py on a fake venv (this Python, a site-packages folder of its own): the listed files
are compiled into the suite's cache folder, the pytest process reads them from there (and writes what it compiled
itself, for the compiler to skip), what it imported becomes the next list, and nothing else is left behind."""

from __future__ import annotations

import marshal
import subprocess
import sys
from pathlib import Path

import pytest
from pyc_paths import pyc

from mtpmatrix.core.rows import RowError
from mtpmatrix.runner import bytecode
from mtpmatrix.tiers.session import imported

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def venv(tmp_path):
    """A venv-shaped folder whose site-packages holds pkg/{__init__,used,unused}.py."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg" / "used.py").write_text("VALUE = 41 + 1\n")
    (site / "pkg" / "unused.py").write_text("VALUE = 0\n")
    return tmp_path / "venv"


def test_listed_files_are_compiled_into_the_suites_folder_and_the_list_is_rewritten(venv, tmp_path):
    site = bytecode.site_packages(venv)
    lists = tmp_path / "cache" / "sglang-0.5.17-py3.11"
    lists.mkdir(parents=True)
    # the last one: another release's
    (lists / "one-contract.txt").write_text("pkg/__init__.py\npkg/used.py\npkg/gone_since.py\n")
    (lists / "one-reference.txt").write_text("pkg/unused.py\n")  # another kind of run's: not compiled for this one
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{SRC}:{site}"}
    pre = bytecode.start(venv, Path(sys.executable), lists, env, bytecode.process_names([], "contract"))
    assert pre.compiler is not None and pre.compiler.wait() == 0
    prefix = Path(pre.env["PYTHONPYCACHEPREFIX"])
    assert "PYTHONDONTWRITEBYTECODE" not in pre.env and pre.pytest_args == ["-p", "mtpmatrix.tiers.session.imported"]
    assert pyc(prefix, site / "pkg" / "used.py").is_file()
    assert not pyc(prefix, site / "pkg" / "unused.py").exists()  # only what this run's list names

    # proof that the cache is read: its pkg.used keeps the source's header (mtime, size) but holds other code
    cached = pyc(prefix, site / "pkg" / "used.py")
    cached.write_bytes(cached.read_bytes()[:16] + marshal.dumps(compile("VALUE = 43\n", "used.py", "exec")))
    # a pytest process with the suite's environment: imports pkg.used from the cache, lists what it imported
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_x.py").write_text(
        "def test_x():\n    import pkg.unused, pkg.used\n\n    assert pkg.used.VALUE == 43\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), *pre.pytest_args],
        env=pre.env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert pyc(prefix, site / "pkg" / "unused.py").is_file()  # compiled by the pytest process: the compiler skips it

    pre.finish()
    assert not prefix.parent.exists()  # the suite's folder is gone
    listed = (lists / "one-contract.txt").read_text().splitlines()
    assert "pkg/unused.py" in listed and "pkg/used.py" in listed and "pkg/gone_since.py" not in listed
    assert all(not p.startswith("/") for p in listed)
    assert (lists / "one-reference.txt").read_text() == "pkg/unused.py\n"  # untouched


def test_without_a_list_nothing_is_compiled_ahead(venv, tmp_path):
    env = {"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    pre = bytecode.start(venv, Path(sys.executable), tmp_path / "none", env, ["sglang", "reference"])
    assert pre.compiler is None and pre.env["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing to get ahead of: as before
    assert "MTPMATRIX_SUITE_PROCESS" not in pre.env  # side by side, side_by_side.run names each process
    pre.finish()
    assert not (tmp_path / "none").exists()  # nothing imported (no pytest ran): no list written


def test_turned_off_or_malformed(venv, tmp_path):
    env = {"MTPMATRIX_PRECOMPILE": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    pre = bytecode.start(venv, Path(sys.executable), tmp_path / "m", env, ["one-contract"])
    assert pre.env is env and pre.pytest_args == [] and pre.folder is None
    pre.finish()
    with pytest.raises(RowError, match=r"MTPMATRIX_PRECOMPILE='yes': use 1 .* or 0"):
        bytecode.enabled({"MTPMATRIX_PRECOMPILE": "yes"})


def test_imported_files_are_the_source_files_in_import_order(tmp_path):
    fake = {
        "b": type("M", (), {"__file__": "/site/b/x.py"}),
        "a": type("M", (), {"__file__": "/site/a.py"}),
        "ext": type("M", (), {"__file__": "/site/ext.so"}),
        "builtin": type("M", (), {}),
        "again": type("M", (), {"__file__": "/site/a.py"}),
    }
    assert imported.imported_files(fake) == ["/site/b/x.py", "/site/a.py"]


def test_side_by_side_the_processes_lists_are_compiled_in_turn_and_kept_apart(venv, tmp_path):
    """Each process's files in turn (its 1st, the other's 1st, ...); each process's imports become its own list,
    paths outside site-packages dropped."""
    site = bytecode.site_packages(venv)
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "sglang.txt").write_text("pkg/__init__.py\npkg/used.py\n")
    (lists / "reference.txt").write_text("pkg/__init__.py\npkg/unused.py\n")
    pre = bytecode.start(venv, Path(sys.executable), lists, {"PATH": "/bin"}, ["sglang", "reference"])
    pre.compiler.wait()
    assert (pre.folder / "compile.txt").read_text().splitlines() == [
        str(site / "pkg" / n) for n in ("__init__.py", "used.py", "unused.py")
    ]
    (pre.folder / "imported" / "imported-reference.txt").write_text(f"/usr/lib/python3.11/os.py\n{site}/pkg/x.py\n")
    pre.finish()
    assert (lists / "reference.txt").read_text() == "pkg/x.py\n"
    assert (lists / "sglang.txt").read_text() == "pkg/__init__.py\npkg/used.py\n"  # no new list: kept


def test_compile_order_interleaves_the_processes_and_forked_keeps_what_one_alone_imports():
    sglang = ["torch/a.py", "sglang/x.py", "torch/b.py", "sglang/y.py"]
    reference = ["torch/a.py", "torch/b.py", "transformers/t.py"]
    # side by side as separate interpreters: each file once, the processes' lists in turn
    assert bytecode.compile_order([sglang, reference]) == [
        "torch/a.py",
        "sglang/x.py",
        "torch/b.py",
        "transformers/t.py",
        "sglang/y.py",
    ]
    # forked from one interpreter that imports the shared files itself: the others first, in the same order, then
    # the shared ones from the last imported back
    assert bytecode.compile_order([sglang, reference], forked=True) == [
        "sglang/x.py",
        "transformers/t.py",
        "sglang/y.py",
        "torch/b.py",
        "torch/a.py",
    ]
    assert bytecode.compile_order([sglang], forked=True) == sglang  # one process shares nothing


def test_a_release_without_lists_uses_the_last_written_of_another_release(venv, tmp_path):
    """A bisect probe's release has no lists yet: its suite still compiles ahead, from the list another release of
    the same Python wrote last; what it imported becomes its own release's list (the other's stays)."""
    import os

    site = bytecode.site_packages(venv)
    cache = tmp_path / "bytecode"
    older, newer, other_python = (
        cache / "sglang-0.5.13-py3.11",
        cache / "sglang-0.5.17-py3.11",
        cache / "sglang-0.5.23-py3.12",
    )
    for folder, listed in (
        (older, "pkg/unused.py\n"),
        (newer, "pkg/__init__.py\npkg/used.py\n"),
        (other_python, "pkg/unused.py\n"),
    ):
        folder.mkdir(parents=True)
        (folder / "one-contract.txt").write_text(listed)
    os.utime(older / "one-contract.txt", (1, 1))  # written long ago
    probe = cache / "sglang-0.5.15-py3.11"
    assert bytecode.read_lists(probe, ["one-contract", "one-reference"]) == [["pkg/__init__.py", "pkg/used.py"], []]
    pre = bytecode.start(venv, Path(sys.executable), probe, {"PATH": "/bin"}, ["one-contract"])
    assert pre.compiler.wait() == 0
    assert (pre.folder / "compile.txt").read_text().splitlines() == [
        str(site / "pkg" / n) for n in ("__init__.py", "used.py")
    ]
    (pre.folder / "imported" / "imported-one-contract.txt").write_text(f"{site}/pkg/used.py\n")
    pre.finish()
    assert (probe / "one-contract.txt").read_text() == "pkg/used.py\n"
    assert (newer / "one-contract.txt").read_text() == "pkg/__init__.py\npkg/used.py\n"  # the other's stays
