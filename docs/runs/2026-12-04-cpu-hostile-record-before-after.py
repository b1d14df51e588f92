"""Before/after table for issue #39 classes 1-3 (2026-12-04-cpu-hostile-record-before-after.md): each scenario built
from the real H200 record (tests/unit/evidence_records.py of this checkout), filed with `python -m mtpmatrix import`
and judged with `python -m mtpmatrix report --require smoke` in a committed copy of TREE (a `git archive` of the
commit to judge with). Prints one JSON line per scenario.

    python docs/runs/2026-12-04-cpu-hostile-record-before-after.py TREE [SCENARIO INDEX ...]
"""
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path

TREE = Path(sys.argv[1]).resolve()
HERE = Path(__file__).resolve().parents[2]  # this checkout: its record builders and the row the box ran
BRANCH_TESTS = HERE / "tests" / "unit"
PY = sys.executable
KNOWN = "src/mtpmatrix/core/known_upstream.json"
EXPECTED = "src/mtpmatrix/core/expected_checks.json"
ROW = "sglang-0.5.17-py312"


def git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def checkout(tmp):
    repo = Path(tmp) / "checkout"
    shutil.copytree(TREE, repo, ignore=shutil.ignore_patterns("__pycache__", ".git", ".nox", "results"))
    shutil.copy2(HERE / "constraints" / f"{ROW}.txt", repo / "constraints")
    git(repo, "init", "-q"); git(repo, "add", "-A"); git(repo, "commit", "-qm", "base")
    return repo


def env(repo):
    e = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}
    e["PYTHONPATH"] = f"{repo}/src:{BRANCH_TESTS}"
    return e


MUTATE = r'''
import json, sys
from pathlib import Path
from evidence_records import h200_record, write_box
data = h200_record()
exec(sys.argv[2])
write_box(Path(sys.argv[1]), data)
'''


def box(repo, out, mutation="pass"):
    subprocess.run([PY, "-c", MUTATE, str(out), mutation], cwd=repo, env=env(repo), check=True, capture_output=True)


def mtp(repo, *args):
    done = subprocess.run([PY, "-m", "mtpmatrix", *args], cwd=repo, env=env(repo), capture_output=True, text=True)
    first = (done.stdout.splitlines() or done.stderr.splitlines() or [""])[0]
    return done.returncode, first


def run(name, mutation="pass", rows=(ROW,), before_import=None, after_import=None):
    with tempfile.TemporaryDirectory() as tmp:
        repo = checkout(tmp)
        if before_import:
            before_import(repo)
        out, results = Path(tmp) / "box", Path(tmp) / "results"
        box(repo, out, mutation)
        for row in rows:
            rc, line = mtp(repo, "import", str(out), "--row", row, "--results", str(results), "--run-id", "r")
            if rc:
                return name, f"import {rc}: {line}"
        if after_import:
            after_import(repo)
        rc, line = mtp(repo, "report", "r", "--results", str(results), "--require", "smoke")
        return name, f"report {rc}: {line}"


def drop_phase_entry_committed(repo):
    listing = json.loads((repo / KNOWN).read_text())
    (repo / "known.orig").write_text(json.dumps(listing, indent=1) + "\n")
    listing["issues"] = [e for e in listing["issues"] if e["id"] != "sglang-gemma4-mtp-draft-rope-phase"]
    (repo / KNOWN).write_text(json.dumps(listing, indent=1) + "\n")
    git(repo, "commit", "-qam", "no draft-phase entry")


def restore_phase_entry_uncommitted(repo):
    (repo / KNOWN).write_text((repo / "known.orig").read_text())


def drop_last_expected_smoke(repo):
    d = json.loads((repo / EXPECTED).read_text())
    d["tiers"]["smoke"] = d["tiers"]["smoke"][:-1]
    (repo / EXPECTED).write_text(json.dumps(d, indent=1) + "\n")


def lower_threshold(repo):
    f = repo / "src/mtpmatrix/core/settings.py"
    f.write_text(f.read_text().replace("MIN_ACCEPT_LENGTH = 1.5", "MIN_ACCEPT_LENGTH = 1.0", 1))


PLUGIN = 'data["pytest"]["plugins"].append({"name": "evil_plugin", "module": "evil_plugin", "dist": None, "version": None}); '
SCENARIOS = [
    ("untampered, filed as sglang-0.5.17-py312 (the row it ran)", {}),
    ("1 a plugin loaded through PYTEST_ADDOPTS=-p evil_plugin",
     {"mutation": PLUGIN + 'data["pytest"]["env_addopts"] = "-p evil_plugin"'}),
    ("1 pytest-rerunfailures 15.1 loaded",
     {"mutation": 'data["pytest"]["plugins"].append({"name": "rerunfailures", "module": "pytest_rerunfailures", "dist": "pytest-rerunfailures", "version": "15.1"})'}),
    ("1 a conftest.py at the checkout root loaded",
     {"mutation": 'data["pytest"]["conftests"].append("conftest.py")'}),
    ("1 a root conftest.py added to the judging checkout after the import",
     {"after_import": lambda r: (r / "conftest.py").write_text("import pytest\n")}),
    ("1 addopts '-p evil_plugin' added to pyproject.toml after the import",
     {"after_import": lambda r: (r / "pyproject.toml").write_text((r / "pyproject.toml").read_text().replace('addopts = "-ra --strict-markers"', 'addopts = "-ra --strict-markers -p evil_plugin"'))}),
    ("1 -o addopts= on the command line", {"mutation": 'data["pytest"]["override_ini"] = ["addopts="]'}),
    ("1 a check passed after 1 rerun",
     {"mutation": 'next(c for c in data["tiers"]["smoke"]["checks"] if c["outcome"] == "passed")["reruns"] = 1'}),
    ("1 smoke on a box with 0 GPUs", {"mutation": 'data.update(gpus=0, gpu_names=[])'}),
    ("2 filed as sglang-0.5.17 (Python 3.11)", {"rows": ("sglang-0.5.17",)}),
    ("2 filed as sglang-0.5.17-cu128", {"rows": ("sglang-0.5.17-cu128",)}),
    ("2 one OUT filed as sglang-0.5.17-py312 and sglang-0.5.17", {"rows": (ROW, "sglang-0.5.17")}),
    ("3 the draft-phase entry added to known_upstream.json after the import, not committed",
     {"before_import": drop_phase_entry_committed, "after_import": restore_phase_entry_uncommitted}),
    ("3 a smoke check dropped from expected_checks.json, not committed (the box ran that checkout)",
     {"before_import": drop_last_expected_smoke}),
    ("3 MIN_ACCEPT_LENGTH lowered in settings.py, not committed (the box ran that checkout)",
     {"before_import": lower_threshold}),
]

only = sys.argv[2:] or None
for i, (name, kw) in enumerate(SCENARIOS):
    if only and str(i) not in only:
        continue
    name, result = run(name, **kw)
    print(json.dumps({"scenario": name, "result": result}), flush=True)
