"""The dynamic loader's view of an environment, read from ELF files only: which file each ``DT_NEEDED`` soname of
a library resolves to (RPATH/RUNPATH with ``$ORIGIN``, ``LD_LIBRARY_PATH``, ld.so.cache's folders, the usual
defaults) once ``import torch`` has loaded torch's own libraries and their closure. ``abi.py`` resolves a library's
undefined symbols in this scope."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from mtpmatrix.tiers.compat.elf import Dynamic

_DEFAULT_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
)


@functools.lru_cache(maxsize=1)
def loader_dirs() -> tuple[str, ...]:
    """The dynamic loader's default search list: ld.so.cache's folders (ldconfig -p), then the usual defaults."""
    dirs: list[str] = []
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            if "=>" in line:
                d = os.path.dirname(line.split("=>", 1)[1].strip())
                if d not in dirs:
                    dirs.append(d)
    return tuple(dirs + [d for d in _DEFAULT_DIRS if d not in dirs])


def _expand(entries: Iterable[str], origin: Path) -> list[Path]:
    return [Path(e.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin))) for e in entries if e]


class LoadScope:
    """What the dynamic loader would find, given what ``import torch`` already loaded.

    ``torch_libs``: torch's shared libraries (soname -> file). They and their DT_NEEDED closure are "loaded": a
    library needing one of those sonames gets that object, wherever its own search path points. ``shipped``: shared
    libraries that the checked packages ship (file name -> file), the last resort for a soname found nowhere else:
    a package whose libraries need each other without an RPATH loads them itself, dependencies first, by full path
    (torchcodec's cores, tvm_ffi's libtvm_ffi.so), and the loader then matches the soname already loaded.
    """

    def __init__(
        self,
        reader,
        torch_libs: dict[str, Path],
        system_dirs: Iterable[str] | None = None,
        shipped: dict[str, Path] | None = None,
        interpreter: Path | None = None,
    ):
        self.reader = reader
        self.torch_libs = dict(torch_libs)
        self.system_dirs = tuple(system_dirs) if system_dirs is not None else loader_dirs()
        self.shipped = dict(shipped or {})
        self._dyn: dict[Path, Dynamic] = {}
        self.loaded: dict[str, Path] = dict(self.torch_libs)
        for path in list(self.torch_libs.values()):
            for soname, dep in self.closure(path).items():
                self.loaded.setdefault(soname, dep)
        # The global scope every later library sees: the interpreter (it defines the Py* API) and what torch loads
        # RTLD_GLOBAL (libtorch_global_deps.so and its closure).
        self.global_scope: dict[str, Path] = {}
        if interpreter is not None and interpreter.is_file():
            self.global_scope["<interpreter>"] = interpreter
            self.global_scope.update(self.closure(interpreter))
        global_deps = self.torch_libs.get("libtorch_global_deps.so")
        if global_deps:
            self.global_scope["libtorch_global_deps.so"] = global_deps
            self.global_scope.update(self.closure(global_deps))

    def dynamic(self, path: Path) -> Dynamic:
        if path not in self._dyn:
            self._dyn[path] = self.reader.dynamic(path)
        return self._dyn[path]

    def resolve(self, soname: str, needed_by: Path) -> Path | None:
        """Where ``soname`` comes from when ``needed_by`` needs it (None: nowhere on this machine)."""
        if soname in self.loaded:
            return self.loaded[soname]
        if "/" in soname:
            return Path(soname) if Path(soname).exists() else None
        dyn = self.dynamic(needed_by)
        origin = needed_by.parent
        dirs = [] if dyn.runpath else _expand(dyn.rpath, origin)
        dirs += [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
        dirs += _expand(dyn.runpath, origin) + [Path(d) for d in self.system_dirs]
        for d in dirs:
            cand = d / soname
            if cand.is_file():
                return cand.resolve()
        return self.shipped.get(soname)

    def closure(self, path: Path) -> dict[str, Path]:
        """``path``'s DT_NEEDED closure, breadth first as the loader walks it: soname -> file (found ones only)."""
        found: dict[str, Path] = {}
        queue, seen = [path], {path}
        while queue:
            lib = queue.pop(0)
            for soname in self.dynamic(lib).needed:
                if soname in found:
                    continue
                dep = self.resolve(soname, lib)
                if dep is None:
                    continue
                found[soname] = dep
                if dep not in seen:
                    seen.add(dep)
                    queue.append(dep)
        return found

    def missing_needed(self, path: Path) -> list[str]:
        """DT_NEEDED entries of ``path`` found nowhere."""
        return [s for s in self.dynamic(path).needed if self.resolve(s, path) is None]
