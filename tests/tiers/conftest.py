"""Fixtures shared by the CPU/GPU tiers: tiny shape-true Gemma 4 pairs, built lazily and once per session.

Nothing is built at import or collection time; building needs only transformers/torch/tokenizers/safetensors
(never sglang). ``MTPMATRIX_TINY_DIR`` points the cache at a persistent folder (reused across sessions and rows:
a finished pair folder is recognised by its marker hash); otherwise it lives under pytest's basetemp.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mtpmatrix.tiers.pairs.tiny import PAIR_NAMES  # plain module: no transformers import until a pair is built


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    env = os.environ.get("MTPMATRIX_TINY_DIR")
    if env:
        root = Path(env).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("tiny-pairs")


@pytest.fixture(scope="session")
def build_tiny_pair(tiny_root):
    """Factory ``(name, variant="random") -> PairPaths`` (variant: random / constructed / witness, or a bool for
    constructed); each pair is built at most once per session."""
    from mtpmatrix.tiers.pairs import tiny

    built: dict[tuple[str, str], tiny.PairPaths] = {}

    def _build(name: str, variant: str | bool = "random") -> tiny.PairPaths:
        key = (name, tiny.variant_name(variant))
        if key not in built:
            built[key] = tiny.build_pair(name, tiny_root, variant=key[1])
        return built[key]

    return _build


@pytest.fixture(scope="session", params=PAIR_NAMES)
def tiny_pair(request, build_tiny_pair):
    """Each tiny pair (random weights), as PairPaths."""
    return build_tiny_pair(request.param)
