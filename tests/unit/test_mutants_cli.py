"""The mutants command (faults/mutants.py, python -m mtpmatrix mutants): --list / --check, and the runner end to
end with a stand-in for the pytest command whose "server" imports the (patched) toy module.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mutant_trees import (
    FAKE,
    OFF_CHAIN,
    RELEASE_FORMS,
    REPO,
    TOY_CAT,
    make_stub_env,
    parse,
    run_stub,
    write_tree,
)

from mtpmatrix.__main__ import main
from mtpmatrix.faults import catalogue as C
from mtpmatrix.faults import mutants as M
from mtpmatrix.faults import mutation as F
from mtpmatrix.faults.catalogue import servers as CS


@pytest.fixture
def stub_env(tmp_path, monkeypatch):
    return make_stub_env(tmp_path, monkeypatch)


def test_unknown_mutant_id_is_one_line_and_exit_2(capsys):
    assert main(["mutants", "--mutants", "nope", "--list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: unknown mutant(s) nope")


def _sglang_017() -> Path | None:
    candidates = [os.environ.get("MTPMATRIX_SGLANG_DIR")]
    found = F.find_sglang()
    candidates.append(str(found) if found else None)
    candidates += [str(p) for p in sorted(REPO.glob(".nox/*sglang-0?5?17*/lib/python3*/site-packages/sglang"))]
    for c in candidates:
        if c and Path(c).is_dir() and F.sglang_version(Path(c)) == "0.5.17":
            return Path(c)
    return None


def test_check_against_the_installed_sglang_0_5_17(capsys):
    pkg = _sglang_017()
    if pkg is None:
        pytest.skip("no sglang 0.5.17 here (set MTPMATRIX_SGLANG_DIR to its package folder, or build the row venv)")
    assert main(["mutants", "--check", "--sglang-dir", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("sglang 0.5.17 at ")
    na = sum("0.5.17" in m.na_on for m in C.CATALOGUE)  # n.a. by design (Mutant.na_on)
    assert f"{len(C.CATALOGUE) - na} applicable, {na} n.a.; every patched module compiles" in out
    for m in C.CATALOGUE:  # 0.5.17 runs Frozen-KV MTP on the spec-v2 worker: no site may land in the v1 worker
        assert "frozen_kv_mtp_worker.py" not in " ".join(F.apply(m, pkg).files)


def test_list_and_check_on_a_fake_release(tmp_path, capsys):
    pkg = write_tree(tmp_path, {**FAKE, "sglang/_version.py": "__version__ = version = '9.9.9'\n"}) / "sglang"
    cat = (
        F.Mutant("ok", "handoff", "m", (F.Site("sglang.srt.speculative.worker_v2", "h[n - 1]", "h[0]"),)),
        F.Mutant("gone", "positions", "m", (F.Site("sglang.srt.speculative.worker_v1", "h", "g"),)),
        F.Mutant("bad", "accounting", "m", (F.Site("sglang.srt.speculative.worker_v2", "h[n - 1]", "h[0"),)),
    )
    ns = parse(["--list"])
    assert M.run(ns, M.StandIns(catalogue=cat, pkg_dir=pkg)) == 0  # --list does not compile
    ns = parse(["--check"])
    assert M.run(ns, M.StandIns(catalogue=cat, pkg_dir=pkg)) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-5].startswith("sglang 9.9.9 at ")
    assert [ln.split()[2] for ln in out[-4:-1]] == ["applicable", "n.a.", "BROKEN"]
    assert "no such file" in out[-3]
    assert out[-1] == "2 applicable, 1 n.a.; 1 patched module(s) do not compile"


def test_runner_kills_a_behaviour_change_and_exits_0(tmp_path, stub_env):
    rc, record, text = run_stub(tmp_path, stub_env, ["--mutants", "value-two,elsewhere"])
    assert rc == 0 and record["verdict"] == "all-killed" and record["exit"] == 0
    assert record["baseline"]["status"] == "passed"
    by_id = {m["id"]: m for m in record["mutants"]}
    assert by_id["elsewhere"]["status"] == "n.a." and "no such file" in by_id["elsewhere"]["reason"]
    killed = by_id["value-two"]
    assert killed["status"] == "killed" and killed["killed_by"] == "test_spec_metrics[w] (acceptance)"
    assert killed["checks"][0]["message"] == "accept length off (VALUE=2)"
    assert killed["files"] == ["toypkg/mod.py"] and killed["sites"][0]["anchor"] == "VALUE = 1\n"
    assert (tmp_path / "out" / "value-two" / "patch.diff").read_text().count("+VALUE = 2") == 1
    assert "[mutants] start baseline" in text and "[mutants] done  value-two: killed by test_spec_metrics[w]" in text
    assert "ALL-KILLED: 1 killed, 1 n.a." in text
    # the run's wall time against its budget, and what its suites cost one by one (issue #41)
    seconds = record["baseline"]["seconds"] + killed["seconds"]
    assert f"wall {record['seconds']:.0f} s (no budget); suites' own seconds {seconds:.0f}, up to " in text


def test_runner_reports_a_survivor_and_exits_1(tmp_path, stub_env):
    rc, record, text = run_stub(tmp_path, stub_env, [])
    assert rc == 1 and record["verdict"] == "survivors"
    status = {m["id"]: m["status"] for m in record["mutants"]}
    assert status == {"value-two": "killed", "comment-only": "survived", "elsewhere": "n.a."}
    table = text.split("\n\n")[1].splitlines()
    assert [ln.split()[0] for ln in table[2:]] == ["baseline", "value-two", "comment-only", "elsewhere"]


def test_failing_baseline_invalidates_the_result(tmp_path, stub_env, monkeypatch):
    monkeypatch.setenv("STUB_FAIL", "baseline")
    rc, record, text = run_stub(tmp_path, stub_env, ["--mutants", "value-two"])
    assert rc == 1 and record["verdict"] == "invalid" and record["baseline"]["status"] == "failed"
    assert "RESULT INVALID: the unpatched baseline did not pass (failed; test_spec_metrics[w] (acceptance))" in text


def test_unknown_server_is_one_line_before_anything_runs(tmp_path, stub_env, capsys):
    pkg, command = stub_env
    rc = M.run(
        parse(["--servers", "nope", "--out", str(tmp_path / "out")]),
        M.StandIns(catalogue=TOY_CAT, pkg_dir=pkg, command=command, known_servers=["w"], gpu_check=False),
    )
    assert rc == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smoke server(s) nope not in this checkout's smoke tier" in err[0]


def test_nothing_applicable_runs_nothing(tmp_path, stub_env):
    pkg, command = stub_env
    lines: list[str] = []
    rc = M.run(
        parse(["--mutants", "elsewhere", "--out", str(tmp_path / "out")]),
        M.StandIns(
            catalogue=TOY_CAT, pkg_dir=pkg, command=command, known_servers=["w"], gpu_check=False, log=lines.append
        ),
    )
    assert rc == 1 and not (tmp_path / "out").exists()
    assert lines[-1].startswith("NOTHING-APPLICABLE")


def test_a_spent_budget_starts_nothing_and_is_no_verdict(tmp_path, stub_env):
    rc, record, text = run_stub(tmp_path, stub_env, ["--budget", "5"])  # < MIN_SUITE_SECONDS left
    assert rc == 1 and record["verdict"] == "invalid" and record["baseline"]["status"] == "not-run"
    assert {m["status"] for m in record["mutants"]} == {"not-run", "n.a."}
    assert "budget left: 3 suite(s) not run" in text
    assert (
        f"wall {record['seconds']:.0f} s of the 5 s budget ({record['seconds'] / 5:.2f}); suites' own seconds 0" in text
    )


def test_a_mutant_on_servers_this_checkout_lacks_stops_in_one_line(tmp_path, capsys):
    pkg = write_tree(tmp_path, RELEASE_FORMS["0.5.17"]) / "sglang"
    ns = parse(["--mutants", "verify-accept-all-greedy", "--out", str(tmp_path / "out")])
    rc = M.run(ns, M.StandIns(pkg_dir=pkg, known_servers=list(CS.WITNESS_SERVERS), gpu_check=False))
    assert rc == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smoke server(s) decoy-mtp-topk1 not in this checkout's smoke tier" in err[0]


def _row_sglang(version: str) -> Path | None:
    """sglang ``version``'s package in a row venv: $MTPMATRIX_SGLANG_DIRS (os.pathsep-separated package folders),
    else this checkout's .nox."""
    dirs = [d for d in os.environ.get("MTPMATRIX_SGLANG_DIRS", "").split(os.pathsep) if d]
    dirs += [str(p) for p in sorted(REPO.glob(".nox/*sglang-0?5?*/lib/python3*/site-packages/sglang"))]
    return next((Path(d) for d in dirs if Path(d).is_dir() and F.sglang_version(Path(d)) == version), None)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.17", "0.5.23"])
def test_check_lists_every_mutant_applicable_on_each_row_release(version, capsys):
    pkg = _row_sglang(version)
    if pkg is None:
        pytest.skip(f"no sglang {version} here (MTPMATRIX_SGLANG_DIRS, or the row venv under .nox)")
    assert main(["mutants", "--check", "--sglang-dir", str(pkg)]) == 0
    out = capsys.readouterr().out
    na = sum(version in m.na_on for m in C.CATALOGUE)  # n.a. by design (Mutant.na_on)
    assert f"{len(C.CATALOGUE) - na} applicable, {na} n.a.; every patched module compiles" in out
    for mutant_id in OFF_CHAIN:
        assert any(
            ln.split()[:3] == [mutant_id, C.catalogue_by_id()[mutant_id].category, "applicable"]
            for ln in out.splitlines()
        ), mutant_id
