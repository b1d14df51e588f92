"""``python bytecode_from_cache.py SPEC K N``: a row's imports compiled from uv's cache while the row installs.

Why (issue #21): a row's install spends most of its time waiting on the package index (uv resolves 215 packages:
5.7 s of 8.3 s on this machine, under half a core busy), while the suite that follows spends ~14 s of CPU compiling
the ~8,000 files its processes import (mtpmatrix.runner.bytecode). Compiling needs only each file's bytes, and uv
installs a file as a hard link to its unpacked copy in uv's cache: the bytes the venv will hold are there before the
install ends. So this compiles them then, on the cores the install leaves idle, at the lowest priority.

Which copy: ``sources.json`` (next to the lists, kept by bytecode.Prefetch.finish) holds, per folder of listed
files, one file's path and inode as the venv had it. A folder's copy is the one in ``<uv cache>/archive-v0/*/`` with
that file at that path and that inode. A folder with none (another release, a pruned cache, a copying link mode) is
left to bytecode.start's compiler, which compiles what is still missing from the venv when the suite starts.

Why it is safe: a file compiled from the cache is written as a *checked hash-based* pyc (PEP 552): Python hashes the
venv's source at every import and uses the bytecode only when the bytes are the same, so a copy that is not the
venv's file (a newer release installed since, a wrong match) costs a compile and is never run. Measured: checking
the hashes adds 0.1 s to the 0.5.17 suite's 7.5 s import.

SPEC (JSON): ``prefix`` (the suite's PYTHONPYCACHEPREFIX), ``site`` (the venv's site-packages), ``files`` (paths
relative to it, in the order to compile), ``sources`` (sources.json's path), ``cache`` (uv's cache folder),
``runner`` (the pid of the process that starts the workers). Worker K of N takes every N-th file from the K-th, and
ends when its standard input ends: the runner closes it when the suite starts (after the install), and the pipe ends
as well when the runner dies (worker 0 then removes the folder). Standard library only: it runs in the row's venv
before anything is installed there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import select
import shutil
import sys

ARCHIVES = "archive-v0"  # uv's unpacked wheels (seen up to uv 0.13.9): one folder per wheel, its files as installed


def archive_index(cache: str) -> dict[str, list[str]]:
    """Top-level name (``torch``, ``six.py``) -> the archive folders that hold it."""
    index: dict[str, list[str]] = {}
    try:
        archives = list(os.scandir(os.path.join(cache, ARCHIVES)))
    except OSError:
        return index
    for archive in archives:
        try:
            for entry in os.scandir(archive.path):
                index.setdefault(entry.name, []).append(archive.path)
        except OSError:  # not a folder, or gone since
            continue
    return index


def folder_key(rel: str) -> str:
    """What one recorded copy stands for: a file's folder, or the file itself at the top level (each top-level
    module, ``six.py``, is a wheel of its own)."""
    return os.path.dirname(rel) or rel


def folder_sources(sources: dict, index: dict[str, list[str]]) -> dict[str, str]:
    """Folder (``folder_key``) -> the archive whose copy of the folder's recorded file has the recorded inode."""
    found = {}
    for folder, (sample, inode) in sources.items():
        for archive in index.get(sample.split("/", 1)[0], []):
            try:
                if os.stat(os.path.join(archive, sample)).st_ino == inode:
                    found[folder] = archive
                    break
            except OSError:
                continue
    return found


def plan(files: list[str], archives: dict[str, str]) -> list[tuple[str, str | None]]:
    """(relative path, its copy in the cache or None) per file, in order."""
    return [(rel, os.path.join(archives[key], rel) if (key := folder_key(rel)) in archives else None) for rel in files]


def compile_one(rel: str, copy: str, site: str) -> bool:
    """Compile ``copy`` as ``rel``'s checked hash-based pyc unless ``rel`` has bytecode already (a pytest process or
    another worker wrote it). True when written; False also when the copy cannot be read (pruned from the cache)."""
    path = os.path.join(site, rel)
    target = importlib.util.cache_from_source(path)  # under sys.pycache_prefix
    if os.path.exists(target):
        return False
    try:
        return (
            py_compile.compile(
                copy,
                cfile=target,
                dfile=path,
                doraise=False,
                quiet=2,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            is not None
        )
    except OSError:
        return False


def install_done() -> bool:
    """Whether standard input has ended (the suite starts, or the runner is gone)."""
    return bool(select.select([sys.stdin], [], [], 0)[0])


def work(todo: list[tuple[str, str | None]], site: str) -> int:
    """Compile ``todo``'s cached copies in order until standard input ends; the number written."""
    written = 0
    for rel, copy in todo:
        if install_done():
            break
        if copy is not None:
            written += compile_one(rel, copy, site)
    return written


def wait_for_install() -> None:
    """Block (idle) until standard input ends."""
    select.select([sys.stdin], [], [])


def main(argv: list[str]) -> int:
    # only the cores nothing else wants: the install's own work (resolving, linking) waits on the CPU otherwise (at
    # the default priority two workers made the 0.5.17 install 12 s where it takes 8)
    os.nice(19)
    spec = json.loads(open(argv[0]).read())
    worker, workers = int(argv[1]), int(argv[2])
    sys.pycache_prefix = spec["prefix"]
    try:
        sources = json.loads(open(spec["sources"]).read())["folders"]
    except (OSError, ValueError, KeyError):
        sources = {}
    todo = plan(spec["files"], folder_sources(sources, archive_index(spec["cache"])))
    work(todo[worker::workers], spec["site"])
    wait_for_install()  # done early or not, its end says whether the runner is still there to clean up
    if os.getppid() != spec["runner"] and worker == 0:  # the runner died: nobody else removes the folder
        shutil.rmtree(os.path.dirname(spec["prefix"]), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
