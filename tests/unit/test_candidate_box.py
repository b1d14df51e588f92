"""A candidate patch on a GPU box: the fault-injection hook serves it at import (MTPMATRIX_PATCH), gpu_box.sh checks it
and records its sha256 (PATCH=FILE), and ``import`` files the run as the candidate, refusing a run that did not
serve it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.__main__ import main
from mtpmatrix.core import schema
from mtpmatrix.core.evidence import judge
from mtpmatrix.faults.mutation import HOOK_DIR
from mtpmatrix.runner import importer

REPO = Path(__file__).resolve().parents[2]
PATCH = """Serve a changed constant.

Draft-Phase: +1

--- a/python/sglang/srt/x.py
+++ b/python/sglang/srt/x.py
@@ -1,2 +1,2 @@
 A = 1
-B = 2
+B = 20
"""
SHA = hashlib.sha256(PATCH.encode()).hexdigest()


@pytest.fixture
def site(tmp_path) -> Path:
    """A site folder with a stand-in sglang whose sglang/srt/x.py the patch changes."""
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "x.py").write_text("A = 1\nB = 2\n")
    return site


@pytest.fixture
def patch_file(tmp_path) -> Path:
    f = tmp_path / "fix.patch"
    f.write_text(PATCH)
    return f


def served(site: Path, **env) -> subprocess.CompletedProcess:
    """``import sglang.srt.x`` in a python with the hook first on its path and ``env``; prints B."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}
    full.update(PYTHONPATH=f"{HOOK_DIR}{os.pathsep}{site}", **env)
    return subprocess.run(
        [sys.executable, "-c", "import sglang.srt.x as x; print(x.B)"],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_hook_serves_the_patched_module(site, patch_file):
    done = served(site, MTPMATRIX_PATCH=str(patch_file), MTPMATRIX_PATCH_SHA256=SHA)
    assert done.stdout.strip() == "20"
    assert f"mtpmatrix-mutant: patch-{SHA[:7]} serves patched sglang.srt.x" in done.stderr
    assert (site / "sglang" / "srt" / "x.py").read_text() == "A = 1\nB = 2\n"  # the installed file as it was


def test_the_hook_serves_nothing_for_another_file_or_a_hunk_that_does_not_apply(site, patch_file):
    other = served(site, MTPMATRIX_PATCH=str(patch_file), MTPMATRIX_PATCH_SHA256="0" * 64)
    assert other.stdout.strip() == "2" and "NOT applied" in other.stderr and "sha256" in other.stderr
    (site / "sglang" / "srt" / "x.py").write_text("A = 1\nB = 3\n")
    moved = served(site, MTPMATRIX_PATCH=str(patch_file))
    assert moved.stdout.strip() == "3"
    assert "NOT applied: MTPMATRIX_PATCH=" in moved.stderr and "sglang/srt/x.py: hunk 1" in moved.stderr


def run_gpu_box(out: Path, site: Path, *args: str, **env) -> subprocess.CompletedProcess:
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BUNDLE", "SITE", "TESTS", "GPU_BOX_TIMEOUT", "PATCH", "DRAFT_PHASE")
        and not k.startswith("MTPMATRIX_")
    }
    full.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(site), **env
    )
    return subprocess.run(
        ["bash", str(REPO / "tools" / "gpu_box.sh"), str(out), *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gpu_box_records_the_patch_it_serves(tmp_path, site, patch_file):
    out = tmp_path / "box"
    done = run_gpu_box(out, site, "--no-such-option", PATCH=str(patch_file))  # pytest's usage error: quick
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    invocation = json.loads((out / schema.INVOCATION_FILE).read_text())
    assert invocation["patch"] == {
        "path": str(patch_file),
        "sha256": SHA,
        "files": ["sglang/srt/x.py"],
        "draft_phase": 1,
        "warnings": [],
    }
    assert invocation["knobs"]["MTPMATRIX_PATCH_SHA256"] == SHA
    assert invocation["knobs"]["MTPMATRIX_DRAFT_PHASE"] == "+1"
    assert f"candidate: {patch_file} (sha256 {SHA}) served at import" in (out / schema.ENV_FILE).read_text()


def test_gpu_box_stops_in_one_line_on_a_patch_that_does_not_apply(tmp_path, site, patch_file):
    (site / "sglang" / "srt" / "x.py").write_text("A = 1\nB = 3\n")
    done = run_gpu_box(tmp_path / "box", site, PATCH=str(patch_file))
    assert done.returncode == 2
    assert done.stderr.strip().startswith(
        "gpu_box.sh: PATCH=fix.patch: sglang/srt/x.py: hunk 1 (@@ -1,2 +1,2 @@) does not apply: line 2 is 'B = 3'"
    )
    assert done.stderr.strip().count("\n") == 0 and not (tmp_path / "box" / schema.PYTEST_LOG).exists()


def box_with_patch(out: Path, sha: str = SHA, knobs_sha: str = SHA, log: str = "61 passed\n") -> Path:
    knobs = {"MTPMATRIX_PATCH": "/box/fix.patch", "MTPMATRIX_PATCH_SHA256": knobs_sha, "MTPMATRIX_DRAFT_PHASE": "+1"}
    write_box(out, h200_record(), knobs=knobs)
    invocation = json.loads((out / schema.INVOCATION_FILE).read_text())
    invocation["patch"] = {"path": "/box/fix.patch", "sha256": sha, "files": ["sglang/srt/x.py"], "draft_phase": 1}
    (out / schema.INVOCATION_FILE).write_text(json.dumps(invocation))
    (out / schema.PYTEST_LOG).write_text(log)
    return out


def test_import_files_the_box_run_as_the_candidate(tmp_path):
    results = tmp_path / "results"
    dest, record = importer.import_run(box_with_patch(tmp_path / "box"), H200_ROW, results=results, run_id="cand")
    rid = f"{H200_ROW}+patch-{SHA[:7]}"
    assert dest == results / "cand" / rid and record["row"]["id"] == rid
    assert record["candidate"] == {
        "kind": "patch",
        "path": "/box/fix.patch",
        "sha256": SHA,
        "files": ["sglang/srt/x.py"],
        "base_row": H200_ROW,
        "draft_phase": 1,
    }
    plan = json.loads((results / "cand" / "manifest.json").read_text())
    assert plan["rows"][rid]["candidate"]["sha256"] == SHA
    # its patch and declared phase are the candidate's identity: nothing in the settings for the judge to hold
    found = judge.judge_row(rid, json.loads((dest / "row.json").read_text()), run_id="cand", manifest=plan)
    assert not [p for p in found if "MTPMATRIX" in p["what"] or "candidate" in p["what"]], found


@pytest.mark.parametrize(
    "box_kw, words",
    [
        ({"knobs_sha": "cd" * 32}, "its suite ran with MTPMATRIX_PATCH_SHA256=cdcdcdcdcdcd"),
        (
            {"log": "mtpmatrix-mutant: NOT applied: MTPMATRIX_PATCH=/box/fix.patch: sglang/srt/x.py: hunk 1 (pid 7)\n"},
            "the patch was not served (pytest.log: mtpmatrix-mutant: NOT applied",
        ),
    ],
)
def test_import_refuses_a_run_that_did_not_serve_its_patch(tmp_path, capsys, box_kw, words):
    out = box_with_patch(tmp_path / "box", **box_kw)
    assert main(["import", str(out), "--row", H200_ROW, "--results", str(tmp_path / "r"), "--run-id", "x"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list((tmp_path / "r" / "x").glob("sglang-*"))
