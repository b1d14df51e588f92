"""matrix.py: session options (--with, --resume, --shard, pass-through to pytest), the install command, sharding."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.core import paths
from mtpmatrix.core.rows import RowError, load_rows, parse_row
from mtpmatrix.core.schema import TIERS
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import index, matrix, venvs
from mtpmatrix.runner.matrix import Options, in_shard, install_command, parse_options, preflight_overrides

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("MTPMATRIX_RUN_ID", "MTPMATRIX_RESULTS_ROOT", "MTPMATRIX_TIERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)  # a stray ./results of the checkout must not leak into --resume


def one_line_error(args) -> str:
    with pytest.raises(RowError) as info:
        parse_options(args)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


# --- parse_options -------------------------------------------------------------------------------------------


def test_defaults():
    o = parse_options([])
    assert o == Options(
        overrides=[],
        run_id=None,
        resume=False,
        results=Path("results"),
        tiers=",".join(TIERS),
        shard=None,
        pytest_args=[],
        offline_check=False,
    )


def test_env_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("MTPMATRIX_RUN_ID", "from-env")
    monkeypatch.setenv("MTPMATRIX_RESULTS_ROOT", str(tmp_path / "r"))
    monkeypatch.setenv("MTPMATRIX_TIERS", "contract")
    o = parse_options([])
    assert (o.run_id, o.results, o.tiers) == ("from-env", tmp_path / "r", "contract")
    assert parse_options(["--run-id", "cli"]).run_id == "cli"  # the command line wins


def test_with_is_repeatable_and_validated():
    o = parse_options(["--with", "transformers==5.20.0", "--with", "flashinfer-python>=0.4,<0.5"])
    assert o.overrides == ["transformers==5.20.0", "flashinfer-python>=0.4,<0.5"]
    assert "give a version" in one_line_error(["--with", "transformers"])
    assert "not a requirement" in one_line_error(["--with", "transformers=5.20"])
    assert "markers are not supported" in one_line_error(["--with", "torch==2.11.0; python_version<'3.12'"])
    assert "expected one argument" in one_line_error(["--with"])


def test_tiers_validated():
    assert parse_options(["--tiers", "contract,reference"]).tiers == "contract,reference"
    assert "unknown tier(s) gpu" in one_line_error(["--tiers", "contract,gpu"])
    # read as the pytest plugin reads them (stripped, empty items dropped), and at least one is needed
    assert parse_options(["--tiers", " contract, reference,"]).tiers == "contract,reference"
    assert "no tier given" in one_line_error(["--tiers", ","])


def test_resume_latest(tmp_path):
    results = tmp_path / "res"
    assert "no earlier run" in one_line_error(["--resume", "--results", str(results)])
    RunStore(results, "20260101-000000").save_row("a", {"verdict": "passed"})
    RunStore(results, "20260102-000000").save_row("a", {"verdict": "pending"})
    o = parse_options(["--resume", "--results", str(results)])
    assert (o.resume, o.run_id) == (True, "20260102-000000")
    # an explicit --run-id is what gets resumed
    assert (
        parse_options(["--resume", "--run-id", "20260101-000000", "--results", str(results)]).run_id
        == "20260101-000000"
    )


def test_resume_explicit(tmp_path):
    o = parse_options(["--resume", "20251231-235959", "--results", str(tmp_path)])  # need not exist yet
    assert (o.resume, o.run_id) == (True, "20251231-235959")
    RunStore(tmp_path / "results", "20260101-000000").save_row("a", {"verdict": "passed"})
    o = parse_options(["--resume", "--", "-x"])  # '--resume' then pytest args: the latest run, args to pytest
    assert (o.run_id, o.pytest_args) == ("20260101-000000", ["-x"])


def test_resume_latest_without_run_is_error_even_with_pytest_args():
    assert "no earlier run" in one_line_error(["--resume", "--", "-k", "smoke"])


@pytest.mark.parametrize("text,shard", [("1/1", (1, 1)), ("1/4", (1, 4)), ("4/4", (4, 4))])
def test_shard_ok(text, shard):
    assert parse_options(["--shard", text]).shard == shard


@pytest.mark.parametrize(
    "text,words",
    [
        ("0/4", "need 1 <= I <= N"),
        ("5/4", "need 1 <= I <= N"),
        ("1/0", "need 1 <= I <= N"),
        ("x", "wants I/N"),
        ("1/2/3", "wants I/N"),
        ("1-4", "wants I/N"),
    ],
)
def test_shard_validation(text, words):
    msg = one_line_error(["--shard", text])
    assert "--shard" in msg and words in msg


def test_what_follows_a_second_double_dash_goes_to_pytest():
    o = parse_options(
        [
            "--with",
            "transformers==5.20.0",
            "--no-index-check",
            "--",
            "-k",
            "smoke and not 31B",
            "-x",
            "--maxfail=2",
            "tests/tiers/test_contract.py::test_resolution",
            "--tiers",
            "--",
        ]
    )
    # everything after it, as given: options of the session's own names and further '--' included
    assert o.pytest_args == [
        "-k",
        "smoke and not 31B",
        "-x",
        "--maxfail=2",
        "tests/tiers/test_contract.py::test_resolution",
        "--tiers",
        "--",
    ]
    assert o.overrides == ["transformers==5.20.0"] and o.offline_check is True and o.tiers == ",".join(TIERS)
    assert parse_options(["--", "-k", "x"]).pytest_args == ["-k", "x"]
    assert parse_options(["--tiers", "contract", "--"]).pytest_args == []


@pytest.mark.parametrize(
    "args, unknown",
    [
        (["--apply", "fix.diff"], "--apply"),  # an option this session does not have: never pytest's usage error
        (["-k", "topk3"], "-k"),  # pytest's own, before the second --
        (["--tiers", "contract", "-x", "--", "-k", "topk3"], "-x"),
        (["--resume", "--maxfail=2"], "--maxfail=2"),
        (["tests/tiers/test_contract.py"], "tests/tiers/test_contract.py"),
    ],
)
def test_an_unknown_option_before_the_second_double_dash_is_one_line(args, unknown):
    what = "option" if unknown.startswith("-") else "argument"
    assert one_line_error(args) == (
        f"nox -s gemma4_mtp -- : unknown {what} {unknown} (pytest options go after a "
        "second --: nox -s gemma4_mtp -- -- -k topk3)"
    )


# --- install_command ---------------------------------------------------------------------------------------------


def row_file(tmp_path, backend="pypi"):
    p = tmp_path / f"row-{backend}.txt"
    p.write_text(f"# python: 3.11\n# torch-backend: {backend}\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n")
    return parse_row(p)


@pytest.fixture
def fake_uv(monkeypatch):
    monkeypatch.setattr(venvs.shutil, "which", lambda name: "/opt/bin/uv" if name == "uv" else None)
    return "/opt/bin/uv"


def test_install_command_pypi(tmp_path, fake_uv):
    venv = tmp_path / "venv"
    cmd = install_command(row_file(tmp_path), venv, tmp_path / "c.txt", None)
    assert cmd[:4] == [fake_uv, "pip", "install", "--python"]
    assert cmd[4] == str(venv / "bin" / "python")
    assert cmd[cmd.index("-c") + 1] == str(tmp_path / "c.txt")
    assert "--override" not in cmd and "--torch-backend" not in cmd
    assert cmd[-5:] == ["sglang==0.5.17", "transformers==5.12.1", "torch==2.11.0", "-e", str(paths.REPO)]


def test_install_command_overrides_and_torch_backend(tmp_path, fake_uv):
    cmd = install_command(row_file(tmp_path, "cu128"), tmp_path / "v", tmp_path / "c.txt", tmp_path / "o.txt")
    assert cmd[cmd.index("-c") + 1] == str(tmp_path / "c.txt")
    assert cmd[cmd.index("--override") + 1] == str(tmp_path / "o.txt")
    assert cmd[cmd.index("--torch-backend") + 1] == "cu128"
    # options come before the requirements
    assert max(cmd.index("-c"), cmd.index("--override"), cmd.index("--torch-backend")) < cmd.index("sglang==0.5.17")


def test_install_command_without_uv(tmp_path, monkeypatch):
    monkeypatch.setattr(venvs.shutil, "which", lambda name: None)
    with pytest.raises(RowError, match="uv is not on PATH"):
        install_command(row_file(tmp_path), tmp_path / "v", tmp_path / "c.txt", None)


# --- in_shard ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7])
def test_in_shard_covers_every_row_exactly_once(n):
    ids = [f"row-{c}" for c in "qwertyuiopa"]  # unsorted on purpose
    owners = {rid: [i for i in range(1, n + 1) if in_shard(rid, ids, (i, n))] for rid in ids}
    assert all(len(v) == 1 for v in owners.values()), owners
    sizes = [sum(1 for v in owners.values() if v == [i]) for i in range(1, n + 1)]
    assert max(sizes) - min(sizes) <= 1  # round robin: balanced


def test_in_shard_real_rows_and_order_independence():
    ids = [r.id for r in load_rows(REPO / "constraints")]
    for n in (1, 2, 3, len(ids), len(ids) + 1):
        picked = [rid for i in range(1, n + 1) for rid in ids if in_shard(rid, ids, (i, n))]
        assert sorted(picked) == sorted(ids)
        assert all(
            in_shard(r, ids, (i, n)) == in_shard(r, list(reversed(ids)), (i, n)) for r in ids for i in range(1, n + 1)
        )
    assert all(in_shard(r, ids, None) for r in ids)


# --- preflight ---------------------------------------------------------------------------------------------------


def test_preflight_overrides_offline_checks_syntax_only():
    preflight_overrides(["transformers==99.0.0"], skip_index=True)  # not asked: no network
    with pytest.raises(RowError, match="give a version"):
        preflight_overrides(["transformers"], skip_index=True)


def test_preflight_overrides_index_error_is_one_line(monkeypatch):
    def unreachable(req, **kw):
        raise index.IndexError_("index http://127.0.0.1:9/simple is unreachable (Connection refused)")

    monkeypatch.setattr(index, "check_spec", unreachable)
    with pytest.raises(RowError) as info:
        preflight_overrides(["transformers==5.20.0"])
    assert str(info.value) == (
        "--with transformers==5.20.0: index http://127.0.0.1:9/simple is unreachable (Connection refused)"
    )


def test_summary_line():
    rec = {
        "row": {"id": "r"},
        "verdict": "failed",
        "tiers": {
            "contract": {"verdict": "failed", "failure_kinds": ["args"]},
            "smoke": {"verdict": "skipped", "reason": "needs 1 CUDA GPU(s), this machine has 0"},
        },
    }
    assert matrix.summary_line(rec) == (
        "r: FAILED — contract=failed [args]; smoke=skipped (needs 1 CUDA GPU(s), this machine has 0)"
    )
    rec = {
        "row": {"id": "r"},
        "verdict": "failed",
        "install": {"verdict": "failed", "failure": {"message": "resolver conflict: x"}},
    }
    assert matrix.summary_line(rec) == "r: FAILED at install: resolver conflict: x"
    rec = {
        "row": {"id": "r"},
        "verdict": "failed",
        "tiers": {"contract": {"verdict": "failed"}},
        "install": {"verdict": "passed", "held": [{"package": "sglang-kernel", "version": "0.4.10"}]},
        "blocking_pins": [{"package": "torchaudio", "version": "2.11.0", "pinned_by": "sglang 0.5.23"}],
    }
    assert matrix.summary_line(rec) == (
        "r: FAILED — contract=failed; held at sglang's pins: sglang-kernel 0.4.10; "
        "blocking pin(s): sglang 0.5.23 pins torchaudio==2.11.0 (move it too: --with)"
    )


def test_summary_line_says_a_batch_timing_entry_did_not_show():
    entry = {"id": "timing-bug", "checks": ["test_x[a]"]}
    rec = {"row": {"id": "r"}, "verdict": "passed", "tiers": {"smoke": {"verdict": "passed"}}}
    rec["tiers"]["smoke"]["unshown_known_upstream"] = [entry]
    assert matrix.summary_line(rec) == (
        "r: PASSED — smoke=passed (known-upstream entry timing-bug did not show: 1 of its checks pass)"
    )


def test_overridden_pins_leave_the_constraints_and_the_requirements(tmp_path):
    f = tmp_path / "sglang-0.5.17.txt"
    f.write_text(
        "# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\nTransformers==5.12.1  # pinned\ntorch==2.11.0\n"
    )
    row = parse_row(f)
    text = matrix.constraints_text(row, ["transformers==5.20.0"])
    assert "sglang==0.5.17\n" in text and "torch==2.11.0\n" in text and "# python: 3.11" in text
    assert not [ln for ln in text.splitlines() if ln.lower().startswith("transformers")]
    assert matrix.constraints_text(row, []) == f.read_text()
    cmd = matrix.install_command(
        row, tmp_path / "venv", tmp_path / "c.txt", tmp_path / "o.txt", ["transformers==5.20.0"]
    )
    assert "transformers" in cmd and "transformers==5.12.1" not in cmd and "sglang==0.5.17" in cmd


def test_with_a_prerelease_pin_asks_the_index_for_prereleases(monkeypatch):
    from packaging.requirements import Requirement
    from packaging.version import Version

    def releases(name, include_prereleases=False, **kw):
        return [Version("5.19.0")] + ([Version("5.20.0rc1")] if include_prereleases else [])

    monkeypatch.setattr(index, "releases", releases)
    assert index.check_spec(Requirement("transformers==5.20.0rc1")) == [Version("5.20.0rc1")]
    assert index.check_spec(Requirement("transformers>=5.0")) == [Version("5.19.0")]


def test_preflight_tier_env_checks_smoke_knobs_whatever_the_tiers():
    """A bad MTPMATRIX_SMOKE_* value is one line before anything installs, with the smoke tier selected or not (it
    used to pass unread with --tiers contract: a new user's walk, 2026-12-05c)."""
    bad = {"MTPMATRIX_SMOKE_SERVERS": "random-nomtp,nope"}
    for tiers in ("contract,smoke", "contract,reference"):
        with pytest.raises(RowError, match="MTPMATRIX_SMOKE_SERVERS: unknown server\\(s\\) nope"):
            matrix.preflight_tier_env(tiers, bad)
    assert matrix.preflight_tier_env("smoke", {}) is not None
    assert matrix.preflight_tier_env("contract,reference", {}) is None


def test_a_cuda_variant_rows_index_is_checked_before_anything_installs(monkeypatch):
    """Its torch comes from the PyTorch index: one line when that does not answer (it used to create the venv and fail
    the install, a 'DOES NOT QUALIFY' row); a PyPI row, or --offline-check, asks nothing."""
    import http.server
    import threading

    from mtpmatrix.core.rows import load_rows

    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    asked = []
    monkeypatch.setattr(index, "check_reachable", lambda url, **kw: asked.append(url))
    matrix.preflight_row_index(rows["sglang-0.5.17"])
    matrix.preflight_row_index(rows["sglang-0.5.17-cu128"], skip_index=True)
    matrix.preflight_row_index(rows["sglang-0.5.17-cu128"])
    assert asked == [f"{index.PYTORCH_INDEX}/cu128/"]
    monkeypatch.undo()
    monkeypatch.setattr(index, "PYTORCH_INDEX", "http://127.0.0.1:9/whl")  # the discard port: nothing listens
    with pytest.raises(RowError, match="row sglang-0.5.17-cu128 installs torch with --torch-backend cu128: index "):
        matrix.preflight_row_index(rows["sglang-0.5.17-cu128"])
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501: an answer
    threading.Thread(target=server.handle_request, daemon=True).start()
    monkeypatch.setattr(index, "PYTORCH_INDEX", f"http://127.0.0.1:{server.server_port}/whl")
    try:
        matrix.preflight_row_index(rows["sglang-0.5.17-cu128"])
    finally:
        server.server_close()


@pytest.mark.parametrize(
    "message, verdict",
    [
        ("index unreachable: error: Failed to fetch: `https://download.pytorch.org/whl/cu128/torch/`", "error"),
        ("python missing: error: No interpreter found for Python 3.12", "error"),
        ("resolver conflict: x No solution found when resolving dependencies", "failed"),
        ("not on the index: sglang==9.9.9 was not found in the package registry", "failed"),
    ],
)
def test_a_row_the_machine_could_not_install_is_no_sglang_failure(message, verdict):
    """An index that did not answer or a missing interpreter says nothing of sglang: the row is an error (not proven,
    exit 3), not 'failed' (exit 1: sglang or a dependency broke), which it used to be."""
    from mtpmatrix.core.store import row_verdict

    record = {"install": {"verdict": "failed", "failure": {"kind": "install", "message": message}}}
    assert row_verdict(record) == verdict


# --- packages an override strands ------------------------------------------------------------------------------

# real `uv pip check` output of a probe with --with torch==2.11.0: the resolver took the newest torchvision
PIP_CHECK = """Using Python 3.11.7 environment at: .cache/bisect/sglang-0.5.17/2.11.0
Checked 215 packages in 2ms
Found 3 incompatibilities
The package `torchvision` requires `torch>=2.14.0`, but `2.11.0` is installed
The package `sglang` requires `torch==2.13.0`, but `2.11.0` is installed
The package `flashinfer-python` requires `nvidia-cudnn-frontend>=1.13`, but `1.10` is installed
"""


def test_stranded_by_overrides_names_only_companions_of_an_overridden_package():
    # sglang is a row pin (its torch pin is what the override breaks); flashinfer's problem is not the override's
    assert matrix.stranded_by_overrides(PIP_CHECK, ["torch==2.11.0"], ["sglang", "transformers", "torch"]) == [
        "torchvision"
    ]
    assert matrix.stranded_by_overrides(PIP_CHECK, ["transformers==5.20.0"], ["sglang", "torch"]) == []
    assert (
        matrix.stranded_by_overrides(
            "Checked 215 packages\nAll installed packages are compatible\n", ["torch==2.11.0"], []
        )
        == []
    )


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A metadata-only wheel: all a resolver reads."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        )
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


@pytest.fixture
def local_index(tmp_path):
    """uv offline on a folder of wheels: base 1/2/3, companion 1/2/3 (each pinning its base), a venv to resolve for."""
    import shutil
    import subprocess
    import sys

    if shutil.which("uv") is None:
        pytest.skip("needs uv")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for v in ("1.0", "2.0"):
        _wheel(wheels, "base", v, [])
    for v in ("1.0", "2.0", "3.0"):  # companion 3.0 needs a base 3.0 that does not exist
        _wheel(wheels, "companion", v, [f"base=={v}"])
    env = {
        **__import__("os").environ,
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": str(wheels),
        "UV_OFFLINE": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_PYTHON_DOWNLOADS": "never",
    }
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--python", sys.executable, str(venv)], check=True, capture_output=True, env=env)
    return venv, env


def test_resolve_companions_follows_the_override(tmp_path, local_index):
    venv, env = local_index
    row = row_file(tmp_path)
    assert matrix.resolve_companions(row, venv, ["base==2.0"], ["companion"], env=env) == ["companion==2.0"]
    assert matrix.resolve_companions(row, venv, ["base==1.0"], ["companion"], env=env) == ["companion==1.0"]
    with pytest.raises(RowError) as info:
        matrix.resolve_companions(row, venv, ["base==9.0"], ["companion"], env=env, log=tmp_path / "c.log")
    assert "\n" not in str(info.value) and str(info.value).startswith("no release of companion fits base==9.0: ")
    assert (tmp_path / "c.log").read_text().startswith("$ ")


def test_row_json_records_the_pytest_args_and_every_mtpmatrix_knob_and_nothing_else():
    """`nox -s gemma4_mtp -- -- -k topk3` with MTPMATRIX_SMOKE_SERVERS set: both are on the row (a subset selection
    the report must see); no other variable of the environment is."""
    opts = parse_options(["--tiers", "smoke", "--", "-k", "topk3"])
    env = {
        "MTPMATRIX_SMOKE_SERVERS": "random-nomtp",
        "MTPMATRIX_ROW": "sglang-0.5.17",
        "HF_TOKEN": "hf_secret",
        "PATH": "/usr/bin",
    }
    got = matrix.suite_invocation(opts, env)
    assert got == {
        "pytest_args": ["-k", "topk3"],
        "knobs": {"MTPMATRIX_ROW": "sglang-0.5.17", "MTPMATRIX_SMOKE_SERVERS": "random-nomtp"},
    }


def test_an_upgrade_probes_verdict_line_names_the_release_it_ran_and_what_uv_pip_check_refused():
    """The console's row line names the overridden package at the version installed and uv pip check's first
    complaint (a new user's walk, 2026-12-05c: only row.json said transformers 5.20.0, and that sglang pins 5.19.0)."""
    record = {
        "row": {"id": "sglang-0.5.23"},
        "verdict": "passed",
        "overrides": ["transformers==5.20.0"],
        "versions": {"transformers": "5.20.0", "sglang": "0.5.23"},
        "install": {
            "verdict": "passed",
            "check": {
                "ok": False,
                "output": ["The package `sglang` requires `transformers==5.19.0`, but `5.20.0` is installed"],
            },
        },
        "tiers": {"contract": {"verdict": "passed"}},
    }
    line = matrix.summary_line(record)
    assert line.endswith(
        "with transformers 5.20.0 (--with); uv pip check: The package `sglang` requires `transformers==5.19.0`, "
        "but `5.20.0` is installed"
    )
    assert "--with" not in matrix.summary_line({**record, "overrides": [], "install": {"verdict": "passed"}})
    # a range names its package (and the release it got) as an exact spec does
    ranged = matrix.summary_line({**record, "overrides": ["Transformers>=5.20"], "install": {"verdict": "passed"}})
    assert ranged.endswith("; with transformers 5.20.0 (--with)")
