"""runner/candidate.py: a candidate sglang (--patch, --sglang WHEEL|CHECKOUT) as a row: its id and record, its bad
input in one line before anything installs, its install command, the patch applied to the installed files (never
through uv's hard links), and the run's plan under the candidate's id."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from mtpmatrix.core import paths
from mtpmatrix.core.rows import RowError, load_rows, parse_row
from mtpmatrix.runner import candidate, matrix, plan, uv_install, venvs
from mtpmatrix.runner.row_run import RowRun

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "docs" / "candidates" / "sglang-0.5.17-draft-phase-fix.patch"
ORIGINAL = "".join(f"line {i}\n" for i in range(1, 11))
PATCH = """--- a/python/sglang/srt/x.py
+++ b/python/sglang/srt/x.py
@@ -4,3 +4,3 @@
 line 4
-line 5
+line five
 line 6
"""


def one_line(call, *args, **kwargs) -> str:
    with pytest.raises(RowError) as info:
        call(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture
def patch_file(tmp_path) -> Path:
    f = tmp_path / "fix.patch"
    f.write_text(PATCH)
    return f


@pytest.fixture
def row(tmp_path):
    p = tmp_path / "sglang-0.5.17.txt"
    p.write_text("# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n")
    return parse_row(p)


# --- identity ----------------------------------------------------------------------------------------------------


def test_a_patch_is_filed_under_the_row_and_its_sha7(patch_file, row):
    cand = candidate.from_options(str(patch_file), None, None)
    assert cand.sha256 == __import__("hashlib").sha256(PATCH.encode()).hexdigest()
    filed = candidate.for_row(cand, row)
    assert filed.id == f"sglang-0.5.17+patch-{cand.sha256[:7]}" and filed.pins == row.pins
    assert cand.record(row.id) == {
        "kind": "patch",
        "path": str(patch_file),
        "sha256": cand.sha256,
        "base_row": "sglang-0.5.17",
        "files": ["sglang/srt/x.py"],
    }
    assert candidate.filed_id(row.id, None) == row.id


def test_the_fix_patch_declares_its_draft_phase():
    cand = candidate.from_options(str(FIX), None, None)
    assert cand.draft_phase == 1 and cand.files == (
        "sglang/srt/models/gemma4_mtp.py",
        "sglang/srt/speculative/frozen_kv_mtp_utils.py",
    )
    assert candidate.suite_env(cand) == {"MTPMATRIX_DRAFT_PHASE": "+1"}
    assert candidate.from_options(str(FIX), None, "+1").draft_phase == 1
    assert "declares Draft-Phase: +1" in one_line(candidate.from_options, str(FIX), None, "-1")


def _git(folder: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(folder), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True, capture_output=True
    )


@pytest.fixture
def checkout(tmp_path) -> Path:
    root = tmp_path / "sglang"
    (root / "python" / "sglang").mkdir(parents=True)
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.18.dev0"\n')
    (root / "python" / "sglang" / "__init__.py").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "x")
    return root


def test_a_checkout_is_filed_under_its_commit_and_says_when_dirty(checkout, row):
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    cand = candidate.from_options(None, str(checkout), None)
    assert (cand.kind, cand.commit, cand.dirty, cand.version, cand.sha256) == (
        "checkout",
        head.strip(),
        False,
        "0.5.18.dev0",
        None,
    )
    assert cand.path == str(checkout / "python")
    assert candidate.for_row(cand, row).id == f"sglang-0.5.17+checkout-{head[:7]}"
    (checkout / "python" / "sglang" / "__init__.py").write_text("x = 1\n")
    dirty = candidate.from_options(None, str(checkout), None)
    assert dirty.dirty and candidate.for_row(dirty, row).id.endswith(f"{head[:7]}-dirty") and dirty.sha256


def test_a_wheel_is_filed_under_its_sha7_and_names_its_version(tmp_path, row):
    wheel = tmp_path / "sglang-0.5.18.dev0-py3-none-any.whl"
    wheel.write_bytes(b"not really a zip")
    cand = candidate.from_options(None, str(wheel), None)
    assert (cand.kind, cand.version) == ("wheel", "0.5.18.dev0")
    assert candidate.for_row(cand, row).id == f"sglang-0.5.17+wheel-{cand.sha256[:7]}"


# --- bad input, before anything installs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, words",
    [
        ("sglang-0.5.18-cp312-cp312-manylinux_2_34_x86_64.whl", "not for sglang-0.5.17's Python 3.11"),
        ("sglang-0.5.18-cp311-cp311-macosx_14_0_arm64.whl", "not for sglang-0.5.17's Python 3.11"),
    ],
)
def test_a_wheel_for_another_python_or_platform_is_one_line(tmp_path, row, name, words):
    wheel = tmp_path / name
    wheel.write_bytes(b"x")
    cand = candidate.from_options(None, str(wheel), None)
    assert words in one_line(candidate.for_row, cand, row)


def test_a_wheel_for_the_rows_python_fits(tmp_path, row):
    wheel = tmp_path / "sglang-0.5.18-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"x")
    assert candidate.for_row(candidate.from_options(None, str(wheel), None), row).id.startswith(row.id + "+wheel-")


def test_bad_input_is_one_line(tmp_path, patch_file, checkout):
    other = tmp_path / "other"
    (other / "python").mkdir(parents=True)
    (other / "python" / "pyproject.toml").write_text('[project]\nname = "vllm"\n')
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "pyproject.toml").write_text('[project]\nname = "sglang"\ndynamic = ["version"]\n')
    not_sglang = tmp_path / "torch-2.11.0-py3-none-any.whl"
    not_sglang.write_bytes(b"x")
    outside = tmp_path / "outside.patch"
    outside.write_text(PATCH.replace("python/sglang/srt/x.py", "python/other/x.py"))
    cases = [
        ((str(patch_file), str(checkout), None), "--patch and --sglang each name a candidate"),
        ((None, None, "+1"), "--draft-phase declares a candidate's draft phase"),
        ((str(tmp_path / "missing.patch"), None, None), "--patch"),
        ((str(outside), None, None), "python/other/x.py: not a file of sglang"),
        ((str(patch_file), None, "one"), "not a whole number"),
        ((str(patch_file), None, "+7"), "outside -3..+3"),
        ((None, str(other), None), "not an sglang checkout"),
        ((None, str(plain), None), "not a git checkout"),
        ((None, str(not_sglang), None), "a wheel of torch, not of sglang"),
        ((None, str(tmp_path / "nothing-here"), None), "neither a wheel file (.whl) nor a folder"),
    ]
    for args, words in cases:
        assert words in one_line(candidate.from_options, *args), args
    assert "both replace the row's sglang" in one_line(
        candidate.from_options, str(patch_file), None, None, ["sglang==0.5.18"]
    )


def test_parse_options_reads_the_candidate(patch_file):
    assert matrix.parse_options(["--patch", str(patch_file)]).candidate.kind == "patch"
    assert matrix.parse_options([]).candidate is None
    srt = _write(patch_file.with_name("srt.patch"), PATCH.replace("python/sglang/srt", "srt"))
    assert "srt/x.py: not a file of sglang" in one_line(matrix.parse_options, ["--patch", str(srt)])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_patch_that_touches_nothing_the_tiers_run_warns(tmp_path):
    readme = _write(tmp_path / "readme.patch", PATCH.replace("srt/x.py", "README.md"))
    cand = candidate.from_options(str(readme), None, None)
    assert len(cand.warnings) == 1 and "touches nothing under sglang/srt/ (sglang/README.md)" in cand.warnings[0]
    assert candidate.from_options(str(FIX), None, None).warnings == ()


# --- the install ----------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_uv(monkeypatch):
    monkeypatch.setattr(venvs.shutil, "which", lambda name: "/opt/bin/uv" if name == "uv" else None)


def test_a_wheel_or_checkout_replaces_the_sglang_pin_and_nothing_else(tmp_path, row, checkout, fake_uv):
    cand = candidate.from_options(None, str(checkout), None)
    cmd = matrix.install_command(row, tmp_path / "v", tmp_path / "c.txt", None, [], cand)
    assert cmd[-7:] == [
        str(checkout / "python"),
        "transformers==5.12.1",
        "torch==2.11.0",
        "--reinstall-package",
        "sglang",
        "-e",
        str(paths.REPO),
    ]
    text = matrix.constraints_text(row, [], cand)
    assert "# sglang==0.5.17  (dropped: the candidate replaces it)" in text and "\ntransformers==5.12.1" in text
    patch = candidate.from_options(str(FIX), None, None)  # a patch keeps the pinned release
    assert "sglang==0.5.17" in matrix.install_command(row, tmp_path / "v", tmp_path / "c.txt", None, [], patch)
    assert "\nsglang==0.5.17" in matrix.constraints_text(row, [], patch)


@pytest.fixture
def site(tmp_path) -> Path:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "sglang" / "srt" / "__pycache__").mkdir(parents=True)
    return site


def test_the_patch_replaces_the_installed_file_never_the_linked_copy(tmp_path, patch_file, site):
    cached = tmp_path / "uv-cache-copy.py"  # uv installs each file as a hard link to its copy in uv's cache
    cached.write_text(ORIGINAL)
    os.link(cached, site / "sglang" / "srt" / "x.py")
    stale = site / "sglang" / "srt" / "__pycache__" / "x.cpython-311.pyc"
    stale.write_bytes(b"compiled from the unpatched source")
    cand = candidate.from_options(str(patch_file), None, None)
    assert candidate.apply_to(cand, site, log=lambda m: None) == ["sglang/srt/x.py"]
    assert (site / "sglang" / "srt" / "x.py").read_text() == ORIGINAL.replace("line 5\n", "line five\n")
    assert cached.read_text() == ORIGINAL  # the cache (and every venv linked to it) untouched
    assert not stale.exists()


def test_a_hunk_that_does_not_apply_names_the_file_and_hunk_and_writes_nothing(tmp_path, site):
    (site / "sglang" / "srt" / "x.py").write_text(ORIGINAL)
    (site / "sglang" / "srt" / "y.py").write_text(ORIGINAL.replace("line 5\n", "line 5 (changed upstream)\n"))
    two = _write(tmp_path / "two.patch", PATCH + PATCH.replace("x.py", "y.py"))
    cand = candidate.from_options(str(two), None, None)
    msg = one_line(candidate.apply_to, cand, site, log=lambda m: None)
    assert msg.startswith("--patch two.patch: sglang/srt/y.py: hunk 1 (@@ -4,3 +4,3 @@) does not apply: line 5 is")
    assert (site / "sglang" / "srt" / "x.py").read_text() == ORIGINAL  # checked first, then written


def _fake_uv_script(tmp_path: Path) -> Path:
    uv = tmp_path / "uv"
    uv.write_text(
        "#!/bin/sh\n"
        'case "$2" in freeze) printf "sglang==0.5.17\\ntransformers==5.12.1\\ntorch==2.11.0\\n";; esac\n'
        '[ "$1" = cache ] && exit 1\nexit 0\n'
    )
    uv.chmod(0o755)
    return uv


def test_a_row_whose_patch_does_not_apply_leaves_no_record(tmp_path, site, monkeypatch):
    """run_row's wiring: the install succeeds, the patch does not apply to what it installed: one RowError line,
    and no row.json (the session marks the planned candidate row as not run, with that line)."""
    (site / "sglang" / "srt" / "x.py").write_text(ORIGINAL.replace("line 5\n", "other\n"))
    monkeypatch.setattr(uv_install, "find_uv", lambda: str(_fake_uv_script(tmp_path)))
    monkeypatch.setattr(RowRun, "suite", lambda *a, **k: pytest.fail("the suite ran on an unpatched sglang"))
    row = load_rows(REPO / "constraints")[0]
    opts = matrix.Options(
        results=tmp_path / "results",
        run_id="r",
        tiers="contract",
        candidate=candidate.from_options(str(_write(tmp_path / "p.patch", PATCH)), None, None),
    )
    msg = one_line(matrix.run_row, row, tmp_path / "venv", opts, log=lambda m: None)
    assert "sglang/srt/x.py: hunk 1" in msg
    folder = tmp_path / "results" / "r" / opts.candidate.row_id(row.id)
    assert (folder / "install.log").is_file() and not (folder / "row.json").exists()


def test_a_patched_row_records_its_candidate_and_the_files_applied(tmp_path, site, monkeypatch):
    (site / "sglang" / "srt" / "x.py").write_text(ORIGINAL)
    monkeypatch.setattr(uv_install, "find_uv", lambda: str(_fake_uv_script(tmp_path)))
    seen = {}

    def suite(run):
        seen["text"] = (site / "sglang" / "srt" / "x.py").read_text()
        return run.finish()

    monkeypatch.setattr(RowRun, "suite", suite)
    row = load_rows(REPO / "constraints")[0]
    cand = candidate.from_options(str(_write(tmp_path / "p.patch", PATCH)), None, "+1")
    record = matrix.run_row(
        row,
        tmp_path / "venv",
        matrix.Options(results=tmp_path / "results", run_id="r", tiers="contract", candidate=cand),
        log=lambda m: None,
    )
    assert "line five" in seen["text"]
    assert record["row"]["id"] == cand.row_id(row.id) and record["row"]["pins"] == row.pins
    assert record["candidate"] == dict(cand.record(row.id), applied=["sglang/srt/x.py"])
    saved = json.loads((tmp_path / "results" / "r" / cand.row_id(row.id) / "row.json").read_text())
    assert saved["candidate"]["draft_phase"] == 1


# --- the run's plan ---------------------------------------------------------------------------------------------------


def test_the_plan_names_each_row_as_its_candidate(patch_file, tmp_path):
    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    cand = candidate.from_options(str(patch_file), None, None)
    planned = plan.planned(rows, ["sglang-0.5.13", "sglang-0.5.17"], cand)
    assert set(planned) == {f"sglang-0.5.13+{cand.suffix}", f"sglang-0.5.17+{cand.suffix}"}
    assert planned[f"sglang-0.5.17+{cand.suffix}"]["candidate"] == {
        "kind": "patch",
        "sha256": cand.sha256,
        "commit": None,
        "dirty": None,
    }
    assert planned[f"sglang-0.5.17+{cand.suffix}"]["pins"] == rows["sglang-0.5.17"].pins
    assert "candidate" not in plan.planned(rows, ["sglang-0.5.17"])["sglang-0.5.17"]


def test_a_candidate_installs_into_a_venv_of_its_own(tmp_path, patch_file, row, monkeypatch):
    """The row's nox venv keeps its pinned release, and the candidate's is one folder down: a patched sglang where a
    row's release is looked for (the mutants' unit tests glob .nox/*sglang-0?5?*) would be read as the release."""
    from mtpmatrix.runner import venvs

    made = []

    def make_venv(r, venv, error):
        venv.mkdir(parents=True)
        made.append((r.id, venv))
        return venv

    monkeypatch.setattr(venvs, "make_venv", make_venv)
    nox_venv = tmp_path / ".nox" / "gemma4_mtp-sglang-0-5-17"
    assert candidate.own_venv(None, row, nox_venv, tmp_path / ".nox") == nox_venv and not made
    cand = candidate.from_options(str(patch_file), None, None)
    venv = candidate.own_venv(cand, row, nox_venv, tmp_path / ".nox")
    assert venv == tmp_path / ".nox" / "candidates" / f"sglang-0.5.17+{cand.suffix}" and made == [(row.id, venv)]
    assert not list((tmp_path / ".nox").glob("*sglang-0?5?*"))  # where a row's release is looked for

    def refuse(r, venv, error):
        raise error("cannot create a Python 3.11 venv for row sglang-0.5.17: no interpreter")

    monkeypatch.setattr(venvs, "make_venv", refuse)
    assert "no interpreter" in one_line(candidate.own_venv, cand, row, nox_venv, tmp_path / ".nox")


def test_resume_runs_a_dirty_checkout_again_once_its_change_changed(tmp_path, checkout):
    """A dirty checkout keeps its id (commit + -dirty) while its change moves: --resume must not keep the record of
    another change (the plan's candidate identity holds the change's sha256)."""
    from mtpmatrix.core.atomic import atomic_write_json
    from mtpmatrix.core.evidence import fingerprint

    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    (checkout / "python" / "sglang" / "__init__.py").write_text("x = 1\n")
    first = candidate.from_options(None, str(checkout), None)
    rid = first.row_id("sglang-0.5.17")
    opts = matrix.Options(run_id="r", results=tmp_path / "results", candidate=first)
    assert plan.start(opts, rid, plan.planned(rows, ["sglang-0.5.17"], first)) is None
    atomic_write_json(
        tmp_path / "results" / "r" / rid / "row.json",
        {"row": {"id": rid}, "verdict": "passed", "fingerprint": fingerprint.describe()},
    )
    resumed = matrix.Options(run_id="r", results=tmp_path / "results", resume=True, candidate=first)
    assert "already has a verdict" in plan.start(resumed, rid, plan.planned(rows, ["sglang-0.5.17"], first))
    (checkout / "python" / "sglang" / "__init__.py").write_text("x = 2\n")
    second = candidate.from_options(None, str(checkout), None)
    assert second.row_id("sglang-0.5.17") == rid and second.sha256 != first.sha256
    assert plan.start(resumed, rid, plan.planned(rows, ["sglang-0.5.17"], second)) is None


def test_bytecode_compiled_from_the_unpatched_copy_is_never_run(tmp_path, site):
    """The install-time workers (runner/bytecode_from_cache.py) compile uv's cached copy -- the unpatched release --
    into the suite's bytecode folder while the row installs. They write checked hash-based pycs, so once the patch
    replaces the venv's file, Python's hash check refuses that bytecode and compiles the patched source."""
    import sys

    from mtpmatrix.runner import bytecode_from_cache

    for part in ("sglang/__init__.py", "sglang/srt/__init__.py"):
        (site / part).write_text("")
    cached = tmp_path / "uv-cache-copy.py"
    cached.write_text("B = 'unpatched'\n" + ORIGINAL.replace("line", "# line"))
    os.link(cached, site / "sglang" / "srt" / "x.py")
    prefix = tmp_path / "pyc"
    was, sys.pycache_prefix = sys.pycache_prefix, str(prefix)
    try:
        assert bytecode_from_cache.compile_one("sglang/srt/x.py", str(cached), str(site))
    finally:
        sys.pycache_prefix = was
    assert list(prefix.rglob("x.*.pyc"))
    fix = _write(
        tmp_path / "b.patch",
        "--- a/sglang/srt/x.py\n+++ b/sglang/srt/x.py\n@@ -1 +1 @@\n-B = 'unpatched'\n+B = 'patched'\n",
    )
    candidate.apply_to(candidate.from_options(str(fix), None, None), site, log=lambda m: None)
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", "import sglang.srt.x as x; print(x.B)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "patched"
