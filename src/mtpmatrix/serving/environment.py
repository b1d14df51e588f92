"""What this environment can run: tier availability with a one-line reason, and the versions that matter.

Checks are cheap on purpose (find_spec and package metadata, never ``import sglang``, which costs ~40 s on two
cores); only the GPU probe imports torch, and only when sglang is there to use a GPU with.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import os
import platform
import shutil
import subprocess

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

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
