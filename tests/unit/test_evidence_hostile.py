"""Evidence on a hostile day (issue #39, classes 1-3): what can change an outcome is recorded and judged, a row is
bound to the build that ran it, and the judging checkout's uncommitted verdict-deciding files are named and never
excuse a failure. Each record case is the real H200 smoke record (evidence_records.h200_record), filed through
``import`` and judged by the report; each printed "smoke proven" (exit 0) before these rules."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from evidence_records import H200_ROW, h200_record, write_box

from mtpmatrix.core.evidence import expected_checks, fingerprint
from mtpmatrix.core.paths import REPO, SUITE
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary
from mtpmatrix.runner import importer
from mtpmatrix.serving import environment

pytest_plugins = ["pytester"]


def judged(tmp_path, data, row=H200_ROW, run="r1", **box) -> dict:
    out = write_box(tmp_path / f"out-{len(list(tmp_path.iterdir()))}", data, **box)
    importer.import_run(out, row, results=tmp_path / "results", run_id=run)
    return report_summary.build_summary(tmp_path / "results" / run, require=["smoke"])


def whys(summary: dict, row: str = H200_ROW) -> list[str]:
    return [p["what"] for p in summary["evidence"]["rows"].get(row, [])]


def test_the_h200_record_proves_the_row_it_ran(tmp_path):
    s = judged(tmp_path, h200_record())
    headline = report_render.headline(s)
    assert (s["verdict"], s["exit_status"]) == ("required-proven", report_summary.EXIT_OK), headline
    assert "smoke proven in all 1 rows" in headline
    # the row's identity as it ran: the torch build, Python and platform
    assert (
        f"{H200_ROW}: sglang 0.5.17, transformers 5.12.1, torch 2.11.0+cu130 (CUDA 13.0), Python 3.12.3, " in headline
    )
    assert "linux-x86_64" in headline


# ---------------------------------------------------------------------------------------------------------------
# class 1: what ran is recorded whole
# ---------------------------------------------------------------------------------------------------------------


def _with(change):
    def make():
        data = h200_record()
        change(data)
        return data

    return make


def _plugin(dist, name="evil", module="evil_plugin"):
    return lambda d: d["pytest"]["plugins"].append({"name": name, "module": module, "dist": dist, "version": "1.0"})


def _set_pytest(key, value):
    return lambda d: d["pytest"].update({key: value})


def _rerun(d):
    chk = next(c for c in d["tiers"]["smoke"]["checks"] if c["outcome"] == "passed")
    chk["reruns"] = 1


HOSTILE = {
    "a plugin loaded through PYTEST_ADDOPTS": (
        lambda d: (_plugin(None)(d), _set_pytest("env_addopts", "-p evil_plugin")(d)),
        ["pytest plugin evil (evil_plugin) loaded", "PYTEST_ADDOPTS='-p evil_plugin'"],
    ),
    "pytest-rerunfailures loaded": (
        _plugin("pytest-rerunfailures", "rerunfailures", "pytest_rerunfailures"),
        ["pytest plugin rerunfailures (pytest-rerunfailures 1.0) loaded"],
    ),
    "a conftest.py at the checkout root": (
        lambda d: d["pytest"]["conftests"].append("conftest.py"),
        ["conftest.py loaded: not one of the suite's files"],
    ),
    "a pytest config other than pyproject.toml": (
        _set_pytest("inifile", "/tmp/other/pytest.ini"),
        ["pytest read its config from /tmp/other/pytest.ini, not the suite's pyproject.toml"],
    ),
    "-o overriding the config": (
        _set_pytest("override_ini", ["addopts=-p evil_plugin"]),
        ["pytest ran with -o addopts=-p evil_plugin"],
    ),
    "--runxfail": (_set_pytest("runxfail", True), ["pytest ran with --runxfail"]),
    "no record of plugins and options": (
        lambda d: d.pop("pytest"),
        ["the record does not say which pytest plugins, options and conftest files ran"],
    ),
    "smoke on a box with 0 GPUs": (lambda d: d.update(gpus=0, gpu_names=[]), ["smoke passed on a box with 0 GPU(s)"]),
    "a pass after a rerun": (_rerun, ["passed after 1 rerun(s): a pass after a rerun is not a pass"]),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_what_can_change_an_outcome_is_judged(tmp_path, case):
    change, expected = HOSTILE[case]
    s = judged(tmp_path, _with(change)())
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    found = " | ".join(whys(s))
    for text in expected:
        assert text in found, found


def test_the_plugins_the_h200_box_loaded_cannot_turn_a_failure_into_a_pass():
    """The allowance for the device's own plugins holds only while the suite uses none of their features."""
    text = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if "unit" not in p.parts)
    for feature in ("anyio", "hypothesis", "mocker", "benchmark", "pytest.mark.timeout", "xdist"):
        assert feature not in text, f"tests/tiers uses {feature}: its plugin is no longer inert"


def _tree(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / SUITE).mkdir(parents=True)
    (repo / SUITE / "test_x.py").write_text("def test_x():\n    pass\n")
    (repo / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = "-ra --strict-markers"\n\n[tool.ruff]\nline-length = 120\n'
    )
    return repo


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: (r / "conftest.py").write_text("import pytest\n"),
        lambda r: (r / "pytest.ini").write_text("[pytest]\naddopts = -p evil\n"),
        lambda r: (r / "pyproject.toml").write_text(
            (r / "pyproject.toml").read_text().replace("--strict-markers", "--strict-markers -p evil")
        ),
    ],
    ids=["root conftest.py", "pytest.ini", "addopts in pyproject.toml"],
)
def test_root_conftest_and_pytest_config_are_in_the_fingerprint(tmp_path, edit):
    repo = _tree(tmp_path)
    before = fingerprint.suite_hash(repo)
    edit(repo)
    assert fingerprint.suite_hash(repo) != before


def test_a_pyproject_edit_outside_pytest_s_table_is_not_the_suite(tmp_path):
    repo = _tree(tmp_path)
    before = fingerprint.suite_hash(repo)
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text().replace("120", "100"))
    assert fingerprint.suite_hash(repo) == before


RERUN_PLUGIN = """\
from _pytest.runner import runtestprotocol


def pytest_runtest_protocol(item, nextitem):
    # what pytest-rerunfailures does: run a failed test again, report only the last attempt as the outcome
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for attempt in range(3):
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        if all(r.passed or r.skipped for r in reports):
            break
    for r in reports:
        item.ihook.pytest_runtest_logreport(report=r)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
"""

FLAKY = """\
import pathlib

import pytest


@pytest.mark.contract
def test_flaky(tmp_path_factory):
    mark = pathlib.Path(__file__).with_name("ran-once")
    if not mark.exists():
        mark.write_text("x")
        assert False, "first attempt fails"


@pytest.mark.contract
def test_steady():
    pass
"""


@pytest.fixture
def plugin_session(pytester, monkeypatch):
    """``run(*args, env_addopts=None) -> tiers.json``: a real pytest session with the mtpmatrix plugin."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makeconftest('pytest_plugins = ["mtpmatrix.tiers.session.plugin"]\n')
    pytester.syspathinsert()
    monkeypatch.setattr(environment, "gpu_count", lambda: 0)
    monkeypatch.setattr(environment, "tier_unavailable", lambda tier: None)
    monkeypatch.setenv(expected_checks.ENV, expected_checks.AS_COLLECTED)

    def run(*args: str, env_addopts: str | None = None) -> dict:
        if env_addopts is not None:
            monkeypatch.setenv("PYTEST_ADDOPTS", env_addopts)
        out = pytester.path / "row" / "tiers.json"
        pytester.runpytest("--mtp-results", str(out), *args)
        return json.loads(out.read_text())

    return run


def test_a_pass_after_a_rerun_is_recorded_as_the_failure_it_was(plugin_session, pytester):
    pytester.makepyfile(rerun_plugin=RERUN_PLUGIN, test_flaky=FLAKY)
    data = plugin_session("-p", "rerun_plugin")
    checks = {c["id"].split("::")[1]: c for c in data["tiers"]["contract"]["checks"]}
    assert checks["test_flaky"]["outcome"] == "failed"
    assert checks["test_flaky"]["reruns"] == 1
    assert "first attempt fails" in checks["test_flaky"]["failure"]["message"]
    assert checks["test_steady"]["outcome"] == "passed" and "reruns" not in checks["test_steady"]
    assert data["tiers"]["contract"]["verdict"] == "failed"


def test_the_session_records_plugins_options_conftests_and_its_build(plugin_session, pytester):
    # a class registered as a plugin is named by its own module (the H200 record of 2026-12-05 said "builtins")
    registers_a_class = (
        "class Hooks:\n    pass\n\ndef pytest_configure(config):\n    config.pluginmanager.register(Hooks)\n"
    )
    pytester.makepyfile(extra_plugin=registers_a_class, test_flaky=FLAKY)
    data = plugin_session(env_addopts="-p extra_plugin")
    rec = data["pytest"]
    assert rec["env_addopts"] == "-p extra_plugin"
    assert rec["inifile"] == "tox.ini"
    assert rec["ini_addopts"] == ["-p", "no:cacheprovider"]
    assert "conftest.py" in rec["conftests"]
    assert {"name": "extra_plugin", "module": "extra_plugin", "dist": None, "version": None} in rec["plugins"]
    assert not [p for p in rec["plugins"] if p["module"] == "builtins"], rec["plugins"]
    assert not [p for p in rec["plugins"] if p["module"].startswith(("_pytest", "mtpmatrix"))]
    assert data["build"]["python"] == platform.python_version()
    assert data["build"]["platform"]
    assert data["gpu_names"] == []
    assert len(data["session_id"]) == 32


def test_an_override_is_the_command_line_s_not_what_the_config_implies(plugin_session, pytester):
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider --strict-markers\n")
    pytester.makepyfile(test_flaky=FLAKY)
    assert plugin_session()["pytest"]["override_ini"] == []
    assert plugin_session("-o", "xfail_strict=false")["pytest"]["override_ini"] == ["xfail_strict=false"]


SETS_A_VARIABLE_AS_IT_RUNS = """\
import os

import pytest


@pytest.mark.contract
def test_imports_a_library_that_sets_a_variable():
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = "/tmp/set-by-a-library"  # as importing sglang does
"""


def test_the_session_records_the_torch_cuda_nccl_variables_it_started_with(plugin_session, pytester, monkeypatch):
    pytester.makepyfile(test_sets=SETS_A_VARIABLE_AS_IT_RUNS)
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # the box's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # never recorded: no prefix torch, CUDA or NCCL reads
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # absent when the session starts; restored after
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    sel = plugin_session()["selection"]
    assert sel["torch_env"] == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_ALGO": "Tree"}
    assert "hf_secret" not in json.dumps(sel)


@pytest.mark.parametrize(
    ("variables", "why"),
    [
        ({"NCCL_ALGO": "Tree"}, "NCCL_ALGO=Tree: torch, CUDA, NCCL or Triton read it"),
        ({"NVIDIA_TF32_OVERRIDE": "0"}, "NVIDIA_TF32_OVERRIDE=0: torch, CUDA, NCCL or Triton read it"),
        ({"TORCH_CUDA_ARCH_LIST": "8.0"}, "TORCH_CUDA_ARCH_LIST=8.0: torch, CUDA, NCCL or Triton read it"),
        ({"TORCH_CUDA_ARCH_LIST": "8.0;9.0a"}, "TORCH_CUDA_ARCH_LIST=8.0;9.0a: torch, CUDA, NCCL or Triton read it"),
        ({"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "TRITON_CACHE_DIR": "/c"}, None),
        # what the lent H200's image sets (its record of 2026-12-05): the H200's own architecture, NCCL's label
        ({"TORCH_CUDA_ARCH_LIST": "9.0a", "NCCL_VERSION": "2.28.3-1"}, None),
    ],
)
def test_a_torch_cuda_or_nccl_variable_that_can_change_numbers_is_not_proven(tmp_path, variables, why):
    data = h200_record()
    data["selection"]["torch_env"] = variables
    s = judged(tmp_path, data)
    if why is None:  # only places or watches things: the H200 record still proves its row
        assert s["exit_status"] == report_summary.EXIT_OK, report_render.headline(s)
    else:
        assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
        assert any(why in w for w in whys(s)), whys(s)


def test_the_h200_images_arch_list_is_judged_against_the_gpus_that_ran():
    from mtpmatrix.core.evidence.environment import arch_list_is_the_gpus

    assert arch_list_is_the_gpus("9.0a", ["NVIDIA H200"] * 2) and arch_list_is_the_gpus(
        "9.0+PTX", ["NVIDIA H100 80GB HBM3"]
    )
    assert not arch_list_is_the_gpus("9.0a", ["NVIDIA A100-SXM4-80GB"])  # another GPU: another architecture
    assert not arch_list_is_the_gpus("9.0a", []) and not arch_list_is_the_gpus("9.0a", ["Tesla T4"])  # unknown
    assert not arch_list_is_the_gpus("9.0a", ["NVIDIA H200", "NVIDIA A100-SXM4-80GB"])  # two architectures


def test_jaxtyping_proves_nothing_only_when_its_options_are_off(tmp_path):
    data = h200_record()
    plugin = {"name": "jaxtyping", "module": "jaxtyping._pytest_plugin", "dist": "jaxtyping", "version": "0.3.11"}
    data["pytest"]["plugins"] = [*data["pytest"]["plugins"], plugin]
    data["pytest"].setdefault("options", {})["jaxtyping_packages"] = None
    assert judged(tmp_path, data)["exit_status"] == report_summary.EXIT_OK
    data["pytest"]["options"]["jaxtyping_packages"] = "mtpmatrix,beartype.beartype"
    s = judged(tmp_path, data, run="r2")
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN
    assert any("pytest ran with jaxtyping_packages" in w for w in whys(s)), whys(s)


def test_a_torch_env_that_is_not_an_object_is_refused_at_import(tmp_path):
    data = h200_record()
    data["selection"]["torch_env"] = "NCCL_ALGO=Tree"
    with pytest.raises(importer.ImportInputError, match="'selection.torch_env' is not an object"):
        importer.import_run(write_box(tmp_path / "box", data), H200_ROW, results=tmp_path / "results", run_id="r")


# ---------------------------------------------------------------------------------------------------------------
# class 2: a row is bound to its build
# ---------------------------------------------------------------------------------------------------------------


def test_a_python_3_12_record_does_not_prove_the_python_3_11_row(tmp_path):
    s = judged(tmp_path, h200_record(), row="sglang-0.5.17")
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert "Python 3.12.3 ran, the row is Python 3.11" in whys(s, "sglang-0.5.17")


def test_pypi_s_cuda_13_torch_does_not_prove_the_cu128_row(tmp_path):
    s = judged(tmp_path, h200_record(), row="sglang-0.5.17-cu128")
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    found = whys(s, "sglang-0.5.17-cu128")
    assert "torch 2.11.0 is PyPI's build (CUDA 13.0), the row's is cu128" in found, found


def test_a_local_torch_build_is_not_pypi_s(tmp_path):
    data = h200_record()
    data["versions"]["torch"] = "2.11.0+cu128"
    data["build"].update(torch="2.11.0+cu128", torch_cuda="12.8")
    s = judged(tmp_path, data)
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN, report_render.headline(s)
    assert "torch 2.11.0+cu128 is not PyPI's build, the row's is PyPI's" in " | ".join(whys(s))


def test_one_invocation_proves_one_row(tmp_path):
    out = write_box(tmp_path / "box", h200_record())
    results = tmp_path / "results"
    importer.import_run(out, H200_ROW, results=results, run_id="r1")
    importer.import_run(out, "sglang-0.5.17", results=results, run_id="r1")
    s = report_summary.build_summary(results / "r1", require=["smoke"])
    assert s["exit_status"] == report_summary.EXIT_NOT_PROVEN
    assert any("also filed as sglang-0.5.17: one session proves one row" in w for w in whys(s)), whys(s)


# ---------------------------------------------------------------------------------------------------------------
# class 3: the judging checkout against its commit
# ---------------------------------------------------------------------------------------------------------------

KNOWN = "src/mtpmatrix/core/known_upstream.json"
EXPECTED = "src/mtpmatrix/core/expected_checks.json"
DRAFT_PHASE_ENTRY = "sglang-gemma4-mtp-draft-rope-phase"


def _git(repo: Path, *args: str) -> str:
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git checkout of this tree's suite, runner and rows, committed: the judging checkout of the cases below."""
    repo = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("src", SUITE, "constraints"):
        shutil.copytree(REPO / folder, repo / folder, ignore=ignore)
    for f in ("tests/conftest.py", "pyproject.toml"):
        shutil.copy2(REPO / f, repo / f)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    return repo


def _mtpmatrix(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}
    env["PYTHONPATH"] = str(repo / "src")
    return subprocess.run(
        [sys.executable, "-m", "mtpmatrix", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )


def _describe(repo: Path) -> dict:
    """The checkout's fingerprint as a session run from it records it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}
    env["PYTHONPATH"] = str(repo / "src")
    code = "import json; from mtpmatrix.core.evidence import fingerprint; print(json.dumps(fingerprint.describe()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def _import_and_report(tmp_path: Path, repo: Path, data: dict, edit=None) -> tuple[subprocess.CompletedProcess, str]:
    box = write_box(tmp_path / "box", data)
    results = tmp_path / "results"
    done = _mtpmatrix(repo, "import", str(box), "--row", H200_ROW, "--results", str(results), "--run-id", "r")
    assert done.returncode == 0, done.stderr
    if edit is not None:
        edit()
    report = _mtpmatrix(repo, "report", "r", "--results", str(results), "--require", "smoke")
    return report, report.stdout.splitlines()[0] if report.stdout else report.stderr


def test_an_uncommitted_known_upstream_entry_does_not_excuse_a_failure(tmp_path, checkout):
    listing = json.loads((checkout / KNOWN).read_text())
    committed = dict(listing, issues=[e for e in listing["issues"] if e["id"] != DRAFT_PHASE_ENTRY])
    (checkout / KNOWN).write_text(json.dumps(committed, indent=1) + "\n")
    _git(checkout, "commit", "-qam", "the draft-phase entry not (yet) listed")
    data = h200_record()
    data["fingerprint"] = _describe(checkout)
    # the excuse, added in the judging checkout after the import, never committed
    report, headline = _import_and_report(
        tmp_path, checkout, data, edit=lambda: (checkout / KNOWN).write_text(json.dumps(listing, indent=1) + "\n")
    )
    assert report.returncode == report_summary.EXIT_FAILED, headline
    commit = _git(checkout, "rev-parse", "HEAD").strip()[:9]
    assert f"judged by commit {commit} with uncommitted {KNOWN} (its committed list applied)" in headline, headline


def test_an_uncommitted_edit_to_the_expected_checks_is_named_in_the_headline(tmp_path, checkout):
    definition = json.loads((checkout / EXPECTED).read_text())
    definition["tiers"]["smoke"] = definition["tiers"]["smoke"][:-1]
    (checkout / EXPECTED).write_text(json.dumps(definition, indent=1) + "\n")
    data = h200_record()
    data["fingerprint"] = _describe(checkout)  # the box ran the same edited checkout
    report, headline = _import_and_report(tmp_path, checkout, data)
    commit = _git(checkout, "rev-parse", "HEAD").strip()[:9]
    assert f"judged by commit {commit} with uncommitted {EXPECTED}" in headline, headline
    assert f"the run's suite: commit {commit} with uncommitted {EXPECTED}" in headline, headline


def test_an_uncommitted_edit_to_the_judges_own_code_is_named_in_the_headline(tmp_path, checkout):
    # the report's summary and the evidence rules decide every verdict at report time, though no box runs them:
    # a judgement by uncommitted judge code says so (the suite's fingerprint, which the box records, leaves it out)
    data = h200_record()
    data["fingerprint"] = _describe(checkout)
    judge = "src/mtpmatrix/report/summary.py"
    report, headline = _import_and_report(
        tmp_path, checkout, data, edit=lambda: (checkout / judge).write_text((checkout / judge).read_text() + "\n")
    )
    commit = _git(checkout, "rev-parse", "HEAD").strip()[:9]
    assert f"judged by commit {commit} with uncommitted {judge}" in headline, headline
    assert "the run's suite:" not in headline, headline  # the box's suite is not what changed
