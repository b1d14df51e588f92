"""``python bytecode_from_cache.py SPEC``: a row's imports compiled from uv's cache while the row installs.

Why (issue #21): a row's install spends most of its time waiting on the package index (uv resolves 215 packages:
5.7 s of 7.3 s on this machine, 42 % of one core used), while the suite that follows spends ~14 s of CPU compiling
the ~8,000 files its processes import (mtpmatrix.runner.bytecode). Compiling needs only each file's bytes, and uv
installs a file as a hard link to its unpacked copy in uv's cache: the bytes the venv will hold are there before the
install ends. So this compiles them then, on the cores the install leaves idle.

Which copy: ``sources.json`` (next to the lists, written by bytecode.Prefetch.finish at the end of the row's last
suite) holds, per folder of listed files, one file's path and inode as the venv had it. A folder's copy is the one in
``<uv cache>/archive-v0/*/`` with that file at that path and that inode. No recorded folder, no match (another
release, a pruned cache, a copying link mode): that folder's files are compiled from the venv once the install is
done (its standard input closed), as bytecode.start's compiler does.

Why it is safe: a file compiled from the cache is written as a *checked hash-based* pyc (PEP 552): Python hashes the
venv's source at every import and uses the bytecode only when the bytes are the same, so a copy that is not the
venv's file (a newer release installed since, a wrong match) costs a compile and is never run. Measured: checking
the hashes adds 0.1 s to the 0.5.17 suite's 7.5 s import.

SPEC (JSON): ``prefix`` (the suite's PYTHONPYCACHEPREFIX), ``site`` (the venv's site-packages), ``files`` (paths
relative to it, in the order to compile), ``sources`` (sources.json's path), ``cache`` (uv's cache folder),
``workers`` (processes while the install runs; one goes on after it). The install is done when standard input
ends (the runner closes it; so does its death, and a process group kill ends every worker).
Standard library only: it runs in the row's venv before anything is installed there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import select
import sys

ARCHIVES = "archive-v0"  # uv's unpacked wheels (uv 0.4 - 0.9): one folder per wheel, its files as installed


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
    return [(rel, os.path.join(archives[key], rel) if (key := folder_key(rel)) in archives else None)
            for rel in files]


def compile_one(rel: str, copy: str | None, site: str) -> bool:
    """Compile ``rel`` unless its bytecode is there (a pytest process or another worker wrote it): from ``copy`` as a
    checked hash-based pyc, else from the venv's file as Python itself would (timestamp). True when written; False
    also when the file cannot be read (a copy pruned from the cache since, a file another release lacks)."""
    path = os.path.join(site, rel)
    target = importlib.util.cache_from_source(path)  # under sys.pycache_prefix
    if os.path.exists(target):
        return False
    try:
        if copy is None:
            return py_compile.compile(path, cfile=target, doraise=False, quiet=2) is not None
        return py_compile.compile(copy, cfile=target, dfile=path, doraise=False, quiet=2,
                                  invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH) is not None
    except OSError:
        return False


def installed(wait: bool = False) -> bool:
    """Whether the install is done: standard input at its end (``wait``: block until it is)."""
    return bool(select.select([sys.stdin], [], [], None if wait else 0)[0])


def work(todo: list[tuple[str, str | None]], site: str, keep_on: bool) -> int:
    """Compile ``todo``'s cached copies in order, then (``keep_on``: the worker that goes on after the install) what
    is left, each file from the venv once the install is done. A worker that does not go on stops at its end."""
    written = 0
    for rel, copy in todo:
        if not keep_on and installed():
            return written
        if copy is not None:
            written += compile_one(rel, copy, site)
    if not keep_on:
        return written
    installed(wait=True)  # uv links files until then: none of the venv's own is read half there
    for rel, _copy in todo:  # what has no bytecode yet, from the venv's own file now
        written += compile_one(rel, None, site)
    return written


def main(argv: list[str]) -> int:
    # only the cores nothing else wants: the install's own work (resolving, linking) waits on the CPU otherwise
    # (at the default priority two workers made the 0.5.17 install 12 s where it takes 8), and after it the
    # pytest processes compile what they import first themselves
    os.nice(19)
    spec = json.loads(open(argv[0]).read())
    sys.pycache_prefix = spec["prefix"]
    try:
        sources = json.loads(open(spec["sources"]).read())["folders"]
    except (OSError, ValueError, KeyError):
        sources = {}
    todo = plan(spec["files"], folder_sources(sources, archive_index(spec["cache"])))
    workers = max(1, int(spec.get("workers", 1)))
    pids = []
    for k in range(1, workers):  # the others take every workers-th file while the install runs
        pid = os.fork()
        if pid == 0:
            work(todo[k::workers], spec["site"], keep_on=False)
            os._exit(0)
        pids.append(pid)
    work(todo[0::workers], spec["site"], keep_on=False)
    # the first worker goes on: every file not written yet, in order, the venv's own once installed
    work(todo, spec["site"], keep_on=True)
    for pid in pids:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
