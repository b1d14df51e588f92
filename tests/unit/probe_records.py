"""Row records for bisect and canary tests, built from recorded runs: the default smoke suite on an H200 (sglang
0.5.13, docs/runs), whose only failure is the draft-phase known upstream issue every 0.5.13-0.5.23 smoke run
carries, with its stored tags stripped (a record is judged again wherever it is read)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
SMOKE_RUN = json.loads((RUNS / "2026-11-30d-h200-sglang-0.5.13-smoke-default.json").read_text())
DRAFT_PHASE = "sglang-gemma4-mtp-draft-rope-phase"
HARNESS_CHECK = "tests/tiers/test_smoke.py::test_topk_batch_served_together[witness-mtp-topk3]"
HARNESS_FAILURE = {"kind": "harness", "type": "CheckFailure",
                   "message": "the smoke tier never batched 4 requests at topk 3",
                   "frame": None, "raised_at": "tests/tiers/test_smoke.py:201 in test_topk_batch_served_together"}


def selection(tiers: dict) -> dict:
    """A session that ran exactly the given checks, without narrowing (so no tier is partial for its selection)."""
    return {"args": [], "knobs": {}, "paths": [],
            "collected": {name: [c["id"] for c in t.get("checks") or []] for name, t in tiers.items()}}


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
    return {"verdict": verdict, "versions": dict(versions), "install": {"verdict": "passed", "seconds": 10.0},
            "suite": {"seconds": 300.0}, "selection": selection(tiers), "tiers": tiers}
