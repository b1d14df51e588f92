"""mtpmatrix.runner.bisect: the search with a fake probe (nothing is installed), candidates, defaults, the real probe."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from probe_records import VERSIONS, fake

from mtpmatrix.core.known_upstream import KnownIssue
from mtpmatrix.core.rows import load_rows
from mtpmatrix.runner import bisect as bs

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")

REPO = Path(__file__).resolve().parents[2]


def run_search(cands, first_bad, uninstallable=()):
    calls = []
    res = bs.search(cands, fake(first_bad, uninstallable, calls)(cands), log=lambda s: None)
    return res, calls


@pytest.mark.parametrize("n", range(1, 13))
def test_finds_every_first_bad_position_in_log_probes(n):
    cands = VERSIONS[:n]
    for first_bad in range(n + 1):  # n means: everything passes
        res, calls = run_search(cands, first_bad)
        assert len(calls) == len(set(calls)) <= math.ceil(math.log2(n + 1))
        if first_bad == n:
            assert res.outcome == "no-bad" and res.first_bad is None and res.last_good == cands[-1]
        elif first_bad == 0:
            assert res.outcome == "good-fails" and res.first_bad == cands[0] and res.last_good is None
        else:
            assert res.outcome == "found"
            assert (res.first_bad, res.last_good) == (cands[first_bad], cands[first_bad - 1])
            assert res.ambiguous == []


def test_uninstallable_releases_in_the_middle_are_skipped():
    # 5.10.1 .. 5.11.0 do not install; the break is at 5.12.0
    unin = {7, 8, 9}
    res, calls = run_search(VERSIONS, first_bad=12, uninstallable=unin)
    assert res.outcome == "found" and res.first_bad == "5.12.0" and res.last_good == "5.11.2"
    assert res.ambiguous == []
    assert any(p.status == bs.UNTESTABLE for p in res.probes) or not set(calls) & {VERSIONS[i] for i in unin}


def test_uninstallable_releases_right_before_the_break_make_it_ambiguous():
    # the real first bad release (5.10.0) does not install, nor does the one before it
    res, _ = run_search(VERSIONS, first_bad=6, uninstallable={5, 6})
    assert res.first_bad == "5.10.1" and res.last_good == "5.9.1"
    assert res.ambiguous == ["5.9.2", "5.10.0"]
    text = "\n".join(bs.describe(res, "transformers"))
    assert "or one of the untestable releases just before it: 5.9.2, 5.10.0" in text


@pytest.mark.parametrize("seed", range(40))
def test_random_ranges_with_random_uninstallable_releases(seed):
    rnd = random.Random(seed)
    n = rnd.randint(1, 30)
    cands = [f"1.{i}.0" for i in range(n)]
    first_bad = rnd.randint(0, n)
    unin = {i for i in range(n) if rnd.random() < 0.3}
    res, calls = run_search(cands, first_bad, unin)
    assert len(calls) == len(set(calls))  # never probes a release twice
    testable_bad = [i for i in range(first_bad, n) if i not in unin]
    if testable_bad:
        assert res.first_bad == cands[testable_bad[0]]
        # everything between the last good and the reported first bad is untestable
        lo = cands.index(res.last_good) if res.last_good else -1
        assert all(i in unin for i in range(lo + 1, testable_bad[0]))
        assert res.ambiguous == [cands[i] for i in range(lo + 1, testable_bad[0])]
    else:
        assert res.first_bad is None
        assert res.outcome == ("no-bad" if len(unin) < n else "inconclusive")


def test_all_good_and_all_bad_ranges():
    res, _ = run_search(VERSIONS, first_bad=None)
    assert res.outcome == "no-bad" and res.last_good == VERSIONS[-1]
    assert "BAD passes here" in "\n".join(bs.describe(res, "transformers"))
    res, _ = run_search(VERSIONS, first_bad=0)
    assert res.outcome == "good-fails" and res.first_bad == VERSIONS[0]
    assert "GOOD 5.8.0 itself fails" in "\n".join(bs.describe(res, "transformers"))


def test_nothing_installs_is_inconclusive():
    res, calls = run_search(VERSIONS[:5], first_bad=2, uninstallable=set(range(5)))
    assert res.outcome == "inconclusive" and res.first_bad is None and len(calls) == 5
    assert "inconclusive" in "\n".join(bs.describe(res, "transformers"))


@pytest.mark.parametrize("first_bad, outcome", [(0, "good-fails"), (None, "no-bad")])
def test_good_equals_bad_is_one_probe(first_bad, outcome):
    cands = bs.candidates("transformers", "5.9.0", "5.9.0", releases=lambda name: VERSIONS)
    assert cands == ["5.9.0"]
    res, calls = run_search(cands, first_bad)
    assert calls == ["5.9.0"] and res.outcome == outcome


def test_candidates_from_the_index_listing():
    rel = ["5.7.0", "5.8.0", "5.8.1", "5.10.0", "5.9.0", "6.0.0"]
    assert bs.candidates("transformers", "5.8.1", "5.10.0", releases=lambda n: rel) == ["5.8.1", "5.9.0", "5.10.0"]
    with pytest.raises(bs.BisectError, match="newer than BAD"):
        bs.candidates("transformers", "5.10.0", "5.8.1", releases=lambda n: rel)
    with pytest.raises(bs.BisectError, match="no release of transformers between"):
        bs.candidates("transformers", "5.8.2", "5.8.9", releases=lambda n: rel)
    with pytest.raises(bs.BisectError, match="Invalid version"):
        bs.candidates("transformers", "five", "5.8.9", releases=lambda n: rel)


def test_the_search_reports_the_failure_of_the_first_bad_release():
    res, _ = run_search(VERSIONS, first_bad=9)
    lines = bs.describe(res, "transformers")
    assert lines[0] == "first bad release: transformers 5.11.0 (last good: 5.10.2)"
    assert "error: [mismatch] CheckFailure: tokens differ at 3 (5.11.0)" in lines[1]
    assert lines[2] == "  first frame: transformers/generation/utils.py:2471 in _assisted_decoding"
    assert "probe(s) over 18 release(s)" in lines[-1]


# --- probe records -> good / bad / untestable / known-only ------------------------------------------------------

REF = "tests/tiers/test_reference.py::"
LISTED = KnownIssue(
    id="hf-x",
    package="transformers",
    affected=">=5.8.0,<6",
    tier="reference",
    component="library",
    kind="mismatch",
    match="tokens differ",
    checks=("test_k",),
    summary="s",
    upstream="u",
)
MISMATCH = {"kind": "mismatch", "type": "CheckFailure", "message": "tokens differ at 3", "frame": "f", "raised_at": "r"}


def _chk(name, outcome, failure=None, **kw):
    return {"id": REF + name, "outcome": outcome, **({"failure": dict(failure)} if failure else {}), **kw}


def _rec(*checks, verdict="passed", collected=None, **tier):
    """A finished probe record of the reference tier at transformers 5.9.0; its session collected ``collected``
    (default: exactly its checks). The stored verdict is whatever the plugin wrote: judging derives it again."""
    ids = [c["id"] for c in checks] if collected is None else [REF + n for n in collected]
    return {
        "install": {"verdict": "passed"},
        "versions": {"transformers": "5.9.0"},
        "verdict": "passed",
        "selection": {"args": [], "knobs": {}, "paths": [], "collected": {"reference": ids}},
        "tiers": {"reference": {"verdict": verdict, "checks": list(checks), **tier}},
    }


def classify(rec, **kw):
    return bs.classify_record(rec, "reference", "5.9.0", 1, issues=[LISTED], **kw)


def test_classify_record():
    inst = {"install": {"verdict": "failed", "failure": {"kind": "install", "message": "resolver conflict: x"}}}
    p = bs.classify_record(inst, "reference", "5.9.0", 3.0)
    assert p.status == bs.UNTESTABLE and p.detail == "does not install: resolver conflict: x"
    assert classify(_rec(_chk("test_a", "passed"))).status == bs.GOOD
    # nothing failed but not all of the tier ran (a check skipped on this release): good only when the checks
    # that break at the bad end ran here and passed; a release that skipped one of them has shown nothing
    ran = [_chk("test_a", "passed"), _chk("test_b", "skipped", reason="skip")]
    partial = _rec(*ran)
    p = classify(partial, breaking=frozenset({"test_a"}))
    assert p.status == bs.GOOD and p.detail == "partial: 1 expected check(s) did not run, none that breaks"
    p = classify(partial, breaking=frozenset({"test_a", "test_b"}))
    assert p.status == bs.UNTESTABLE and p.detail.endswith("the check(s) that break did not run here: test_b")
    p = classify(partial)
    assert p.status == bs.UNTESTABLE and p.detail.endswith("which checks break is not known")
    # a tier that passed without the check that breaks shows nothing
    whole = _rec(ran[0])
    assert classify(whole, breaking=frozenset({"test_a"})).status == bs.GOOD
    p = classify(whole, breaking=frozenset({"test_c"}))
    assert p.status == bs.UNTESTABLE and p.detail == "reference tier passed without the check(s) that break: test_c"
    assert classify(whole).status == bs.GOOD
    p = classify(_rec(_chk("test_a", "failed", MISMATCH), verdict="failed", failure_kinds=["mismatch"]))
    assert p.status == bs.BAD and p.failure == MISMATCH and "tokens differ" in p.detail and p.breaks == ["test_a"]
    harness = {"kind": "harness", "message": "KeyError"}
    p = classify(_rec(_chk("test_a", "error", harness), verdict="error", failure_kinds=["harness"]))
    assert p.status == bs.UNTESTABLE and p.detail == "harness error: KeyError"
    # pytest died before any check could say (no records): proves nothing either way, as in the report
    p = classify(_rec(verdict="error", reason="pytest exited 4 without results", failure_kinds=["crash"]))
    assert (
        p.status == bs.UNTESTABLE
        and p.detail == "reference tier error before any check could say: pytest exited 4 without results"
    )
    p = classify(_rec(verdict="skipped", reason="reference tier: transformers 5.7 has no gemma4_assistant"))
    assert p.status == bs.UNTESTABLE and "no gemma4_assistant" in p.detail and not p.fatal
    p = bs.classify_record(
        {
            "install": {"verdict": "passed"},
            "tiers": {"smoke": {"verdict": "skipped", "reason": "smoke tier: needs 1 CUDA GPU(s), this machine has 0"}},
        },
        "smoke",
        "v",
        1,
    )
    assert p.fatal and p.detail == "smoke tier skipped: needs 1 CUDA GPU(s), this machine has 0"


def test_a_probe_is_judged_again_not_read_from_its_stored_verdicts_and_tags():
    """A probe record's stored verdict and tags are what some earlier run wrote: a failure tagged with an entry
    removed since, or a tier stored as passed around a failing check, is a failure."""
    removed = _rec(
        _chk("test_a", "failed", MISMATCH, known_upstream="an-entry-removed-since"), verdict="known-upstream"
    )
    assert classify(removed).status == bs.BAD
    assert classify(removed, breaking=frozenset({"test_b"})).status == bs.BAD
    assert classify(_rec(_chk("test_a", "failed", MISMATCH), verdict="passed")).status == bs.BAD
    assert bs.failing_checks(removed, "reference", issues=[LISTED]) == {"test_a"}


def test_a_harness_error_beside_a_known_upstream_failure_is_untestable():
    """The recorded smoke tier of a 0.5.x row fails only on the draft-phase known upstream issue; with a harness
    error beside it, the probe has shown nothing about the release."""
    from probe_records import DRAFT_PHASE, smoke_record

    rec = smoke_record({"sglang": "0.5.23", "torch": "2.15.0"}, harness_error=True)
    p = bs.classify_record(rec, "smoke", "2.15.0", 1.0)
    assert p.status == bs.UNTESTABLE, p
    assert p.detail == (
        f"harness error: the smoke tier never batched 4 requests at topk 3; known upstream {DRAFT_PHASE} beside it"
    )
    assert p.known_upstream == [DRAFT_PHASE] and p.breaks == []


def test_a_probe_that_fails_only_on_listed_issues_is_its_own_state():
    """Known upstream only: good for a search of a new break only when the checks that break there ran here and
    passed; otherwise neither good nor bad (a listed bug may hide the break searched, or be it)."""
    ku = _rec(_chk("test_k", "failed", MISMATCH), _chk("test_a", "passed"), verdict="failed")
    p = classify(ku)
    assert p.status == bs.KNOWN_ONLY and p.known_upstream == ["hf-x"]
    assert p.detail == "reference tier fails only on listed upstream issues (hf-x); which checks break is not known"
    p = classify(ku, breaking=frozenset({"test_a"}))
    assert p.status == bs.GOOD and p.detail == "known upstream only (hf-x); the check(s) that break passed"
    p = classify(ku, breaking=frozenset({"test_a", "test_k"}))
    assert p.status == bs.KNOWN_ONLY and p.detail.endswith("the check(s) that break did not pass here: test_k")
    # the search sets it aside like an untestable release, and says which it was
    status = {"1.0": bs.GOOD, "1.1": bs.KNOWN_ONLY, "1.2": bs.BAD}
    res = bs.search(
        list(status),
        lambda v: bs.Probe(
            v,
            status[v],
            "fails only on listed upstream issues (hf-x)",
            known_upstream=["hf-x"] if status[v] == bs.KNOWN_ONLY else [],
        ),
        log=lambda s: None,
    )
    assert (res.first_bad, res.last_good, res.ambiguous) == ("1.2", "1.0", ["1.1"])
    text = bs.describe(res, "transformers")
    assert "transformers 1.1: fails only on listed upstream issues (hf-x) (neither good nor bad)" in text
    assert "  or one of the releases just before it that fail only on listed upstream issues: 1.1" in text


def test_a_fatal_probe_stops_the_search():
    calls = []

    def probe(v):
        calls.append(v)
        return bs.Probe(v, bs.UNTESTABLE, "smoke tier skipped: needs 1 CUDA GPU(s)", fatal=True)

    with pytest.raises(bs.BisectError, match="no release can be tested here"):
        bs.search(VERSIONS, probe, log=lambda s: None)
    assert len(calls) == 1


# --- defaults -------------------------------------------------------------------------------------------------


def test_default_tier_is_the_cheapest_that_failed_in_the_latest_finished_run(results):
    # 0.5.23 is unfinished in the newest (CPU) run: the run before failed contract and gsm8k
    assert bs.cheapest_failed_tier(results, "sglang-0.5.23") == ("contract", "20261208-090507")
    assert bs.cheapest_failed_tier(results, "sglang-0.5.17") == ("contract", "20261209-140233")  # nothing failed
    assert bs.cheapest_failed_tier(results, "no-such-row") == ("contract", None)
    f = results / "20261208-090507" / "sglang-0.5.23" / "row.json"
    rec = json.loads(f.read_text())
    rec["tiers"]["reference"]["verdict"] = "failed"  # a stored verdict alone: judged again, nothing failed there
    f.write_text(json.dumps(rec))
    assert bs.cheapest_failed_tier(results, "sglang-0.5.23") == ("contract", "20261208-090507")
    rec["tiers"]["reference"]["checks"][0].update(outcome="failed", failure={"kind": "mismatch", "message": "x"})
    f.write_text(json.dumps(rec))
    assert bs.cheapest_failed_tier(results, "sglang-0.5.23") == ("reference", "20261208-090507")


def test_the_checks_that_break_come_from_the_latest_run_where_the_tier_failed(results):
    f = results / "20261208-090507" / "sglang-0.5.23" / "row.json"
    rec = json.loads(f.read_text())
    c = "tests/tiers/test_contract.py::"
    rec["tiers"]["contract"]["checks"] = [
        {"id": c + "test_import", "outcome": "failed", "failure": {"kind": "import", "message": "x"}},
        {"id": c + "test_abi", "outcome": "passed"},
        # a stored tag is some earlier run's: no entry explains this failure today, so it is part of the break
        {"id": c + "test_x", "outcome": "failed", "known_upstream": "hf-x"},
        {"id": c + "test_h", "outcome": "error", "failure": {"kind": "harness", "message": "KeyError"}},
    ]  # no evidence
    f.write_text(json.dumps(rec))
    assert bs.latest_failing_run(results, "sglang-0.5.23", "contract") == "20261208-090507"
    assert bs.latest_failing_run(results, "sglang-0.5.23", "smoke") is None
    assert bs.breaking_checks(results, "20261208-090507", "sglang-0.5.23", "contract") == {"test_import", "test_x"}
    assert bs.breaking_checks(results, None, "sglang-0.5.23", "contract") is None


def test_cheapest_order():
    assert bs.CHEAPEST == ("reference", "contract", "smoke", "gsm8k")


def test_default_row_is_the_first_failing_row_of_the_latest_run(results):
    rows = load_rows(REPO / "constraints")
    # latest (CPU) run: sglang-0.5.13 errored
    assert bs.default_row(results, rows) == "sglang-0.5.13"
    assert bs.default_row(results / "nowhere", rows) == "sglang-0.5.17"  # the 'ci' row


def test_every_probe_status_combination_on_three_releases():
    # exhaustive over 3 releases x {good, bad, untestable}, monotone in good/bad
    cands = ["1.0", "1.1", "1.2"]
    for statuses in itertools.product((bs.GOOD, bs.BAD, bs.UNTESTABLE), repeat=3):
        testable = [s for s in statuses if s != bs.UNTESTABLE]
        if testable != sorted(testable, key=lambda s: s == bs.BAD):
            continue  # not monotone
        res = bs.search(cands, lambda v: bs.Probe(v, statuses[cands.index(v)]), log=lambda s: None)
        bad = [i for i, s in enumerate(statuses) if s == bs.BAD]
        assert res.first_bad == (cands[bad[0]] if bad else None)


@pytest.mark.parametrize("keep", [False, True])
def test_a_probe_installs_the_release_and_removes_its_venv_unless_kept(tmp_path, monkeypatch, keep):
    """make_probe's probe: a fresh venv under the cache, the row run with ``package==version`` and the spec's
    companions into the spec's run, its record classified; the venv removed after, unless ``keep_venvs``."""
    from probe_records import reference_record

    from mtpmatrix.runner import matrix

    runs = []

    def make_venv(row, venv):
        venv.mkdir(parents=True)
        return venv

    def run_row(row, venv, opts, log=print):
        runs.append((row.id, venv, list(opts.overrides), opts.run_id, opts.tiers))
        return reference_record("5.12.1")

    monkeypatch.setattr(bs, "make_venv", make_venv)
    monkeypatch.setattr(matrix, "find_uv", lambda error: "uv")
    monkeypatch.setattr(matrix, "run_row", run_row)
    row = next(r for r in load_rows(REPO / "constraints") if r.id == "sglang-0.5.17")
    spec = bs.ProbeSpec(
        row, "transformers", "reference", "b1", tmp_path / "results", tmp_path / "cache", ("torch==2.9.1",), keep
    )
    p = bs.make_probe(spec, log=lambda m: None)("5.12.1")
    venv = tmp_path / "cache" / "sglang-0.5.17" / "5.12.1"
    assert runs == [
        (
            "sglang-0.5.17-transformers-5.12.1-torch-2-9-1",
            venv,
            ["transformers==5.12.1", "torch==2.9.1"],
            "b1",
            "reference",
        )
    ]
    assert p.version == "5.12.1" and p.record == str(tmp_path / "results" / "b1" / runs[0][0] / "row.json")
    assert venv.exists() is keep
