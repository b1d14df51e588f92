"""Known-upstream entries whose bug shows only under a condition a run does not control (``shows_when``: the server
happens to put certain requests in one batch step): a listed check that passes inside the range is not the bug
fixed, so the entry is listed as 'did not show' (``unshown_known_upstream``), never as 'can go'; an entry without
``shows_when`` is stale as before. Built on the recorded H200 smoke run of sglang 0.5.13 (2026-12-05b,
docs/runs) and the next (2026-12-05e), whose witnesses served the token_ids_logprob mixed batch the other way round
(topk 1 crashed, topk 3 served it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.core import known_upstream
from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.core.schema import KNOWN_UPSTREAM
from mtpmatrix.core.store import row_verdict
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary
from mtpmatrix.runner import importer

RUNS = Path(__file__).resolve().parents[2] / "docs" / "runs"
TOKEN_IDS_0513 = "sglang-0513-token-ids-logprob-mixed-batch-crash"
TOKEN_IDS_0517 = "sglang-token-ids-logprob-mixed-batch-crash"
HIDDEN_OFFSET_0513 = "sglang-0513-hidden-states-prefill-offset-past-plain-requests"
MIXED = "tests/tiers/test_smoke_token_ids_logprob.py::test_token_ids_logprob_beside_other_requests[{}]"
SHOWS = "a token_ids_logprob request decodes in one batch step with one that did not ask"


def _issue(**changes) -> known_upstream.KnownIssue:
    fields = {
        "id": "mixed-batch-bug",
        "package": "sglang",
        "affected": ">=0.5.13,<=0.5.13",
        "tier": "smoke",
        "component": "sglang",
        "kind": "crash",
        "match": "'list' object has no attribute 'tolist'",
        "checks": ("test_token_ids_logprob_beside_other_requests",),
        "summary": "crashes the scheduler",
        "upstream": "https://example.invalid/issue/1",
        **changes,
    }
    return known_upstream.KnownIssue(**fields)


def _tiers() -> dict:
    """A smoke tier where the no-MTP server crashed on the mixed batch and the topk 1 server served it."""
    crash = {
        "kind": "crash",
        "type": "CheckFailure",
        "message": "3/3 token_ids_logprob requests failed; first mixed-300: ConnectionError: ...; server log: "
        "AttributeError: 'list' object has no attribute 'tolist'",
        "frame": None,
        "raised_at": "tests/tiers/test_smoke_token_ids_logprob.py:90 in test_token_ids_logprob_beside_other_requests",
    }
    checks = [
        {"id": MIXED.format("witness-nomtp"), "tier": "smoke", "outcome": "failed", "failure": crash},
        {"id": MIXED.format("witness-mtp-topk1"), "tier": "smoke", "outcome": "passed"},
    ]
    return {"smoke": {"verdict": "failed", "checks": checks}}


def test_a_pass_of_an_entry_with_shows_when_is_not_stale_but_did_not_show():
    tiers = _tiers()
    known_upstream.apply(tiers, {"sglang": "0.5.13"}, [_issue(shows_when=SHOWS)])
    smoke = tiers["smoke"]
    assert "stale_known_upstream" not in smoke
    (unshown,) = smoke["unshown_known_upstream"]
    assert (unshown["id"], unshown["checks"], unshown["shows_when"]) == (
        "mixed-batch-bug",
        [MIXED.format("witness-mtp-topk1")],
        SHOWS,
    )
    # the failure is matched as before, and the pass does not change the verdict: every failure is tagged
    assert [k["checks"] for k in smoke["known_upstream"]] == [[MIXED.format("witness-nomtp")]]
    assert smoke["verdict"] == KNOWN_UPSTREAM
    # derived like the others: stripped and derived again, so a second apply changes nothing
    before = json.dumps(tiers, sort_keys=True)
    known_upstream.apply(tiers, {"sglang": "0.5.13"}, [_issue(shows_when=SHOWS)])
    assert json.dumps(tiers, sort_keys=True) == before
    known_upstream.apply(tiers, {"sglang": "0.5.13"}, [])
    assert "unshown_known_upstream" not in tiers["smoke"] and tiers["smoke"]["verdict"] == "failed"


def test_the_same_entry_without_shows_when_is_stale_as_before():
    without = _tiers()
    known_upstream.apply(without, {"sglang": "0.5.13"}, [_issue()])
    (stale,) = without["smoke"]["stale_known_upstream"]
    assert stale["checks"] == [MIXED.format("witness-mtp-topk1")] and "shows_when" not in stale
    assert "unshown_known_upstream" not in without["smoke"]
    assert "shows_when" not in without["smoke"]["known_upstream"][0]  # an entry without it: its records unchanged
    assert without["smoke"]["verdict"] == KNOWN_UPSTREAM


_ENTRY = {
    "id": "x",
    "package": "sglang",
    "affected": "<=0.5.13",
    "tier": "smoke",
    "component": "sglang",
    "kind": "crash",
    "match": "tolist",
    "checks": ["test_token_ids_logprob_beside_other_requests"],
    "summary": "s",
    "upstream": "u",
}


@pytest.mark.parametrize("value", ["", "   ", None, 3, ["a batch step"], {"when": "x"}])
def test_load_refuses_a_shows_when_that_is_not_a_condition(tmp_path, value):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [dict(_ENTRY, shows_when=value)]}))
    with pytest.raises(ValueError) as info:
        known_upstream.load(f)
    text = str(info.value)
    assert "shows_when" in text and "issue 0 (x)" in text and str(f) in text and "\n" not in text
    assert "unknown field" not in text and "not a non-empty string" in text  # a known field, a bad value


def test_load_keeps_a_shows_when(tmp_path):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [dict(_ENTRY, shows_when=SHOWS)]}))
    (issue,) = known_upstream.load(f)
    assert issue.shows_when == SHOWS and issue.as_dict()["shows_when"] == SHOWS


def test_the_batch_timing_entries_say_when_they_show():
    issues = {i.id: i for i in known_upstream.load()}
    for entry_id in (TOKEN_IDS_0513, TOKEN_IDS_0517, HIDDEN_OFFSET_0513):
        assert issues[entry_id].shows_when, entry_id
    # the code path is every server's: the 0.5.13 entry lists the check on every server, as the 0.5.17 one does
    assert (
        issues[TOKEN_IDS_0513].checks
        == issues[TOKEN_IDS_0517].checks
        == ("test_token_ids_logprob_beside_other_requests",)
    )


def _smoke_0513(record: Path) -> dict:
    """A recorded 0.5.13 smoke run, its stored tags stripped: 2026-12-05b (the no-MTP and topk 3 witnesses crashed on
    the mixed batch, topk 1 served it) or 2026-12-05e (the no-MTP and topk 1 witnesses crashed, topk 3 served it)."""
    rec = read_json_or_gzip(record)
    known_upstream.strip(rec["tiers"])
    return rec


@pytest.mark.parametrize("day", ["2026-12-05b", "2026-12-05e"])
def test_the_mixed_batch_crash_is_known_on_whichever_server_timing_picks(day):
    record = RUNS / f"{day}-h200-sglang-0.5.13-smoke-default.json.gz"
    rec = _smoke_0513(record)
    known_upstream.apply(rec["tiers"], rec["versions"])
    smoke = rec["tiers"]["smoke"]
    crashed, served = (
        ("witness-mtp-topk1", "witness-mtp-topk3") if day.endswith("e") else ("witness-mtp-topk3", "witness-mtp-topk1")
    )
    by_id = {c["id"]: c for c in smoke["checks"]}
    for server in ("witness-nomtp", crashed):
        assert by_id[MIXED.format(server)].get("known_upstream") == TOKEN_IDS_0513, server
    untagged = [c["id"] for c in smoke["checks"] if c["outcome"] == "failed" and not c.get("known_upstream")]
    assert not [c for c in untagged if "token_ids_logprob" in c]
    unshown = {k["id"]: k["checks"] for k in smoke.get("unshown_known_upstream") or []}
    assert unshown[TOKEN_IDS_0513] == [MIXED.format(served)]
    # the record's no-MTP hidden-states check passed: the prefill offset did not show there, the entry stays
    assert unshown[HIDDEN_OFFSET_0513] == [
        "tests/tiers/test_smoke_hidden_states.py::test_hidden_states_as_predicted[witness-nomtp]"
    ]
    stale = [k["id"] for k in smoke.get("stale_known_upstream") or []]
    assert TOKEN_IDS_0513 not in stale and HIDDEN_OFFSET_0513 not in stale
    # a pass is a pass: the verdicts are those the same list gives without any shows_when
    plain = _smoke_0513(record)
    issues = [known_upstream.KnownIssue(**dict(i.__dict__, shows_when=None)) for i in known_upstream.load()]
    known_upstream.apply(plain["tiers"], plain["versions"], issues)
    assert smoke["verdict"] == plain["tiers"]["smoke"]["verdict"] and row_verdict(rec) == row_verdict(plain)


# --- the report: 'did not show', never 'can go' ---------------------------------------------------------------------


def _import(tmp_path: Path, results: Path, run_id: str, data: dict, knobs: dict | None = None) -> None:
    box = write_box(tmp_path / f"box-{run_id}", data, knobs=knobs)
    if knobs:  # a candidate: its patch, as runner/candidate.py records it
        inv = json.loads((box / "invocation.json").read_text())
        inv["patch"] = {"path": "/box/fix.patch", "sha256": SHA, "files": ["sglang/srt/x.py"]}
        (box / "invocation.json").write_text(json.dumps(inv))
    importer.import_run(box, H200_ROW, results=results, run_id=run_id)


def _served_on(data: dict, *servers: str) -> dict:
    """The H200 0.5.17 record (every witness crashed on the mixed batch) with ``servers`` serving it."""
    for chk in data["tiers"]["smoke"]["checks"]:
        if chk["id"] in {MIXED.format(s) for s in servers}:
            chk["outcome"] = "passed"
            chk.pop("failure", None)
    return data


SHA = "1a2b3c4" + "0" * 57


@pytest.fixture
def working_list(monkeypatch):
    """The report judges with this checkout's known_upstream.json, committed or not: these tests are about what it
    says of the list's entries (an uncommitted list is otherwise replaced by the commit's: evidence/checkout.py)."""
    from mtpmatrix.core.evidence import checkout

    monkeypatch.setattr(checkout, "known_issues", lambda repo=None: known_upstream.load())


def test_the_report_says_the_entry_did_not_show_and_not_that_it_can_go(tmp_path, working_list):
    results = tmp_path / "results"
    _import(tmp_path, results, "run", _served_on(h200_record(), "witness-mtp-topk1"))
    s = report_summary.build_summary(results / "run", require=["smoke"])
    assert not [k for k in s["stale_known_upstream"] if k["id"] == TOKEN_IDS_0517]
    (k,) = [k for k in s["unshown_known_upstream"] if k["id"] == TOKEN_IDS_0517]
    assert (k["row"], k["tier"], k["checks"]) == (H200_ROW, "smoke", [MIXED.format("witness-mtp-topk1")])
    shows_when = next(i.shows_when for i in known_upstream.load() if i.id == TOKEN_IDS_0517)
    md = report_render.render_markdown(s)
    line = next(ln for ln in md.splitlines() if TOKEN_IDS_0517 in ln and "🔸" in ln)
    assert line.startswith(
        f"- 🔸 entry `{TOKEN_IDS_0517}` did not show in {H200_ROW} smoke (1 of its checks passed: "
        "test_token_ids_logprob_beside_other_requests[witness-mtp-topk1]): it shows only when "
    )
    assert line.endswith(" — a pass is not evidence of a fix")
    assert "can go" not in line and f"`{TOKEN_IDS_0517}` can go" not in md
    html = report_render.render_html(s)
    assert f"<code>{TOKEN_IDS_0517}</code> did not show in {H200_ROW} smoke" in html
    assert "a pass is not evidence of a fix" in html
    assert f"it shows only when {shows_when} — a pass" in line
    # the condition is printed as text, whatever Markdown or HTML it holds (escaped as every value from a record)
    k["shows_when"] = "two requests <b>share</b> | a *step*\n# QUALIFIES"
    line = next(ln for ln in report_render.render_markdown(s).splitlines() if "🔸" in ln and TOKEN_IDS_0517 in ln)
    assert "it shows only when two requests \\<b\\>share\\</b\\> \\| a \\*step\\* # QUALIFIES — a pass" in line
    assert "two requests &lt;b&gt;share&lt;/b&gt;" in report_render.render_html(s)


def test_a_candidate_that_served_the_mixed_batch_fixes_nothing_it_can_show(tmp_path, working_list):
    """A candidate row where the entry did not show: not 'no longer applies', listed as 'did not show', and its
    checks that passed there say the bug did not show, not that it is fixed."""
    results = tmp_path / "results"
    _import(tmp_path, results, "base", h200_record())
    servers = ("witness-nomtp", "witness-mtp-topk1", "witness-mtp-topk3")
    knobs = {"MTPMATRIX_PATCH": "/box/fix.patch", "MTPMATRIX_PATCH_SHA256": SHA}
    _import(tmp_path, results, "cand", _served_on(h200_record(), *servers), knobs=knobs)
    s = report_summary.build_summary(results / "cand", baseline_dir=results / "base", require=["smoke"])
    (c,) = s["candidates"]
    assert TOKEN_IDS_0517 not in [k["id"] for k in c["no_longer_applies"]]
    assert [k["id"] for k in c["did_not_show"]] == [TOKEN_IDS_0517]
    fixed = [i for i in c["fixed"] if "token_ids_logprob" in i["check"]]
    assert len(fixed) == 3 and all(i["unshown"] == TOKEN_IDS_0517 for i in fixed)
    md = report_render.render_markdown(s)
    assert (
        f"- 🔸 known upstream `{TOKEN_IDS_0517}` did not show in the candidate (3 of its checks pass, smoke): it "
        "shows only when "
    ) in md
    assert f"`{TOKEN_IDS_0517}` no longer applies" not in md
    assert (
        "test_token_ids_logprob_beside_other_requests[witness-nomtp] (known upstream in "
        f"{H200_ROW}, passes now; `{TOKEN_IDS_0517}` did not show: not evidence of a fix)"
    ) in md
    html = report_render.render_html(s)
    assert f"<code>{TOKEN_IDS_0517}</code> did not show in the candidate" in html
