"""runner/installable.py and the canary around it: a canary whose newest release cannot install names the conflict
in one line, the first release that cannot install is found by resolution alone, and the newest that installs is
searched (uv's resolutions faked, nothing installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from canary_world import TRANSFORMERS, canary_row, resolution

from mtpmatrix.runner import bisect as bs
from mtpmatrix.runner import culprit
from mtpmatrix.runner.canary import Canary, Resolution

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")


@pytest.fixture
def row(tmp_path):
    return canary_row(tmp_path)


# --- a canary whose newest release cannot install (issue #39, class 9) -------------------------------------------

# uv 0.13.9's own words on 2026-12-04 (results/before-install-conflict/sglang-0.5.17-transformers/install.log)
UV_CONFLICT = (
    "error: No solution found when resolving dependencies\n"
    "  cause: Because transformers>=5.25.0 depends on kernels>=0.19.1,<0.20 and sglang==0.5.17 depends on "
    "kernels>=0.14.1,<0.15, we can conclude that sglang==0.5.17 and transformers>=5.25.0 are incompatible.\n"
    "         And because you require sglang==0.5.17 and transformers==5.25.0, we can conclude that your "
    "requirements are unsatisfiable.\n"
)
CONFLICT_LINE = "transformers 5.25.0 needs kernels>=0.19.1,<0.20; sglang 0.5.17 requires kernels>=0.14.1,<0.15"
QWEN = "'qwen3_asr' is already used by a Transformers config, pick another name."


def test_uv_conflict_is_one_line_naming_the_release_and_both_requirements():
    from mtpmatrix.core.failures import classify_install
    from mtpmatrix.runner import installable

    message = classify_install(UV_CONFLICT).message
    assert installable.is_conflict({"message": message})
    assert installable.conflict_line(message, {"transformers": "5.25.0"}) == CONFLICT_LINE
    # the moved package first whichever side uv names it on; a range it names for older releases stays uv's
    swapped = "Because sglang==0.5.17 depends on kernels<0.15 and transformers>=5.20 depends on kernels>=0.19.1, we"
    assert (
        installable.conflict_line(swapped, {"transformers": "5.25.0"})
        == "transformers>=5.20 needs kernels>=0.19.1; sglang 0.5.17 requires kernels<0.15"
    )
    other = "resolver conflict: error: x | Because only foo<2 is available, we can conclude that bar is unusable."
    assert installable.conflict_line(other, {}) == "Because only foo<2 is available"
    assert not installable.is_conflict({"message": "index unreachable: error: Failed to fetch"})


def fake_uv(first_uninstallable: dict[str, str], calls: list, unreachable: bool = False):
    """``uv pip compile`` over a fake index: a package cannot install from ``first_uninstallable[package]`` on
    (uv's conflict text); ``unreachable``: every resolution fails to fetch."""
    import subprocess

    from packaging.version import Version

    def run(cmd, input, **kw):
        overrides = Path(cmd[cmd.index("--override") + 1]).read_text().split()
        calls.append(tuple(overrides))
        assert f"-e {culprit.paths.REPO}" in input and "sglang==0.5.17" in input  # the row's install, resolved
        if unreachable:
            return subprocess.CompletedProcess(cmd, 2, "", "error: Failed to fetch: `https://pypi.org/simple/x/`\n")
        for o in overrides:
            pkg, ver = o.split("==")
            if pkg in first_uninstallable and Version(ver) >= Version(first_uninstallable[pkg]):
                return subprocess.CompletedProcess(cmd, 1, "", UV_CONFLICT.replace("5.25.0", ver))
        return subprocess.CompletedProcess(cmd, 0, "\n".join(overrides) + "\n", "")

    return run


def test_the_first_release_that_cannot_install_is_bisected_by_resolution_alone(row, tmp_path, monkeypatch):
    from mtpmatrix.runner import installable

    monkeypatch.setattr(installable, "find_uv", lambda error=None: "uv")

    releases = [*TRANSFORMERS, "5.25.0"]
    calls = []
    run = fake_uv({"transformers": "5.20.0"}, calls)

    def probe_for(pkg):
        return installable.resolution_probe(row, pkg, workdir=tmp_path / "res", run=run)

    def cands(pkg, good, bad):
        return releases[releases.index(good) : releases.index(bad) + 1]

    s = installable.search(
        {"transformers": ("5.12.1", "5.25.0")}, row.id, probe_for, cands, lambda: None, log=lambda m: None
    )
    b = s["bisect"]["transformers"]
    assert (b["first_bad"], b["last_good"], s["installable"]) == ("5.20.0", "5.19.0", {"transformers": "5.19.0"})
    assert s["single"]["transformers"]["detail"] == "cannot install: " + CONFLICT_LINE
    # 5.25.0 alone, then a bisect of 11 releases with 5.25.0 known bad: at most ceil(log2(11)) + 1 resolutions
    assert calls[0] == ("transformers==5.25.0",) and len(calls) <= 1 + 5
    assert ("transformers==5.25.0",) not in calls[1:]  # the known bad end is not asked again
    text = "\n".join(installable.lines(s))
    assert "CANNOT INSTALL: transformers 5.25.0 on sglang-0.5.17: " + CONFLICT_LINE in text
    assert "first release that cannot install: transformers 5.20.0 (newest that installs: 5.19.0;" in text
    # a spent --budget stops the search cleanly, names the interval and runs nothing instead
    spent = iter([None, None, "--budget 15 s spent"])
    stopped = installable.search(
        {"transformers": ("5.12.1", "5.25.0")}, row.id, probe_for, cands, lambda: next(spent), log=lambda m: None
    )
    assert stopped["installable"] is None and stopped["stopped"] == "--budget 15 s spent"
    text = "\n".join(installable.lines(stopped))
    assert "stopped (--budget 15 s spent): the first release that cannot install is one of 5.17.0 .. 5.25.0" in text
    assert "install search stopped: --budget 15 s spent" in text
    # two moved packages: the one that installs alone stays at its release, the other falls back
    calls.clear()
    moved = {"transformers": ("5.12.1", "5.25.0"), "torch": ("2.11.0", "2.15.0")}
    s2 = installable.search(moved, row.id, probe_for, cands, lambda: None, log=lambda m: None)
    assert (
        s2["installable"] == {"transformers": "5.19.0", "torch": "2.15.0"} and s2["single"]["torch"]["status"] == "good"
    )

    # each alone installs, together they do not: nothing to run instead, and it says so
    def installs_alone(pkg):
        return installable.resolution_probe(row, pkg, workdir=tmp_path / "res", run=fake_uv({}, []))

    s3 = installable.search(moved, row.id, installs_alone, cands, lambda: None, log=lambda m: None)
    assert s3["installable"] is None and s3["together"] == ["torch", "transformers"]
    assert "torch + transformers install each alone on sglang-0.5.17, not together" in "\n".join(installable.lines(s3))
    # an index that does not answer stops the search in one line: no release can be told apart
    with pytest.raises(bs.BisectError, match="resolution failed: index unreachable"):
        installable.search(
            {"transformers": ("5.12.1", "5.25.0")},
            row.id,
            lambda pkg: installable.resolution_probe(row, pkg, workdir=tmp_path, run=fake_uv({}, [], unreachable=True)),
            cands,
            lambda: None,
            known={"transformers": bs.Probe("5.25.0", bs.BAD)},
            log=lambda m: None,
        )


@pytest.fixture
def conflicting_index(monkeypatch, tmp_path):
    """The 2026-12-04 index: transformers 5.25.0 cannot install on sglang 0.5.17 (uv's conflict), every release
    from 5.13.0 breaks the import; run_row answers as the matrix would, resolutions as uv would."""
    from packaging.version import Version

    from mtpmatrix.core.failures import classify_install
    from mtpmatrix.core.store import RunStore
    from mtpmatrix.runner import installable

    installs, resolutions = [], []

    def run_row(row, venv, opts, log=print):
        installs.append((row.id, tuple(opts.overrides)))
        tf = next(o.split("==")[1] for o in opts.overrides if o.startswith("transformers=="))
        base = {**opts.record_extra, "overrides": list(opts.overrides)}
        if Version(tf) >= Version("5.25.0"):
            install = {"verdict": "failed", "seconds": 0.8, "failure": classify_install(UV_CONFLICT).as_dict()}
            record = {**base, "verdict": "failed", "install": install}
        else:
            fails = Version(tf) >= Version("5.13.0")
            check = {
                "id": "tests/tiers/test_contract.py::test_import[gemma4_mtp]",
                "outcome": "failed" if fails else "passed",
                "failure": {"kind": "import", "type": "ValueError", "message": QWEN} if fails else None,
            }
            record = {
                **base,
                "versions": {"transformers": tf},
                "verdict": "failed" if fails else "passed",
                "install": {"verdict": "passed", "seconds": 12.5},
                "suite": {"seconds": 60.0},
                "tiers": {"contract": {"verdict": "failed" if fails else "passed", "checks": [check]}},
            }
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    real_probe = installable.resolution_probe
    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    monkeypatch.setattr(
        installable,
        "resolution_probe",
        lambda *a, **k: real_probe(*a, **k, run=fake_uv({"transformers": "5.25.0"}, resolutions)),
    )
    monkeypatch.setattr(installable, "find_uv", lambda error=None: "uv")
    monkeypatch.setattr(culprit.bisect, "candidates", lambda p, g, b: [*TRANSFORMERS, "5.25.0"][:11])
    return installs, resolutions


def test_a_canary_that_cannot_install_names_why_and_searches_the_newest_release_that_does(
    row, tmp_path, conflicting_index
):
    """Before: "FAILED — install failed", nothing searched, and the session said "breaks (culprit above and in
    canary.json)" with no culprit above or in the file."""
    installs, resolutions = conflicting_index
    c = Canary("sglang-0.5.17-transformers", row.path, row, "canary-override", {"transformers": ">=5.12"})
    res = Resolution(c, {"transformers": "5.25.0"}, {"transformers": ("5.12.1", "5.25.0")})
    opts = culprit.matrix.Options(run_id="r1", results=tmp_path / "results", tiers="contract")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    text = "\n".join(state["summary"])
    assert installs[:2] == [
        ("sglang-0.5.17-transformers", ("transformers==5.25.0",)),  # the canary: cannot install
        ("sglang-0.5.17-transformers-at-transformers-5.24.0", ("transformers==5.24.0",)),  # the newest that does
    ]
    assert all(r != ("transformers==5.25.0",) for r in resolutions)  # the canary's own install said so already
    assert "CANNOT INSTALL: transformers 5.25.0 on sglang-0.5.17: " + CONFLICT_LINE in text
    assert "first release that cannot install: transformers 5.25.0 (newest that installs: 5.24.0;" in text
    assert "sglang-0.5.17-transformers-at-transformers-5.24.0: FAILED — contract=failed" in text
    assert f"CULPRIT: transformers 5.13.0 breaks sglang-0.5.17 contract (last good: 5.12.1): [import] {QWEN}" in text
    on_disk = json.loads((tmp_path / "results" / "r1" / "sglang-0.5.17-transformers" / "canary.json").read_text())
    assert on_disk["install"]["bisect"]["transformers"]["first_bad"] == "5.25.0"
    assert on_disk["install"]["run"]["versions"] == {"transformers": "5.24.0"}
    assert on_disk["row"]["verdict"] == "failed"  # the canary itself still fails: its newest cannot install
    line = culprit.outcome_line(state, "canary.json")
    assert line.startswith("transformers 5.25.0 cannot install (" + CONFLICT_LINE + ")")
    assert "first that cannot: transformers 5.25.0, newest that installs: 5.24.0" in line
    assert "culprit: transformers 5.13.0 breaks sglang-0.5.17 contract" in line
    # the fallback run is planned in the run's manifest, and the report shows it as part of its canary
    from mtpmatrix.report import canaries as rc

    manifest = json.loads((tmp_path / "results" / "r1" / "manifest.json").read_text())
    assert "sglang-0.5.17-transformers-at-transformers-5.24.0" in manifest["rows"]
    from mtpmatrix.core.store import read_run

    run = tmp_path / "results" / "r1"
    sec = rc.section(run, read_run(run))  # the records as they stand (the report hands it its judged ones)
    assert [x["id"] for x in sec["canaries"]] == ["sglang-0.5.17-transformers"]
    assert sec["canaries"][0]["verdict"] == f"failed, cannot install transformers 5.25.0 ({CONFLICT_LINE})"
    # --resume: nothing installed or resolved again
    installs.clear(), resolutions.clear()
    opts.resume = True
    again = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    assert installs == [] and resolutions == [] and again["install"] == state["install"]


def test_an_install_that_fails_for_another_reason_claims_no_culprit(row, tmp_path, monkeypatch):
    from mtpmatrix.core.store import RunStore

    def run_row(row, venv, opts, log=print):
        failure = {"kind": "install", "message": "index unreachable: error: Failed to fetch: `https://x/simple`"}
        record = {**opts.record_extra, "verdict": "failed", "install": {"verdict": "failed", "failure": failure}}
        RunStore(opts.results, opts.run_id).save_row(row.id, record)
        return record

    monkeypatch.setattr(culprit.matrix, "run_row", run_row)
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda row, venv: venv)
    res = resolution(row, {"transformers": "5.25.0"})
    opts = culprit.matrix.Options(run_id="r1", results=tmp_path / "results", tiers="contract")
    state = culprit.run_canary(res, opts, repo=tmp_path, log=lambda m: None)
    assert state.get("install") is None and "CULPRIT" not in "\n".join(state["summary"])
    assert state["summary"][1] == (
        "c: FAILED — install failed: index unreachable: error: Failed to fetch: `https://x/simple`"
    )
    line = culprit.outcome_line(state, "canary.json")
    assert line == (
        "failed (install failed: index unreachable: error: Failed to fetch: `https://x/simple`): no culprit "
        "searched — details above and in canary.json"
    )


def test_the_session_line_says_when_the_newest_release_that_installs_passes():
    state = {
        "row": {"verdict": "failed", "tiers": "install failed: resolver conflict: ..."},
        "install": {
            "single": {
                "transformers": {"version": "5.25.0", "status": "bad", "detail": "cannot install: " + CONFLICT_LINE}
            },
            "bisect": {"transformers": {"outcome": "found", "first_bad": "5.25.0", "last_good": "5.24.0"}},
            "run": {"id": "c-at-transformers-5.24.0", "verdict": "passed"},
        },
        "broken_tiers": [],
        "summary": [],
    }
    assert culprit.outcome_line(state, "canary.json") == (
        f"transformers 5.25.0 cannot install ({CONFLICT_LINE}); first that cannot: transformers 5.25.0, newest that "
        "installs: 5.24.0; c-at-transformers-5.24.0 passed: nothing breaks at the newest releases that install — "
        "details above and in canary.json"
    )
