"""What a qualification needs, defined once, and the tier verdicts derived from it.

A tier is ``passed`` only when its whole expected set ran and passed (``known-upstream`` when some of it failed
matching a known-upstream entry's signature); a tier where nothing failed but part of the set did not run, or ran
less than the seed suite asks, is ``partial``, with what did not run and why (``missing``). The expected set of
each tier is defined in the project (evidence/expected_checks.py: ``expected_checks.json``, what ``tests/tiers``
collects with no knob), never read from what a session collected:

  contract, reference   every check of the tier
  smoke                 the default smoke servers (smoke_servers.DEFAULT_SMOKE_SERVERS) x their checks; a check of a server
                        outside the defaults is not needed (it still fails the tier if it fails)
  gsm8k                 the seed cases (settings.DEFAULT_PAIRS x settings.TOPKS at each pair's TP) x their checks,
                        each case scoring settings.GSM8K_NUM_EXAMPLES questions gated at its pair's own threshold (an
                        ungated case -- the tiny proof pair, an unknown --server-url model -- is no seed case)

What a session was asked is recorded by the pytest plugin as ``selection`` in tiers.json (and copied to row.json):
the pytest args, -k / -m / --deselect / --maxfail, the positional paths (node ids narrow collection), every
``MTPMATRIX_*`` knob, and per tier the ids of every check collected. Any subset selection makes the tier partial; a
run without a ``selection`` (written before schema 3) cannot show it ran everything and is partial too.

``judge_tiers`` is the one derivation of tier verdicts: the plugin writes its result to tiers.json, ``import``, the
report, bisect probes and a canary's baseline run it again over stored records (``rejudge_record``: stored tags and
verdicts are never trusted, see known_upstream.apply).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mtpmatrix.core import settings
from mtpmatrix.core.evidence import expected_checks
from mtpmatrix.core.record_types import CheckRecord, MissingRecord, RowRecord, Selection, TierRecord, Tiers
from mtpmatrix.core.schema import FAILING, KNOWN_UPSTREAM, PARTIAL, TIERS, check_param, short_check_id, worst
from mtpmatrix.core.smoke_servers import DEFAULT_SMOKE_SERVERS
from mtpmatrix.core.store import row_verdict

if TYPE_CHECKING:
    from mtpmatrix.core.known_upstream import KnownIssue

KNOB_PREFIX = "MTPMATRIX_"
SGLANG_ENV_PREFIXES = ("SGLANG_", "SGL_")
# The variables torch and what it runs on read: torch's own (TORCH_*, PYTORCH_*, torch.compile's TORCHINDUCTOR_* and
# TORCHDYNAMO_*), the CUDA runtime and libraries' (CUDA_*, CUBLAS_*, CUBLASLT_*, CUDNN_*, NVIDIA_TF32_OVERRIDE: torch's
# "CUDA Environment Variables" page), NCCL's (NCCL_*: NCCL's "Environment Variables") and Triton's (TRITON_*: sglang's
# kernels). A session records these and, beyond them, only MTPMATRIX_* and SGLANG_* / SGL_*: never a token or
# another tool's setting.
TORCH_ENV_PREFIXES = (
    "TORCH_",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "NCCL_",
    "TRITON_",
)
TORCH_ENV_NAMES = ("NVIDIA_TF32_OVERRIDE",)
NOT_RECORDED = (
    "selection not recorded (a run written before schema 3): its pytest args, MTPMATRIX_* knobs and "
    "collected checks are unknown, so it cannot show it ran the whole tier"
)
SEED_NUM_EXAMPLES = settings.GSM8K_NUM_EXAMPLES


def knobs(env: Mapping[str, str]) -> dict[str, str]:
    """The ``MTPMATRIX_*`` variables of ``env``: what a row records of its environment (nothing else: no tokens)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(KNOB_PREFIX)}


def sglang_env(env: Mapping[str, str]) -> dict[str, str]:
    """The ``SGLANG_*`` / ``SGL_*`` variables of ``env``: sglang reads them (in the session's process and every server
    it starts, which inherit its environment) and the qualification suite sets none, so each one changes what is
    tested."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(SGLANG_ENV_PREFIXES)}


def torch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that torch, CUDA, NCCL or Triton read (TORCH_ENV_PREFIXES, TORCH_ENV_NAMES): some
    only place things (which GPUs, where caches go, how much is logged), others change the numbers or the path
    served (TF32, cuBLAS workspaces, NCCL's algorithm); evidence/environment.py tells them apart."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(TORCH_ENV_PREFIXES) or k in TORCH_ENV_NAMES}


def seed_cases() -> dict[str, settings.ModelPair]:
    """{case id: pair} of the GSM8K seed suite (the pairs' settings.py values, before any env override)."""
    return {
        settings.gsm8k_case_id(name, k): settings.PAIRS[name] for name in settings.DEFAULT_PAIRS for k in settings.TOPKS
    }


def default_smoke_servers() -> tuple[str, ...]:
    return tuple(s.name for s in DEFAULT_SMOKE_SERVERS)


def narrowing(selection: Selection) -> str:
    """How the session deselected collected checks ('-k topk3; -m x; --deselect ...'), '' when it did not."""
    parts = []
    if selection.get("keyword"):
        parts.append(f"-k {selection['keyword']}")
    if selection.get("markexpr"):
        parts.append(f"-m {selection['markexpr']}")
    if selection.get("deselect"):
        parts.append(f"--deselect {' '.join(selection['deselect'])}")
    return "; ".join(parts)


def _node_ids(selection: Selection, tier_ids: list[str]) -> list[str]:
    """The node ids (``file::test``) among the session's paths that point into this tier's files."""
    files = {PurePosixPath(i.split("::", 1)[0]).name for i in tier_ids}
    return [p for p in selection.get("paths") or [] if "::" in p and PurePosixPath(p.split("::", 1)[0]).name in files]


def _not_run(chk: CheckRecord | None, selection: Selection) -> str:
    """Why an expected check did not pass without failing: its skip reason, deselection, or an early stop."""
    if chk is not None:
        return chk.get("reason") or f"{chk.get('outcome')}"
    how = narrowing(selection)
    if how:
        return f"deselected ({how})"
    if selection.get("maxfail"):
        return f"never ran (pytest stopped after --maxfail {selection['maxfail']})"
    return "never ran (pytest stopped before it)"


def _gsm8k_case_missing(
    pair: settings.ModelPair, checks: list[CheckRecord], knob: Mapping[str, str | None]
) -> str | None:
    """Why a seed case that ran is still not the seed case: ungated, fewer questions, another floor or TP."""
    acc = next((c for c in checks if short_check_id(c["id"]).startswith("test_accuracy[")), None)
    if acc is None or acc.get("outcome") != "passed":
        return None  # a failing check fails the tier; a missing or skipped one is reported as not run
    m = acc.get("metrics") or {}
    if m.get("gated") is not True or m.get("threshold") is None:
        return "ran ungated (threshold None): reported, not gated"
    if m.get("num_examples") != SEED_NUM_EXAMPLES:
        return f"scored {m.get('num_examples')} of {SEED_NUM_EXAMPLES} questions" + (
            f" (MTPMATRIX_GSM8K_NUM_EXAMPLES={knob['MTPMATRIX_GSM8K_NUM_EXAMPLES']})"
            if knob.get("MTPMATRIX_GSM8K_NUM_EXAMPLES")
            else ""
        )
    if m.get("threshold") != pair.threshold:
        return (
            f"gated at threshold {m.get('threshold')}, not the seed threshold {pair.threshold} "
            f"({settings.pair_env_key(pair.name, 'THRESHOLD')})"
        )
    tp = knob.get(settings.pair_env_key(pair.name, "TP"))
    if tp and tp != str(pair.tp):
        return f"ran at TP {tp} ({settings.pair_env_key(pair.name, 'TP')}), the seed case is TP {pair.tp}"
    return None


def _case_not_collected(tier: str, knob: Mapping[str, str | None], selection: Selection) -> str:
    if tier == "smoke":
        v = knob.get("MTPMATRIX_SMOKE_SERVERS")
        return f"not selected (MTPMATRIX_SMOKE_SERVERS={v})" if v else "not collected"
    if knob.get("MTPMATRIX_GSM8K_PAIR"):
        return "not run: tiny proof mode (MTPMATRIX_GSM8K_PAIR) replaces the seed pairs, ungated"
    if any(str(a).startswith("--server-url") for a in selection.get("args") or []):
        return "not served: --server-url runs only the cases its servers serve"
    v = knob.get("MTPMATRIX_GSM8K_PAIRS")
    return f"not selected (MTPMATRIX_GSM8K_PAIRS={v})" if v else "not collected"


def missing(tier: str, entry: TierRecord, selection: Selection | None) -> list[MissingRecord]:
    """What of ``tier``'s expected set (evidence.expected_checks: defined in the project, not read from what the
    session collected) did not run, or ran less than the seed suite asks: ``[{"what", "why"}]`` (a check, a case or
    server, or the session's selection), in a stable order, without duplicates."""
    checks = [c for c in entry.get("checks") or [] if isinstance(c, dict)]
    by_id = {c.get("id"): c for c in checks}
    out: list[tuple[str, str]] = []
    if selection is None:
        out.append(("selection", NOT_RECORDED))
        sel: Selection = {}
    else:
        sel = selection
    collected = set((sel.get("collected") or {}).get(tier) or [])
    definition = expected_checks.load()
    if definition is not None:
        defined = list(definition[tier])
    else:  # a made-up suite judged as collected (expected_checks.AS_COLLECTED): the default servers, the seed cases
        pool = (
            list((sel.get("collected") or {}).get(tier) or []) if selection is not None else [c["id"] for c in checks]
        )
        units = default_smoke_servers() if tier == "smoke" else tuple(seed_cases()) if tier == "gsm8k" else None
        defined = [
            i for i in pool if units is None or check_param(i) in units or (tier == "smoke" and check_param(i) is None)
        ]
    knob = sel.get("knobs") or {}
    nodes = _node_ids(sel, list(collected | set(defined)))
    if nodes:
        out.append(("selection", f"pytest was given node ids ({' '.join(nodes)}), not the whole tier"))
    if knob.get("MTPMATRIX_MUTANT"):
        out.append(("MTPMATRIX_MUTANT", "fault injection: sglang ran with a mutant"))
    if tier == "smoke" and knob.get("MTPMATRIX_SMOKE_SWAP_DRAFTERS") == "1":
        out.append(("MTPMATRIX_SMOKE_SWAP_DRAFTERS", "fault injection: exact pairs served with the wrong drafter"))

    if tier in ("smoke", "gsm8k"):
        units = default_smoke_servers() if tier == "smoke" else tuple(seed_cases())
        collected_units = {check_param(i) for i in collected}
        for unit in units:
            if unit not in collected_units:
                out.append((unit, _case_not_collected(tier, knob, sel)))
    for i in defined:
        chk = by_id.get(i)
        if chk is None and selection is not None and i not in collected:
            if tier in ("smoke", "gsm8k") and check_param(i) not in {check_param(c) for c in collected}:
                continue  # the whole server or case is missing: said once, above
            out.append(
                (
                    (check_param(i) if tier in ("smoke", "gsm8k") else None) or short_check_id(i),
                    "not in this session's suite: the expected check was never collected",
                )
            )
        elif chk is None or chk.get("outcome") == "skipped":
            what = (check_param(i) if tier in ("smoke", "gsm8k") else None) or short_check_id(i)
            out.append((what, _not_run(chk, sel)))
    if tier == "gsm8k":
        for case, pair in seed_cases().items():
            why = _gsm8k_case_missing(pair, [c for c in checks if check_param(str(c.get("id"))) == case], knob)
            if why:
                out.append((case, why))
    seen: dict[tuple[str, str], None] = {}
    for item in out:
        seen.setdefault(item, None)
    return [{"what": what, "why": why} for what, why in seen]


def judge_tier(tier: str, entry: TierRecord, selection: Selection | None) -> TierRecord:
    """Set ``entry``'s verdict (and ``missing``) from its checks, already tagged by known_upstream.apply.

    failed/error: a failure no known-upstream entry explains, or a session that stopped early; skipped: nothing ran;
    partial: nothing failed but the expected set did not all run; known-upstream: all of it ran, every failure
    matched an entry; passed: all of it ran and passed.
    """
    checks = entry.get("checks") or []
    failing = [c for c in checks if c.get("outcome") in FAILING]
    untagged = [c for c in failing if not c.get("known_upstream")]
    entry.pop("missing", None)
    if entry.get("incomplete") or (entry.get("verdict") in FAILING and not failing):
        # pytest stopped early, or died before writing records: proves nothing either way (harness)
        entry["verdict"] = entry["verdict"] if entry.get("verdict") in FAILING else "error"
        return entry
    if untagged:
        entry["verdict"] = worst(c["outcome"] for c in untagged)
        return entry
    if not any(c.get("outcome") in ("passed", *FAILING) for c in checks):
        entry["verdict"] = "skipped"
        if checks and not entry.get("reason"):
            entry["reason"] = "; ".join(sorted({c.get("reason", "") for c in checks}))
        return entry
    gaps = missing(tier, entry, selection)
    if gaps:
        entry["missing"] = gaps
    entry["verdict"] = PARTIAL if gaps else KNOWN_UPSTREAM if failing else "passed"
    return entry


def judge_tiers(
    tiers: Tiers,
    selection: Selection | None,
    versions: Mapping[str, str | None],
    issues: list[KnownIssue] | None = None,
) -> Tiers:
    """Every tier's verdict, derived again from its checks: stored known-upstream tags and verdicts are stripped and
    the current list (``issues``, default known_upstream.json) applied, then each tier judged against its expected
    set. Changes ``tiers`` in place and returns it."""
    from mtpmatrix.core import known_upstream

    known_upstream.apply(tiers, versions or {}, issues)
    for name, entry in tiers.items():
        judge_tier(name, entry, selection)
    return tiers


def rejudge_record(record: RowRecord, issues: list[KnownIssue] | None = None) -> RowRecord:
    """A row record with its tier verdicts derived again from its checks, its selection and the known-upstream list
    (``judge_tiers``; ``issues`` default known_upstream.json), and its row verdict from those; an unfinished row
    stays unfinished. What the report, bisect probes and a canary's baseline read. Changes ``record`` in place and
    returns it."""
    tiers = record.get("tiers")
    if isinstance(tiers, dict):
        judge_tiers(tiers, record.get("selection"), record.get("versions") or {}, issues)
    if record.get("verdict") not in (None, "pending"):
        record["verdict"] = row_verdict(record)
    return record


# What a tier, a row or a run proves, for a decision (the report's exit status, a bisect probe, a canary's baseline):
PROVEN = "passed"  # its whole expected set ran and passed
KNOWN_ONLY = KNOWN_UPSTREAM  # its whole expected set ran; every failure matched a known-upstream entry
BROKEN = "failed"  # a failure sglang or its dependencies own (any kind but harness, listed upstream bugs aside)
NOT_PROVEN = "not-proven"  # nothing that fails sglang, but not the whole set either: partial, skipped, pending,
#                            interrupted, or failures of the harness alone
STATES = (BROKEN, NOT_PROVEN, KNOWN_ONLY, PROVEN)  # worst first
HARNESS = "harness"


def unexplained_failures(entry: TierRecord) -> list[CheckRecord]:
    """The failing checks of a judged tier that no known-upstream entry explains."""
    return [
        c
        for c in entry.get("checks") or []
        if isinstance(c, dict) and c.get("outcome") in FAILING and not c.get("known_upstream")
    ]


def tier_state(entry: TierRecord | None) -> str:
    """The one reading of a judged tier (judge_tier's verdict and its checks) for every decision: BROKEN when a
    failure no known-upstream entry explains is of a kind other than ``harness`` (a harness hiccup beside an sglang
    failure does not hide it); NOT_PROVEN for a session that stopped early, a failure of the harness alone, a
    partial, skipped or unfinished tier; KNOWN_ONLY and PROVEN as their verdicts say."""
    if not isinstance(entry, dict):
        return NOT_PROVEN
    verdict = entry.get("verdict")
    if verdict == "passed":
        return PROVEN
    if verdict == KNOWN_UPSTREAM:
        return KNOWN_ONLY
    if verdict in FAILING:
        kinds = {
            f.get("kind") if isinstance(f := c.get("failure"), dict) else None for c in unexplained_failures(entry)
        }
        if kinds - {HARNESS}:  # an unclassified failure (kind None) counts against the release: never green
            return BROKEN
        return NOT_PROVEN  # harness only, or a tier-level error without checks (pytest died, stopped early)
    return NOT_PROVEN


def worst_state(states: Iterable[str]) -> str:
    """The worst of ``states`` (STATES order); NOT_PROVEN when there are none."""
    present = set(states)
    return next((s for s in STATES if s in present), NOT_PROVEN)


def complete(verdict: str | None) -> bool:
    """Whether a tier with this verdict ran its whole expected set without a failure sglang owns."""
    return verdict in ("passed", KNOWN_UPSTREAM)


def summarize(records: list[CheckRecord]) -> Tiers:
    """Per-tier verdicts from per-test records."""
    tiers: Tiers = {}
    for tier in TIERS:
        recs = [r for r in records if r["tier"] == tier]
        if not recs:
            tiers[tier] = {"verdict": "skipped", "reason": "no tests collected for this tier", "checks": []}
            continue
        outcomes = {"passed": "passed", "failed": "failed", "error": "error", "skipped": "skipped"}
        verdict = worst(outcomes[r["outcome"]] for r in recs)
        entry: TierRecord = {"verdict": verdict, "seconds": round(sum(r["seconds"] for r in recs), 3), "checks": recs}
        if verdict == "skipped":
            reasons = sorted({r.get("reason", "") for r in recs})
            entry["reason"] = reasons[0] if len(reasons) == 1 else "; ".join(reasons)
        failures = [r["failure"] for r in recs if "failure" in r]
        if failures:
            entry["failure_kinds"] = sorted({f["kind"] for f in failures})
        tiers[tier] = entry
    return tiers
