"""What this environment can run: tier availability with a one-line reason, and the versions that matter.

Checks are cheap on purpose (find_spec and package metadata, never ``import sglang``, which costs ~40 s on two
cores); only the GPU probe imports torch, and only when sglang is there to use a GPU with.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from mtpmatrix.core.record_types import Build
from mtpmatrix.core.settings import MIN_TRANSFORMERS

WATCHED = (
    "sglang",
    "sglang-kernel",
    "sgl-kernel",
    "transformers",
    "torch",
    "triton",
    "flashinfer-python",
    "tokenizers",
    "huggingface-hub",
    "safetensors",
)


def version_of(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def by_release(table, version: str | None, default):
    """The value of the first ``(specifier set, value)`` row of ``table`` whose range holds ``version``: a table of
    what differs between releases (the draft phase, the meta_info fields); ``default`` for a release outside every
    range, a missing or an unparsable version."""
    try:
        v = Version(version) if version else None
    except InvalidVersion:
        v = None
    if v is None:
        return default
    return next((value for spec, value in table if v in SpecifierSet(spec)), default)


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    out.update({d: version_of(d) for d in WATCHED if version_of(d)})
    return out


def torch_build() -> tuple[str | None, str | None]:
    """(torch.__version__, torch.version.cuda) read from torch's own version.py, without importing torch (seconds,
    and a CUDA init): PyPI's wheels carry the CUDA build there (``2.11.0+cu130``) and not in their metadata."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    values: dict[str, str | None] = {}
    for folder in folders[:1]:
        try:
            tree = ast.parse(Path(folder, "version.py").read_text())
        except (OSError, SyntaxError, ValueError):
            break
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if target is None and isinstance(node, ast.AnnAssign):
                target = node.target
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                values[target.id] = node.value.value if isinstance(node.value.value, str) else None
    return values.get("__version__"), values.get("cuda")


def build() -> Build:
    """The build a session ran on, which a row's identity includes beside its pins: Python, the platform, torch's
    version with its local build (``+cu130``) and the CUDA it was built for."""
    torch_version, torch_cuda = torch_build()
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": sysconfig.get_platform(),
        "torch": torch_version or version_of("torch"),
        "torch_cuda": torch_cuda,
    }


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def gpu_count() -> int:
    """CUDA devices visible to torch; 0 when torch is absent or has no CUDA."""
    if os.environ.get("MTPMATRIX_FORCE_NO_GPU"):
        return 0
    if not has_module("torch"):
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install means: no usable GPU here
        return 0


@functools.cache
def gpu_names() -> list[str]:
    """The name of each CUDA device torch sees (gpu_count of them); [] without one."""
    if not gpu_count():
        return []
    try:
        import torch

        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA install: gpu_count said so already
        return []


def nvidia_smi(*args: str) -> str | None:
    """stdout of ``nvidia-smi ARGS`` (one place for the call); None when nvidia-smi is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def gpu_free_mib(env: dict | None = None) -> int | None:
    """Least free memory (MiB) among the GPUs this process may use, per nvidia-smi; None when unknown.

    Honours a numeric CUDA_VISIBLE_DEVICES (nvidia-smi itself ignores it); with UUIDs or MIG names it is unknown.
    """
    env = os.environ if env is None else env
    csv = nvidia_smi("--query-gpu=index,memory.free", "--format=csv,noheader,nounits")
    return None if csv is None else least_free_mib(csv, env.get("CUDA_VISIBLE_DEVICES"))


def least_free_mib(smi_csv: str, visible: str | None) -> int | None:
    """The smallest memory.free of ``index, memory.free`` CSV rows, restricted to ``visible`` device indexes."""
    free = {}
    for line in smi_csv.splitlines():
        parts = [t.strip() for t in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            free[int(parts[0])] = int(parts[1])
    if visible is not None and visible.strip():
        wanted = [t.strip() for t in visible.split(",")]
        if not all(t.isdigit() for t in wanted):
            return None
        free = {i: m for i, m in free.items() if str(i) in wanted}
    return min(free.values()) if free else None


def sglang_missing() -> str | None:
    if not has_module("sglang"):
        return "sglang is not installed in this environment"
    return None


def transformers_missing() -> str | None:
    tv = version_of("transformers")
    if tv is None:
        return "transformers is not installed in this environment"
    if Version(tv) < Version(MIN_TRANSFORMERS) or not has_module("transformers.models.gemma4_assistant"):
        return f"transformers {tv} has no gemma4_assistant (needs >= {MIN_TRANSFORMERS})"
    return None


def gpu_missing(needed: int = 1) -> str | None:
    n = gpu_count()
    if n < needed:
        return f"needs {needed} CUDA GPU(s), this machine has {n}"
    return None


def tier_unavailable(tier: str) -> str | None:
    """One line saying why ``tier`` cannot run here, or None when it can."""
    if tier == "contract":
        return sglang_missing()
    if tier == "reference":
        return transformers_missing()
    if tier in ("smoke", "gsm8k"):
        return sglang_missing() or transformers_missing() or gpu_missing(1)
    raise ValueError(f"unknown tier {tier!r}")
