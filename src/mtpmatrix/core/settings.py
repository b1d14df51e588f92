"""Model pairs, thresholds and server arguments: defined here once, used by every tier.

Values follow sglang PR #24552 (the seed GSM8K suite for Gemma 4 MTP). Every path, TP size and threshold can be
overridden from the environment (see ``resolve_pair``) so GPU boxes with weights elsewhere need no code change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# --- environments ---------------------------------------------------------------------------------------------
MIN_TRANSFORMERS = "5.8.0"  # the first transformers with gemma4_assistant: rows below it are refused, the tier skips

# --- tiny pairs: the families mtpmatrix.pairs.tiny builds (MTPMATRIX_SMOKE_PAIR picks one for the smoke tier)
TINY_PAIR_NAMES = ("e-series", "moe-26b-a4b", "dense-31b")

# --- speculative decoding: the seed command lines -----------------------------------------------------------
SPEC_ALGORITHM_CLI = "NEXTN"  # what users type; sglang promotes it for Gemma 4 assistant drafts ...
SPEC_ALGORITHM_RESOLVED = "FROZEN_KV_MTP"  # ... to this
NUM_STEPS = 5
TOPKS = (1, 3)
DRAFT_TOKENS = {1: 6, 3: 12}  # --speculative-num-draft-tokens for each --speculative-eagle-topk
MIN_ACCEPT_LENGTH = 1.5  # gsm8k tier, real weights
# A verify step keeps at least its bonus token: the accept length of a drafter whose every draft is rejected, the
# least any run with speculative decoding shows. A floor at it is a presence check ("speculative decoding ran"),
# never an acceptance gate: what the smoke tier's random pair and the gsm8k tier's tiny proof mode are held to.
NO_DRAFT_ACCEPT_LENGTH = 1.0

# --- common server arguments (the seed suite's) --------------------------------------------------------------
COMMON_ARGS = (
    "--attention-backend",
    "triton",
    "--dtype",
    "bfloat16",
    "--mem-fraction-static",
    "0.55",
    "--max-running-requests",
    "16",
    "--context-length",
    "2048",
    "--max-total-tokens",
    "32768",
    "--skip-server-warmup",
)
# The smoke tier serves tiny pairs: same path, smaller everything, so launch + CUDA-graph capture stay fast and
# several servers can share one GPU.
SMOKE_ARGS = (
    "--attention-backend",
    "triton",
    "--dtype",
    "bfloat16",
    # sglang keeps (1 - this) x the memory free at its start out of its static pool and fails its launch when less
    # than that is still free after loading: this fraction is the room every other server launching beside it may
    # take (launch_plan.launch_parallelism). The pool itself is capped by --max-total-tokens (min(profiled, cap):
    # 0.5.17 kv_cache_configurator.py l. 1705), and no other setting of a smoke server reads the fraction (graph
    # batch sizes and chunked prefill follow the card's capacity; no speculative override), so a larger one costs
    # nothing sglang allocates: memory outside the pool (graphs, activations) was never checked against it. 0.7: the
    # 18 default servers at launch_plan.SERVER_MIB each (18 x 2,944 MiB = 51.8 GiB) need 0.656 of an idle H100
    # 80GB's ~79 GiB free, 0.42 of an H200's 125 GiB. At 0.42 an H100 launched 11 at once, two waves, ratio 1.59
    # (docs/runs/2026-12-05f-h100-gpu-session.md); 0.7 on an H100 is to be measured (docs/gpu-boxes.md). A server
    # that fails beside the others is relaunched alone, so a wrong margin costs time, not a verdict.
    "--mem-fraction-static",
    "0.7",
    "--max-running-requests",
    "8",
    "--context-length",
    "512",
    "--max-total-tokens",
    "8192",
    "--cuda-graph-max-bs",
    "8",
    # sglang folds spec counters into avg_spec_accept_length only at decode-log time (every 40 decode steps by
    # default); a constructed pair finishes its requests in fewer steps than that, so log every step.
    "--decode-log-interval",
    "1",
    "--skip-server-warmup",
)

# --- GSM8K --------------------------------------------------------------------------------------------------
GSM8K_NUM_EXAMPLES = 200
# the test split's SHA-256, of the decompressed bytes: every source (a user's copy, the shipped one, a download) is
# held to it (tiers.gsm8k_eval), and the suite's fingerprint names the data by it (evidence.fingerprint)
GSM8K_SHA256 = {"test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"}  # 1319 lines
GSM8K_NUM_SHOTS = 5
GSM8K_PARALLEL = 128
GSM8K_MAX_NEW_TOKENS = 512


@dataclass(frozen=True)
class ModelPair:
    name: str
    target: str
    assistant: str
    tp: int
    threshold: float | None  # GSM8K score floor; None = calibrate (report only)
    extra_args: tuple[str, ...] = ()
    optional: bool = False
    notes: str = ""


PAIRS: dict[str, ModelPair] = {
    p.name: p
    for p in (
        ModelPair("E4B", "google/gemma-4-E4B-it", "google/gemma-4-E4B-it-assistant", tp=1, threshold=0.65),
        ModelPair(
            "26B-A4B",
            "google/gemma-4-26B-A4B-it",
            "google/gemma-4-26B-A4B-it-assistant",
            tp=2,
            threshold=0.415,
            extra_args=("--enable-deterministic-inference",),
            notes="0.445 observed - 0.03",
        ),
        ModelPair("31B", "google/gemma-4-31B-it", "google/gemma-4-31B-it-assistant", tp=2, threshold=0.75),
        ModelPair(
            "E2B",
            "google/gemma-4-E2B-it",
            "google/gemma-4-E2B-it-assistant",
            tp=1,
            threshold=None,
            optional=True,
            notes="threshold to calibrate",
        ),
    )
}
DEFAULT_PAIRS = tuple(n for n, p in PAIRS.items() if not p.optional)


def pair_env_key(pair_name: str, what: str) -> str:
    """The env knob overriding ``what`` (TARGET, ASSISTANT, TP, THRESHOLD) of a pair: MTPMATRIX_26B_A4B_TP."""
    return "MTPMATRIX_" + pair_name.upper().replace("-", "_") + "_" + what


def gsm8k_case_id(pair_name: str, topk: int | None) -> str:
    """A GSM8K case's id: the pair at one topk (``E4B-topk1``), or without MTP (``E4B-nomtp``)."""
    return f"{pair_name}-{'nomtp' if topk is None else f'topk{topk}'}"


def resolve_pair(name: str, env: Mapping[str, str] | None = None) -> ModelPair:
    """The pair called ``name`` with environment overrides applied.

    MTPMATRIX_<PAIR>_TARGET / _ASSISTANT (HF id or local path), _TP, _THRESHOLD, where <PAIR> is E4B, 26B_A4B,
    31B or E2B. Unknown names are an error listing the known ones.
    """
    env = os.environ if env is None else env
    if name not in PAIRS:
        raise KeyError(f"unknown model pair {name!r}; known: {', '.join(PAIRS)}")
    pair = PAIRS[name]
    changes: dict[str, Any] = {}
    if env.get(pair_env_key(name, "TARGET")):
        changes["target"] = env[pair_env_key(name, "TARGET")]
    if env.get(pair_env_key(name, "ASSISTANT")):
        changes["assistant"] = env[pair_env_key(name, "ASSISTANT")]
    if env.get(pair_env_key(name, "TP")):
        changes["tp"] = int(env[pair_env_key(name, "TP")])
    if env.get(pair_env_key(name, "THRESHOLD")):
        changes["threshold"] = float(env[pair_env_key(name, "THRESHOLD")])
    return replace(pair, **changes)


def mtp_args(assistant: str, topk: int) -> list[str]:
    """The speculative-decoding arguments of the seed command line for one topk."""
    if topk not in DRAFT_TOKENS:
        raise ValueError(f"topk {topk} has no draft-token count; known: {sorted(DRAFT_TOKENS)}")
    return [
        "--speculative-algorithm",
        SPEC_ALGORITHM_CLI,
        "--speculative-draft-model-path",
        str(assistant),
        "--speculative-num-steps",
        str(NUM_STEPS),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(DRAFT_TOKENS[topk]),
    ]


def server_args(
    model: str,
    *,
    assistant: str | None = None,
    topk: int | None = None,
    tp: int = 1,
    base: tuple[str, ...] = COMMON_ARGS,
    extra: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """Arguments of ``sglang.launch_server`` (without host/port): model, TP, common args, MTP args, extras."""
    args = ["--model-path", str(model), "--tp-size", str(tp), *base]
    if assistant is not None:
        args += mtp_args(assistant, topk if topk is not None else 1)
    args += list(extra)
    return args


def expected_resolution(topk: int) -> dict[str, Any]:
    """What ServerArgs must hold after resolution for the seed command line with this topk."""
    return {
        "speculative_algorithm": SPEC_ALGORITHM_RESOLVED,
        "speculative_eagle_topk": topk,
        "speculative_num_steps": NUM_STEPS,
        "speculative_num_draft_tokens": DRAFT_TOKENS[topk],
    }
