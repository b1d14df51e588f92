"""Evidence on a hostile day (issue #39, classes 4-8), each case built from the real H200 smoke record as ``import``
files it (conftest.h200_run): a row whose constraints changed since its run, file times that lie about which run is
the latest, ids and links that would leave the results root, text that would forge a heading, I/O and parse faults,
two imports into one run at once, and a report that must say one thing on every page."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.__main__ import main
from mtpmatrix.core import paths, store
from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.evidence import manifest
from mtpmatrix.report.cli import write_report
from mtpmatrix.runner import baseline

ROW = H200_ROW  # the row the H200 record ran (its Python and torch build)
FORGED = "boom\r# ✅ QUALIFIES\n<h1>✅ QUALIFIES</h1>"


def report(results: Path, *args: str, capsys) -> tuple[int, str, str]:
    rc = main(["report", *args, "--results", str(results), "--require", "smoke"])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: ")


# --- 4: staleness ---------------------------------------------------------------------------------------------------


def test_a_row_whose_constraints_changed_since_its_run_is_not_proven(h200_run, tmp_path, monkeypatch, capsys):
    results, _run = h200_run
    rc, out, _ = report(results, "h200", capsys=capsys)
    assert rc == 0 and "smoke proven" in out  # the untouched record
    moved = tmp_path / "constraints"
    shutil.copytree(paths.CONSTRAINTS_DIR, moved)
    f = moved / f"{ROW}.txt"
    f.write_text(f.read_text().replace("transformers==5.12.1", "transformers==5.12.0"))
    monkeypatch.setattr(paths, "CONSTRAINTS_DIR", moved)
    rc, out, _ = report(results, "h200", capsys=capsys)
    assert rc == 3 and "NOT PROVEN" in out
    assert f"constraints/{ROW}.txt changed since the run" in out


def _future(f: Path) -> None:
    t = 4102444800  # 2100-01-01: what rsync -a keeps of a box whose clock ran ahead
    os.utime(f, (t, t))


def test_latest_run_is_the_one_recorded_last_whatever_the_file_times(results):
    assert store.latest_run_id(results) == "20261209-140233"
    for f in (results / "20261201-090512").glob("*/row.json"):
        _future(f)  # an old run copied in with future times
    assert store.latest_run_id(results) == "20261209-140233"


def test_the_canary_baseline_walks_runs_by_recorded_time(results):
    for f in (results / "20261201-090512").glob("*/row.json"):
        _future(f)
    order = [run for run, _rec in baseline._plain_runs(results, "sglang-0.5.17")]
    assert order == ["20261209-140233", "20261208-090507", "20261201-090512"]


# --- 5: lanes -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["../escaped", "a/b", "..", ".hidden", ""])
def test_import_run_id_is_one_name_inside_the_results_root(tmp_path, capsys, run_id):
    out = write_box(tmp_path / "box", h200_record())
    results = tmp_path / "root" / "results"
    rc = main(["import", str(out), "--row", ROW, "--run-id", run_id, "--results", str(results)])
    _, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "--run-id" in err
    assert not (tmp_path / "root" / "escaped").exists() and not (results.exists() and any(results.rglob("row.json")))


def test_report_run_id_is_one_name_inside_the_results_root(h200_run, capsys):
    results, run = h200_run
    shutil.copytree(run, results.parent / "outside")
    for args in (["../outside"], ["h200", "--baseline", "../outside"]):
        rc, _out, err = report(results, *args, capsys=capsys)
        assert rc == 2 and one_line_error(err), (args, err)


@pytest.mark.parametrize("name", ["pytest.log", "env.txt", "logs.tgz", "tiers.json"])
def test_import_never_follows_a_link_out_of_out(tmp_path, capsys, name):
    out = write_box(tmp_path / "box", h200_record())
    secret = tmp_path / "secret"
    if name == "logs.tgz":  # a real archive elsewhere on the box
        import tarfile

        (tmp_path / "server.log").write_text("someone else's log")
        with tarfile.open(secret, "w:gz") as tar:
            tar.add(tmp_path / "server.log", arcname="server.log")
    else:
        shutil.copy(out / name, secret)
    (out / name).unlink(missing_ok=True)
    (out / name).symlink_to(secret)
    results = tmp_path / "results"
    rc = main(["import", str(out), "--row", ROW, "--run-id", "r", "--results", str(results)])
    _, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "link" in err, err
    assert not (results / "r" / ROW).exists()


def test_a_malformed_candidate_sha_is_one_line_and_files_nothing_outside(tmp_path, capsys):
    out = write_box(tmp_path / "box", h200_record())
    inv = json.loads((out / "invocation.json").read_text())
    inv["patch"] = {"sha256": "../../../" + "x" * 55, "files": ["a.py"], "draft_phase": None}
    (out / "invocation.json").write_text(json.dumps(inv))
    results = tmp_path / "results"
    rc = main(["import", str(out), "--row", ROW, "--run-id", "r", "--results", str(results)])
    _, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "sha256" in err
    assert not list(tmp_path.glob("**/row.json"))


def _failing_with(run: Path, message: str) -> None:
    """Fail the record's first smoke check with ``message`` in every file that says its outcome."""
    from evidence_records import write_junit

    row = run / ROW
    rec = read_json(row / "row.json")
    chk = rec["tiers"]["smoke"]["checks"][0]
    chk.update(outcome="failed", failure={"kind": "mismatch", "type": "CheckFailure", "message": message})
    atomic_write_json(row / "row.json", rec)
    tiers = read_json(row / "tiers.json")
    tiers["tiers"]["smoke"]["checks"][0].update(outcome="failed", failure=chk["failure"])
    atomic_write_json(row / "tiers.json", tiers)
    write_junit(row / "junit.xml", [c for t in rec["tiers"].values() for c in t["checks"]])


def _lines(md: str) -> list[str]:
    """Lines as CommonMark reads them: \\r\\n, \\r and \\n each end one."""
    return md.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def test_record_text_cannot_forge_a_heading_in_markdown_or_html(h200_run, tmp_path, monkeypatch, capsys):
    results, run = h200_run
    _failing_with(run, FORGED)
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    rc, _out, _err = report(results, "h200", capsys=capsys)
    assert rc == 1
    for md in ((run / "report" / "summary.md").read_text(), step.read_text()):
        assert not [ln for ln in _lines(md) if ln.lstrip().startswith("#") and "QUALIFIES" in ln]
        assert "<h1>" not in md and "\r" not in md
        assert "boom # ✅ QUALIFIES \\<h1\\>✅ QUALIFIES\\</h1\\>" in md  # shown, escaped
    html = (run / "report" / "report.html").read_text()
    assert "<h1>✅ QUALIFIES" not in html and "&lt;h1&gt;✅ QUALIFIES&lt;/h1&gt;" in html


# --- 6: I/O and parse faults ----------------------------------------------------------------------------------------


def test_an_unwritable_report_folder_is_one_line_exit_2(h200_run, tmp_path, capsys):
    results, _run = h200_run
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc, _out, err = report(results, "h200", "--out", str(blocker / "report"), capsys=capsys)
    assert rc == 2 and one_line_error(err)


def test_a_full_disk_is_one_line_exit_2(h200_run, monkeypatch, capsys):
    import errno

    from mtpmatrix.core import atomic

    results, _run = h200_run

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(atomic, "atomic_write_bytes", full)
    rc, _out, err = report(results, "h200", capsys=capsys)
    assert rc == 2 and one_line_error(err) and "No space left" in err


def test_an_unwritable_step_summary_is_one_line_exit_2(h200_run, tmp_path, monkeypatch, capsys):
    results, _run = h200_run
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no-such-folder" / "step.md"))
    rc, _out, err = report(results, "h200", capsys=capsys)
    assert rc == 2 and one_line_error(err) and "GITHUB_STEP_SUMMARY" in err


def test_deeply_nested_json_in_a_record_is_unreadable_exit_3(h200_run, capsys):
    results, run = h200_run
    (run / ROW / "row.json").write_text("[" * 200_000 + "]" * 200_000)
    rc, out, err = report(results, "h200", capsys=capsys)
    assert rc == 3 and "unreadable" in out and "Traceback" not in err


def test_deeply_nested_json_in_a_manifest_is_not_proven(h200_run, capsys):
    results, run = h200_run
    (run / "manifest.json").write_text('{"rows": ' + "[" * 200_000 + "]" * 200_000 + "}")
    rc, out, err = report(results, "h200", capsys=capsys)
    assert rc == 3 and "manifest.json" in out and "Traceback" not in err


def test_a_freeze_txt_that_is_not_utf8_is_no_fault(h200_run, capsys):
    results, run = h200_run
    (run / ROW / "freeze.txt").write_bytes(b"sglang==0.5.17\n\xff\xfebroken==1\n")
    rc, out, err = report(results, "h200", capsys=capsys)
    assert rc == 0 and "smoke proven" in out and not err


def test_a_candidate_with_a_sha_that_is_not_text_is_not_proven(h200_run, capsys):
    results, run = h200_run
    rec = read_json(run / ROW / "row.json")
    rec["candidate"] = {"kind": "patch", "sha256": 12345, "files": [], "base_row": ROW}
    atomic_write_json(run / ROW / "row.json", rec)
    plan = read_json(run / "manifest.json")  # the plan names the same candidate: only its shape is off
    plan["rows"][ROW]["candidate"] = manifest.candidate_identity(rec["candidate"])
    atomic_write_json(run / "manifest.json", plan)
    rc, out, err = report(results, "h200", capsys=capsys)
    assert rc == 3 and "candidate" in out and "Traceback" not in err


def test_an_unexpected_fault_never_reads_as_a_broken_release(monkeypatch, capsys):
    """Exit 1 is sglang's: whatever else goes wrong in a command exits 2 with one line."""
    from mtpmatrix.report import cli

    def broken(ns):
        raise PermissionError(13, "Permission denied", "/results/x")

    monkeypatch.setattr(cli, "run", broken)
    assert main(["report"]) == 2
    assert one_line_error(capsys.readouterr().err)

    def bug(ns):
        raise KeyError("tiers")

    monkeypatch.setattr(cli, "run", bug)
    assert main(["report"]) == 2  # a bug of this tool is no verdict on sglang either
    assert "error: internal error" in capsys.readouterr().err


# --- 7: concurrent imports ------------------------------------------------------------------------------------------


def test_two_writers_of_one_manifest_keep_both_rows(tmp_path, monkeypatch):
    """Import A has read the manifest when import B plans its row: B waits for A's write, then adds to it."""
    run = tmp_path / "run"
    run.mkdir()
    a_read, b_at_the_door = threading.Event(), threading.Event()
    real_read = manifest._read_file

    def read_then_pause(f):
        data = real_read(f)
        if threading.current_thread().name == "A":
            a_read.set()
            assert b_at_the_door.wait(60)
        return data

    real_lock = getattr(manifest, "_locked", None)

    def lock_then_signal(run_dir):
        if threading.current_thread().name == "B":
            b_at_the_door.set()  # B is about to wait for A's lock
        return real_lock(run_dir)

    monkeypatch.setattr(manifest, "_read_file", read_then_pause)
    monkeypatch.setattr(manifest, "_locked", lock_then_signal, raising=False)
    fp = {"suite": "s"}

    def ensure(rid):
        manifest.ensure(run, "run", {rid: {"pins": {}}}, {"argv": ["import", rid]}, fp)

    a = threading.Thread(target=ensure, args=("row-a",), name="A")
    a.start()
    assert a_read.wait(60)
    b = threading.Thread(target=ensure, args=("row-b",), name="B")
    b.start()
    if real_lock is None:  # no lock at all: B writes while A still holds what it read
        b.join(60)
        b_at_the_door.set()
    a.join(60)
    b.join(60)
    assert sorted(read_json(run / "manifest.json")["rows"]) == ["row-a", "row-b"]


# --- 8: one judged run per report -----------------------------------------------------------------------------------


def _with_canary(run: Path) -> None:
    """A canary row beside the H200 row, its stored verdict 'passed' but its record from another run."""
    rec = read_json(run / ROW / "row.json")
    rec["run_id"] = "another-run"
    rec["canary"] = {"id": "c", "mode": "canary-override", "from": ROW, "moved": {}, "resolved": {}}
    shutil.copytree(run / ROW, run / "c")
    rec["row"]["id"] = "c"
    atomic_write_json(run / "c" / "row.json", rec)


def test_the_canary_section_shows_the_judged_verdict_and_the_index_is_never_asked(h200_run, monkeypatch):
    from mtpmatrix.runner import index

    asked = []
    monkeypatch.setattr(index, "releases", lambda name, *a, **k: asked.append(name) or [])
    results, run = h200_run
    _with_canary(run)
    summary, paths_ = write_report(results, "h200")
    table = {r["id"]: r["verdict"] for r in summary["rows"]}
    assert table["c"] == "not-proven"
    shown = {c["id"]: c["verdict"] for c in summary["canaries"]["canaries"]}
    assert shown == {"c": table["c"]}
    assert json.loads(paths_["json"].read_text())["canaries"]["canaries"][0]["verdict"] == "not-proven"
    assert asked == []  # the report is offline


def test_gsm8k_question_records_are_read_once_per_report(results, monkeypatch):
    """The judge checks a row's counts against its per-question records; the table, the pairing across rows and
    the baseline comparison show them: one reading of each file for all of them."""
    opened: list[str] = []

    def counting_open(path, *a, **k):
        opened.append(str(path))
        return open(path, *a, **k)

    monkeypatch.setattr(store, "open", counting_open, raising=False)  # where the question files are read
    write_report(results, "20261208-090507", baseline="20261201-090512")
    jsonl = [p for p in opened if p.endswith(".jsonl")]
    assert jsonl and len(jsonl) == len(set(jsonl)), sorted(jsonl)
