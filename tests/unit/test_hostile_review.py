"""An adversarial review of issue #39's evidence rules (docs/runs/2026-12-04-cpu-hostile-review.md): each case the
real H200 smoke record (evidence_records.h200_record) bent one way the earlier audits did not list -- a pass that
still carries its failure, a Python that only starts like the row's, a known-upstream entry that matches any
failure, a box clock in the future, a checkout with no git, a run folder that is a link, a path with a newline, a
logs.tgz that brings its own junit.xml, a GPU count that is no number -- and what the import and report must say."""

from __future__ import annotations

import functools
import io
import json
import tarfile
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.__main__ import main
from mtpmatrix.core import known_upstream, store
from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.evidence import checkout
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary
from mtpmatrix.runner import importer

ROW = H200_ROW
CUSTOM = "custom-logit-processor"  # a smoke check the H200 record fails (known upstream for 0.5.17)


def judged(tmp_path: Path, data: dict, run: str = "r") -> dict:
    out = write_box(tmp_path / f"out-{run}", data)
    importer.import_run(out, ROW, results=tmp_path / "results", run_id=run)
    return report_summary.build_summary(tmp_path / "results" / run, require=["smoke"])


def whys(summary: dict) -> list[str]:
    return [p["what"] for p in summary["evidence"]["rows"].get(ROW, [])]


def one_line_error(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_a_check_recorded_passed_that_carries_its_failure_is_not_proven(tmp_path):
    data = h200_record()
    flipped = [c for c in data["tiers"]["smoke"]["checks"] if CUSTOM in c["id"] and c["outcome"] == "failed"]
    assert flipped and all(c.get("failure") for c in flipped)
    for c in flipped:  # the outcome flipped by hand, tiers.json and junit.xml alike; the failure left in
        c["outcome"] = "passed"
    s = judged(tmp_path, data)
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert any("recorded passed, yet carries a mismatch failure" in w for w in whys(s))


@pytest.mark.parametrize("python", ["3.12.3rc1", "3.12.x; 3.11", "3.120.1"])
def test_a_python_that_is_not_a_release_of_the_row_s_is_not_proven(tmp_path, python):
    data = h200_record()
    data["build"]["python"] = python
    s = judged(tmp_path, data)
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert f"Python {python} ran, the row is Python 3.12" in whys(s)


def test_the_h200_python_still_proves_its_row(tmp_path):
    s = judged(tmp_path, h200_record())  # Python 3.12.3
    assert s["exit_status"] == report_summary.EXIT_OK, report_render.headline(s)


@pytest.mark.parametrize("match", [".*", "raised at", ":", "x*"])
def test_a_known_upstream_entry_that_matches_any_failure_is_refused(tmp_path, match):
    listed = json.loads(known_upstream.FILE.read_text())
    listed["issues"].append(
        {
            "id": "too-broad",
            "package": "sglang",
            "affected": "<=0.5.17",
            "tier": "smoke",
            "component": "sglang",
            "kind": "crash",
            "match": match,
            "checks": ["test_server_serves"],
            "summary": "an excuse for any crash of the server",
            "upstream": "https://example.invalid",
        }
    )
    f = tmp_path / "known_upstream.json"
    f.write_text(json.dumps(listed))
    with pytest.raises(ValueError, match="too-broad.*matches a failure with no words"):
        known_upstream.load(f)


def test_the_committed_known_upstream_list_still_loads():
    assert len(known_upstream.load()) == len(json.loads(known_upstream.FILE.read_text())["issues"])


def _failing(data: dict) -> dict:
    c = data["tiers"]["smoke"]["checks"][0]
    c["outcome"] = "failed"
    c["failure"] = {"kind": "crash", "type": "RuntimeError", "message": "server died", "frame": None}
    return data


def test_a_box_clock_in_the_future_does_not_make_its_run_the_latest(tmp_path, capsys):
    results = tmp_path / "results"
    ahead = write_box(tmp_path / "ahead", h200_record())
    (ahead / "env.txt").write_text("2100-01-01T00:00:00Z\nNVIDIA H200, 143771 MiB, 580.159.04\n")
    importer.import_run(ahead, ROW, results=results, run_id="skewed")
    today = write_box(tmp_path / "today", _failing(h200_record()))  # env.txt: 2026-12-01, as write_box has it
    importer.import_run(today, ROW, results=results, run_id="today")
    assert store.latest_run_id(results) == "today"
    rc = main(["report", "--results", str(results), "--require", "smoke"])
    assert rc == 1 and "DOES NOT QUALIFY" in capsys.readouterr().out


def test_a_checkout_with_no_git_vouches_for_nothing_and_proves_nothing(h200_run, tmp_path, monkeypatch):
    _results, run = h200_run
    tarball = tmp_path / "tarball"  # git archive | tar -x: the files, no history; no distribution installed them
    tarball.mkdir()
    monkeypatch.setattr(checkout, "state", functools.partial(checkout.state, tarball))
    s = report_summary.build_summary(run, require=["smoke"])
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert "judged by a checkout with no git commit and no installed distribution" in report_render.headline(s)


def test_a_git_checkout_says_nothing_of_it(h200_run):
    _results, run = h200_run
    s = report_summary.build_summary(run, require=["smoke"])
    assert "no git commit" not in report_render.headline(s)


def test_a_run_folder_that_is_a_link_is_refused(h200_run, tmp_path, capsys):
    results, run = h200_run
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "r").symlink_to(run)  # results/r -> a run folder elsewhere
    rc = main(["report", "r", "--results", str(linked), "--require", "smoke"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "is a link" in err
    assert not (run / "report").exists()  # nothing written through the link
    assert store.latest_run_id(linked) is None  # nor taken for the latest run


def test_an_import_error_naming_a_path_with_a_newline_is_one_line(tmp_path, capsys):
    out = write_box(tmp_path / "bo\nx", h200_record())
    (out / "junit.xml").unlink()
    rc = main(["import", str(out), "--row", ROW, "--results", str(tmp_path / "results"), "--run-id", "r"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err), err


def test_logs_tgz_cannot_stand_in_for_out_s_own_files(tmp_path):
    out = write_box(tmp_path / "box", h200_record())
    junit = (out / "junit.xml").read_bytes()
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        for name, body in (("junit.xml", b"<testsuites/>"), ("pytest.log", b"forged\n"), ("server-x.log", b"ok\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    dest, _record = importer.import_run(out, ROW, results=tmp_path / "results", run_id="r")
    assert (dest / "junit.xml").read_bytes() == junit
    assert (dest / "pytest.log").read_text() == "61 passed\n"
    assert (dest / "server-x.log").read_text() == "ok\n"  # the work folder's logs still come in


@pytest.mark.parametrize("gpus", [float("nan"), True, "1", -1])
def test_import_refuses_a_gpu_count_that_is_not_a_whole_number(tmp_path, gpus):
    data = h200_record()
    data["gpus"] = gpus
    out = write_box(tmp_path / "box", data)
    with pytest.raises(importer.ImportInputError, match="'gpus' is .* not a whole number"):
        importer.import_run(out, ROW, results=tmp_path / "results", run_id="r")
    assert not (tmp_path / "results" / "r" / ROW).exists()


def test_a_row_json_edited_to_a_future_finish_is_not_the_latest(h200_run, tmp_path):
    results, run = h200_run
    f = run / ROW / "row.json"
    rec = read_json(f)
    rec["finished"] = "2100-01-01T00:00:00+00:00"
    atomic_write_json(f, rec)
    assert store.run_time(run) is not None and store.run_time(run).year < 2100


@pytest.mark.parametrize("run_id", [" h200", "h200 ", "h\u200b200", "\u202eh200", "h200\u2028"])
def test_a_run_id_that_prints_as_another_is_refused(tmp_path, capsys, run_id):
    out = write_box(tmp_path / "box", h200_record())
    rc = main(["import", str(out), "--row", ROW, "--results", str(tmp_path / "results"), "--run-id", run_id])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "is not one folder name" in err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_sglang_variable_in_the_session_s_environment_is_recorded_and_not_proven(tmp_path, monkeypatch):
    from mtpmatrix.tiers.session import plugin

    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "0")  # the servers inherit it: another speculative path is served

    class Config:  # what plugin.selection reads of a session's config
        class invocation_params:  # noqa: N801
            args = ("--tiers", "smoke")

        args: list[str] = []
        stash: dict = {}

        @staticmethod
        def getoption(name, default=None):
            return default

    sel = plugin.selection(Config)
    assert sel["sglang_env"] == {"SGLANG_ENABLE_SPEC_V2": "0"}
    data = h200_record()
    data["selection"]["sglang_env"] = sel["sglang_env"]
    s = judged(tmp_path, data)
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert any("SGLANG_ENABLE_SPEC_V2=0: sglang reads it" in w for w in whys(s))


def test_import_names_a_broken_known_upstream_list_not_the_box_s_tiers_json(tmp_path, monkeypatch, capsys):
    listed = json.loads(known_upstream.FILE.read_text())
    listed["issues"][0]["match"] = ".*"
    broken = tmp_path / "known_upstream.json"
    broken.write_text(json.dumps(listed))
    monkeypatch.setattr(known_upstream, "FILE", broken)
    out = write_box(tmp_path / "box", h200_record())
    rc = main(["import", str(out), "--row", ROW, "--results", str(tmp_path / "results"), "--run-id", "r"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err), err
    assert err.startswith("error: the known upstream list: ") and "tiers.json" not in err


@pytest.mark.parametrize("tier", ["smoke", "gsm8k"])
def test_a_gpu_tier_passed_on_a_torch_without_cuda_is_not_proven(tmp_path, tier):
    data = h200_record()
    data["build"].update(torch="2.11.0", torch_cuda=None)  # review case 13: a torch built without CUDA
    if tier == "gsm8k":  # the smoke checks stay as the H200 ran them; one gsm8k check passed beside them
        data["tiers"]["gsm8k"] = {"checks": [{"id": "tests/tiers/test_gsm8k.py::test_x", "outcome": "passed"}]}
    s = judged(tmp_path, data)
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert f"{tier} passed on torch 2.11.0, built without CUDA: a GPU tier cannot pass there" in whys(s)


def test_the_h200_torch_with_cuda_proves_its_gpu_tier(tmp_path):
    s = judged(tmp_path, h200_record())  # torch 2.11.0+cu130, CUDA 13.0
    assert not any("built without CUDA" in w for w in whys(s))


def test_a_gsm8k_check_served_by_a_server_url_needs_no_cuda_in_the_session(tmp_path):
    data = h200_record()
    data["build"].update(torch="2.11.0", torch_cuda=None)
    del data["tiers"]["smoke"]  # only the client ran here: its GPU work was the --server-url server's
    served = {"url": "http://gpu:30000", "version": "0.5.17", "tp_size": 1}
    check = {"id": "tests/tiers/test_gsm8k.py::test_x", "outcome": "passed", "metrics": {"served": served}}
    data["tiers"]["gsm8k"] = {"checks": [check]}
    assert not any("built without CUDA" in w for w in whys(judged(tmp_path, data)))


def test_a_tier_required_twice_is_named_once(h200_run, capsys):
    results, run = h200_run
    assert main(["report", run.name, "--results", str(results), "--require", "smoke,smoke"]) == 0
    out = capsys.readouterr().out
    assert "smoke proven" in out and "smoke and smoke" not in out, out


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:  # a hole: no disk used, every byte NUL
        fh.truncate(size)


OVER = 32 * 2**20 + 1  # atomic.MAX_RECORD_BYTES: 100 x the largest real record (the H200's 330 KB tiers.json)


@pytest.mark.parametrize("name", ["tiers.json", "junit.xml", "invocation.json"])
def test_import_refuses_a_box_file_over_the_record_limit_unread(tmp_path, capsys, name):
    out = write_box(tmp_path / "box", h200_record())
    _sparse(out / name, OVER)
    rc = main(["import", str(out), "--row", ROW, "--results", str(tmp_path / "results"), "--run-id", "r"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err), err
    assert f"{name}: 32.0 MiB, over the 32 MiB a record file may be" in err


def test_import_refuses_a_per_question_record_over_the_limit_in_logs_tgz(tmp_path, capsys):
    out = write_box(tmp_path / "box", h200_record())
    big = tmp_path / "big.jsonl"
    _sparse(big, OVER)
    with tarfile.open(out / "logs.tgz", "w:gz") as tar:
        tar.add(big, arcname="gsm8k/E4B-topk1.jsonl")
    rc = main(["import", str(out), "--row", ROW, "--results", str(tmp_path / "results"), "--run-id", "r"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err) and "gsm8k/E4B-topk1.jsonl is 32.0 MiB, over the 32 MiB" in err, err
    assert not (tmp_path / "results" / "r" / ROW).exists()


@pytest.mark.parametrize("name", ["row.json", "tiers.json", "junit.xml"])
def test_report_refuses_a_run_holding_a_record_over_the_limit_unread(h200_run, capsys, name):
    results, run = h200_run
    _sparse(run / ROW / name, OVER)
    rc = main(["report", run.name, "--results", str(results), "--require", "smoke"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err), err
    assert f"{name}: 32.0 MiB, over the 32 MiB a record file may be" in err and not (run / "report").exists()


@pytest.mark.parametrize("name", ["row.json", "tiers.json"])
@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_report_refuses_a_record_that_is_no_regular_file_unread(h200_run, capsys, name, special):
    """A record linked to /dev/zero stats as 0 bytes and reads forever (it was read until memory ran out, then a
    traceback), and a FIFO blocks its reader (the report hung): refused in one line, exit 2, before reading it."""
    import os

    results, run = h200_run
    record = run / ROW / name
    record.unlink()
    if special == "fifo":
        os.mkfifo(record)
    else:
        record.symlink_to(special)
    rc = main(["report", run.name, "--results", str(results), "--require", "smoke"])
    _out, err = capsys.readouterr()
    assert rc == 2 and one_line_error(err), err
    assert f"{name}: not a regular file" in err and not (run / "report").exists(), err
