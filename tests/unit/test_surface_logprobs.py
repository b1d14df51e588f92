"""Request family "logprobs": requests, the derived bounds, and the checks' logic on fake witness responses built
from the prediction (a row's top logprobs depend on its input token alone) and on broken variants."""

from __future__ import annotations

import math

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.tiers.surface import Exchange, logprobs

WITNESS = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-mtp-topk1")
NOMTP = next(s for s in smoke_servers.SMOKE_SERVERS if s.name == "witness-nomtp")


def row(x: int, temperature: float = 1.0, jitter: float = 0.0) -> list[list]:
    """Fake witness row of input token x: x + 1 on top, 4 runner-ups >= GAP below (deterministic per x)."""
    peak = -1e-3 / temperature + jitter
    others = [
        (-(logprobs.GAP + 0.3 * k + (x % 5) * 0.01) / temperature + jitter, (x + 37 * k) % 512)
        for k in range(1, logprobs.TOP_N)
    ]
    return [[peak, x + 1, None]] + [[lp, t, None] for lp, t in others]


def respond(payload: dict, jitter: float = 0.0) -> dict:
    prompt = payload["input_ids"]
    t = logprobs.temperature_of(payload)
    out = [prompt[-1] + k for k in range(1, logprobs.MAX_NEW_TOKENS + 1)]
    rows = [row(prompt[-1] + i, t, jitter) for i in range(len(out))]
    meta = {
        "output_token_logprobs": [[r[0][0], tok, None] for r, tok in zip(rows, out)],
        "output_top_logprobs": rows,
        "input_token_logprobs": [[None, prompt[0], None]]
        + [[row(prompt[p - 1], t)[0][0], prompt[p], None] for p in range(1, len(prompt))],
        "input_top_logprobs": [None] + [row(prompt[p - 1], t) for p in range(1, len(prompt))],
    }
    return {"output_ids": out, "meta_info": meta}


def exchanges(spec=WITNESS, jitter=0.0, mutate=None) -> list[Exchange]:
    out = []
    for label, payload in logprobs.requests(spec, 512):
        resp = respond(payload, jitter)
        if mutate:
            mutate(label, resp)
        out.append(Exchange(label, payload, resp))
    return out


def check(ex_list, ref_list) -> list[str]:
    ref = {x.label: x for x in ref_list}
    problems = []
    for ex in ex_list:
        own = logprobs.own_problems(ex)
        problems += own or logprobs.compare_exchange(ex, ref[ex.label])
    return problems


def test_bounds_are_derived_and_separated():
    assert logprobs.PEAK == pytest.approx(17.4835, abs=1e-3)
    assert logprobs.GAP == pytest.approx(7.659, abs=1e-3)
    assert logprobs.OWN_FLOOR == pytest.approx(-0.2159, abs=1e-3)
    assert logprobs.TOLERANCE_NATS == pytest.approx(0.65625)
    assert logprobs.GAP > 10 * logprobs.TOLERANCE_NATS


def test_requests_only_on_witness_and_inside_context():
    assert logprobs.requests(next(s for s in smoke_servers.SMOKE_SERVERS if s.pair == "sampled"), 512) == []
    reqs = logprobs.requests(WITNESS, 512)
    assert reqs == logprobs.requests(NOMTP, 512)  # the same requests with and without MTP
    for _label, p in reqs:
        assert p["return_logprob"] and p["top_logprobs_num"] == logprobs.TOP_N and p["logprob_start_len"] == 0
        ids = p["input_ids"]
        assert ids == list(range(ids[0], ids[0] + 12)) and ids[0] >= 16
        assert ids[-1] + logprobs.MAX_NEW_TOKENS < 512
    assert len({tuple(p["input_ids"]) for _l, p in reqs}) == len(reqs)


def test_position_labels():
    assert logprobs.position_label(0).endswith("(prefill token)")
    assert "accepted draft 1" in logprobs.position_label(1)
    assert "verify step 1, bonus" in logprobs.position_label(6)
    assert "verify step 2, accepted draft 1" in logprobs.position_label(7)


def test_intact_passes_with_bf16_jitter():
    ref = exchanges(NOMTP)
    assert check(exchanges(jitter=0.3), ref) == []
    assert logprobs.input_problems(exchanges()) == []
    assert logprobs.input_problems(ref) == []


def _shift_rows(label, resp):
    """Logprobs read one node late: each position reports the next position's row (and its token's logprob
    there)."""
    meta = resp["meta_info"]
    rows = meta["output_top_logprobs"]
    shifted = rows[1:] + [rows[-1]]
    meta["output_top_logprobs"] = shifted
    meta["output_token_logprobs"] = [[-(logprobs.GAP + 1), t, None] for (_lp, t, _n) in meta["output_token_logprobs"]]


def test_neighbouring_node_fails():
    problems = check(exchanges(mutate=_shift_rows), exchanges(NOMTP))
    assert problems and "top-1 logprob is token" in problems[0] and "prefill token" in problems[0]


def test_wrong_logprob_at_bonus_named_as_bonus():
    def bonus_off(label, resp):
        rows = resp["meta_info"]["output_top_logprobs"]
        rows[6] = [[lp - 1.0 if i else lp, t, n] for i, (lp, t, n) in enumerate(rows[6])]

    problems = check(exchanges(mutate=bonus_off), exchanges(NOMTP))
    assert problems and "verify step 1, bonus" in problems[0] and "> 0.656" in problems[0]


def test_token_ids_not_output_ids_fail():
    def wrong_ids(label, resp):
        resp["meta_info"]["output_token_logprobs"][3][1] += 1

    problems = check(exchanges(mutate=wrong_ids), exchanges(NOMTP))
    assert problems and "names token" in problems[0] and "accepted draft 3" in problems[0]


def test_draft_distribution_fails():
    """Rows from a draft head that only scores a few tokens: runner-ups far below the target's."""

    def draft_rows(label, resp):
        for r in resp["meta_info"]["output_top_logprobs"][1:]:
            for e in r[1:]:
                e[0] -= 20.0

    assert any("differs by" in p for p in check(exchanges(mutate=draft_rows), exchanges(NOMTP)))


def test_unscaled_logprobs_on_sampled_request_fail():
    """A server returning raw logprobs for the temperature 0.5 requests while no-MTP returns processed ones."""
    ref = exchanges(NOMTP)

    def raw(label, resp):
        if label.startswith("scaled"):
            x0 = None
            for i, r in enumerate(resp["meta_info"]["output_top_logprobs"]):
                x0 = r[0][1] - 1
                resp["meta_info"]["output_top_logprobs"][i] = row(x0)

    problems = check(exchanges(mutate=raw), ref)
    assert problems and problems[0].startswith("scaled-")


def test_output_off_chain_fails():
    def off(label, resp):
        resp["output_ids"][10] += 3

    assert "leave the +1 chain at output 10" in check(exchanges(mutate=off), exchanges(NOMTP))[0]


def test_missing_input_logprobs_fail():
    def drop(label, resp):
        resp["meta_info"]["input_token_logprobs"] = resp["meta_info"]["input_token_logprobs"][-1:]

    assert "input logprobs cover tokens" in logprobs.input_problems(exchanges(mutate=drop))[0]


def test_input_row_off_by_one_fails():
    def shift(label, resp):
        top = resp["meta_info"]["input_top_logprobs"]
        resp["meta_info"]["input_top_logprobs"] = [None] + top[2:] + [top[-1]]

    assert "rank 1" in logprobs.input_problems(exchanges(mutate=shift))[0]


def test_verify_rows_disagreeing_with_prefill_fail():
    """An MTP server whose verify rows (outputs) drift from the prefill rows of the same tokens."""

    def drift(label, resp):
        if label.startswith("greedy"):
            for r in resp["meta_info"]["output_top_logprobs"][9:]:
                for e in r[1:]:
                    e[0] += 1.0

    problems = logprobs.input_problems(exchanges(mutate=drift))
    assert problems and "against greedy-" in problems[0] and "prefill" in problems[0]


def test_first_input_logprob_must_be_empty():
    def fill(label, resp):
        resp["meta_info"]["input_token_logprobs"][0][0] = -1.0

    assert "nothing precedes it" in logprobs.input_problems(exchanges(mutate=fill))[0]


def test_failed_request_reported():
    ex = exchanges()
    ex[0] = Exchange(ex[0].label, ex[0].payload, {}, "HTTP 400: bad")
    assert "request failed" in logprobs.own_problems(ex[0])[0]
    assert math.isfinite(logprobs.tolerance(ex[-1].payload))


def test_fewer_top_logprobs_than_asked_fail():
    """An MTP server that returns one top logprob per position where top_logprobs_num asked five."""

    def one(label, resp):
        resp["meta_info"]["output_top_logprobs"] = [r[:1] for r in resp["meta_info"]["output_top_logprobs"]]

    problems = check(exchanges(mutate=one), exchanges(NOMTP))
    assert problems and all(f"1 top logprobs, {logprobs.TOP_N} asked" in p for p in problems)


def test_runner_ups_of_another_row_fail_and_a_near_tie_at_the_cut_passes():
    """Runner-ups that are other ids than no-MTP's (another row's) fail, though no id both list differs; an id that
    swapped in at the last rank within the bf16 bound (a near-tie at the cut) passes."""

    def other_row(label, resp):
        for r in resp["meta_info"]["output_top_logprobs"]:
            for e in r[1:]:
                e[1] = (e[1] + 250) % 512

    problems = check(exchanges(mutate=other_row), exchanges(NOMTP))
    assert problems and "is listed here at" in problems[0] and "other runner-ups" in problems[0]

    def near_tie(label, resp):
        for r in resp["meta_info"]["output_top_logprobs"]:
            r[-1] = [r[-1][0] + 0.2, (r[-1][1] + 250) % 512, None]  # a new id, 0.2 nats above no-MTP's last

    assert check(exchanges(mutate=near_tie), exchanges(NOMTP)) == []
