"""The hidden-states known-upstream entries against each release's mechanism, simulated on the fake witness
(fake_shapes: a row is a function of its input token, PREDICTED_ROWS the prediction), run through the smoke tier's
own check functions: 0.5.17's topk 1 rows read after the next step's replay, 0.5.13's one row per verify step and its
prefill offset past plain requests. Each release's failures are excused by its entries, and by nothing on another
release; the same failures beside a second bug (another request's rows, a row of no token) are excused by none."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_shapes import PREDICTED_ROWS, hidden_row
from test_surface_request_shapes import NOMTP, collect

from mtpmatrix.core import known_upstream
from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.tiers import surface
from mtpmatrix.tiers.surface import hidden_states

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
STEP = 6  # tokens each witness verify step keeps (5 drafts + the bonus)
AS_PREDICTED = "tests/tiers/test_smoke_hidden_states.py::test_hidden_states_as_predicted"
MATCH = "tests/tiers/test_smoke_hidden_states.py::test_hidden_states_match_no_mtp"


def with_rows(ex, prefill=None, decode=None) -> surface.Exchange:
    block, *rows = ex.meta["hidden_states"]
    meta = {
        **ex.meta,
        "hidden_states": [prefill if prefill is not None else block, *(decode if decode is not None else rows)],
    }
    return surface.Exchange(ex.label, ex.payload, {**ex.response, "meta_info": meta})


def next_replay(exchanges, steps: dict[str, int]):
    """0.5.17, topk 1: verify step ``steps[label]``'s decode rows are the next step's (inputs + 6)."""
    out = []
    for ex in exchanges:
        if ex.label in steps:
            s, rows = steps[ex.label], list(ex.meta["hidden_states"][1:])
            for k in range(STEP * (s - 1), STEP * s):
                rows[k] = hidden_row(ex.output_ids[k] + STEP)
            ex = with_rows(ex, decode=rows)
        out.append(ex)
    return out


def one_row_per_step(exchanges):
    """0.5.13, spec v1: one decode row per verify step, row i of the batch's flattened accepted rows (the first
    asking request's)."""
    first = next(x for x in exchanges if x.payload.get("return_hidden_states"))
    out = []
    for ex in exchanges:
        if ex.payload.get("return_hidden_states"):
            steps = ex.meta["spec_verify_ct"]
            ex = with_rows(ex, decode=[hidden_row(first.output_ids[i]) for i in range(steps)])
        out.append(ex)
    return out


def prefill_offset(exchanges, moves: dict[str, str]):
    """0.5.13-0.5.16: an asking request prefilled after a plain one gets that one's prompt rows."""
    by = {x.label: x for x in exchanges}
    return [
        with_rows(x, prefill=[hidden_row(t) for t in by[moves[x.label]].payload["input_ids"]])
        if x.label in moves
        else x
        for x in exchanges
    ]


def own_prompt_rows(exchanges, label: str, rows):
    """``label``'s prompt rows as ``rows`` makes them from its input ids."""
    return [
        with_rows(x, prefill=[hidden_row(t) for t in rows(x.payload["input_ids"])]) if x.label == label else x
        for x in exchanges
    ]


def second_bug(exchanges):
    """A bug no entry names beside them: hidden-145's output 3 row is no token's."""
    out = []
    for ex in exchanges:
        if ex.label == "hidden-145":
            rows = list(ex.meta["hidden_states"][1:])
            rows[2] = [0.0] * hidden_states.HIDDEN
            ex = with_rows(ex, decode=rows)
        out.append(ex)
    return out


def record(check: str, server: str, problems: list[str]) -> dict:
    rec = {
        "id": f"{check}[{server}]",
        "outcome": "passed" if not problems else "failed",
        "metrics": {"problems": problems},
    }
    if problems:
        message = f"{len(problems)} problem(s) over 5 hidden_states requests; first: {problems[0]}"
        rec["failure"] = {"kind": "mismatch", "type": "CheckFailure", "message": message}
    return rec


def tier(servers: dict[str, list], reference: list) -> list[dict]:
    """The hidden-states checks of a smoke tier whose servers returned ``servers`` ({name: exchanges})."""
    checks = []
    for name, exchanges in servers.items():
        own = [p for x in exchanges for p in hidden_states.count_problems(x)]
        checks.append(record(AS_PREDICTED, name, own + hidden_states.prediction_problems(exchanges, PREDICTED_ROWS)))
        if name != "witness-nomtp":
            checks.append(record(MATCH, name, hidden_states.against_reference(exchanges, reference, PREDICTED_ROWS)))
    return checks


def excused(checks: list[dict], sglang: str) -> dict[str, str | None]:
    """{failed check: the entry that matches it on ``sglang``, or None}."""
    entries = [e for e in known_upstream.load() if e.applies_to({"sglang": sglang})]
    out = {}
    for c in checks:
        if c["outcome"] == "failed":
            hits = [e.id for e in entries if e.matches(c, checks)]
            assert len(hits) <= 1, hits
            out[c["id"].split("::")[1]] = hits[0] if hits else None
    return out


@pytest.fixture(scope="module")
def intact():
    return collect(hidden_states), collect(hidden_states, spec=NOMTP)


def test_0517_topk1_rows_of_the_next_step_are_its_entry_and_nothing_else(intact):
    mtp, nomtp = intact
    bad = next_replay(mtp, {"hidden-30": 4, "hidden-50": 4, "hidden-145": 3})
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": bad, "witness-mtp-topk3": mtp}, nomtp)
    assert (
        checks[1]["metrics"]["problems"][0] == "hidden-30 output 19..24 (inputs 60..65): the rows of inputs 66..71 (+6)"
    )
    entry = "sglang-mtp-overlap-hidden-states-read-after-next-replay"
    assert excused(checks, "0.5.17") == {
        "test_hidden_states_as_predicted[witness-mtp-topk1]": entry,
        "test_hidden_states_match_no_mtp[witness-mtp-topk1]": entry,
    }
    assert set(excused(checks, "0.5.16").values()) == {None}  # another release's entries do not name it
    # the same at topk 3, where 0.5.17 clones the accepted path first: not the entry
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": mtp, "witness-mtp-topk3": bad}, nomtp)
    assert set(excused(checks, "0.5.17").values()) == {None}
    # beside a second bug: neither check excused (each line is read, not only the first)
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": second_bug(bad), "witness-mtp-topk3": mtp}, nomtp)
    assert set(excused(checks, "0.5.17").values()) == {None}
    # rows of a step two on (inputs + 12): not the next replay's
    far = [
        with_rows(
            x,
            decode=[
                hidden_row(t + 12) if 6 <= k < 12 else r
                for k, (t, r) in enumerate(zip(x.output_ids, x.meta["hidden_states"][1:]))
            ],
        )
        if x.label == "hidden-30"
        else x
        for x in mtp
    ]
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": far, "witness-mtp-topk3": mtp}, nomtp)
    assert excused(checks, "0.5.17")["test_hidden_states_as_predicted[witness-mtp-topk1]"] is None


def test_0513_one_row_per_step_and_the_prefill_offset_are_its_entries_and_nothing_else(intact):
    mtp, nomtp = intact
    nomtp_0513 = prefill_offset(nomtp, {"hidden-30": "plain-85"})
    mtp_0513 = one_row_per_step(prefill_offset(mtp, {"hidden-145": "plain-85"}))
    checks = tier(
        {"witness-nomtp": nomtp_0513, "witness-mtp-topk1": mtp_0513, "witness-mtp-topk3": mtp_0513}, nomtp_0513
    )
    assert checks[0]["metrics"]["problems"] == [
        "hidden-30 prompt 0..11 (inputs 30..41): the rows of inputs 85..96 (+55)"
    ]
    mtp_entry, offset = (
        "sglang-0513-mtp-hidden-states-one-row-per-verify-step",
        "sglang-0513-hidden-states-prefill-offset-past-plain-requests",
    )
    assert excused(checks, "0.5.13") == {
        "test_hidden_states_as_predicted[witness-nomtp]": offset,
        **{
            f"{c}[{s}]": mtp_entry
            for c in ("test_hidden_states_as_predicted", "test_hidden_states_match_no_mtp")
            for s in ("witness-mtp-topk1", "witness-mtp-topk3")
        },
    }
    assert set(excused(checks, "0.5.17").values()) == {None}
    # a second bug beside them: a row of no token, on either kind of server
    checks = tier(
        {
            "witness-nomtp": second_bug(nomtp_0513),
            "witness-mtp-topk1": second_bug(mtp_0513),
            "witness-mtp-topk3": mtp_0513,
        },
        nomtp_0513,
    )
    got = excused(checks, "0.5.13")
    assert got["test_hidden_states_as_predicted[witness-nomtp]"] is None
    assert got["test_hidden_states_as_predicted[witness-mtp-topk1]"] is None
    # no-MTP decode rows off (0.5.13 hands decode rows out per request): not the prefill offset
    off = next_replay(nomtp, {"hidden-50": 2})
    checks = tier({"witness-nomtp": off, "witness-mtp-topk1": mtp, "witness-mtp-topk3": mtp}, off)
    assert excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-nomtp]"] is None


def test_a_check_with_more_problems_than_it_recorded_is_never_excused(intact):
    mtp, nomtp = intact
    checks = tier(
        {"witness-nomtp": nomtp, "witness-mtp-topk1": next_replay(mtp, {"hidden-30": 4}), "witness-mtp-topk3": mtp},
        nomtp,
    )
    failed = next(c for c in checks if c["outcome"] == "failed")
    entry = next(e for e in known_upstream.load() if e.id == "sglang-mtp-overlap-hidden-states-read-after-next-replay")
    assert entry.matches(failed, checks)
    failed["failure"]["message"] = failed["failure"]["message"].replace("1 problem(s)", "61 problem(s)", 1)
    assert not entry.matches(failed, checks)  # 61 counted, 1 recorded: the rest are unseen


def test_the_prefill_offset_entry_takes_another_prompts_rows_only(intact):
    """Its own prompt's rows shifted by one, or its block reversed, are no prefill offset past plain requests (the
    offset moves by whole prompts): not excused (the review's cases, 2026-12-05c)."""
    mtp, nomtp = intact

    for bad in (
        own_prompt_rows(nomtp, "hidden-30", lambda p: [t + 1 for t in p]),
        own_prompt_rows(nomtp, "hidden-50", lambda p: p[::-1]),
    ):
        checks = tier({"witness-nomtp": bad, "witness-mtp-topk1": mtp, "witness-mtp-topk3": mtp}, bad)
        assert excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-nomtp]"] is None


def lagging(exchanges, label: str, plain: str, k: int):
    """0.5.13-0.5.16 after a radix hit: ``plain`` extends only its last ``k`` prompt tokens in the batch ahead of the
    asking ``label``, so the offset lags by k: ``label`` gets those k rows, then its own first 12 - k."""
    ahead = next(x for x in exchanges if x.label == plain).payload["input_ids"][-k:]
    return own_prompt_rows(exchanges, label, lambda p: [*ahead, *p[:-k]])


def test_the_prefill_offset_lagging_by_a_short_extend_is_its_entry(intact):
    """The H100 run of 2026-12-05 (0.5.13, witness-mtp-topk1): a plain request that hit the radix cache extended 2
    tokens ahead of hidden-30, whose prompt rows 2..11 were then its own inputs 30..39 (-2). Excused by the prefill
    offset's entry without MTP and by the one-row-per-step entry with it; its own rows ahead (+2) are not."""
    mtp, nomtp = intact
    late = lagging(nomtp, "hidden-30", "plain-85", 2)
    checks = tier({"witness-nomtp": late, "witness-mtp-topk1": mtp, "witness-mtp-topk3": mtp}, late)
    problems = checks[0]["metrics"]["problems"]
    assert "hidden-30 prompt 2..11 (inputs 32..41): the rows of inputs 30..39 (-2)" in problems
    assert (
        excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-nomtp]"]
        == "sglang-0513-hidden-states-prefill-offset-past-plain-requests"
    )
    mtp_late = one_row_per_step(lagging(mtp, "hidden-30", "plain-85", 2))
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": mtp_late, "witness-mtp-topk3": mtp}, nomtp)
    assert set(excused(checks, "0.5.13").values()) == {"sglang-0513-mtp-hidden-states-one-row-per-verify-step"}
    assert set(excused(checks, "0.5.17").values()) == {None}
    ahead = [
        with_rows(x, prefill=[hidden_row(t + 2) for t in x.payload["input_ids"]]) if x.label == "hidden-30" else x
        for x in nomtp
    ]
    checks = tier({"witness-nomtp": ahead, "witness-mtp-topk1": mtp, "witness-mtp-topk3": mtp}, ahead)
    assert excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-nomtp]"] is None


def test_the_h100_0513_record_has_no_failure_but_its_entries():
    """The recorded H100 run of sglang 0.5.13 (docs/runs/2026-12-05f-h100-sglang-0.5.13-smoke-default.json.gz): its
    one failure, the topk 1 prompt rows late by a radix-hit extend of 2, is the one-row-per-step entry's with the
    offset's lag; every other failure an entry's too. Seen failing on the list before the lag was allowed."""
    rec = read_json_or_gzip(RUNS / "2026-12-05f-h100-sglang-0.5.13-smoke-default.json.gz")
    known_upstream.strip(rec["tiers"])
    known_upstream.apply(rec["tiers"], rec["versions"])
    smoke = rec["tiers"]["smoke"]
    by_id = {c["id"].split("::")[1]: c for c in smoke["checks"]}
    assert by_id["test_hidden_states_as_predicted[witness-mtp-topk1]"]["known_upstream"] == (
        "sglang-0513-mtp-hidden-states-one-row-per-verify-step"
    )
    assert [c["id"] for c in smoke["checks"] if c["outcome"] == "failed" and not c.get("known_upstream")] == []
    assert smoke["verdict"] == "known-upstream"


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param(lambda p: [p[0]] * len(p), id="every-row-row-0"),
        pytest.param(lambda p: [t - 1 for t in p], id="whole-block-one-early"),
        pytest.param(lambda p: [t - 1 for t in p[:6]] + p[6:], id="first-half-one-early"),
    ],
)
def test_a_lag_is_excused_only_as_the_offset_gives_it(intact, rows):
    """The offset's lag of k hands a request its own rows 0..11-k at rows k..11, to its prompt's end, after k rows of
    the requests ahead. Own rows early in any other shape (the review's cases of 0d9f540: one row broadcast, the
    whole block or part of it one early) are no entry's, with or without MTP. Not told apart by a per-line signature,
    so still excused: rows 0..k-1 right with rows k..11 late (no request's rows ahead)."""
    mtp, nomtp = intact
    bad = own_prompt_rows(nomtp, "hidden-30", rows)
    checks = tier({"witness-nomtp": bad, "witness-mtp-topk1": mtp, "witness-mtp-topk3": mtp}, nomtp)
    assert excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-nomtp]"] is None
    bad = one_row_per_step(own_prompt_rows(mtp, "hidden-30", rows))
    checks = tier({"witness-nomtp": nomtp, "witness-mtp-topk1": bad, "witness-mtp-topk3": mtp}, nomtp)
    assert excused(checks, "0.5.13")["test_hidden_states_as_predicted[witness-mtp-topk1]"] is None
