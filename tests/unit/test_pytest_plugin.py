"""The pytest plugin (mtpmatrix.tiers.session.plugin) end to end: real pytest sessions (pytester, in process) over
small synthetic test files, loaded the way tests/conftest.py loads it, with the project's markers.

What this machine can run, the installed versions and the known-upstream list are fixed by the ``session``
fixture (the plugin reads them through ``environment`` and ``known_upstream``), so the verdicts do not depend on
whether sglang, transformers or a GPU happen to be here.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from mtpmatrix.core import expected, known_upstream
from mtpmatrix.core.evidence import expected_checks
from mtpmatrix.core.schema import SCHEMA, TIERS
from mtpmatrix.serving import environment

pytest_plugins = ["pytester"]

MARKERS = (*TIERS, "check(kind): what a failure of this test means")  # registered as pyproject.toml does
NO_GPU = "needs 1 CUDA GPU(s), this machine has 0"
VERSIONS = {"python": "3.11.9", "transformers": "5.18.0", "torch": "2.11.0"}

# One module per tier behaviour the plugin records; line numbers matter only through ``line_of``.
CHECKS = """\
import time

import pytest

from mtpmatrix.core.kinds import CheckFailure


@pytest.fixture
def slow_setup():
    time.sleep(0.3)


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


@pytest.mark.contract
@pytest.mark.check("args")
def test_resolves(slow_setup, record_property, mtp_results_dir):
    record_property("speculative_algorithm", "FROZEN_KV_MTP")
    record_property("vs_nomtp", {"delta": 0.01, "lost": 1})
    (mtp_results_dir / "server-resolves.log").write_text("kept next to tiers.json")


@pytest.mark.contract
@pytest.mark.check("config")
def test_config_values(record_property):
    record_property("layers", 8)
    assert 1 + 1 == 3, "config resolves to the wrong values"


@pytest.mark.contract
@pytest.mark.check("weights")
def test_needs_broken_fixture(broken):
    pass


@pytest.mark.contract
@pytest.mark.check("crash")
def test_own_bug():
    raise RuntimeError("a bug in the harness")


@pytest.mark.contract
def test_skips_itself():
    pytest.skip("not on this row:\\n  reason spans\\n  three lines")


@pytest.mark.reference
@pytest.mark.check("mismatch")
def test_greedy():
    raise CheckFailure("mismatch", "outputs differ at token 3")


@pytest.mark.reference
def test_reference_ok():
    pass


@pytest.mark.smoke
def test_server():
    pass


def test_not_a_tier():
    pass
"""


def line_of(source: str, text: str) -> int:
    return next(i for i, ln in enumerate(source.splitlines(), 1) if text in ln)


@pytest.fixture
def session(pytester, monkeypatch, tmp_path):
    """``run(source, *args, unavailable=..., known=[...]) -> (result, tiers.json or None)``."""
    pytester.makeini(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n" + "".join(f"    {m}\n" for m in MARKERS)
    )
    pytester.makeconftest('pytest_plugins = ["mtpmatrix.tiers.session.plugin"]\n')
    monkeypatch.setattr(environment, "versions", lambda: dict(VERSIONS))
    monkeypatch.setattr(environment, "gpu_count", lambda: 0)
    monkeypatch.setenv(expected_checks.ENV, expected_checks.AS_COLLECTED)  # a made-up suite: judged as collected
    real_load = known_upstream.load

    def run(source: str, *args: str, unavailable: dict | None = None, known: list[dict] | str = ()):
        why = {"contract": None, "reference": None, "smoke": NO_GPU, "gsm8k": NO_GPU, **(unavailable or {})}
        monkeypatch.setattr(environment, "tier_unavailable", lambda tier: why[tier])
        listing = tmp_path / "known_upstream.json"
        listing.write_text(known if isinstance(known, str) else json.dumps({"issues": list(known)}))
        monkeypatch.setattr(known_upstream, "load", lambda path=None: real_load(listing))
        pytester.makepyfile(test_tiers=source)
        out = pytester.path / "row" / "tiers.json"
        # no_reraise_ctrlc: a session stopped by Ctrl-C in a synthetic test ends that session, not this one
        result = pytester.runpytest("-rs", "--mtp-results", str(out), *args, no_reraise_ctrlc=True)
        return result, (json.loads(out.read_text()) if out.exists() else None)

    return run


def _checks(tiers: dict, tier: str) -> dict[str, dict]:
    return {c["id"].split("::", 1)[1]: c for c in tiers["tiers"][tier]["checks"]}


def test_tiers_json_holds_verdicts_and_check_records(session, pytester):
    result, data = session(CHECKS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert data["schema"] == SCHEMA and data["versions"] == VERSIONS and data["gpus"] == 0
    assert data["exitstatus"] == 1 and data["seconds"] > 0
    tiers = data["tiers"]
    assert set(tiers) == set(TIERS)

    contract = tiers["contract"]
    assert contract["verdict"] == "failed"
    assert contract["failure_kinds"] == ["harness"]
    checks = _checks(data, "contract")
    assert list(checks) == [
        "test_resolves",
        "test_config_values",
        "test_needs_broken_fixture",
        "test_own_bug",
        "test_skips_itself",
    ]
    assert all(c["tier"] == "contract" and c["id"] == f"test_tiers.py::{name}" for name, c in checks.items())
    assert contract["seconds"] == pytest.approx(sum(c["seconds"] for c in checks.values()), abs=0.01)

    ok = checks["test_resolves"]
    assert ok["outcome"] == "passed" and "failure" not in ok
    # record_property values, as recorded (JSON values stay JSON values)
    assert ok["metrics"] == {"speculative_algorithm": "FROZEN_KV_MTP", "vs_nomtp": {"delta": 0.01, "lost": 1}}
    assert ok["seconds"] >= 0.3  # a fixture's setup counts into the check's time
    assert 0 <= ok["cpu_seconds"] < 0.25  # its CPU time too, and a sleeping fixture spends none
    # mtp_results_dir is the folder of --mtp-results: what a tier keeps lands next to tiers.json
    assert (pytester.path / "row" / "server-resolves.log").read_text() == "kept next to tiers.json"

    bad = checks["test_config_values"]
    assert bad["outcome"] == "failed" and bad["metrics"] == {"layers": 8}
    # a bare assertion is the harness's, whatever the check declares (a break found says so with CheckFailure)
    assert bad["failure"] == {
        "kind": "harness",
        "type": "AssertionError",
        "message": "config resolves to the wrong values",
        "frame": None,
        "raised_at": f"{pytester.path / 'test_tiers.py'}:{line_of(CHECKS, 'assert 1 + 1 == 3')} in test_config_values",
    }

    setup = checks["test_needs_broken_fixture"]
    assert setup["outcome"] == "error" and setup["metrics"] == {}
    assert setup["failure"]["type"] == "RuntimeError" and setup["failure"]["message"] == "fixture broke"
    assert setup["failure"]["raised_at"].endswith(f":{line_of(CHECKS, 'fixture broke')} in broken")

    # an exception that never went through a library under test is this project's bug, whatever the check declares
    own = checks["test_own_bug"]
    assert own["outcome"] == "failed" and own["failure"]["kind"] == "harness"

    skipped = checks["test_skips_itself"]
    assert skipped["outcome"] == "skipped" and skipped["reason"] == "not on this row: reason spans three lines"

    reference = tiers["reference"]
    assert reference["verdict"] == "failed" and reference["failure_kinds"] == ["mismatch"]
    greedy = _checks(data, "reference")["test_greedy"]
    assert greedy["failure"]["kind"] == "mismatch" and greedy["failure"]["type"] == "CheckFailure"
    assert greedy["failure"]["message"] == "outputs differ at token 3"

    # an unavailable tier: each check skipped with the one-line reason, and the tier with it
    assert tiers["smoke"]["verdict"] == "skipped" and tiers["smoke"]["reason"] == f"smoke tier: {NO_GPU}"
    assert tiers["gsm8k"] == {"verdict": "skipped", "reason": "no tests collected for this tier", "checks": []}
    # a test without a tier marker is no check of any tier
    assert "test_not_a_tier" not in json.dumps(tiers)
    assert all("incomplete" not in t for t in tiers.values())


def test_tiers_option_selects_and_skips_with_one_line(session):
    result, data = session(CHECKS, "--tiers", " reference, contract ", unavailable={"contract": "no sglang here"})
    tiers = data["tiers"]
    assert tiers["reference"]["verdict"] == "failed"
    assert tiers["contract"]["verdict"] == "skipped" and tiers["contract"]["reason"] == "contract tier: no sglang here"
    not_selected = "smoke tier not selected (--tiers reference,contract)"
    assert tiers["smoke"]["verdict"] == "skipped" and tiers["smoke"]["reason"] == not_selected
    assert _checks(data, "smoke")["test_server"] == {
        "id": "test_tiers.py::test_server",
        "tier": "smoke",
        "outcome": "skipped",
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "metrics": {},
        "reason": not_selected,
    }
    # the terminal says the same, one line each
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] test_tiers.py:*: contract tier: no sglang here",
            f"SKIPPED [[]1[]] test_tiers.py:*: {not_selected}",
        ]
    )
    result.stdout.fnmatch_lines(
        ["mtpmatrix tier reference: available", "mtpmatrix tier contract: skip (no sglang here)"]
    )
    result.assert_outcomes(passed=2, failed=1, skipped=6)


def test_tiers_from_the_environment(session, monkeypatch):
    monkeypatch.setenv("MTPMATRIX_TIERS", "smoke")
    _result, data = session(CHECKS, unavailable={"smoke": None})
    # its one check passed, but none of the default smoke servers was collected: not the whole tier
    smoke = data["tiers"]["smoke"]
    assert smoke["verdict"] == "partial"
    assert {m["what"] for m in smoke["missing"]} == set(expected.default_smoke_servers())
    assert data["tiers"]["contract"]["reason"] == "contract tier not selected (--tiers smoke)"


@pytest.mark.parametrize("tiers", ["contract,bogus", "Contract"])
def test_unknown_tier_is_a_usage_error(session, tiers):
    result, data = session(CHECKS, "--tiers", tiers)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and data is None
    bad = tiers.split(",")[-1]
    result.stderr.fnmatch_lines([f"ERROR: --tiers: unknown tier(s) {bad}; known: contract, reference, smoke, gsm8k"])


KNOWN = {
    "id": "greedy-bug",
    "package": "transformers",
    "affected": ">=5.18.0,<5.20.0",
    "tier": "reference",
    "match": r"CheckFailure: outputs differ at token \d",
    "checks": ["test_greedy"],
    "summary": "one line",
    "upstream": "https://example.invalid/pr/1",
    "fixed_in": "5.20.0",
    "component": "library",
    "kind": "mismatch",
}
# A reference check that fails the way KNOWN describes; the modules below add their own checks to it.
GREEDY_FAILS = """\
import pytest

from mtpmatrix.core.kinds import CheckFailure


@pytest.mark.reference
@pytest.mark.check("mismatch")
def test_greedy():
    raise CheckFailure("mismatch", "outputs differ at token 3")
"""
REFERENCE_ONLY = (
    GREEDY_FAILS
    + """

@pytest.mark.reference
def test_witness():
    pass
"""
)


def test_known_upstream_failure_is_tagged_and_does_not_fail_the_tier(session):
    stale = dict(KNOWN, id="witness-bug", match="never raised", checks=["test_witness"])
    other_release = dict(KNOWN, id="old-bug", affected="<5.9")
    _result, data = session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN, stale, other_release])
    reference = data["tiers"]["reference"]
    assert reference["verdict"] == "known-upstream"
    assert _checks(data, "reference")["test_greedy"]["known_upstream"] == "greedy-bug"
    assert reference["known_upstream"] == [
        {
            "id": "greedy-bug",
            "package": "transformers",
            "version": "5.18.0",
            "summary": "one line",
            "upstream": "https://example.invalid/pr/1",
            "fixed_in": "5.20.0",
            "serving_path": False,
            "component": "library",
            "checks": ["test_tiers.py::test_greedy"],
        }
    ]
    # a listed check that passes inside the affected range: the entry no longer describes this environment
    assert [(e["id"], e["checks"]) for e in reference["stale_known_upstream"]] == [
        ("witness-bug", ["test_tiers.py::test_witness"])
    ]


def test_a_batch_timing_entry_that_did_not_show_is_said_so_not_can_go(session):
    # shows_when (known_upstream.py): the 0.5.13 mixed-batch crash passed on another server each H200 run
    timing = dict(KNOWN, id="timing-bug", match="never raised", checks=["test_witness"], shows_when="two share a step")
    result, data = session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN, timing])
    reference = data["tiers"]["reference"]
    assert "stale_known_upstream" not in reference or reference["stale_known_upstream"] == []
    assert [e["id"] for e in reference["unshown_known_upstream"]] == ["timing-bug"]
    out = result.stdout.str()
    assert "did not show (batch timing: a pass is not a fix)" in out and "it shows only when two share a step" in out
    assert "entries that can go" not in out


def test_known_upstream_needs_the_affected_release(session, monkeypatch):
    monkeypatch.setitem(VERSIONS, "transformers", "5.20.0")
    _result, data = session(REFERENCE_ONLY, "--tiers", "reference", known=[KNOWN])
    reference = data["tiers"]["reference"]
    assert reference["verdict"] == "failed" and "known_upstream" not in reference
    assert "known_upstream" not in _checks(data, "reference")["test_greedy"]


def test_malformed_known_upstream_list_is_a_usage_error(session):
    result, data = session(REFERENCE_ONLY, known=[dict(KNOWN, tier="nightly")])
    assert result.ret == pytest.ExitCode.USAGE_ERROR and data is None
    result.stderr.fnmatch_lines(["ERROR: known upstream issues: *issue 0 (greedy-bug): unknown tier 'nightly'*"])


def test_collection_error_marks_every_selected_tier_incomplete(session, pytester):
    pytester.makepyfile(test_broken="import no_such_module_here\n")
    result, data = session(REFERENCE_ONLY, "--tiers", "contract,reference")
    assert result.ret == pytest.ExitCode.INTERRUPTED and data["exitstatus"] == int(pytest.ExitCode.INTERRUPTED)
    reason = "pytest stopped early (exit 2): 1 collection error(s), first in test_broken.py; see the pytest output"
    for tier in ("contract", "reference"):  # nothing ran: an error, never 'skipped' or 'passed'
        entry = data["tiers"][tier]
        assert (entry["verdict"], entry["incomplete"], entry["reason"], entry["failure_kinds"]) == (
            "error",
            True,
            reason,
            ["harness"],
        )
    assert data["tiers"]["smoke"]["verdict"] == "skipped" and "incomplete" not in data["tiers"]["smoke"]


INTERRUPTED = (
    GREEDY_FAILS
    + """

@pytest.mark.contract
def test_first():
    pass


@pytest.mark.contract
def test_ctrl_c():
    raise KeyboardInterrupt


@pytest.mark.contract
def test_never_reached():
    pass
"""
)


def test_interrupted_session_keeps_failures_and_marks_the_rest(session):
    result, data = session(INTERRUPTED, "--tiers", "contract,reference,smoke")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    tiers = data["tiers"]
    assert tiers["reference"]["verdict"] == "failed" and "incomplete" not in tiers["reference"]
    assert tiers["reference"]["failure_kinds"] == ["mismatch"]
    contract = tiers["contract"]  # one check passed before Ctrl-C: that qualifies nothing
    assert contract["verdict"] == "error" and contract["incomplete"] and contract["failure_kinds"] == ["harness"]
    assert contract["reason"] == "pytest stopped early (exit 2); see the pytest output"
    assert [c["id"] for c in contract["checks"]] == ["test_tiers.py::test_first"]
    assert tiers["smoke"]["verdict"] == "error" and tiers["smoke"]["incomplete"]
    assert tiers["gsm8k"]["verdict"] == "skipped"  # not selected


def test_interrupted_session_is_an_error_even_with_only_known_failures(session):
    source = REFERENCE_ONLY + "\n\n@pytest.mark.reference\ndef test_ctrl_c():\n    raise KeyboardInterrupt\n"
    _result, data = session(source, "--tiers", "reference", known=[KNOWN])
    reference = data["tiers"]["reference"]
    assert _checks(data, "reference")["test_greedy"]["known_upstream"] == "greedy-bug"
    assert reference["verdict"] == "error" and reference["incomplete"]


def test_no_results_file_without_the_option(pytester, monkeypatch):
    pytester.makeconftest('pytest_plugins = ["mtpmatrix.tiers.session.plugin"]\n')
    monkeypatch.setattr(environment, "tier_unavailable", lambda tier: None)
    monkeypatch.delenv("MTPMATRIX_RESULTS", raising=False)
    pytester.makepyfile(
        test_one=textwrap.dedent("""
        import pytest

        @pytest.mark.contract
        def test_x(mtp_results_dir):
            assert mtp_results_dir.is_dir()
        """)
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    result.assert_outcomes(passed=1)
    assert not list(pytester.path.rglob("tiers.json"))


# A package whose __init__ fails half way, after importing a namespace subpackage (sglang/__init__.py imports
# sglang.srt.environ first; sglang.srt has no __init__.py): importlib drops the package from sys.modules but keeps
# the subpackage, so every later import under it raises KeyError: '<package>' from _NamespacePath._get_parent_path.
# Seen on the 0.5.23 row with --with torch==2.15.0 (torchaudio built for another CUDA, raised in sglang/__init__.py).
HALF_IMPORTED = {
    # fails once, like sglang under that row: a later step (sglang.launch_server) imported the package again cleanly
    "halfpkg/__init__.py": "import os\nfrom halfpkg.sub.environ import x  # noqa: F401\n"
    "flag = os.path.join(os.path.dirname(__file__), 'fail-once')\n"
    "if os.path.exists(flag):\n    os.unlink(flag)\n"
    "    raise ImportError('halfpkg was built for CUDA 13.0, torch has 13.2')\n",
    "halfpkg/fail-once": "",
    "halfpkg/top.py": "",
    "halfpkg/sub/environ.py": "x = 1\n",
    "halfpkg/sub/models/__init__.py": "",
    "halfpkg/sub/models/m1.py": "",
    "halfpkg/sub/models/m2.py": "",
    "halfpkg/sub/models/m3.py": "",
}
IMPORT_CHAIN = """\
import pytest

from mtpmatrix.tiers.compat import sglang_compat as compat

CHAIN = (*(compat.ImportStep(m, (f"halfpkg.sub.models.{m}",)) for m in ("m1", "m2", "m3")),
         compat.ImportStep("top", ("halfpkg.top",)))


@pytest.fixture(scope="module")
def chain():
    return compat.import_chain(CHAIN)


@pytest.mark.contract
@pytest.mark.check("import")
@pytest.mark.parametrize("step", CHAIN, ids=lambda s: s.id)
def test_import(step, chain):
    if step.id in chain.errors:
        raise chain.errors[step.id]


@pytest.mark.contract
@pytest.mark.check("config")
def test_unrelated():
    return {}["own bug"]
"""


def test_half_imported_package_failures_point_at_the_failure_that_left_it(session, pytester):
    for path, text in HALF_IMPORTED.items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(text)
    _result, data = session(IMPORT_CHAIN, "--tiers", "contract")
    checks = _checks(data, "contract")
    first = checks["test_import[m1]"]["failure"]
    assert (first["kind"], first["type"]) == ("import", "ImportError") and "consequence_of" not in first
    for later in ("test_import[m2]", "test_import[m3]"):
        f = checks[later]["failure"]
        assert f["type"] == "KeyError" and f["kind"] == "import"  # the earlier failure's kind, not 'harness'
        assert f["consequence_of"] == "test_tiers.py::test_import[m1]"
        assert f["message"] == (
            "consequence of test_tiers.py::test_import[m1] (import): it left package "
            "'halfpkg' half-imported, so importlib raised KeyError: 'halfpkg'"
        )
    # a KeyError of this project's own, unrelated to the half-imported package, stays harness
    own = checks["test_unrelated"]["failure"]
    assert own["kind"] == "harness" and "consequence_of" not in own
    assert checks["test_import[top]"]["outcome"] == "passed"  # the package imported again: no longer half-imported
    assert data["tiers"]["contract"]["failure_kinds"] == ["harness", "import"]


def test_the_session_records_its_selection_and_a_deselected_check_makes_the_tier_partial(session, monkeypatch):
    """tiers.json says what the session was asked (args, -k, MTPMATRIX_* knobs and nothing else of the environment,
    every check collected before -k took some away), and a tier whose checks were deselected is partial, naming
    them and the -k that left them out."""
    monkeypatch.setenv("MTPMATRIX_SMOKE_PAIR", "e-series")
    monkeypatch.setenv("NOT_A_KNOB_TOKEN", "secret")
    source = REFERENCE_ONLY.replace(
        "def test_greedy():\n    raise CheckFailure", "def test_greedy():\n    return\n    raise"
    )
    _result, data = session(source, "--tiers", "reference", "-k", "witness")
    sel = data["selection"]
    assert sel["keyword"] == "witness" and sel["args"][sel["args"].index("-k") + 1] == "witness"
    assert sel["knobs"]["MTPMATRIX_SMOKE_PAIR"] == "e-series" and "NOT_A_KNOB_TOKEN" not in json.dumps(sel)
    assert sel["collected"]["reference"] == ["test_tiers.py::test_greedy", "test_tiers.py::test_witness"]
    reference = data["tiers"]["reference"]
    assert reference["verdict"] == "partial"
    assert reference["missing"] == [{"what": "test_greedy", "why": "deselected (-k witness)"}]
    # without -k the same module is the whole tier
    _result, data = session(source, "--tiers", "reference")
    assert data["tiers"]["reference"]["verdict"] == "passed" and "missing" not in data["tiers"]["reference"]
