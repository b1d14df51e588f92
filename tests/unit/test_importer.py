"""python -m mtpmatrix import: a tools/gpu_box.sh OUT folder, as the H200 runs left them (docs/runs), filed under
results/<run>/<row>/ in the schema's layout and read by the report like a nox row."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from mtpmatrix.runner import importer

from mtpmatrix import report, schema
from mtpmatrix.__main__ import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runs"
BOX_RUN = DOCS / "2026-11-30-h200-sglang-0.5.17-smoke-gsm8k-tiny.json"  # tiers.json of a real gpu_box.sh run
CASES = ("tiny-e2e-proof-topk1", "tiny-e2e-proof-topk3")


def _add(tar: tarfile.TarFile, name: str, text: str) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def gpu_box_out(tmp_path: Path, correct=lambda case, i: i % 3 == 0, name="out") -> Path:
    """An OUT folder exactly as gpu_box.sh writes it: its work folder's logs and records tarred as './NAME'."""
    out = tmp_path / name
    out.mkdir()
    shutil.copy(BOX_RUN, out / "tiers.json")
    shutil.copy(DOCS / "env-2-r17.txt", out / "env.txt")
    (out / "junit.xml").write_text("<testsuites/>\n")
    (out / "pytest.log").write_text("20 passed\n")
    logs = {json.loads(BOX_RUN.read_text())["tiers"][t]["checks"][0]["metrics"]["server_log"]
            for t in ("smoke", "gsm8k")}
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        for log in logs:
            _add(tar, "./" + Path(log).name, "# mtpmatrix server\nCapture cuda graph end\n")
        for case in CASES:
            lines = [json.dumps({"index": i, "correct": correct(case, i)}) for i in range(200)]
            _add(tar, f"./gsm8k-{case}.jsonl", "\n".join(lines) + "\n")
        _add(tar, "../escape.txt", "outside")  # never written outside the row folder
    return out


def test_gpu_box_out_imports_into_the_results_store_and_reports(tmp_path, capsys):
    out = gpu_box_out(tmp_path)
    results = tmp_path / "results"
    assert main(["import", str(out), "--row", "sglang-0.5.17", "--results", str(results), "--run-id", "box1"]) == 0
    row = results / "box1" / "sglang-0.5.17"
    # a run recorded before schema 3 (no selection), of tiny GSM8K cases: every check passed, not the whole suite
    assert "sglang-0.5.17: PARTIAL" in capsys.readouterr().out
    names = {str(p.relative_to(row)) for p in row.rglob("*") if p.is_file()}
    assert {"row.json", "tiers.json", "junit.xml", "pytest.log", "env.txt", "server-random-nomtp.log",
            "gsm8k/tiny-e2e-proof-topk1.jsonl", "gsm8k/tiny-e2e-proof-topk3.jsonl"} <= names
    assert not (tmp_path / "results" / "box1" / "escape.txt").exists() and not list(results.glob("box1/.import*"))
    rec = json.loads((row / "row.json").read_text())
    assert rec["verdict"] == "partial" and rec["install"]["verdict"] == importer.IMPORTED
    assert rec["versions"]["sglang"] == "0.5.17" and rec["gpus"] == 1 and rec["started"] == "2026-11-30T06:10:25+00:00"
    acc = next(c for c in rec["tiers"]["gsm8k"]["checks"] if c["id"].endswith("test_accuracy[tiny-e2e-proof-topk1]"))
    # the GPU box's absolute paths (under its own $OUT) became row-relative schema paths
    assert acc["metrics"][schema.RECORDS] == "gsm8k/tiny-e2e-proof-topk1.jsonl"
    assert acc["metrics"][schema.SERVER_LOG] == "server-gsm8k-tiny-e2e-proof-topk1.log"

    s = report.build_summary(results / "box1")
    m = {x["short"]: x for x in report._row_summary(results / "box1", "sglang-0.5.17", rec, tmp_path)["metrics"]
         if x["tier"] == "gsm8k"}
    assert m["tiny-e2e-proof-topk1"]["accept_length"] == 6.0 and m["tiny-e2e-proof-topk1"]["score"] == 0.0
    assert s["tier_status"]["smoke"]["partial"] == ["sglang-0.5.17"]
    assert "contract and reference not run" in report.render_markdown(s)


def test_a_second_box_run_compares_question_by_question(tmp_path):
    results = tmp_path / "results"
    importer.import_run(gpu_box_out(tmp_path, name="a"), "sglang-0.5.17", results=results, run_id="box1")
    flip = {3, 6, 9}  # right in the first run, wrong in the second
    importer.import_run(gpu_box_out(tmp_path, lambda c, i: i % 3 == 0 and i not in flip, name="b"),
                        "sglang-0.5.17", results=results, run_id="box2")
    s = report.build_summary(results / "box2", baseline_dir=results / "box1")
    p = next(x for x in s["baseline"]["paired"] if x["key"] == "tiny-e2e-proof-topk1")
    assert p["flipped_to_wrong"] == sorted(flip) and p["right_in_b_only"] == 0


@pytest.mark.parametrize("setup, args, words", [
    (lambda out: (out / "tiers.json").unlink(), ["--row", "sglang-0.5.17"], "no tiers.json"),
    (lambda out: None, ["--row", "sglang-9.9"], "--row 'sglang-9.9' is not a row; known: "),
    (lambda out: (out / "tiers.json").write_text("{}"), ["--row", "sglang-0.5.17"], "no 'tiers'"),
    (lambda out: (out / "logs.tgz").write_bytes(b"not a tarball"), ["--row", "sglang-0.5.17"], "logs.tgz: unreadable"),
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys, setup, args, words):
    out = gpu_box_out(tmp_path)
    setup(out)
    results = tmp_path / "results"
    assert main(["import", str(out), *args, "--results", str(results), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(results.glob("r/*"))  # no row, no staging folder


def test_a_row_is_never_overwritten(tmp_path, capsys):
    out = gpu_box_out(tmp_path)
    args = ["import", str(out), "--row", "sglang-0.5.17", "--results", str(tmp_path / "results"), "--run-id", "r"]
    assert main(args) == 0
    assert main(args) == 2
    assert "already exists: import into another --run-id" in capsys.readouterr().err


def test_gpu_box_script_output_imports_as_it_is(tmp_path, gsm8k_lines):
    """tools/gpu_box.sh itself (the gsm8k tier against a stand-in server, so it runs here), then import: its OUT
    folder lands in the results store with the records and logs the report reads."""
    import os
    import subprocess
    import sys

    from fake_sglang import FakeSglang, gsm8k_responder, server_info

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "box"
    env = {**os.environ, "MTPMATRIX_GSM8K_NUM_EXAMPLES": "30",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with FakeSglang(server_info=server_info(topk=3), responder=gsm8k_responder(gsm8k_lines, lambda i: i != 4)) as fake:
        proc = subprocess.run(["bash", str(repo / "tools" / "gpu_box.sh"), str(out), "--tiers", "gsm8k",
                               "--server-url", fake.base_url], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"tiers.json", "junit.xml", "pytest.log", "env.txt", "logs.tgz",
                                               schema.INVOCATION_FILE}
    # the run's evidence carries the id of the invocation that made it
    invocation_id = json.loads((out / schema.INVOCATION_FILE).read_text())["invocation_id"]
    knobs = json.loads((out / "tiers.json").read_text())["selection"]["knobs"]
    assert knobs["MTPMATRIX_INVOCATION_ID"] == invocation_id
    dest, rec = importer.import_run(out, "sglang-0.5.17", results=tmp_path / "results", run_id="box")
    # what the box was asked to run is on the row: its pytest args and MTPMATRIX_* knobs (and nothing else)
    assert rec["pytest_args"] == ["--tiers", "gsm8k", "--server-url", fake.base_url]
    assert rec["knobs"]["MTPMATRIX_GSM8K_NUM_EXAMPLES"] == "30"
    assert all(k.startswith("MTPMATRIX_") for k in rec["knobs"]) and "PATH" not in rec["knobs"]
    # one --server-url case of 30 questions is not the seed suite: ran and passed, but partial
    gsm = rec["tiers"]["gsm8k"]
    assert gsm["verdict"] == "partial" and rec["verdict"] == "partial"
    assert any(m["what"] == "E4B-topk1" for m in gsm["missing"])
    assert any("30 of 200" in m["why"] for m in gsm["missing"] if m["what"] == "E4B-topk3")
    qs = report.question_records(rec, dest)
    assert list(qs) == ["E4B-topk3"] and sum(qs["E4B-topk3"]["questions"].values()) == 29


def test_import_strips_the_box_s_stored_tags_and_verdicts(tmp_path):
    """A GPU box's tiers.json is evidence, not a verdict: a stored known-upstream tag that matches no entry of the
    current list (or an entry narrowed since) is dropped, and the tier verdict is derived again."""
    out = gpu_box_out(tmp_path)
    data = json.loads((out / "tiers.json").read_text())
    smoke = data["tiers"]["smoke"]
    chk = smoke["checks"][0]
    chk.update(outcome="failed", known_upstream="sglang-gemma4-mtp-draft-rope-phase",
               failure={"kind": "launch", "type": "CheckFailure", "message": "server died", "frame": None,
                        "raised_at": None})
    smoke.update(verdict="known-upstream", known_upstream=[{"id": "sglang-gemma4-mtp-draft-rope-phase",
                                                            "checks": [chk["id"]]}])
    (out / "tiers.json").write_text(json.dumps(data))
    _dest, rec = importer.import_run(out, "sglang-0.5.17", results=tmp_path / "results", run_id="r")
    smoke = rec["tiers"]["smoke"]
    assert smoke["verdict"] == "failed" and rec["verdict"] == "failed"
    assert "known_upstream" not in smoke and "known_upstream" not in smoke["checks"][0]
