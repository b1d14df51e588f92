"""Fault injection hook (``python -m mtpmatrix mutants``): serve the patched source of a few modules.

This folder goes first on PYTHONPATH, so every Python started with that environment (the pytest process, each
``sglang.launch_server`` and the scheduler / detokenizer processes it spawns) imports this file at start-up. When
``MTPMATRIX_MUTANT`` names a JSON file

    {"mutant": ID, "modules": {DOTTED_NAME: {"origin": PATH, "sha256": HEX, "source": TEXT}, ...}}

a meta-path finder serves ``source`` for each named module, under its original file name (tracebacks, classification
and ``inspect`` see the patched text through linecache). The installed files are never touched. A module is patched
only when the import system would have loaded it from ``origin`` and that file still hashes to ``sha256``;
otherwise it imports normally and a ``NOT applied`` line says why. Each process that loads a patched module prints
one ``mtpmatrix-mutant:`` line to stderr, which lands in the server log: the runner's proof that the mutant ran.

``MTPMATRIX_PATCH`` names a unified diff instead (tools/gpu_box.sh ``PATCH=FILE``: a candidate served at import,
runner/candidate.py): at start-up the hook reads it with mtpmatrix/core/unidiff.py (loaded by its path, beside this
folder), applies each file's hunks to the source the interpreter would import, and serves the results the same way,
as ``patch-<sha7>``. It serves nothing, and says ``NOT applied`` with the file and hunk, when the file's sha256 is not
``MTPMATRIX_PATCH_SHA256`` or a hunk does not apply; ``python -m mtpmatrix import`` refuses a run whose logs say so.

Without ``MTPMATRIX_MUTANT`` or ``MTPMATRIX_PATCH`` nothing is installed. Either way a ``sitecustomize`` further
along sys.path (a distribution's or a virtualenv's) still runs. Standard library only; never raises into interpreter
start-up.
"""

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import linecache
import os
import sys

ENV = "MTPMATRIX_MUTANT"
PATCH_ENV = "MTPMATRIX_PATCH"
PATCH_SHA256_ENV = "MTPMATRIX_PATCH_SHA256"
MARK = "mtpmatrix-mutant:"
_HERE = os.path.dirname(os.path.abspath(__file__))
_UNIDIFF = os.path.join(_HERE, os.pardir, os.pardir, "core", "unidiff.py")


def _say(text):
    try:
        sys.stderr.write(f"{MARK} {text} (pid {os.getpid()})\n")
        sys.stderr.flush()
    except Exception:
        pass


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


class _PatchedLoader(importlib.abc.Loader):
    def __init__(self, mutant, name, origin, source):
        self.mutant, self.name, self.origin, self.source = mutant, name, origin, source

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        lines = self.source.splitlines(keepends=True)
        linecache.cache[self.origin] = (len(self.source), None, lines, self.origin)  # mtime None: kept as is
        code = compile(self.source, self.origin, "exec", dont_inherit=True)
        _say(f"{self.mutant} serves patched {self.name}")
        exec(code, module.__dict__)

    def get_source(self, fullname):
        return self.source


class MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, mutant, modules):
        self.mutant = mutant
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        entry = self.modules.get(fullname)
        if entry is None:
            return None
        normal = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            normal = finder.find_spec(fullname, path, target)
            if normal is not None:
                break
        origin = entry["origin"]
        if normal is None or not normal.origin or not _same_file(normal.origin, origin):
            _say(
                f"{self.mutant} NOT applied to {fullname}: this interpreter imports it from "
                f"{getattr(normal, 'origin', None)}, the mutant was made from {origin}"
            )
            return None
        try:
            with open(origin, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
        except OSError as exc:
            _say(f"{self.mutant} NOT applied to {fullname}: {exc}")
            return None
        if digest != entry["sha256"]:
            _say(f"{self.mutant} NOT applied to {fullname}: {origin} changed since the mutant was made")
            return None
        loader = _PatchedLoader(self.mutant, fullname, origin, entry["source"])
        return importlib.util.spec_from_file_location(
            fullname, origin, loader=loader, submodule_search_locations=normal.submodule_search_locations
        )


def _load_unidiff():
    name = "_mtpmatrix_unidiff"  # not mtpmatrix.core.unidiff: the package itself need not be importable here
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _UNIDIFF)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def patch_payload(path, sha256=None):
    """The hook payload (as ``MTPMATRIX_MUTANT`` holds it) of the unified diff at ``path`` against the sglang this
    interpreter imports; ValueError (one line) when the file is not ``sha256``'s or a hunk does not apply."""
    unidiff = _load_unidiff()
    with open(path, "rb") as fh:
        data = fh.read()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and digest != sha256:
        raise ValueError(f"{path} has sha256 {digest[:12]}, {PATCH_SHA256_ENV} says {sha256[:12]}")
    spec = importlib.machinery.PathFinder.find_spec(unidiff.PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"no {unidiff.PACKAGE} package on this interpreter's path")
    site = os.path.dirname(list(spec.submodule_search_locations)[0])
    modules = {}
    for fp in unidiff.parse(data.decode("utf-8")):
        if fp.kind != "modify" or fp.module is None:
            raise ValueError(f"{fp.path}: served at import, a patch may only change existing .py files")
        origin = os.path.join(site, *fp.path.split("/"))
        try:
            with open(origin, "rb") as fh:
                original = fh.read()
        except OSError as exc:
            raise ValueError(f"{fp.path}: {exc}") from None
        modules[fp.module] = {
            "origin": origin,
            "sha256": hashlib.sha256(original).hexdigest(),
            "source": unidiff.apply(fp, original.decode("utf-8")),
        }
    return {"mutant": f"patch-{digest[:7]}", "modules": modules}


def _install():
    patch = os.environ.get(PATCH_ENV)
    if patch:
        try:
            payload = patch_payload(patch, os.environ.get(PATCH_SHA256_ENV))
        except Exception as exc:  # serve nothing rather than a part of it; the line names what failed
            _say(f"NOT applied: {PATCH_ENV}={patch}: {' '.join(str(exc).split())}")
            return
        sys.meta_path.insert(0, MutantFinder(payload["mutant"], payload["modules"]))
        return
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as fh:
            payload = json.load(fh)
        finder = MutantFinder(str(payload["mutant"]), dict(payload["modules"]))
    except Exception as exc:  # a broken payload must be visible, and must not stop the interpreter
        _say(f"NOT applied: cannot read {ENV}={path}: {type(exc).__name__}: {exc}")
        return
    sys.meta_path.insert(0, finder)


def _chain():
    """Run the next ``sitecustomize`` on sys.path, the one this file shadows."""
    rest = [p for p in sys.path if not _same_file(p or os.getcwd(), _HERE)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or not spec.origin or not spec.loader or _same_file(spec.origin, __file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


for _step in (_install, _chain):
    try:
        _step()
    except Exception as _exc:  # pragma: no cover - start-up must go on
        _say(f"hook step {_step.__name__} failed: {type(_exc).__name__}: {_exc}")
