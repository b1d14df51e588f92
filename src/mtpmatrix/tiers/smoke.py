"""GPU smoke tier: live sglang servers with Frozen-KV MTP on tiny Gemma 4 pairs.

One collection pass (mtpmatrix.tiers.smoke_collect) launches every server (no-MTP reference, MTP topk 1 and 3,
dummy and safetensors weights), sends the same greedy requests through the GSM8K tier's client (text in/out and token
ids), reads /server_info and the server log, and stops it; the tests then assert on what was collected. This module
says what the servers are sent (prompts, arguments) and judges what came back.

Servers launch side by side when the GPU has room (``launch_plan.launch_parallelism``): a launch is mostly
CPU-bound Triton compilation, processor loading and CUDA-graph capture, and five in turn took ~6 min on an H200;
the default servers launch in one wave on an idle H200 (15 of them in 3.2 min from cold, 2026-12-02; 18 since
the long-and-tight family). A server that fails
while others share the GPU is relaunched alone before its failure counts, so contention never becomes a verdict; a
failure that repeats alone stands for every server that failed the same way beside it (``failure_signature``), so a
broken release costs one relaunch, not one per server.

The pairs, built on the fly by mtpmatrix.pairs (``SMOKE_SERVERS`` says which server serves which):
- *random*: saved random weights (accept length ~1.0; bf16 near-ties may flip a few greedy tokens);
- *constructed* and *witness*: both models compute next = token + 1, so greedy output is known exactly and every
  draft is right (the witness at sglang's draft phase only when every Frozen-KV hand-off is): the accept length must
  be its maximum (``EXACT_PAIR_MIN_ACCEPT``). A drop means a hand-off or the acceptance machinery broke;
- *decoy*: the witness with a wrong draft ranked first at known inputs: each request's accept length is predicted
  exactly at topk 1 and 3;
- *sampled*: a closed-form next-token distribution; sampled requests must come out with it, with and without MTP.
The per-request speculative meta_info fields and /server_info's average must agree (mtpmatrix.tiers.compat.meta_fields).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core import settings
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.core.smoke_servers import SmokeServerSpec

PROMPT_LEN = 12
MAX_NEW_TOKENS = 32
N_ID_PROMPTS = 8
TEXT_PROMPTS = ("The quick brown fox", "Question: 2 + 3 = ?\nAnswer:", "Gemma four speaks", "1 2 3 4 5")
# A target CUDA graph is captured by the model runner; the draft's by the Frozen-KV MTP worker. Messages differ
# across releases ("Capture cuda graph end", "Capture decode CUDA graph end", ...), so match loosely but never let
# the draft line count as the target's.
TARGET_GRAPH_RE = re.compile(r"Capture (?!Frozen-KV|draft)[\w\- ]*?(?:cuda|CUDA) graph end")
DRAFT_GRAPH_RE = re.compile(r"Capture Frozen-KV MTP draft (?:cuda|CUDA) graph end")


def all_drafts_accepted_length(completion_tokens: int, steps: int) -> float:
    """Accept length (completion tokens / verify steps, client.accept_length_from_meta) of a request whose every
    draft is accepted: its first token comes from prefill and each verify step keeps at most ``steps`` + 1 tokens
    (its drafts and the bonus token), so the other completion_tokens - 1 take ceil((completion_tokens - 1) /
    (steps + 1)) verify steps. No drafter, right or wrong, gets above it."""
    return completion_tokens / math.ceil((completion_tokens - 1) / (steps + 1))


# The exact pairs (witness at sglang's draft phase, constructed) draft every token right when the path is intact, so
# their accept length per request is the maximum, 32 / 6 = 5.3333, at topk 1 and 3 alike (the greedy chain is in
# the draft tree). Exact, not a margin: the witness's draft logits put the right token >= 9.8 nats above any other
# (LOGIT_PEAK 20 x code_margin 0.49 on the tiny pairs' codes), the constructed pair's ~2.4, while bf16 moves a
# logit of 20 by <= 0.08; no draft flips, and one lost draft in the 8 requests already gives 256 / 49 = 5.22.
# Intact, measured 5.333 at topk 1 and 3: docs/runs/2026-11-30d-h200-sglang-0.5.13-smoke-default.json.gz (witness),
# 2026-11-30b-h200-sglang-0.5.17-smoke-tp1-side-by-side.json.gz, 2026-11-30b-h200x2-sglang-0.5.17-smoke-tp2-moe.json.gz
# and -tp2-dense31b.json.gz (constructed). Broken, docs/runs/2026-11-30d-h200-sglang-0.5.1{3,7}-mutants.json.gz: 3.507
# (hand-off from the verify block's first position, topk 1 and 3), 2.977 (tree parent), 2.17-2.39 (topk batch
# rows), 2.667 (per-request accept count), 2.032 (draft positions), 1.03-1.10 (KV layer, verify rows).
EXACT_PAIR_ACCEPT_LENGTH = all_drafts_accepted_length(MAX_NEW_TOKENS, settings.NUM_STEPS)
# Floor = that maximum, cut to the 4 decimals accept_length_from_meta rounds to; the same at every topk.
EXACT_PAIR_MIN_ACCEPT = {topk: math.floor(EXACT_PAIR_ACCEPT_LENGTH * 1e4) / 1e4 for topk in settings.TOPKS}
# The witness tier demands that topk 3 ran with several requests in one draft/verify batch (batch expansion at
# topk > 1 is one of the things the witness checks), read from the server's decode log lines.
WITNESS_MIN_BATCH = 4
RUNNING_REQ_RE = re.compile(r"#running-req[:=]\s*(\d+)")
# Random weights give flat logits, so MTP (verify over 6-12 tokens at once) and no-MTP (one token at a time) take
# different kernels and split bf16 near-ties differently: on an H200 (0.5.17) only 2/8 sequences were identical.
# The check therefore looks at the first token where a sequence diverges: the no-MTP server's own top logprobs
# there must show a near-tie between the two tokens. Any other divergence is a real mismatch.
NEAR_TIE_NATS = 0.05
# Enough of the no-MTP ranking to place the MTP token at a divergence (its rank and gap) even when it is not 2nd.
TOP_LOGPROBS = 10


@dataclass
class SmokeRun:
    spec: SmokeServerSpec
    log_path: Path
    vocab_size: int = 0
    launch_seconds: float | None = None
    error: BaseException | None = None
    server_info_before: dict | None = None
    server_info_after: dict | None = None
    id_outputs: list[list[int]] = field(default_factory=list)
    id_meta: list[dict] = field(default_factory=list)
    id_top_logprobs: list[list] = field(default_factory=list)  # no-MTP only: per position [(logprob, id), ...]
    text_outputs: list[str] = field(default_factory=list)
    text_meta: list[dict] = field(default_factory=list)
    sampled_requests: list = field(
        default_factory=list
    )  # sampled pair: the plan sent (pairs.sampled.ring.SampledRequest)
    sampled_outputs: list[list[int]] = field(default_factory=list)
    sampled_meta: list[dict] = field(default_factory=list)
    # the request families (mtpmatrix.tiers.surface) by name: what was sent and what came back
    surface: dict[str, list] = field(default_factory=dict)
    request_seconds: float | None = None
    gpu_memory_mib: int | None = None  # what the server's processes held on the GPU once ready (nvidia-smi)
    first_attempt_error: str | None = None  # set when a side-by-side launch failed and this run is the relaunch
    # failed beside others the way this server (named) failed beside them and again alone: not relaunched
    confirmed_alone_by: str | None = None
    # failed beside others exactly as a known-upstream entry for this server and release says (its kind and message,
    # the exception a run alone established): not relaunched, the entry's id
    known_upstream_no_relaunch: str | None = None
    log_text: str = ""
    # the request families sent after server_info_after was read (surface LAST: they can kill a release's server)
    sent_after_info: frozenset[str] = frozenset()

    @property
    def all_meta(self) -> list[dict]:
        """The meta_info of every request the tier sent this server (token ids, text, sampled, every family)."""
        return self.info_meta + [
            m for family in self.sent_after_info for x in self.surface.get(family, []) for m in x.metas
        ]

    @property
    def info_meta(self) -> list[dict]:
        """The meta_info of the requests answered before server_info_after was read: what its lifetime counters
        count."""
        return (
            self.id_meta
            + self.text_meta
            + self.sampled_meta
            + [
                m
                for family, exchanges in self.surface.items()
                if family not in self.sent_after_info
                for x in exchanges
                for m in x.metas
            ]
        )

    def exchanges(self, family: str) -> list:
        """What the request family ``family`` sent this server and got back (surface.Exchange), in its order."""
        return self.surface.get(family, [])


def id_prompts(vocab_size: int, n: int = N_ID_PROMPTS, length: int = PROMPT_LEN) -> list[list[int]]:
    """Deterministic token-id prompts inside the vocabulary, away from special ids and the top end (so t+1 rules
    never wrap or hit EOS within MAX_NEW_TOKENS)."""
    lo, hi = 16, vocab_size - MAX_NEW_TOKENS - 2
    step = max(1, (hi - lo - length) // max(1, n))
    return [[lo + (i * step + j * 7) % (hi - lo) for j in range(length)] for i in range(n)]


def expected_constructed(prompt: list[int], n: int = MAX_NEW_TOKENS) -> list[int]:
    return [prompt[-1] + i for i in range(1, n + 1)]


def sampling_params() -> dict:
    return {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}


def sampled_plan(spec: SmokeServerSpec) -> list:
    """The sampled requests a server gets besides the greedy ones: the sampled pair's plan, else none."""
    if spec.pair != "sampled":
        return []
    from mtpmatrix.pairs.sampled import ring

    return ring.request_plan()


def server_args_for(
    spec: SmokeServerSpec, target: Path, assistant: Path, tp: int, extra_args: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """sglang arguments of one smoke server; ``extra_args`` (MTPMATRIX_SMOKE_EXTRA_ARGS) go last, so they win."""
    from mtpmatrix.tiers.compat.sglang_compat import spelled_for_release

    extra = ["--load-format", spec.load_format] if spec.load_format != "auto" else []
    argv = settings.server_args(
        target,
        assistant=assistant if spec.topk else None,
        topk=spec.topk,
        tp=tp,
        base=settings.SMOKE_ARGS,
        extra=[*extra, *spec.mode_args, *extra_args],
    )
    return spelled_for_release(argv)  # the server runs the sglang this process has installed


@dataclass(frozen=True)
class SmokeJob:
    """One server to collect: its spec, the pair folders it serves and the target's vocabulary size."""

    spec: SmokeServerSpec
    target: Path
    assistant: Path
    vocab_size: int


def known_to_fail_alone(error: BaseException | None, server: str, versions: dict, issues=None) -> str | None:
    """The id of the known-upstream entry this server's failure already matches, by what can be told at launch: the
    entry lists this server's test_server_serves case, covers this release, and its kind and pattern match the
    failure. Such an entry was written from a run that relaunched the server alone and saw the same exception (H200,
    sglang 0.5.13: two crashed servers relaunched one after the other made the suite 2.39 x one cold launch), so
    a relaunch would repeat it. Whether the failure is reported as that entry is still decided per check, by the
    whole signature. None: relaunch as usual."""
    if not isinstance(error, CheckFailure):
        return None
    from mtpmatrix.core import known_upstream

    text = f"CheckFailure: {error}"
    for issue in known_upstream.load() if issues is None else issues:
        if (
            issue.tier == "smoke"
            and issue.kind == error.kind
            and f"test_server_serves[{server}]" in issue.checks
            and issue.applies_to(versions)
            and re.search(issue.match, text) is not None
        ):
            return issue.id
    return None


def failure_signature(error: BaseException | None, name: str) -> tuple[str, str] | None:
    """How a server failed, comparable across servers and attempts: the failure kind and the first line of its
    message with the server's name and every number (seconds, ports, exit codes) masked. None for anything but a
    server's own classified failure (CheckFailure from SglangServer or the requests)."""
    if not isinstance(error, CheckFailure):
        return None
    first = (str(error).splitlines() or [""])[0]
    return error.kind, re.sub(r"\d+", "#", first.replace(name, "<server>"))


def max_running_requests(log_text: str) -> int:
    """The largest batch the server logged (#running-req of its decode lines); 0 when it logged none."""
    return max((int(m) for m in RUNNING_REQ_RE.findall(log_text)), default=0)


def accept_length_problem(spec: SmokeServerSpec, metas: list[dict], steps: int = settings.NUM_STEPS) -> str | None:
    """What is wrong with the accept length of an MTP server's token-id responses (``metas``, MAX_NEW_TOKENS each);
    None when nothing.

    Every server: each response ran a verify step, and the pooled accept length lies in [1, EXACT_PAIR_ACCEPT_LENGTH]
    (a verify step keeps at least its bonus token and at most ``steps`` + 1 tokens; outside that the counters are
    wrong, whatever the drafts). That is all the random pair is held to: a presence check, "speculative decoding
    ran", since its drafts are right by chance only (1.03-1.05 measured, and a broken path gives the same ~1). An
    exact pair gated on hand-offs (witness at sglang's phase, constructed) must reach EXACT_PAIR_MIN_ACCEPT.
    """
    from mtpmatrix.serving.client import accept_length_from_meta

    got = accept_length_from_meta(metas)
    if got is None:
        return "responses carry no spec_verify_ct (speculative decoding did not run)"
    unverified = [m for m in metas if not m.get("spec_verify_ct")]
    if unverified:
        return f"{len(unverified)}/{len(metas)} responses ran no verify step: speculative decoding did not run for them"
    ceiling = math.floor(all_drafts_accepted_length(MAX_NEW_TOKENS, steps) * 1e4) / 1e4
    # the decoy witness's exact per-request value is test_decoy_accept_matches_prediction's business
    if spec.exact and not spec.phase_reference and not spec.decoy:
        floor = EXACT_PAIR_MIN_ACCEPT[spec.topk]
        if not floor <= got <= ceiling + 1e-4:
            return (
                f"accept length {got} outside [{floor}, {ceiling}]: an intact path accepts every draft of this "
                f"pair ({MAX_NEW_TOKENS} tokens in {math.ceil((MAX_NEW_TOKENS - 1) / (steps + 1))} verify steps "
                f"per request); a broken hand-off loses drafts"
            )
    elif not settings.NO_DRAFT_ACCEPT_LENGTH <= got <= ceiling + 1e-4:
        return (
            f"accept length {got} outside [{settings.NO_DRAFT_ACCEPT_LENGTH}, {ceiling}], the range any drafter "
            f"gives (a verify step keeps 1 to {steps + 1} tokens): the spec counters are wrong"
        )
    return None


def accept_length_floor(spec: SmokeServerSpec) -> float | None:
    """The least per-request accept length a smoke MTP server's checks let pass (what the report draws as its
    floor): an exact pair's all-drafts maximum (accept_length_problem; the transformers-phase witness is held to it by
    test_draft_phase_matches_transformers), none for the decoy (each request's own is predicted exactly,
    test_decoy_accept_matches_prediction), else NO_DRAFT_ACCEPT_LENGTH (a presence check)."""
    if spec.decoy or spec.topk is None:
        return None
    return EXACT_PAIR_MIN_ACCEPT[spec.topk] if spec.exact else settings.NO_DRAFT_ACCEPT_LENGTH


def phase_moved(spec: SmokeServerSpec, runs) -> str | None:
    """Why a server built for sglang's draft phase (``*-sglang-phase``) lost its drafts, when the witness built for
    transformers' phase beside it drafted right: the sglang under test drafts at transformers' phase, not at the one
    these servers were built for (a fixed release still inside SGLANG_DRAFT_PHASES, or a candidate that moves the
    phase without declaring it). None when that is not the story (``runs``: the smoke runs, by server name)."""
    from mtpmatrix.pairs.witness.phase import REFERENCE_DRAFT_PHASE, sglang_draft_phase
    from mtpmatrix.serving.client import accept_length_from_meta

    if not spec.pair.endswith("-sglang-phase"):
        return None
    reference = [r for r in runs.values() if r.spec.phase_reference]
    got = accept_length_from_meta(reference[0].id_meta) if reference else None
    if got is None or got < EXACT_PAIR_MIN_ACCEPT[reference[0].spec.topk]:
        return None
    built, ref = sglang_draft_phase(), REFERENCE_DRAFT_PHASE
    return (
        f"draft phase moved: this server's pair is built for sglang's draft phase {built:+d}, while the witness "
        f"built for transformers' phase {ref:+d} accepts {got:.2f} per verify: this sglang drafts at {ref:+d} "
        f"(a candidate that moves the phase declares it: 'Draft-Phase: {ref:+d}' in its patch, or "
        f"--draft-phase {ref:+d})"
    )


@dataclass
class Divergence:
    sequence: int
    position: int
    reference_token: int
    mtp_token: int
    gap_nats: float | None  # reference logprob(reference token) - logprob(mtp token); None: mtp token not in top-k
    mtp_rank: int | None = None  # 1-based rank of the MTP token in the reference's top-k there; None: not in it

    @property
    def near_tie(self) -> bool:
        return self.gap_nats is not None and self.gap_nats <= NEAR_TIE_NATS


def divergences(reference: SmokeRun, mtp: SmokeRun) -> list[Divergence]:
    """The first divergence of each MTP sequence from the no-MTP reference, judged on the reference's logprobs."""
    out = []
    for s, (ref, got) in enumerate(zip(reference.id_outputs, mtp.id_outputs)):
        pos = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
        if pos is None:
            continue
        ranked = (
            reference.id_top_logprobs[s][pos]
            if s < len(reference.id_top_logprobs) and pos < len(reference.id_top_logprobs[s])
            else []
        )
        top = {tid: lp for lp, tid in ranked}
        gap = top[ref[pos]] - top[got[pos]] if ref[pos] in top and got[pos] in top else None
        rank = next((i + 1 for i, (_lp, tid) in enumerate(ranked) if tid == got[pos]), None)
        out.append(Divergence(s, pos, ref[pos], got[pos], None if gap is None else round(gap, 5), rank))
    return out
