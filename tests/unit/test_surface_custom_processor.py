"""The custom-logit-processor request of the "features" family: the processor (top_token_swap) on a numpy witness
decoded the way sglang decodes (the sampler one row per step; Frozen-KV MTP verify six rows per step in 0.5.13's
and 0.5.23's layouts, or without the processor as 0.5.17 / 0.5.23 verify run it), its serialised string, the servers
that must accept it, and the smoke check and known-upstream entry on those outputs."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from mtpmatrix.core import known_upstream, smoke_servers
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.tiers.surface import features, logprobs, top_token_swap

REPO = Path(__file__).resolve().parents[2]
SPEC = {s.name: s for s in smoke_servers.SMOKE_SERVERS}
ENTRY = "sglang-mtp-verify-skips-custom-logit-processor"
CHECK = "tests/tiers/test_smoke_features.py::test_feature_matches_no_mtp"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TSF = _load(REPO / "tests" / "unit" / "test_surface_features.py", "tsf")
TF = TSF.TF

# ---------------------------------------------------------------------------------------------- a numpy witness

VOCAB = logprobs.VOCAB
STEP_DRAFTS = logprobs.STEP_TOKENS - 1  # drafts per verify step (topk 1 chain)
_RNG = np.random.default_rng(7)
_OFF_PEAK = _RNG.uniform(-logprobs.RUNNER_UP, logprobs.RUNNER_UP, size=(VOCAB, VOCAB)).astype(np.float32)


def row(x: int) -> np.ndarray:
    """The witness's logits after token x: x + 1 at the peak (17.48), every other token at most 9.82."""
    r = _OFF_PEAK[x].copy()
    r[(x + 1) % VOCAB] = logprobs.PEAK
    return r


def decode_no_mtp(prompt_last: int, params: dict, n: int = features.MAX_NEW_TOKENS) -> list[int]:
    """The sampler: one row per step, the processor on it (one params entry for the one row)."""
    out, last = [], prompt_last
    proc = top_token_swap.TopTokenSwap()
    for _ in range(n):
        last = int(proc(row(last)[None, :], [params]).argmax(-1)[0])
        out.append(last)
    return out


def decode_mtp(prompts: list[int], params: list[dict], layout: str, n: int = features.MAX_NEW_TOKENS) -> list[list]:
    """Greedy Frozen-KV MTP on a batch: the prefill token through the sampler, then verify steps of 1 + 5 rows per
    request (the drafter drafts the witness's unmodified chain, as the witness's does). ``layout``: how verify
    hands the rows to the processor: "per-request" (0.5.13: one params entry per request for its 6 rows),
    "per-row" (0.5.23's apply_custom_logit_processor: one entry per row), "skipped" (0.5.17 / 0.5.23 eagle_sample)."""
    proc = top_token_swap.TopTokenSwap()
    outs = [[int(proc(row(p)[None, :], [q]).argmax(-1)[0])] for p, q in zip(prompts, params)]
    while any(len(o) < n for o in outs):
        nodes = [[o[-1] + d for d in range(STEP_DRAFTS + 1)] for o in outs]  # bonus, then the 5 drafts
        logits = np.stack([row(x) for ns in nodes for x in ns])
        if layout == "per-request":
            logits = proc(logits, params)
        elif layout == "per-row":
            logits = proc(logits, [q for q in params for _ in range(STEP_DRAFTS + 1)])
        target = logits.argmax(-1).reshape(len(outs), STEP_DRAFTS + 1)
        for o, ns, t in zip(outs, nodes, target):
            j = 0
            while j < STEP_DRAFTS and int(t[j]) == ns[j + 1]:  # draft j + 1 accepted
                o.append(ns[j + 1])
                j += 1
            o.append(int(t[j]))  # the bonus: the target's own token where the drafts stop
    return [o[:n] for o in outs]


def _payload():
    return dict(features.requests(SPEC["witness-nomtp"], VOCAB))[features.CUSTOM]


# ---------------------------------------------------------------------------------------------- the request


def test_the_request_swaps_an_accepted_draft_for_a_token_off_the_chain():
    p = _payload()
    token, instead = features.swap_tokens()
    assert p["sampling_params"]["custom_params"] == {"token_id": token, "instead": instead}
    assert p["sampling_params"]["temperature"] == 0.0 and p["sampling_params"]["ignore_eos"] is True
    assert features.chain(features.CUSTOM)[features.SWAP_POSITION - 1] == token
    assert "accepted draft 3" in logprobs.position_label(features.SWAP_POSITION - 1)
    swapped = features.swapped_chain()
    assert len(swapped) == features.MAX_NEW_TOKENS and token not in swapped and max(swapped) < VOCAB
    assert instead > features.chain(features.CUSTOM)[-1]  # the swapped run never meets the chain's tokens again
    # the string sglang loads: a pickle of the class by reference, which dill.loads reads as pickle.loads does
    loaded = pickle.loads(bytes.fromhex(json.loads(p["custom_logit_processor"])["callable"]))
    assert loaded is top_token_swap.TopTokenSwap and p["custom_logit_processor"] == top_token_swap.serialised()


def test_every_server_sent_the_request_accepts_processors():
    """sglang refuses the request without the flag: every server of the witness pair (the ones features sends it
    to) must carry it, and only the flag is added."""
    flag = smoke_servers.CUSTOM_LOGIT_PROCESSOR_ARGS[0]
    for spec in smoke_servers.SMOKE_SERVERS:
        sent = features.CUSTOM in dict(features.requests(spec, VOCAB))
        assert sent == (flag in spec.mode_args), spec.name
    assert {s.name for s in smoke_servers.SMOKE_SERVERS if flag in s.mode_args} == {
        "witness-mtp-topk1",
        "witness-mtp-topk3",
        "witness-mtp-topk3-eager",
        "witness-nomtp",
    }


# ---------------------------------------------------------------------------------------------- the processor


def test_processor_gives_the_swapped_chain_without_mtp_and_under_either_verify_layout():
    p = _payload()
    prompt_last, params = p["input_ids"][-1], p["sampling_params"]["custom_params"]
    assert decode_no_mtp(prompt_last, params) == features.swapped_chain()
    # two requests in one verify batch, with other params: each entry acts on its own rows only
    other = {"token_id": 40 + 5, "instead": 40 + 45}
    for layout in ("per-request", "per-row"):
        got, beside = decode_mtp([prompt_last, 39], [params, other], layout)
        assert got == features.swapped_chain(), layout
        assert beside == [40, 41, 42, 43, 44, 85] + list(range(86, 86 + 26)), layout
    # 0.5.17 / 0.5.23: verify runs no processor, so token 4 (an accepted draft) stays
    got, _ = decode_mtp([prompt_last, 39], [params, other], "skipped")
    assert got == features.chain(features.CUSTOM)


def test_processor_leaves_rows_without_params_and_refuses_a_layout_it_cannot_read():
    proc = top_token_swap.TopTokenSwap()
    logits = np.stack([row(10), row(20)])
    assert (proc(logits.copy(), [None, {"__req__": object()}]) == logits).all()
    assert (proc(logits.copy(), None) == logits).all()
    with pytest.raises(ValueError, match="3 logit rows for 2 custom_params entries"):
        proc(np.stack([row(10), row(11), row(12)]), [{"token_id": 12, "instead": 50}] * 2)


# ---------------------------------------------------------------------------------------------- the check


def _runs(mtp_output=None, ref_output=None):
    return TSF.fake_runs(
        mtp_outputs={features.CUSTOM: mtp_output} if mtp_output is not None else None,
        ref_outputs={features.CUSTOM: ref_output} if ref_output is not None else None,
    )


def test_check_passes_the_swapped_chain_and_fails_verify_without_the_processor():
    p = _payload()
    applied, _ = decode_mtp([p["input_ids"][-1], 39], [p["sampling_params"]["custom_params"], None], "per-request")
    TSF.run_feature(_runs(applied), "witness-mtp-topk1", features.CUSTOM)
    TSF.run_feature(_runs(), "witness-nomtp", features.CUSTOM)
    skipped, _ = decode_mtp([p["input_ids"][-1], 39], [p["sampling_params"]["custom_params"], None], "skipped")
    with pytest.raises(CheckFailure) as err:
        TSF.run_feature(_runs(skipped), "witness-mtp-topk1", features.CUSTOM)
    assert err.value.kind == "mismatch"
    assert str(err.value) == (
        "custom-logit-processor on witness-mtp-topk1: the processor did not act: output is the unmodified chain, "
        "435 at output 4 where the processor puts 475 (custom_params token_id 435, instead 475) "
        f"(predicted for intact sglang: docs/upstream/{ENTRY}.md)"
    )


@pytest.mark.parametrize(
    "output",
    [
        features.chain(features.CUSTOM)[:4] + [475 + i for i in range(28)],  # swapped one row late
        features.swapped_chain()[:31],  # one token short
        features.chain(features.CUSTOM)[:3] + [100 + i for i in range(29)],  # another token put in place
    ],
    ids=["late", "short", "other-token"],
)
def test_other_wrong_outputs_fail_without_the_upstream_pointer(output):
    with pytest.raises(CheckFailure, match="then 475 in place of 435") as err:
        TSF.run_feature(_runs(output), "witness-mtp-topk1", features.CUSTOM)
    assert "docs/upstream" not in str(err.value)


def test_no_mtp_server_without_the_processor_fails():
    with pytest.raises(CheckFailure, match="did not act"):
        TSF.run_feature(_runs(ref_output=features.chain(features.CUSTOM)), "witness-nomtp", features.CUSTOM)


# ---------------------------------------------------------------------------------------------- known upstream


def _record(mtp_message: str, nomtp_outcome: str) -> dict:
    def check(server, outcome, message=None):
        c = {"id": f"{CHECK}[{server}-{features.CUSTOM}]", "outcome": outcome}
        if message:
            c["failure"] = {"kind": "mismatch", "type": "CheckFailure", "message": message, "raised_at": "x"}
        return c

    checks = [check(s, "failed", mtp_message) for s in ("witness-mtp-topk1", "witness-mtp-topk3")]
    checks.append(check("witness-nomtp", nomtp_outcome, None if nomtp_outcome == "passed" else "did not act"))
    return {"smoke": {"verdict": "failed", "checks": checks}}


def _mtp_message(output) -> str:
    with pytest.raises(CheckFailure) as err:
        TSF.run_feature(_runs(output), "witness-mtp-topk1", features.CUSTOM)
    return str(err.value)


@pytest.mark.parametrize(
    "version,output,nomtp,known",
    [
        ("0.5.17", "plain", "passed", True),
        ("0.5.23", "plain", "passed", True),
        ("0.5.13", "plain", "passed", False),  # 0.5.13's verify applies it: a failure there is a regression
        ("0.5.24", "plain", "passed", False),  # past the releases read
        ("0.5.17", "plain", "failed", False),  # the processor broken everywhere: not this bug
        ("0.5.17", "wrong-row", "passed", False),
    ],
)
def test_entry_matches_only_the_plain_chain_beside_a_passing_no_mtp(version, output, nomtp, known):
    out = features.chain(features.CUSTOM) if output == "plain" else [100 + i for i in range(32)]
    tiers = _record(_mtp_message(out), nomtp)
    known_upstream.apply(tiers, {"sglang": version})
    tagged = [c.get("known_upstream") for c in tiers["smoke"]["checks"] if c["outcome"] == "failed"]
    if known:
        assert tiers["smoke"]["verdict"] == "known-upstream" and tagged == [ENTRY, ENTRY]
    else:
        assert ENTRY not in tagged
