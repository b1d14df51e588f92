"""python -m mtpmatrix import: a tools/gpu_box.sh OUT folder, as the H200 runs left them (docs/runs), filed under
results/<run>/<row>/ in the schema's layout and read by the report like a nox row."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mtpmatrix.__main__ import main
from mtpmatrix.core import expected, schema, store
from mtpmatrix.core.atomic import atomic_write_json, read_json_or_gzip
from mtpmatrix.report import checks as report_checks
from mtpmatrix.report import render as report_render
from mtpmatrix.report import row_summary as report_row_summary
from mtpmatrix.report import summary as report_summary
from mtpmatrix.runner import importer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runs"
SRC = Path(__file__).resolve().parents[2] / "src"
BOX_RUN = DOCS / "2026-11-30-h200-sglang-0.5.17-smoke-gsm8k-tiny.json.gz"  # tiers.json of a real gpu_box.sh run
CASES = ("tiny-e2e-proof-topk1", "tiny-e2e-proof-topk3")


def _add(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


INVOCATION_ID = "5f0c1d9a3b7e4c2a8d6f1e0b9a7c5d3e"


def bind(out: Path, tiers_id: str | None, invocation_id: str | None = INVOCATION_ID) -> None:
    """Give OUT's invocation.json ``invocation_id`` and its tiers.json's recorded knobs ``tiers_id`` (None: none), as
    gpu_box.sh and the pytest plugin write them; the selection is the one the plugin records for its checks."""
    data = json.loads((out / "tiers.json").read_text())
    knobs = {} if tiers_id is None else {importer.INVOCATION_KNOB: tiers_id}
    data["selection"] = {
        "args": ["tests/tiers", "--tiers", "smoke,gsm8k"],
        "paths": ["tests/tiers"],
        "keyword": "",
        "markexpr": "",
        "deselect": [],
        "maxfail": 0,
        "knobs": knobs,
        "collected": {t: [c["id"] for c in e.get("checks") or []] for t, e in data["tiers"].items()},
    }
    (out / "tiers.json").write_text(json.dumps(data))
    invocation = {
        "started": "2026-11-30T06:10:20Z",
        "tests": ["tests/tiers"],
        "timeout_s": None,
        "knobs": knobs,
        "pytest_args": ["--tiers", "smoke,gsm8k"],
    }
    if invocation_id is not None:
        invocation["invocation_id"] = invocation_id
    (out / schema.INVOCATION_FILE).write_text(json.dumps(invocation))


def gpu_box_out(tmp_path: Path, correct=lambda case, i: i % 3 == 0, name="out") -> Path:
    """An OUT folder exactly as gpu_box.sh writes it: its work folder's logs and records tarred as './NAME', its
    tiers.json and invocation.json bound by one invocation id."""
    out = tmp_path / name
    out.mkdir()
    atomic_write_json(out / "tiers.json", read_json_or_gzip(BOX_RUN))  # the bytes the box wrote
    bind(out, INVOCATION_ID)
    shutil.copy(DOCS / "env-2-r17.txt", out / "env.txt")
    (out / "junit.xml").write_text("<testsuites/>\n")
    (out / "pytest.log").write_text("20 passed\n")
    logs = {read_json_or_gzip(BOX_RUN)["tiers"][t]["checks"][0]["metrics"]["server_log"] for t in ("smoke", "gsm8k")}
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        for log in logs:
            _add(tar, "./" + Path(log).name, "# mtpmatrix server\nCapture cuda graph end\n")
        for case in CASES:
            lines = [json.dumps({"index": i, "correct": correct(case, i)}) for i in range(200)]
            _add(tar, f"./gsm8k-{case}.jsonl", "\n".join(lines) + "\n")
        _add(tar, "../escape.txt", "outside")  # never written outside the row folder
    return out


def test_the_tiers_are_judged_against_the_selection_the_box_recorded(tmp_path):
    """A box that recorded its pytest selection (tiers.json's ``selection``) is judged by it, not as a run that
    recorded none (whose every tier would miss the selection)."""
    out = gpu_box_out(tmp_path)
    _, rec = importer.import_run(out, "sglang-0.5.17", results=tmp_path / "results", run_id="box1")
    assert rec["selection"] == json.loads((out / "tiers.json").read_text())["selection"]
    not_recorded = {"what": "selection", "why": expected.NOT_RECORDED}
    judged = {t: e for t, e in rec["tiers"].items() if e["verdict"] != "skipped"}
    assert set(judged) == {"smoke", "gsm8k"}
    assert all(not_recorded not in e.get("missing", []) for e in judged.values()), judged


def test_gpu_box_out_imports_into_the_results_store_and_reports(tmp_path, capsys):
    out = gpu_box_out(tmp_path)
    results = tmp_path / "results"
    assert main(["import", str(out), "--row", "sglang-0.5.17", "--results", str(results), "--run-id", "box1"]) == 0
    row = results / "box1" / "sglang-0.5.17"
    # a run recorded before schema 3 (no selection), of tiny GSM8K cases: every check passed, not the whole suite
    assert "sglang-0.5.17: PARTIAL" in capsys.readouterr().out
    names = {str(p.relative_to(row)) for p in row.rglob("*") if p.is_file()}
    assert {
        "row.json",
        "tiers.json",
        "junit.xml",
        "pytest.log",
        "env.txt",
        "server-random-nomtp.log",
        "gsm8k/tiny-e2e-proof-topk1.jsonl",
        "gsm8k/tiny-e2e-proof-topk3.jsonl",
    } <= names
    assert not (tmp_path / "results" / "box1" / "escape.txt").exists() and not list(results.glob("box1/.import*"))
    rec = json.loads((row / "row.json").read_text())
    assert rec["verdict"] == "partial" and rec["install"]["verdict"] == importer.IMPORTED
    assert rec["versions"]["sglang"] == "0.5.17" and rec["gpus"] == 1 and rec["started"] == "2026-11-30T06:10:25+00:00"
    acc = next(c for c in rec["tiers"]["gsm8k"]["checks"] if c["id"].endswith("test_accuracy[tiny-e2e-proof-topk1]"))
    # the GPU box's absolute paths (under its own $OUT) became row-relative schema paths
    assert acc["metrics"][schema.RECORDS] == "gsm8k/tiny-e2e-proof-topk1.jsonl"
    assert acc["metrics"][schema.SERVER_LOG] == "server-gsm8k-tiny-e2e-proof-topk1.log"

    s = report_summary.build_summary(results / "box1")
    m = {
        x["short"]: x
        for x in report_row_summary.row_summary(results / "box1", "sglang-0.5.17", rec, tmp_path)["metrics"]
        if x["tier"] == "gsm8k"
    }
    assert m["tiny-e2e-proof-topk1"]["accept_length"] == 6.0 and m["tiny-e2e-proof-topk1"]["score"] == 0.0
    # its stub junit.xml names none of its checks: the record cannot show its outcomes, so it proves nothing
    assert (
        s["tier_status"]["smoke"]["unproven"] == ["sglang-0.5.17"]
        and s["exit_status"] == report_summary.EXIT_NOT_PROVEN
    )
    assert "junit.xml says nothing" in report_render.render_markdown(s)


def test_a_second_box_run_compares_question_by_question(tmp_path):
    results = tmp_path / "results"
    importer.import_run(gpu_box_out(tmp_path, name="a"), "sglang-0.5.17", results=results, run_id="box1")
    flip = {3, 6, 9}  # right in the first run, wrong in the second
    importer.import_run(
        gpu_box_out(tmp_path, lambda c, i: i % 3 == 0 and i not in flip, name="b"),
        "sglang-0.5.17",
        results=results,
        run_id="box2",
    )
    s = report_summary.build_summary(results / "box2", baseline_dir=results / "box1")
    p = next(x for x in s["baseline"]["paired"] if x["key"] == "tiny-e2e-proof-topk1")
    assert p["flipped_to_wrong"] == sorted(flip) and p["right_in_b_only"] == 0


@pytest.mark.parametrize(
    "setup, args, words",
    [
        (lambda out: (out / "tiers.json").unlink(), ["--row", "sglang-0.5.17"], "no tiers.json"),
        (lambda out: None, ["--row", "sglang-9.9"], "--row 'sglang-9.9' is not a row; known: "),
        (lambda out: (out / "tiers.json").write_text("{}"), ["--row", "sglang-0.5.17"], "no 'tiers'"),
        (
            lambda out: (out / "logs.tgz").write_bytes(b"not a tarball"),
            ["--row", "sglang-0.5.17"],
            "logs.tgz: unreadable",
        ),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys, setup, args, words):
    out = gpu_box_out(tmp_path)
    setup(out)
    results = tmp_path / "results"
    assert main(["import", str(out), *args, "--results", str(results), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(results.glob("r/*"))  # no row, no staging folder


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data))


def _edit_tiers(out: Path, edit) -> None:
    data = json.loads((out / "tiers.json").read_text())
    edit(data)
    _write_json(out / "tiers.json", data)


# What import cannot verify is refused, each in one line: evidence of another run (or of none), a box output that
# predates the invocation id, a tiers.json that is not the plugin's shape (never a traceback).
@pytest.mark.parametrize(
    "setup, words",
    [
        (lambda out: bind(out, "0" * 32), "tiers.json is not from this invocation"),
        (lambda out: bind(out, None), "tiers.json is not from this invocation"),
        (lambda out: bind(out, INVOCATION_ID, invocation_id=None), "predates verified invocations"),
        (lambda out: (out / schema.INVOCATION_FILE).unlink(), "predates verified invocations"),
        (lambda out: _write_json(out / schema.INVOCATION_FILE, ["not", "an", "object"]), "invocation.json: not"),
        (lambda out: (out / "junit.xml").unlink(), "no junit.xml"),
        (lambda out: (out / "pytest.log").unlink(), "no pytest.log"),
        (lambda out: _write_json(out / "tiers.json", [{"tiers": {}}]), "tiers.json: not"),
        (lambda out: (out / "tiers.json").write_bytes(b'{"tiers": {"smoke": "\xff\xfe"}}'), "tiers.json: unreadable"),
        (lambda out: _edit_tiers(out, lambda d: d.update(tiers=[])), "no 'tiers'"),
        (lambda out: _edit_tiers(out, lambda d: d["tiers"].update(smoke=[])), "tiers.smoke is not an object"),
        (lambda out: _edit_tiers(out, lambda d: d["tiers"].update(gpu={"checks": []})), "unknown tier 'gpu'"),
        (lambda out: _edit_tiers(out, lambda d: d["tiers"]["smoke"].update(checks={})), "tiers.smoke.checks"),
        (
            lambda out: _edit_tiers(out, lambda d: d["tiers"]["smoke"]["checks"][0].pop("id")),
            "tiers.smoke.checks[0] has no id",
        ),
        (lambda out: _edit_tiers(out, lambda d: d["tiers"]["gsm8k"]["checks"].append("passed")), "] is not an object"),
        (
            lambda out: _edit_tiers(out, lambda d: d["tiers"]["smoke"]["checks"][0].update(metrics=[1])),
            "metrics is not an object",
        ),
        (
            lambda out: _edit_tiers(out, lambda d: d["tiers"]["smoke"]["checks"][0].update(failure="died")),
            "failure is not an object",
        ),
        (lambda out: _edit_tiers(out, lambda d: d.update(selection="all")), "'selection' is not"),
        (
            lambda out: _edit_tiers(out, lambda d: d["selection"].update(knobs=["MTPMATRIX_X"])),
            "'selection.knobs' is not",
        ),
        (lambda out: _edit_tiers(out, lambda d: d.update(versions=["sglang"])), "'versions' is not"),
        (lambda out: _edit_tiers(out, lambda d: d["selection"].update(paths=7)), "'selection.paths' is not"),
        (lambda out: _edit_tiers(out, lambda d: d.update(fingerprint="abc")), "'fingerprint' is not an object"),
        (
            lambda out: _write_json(out / schema.INVOCATION_FILE, {"invocation_id": INVOCATION_ID, "knobs": ["x"]}),
            "invocation.json: not gpu_box.sh's",
        ),
    ],
    ids=[
        "another-invocation",
        "no-id-in-tiers",
        "no-id-in-invocation",
        "no-invocation",
        "invocation-a-list",
        "no-junit",
        "no-pytest-log",
        "tiers-a-list",
        "non-utf8",
        "tiers-tiers-a-list",
        "tier-a-list",
        "unknown-tier",
        "checks-a-dict",
        "check-without-id",
        "check-a-string",
        "metrics-a-list",
        "failure-a-string",
        "selection-a-string",
        "knobs-a-list",
        "versions-a-list",
        "paths-a-number",
        "fingerprint-a-string",
        "invocation-knobs-a-list",
    ],
)
def test_what_import_cannot_verify_is_one_line_and_leaves_nothing(tmp_path, capsys, setup, words):
    out = gpu_box_out(tmp_path)
    setup(out)
    results = tmp_path / "results"
    assert main(["import", str(out), "--row", "sglang-0.5.17", "--results", str(results), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not list(results.glob("r/*")) and not list(results.glob("r/.*"))  # no row, no staging folder


def test_an_older_box_output_is_told_to_run_the_current_script(tmp_path, capsys):
    out = gpu_box_out(tmp_path)
    bind(out, None, invocation_id=None)  # a box from before invocation ids: nothing binds its tiers.json to it
    assert main(["import", str(out), "--row", "sglang-0.5.17", "--results", str(tmp_path / "results")]) == 2
    assert "re-run it with the current tools/gpu_box.sh" in capsys.readouterr().err


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped (not alive: nothing answers os.kill(pid, 0))."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_a_killed_import_s_staging_folder_is_cleaned_by_the_next_import_of_its_row(tmp_path):
    results = tmp_path / "results"
    run = results / "r"
    dead, alive = _dead_pid(), os.getppid()
    left = {
        name: run / name
        for name in (
            f".import-sglang-0.5.17-{dead}",  # killed: goes
            f".import-sglang-0.5.17-{alive}",  # another import still at work: stays
            f".import-sglang-0.5.23-{dead}",  # another row's: not this import's
            f".import-sglang-0.5.17-cu128-{dead}",
        )
    }  # a row whose id extends this one
    for folder in left.values():
        folder.mkdir(parents=True)
        (folder / "row.json").write_text('{"verdict": "passed"}')
    dest, _ = importer.import_run(gpu_box_out(tmp_path), "sglang-0.5.17", results=results, run_id="r")
    assert sorted(p.name for p in run.iterdir()) == sorted([dest.name, "manifest.json", *list(left)[1:]])
    assert list(store.read_run(run)) == ["sglang-0.5.17"]


def test_a_row_another_import_filed_meanwhile_is_kept_and_ours_is_one_line(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    other = gpu_box_out(tmp_path, name="other")
    real_env = importer._env

    def the_other_import_finishes_first(out):  # while this import assembles its row, in a process of its own
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mtpmatrix",
                "import",
                str(other),
                "--row",
                "sglang-0.5.17",
                "--results",
                str(results),
                "--run-id",
                "r",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        assert done.returncode == 0, done.stderr
        return real_env(out)

    monkeypatch.setattr(importer, "_env", the_other_import_finishes_first)
    assert (
        main(
            ["import", str(gpu_box_out(tmp_path)), "--row", "sglang-0.5.17", "--results", str(results), "--run-id", "r"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "already exists: import into another --run-id" in err and err.count("\n") == 1
    row = results / "r" / "sglang-0.5.17"
    assert json.loads((row / "row.json").read_text())["host"]["imported_from"] == str(other.resolve())
    # no staging folder left (the manifest plans the row: the first import wrote it)
    assert sorted(p.name for p in (results / "r").iterdir()) == ["manifest.json", "sglang-0.5.17"]


def test_a_row_is_never_overwritten(tmp_path, capsys):
    out = gpu_box_out(tmp_path)
    args = ["import", str(out), "--row", "sglang-0.5.17", "--results", str(tmp_path / "results"), "--run-id", "r"]
    assert main(args) == 0
    assert main(args) == 2
    assert "already exists: import into another --run-id" in capsys.readouterr().err


def test_gpu_box_script_output_imports_as_it_is(tmp_path, gsm8k_lines):
    """tools/gpu_box.sh itself (the gsm8k tier against a stand-in server, so it runs here), then import: its OUT
    folder lands in the results store with the records and logs the report reads."""
    from fake_sglang import FakeSglang, gsm8k_responder, server_info

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "box"
    env = {
        **os.environ,
        "MTPMATRIX_GSM8K_NUM_EXAMPLES": "30",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    with FakeSglang(server_info=server_info(topk=3), responder=gsm8k_responder(gsm8k_lines, lambda i: i != 4)) as fake:
        proc = subprocess.run(
            ["bash", str(repo / "tools" / "gpu_box.sh"), str(out), "--tiers", "gsm8k", "--server-url", fake.base_url],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {
        "tiers.json",
        "junit.xml",
        "pytest.log",
        "env.txt",
        "logs.tgz",
        schema.INVOCATION_FILE,
    }
    # the run's evidence carries the id of the invocation that made it
    invocation_id = json.loads((out / schema.INVOCATION_FILE).read_text())["invocation_id"]
    written = json.loads((out / "tiers.json").read_text())
    assert written["selection"]["knobs"]["MTPMATRIX_INVOCATION_ID"] == invocation_id
    dest, rec = importer.import_run(out, "sglang-0.5.17", results=tmp_path / "results", run_id="box")
    # the suite that wrote the records is on the row, as on a nox row (evidence.judge reads it there)
    assert rec["fingerprint"] == written["fingerprint"] and rec["fingerprint"]["suite"]
    # what the box was asked to run is on the row: its pytest args and MTPMATRIX_* knobs (and nothing else)
    assert rec["pytest_args"] == ["--tiers", "gsm8k", "--server-url", fake.base_url]
    assert rec["knobs"]["MTPMATRIX_GSM8K_NUM_EXAMPLES"] == "30"
    assert all(k.startswith("MTPMATRIX_") for k in rec["knobs"]) and "PATH" not in rec["knobs"]
    # one --server-url case of 30 questions is not the seed suite: ran and passed, but partial
    gsm = rec["tiers"]["gsm8k"]
    assert gsm["verdict"] == "partial" and rec["verdict"] == "partial"
    assert any(m["what"] == "E4B-topk1" for m in gsm["missing"])
    assert any("30 of 200" in m["why"] for m in gsm["missing"] if m["what"] == "E4B-topk3")
    qs = report_checks.question_records(rec, dest)
    assert list(qs) == ["E4B-topk3"] and sum(qs["E4B-topk3"]["questions"].values()) == 29


def test_import_strips_the_box_s_stored_tags_and_verdicts(tmp_path):
    """A GPU box's tiers.json is evidence, not a verdict: a stored known-upstream tag that matches no entry of the
    current list (or an entry narrowed since) is dropped, and the tier verdict is derived again."""
    out = gpu_box_out(tmp_path)
    data = json.loads((out / "tiers.json").read_text())
    smoke = data["tiers"]["smoke"]
    chk = smoke["checks"][0]
    chk.update(
        outcome="failed",
        known_upstream="sglang-gemma4-mtp-draft-rope-phase",
        failure={"kind": "launch", "type": "CheckFailure", "message": "server died", "frame": None, "raised_at": None},
    )
    smoke.update(
        verdict="known-upstream", known_upstream=[{"id": "sglang-gemma4-mtp-draft-rope-phase", "checks": [chk["id"]]}]
    )
    (out / "tiers.json").write_text(json.dumps(data))
    _dest, rec = importer.import_run(out, "sglang-0.5.17", results=tmp_path / "results", run_id="r")
    smoke = rec["tiers"]["smoke"]
    assert smoke["verdict"] == "failed" and rec["verdict"] == "failed"
    assert "known_upstream" not in smoke and "known_upstream" not in smoke["checks"][0]
