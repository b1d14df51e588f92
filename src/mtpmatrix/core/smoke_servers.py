"""The smoke servers, defined once: which tiny pair, variant, topk and mode each serves (``SMOKE_SERVERS``), the
default suite (``DEFAULT_SMOKE_SERVERS``: what the expected set of the smoke tier is made of, mtpmatrix.core.expected),
the servers fault injection serves, and the smoke tier's ``MTPMATRIX_SMOKE_*`` knobs checked (``smoke_options``:
what the evidence judge compares to tell a knob that changes what is tested). The smoke tier itself
(mtpmatrix.tiers.smoke) launches them; this module is plain data: no sglang, no torch, no requests.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from mtpmatrix.core.schema import comma_list
from mtpmatrix.core.settings import TINY_PAIR_NAMES


@dataclass(frozen=True)
class SmokeServerSpec:
    name: str
    pair: str  # tiny pair variant (mtpmatrix.pairs.tiny.configs.VARIANTS)
    topk: int | None  # None = no MTP
    load_format: str = "auto"
    default: bool = True  # in the suite unless MTPMATRIX_SMOKE_SERVERS names servers
    # sglang arguments of this server alone (a scheduler or graph mode the others do not run, a request feature its
    # request families need), before MTPMATRIX_SMOKE_EXTRA_ARGS
    mode_args: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        """Greedy output known exactly (next = token + 1); every draft right (decoy: every decoy rejected, every
        right token accepted as predicted) when the MTP path works."""
        return self.pair == "constructed" or self.pair.startswith(("witness", "decoy"))

    @property
    def decoy(self) -> bool:
        """The decoy witness: each request's accept length is predicted exactly (test_decoy_accept_matches_prediction),
        in place of the exact pairs' floor."""
        return self.pair.startswith("decoy")

    @property
    def phase_reference(self) -> bool:
        """The witness built for transformers' draft phase: its acceptance says whether sglang drafts at that phase
        (test_draft_phase_matches_transformers), not whether a hand-off broke (the sglang-phase witness says that)."""
        return self.pair == "witness"


NO_OVERLAP_ARGS = ("--disable-overlap-schedule",)
SEEDED_ARGS = ("--enable-deterministic-inference",)
# CUDA graphs for batches of up to 2 requests: the witness's 8 greedy requests plus the request families run in
# batches of up to 8 (--max-running-requests), so most verify and draft steps take the eager path, the rest a graph.
EAGER_ABOVE_BATCH = 2
EAGER_ABOVE_ARGS = ("--cuda-graph-max-bs", str(EAGER_ABOVE_BATCH))
# sglang refuses a request's custom_logit_processor without it (tokenizer_manager, 0.5.13-0.5.23; off by default for
# security: the string is a pickle the scheduler loads); every server of the witness pair the request surface
# uses (mtpmatrix.tiers.surface.features: custom-logit-processor) sets it.
CUSTOM_LOGIT_PROCESSOR_ARGS = ("--enable-custom-logit-processor",)
# sglang refuses return_hidden_states without it (tokenizer_manager, 0.5.13-0.5.23; 0.5.17+ also spell it
# --return-hidden-states-mode full): the witness servers the hidden-states family asks (surface.hidden_states).
# The eager server goes without, so one witness MTP server still runs with hidden-state capture off.
WITNESS_SURFACE_ARGS = (*CUSTOM_LOGIT_PROCESSOR_ARGS, "--enable-return-hidden-states")
# The long-and-tight family (issue #38 item 2; requests: mtpmatrix.tiers.surface.long_context): the long witness
# (mtpmatrix.pairs.long_witness, context limit 256, window 64) with a small KV pool, a small prefill chunk and, on the
# topk 3 server, 16-token pages. What each number makes sglang do (0.5.13-0.5.23, read from each release's
# scheduler.py / tokenizer_manager.py / schedule_policy.py):
#   --context-length 256: the pair's own limit (SMOKE_ARGS' 512 exceeds its max_position_embeddings);
#   --chunked-prefill-size 32: every 160-token prompt of the family prefills in 5 chunks, each a half window;
#   --max-total-tokens 640: the full-attention pool; the family's 4 to-the-limit requests need ~4 x 250 = 1000 slots
#     at their end, so they cannot all run to the limit at once: sglang admits a request only while input + max_new
#     + page stays under what the running ones leave (two at a time here; schedule_policy PrefillAdder.add_one_req)
#     and retracts when a decode step finds no room (whether and how often it retracts is a measurement, recorded by
#     test_long_pool_empty_when_idle, not a check; "measure on first GPU run", docs/gpu-boxes.md). Every request
#     still fits alone: the scheduler clamps max_new_tokens to pool - ceil_page(input) - page - 1 >= 463 new tokens;
#   --swa-full-tokens-ratio 0.5: the sliding-window pool half the full one (320 slots; default 0.8), so the SWA pool
#     is tight too (a 160-token prompt holds its window's 64 + the chunk being written);
#   --page-size 16 (topk 3 only): radix hits and the pool counted in 16-token pages;
#   --swa-full-tokens-ratio 0.75 on that paged server (480 slots): under the spec-v2 worker (0.5.17, 0.5.23) each
#     decoding request there holds 2 x 96 draft slots ahead of its committed tokens in both pools (mem_cache
#     allocation_sizing.get_alloc_reserve_per_decode: topk 3 x 2 pages per branch, doubled), besides the 64 tokens of
#     its prompt the radix tree keeps SWA-locked (SWARadixCache.inc_lock_ref) and its decoded tokens: ~64 + 81 + 192 +
#     a page = ~353 SWA slots for one request to the limit, more than 320, and a lone request that cannot fit is
#     aborted "Out of memory even after retracting all other requests" (ScheduleBatch.retract_decode). 480 holds it
#     (and the prefix pair's first request, ~360, without evicting its own prefix from the SWA pool, which would
#     tombstone the repeat's radix hit); two such requests still cannot decode together (2 x ~290 > 480).
LONG_CONTEXT_LEN = 256
LONG_CHUNK = 32
LONG_POOL_TOKENS = 640
LONG_SWA_RATIO = 0.5
LONG_PAGED_SWA_RATIO = 0.75
LONG_PAGE = 16
_LONG_LIMITS = (
    "--context-length",
    str(LONG_CONTEXT_LEN),
    "--chunked-prefill-size",
    str(LONG_CHUNK),
    "--max-total-tokens",
    str(LONG_POOL_TOKENS),
)
LONG_TIGHT_ARGS = (*_LONG_LIMITS, "--swa-full-tokens-ratio", str(LONG_SWA_RATIO))
LONG_PAGED_ARGS = (*_LONG_LIMITS, "--swa-full-tokens-ratio", str(LONG_PAGED_SWA_RATIO), "--page-size", str(LONG_PAGE))
# With the decoys the default suite runs in 1.17-1.19 x one cold launch (limit 1.5; one H200,
# docs/runs/2026-12-01b-h200-smoke-launch-budget.json.gz).
DECOY_IN_DEFAULT_SUITE = True
SMOKE_SERVERS = (
    SmokeServerSpec("random-nomtp", "random", None),
    SmokeServerSpec("random-mtp-topk1-dummy", "random", 1, "dummy"),
    SmokeServerSpec("random-mtp-topk3", "random", 3),
    # The constructed pair drafts from the token alone: blind to hidden state, KV and positions (kept on demand to
    # tell a broken verify path from a broken hand-off).
    SmokeServerSpec("constructed-mtp-topk1", "constructed", 1, default=False),
    SmokeServerSpec("constructed-mtp-topk3", "constructed", 3, default=False),
    # The witness pair needs every hand-off (mtpmatrix.pairs.witness), built for the draft phase sglang uses: any broken
    # hidden state, KV layer, position, tree parent or batch row drops its accept length to ~1 (H200, sglang 0.5.17:
    # 6.00 of 6 intact; every hand-off mutant of mtpmatrix.faults.catalogue killed, docs/fault-injection.md).
    SmokeServerSpec("witness-mtp-topk1", "witness-sglang-phase", 1, mode_args=WITNESS_SURFACE_ARGS),
    SmokeServerSpec("witness-mtp-topk3", "witness-sglang-phase", 3, mode_args=WITNESS_SURFACE_ARGS),
    # The same witness built for transformers' draft phase: sglang's phase differs (known_upstream.json), so this
    # server's acceptance is reported by its own check, apart from the hand-off gate.
    SmokeServerSpec("witness-transformers-phase-topk1", "witness", 1),
    # The sampled pair (mtpmatrix.pairs.sampled): a closed-form next-token distribution, a drafter that proposes
    # another; sampled requests must come out with the target's own distribution, with and without MTP.
    SmokeServerSpec("sampled-nomtp", "sampled", None),
    SmokeServerSpec("sampled-mtp-topk1", "sampled", 1),
    SmokeServerSpec("sampled-mtp-topk3", "sampled", 3),
    # The decoy witness (mtpmatrix.pairs.decoy): at known inputs the drafter ranks a wrong decoy first, so topk 1
    # must reject it and topk 3 must follow the second branch, fed its own parent; every request's accept length is
    # predicted exactly (topk 1: 3.56 or 4.0, topk 3: 5.33 on the e-series prompts).
    SmokeServerSpec("decoy-mtp-topk1", "decoy-sglang-phase", 1, default=DECOY_IN_DEFAULT_SUITE),
    SmokeServerSpec("decoy-mtp-topk3", "decoy-sglang-phase", 3, default=DECOY_IN_DEFAULT_SUITE),
    # The request surface (mtpmatrix.tiers.surface): the witness without MTP answers every request family the MTP
    # witness servers get (stops, logprobs, sampling features), so each is held to MTP equals no-MTP on one pair.
    SmokeServerSpec("witness-nomtp", "witness-sglang-phase", None, mode_args=WITNESS_SURFACE_ARGS),
    # Modes no other server runs: the non-overlap scheduler (0.5.17+: the v2 worker under the non-overlap event
    # loop; 0.5.13's only mode), and the eager draft/verify path (batches above --cuda-graph-max-bs run without CUDA
    # graphs).
    SmokeServerSpec("decoy-mtp-topk3-no-overlap", "decoy-sglang-phase", 3, mode_args=NO_OVERLAP_ARGS),
    # ... and seeded: sampling_seed is honoured only under --enable-deterministic-inference (test_smoke_sampling's
    # test_seeded_repeats_identical); triton attention is a deterministic backend in 0.5.13 and 0.5.17
    # (server_args.DETERMINISTIC_ATTENTION_BACKEND_CHOICES), speculative decoding refuses it only with
    # --speculative-use-rejection-sampling (0.5.17 arg_groups/speculative_hook.py).
    SmokeServerSpec("sampled-mtp-topk1-no-overlap", "sampled", 1, mode_args=(*NO_OVERLAP_ARGS, *SEEDED_ARGS)),
    SmokeServerSpec(
        "witness-mtp-topk3-eager",
        "witness-sglang-phase",
        3,
        mode_args=(*EAGER_ABOVE_ARGS, *CUSTOM_LOGIT_PROCESSOR_ARGS),
    ),
    # The long-and-tight family: prompts longer than the window in chunks, shared prefixes longer than the window
    # (radix hits), requests to the context limit, an abort mid-batch, on a pool small enough to retract; MTP output
    # must equal the no-MTP twin's and the long witness's rule exactly (tests/tiers/test_smoke_long.py).
    SmokeServerSpec("long-witness-nomtp", "long-witness-sglang-phase", None, mode_args=LONG_TIGHT_ARGS),
    SmokeServerSpec("long-witness-mtp-topk1", "long-witness-sglang-phase", 1, mode_args=LONG_TIGHT_ARGS),
    SmokeServerSpec("long-witness-mtp-topk3-paged", "long-witness-sglang-phase", 3, mode_args=LONG_PAGED_ARGS),
    # On demand, to tell the page size's part in a long-family deviation from the tree's and the worker's: topk 3 with
    # the paged server's settings less --page-size, topk 1 and no MTP with all of them.
    SmokeServerSpec(
        "long-witness-mtp-topk3", "long-witness-sglang-phase", 3, mode_args=LONG_PAGED_ARGS[:-2], default=False
    ),
    SmokeServerSpec(
        "long-witness-mtp-topk1-paged", "long-witness-sglang-phase", 1, mode_args=LONG_PAGED_ARGS, default=False
    ),
    SmokeServerSpec(
        "long-witness-nomtp-paged", "long-witness-sglang-phase", None, mode_args=LONG_PAGED_ARGS, default=False
    ),
)
DEFAULT_SMOKE_SERVERS = tuple(s for s in SMOKE_SERVERS if s.default)
# What fault injection (mtpmatrix.faults.mutants) serves per mutant: the witness servers see every hand-off.
WITNESS_SERVERS = ("witness-mtp-topk1", "witness-mtp-topk3")
# What sees sampled verify (temperature, top-k/top-p renormalisation, accept thresholds, residual): each MTP server's
# sampled output is held to the closed form on its own (test_sampled_distribution_matches_closed_form).
SAMPLED_SERVERS = ("sampled-mtp-topk1", "sampled-mtp-topk3")
DECOY_SERVERS = ("decoy-mtp-topk1", "decoy-mtp-topk3")  # the decoy witness: off the top-1 chain
LONG_SERVERS = ("long-witness-nomtp", "long-witness-mtp-topk1", "long-witness-mtp-topk3-paged")


# the long-and-tight flags and the ServerArgs field each sets (contract tier: each must resolve to the value asked)
LONG_TIGHT_FIELDS = {
    "--context-length": ("context_length", int),
    "--chunked-prefill-size": ("chunked_prefill_size", int),
    "--max-total-tokens": ("max_total_tokens", int),
    "--swa-full-tokens-ratio": ("swa_full_tokens_ratio", float),
    "--page-size": ("page_size", int),
}


def long_tight_settings(spec: SmokeServerSpec) -> dict[str, int | float]:
    """The ServerArgs values a server's long-and-tight flags (its mode_args) ask for; {} for the other servers."""
    args = list(spec.mode_args)
    return {
        field: kind(args[i + 1])
        for i, flag in enumerate(args[:-1])
        if flag in LONG_TIGHT_FIELDS
        for field, kind in [LONG_TIGHT_FIELDS[flag]]
    }


def page_size(spec: SmokeServerSpec) -> int:
    """The --page-size a smoke server runs with (its mode_args; sglang's default 1 otherwise)."""
    args = list(spec.mode_args)
    return int(args[args.index("--page-size") + 1]) if "--page-size" in args else 1


@dataclass(frozen=True)
class SmokeOptions:
    """The smoke tier's environment knobs, checked (see ``smoke_options``)."""

    pair: str = "e-series"  # MTPMATRIX_SMOKE_PAIR: tiny pair family
    tp: int = 1  # MTPMATRIX_SMOKE_TP
    specs: tuple[SmokeServerSpec, ...] = DEFAULT_SMOKE_SERVERS  # MTPMATRIX_SMOKE_SERVERS: by name
    parallel: int | None = None  # MTPMATRIX_SMOKE_PARALLEL; None = from free GPU memory
    extra_args: tuple[str, ...] = ()  # MTPMATRIX_SMOKE_EXTRA_ARGS, split like a shell would
    swap_drafters: bool = False  # MTPMATRIX_SMOKE_SWAP_DRAFTERS=1: fault injection (wrong drafter)


def smoke_options(env: Mapping[str, str] | None = None) -> SmokeOptions:
    """The smoke knobs from ``env``; ValueError with one line naming the variable and what it accepts."""
    env = os.environ if env is None else env
    pair = env.get("MTPMATRIX_SMOKE_PAIR") or "e-series"
    if pair not in TINY_PAIR_NAMES:
        raise ValueError(f"MTPMATRIX_SMOKE_PAIR={pair!r} is not a tiny pair; known: {', '.join(TINY_PAIR_NAMES)}")
    tp = _positive_int(env, "MTPMATRIX_SMOKE_TP") or 1
    names = comma_list(env.get("MTPMATRIX_SMOKE_SERVERS"))
    known = [s.name for s in SMOKE_SERVERS]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"MTPMATRIX_SMOKE_SERVERS: unknown server(s) {', '.join(unknown)}; known: {', '.join(known)}")
    specs = tuple(s for s in SMOKE_SERVERS if (s.name in names if names else s.default))
    try:
        extra = tuple(shlex.split(env.get("MTPMATRIX_SMOKE_EXTRA_ARGS") or ""))
    except ValueError as exc:
        raise ValueError(f"MTPMATRIX_SMOKE_EXTRA_ARGS does not split like shell words: {exc}") from None
    owned = [a for a in extra if a.split("=", 1)[0] in ("--host", "--port", "--model-path", "--tp-size")]
    if owned:
        raise ValueError(f"MTPMATRIX_SMOKE_EXTRA_ARGS may not set {', '.join(owned)}: the tier sets those itself")
    return SmokeOptions(
        pair=pair,
        tp=tp,
        specs=specs,
        parallel=_positive_int(env, "MTPMATRIX_SMOKE_PARALLEL"),
        extra_args=extra,
        swap_drafters=env.get("MTPMATRIX_SMOKE_SWAP_DRAFTERS") == "1",
    )


def collection_options() -> SmokeOptions:
    """The smoke knobs for parametrising the smoke checks at collection: the defaults when a knob is bad (with the
    smoke tier selected the plugin has already stopped pytest with its one line; without it, a bad knob must not
    break collecting the other tiers)."""
    try:
        return smoke_options()
    except ValueError:
        return SmokeOptions()


def _positive_int(env: Mapping[str, str], name: str) -> int | None:
    raw = (env.get(name) or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {raw!r}")
    return int(raw)
