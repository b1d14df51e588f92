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

from packaging.version import Version

WATCHED = ("sglang", "sglang-kernel", "sgl-kernel", "transformers", "torch", "triton", "flashinfer-python",
           "tokenizers", "huggingface-hub", "safetensors")


def version_of(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    out = {"python": platform.python_version()}
    out.update({d: version_of(d) for d in WATCHED if version_of(d)})
    return out


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
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


def sglang_missing() -> str | None:
    if not has_module("sglang"):
        return "sglang is not installed in this environment"
    return None


def transformers_missing() -> str | None:
    tv = version_of("transformers")
    if tv is None:
        return "transformers is not installed in this environment"
    if Version(tv) < Version("5.8.0") or not has_module("transformers.models.gemma4_assistant"):
        return f"transformers {tv} has no gemma4_assistant (needs >= 5.8.0)"
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
