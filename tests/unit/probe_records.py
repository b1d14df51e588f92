"""Row records for bisect and canary tests, built from recorded runs: the default smoke suite on an H200 (sglang
0.5.13, docs/runs), whose only failure is the draft-phase known upstream issue every 0.5.13-0.5.23 smoke run
carries, with its stored tags stripped (a record is judged again wherever it is read)."""

from __future__ import annotations

import copy
from pathlib import Path

from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.runner.probe import BAD, GOOD, UNTESTABLE, Probe

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
SMOKE_RUN = read_json_or_gzip(RUNS / "2026-11-30d-h200-sglang-0.5.13-smoke-default.json.gz")
DRAFT_PHASE = "sglang-gemma4-mtp-draft-rope-phase"
HARNESS_CHECK = "tests/tiers/test_smoke.py::test_topk_batch_served_together[witness-mtp-topk3]"
HARNESS_FAILURE = {
    "kind": "harness",
    "type": "CheckFailure",
    "message": "the smoke tier never batched 4 requests at topk 3",
    "frame": None,
    "raised_at": "tests/tiers/test_smoke.py:201 in test_topk_batch_served_together",
}


def selection(tiers: dict) -> dict:
    """A session that ran exactly the given checks, without narrowing (so no tier is partial for its selection)."""
    return {
        "args": [],
        "knobs": {},
        "paths": [],
        "collected": {name: [c["id"] for c in t.get("checks") or []] for name, t in tiers.items()},
    }


def smoke_tier(*, harness_error: bool = False, tagged: bool = True) -> dict:
    """The recorded smoke tier: the draft-phase check fails, everything else passes. ``harness_error``: one more check
    errors in the harness beside it (stored verdict 'error', as the plugin writes it). ``tagged``: keep the stored
    known-upstream tag and verdict (what a record carries; judging strips and derives them again)."""
    tier = copy.deepcopy(SMOKE_RUN["tiers"]["smoke"])
    for c in tier["checks"]:
        if not tagged:
            c.pop("known_upstream", None)
        if harness_error and c["id"] == HARNESS_CHECK:
            c.update(outcome="error", failure=dict(HARNESS_FAILURE))
    if not tagged:
        tier.pop("known_upstream", None)
        tier["verdict"] = "failed"
    if harness_error:
        tier["verdict"] = "error"
        tier["failure_kinds"] = ["acceptance", "harness"]
    return tier


def smoke_record(versions: dict, **kw) -> dict:
    """A finished row record whose only tier is the recorded smoke tier (``smoke_tier``), at ``versions``."""
    tiers = {"smoke": smoke_tier(**kw)}
    verdict = "error" if kw.get("harness_error") else "passed"
    return {
        "verdict": verdict,
        "versions": dict(versions),
        "install": {"verdict": "passed", "seconds": 10.0},
        "suite": {"seconds": 300.0},
        "selection": selection(tiers),
        "tiers": tiers,
    }


# --- the reference tier of the 0.5.17 row across transformers releases (README: nox -s bisect -- transformers
# 5.12.1 5.19.0 --row sglang-0.5.17 --tier reference), as the known-upstream entries describe each release ---------

REF = "tests/tiers/test_reference.py::"
CANDIDATE_CRASH = {
    "kind": "crash",
    "type": "CheckFailure",
    "message": "e-series: generate failed on 'Hello world, count: 1 2 3': TypeError: SinglePositionMultiTokenCandidate"
    "Generator.__init__() missing 2 required positional arguments: 'input_ids' and 'model_kwargs' (at "
    "transformers/generation/utils.py:1338 in _get_candidate_generator)",
    "frame": "transformers/generation/utils.py:2976 in generate",
    "raised_at": "transformers/utils/deprecation.py:171 in wrapped_func",
}
FIRST_ROUND_DRAFT = {
    "kind": "acceptance",
    "type": "CheckFailure",
    "message": "e-series: transformers drafts the first round after prefill from the wrong hidden state: the reference "
    "witness accepts 0/12 drafts there, 1.0 of them after",
    "frame": None,
    "raised_at": "tests/tiers/test_reference.py:358 in test_witness_drafts_at_transformers_phase",
}
ASSISTED_SAMPLING = {
    "kind": "mismatch",
    "type": "CheckFailure",
    "message": "dense-31b: transformers' assisted sampling differs from the closed form: 1536 offsets; ...",
    "frame": None,
    "raised_at": "tests/tiers/test_reference.py:538 in test_sampled_assisted_generation_matches_closed_form",
}
SAMPLING_METRICS = {
    "sampled_offsets": 1536,
    "sampled_counts": {"1": 889, "3": 344, "7": 303},
    "sampled_off_support": 0,
    "sampled_share_offset_1": 0.5788,
    "sampled_share_offset_3": 0.224,
}


def reference_record(transformers: str) -> dict:
    """The 0.5.17 row's reference tier at ``transformers``: 5.18-5.19 crash building the candidate generator, before
    5.17 the first draft round after prefill is wrong, and assisted sampling is not lossless from 5.8 on (a crash
    first on 5.18-5.19); greedy assisted generation and plain sampling pass otherwise."""
    from packaging.version import Version

    v = Version(transformers)
    crash = Version("5.18") <= v < Version("5.20")

    def chk(name, failure=None, metrics=None):
        return {
            "id": REF + name,
            "tier": "reference",
            "outcome": "failed" if failure else "passed",
            "seconds": 1.0,
            "metrics": metrics or {},
            **({"failure": dict(failure)} if failure else {}),
        }

    checks = [
        chk("test_greedy_with_assistant_equals_greedy[e-series]", CANDIDATE_CRASH if crash else None),
        chk(
            "test_witness_drafts_at_transformers_phase[e-series]",
            CANDIDATE_CRASH if crash else FIRST_ROUND_DRAFT if v < Version("5.17") else None,
            {"first_round_drafted": 12, "first_round_accepted": 0} if v < Version("5.17") else None,
        ),
        chk(
            "test_sampled_assisted_generation_matches_closed_form",
            CANDIDATE_CRASH if crash else ASSISTED_SAMPLING,
            None if crash else SAMPLING_METRICS,
        ),
        chk("test_sampled_closed_form_matches_transformers_sampling[e-series]"),
    ]
    tiers = {"reference": {"verdict": "failed", "checks": checks}}
    return {
        "verdict": "failed",
        "versions": {"sglang": "0.5.17", "transformers": transformers},
        "install": {"verdict": "passed"},
        "selection": selection(tiers),
        "tiers": tiers,
    }


VERSIONS = [f"5.{m}.{p}" for m in range(8, 14) for p in range(3)]  # 18 releases, 5.8.0 .. 5.13.2


def fake(first_bad: int | None, uninstallable=(), calls=None):
    """A probe over VERSIONS-like lists: index >= first_bad is bad; some indices do not install."""

    def factory(cands):
        def probe(v):
            i = cands.index(v)
            if calls is not None:
                calls.append(v)
            if i in uninstallable:
                return Probe(v, UNTESTABLE, f"does not install: resolver conflict: no wheel for {v}")
            if first_bad is not None and i >= first_bad:
                return Probe(
                    v,
                    BAD,
                    "2 check(s) failed [mismatch]",
                    {
                        "kind": "mismatch",
                        "type": "CheckFailure",
                        "message": f"tokens differ at 3 ({v})",
                        "frame": "transformers/generation/utils.py:2471 in _assisted_decoding",
                        "raised_at": "tests/tiers/test_reference.py:61 in test_greedy",
                    },
                )
            return Probe(v, GOOD)

        return probe

    return factory
