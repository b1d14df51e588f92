"""Can the MTP path's native extensions load against this environment's torch? Answered from the ELF files alone,
on a CPU machine, in seconds.

Why: sglang's kernels (``sgl_kernel/sm90/common_ops.abi3.so``, ``sm100/...``) are C++ extensions built against one
torch release. Under another torch, ``import sgl_kernel`` fails with "undefined symbol" on a GPU box and no server
starts. On a CPU machine it fails anyway (no ``libcuda.so.1``) and sglang swallows the error, so the contract tier
passed under a torch whose ABI the kernels cannot load. This module finds those breaks without loading anything.

Which libraries (from the installed distributions, nothing hard-coded):
  * the distributions in sglang's runtime-dependency closure (``Requires-Dist`` of the installed metadata, markers
    evaluated, no extras, torch's own requirements not followed), torch itself excluded: it is what the others are
    checked against;
  * every ELF shared object in their ``RECORD`` whose ``DT_NEEDED`` names one of torch's libraries: the extension
    modules (sgl_kernel's per-architecture ``sm90``/``sm100`` ``common_ops``, ``flash_ops``, ...) and the operator
    libraries packages load with ``torch.ops.load_library`` or ctypes (deep_gemm's ``_C.so``, torchvision,
    torchaudio, torchao, torchcodec). Which of them one server run loads depends on the GPU and the features used;
    each is loaded on some path of sglang, and the message names every library, so a reader sees which broke;
  * except builds for another torch release, named so (``libtorch_c_dlpack_addon_torch26-cpu.so`` under torch
    2.11): their package loads only the one named for the running torch.

What "missing" means, and why it gives no false alarms:
  * torch's side is what ``import torch`` has loaded before any extension: the shared libraries torch ships
    (``torch/lib``, by ``SONAME``) and their own ``DT_NEEDED`` closure, resolved like the dynamic loader does
    (RPATH/RUNPATH with ``$ORIGIN``, then the system's library path);
  * a library's undefined symbols are looked up in its load scope: the interpreter and torch's global dependencies
    plus the library's own ``DT_NEEDED`` closure, resolved the same way (a soname torch already loaded is that
    object; one found nowhere else may be a library the checked packages ship and load by path first, as
    torchcodec does with its cores);
  * a symbol is *torch's* when it is unversioned and its name belongs to torch: a mangled C++ name that mentions
    ``c10``, ``at``, ``torch``, ``caffe2`` or ``aoti`` as a name component (``_ZN3c10...``, ``_ZNK2at...``, also
    ``THPVariable_Wrap(at::TensorBase const&)``), or torch's C ABI (``aoti_torch_*``, ``torch_*``, ``THP*``).
    Versioned references (``memcpy@GLIBC_2.14``) belong to the library named in their version requirement, and torch
    versions none of its symbols. Weak undefined references may stay unresolved at load time, so they never count.
    Everything else that stays unresolved on a CPU machine (``cu*`` from the absent driver's ``libcuda.so.1``,
    ``Py*`` from the interpreter) is not torch's and is only counted;
  * a torch symbol is missing when no library in the scope defines it (defined: any binding, not ``UND``), and a
    ``DT_NEEDED`` torch library is missing when the row's torch does not ship it (``libc10_cuda.so`` under a CPU
    build). Each one is a load failure on any machine.
  Comparing the export tables of the *pinned* torch and the row's torch would need the pinned torch installed too
  (gigabytes per probe) and would still not say which of the differences a library uses; resolving the library's
  own references against the row's torch answers exactly that.

CUDA: the CUDA runtime libraries whose soname major is the CUDA major (``libcudart``, ``libcublas``,
``libcublasLt``, ``libnvrtc``, ``libnvJitLink``; not cufft/cusparse/curand, whose majors differ) that a library
needs must have the major of the row's torch build (``torch.version.cuda``, read from ``torch/version.py`` without
importing torch). A CPU build of torch has no CUDA version: that half is skipped, saying so.

ELF reading: ``elf.py`` (pyelftools, else binutils' readelf; with neither the check is skipped with one line).
Names are demangled with ``c++filt`` when it is there.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mtpmatrix.tiers.compat.elf import AbiUnavailable, Ref, make_reader
from mtpmatrix.tiers.compat.elf import needed as needed_sonames
from mtpmatrix.tiers.compat.load_scope import LoadScope

ROOT_DIST = "sglang"
TORCH_DIST = "torch"
# torch's own shared libraries, by soname: what a DT_NEEDED entry must name to be torch's to provide (a CPU build
# ships no *_cuda ones). Other libraries named libtorch* (libtorchaudio, libtorchcodec_core4, ...) are not torch's.
TORCH_SONAME = re.compile(r"^lib(?:torch(?:_[a-z_]+)?|c10(?:_[a-z]+)?|caffe2_nvrtc|shm)\.so$")
# A mangled name whose entity lives in one of torch's namespaces: the first component of its nested name (after
# the special-name prefixes for vtables, typeinfo, thunks and guard variables, and the cv/ref qualifiers) is c10,
# at, torch, caffe2 or aoti. Only the entity's own name counts: torchcodec's
# ``facebook::torchcodec::VideoEncoder::VideoEncoder(torch::stable::Tensor const&, ...)`` mentions torch in a
# parameter type but is torchcodec's to define.
_TORCH_MANGLED = re.compile(
    r"^_Z(?:T[VTIS]|Th[n]?\d+_|Tv[n]?\d+_[n]?\d+_|GV)?N?[rVK]*[RO]?"
    r"(?:3c10|2at|5torch|6caffe2|4aoti)"
)
# torch's C ABI (stable ABI shims and the Python bindings), also as the name of a global-namespace C++ function
# (``_Z16THPVariable_WrapRKN2at10TensorBaseE``).
_TORCH_C_ABI = re.compile(r"^(?:aoti_torch_|torch_|THP)")
_GLOBAL_CXX = re.compile(r"^_Z(\d+)")
# Sonames whose major number is the CUDA major (auditwheel may insert a hash: libcudart.faf08d9a.so.13).
CUDA_MAJOR_SONAME = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink)(?:[.-][0-9a-f]{8})?\.so\.(\d+)$")

# ---------------------------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------------------------


def is_torch_symbol(ref: Ref) -> bool:
    """Whether an undefined reference is torch's to define (see the module docstring)."""
    if ref.version_file is not None:
        return bool(TORCH_SONAME.match(ref.version_file))
    name = ref.name
    m = _GLOBAL_CXX.match(name)
    if m:  # a global-namespace function: its source name decides
        name = name[m.end() : m.end() + int(m.group(1))]
    return bool(_TORCH_MANGLED.match(name) or _TORCH_C_ABI.match(name))


def demangle(names: list[str]) -> list[str]:
    """Demangled names, in order (c++filt); the mangled names themselves where c++filt is absent."""
    tool = shutil.which("c++filt")
    if not names or tool is None:
        return list(names)
    out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if out.returncode == 0 and len(lines) == len(names) else list(names)


def short_name(demangled: str) -> str:
    """``torch::Library::_def(std::variant<...>&&, ...)`` -> ``torch::Library::_def``: the parameter list (and a
    template function's return type) dropped."""
    depth, start = 0, 0
    for i, ch in enumerate(demangled):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:  # "int const* at::TensorBase::const_data_ptr<int, 0>()": skip the return type
            start = i + 1
        elif ch == "(" and depth == 0 and not demangled[:i].endswith("operator"):
            return demangled[start:i]
    return demangled


# ---------------------------------------------------------------------------------------------------------------
# one library
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class LibraryResult:
    path: Path
    label: str  # e.g. "sgl_kernel/sm90/common_ops.abi3.so (sglang-kernel 0.4.5)"
    missing_symbols: list[str] = field(default_factory=list)  # mangled
    missing_demangled: list[str] = field(default_factory=list)
    missing_torch_libs: list[str] = field(default_factory=list)  # DT_NEEDED torch sonames the row's torch lacks
    unresolved_other: list[str] = field(default_factory=list)  # not torch's; left to the driver / interpreter
    absent_libs: list[str] = field(default_factory=list)  # non-torch DT_NEEDED not on this machine (libcuda.so.1)
    torch_refs: int = 0  # how many torch symbols it needs (all resolved unless listed above)
    cuda_majors: dict[str, int] = field(default_factory=dict)  # soname -> CUDA major it needs

    @property
    def broken(self) -> bool:
        return bool(self.missing_symbols or self.missing_torch_libs)


def check_library(path: Path, scope: LoadScope, label: str | None = None) -> LibraryResult:
    """Resolve ``path``'s torch references in its load scope (see the module docstring)."""
    path = Path(path).resolve()
    reader = scope.reader
    res = LibraryResult(path=path, label=label or path.name)
    dyn = scope.dynamic(path)
    for soname in dyn.needed:
        m = CUDA_MAJOR_SONAME.match(soname)
        if m:
            res.cuda_majors[soname] = int(m.group(2))
        if scope.resolve(soname, path) is None:
            (res.missing_torch_libs if TORCH_SONAME.match(soname) else res.absent_libs).append(soname)
    refs = reader.undefined(path)
    torch_names = sorted({r.name for r in refs if is_torch_symbol(r)})
    res.torch_refs = len(torch_names)
    # torch's libraries first (where torch's symbols live), then the rest of the scope for what is left
    closure = scope.closure(path)
    ordered = [p for s, p in closure.items() if TORCH_SONAME.match(s)]
    ordered += [p for s, p in {**scope.global_scope, **closure}.items() if p not in ordered]
    left = set(torch_names)
    for lib in ordered:
        if not left:
            break
        left -= reader.defines(lib, left)
    res.missing_symbols = sorted(left)
    res.missing_demangled = demangle(res.missing_symbols)
    other = {r.name for r in refs if not is_torch_symbol(r) and r.version_file is None}
    if other:
        for lib in ordered:
            if not other:
                break
            other -= reader.defines(lib, other)
    res.unresolved_other = sorted(other)
    return res


def cuda_mismatches(results: list[LibraryResult], torch_cuda: str) -> list[str]:
    """One line per library that needs a CUDA runtime of another major than ``torch_cuda`` ("13.0")."""
    major = int(torch_cuda.split(".")[0])
    out = []
    for r in results:
        bad = {s: m for s, m in r.cuda_majors.items() if m != major}
        if bad:
            majors = "/".join(sorted({str(m) for m in bad.values()}))
            out.append(f"{r.label} needs {', '.join(sorted(bad))} (CUDA {majors})")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the installed environment
# ---------------------------------------------------------------------------------------------------------------


def _dists(path: list[str] | None = None) -> dict[str, md.Distribution]:
    out: dict[str, md.Distribution] = {}
    for d in md.distributions(**({"path": path} if path is not None else {})):
        name = d.metadata["Name"]
        if name:
            out.setdefault(canonicalize_name(name), d)  # first on the path wins, as for imports
    return out


def dependency_closure(root: str, dists: dict[str, md.Distribution], stop_at: Iterable[str] = ()) -> list[str]:
    """``root`` and every installed distribution it requires, transitively (markers evaluated, no extras); the
    requirements of ``stop_at`` distributions are not followed."""
    seen: list[str] = []
    stack = [canonicalize_name(root)]
    while stack:
        name = stack.pop()
        if name in seen or name not in dists:
            continue
        seen.append(name)
        if name in stop_at:
            continue
        for spec in dists[name].requires or []:
            try:
                req = Requirement(spec)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            stack.append(canonicalize_name(req.name))
    return seen


_SHARED_OBJECT = re.compile(r"\.so(?:\.\d+)*$")
# A per-release build: "libtorch_c_dlpack_addon_torch26-cpu.so" is loaded by its package only under torch 2.6.
_FOR_TORCH_RELEASE = re.compile(r"torch(\d)(\d{1,2})(?![0-9])")


def built_for_other_torch(filename: str, torch_version: str) -> bool:
    """Whether the file name marks a build for another torch release (``...torch26...`` under torch 2.11)."""
    m = _FOR_TORCH_RELEASE.search(filename)
    if not m:
        return False
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch_version).groups())
    return (int(m.group(1)), int(m.group(2))) != (major, minor)


def torch_libraries(dist: md.Distribution) -> dict[str, Path]:
    """The shared libraries torch ships (torch/lib), by file name (= soname for torch's)."""
    out = {}
    for f in dist.files or []:
        parts = f.parts
        if len(parts) == 3 and parts[:2] == ("torch", "lib") and (f.name.endswith(".so") or ".so." in f.name):
            out[f.name] = Path(dist.locate_file(f)).resolve()
    return out


def torch_cuda_version(dist: md.Distribution) -> str | None:
    """``torch.version.cuda`` read from torch/version.py (no torch import): "13.0", or None for a CPU build."""
    for f in dist.files or []:
        if f.parts == ("torch", "version.py"):
            tree = ast.parse(Path(dist.locate_file(f)).read_text())
            for node in tree.body:
                target = (
                    node.target
                    if isinstance(node, ast.AnnAssign)
                    else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
                )
                if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
                    value = ast.literal_eval(node.value)
                    return str(value) if value else None
    return None


@dataclass
class AbiReport:
    torch_version: str
    torch_cuda: str | None
    reader: str
    libraries: list[LibraryResult]
    seconds: float
    distributions: list[str]  # distributions that contributed a library, "name version"
    shared_objects: int = 0  # shared-object files looked at (this torch's builds), torch-linked or not
    searched: int = 0  # distributions in sglang's dependency closure, torch excluded

    @property
    def broken(self) -> list[LibraryResult]:
        return [r for r in self.libraries if r.broken]

    def failure_message(self) -> str | None:
        """None when every library loads. Else a first line naming the missing symbols (short names) and the
        libraries that need them (most missing first), then each library group with the full signatures."""
        if not self.libraries:  # an empty check is no pass: there is always one to check (sgl_kernel)
            return (
                f"no native library of sglang or its dependencies links torch ({self.shared_objects} shared "
                f"object(s) seen in {self.searched} distribution(s), none linking it): sglang's kernels "
                f"(sgl_kernel) do on every release, so nothing was checked against torch {self.torch_version}"
            )
        broken = sorted(self.broken, key=lambda r: (-len(r.missing_symbols) - len(r.missing_torch_libs), r.label))
        if not broken:
            return None
        heads = []
        with_syms = [r for r in broken if r.missing_symbols]
        if with_syms:
            mangled = {m for r in with_syms for m in r.missing_symbols}
            names = sorted({short_name(d) for r in with_syms for d in r.missing_demangled})
            libs = ", ".join(f"{r.label} ({len(r.missing_symbols)})" for r in with_syms[:4])
            libs += f" and {len(with_syms) - 4} more" if len(with_syms) > 4 else ""  # the first line stays short
            heads.append(
                f"torch {self.torch_version} does not define {len(mangled)} symbol(s) that "
                f"{len(with_syms)} native librar{'y' if len(with_syms) == 1 else 'ies'} need: "
                f"{', '.join(names)} -- needed by {libs}"
            )
        with_libs = [r for r in broken if r.missing_torch_libs]
        if with_libs:
            sonames = sorted({s for r in with_libs for s in r.missing_torch_libs})
            heads.append(
                f"torch {self.torch_version} ships no {', '.join(sonames)} -- needed by "
                + ", ".join(r.label for r in with_libs)
            )
        groups: dict[tuple, list[str]] = {}
        for r in with_syms:
            groups.setdefault(tuple(r.missing_demangled), []).append(r.label)
        details = []
        for demangled, labels in groups.items():
            details.append(f"  {', '.join(labels)}:")
            details += [f"    {d}" for d in demangled]
        return "\n".join(["; ".join(heads), *details])


def check_installed(reader=None, *, root: str = ROOT_DIST, path: list[str] | None = None) -> AbiReport:
    """The ABI report of the torch-linked native libraries of ``root`` and its dependencies against the installed
    torch (see the module docstring for which libraries)."""
    t0 = time.monotonic()
    if not sys.platform.startswith("linux"):
        raise AbiUnavailable(f"the check reads ELF files; this is {sys.platform}")
    dists = _dists(path)
    torch = dists.get(TORCH_DIST)
    if torch is None:
        raise AbiUnavailable("torch is not installed in this environment")
    if canonicalize_name(root) not in dists:
        raise AbiUnavailable(f"{root} is not installed in this environment")
    torch_version = torch.version  # read once: each access parses torch's METADATA again
    reader = reader or make_reader()
    results: list[LibraryResult] = []
    contributing: list[str] = []
    seen = 0
    try:
        closure = [dists[n] for n in dependency_closure(root, dists, stop_at=(TORCH_DIST,)) if n != TORCH_DIST]
        # each RECORD parsed once (``Distribution.files`` parses it again on every call)
        shared = [
            [(f, Path(dist.locate_file(f)).resolve()) for f in dist.files or [] if _SHARED_OBJECT.search(f.name)]
            for dist in closure
        ]
        scope = LoadScope(
            reader,
            torch_libraries(torch),
            shipped={f.name: file for fs in shared for f, file in fs},
            interpreter=Path(sys.executable).resolve(),
        )
        for dist, files in zip(closure, shared):
            checked = 0
            for f, file in files:
                if built_for_other_torch(f.name, torch_version):
                    continue
                seen += 1
                try:  # the quick DT_NEEDED scan first: most of these libraries do not link torch
                    needed = needed_sonames(file)
                except (OSError, ValueError):
                    try:
                        needed = scope.dynamic(file).needed
                    except Exception:  # not an ELF file (a linker script, a stray name): the loader would refuse it
                        continue
                if any(TORCH_SONAME.match(s) for s in needed):
                    results.append(check_library(file, scope, label=str(f)))
                    checked += 1
            if checked:
                contributing.append(f"{dist.metadata['Name']} {dist.version}")
    finally:
        reader.close()
    return AbiReport(
        torch_version=torch_version,
        torch_cuda=torch_cuda_version(torch),
        reader=reader.name,
        libraries=results,
        seconds=round(time.monotonic() - t0, 2),
        distributions=contributing,
        shared_objects=seen,
        searched=len(closure),
    )
