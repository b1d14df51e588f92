"""Fixtures shared by the CPU/GPU tiers: tiny shape-true Gemma 4 pairs, built lazily and once per session.

Nothing is built at import or collection time; building needs only transformers/torch/tokenizers/safetensors
(never sglang). ``MTPMATRIX_TINY_DIR`` points the cache at a persistent folder (reused across sessions and rows:
a finished pair folder is recognised by its marker hash, and served while its files are the ones a session built
there: mtpmatrix.tiers.pair_cache); otherwise it lives under pytest's basetemp.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from mtpmatrix.core import schema, smoke_servers
from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.pairs.tiny.build import PAIR_NAMES  # plain modules: no transformers import until a pair is built
from mtpmatrix.serving import launch_plan
from mtpmatrix.serving.environment import gpu_free_mib, gpu_missing
from mtpmatrix.tiers import smoke, smoke_collect


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    env = os.environ.get("MTPMATRIX_TINY_DIR")
    if env:
        root = Path(env).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        return root
    return tmp_path_factory.mktemp("tiny-pairs")


@pytest.fixture(scope="session")
def build_tiny_pair(tiny_root, tmp_path_factory):
    """Factory ``(name, variant="random") -> PairPaths`` (variant: random / constructed / witness, or a bool for
    constructed); each pair is built at most once per session, and one reused from ``tiny_root`` only while its
    files are those a session built there (mtpmatrix.tiers.pair_cache)."""
    from mtpmatrix.pairs.tiny.build import PairPaths, build_pair
    from mtpmatrix.pairs.tiny.configs import variant_name
    from mtpmatrix.tiers import pair_cache

    built: dict[tuple[str, str], PairPaths] = {}

    def _build(name: str, variant: str | bool = "random") -> PairPaths:
        key = (name, variant_name(variant))
        if key not in built:
            own = tmp_path_factory.getbasetemp() / "tiny-pairs-rebuilt"
            built[key] = pair_cache.served_pair(build_pair, name, key[1], tiny_root, own)
        return built[key]

    return _build


@pytest.fixture(scope="session")
def load_pair(build_tiny_pair):
    """``(name, variant) -> (target, assistant, tokenizer)`` in fp32, once per session and pair (the reference tier's
    files share it: mtpmatrix.tiers.reference_models.pair_loader)."""
    from mtpmatrix.tiers import reference_models

    return reference_models.pair_loader(build_tiny_pair)


@pytest.fixture(scope="session", params=PAIR_NAMES)
def tiny_pair(request, build_tiny_pair):
    """Each tiny pair (random weights), as PairPaths."""
    return build_tiny_pair(request.param)


@pytest.fixture(scope="session")
def smoke_runs(build_tiny_pair, mtp_results_dir, mtp_progress):
    """Launch every selected server once (side by side where the GPU has room) and keep what each did."""
    options = smoke_servers.collection_options()
    specs = list(options.specs)
    why = gpu_missing(options.tp)
    if why:
        pytest.skip(f"smoke tier: {why} (MTPMATRIX_SMOKE_TP={options.tp})")
    t0 = time.monotonic()
    pairs = {variant: build_tiny_pair(options.pair, variant) for variant in sorted({s.pair for s in specs})}
    if options.swap_drafters:
        pairs.setdefault("random", build_tiny_pair(options.pair))
    swap = options.swap_drafters
    jobs = []
    for spec in specs:
        pair = pairs[spec.pair]
        assistant = pairs["random"].assistant if swap and spec.exact else pair.assistant
        jobs.append(smoke.SmokeJob(spec, pair.target, assistant, _vocab_size(pair.target)))
    free_mib, fraction = gpu_free_mib(), launch_plan.mem_fraction(options.extra_args)
    parallel = launch_plan.launch_parallelism(len(jobs), free_mib, options.parallel, fraction)
    runs = smoke_collect.collect_all(
        jobs,
        smoke_collect.ServerOptions(
            log_dir=mtp_results_dir, tp=options.tp, extra_args=options.extra_args, progress=mtp_progress
        ),
        parallel=parallel,
    )
    # the suite's wall time (pair builds, launches, requests) against one cold launch of this run, beside the logs
    budget = launch_plan.launch_budget(runs, parallel, time.monotonic() - t0, free_mib, fraction)
    atomic_write_json(mtp_results_dir / schema.SMOKE_LAUNCH_BUDGET_FILE, budget)
    mtp_progress(launch_plan.launch_budget_line(budget))
    return runs


def _vocab_size(target_dir) -> int:
    cfg = json.loads((target_dir / "config.json").read_text())
    return (cfg.get("text_config") or cfg)["vocab_size"]
