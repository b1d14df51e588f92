"""Fault injection (mtpmatrix.faults and mutant_hook/sitecustomize.py), without sglang or a GPU.

The hook is exercised for real: subprocesses (and a multiprocessing *spawn* child, the way sglang starts its
scheduler) import a toy package through it. The catalogue logic runs on small fake source trees, the verdicts on
tiers.json records as the pytest plugin writes them, and the runner end to end with a stand-in for the pytest
command whose "server" imports the (patched) toy module.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtpmatrix.__main__ import main
from mtpmatrix.faults import catalogue as C
from mtpmatrix.faults import mutants as M
from mtpmatrix.faults import suites as S

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------- toy trees
def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


TOY = {
    "toypkg/__init__.py": "",
    "toypkg/mod.py": """\
        VALUE = 1


        def where():
            raise RuntimeError("boom at VALUE=%d" % VALUE)
        """,
}
TOY_MUTANT = C.Mutant("value-two", "accounting", "VALUE 1 -> 2", (C.Site("toypkg.mod", "VALUE = 1\n", "VALUE = 2\n"),))


def payload_for(tmp_path: Path, mutant=TOY_MUTANT, pkg="toypkg") -> tuple[Path, Path]:
    site = write_tree(tmp_path / "site", TOY)
    app = C.apply(mutant, site / pkg)
    assert app.applicable and not app.error, app.reason()
    payload = tmp_path / "mutant.json"
    payload.write_text(json.dumps(C.hook_payload(app)))
    return site, payload


def py(code: str, env: dict, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def hook_env(*paths: Path, payload: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", C.ENV_MUTANT)}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (C.HOOK_DIR, *paths))
    if payload is not None:
        env[C.ENV_MUTANT] = str(payload)
    return env


SPAWN = """\
    import multiprocessing as mp
    import toypkg.mod as m

    def child(q):
        import toypkg.mod as m2
        q.put(m2.VALUE)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(m.VALUE, q.get(timeout=60))
        p.join(60)
"""


# --------------------------------------------------------------------------------------------- the hook
def test_hook_serves_the_patched_module_to_a_process_and_its_spawn_child(tmp_path):
    site, payload = payload_for(tmp_path)
    script = tmp_path / "spawn_check.py"
    script.write_text(textwrap.dedent(SPAWN))
    proc = subprocess.run([sys.executable, str(script)], env=hook_env(site, payload=payload), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{C.MARK} value-two serves patched toypkg.mod")]
    assert len(lines) == 2 and len({ln.rsplit("pid", 1)[1] for ln in lines}) == 2  # parent and child, each once
    assert (site / "toypkg" / "mod.py").read_text().startswith("VALUE = 1\n")  # the installed file is untouched


def test_hook_without_a_mutant_changes_nothing(tmp_path):
    site, _ = payload_for(tmp_path)
    script = tmp_path / "spawn_check.py"
    script.write_text(textwrap.dedent(SPAWN))
    proc = subprocess.run([sys.executable, str(script)], env=hook_env(site), cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"] and C.MARK not in proc.stderr


def test_tracebacks_and_inspect_show_the_patched_text(tmp_path):
    site, payload = payload_for(tmp_path)
    proc = py("""\
        import inspect, traceback, toypkg.mod as m
        print(inspect.getsource(m).splitlines()[0])
        try:
            m.where()
        except RuntimeError:
            print(traceback.format_exc().strip().splitlines()[-1])
        print(m.__file__)
        """, hook_env(site, payload=payload), tmp_path)
    assert proc.returncode == 0, proc.stderr
    first, error, file = proc.stdout.splitlines()
    assert first == "VALUE = 2" and error == "RuntimeError: boom at VALUE=2"
    assert Path(file) == site / "toypkg" / "mod.py"  # the module keeps its own file name


def test_hook_refuses_a_file_changed_since_the_mutant_was_made(tmp_path):
    site, payload = payload_for(tmp_path)
    (site / "toypkg" / "mod.py").write_text("VALUE = 7\n")
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(site, payload=payload), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "7"
    assert "value-two NOT applied to toypkg.mod" in proc.stderr and "changed since" in proc.stderr


def test_hook_refuses_a_module_imported_from_elsewhere(tmp_path):
    _site, payload = payload_for(tmp_path)
    other = write_tree(tmp_path / "other", TOY)  # another copy comes first on sys.path
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(other, payload=payload), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "1"
    assert "NOT applied to toypkg.mod: this interpreter imports it from" in proc.stderr


def test_hook_chains_to_the_sitecustomize_it_shadows(tmp_path):
    site, payload = payload_for(tmp_path)
    other = write_tree(tmp_path / "vendor", {"sitecustomize.py": "import os\nos.environ['CHAINED'] = 'yes'\n"})
    proc = py("import os, toypkg.mod as m; print(os.environ.get('CHAINED'), m.VALUE)",
              hook_env(other, site, payload=payload), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "2"]


def test_unreadable_payload_is_reported_and_startup_goes_on(tmp_path):
    site, _ = payload_for(tmp_path)
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(site, payload=tmp_path / "missing.json"), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "1"
    assert f"{C.MARK} NOT applied: cannot read {C.ENV_MUTANT}=" in proc.stderr


# --------------------------------------------------------------------------------------------- applying
FAKE = {
    "sglang/srt/speculative/worker_v2.py": """\
        def seed(h, n):
            return h[n - 1]
        """,
    "sglang/srt/speculative/twice.py": "x = 1\nx = 1\n",
}


def test_sites_apply_where_the_anchor_is_unique_and_are_na_elsewhere(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    m = C.Mutant("seed-first", "handoff", "first instead of last", (
        C.Site("sglang.srt.speculative.worker_v2", "return h[n - 1]", "return h[0]"),  # this release
        C.Site("sglang.srt.speculative.worker_v1", "return h[n - 1]", "return h[0]"),  # an older one: absent
    ))
    app = C.apply(m, pkg)
    assert app.applicable and app.error is None
    assert [s.status for s in app.sites] == ["applied", "no such file"]
    assert app.files == ["sglang/srt/speculative/worker_v2.py"]
    assert "return h[0]" in C.hook_payload(app)["modules"]["sglang.srt.speculative.worker_v2"]["source"]
    assert "-    return h[n - 1]\n+    return h[0]" in C.diff(app)


@pytest.mark.parametrize("site,status", [
    (C.Site("sglang.srt.speculative.worker_v2", "return h[n]", "return h[0]"), "anchor absent"),
    (C.Site("sglang.srt.speculative.twice", "x = 1\n", "x = 2\n"), "anchor found 2 times"),
    (C.Site("sglang.srt.speculative.gone", "x", "y"), "no such file"),
])
def test_absent_or_ambiguous_anchor_is_not_applicable(tmp_path, site, status):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    app = C.apply(C.Mutant("m", "handoff", "m", (site,)), pkg)
    assert not app.applicable and app.modules == {}
    assert status in app.reason()


def test_a_replacement_that_does_not_compile_is_an_error(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    app = C.apply(C.Mutant("m", "handoff", "m", (C.Site("sglang.srt.speculative.worker_v2", "return h[n - 1]",
                                                           "return h[0"),)), pkg)
    assert app.applicable and "does not compile" in app.error and "worker_v2.py:2" in app.error


def test_overlapping_sites_are_an_error(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    mod = "sglang.srt.speculative.worker_v2"
    app = C.apply(C.Mutant("m", "handoff", "m", (C.Site(mod, "return h[n - 1]", "return h[n - 2]"),
                                                 C.Site(mod, "h[n - 1]", "h[0]"))), pkg)
    assert "overlap" in app.error


def test_select_and_unknown_ids():
    assert [m.id for m in C.select("topk-parent-hidden, handoff-block-first")] == ["handoff-block-first",
                                                                                  "topk-parent-hidden"]
    assert len(C.select(None)) == len(C.CATALOGUE)
    with pytest.raises(C.MutantsError, match="unknown mutant.s. nope; known: handoff-block-first"):
        C.select("handoff-block-first,nope")


def test_unknown_mutant_id_is_one_line_and_exit_2(capsys):
    assert main(["mutants", "--mutants", "nope", "--list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: unknown mutant(s) nope")


def test_catalogue_covers_every_required_category_with_distinct_real_edits():
    ids = [m.id for m in C.CATALOGUE]
    assert len(ids) == len(set(ids)) >= 8
    assert {m.category for m in C.CATALOGUE} == set(C.CATEGORIES)
    for m in C.CATALOGUE:
        assert m.sites and m.models and m.expect and m.servers, m.id
        assert all(s.module.startswith("sglang.") and s.anchor != s.replacement for s in m.sites), m.id


def _sglang_017() -> Path | None:
    candidates = [os.environ.get("MTPMATRIX_SGLANG_DIR")]
    found = C.find_sglang()
    candidates.append(str(found) if found else None)
    candidates += [str(p) for p in sorted(REPO.glob(".nox/*sglang-0?5?17*/lib/python3*/site-packages/sglang"))]
    for c in candidates:
        if c and Path(c).is_dir() and C.sglang_version(Path(c)) == "0.5.17":
            return Path(c)
    return None


def test_check_against_the_installed_sglang_0_5_17(capsys):
    pkg = _sglang_017()
    if pkg is None:
        pytest.skip("no sglang 0.5.17 here (set MTPMATRIX_SGLANG_DIR to its package folder, or build the row venv)")
    assert main(["mutants", "--check", "--sglang-dir", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("sglang 0.5.17 at ")
    assert f"{len(C.CATALOGUE)} applicable, 0 n.a.; every patched module compiles" in out
    for m in C.CATALOGUE:  # 0.5.17 runs Frozen-KV MTP on the spec-v2 worker: no site may land in the v1 worker
        assert "frozen_kv_mtp_worker.py" not in " ".join(C.apply(m, pkg).files)


def test_list_and_check_on_a_fake_release(tmp_path, capsys):
    pkg = write_tree(tmp_path, {**FAKE, "sglang/_version.py": "__version__ = version = '9.9.9'\n"}) / "sglang"
    cat = (C.Mutant("ok", "handoff", "m", (C.Site("sglang.srt.speculative.worker_v2", "h[n - 1]", "h[0]"),)),
           C.Mutant("gone", "positions", "m", (C.Site("sglang.srt.speculative.worker_v1", "h", "g"),)),
           C.Mutant("bad", "accounting", "m", (C.Site("sglang.srt.speculative.worker_v2", "h[n - 1]", "h[0"),)))
    ns = parse(["--list"])
    assert M.run(ns, catalogue=cat, pkg_dir=pkg) == 0  # --list does not compile
    ns = parse(["--check"])
    assert M.run(ns, catalogue=cat, pkg_dir=pkg) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-5].startswith("sglang 9.9.9 at ")
    assert [ln.split()[2] for ln in out[-4:-1]] == ["applicable", "n.a.", "BROKEN"]
    assert "no such file" in out[-3]
    assert out[-1] == "2 applicable, 1 n.a.; 1 patched module(s) do not compile"


# --------------------------------------------------------------------------------------------- verdicts
def check(name: str, outcome: str, kind: str | None = None, message: str = "") -> dict:
    rec = {"id": f"tests/tiers/test_smoke.py::{name}", "tier": "smoke", "outcome": outcome, "seconds": 1.0,
           "metrics": {}}
    if kind:
        rec["failure"] = {"kind": kind, "type": "CheckFailure", "message": message, "frame": None, "raised_at": None}
    return rec


def tiers(*checks, verdict=None, reason=None) -> dict:
    smoke = {"verdict": verdict or ("failed" if any(c["outcome"] == "failed" for c in checks) else "passed"),
             "checks": list(checks)}
    if reason:
        smoke["reason"] = reason
    return {"tiers": {"smoke": smoke}, "exitstatus": 0}


def test_judge_suite():
    got = S.judge_suite(tiers(check("test_server_serves[w1]", "passed"),
                              check("test_spec_metrics[w1]", "failed", "acceptance",
                                    "accept length 1.03 outside [5.0, 6]\nmore detail")))
    assert got.status == "failed" and got.passed == 1
    assert got.failed == [{"id": "tests/tiers/test_smoke.py::test_spec_metrics[w1]", "outcome": "failed",
                           "kind": "acceptance", "message": "accept length 1.03 outside [5.0, 6]"}]
    assert S.judge_suite(tiers(check("a", "passed"), check("b", "passed"))).status == "passed"
    skipped = S.judge_suite(tiers(check("a", "skipped"), verdict="skipped", reason="smoke tier: no GPU"))
    assert skipped.status == "error" and "no GPU" in skipped.reason
    assert S.judge_suite(tiers(check("a", "failed", "harness", "KeyError"))).status == "error"
    assert S.judge_suite(None, 2).reason.startswith("pytest exited 2 without tiers.json")
    assert S.judge_suite(tiers(check("a", "passed")), timed_out=True).status == "timeout"
    stopped = tiers(check("a", "passed"), verdict="error", reason="pytest stopped early (exit 2)")
    assert S.judge_suite(stopped).status == "error"


def test_hook_evidence_from_server_logs(tmp_path):
    (tmp_path / "server-w1.log").write_text(f"# pid 1 (process group 1)\n{C.MARK} m1 serves patched x.y (pid 3)\n")
    assert S.hook_evidence(tmp_path, "m1") == (True, None)
    assert S.hook_evidence(tmp_path, "m2") == (False, None)
    (tmp_path / "server-w3.log").write_text(f"{C.MARK} m1 NOT applied to x.y: changed (pid 4)\n")
    assert S.hook_evidence(tmp_path, "m1")[1].startswith(f"{C.MARK} m1 NOT applied")


@pytest.mark.parametrize("outcome,served,refused,status", [
    (S.SuiteOutcome("failed", [{"id": "a", "kind": "acceptance"}]), True, None, "killed"),
    (S.SuiteOutcome("passed", [], 4), True, None, "survived"),
    (S.SuiteOutcome("failed", [{"id": "a", "kind": "launch"}]), False, None, "error"),  # killed by something else
    (S.SuiteOutcome("passed", [], 4), True, "NOT applied", "error"),
    (S.SuiteOutcome("timeout", reason="t"), True, None, "error"),
    (S.SuiteOutcome("error", reason="no smoke check ran"), True, None, "error"),
])
def test_mutant_status(outcome, served, refused, status):
    assert S.mutant_status(outcome, served, refused)[0] == status


def test_overall_verdict():
    killed, survived, na = ({"status": "killed"}, {"status": "survived"}, {"status": "n.a."})
    assert S.overall({"status": "passed"}, [killed, na]) == ("all-killed", 0)
    assert S.overall({"status": "passed"}, [killed, survived]) == ("survivors", 1)
    assert S.overall({"status": "failed"}, [killed]) == ("invalid", 1)
    assert S.overall({"status": "passed"}, [killed, {"status": "error"}]) == ("incomplete", 1)
    assert S.overall({"status": "passed"}, [na]) == ("nothing-applicable", 1)


def test_render_table():
    rows = [{"id": "baseline", "models": "unpatched sglang 0.5.17", "status": "passed", "seconds": 120.4},
            {"id": "topk-parent-hidden", "models": "x" * 80, "status": "killed", "seconds": 95.0,
             "killed_by": "test_spec_metrics[witness-mtp-topk3] (acceptance)"},
            {"id": "accept-count-server", "models": "m", "status": "n.a.", "seconds": None}]
    lines = S.render_table(rows, models_width=20).splitlines()
    assert lines[0].split() == ["mutant", "what", "it", "models", "status", "killed", "by", "s"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[3].startswith("topk-parent-hidden   " + "x" * 17 + "...  killed  test_spec_metrics[")
    assert lines[3].endswith(" 95") and lines[2].endswith("120") and lines[4].endswith(" -")
    status_col = lines[0].index("status")
    assert [ln[status_col:].split()[0] for ln in lines[2:]] == ["passed", "killed", "n.a."]


def test_killed_by_names_checks_with_their_kind():
    checks = [{"id": f"t.py::c{i}", "kind": "acceptance"} for i in range(4)]
    assert S.killed_by(checks) == "c0 (acceptance), c1 (acceptance), +2 more"


def test_server_cap():
    assert S.server_cap(16, None) == 5  # one per CORES_PER_SERVER cores
    assert S.server_cap(16, 24 * 1024) == 2  # a 24 GiB card: the smoke tier's memory rule wins
    assert S.server_cap(2, None) == 1 and S.server_cap(None, None) == 1
    assert S.server_cap(16, None, requested=2) == 2


def test_suite_env_puts_the_hook_first_and_names_the_suite(tmp_path):
    base = {"PYTHONPATH": "/tmp/site:src", C.ENV_MUTANT: "stale", "MTPMATRIX_SMOKE_SWAP_DRAFTERS": "1"}
    env = S.suite_env(base, ("a", "b"), tmp_path / "m", tmp_path / "tiny", tmp_path / "m" / "mutant.json",
                      tmp_path / "cache")
    assert env["PYTHONPATH"] == f"{C.HOOK_DIR}{os.pathsep}/tmp/site:src"
    assert env[C.ENV_MUTANT] == str(tmp_path / "m" / "mutant.json")
    assert env["MTPMATRIX_SMOKE_SERVERS"] == "a,b" and env["MTPMATRIX_SMOKE_PARALLEL"] == "2"
    assert env["MTPMATRIX_RESULTS"] == str(tmp_path / "m" / "tiers.json")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert "MTPMATRIX_SMOKE_SWAP_DRAFTERS" not in env
    baseline = S.suite_env(base, ("a",), tmp_path / "b", tmp_path / "tiny", None, None)
    assert C.ENV_MUTANT not in baseline and "TRITON_CACHE_DIR" not in baseline


def test_pytest_command_is_the_smoke_suite_with_its_own_results(tmp_path):
    s = S.Suite("m", ("a",), tmp_path, {})
    assert S.pytest_command(s, "py") == ["py", "-m", "pytest", "tests/tiers/test_smoke.py", "-p", "no:cacheprovider",
                                         "--tiers", "smoke", "--mtp-results", str(tmp_path / "tiers.json")]


def test_split_row_arg():
    assert M.split_row_arg(["--row", "sglang-0.5.17", "--check"]) == ("sglang-0.5.17", ["--check"])
    assert M.split_row_arg(["--row=x", "--mutants", "a"]) == ("x", ["--mutants", "a"])
    assert M.split_row_arg([]) == (None, [])
    with pytest.raises(C.MutantsError):
        M.split_row_arg(["--row"])


# --------------------------------------------------------------------------------------------- the runner
# A stand-in for one smoke suite: a "server" process imports the toy module through the hook (its stderr is the
# server log, as for sglang), and a check fails when the module is not the unpatched one.
STUB = """\
import json, os, subprocess, sys, time
folder, name = sys.argv[1], sys.argv[2]
t0 = time.monotonic()  # one clock for every process of this machine: the spans compare across them
with open(os.path.join(folder, "server-w.log"), "w") as log:
    log.write("# mtpmatrix: ready after 0.1s\\n")
    log.flush()
    out = subprocess.run([sys.executable, "-c", "import toypkg.mod as m; print(m.VALUE)"], stdout=subprocess.PIPE,
                         stderr=log, text=True).stdout.strip()
time.sleep(float(os.environ.get("STUB_SLEEP", "0.3")))
with open(os.path.join(folder, "..", "spans.txt"), "a") as fh:
    fh.write(f"{name} {t0} {time.monotonic()}\\n")
fail = name == os.environ.get("STUB_FAIL") or out != "1"
rec = {"id": "tests/tiers/test_smoke.py::test_spec_metrics[w]", "tier": "smoke",
       "outcome": "failed" if fail else "passed", "seconds": 0.1, "metrics": {}}
if fail:
    rec["failure"] = {"kind": "acceptance", "message": f"accept length off (VALUE={out})"}
json.dump({"tiers": {"smoke": {"verdict": "failed" if fail else "passed", "checks": [rec]}}},
          open(os.path.join(folder, "tiers.json"), "w"))
"""

TOY_CAT = (
    C.Mutant("value-two", "accounting", "VALUE 1 -> 2", (C.Site("toypkg.mod", "VALUE = 1\n", "VALUE = 2\n"),),
             servers=("w",)),
    C.Mutant("comment-only", "positions", "a comment: changes nothing observable",
             (C.Site("toypkg.mod", "def where():\n", "def where():  # mutated\n"),), servers=("w",)),
    C.Mutant("elsewhere", "handoff", "absent here", (C.Site("toypkg.v1", "x", "y"),), servers=("w",)),
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    M.add_arguments(p)
    return p.parse_args(argv)


@pytest.fixture
def stub_env(tmp_path, monkeypatch):
    site = write_tree(tmp_path / "site", TOY)
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv(C.ENV_MUTANT, raising=False)
    command = lambda suite: [sys.executable, str(stub), str(suite.folder), suite.name]  # noqa: E731
    return site / "toypkg", command


def run_stub(tmp_path, stub_env, argv, **kw):
    pkg, command = stub_env
    lines: list[str] = []
    rc = M.run(parse(["--out", str(tmp_path / "out"), *argv]), catalogue=TOY_CAT, pkg_dir=pkg, command=command,
               known_servers=["w"], gpu_check=False, cpus=6, poll=0.05, log=lines.append, **kw)
    record = json.loads((tmp_path / "out" / "mutants.json").read_text())
    return rc, record, "\n".join(lines)


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
    rc = M.run(parse(["--servers", "nope", "--out", str(tmp_path / "out")]), catalogue=TOY_CAT, pkg_dir=pkg,
               command=command, known_servers=["w"], gpu_check=False)
    assert rc == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smoke server(s) nope not in this checkout's smoke tier" in err[0]


def test_scheduler_respects_the_server_cap_and_the_warmup(tmp_path, stub_env, monkeypatch):
    _pkg, command = stub_env
    monkeypatch.setenv("STUB_SLEEP", "0.6")
    out = tmp_path / "out"
    suites = [S.Suite("baseline", ("a", "b"), out / "baseline", dict(os.environ))]
    suites += [S.Suite(f"m{i}", ("a",), out / f"m{i}", dict(os.environ)) for i in range(4)]
    done: list[str] = []
    S.Scheduler(suites, cap=2, timeout=60, command=command, log=lambda _: None, poll=0.02,
                on_done=lambda s: done.append(s.name)).run()
    assert sorted(done) == ["baseline", "m0", "m1", "m2", "m3"]
    spans = {}
    for line in (out / "spans.txt").read_text().splitlines():
        name, a, b = line.split()
        spans[name] = (float(a), float(b))
    servers = {s.name: s.n for s in suites}
    for name, (a, _b) in spans.items():  # at any start, the servers of overlapping suites fit under the cap
        overlapping = [n for n, (x, y) in spans.items() if x <= a < y]
        assert sum(servers[n] for n in overlapping) <= 2, (name, overlapping)
    assert all(s.started >= suites[0].started for s in suites[1:])


HANGING_SUITE = """\
import signal, time
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a SIGINT held since exec is raised here
    time.sleep(3600)
except KeyboardInterrupt:
    raise SystemExit(2)  # as pytest does: stops its servers, writes tiers.json
"""


@pytest.mark.parametrize("runner_sigint", ["handled", "ignored"])
def test_scheduler_times_out_a_hanging_suite(tmp_path, runner_sigint):
    """A suite past its deadline is interrupted with SIGINT and stops on it (exit 2), not SIGKILLed after its grace.

    Event, not time: SIGINT is blocked in this thread while the scheduler runs, so the suite starts with it blocked
    and the scheduler's SIGINT stays pending until the suite unblocks it inside its ``try`` -- however much longer
    than the 2 s deadline a Python start takes on a loaded machine. The grace is a hang bound only (the suite exits
    at once). 'ignored': the runner started with SIGINT ignored (a background job of a non-interactive shell), which
    its children inherit unless the scheduler resets it: they were SIGKILLed (-9), issue #20."""
    from events import HANG

    hang = tmp_path / "hang.py"
    hang.write_text(HANGING_SUITE)
    suite = S.Suite("m", ("a",), tmp_path / "m", dict(os.environ))
    runner_handler = signal.SIG_IGN if runner_sigint == "ignored" else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, runner_handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        S.Scheduler([suite], cap=1, timeout=2, command=lambda s: [sys.executable, str(hang)], log=lambda _: None,
                    poll=0.05, grace=HANG).run()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)
    assert suite.timed_out and suite.exitstatus == 2
    assert S.judge_suite(None, suite.exitstatus, suite.timed_out).status == "timeout"


def test_nox_mutants_session_rejects_an_unknown_row_in_one_line():
    import shutil

    nox = [sys.executable, "-m", "nox"] if __import__("importlib").util.find_spec("nox") else (
        [shutil.which("nox")] if shutil.which("nox") else None)
    if nox is None:
        pytest.skip("nox is not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MTPMATRIX_", "NOX"))}
    proc = subprocess.run([*nox, "-s", "mutants", "--", "--row", "nope"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown row 'nope'; known: sglang-0.5.13" in proc.stderr


def test_nothing_applicable_runs_nothing(tmp_path, stub_env):
    pkg, command = stub_env
    lines: list[str] = []
    rc = M.run(parse(["--mutants", "elsewhere", "--out", str(tmp_path / "out")]), catalogue=TOY_CAT, pkg_dir=pkg,
               command=command, known_servers=["w"], gpu_check=False, log=lines.append)
    assert rc == 1 and not (tmp_path / "out").exists()
    assert lines[-1].startswith("NOTHING-APPLICABLE")


def test_a_spent_budget_starts_nothing_and_is_no_verdict(tmp_path, stub_env):
    rc, record, text = run_stub(tmp_path, stub_env, ["--budget", "5"])  # < MIN_SUITE_SECONDS left
    assert rc == 1 and record["verdict"] == "invalid" and record["baseline"]["status"] == "not-run"
    assert {m["status"] for m in record["mutants"]} == {"not-run", "n.a."}
    assert "budget left: 3 suite(s) not run" in text


def test_leftover_server_groups_are_killed_only_when_they_are_sglang(tmp_path):
    procs = {}
    for name, code in (("sg", "import time; time.sleep(120)  # sglang.launch_server"),
                       ("other", "import time; time.sleep(120)")):
        p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
        procs[name] = p
        (tmp_path / f"server-{name}.log").write_text(f"# command: x\n# pid {p.pid} (process group {p.pid})\nlog\n")
    try:
        assert S.stop_leftover_servers(tmp_path) == [procs["sg"].pid]
        assert procs["sg"].wait(timeout=10) == -9
        assert procs["other"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


# --------------------------------------------------------------------------------------------- off-chain mutants
# The lines the decoy / sampled / metric-field mutants edit, in the shape each release has them (read from the
# installed 0.5.13, 0.5.17 and 0.5.23: eagle_info(_v2) vs eagle_utils verify, the v1 request counters of 0.5.13,
# 0.5.23's sampling_softmax), each in a module that compiles.
_SPU_TEXT = """\
    def later(flat_cs, topk, batch_offsets, hidden_states):
        selected_input_index = flat_cs // topk + batch_offsets.repeat_interleave(topk)
        return hidden_states[selected_input_index]
    """
_BRP_TEXT = """\
    def settle(req, num_correct_drafts):
        req.spec_verify_ct += 1
        req.spec_num_correct_drafts += num_correct_drafts
        req.update_spec_correct_drafts_histogram(num_correct_drafts)
    """
_V1_VERIFY = """\
    class EagleVerifyInput:
        def verify(self, bs, logits_output, sampling_info, req, num_correct_drafts_this_req):
            candidates = self.draft_token.reshape(bs, self.draft_token_num)
            if sampling_info.is_all_greedy:
                target_predict = torch.argmax(logits_output.next_token_logits, dim=-1)
                target_predict = target_predict.reshape(bs, self.draft_token_num)
            else:
                target_probs = F.softmax(
                    logits_output.next_token_logits / expanded_temperature, dim=-1
                )
                target_probs = top_k_renorm_prob(
                    target_probs, sampling_info.top_ks
                )
                if sampling_info.need_top_p_sampling:
                    target_probs = top_p_renorm_prob(
                        target_probs, sampling_info.top_ps
                    )
                tree_speculative_sampling_target_only(
                    target_probs=target_probs,
                    threshold_single=get_global_server_args().speculative_accept_threshold_single,
                    threshold_acc=get_global_server_args().speculative_accept_threshold_acc,
                )
            req.spec_num_correct_drafts += num_correct_drafts_this_req
    """
_V2_SAMPLE = """\
    def eagle_sample(verify_input, bs, next_token_logits, sampling_info, expanded_temperature):
        candidates = verify_input.draft_token.reshape(bs, verify_input.draft_token_num)
        if sampling_info.is_all_greedy:
            target_predict = torch.argmax(next_token_logits, dim=-1)
            target_predict = target_predict.reshape(bs, verify_input.draft_token_num)
        else:
            target_probs = SOFTMAX
            if sampling_info.need_top_k_sampling:
                target_probs = top_k_renorm_prob(
                    target_probs, sampling_info.top_ks
                )
            if sampling_info.need_top_p_sampling:
                target_probs = top_p_renorm_prob(
                    target_probs, sampling_info.top_ps
                )
            sampling_fn(
                target_probs=target_probs,
                threshold_single=get_spec().speculative_accept_threshold_single,
                threshold_acc=get_spec().speculative_accept_threshold_acc,
            )
    """
_SOFTMAX_0517 = "F.softmax(\n            next_token_logits / expanded_temperature, dim=-1\n        )"
_SOFTMAX_0523 = "sampling_softmax(\n            next_token_logits, temperatures=expanded_temperature\n        )"
_SPEC = "sglang/srt/speculative/"
_BRP_FILE = "sglang/srt/managers/scheduler_components/batch_result_processor.py"
RELEASE_FORMS = {
    "0.5.13": {_SPEC + "spec_utils.py": _SPU_TEXT, _BRP_FILE: _BRP_TEXT, _SPEC + "eagle_info.py": _V1_VERIFY,
               _SPEC + "eagle_info_v2.py": _V1_VERIFY.replace(
                   "            req.spec_num_correct_drafts += num_correct_drafts_this_req\n", "")},
    "0.5.17": {_SPEC + "spec_utils.py": _SPU_TEXT, _BRP_FILE: _BRP_TEXT,
               _SPEC + "eagle_utils.py": _V2_SAMPLE.replace("SOFTMAX", _SOFTMAX_0517)},
    "0.5.23": {_SPEC + "spec_utils.py": _SPU_TEXT, _BRP_FILE: _BRP_TEXT,
               _SPEC + "eagle_utils.py": _V2_SAMPLE.replace("SOFTMAX", _SOFTMAX_0523)},
}
OFF_CHAIN = {  # mutant -> files it must patch in each release form (0.5.13 / 0.5.17 and 0.5.23)
    "topk-parent-non-first": ({"spec_utils.py"}, {"spec_utils.py"}),
    "verify-accept-all-greedy": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-temperature-ignored": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-renorm-skipped": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "verify-accept-threshold": ({"eagle_info.py", "eagle_info_v2.py"}, {"eagle_utils.py"}),
    "metric-correct-drafts-bonus": ({"batch_result_processor.py", "eagle_info.py"}, {"batch_result_processor.py"}),
}


@pytest.mark.parametrize("release", sorted(RELEASE_FORMS))
@pytest.mark.parametrize("mutant_id", sorted(OFF_CHAIN))
def test_off_chain_mutants_apply_to_each_release_form(tmp_path, release, mutant_id):
    pkg = write_tree(tmp_path, RELEASE_FORMS[release]) / "sglang"
    mutant = C.catalogue_by_id()[mutant_id]
    app = C.apply(mutant, pkg)
    assert app.applicable and app.error is None, app.reason()
    want = OFF_CHAIN[mutant_id][0 if release == "0.5.13" else 1]
    assert {Path(f).name for f in app.files} == want
    patched = "".join(m["patched"] for m in app.modules.values())
    assert all(s.site.replacement in patched for s in app.sites if s.applied)
    assert not any(s.status.startswith("anchor found") for s in app.sites)  # never ambiguous


def test_off_chain_edits_do_what_they_model(tmp_path):
    """The edits themselves, read off the patched text: what each mutant changes and nothing else."""
    forms = {r: write_tree(tmp_path / r, files) / "sglang" for r, files in RELEASE_FORMS.items()}

    def patched(mutant_id: str, release: str, file: str) -> str:
        app = C.apply(C.catalogue_by_id()[mutant_id], forms[release])
        return next(m["patched"] for m in app.modules.values() if m["rel"].endswith(file))

    for r in RELEASE_FORMS:
        assert "(flat_cs // topk).clamp(max=0)" in patched("topk-parent-non-first", r, "spec_utils.py")
        text = patched("verify-temperature-ignored", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "/ expanded_temperature" not in text and "temperatures=expanded_temperature" not in text
        text = patched("verify-renorm-skipped", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "= top_k_renorm_prob(" not in text and "= top_p_renorm_prob(" not in text
        text = patched("verify-accept-threshold", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "threshold_acc=0.5 * " in text and "threshold_single=get_" in text  # only the coin threshold moves
        text = patched("metric-correct-drafts-bonus", r, "batch_result_processor.py")
        assert "spec_num_correct_drafts += num_correct_drafts + 1\n" in text
        assert "req.spec_verify_ct += 1\n" in text and "histogram(num_correct_drafts)" in text  # the rest untouched


def test_every_mutant_names_servers_that_can_see_it():
    """Witness servers for hand-off bugs, the decoy / sampled servers for what the witness cannot see, every one a
    server of this checkout's smoke tier (a run refuses servers the smoke tier lacks: next test)."""
    from mtpmatrix.tiers.smoke import SMOKE_SERVERS

    known = {s.name for s in SMOKE_SERVERS}
    by_id = C.catalogue_by_id()
    for m in C.CATALOGUE:
        assert set(m.servers) <= known, m.id
    assert by_id["topk-parent-non-first"].servers == C.DECOY_TOPK3 == ("decoy-mtp-topk3",)
    assert by_id["verify-accept-all-greedy"].servers == C.DECOY_TOPK1 == ("decoy-mtp-topk1",)
    for mid in ("verify-temperature-ignored", "verify-renorm-skipped", "verify-accept-threshold"):
        assert by_id[mid].servers == ("sampled-mtp-topk1", "sampled-mtp-topk3"), mid
        assert "test_sampled_distribution_matches_closed_form" in by_id[mid].expect
    assert "test_meta_info_fields_agree" in by_id["metric-correct-drafts-bonus"].expect


def test_a_mutant_on_servers_this_checkout_lacks_stops_in_one_line(tmp_path, capsys):
    pkg = write_tree(tmp_path, RELEASE_FORMS["0.5.17"]) / "sglang"
    ns = parse(["--mutants", "verify-accept-all-greedy", "--out", str(tmp_path / "out")])
    rc = M.run(ns, pkg_dir=pkg, known_servers=list(C.WITNESS_SERVERS), gpu_check=False)
    assert rc == 2 and not (tmp_path / "out").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "smoke server(s) decoy-mtp-topk1 not in this checkout's smoke tier" in err[0]


def _row_sglang(version: str) -> Path | None:
    """sglang ``version``'s package in a row venv: $MTPMATRIX_SGLANG_DIRS (os.pathsep-separated package folders),
    else this checkout's .nox."""
    dirs = [d for d in os.environ.get("MTPMATRIX_SGLANG_DIRS", "").split(os.pathsep) if d]
    dirs += [str(p) for p in sorted(REPO.glob(".nox/*sglang-0?5?*/lib/python3*/site-packages/sglang"))]
    return next((Path(d) for d in dirs if Path(d).is_dir() and C.sglang_version(Path(d)) == version), None)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.17", "0.5.23"])
def test_check_lists_every_mutant_applicable_on_each_row_release(version, capsys):
    pkg = _row_sglang(version)
    if pkg is None:
        pytest.skip(f"no sglang {version} here (MTPMATRIX_SGLANG_DIRS, or the row venv under .nox)")
    assert main(["mutants", "--check", "--sglang-dir", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert f"{len(C.CATALOGUE)} applicable, 0 n.a.; every patched module compiles" in out
    for mutant_id in OFF_CHAIN:
        assert any(ln.split()[:3] == [mutant_id, C.catalogue_by_id()[mutant_id].category, "applicable"]
                   for ln in out.splitlines()), mutant_id
