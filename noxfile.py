"""gemma4-mtp-matrix sessions.

nox -s gemma4_mtp                         every default row (constraints/*.txt), CPU tiers unless a GPU is here
nox -s "gemma4_mtp(sglang-0.5.17)"        one row
nox -t latest                             rows by tag (nox -l --json lists rows and tags)
nox -s gemma4_mtp -- --with transformers==5.20.0      upgrade probe (uv --override), recorded per row
nox -s gemma4_mtp -- --patch FILE         a candidate: the patch on each row's pinned sglang (--sglang WHEEL|DIR:
                                          a wheel or checkout instead); filed as <row>+patch-<sha7>
nox -s gemma4_mtp -- --resume             finish the latest run, skipping rows that have a verdict
nox -s gemma4_mtp_extra                   rows marked 'default: false' (CUDA variants from the PyTorch index)
nox -s unit                               the runner's own unit tests (the 'test' dependency group)
nox -s lint                               ruff check + ruff format --check
nox -s typecheck                          mypy: core/ and report/ against the results records' types
nox -t ci                                 what CI runs: unit tests, lint, typecheck + the CPU tiers of the 'ci' row
                                          (ci_row)
nox -s report -- [RUN_ID]                 Markdown/HTML/JSON summary of a run (NOT PROVEN fails it only with --gate
                                          or --require TIERS; python -m mtpmatrix report exits 3 on it)
nox -s mutants -- --row ROW [--check]     fault injection in a row's venv (python -m mtpmatrix mutants)
nox -s gemma4_mtp -- --tiers gsm8k --server-url URL    GSM8K against a running sglang server
nox -t canary [-- --tiers contract --budget S]          canary rows (constraints/canary/): newest releases,
                                                        and the culprit when one breaks a tier its row passes
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"  # nox.project.dependency_groups (the unit and lint sessions' installs)
PYPROJECT = Path(__file__).parent / "pyproject.toml"

sys.path.insert(0, str(Path(__file__).parent / "src"))
from mtpmatrix.core import paths  # noqa: E402
from mtpmatrix.core.rows import RowError, load_rows  # noqa: E402
from mtpmatrix.runner import candidate, culprit, matrix, plan  # noqa: E402
from mtpmatrix.runner.canary import load_canaries  # noqa: E402

# A row's Python comes from the machine; uv may download a missing one only where it can (online users). On
# air-gapped machines set UV_PYTHON_DOWNLOADS=never (.ci/run does) so a missing Python fails at once instead of
# retrying.
nox.options.default_venv_backend = "uv"
nox.options.download_python = "never" if os.environ.get("UV_PYTHON_DOWNLOADS") == "never" else "auto"
nox.options.error_on_missing_interpreters = True

try:
    ROWS = {row.id: row for row in load_rows(paths.CONSTRAINTS_DIR)}
    CANARIES = load_canaries(paths.CONSTRAINTS_DIR, list(ROWS.values()))
except RowError as exc:  # one clear line, before any session (or venv) exists
    raise SystemExit(f"error: {exc}") from None
# One run id for every row of this nox invocation (--run-id / --resume / MTPMATRIX_RUN_ID take precedence).
RUN_ID = paths.new_run_id()


CI_TAG = paths.CI_TAG


def _params(default: bool):
    # A row file's 'ci' tag selects the ci_row session below, not this one: `nox -t ci` must not file its CI run
    # under results/ as the user's latest matrix run (the report's default).
    return [
        nox.param(row.python, row.id, id=row.id, tags=[t for t in row.tags if t != CI_TAG])
        for row in ROWS.values()
        if row.default is default
    ]


def _run_matrix_row(session: nox.Session, row_id: str, peers: list[str], run_id: str = RUN_ID) -> None:
    """The one path every row takes: options, pre-flight, install, suite, verdict."""
    opts, filed = None, row_id
    try:
        opts = matrix.parse_options(session.posargs)
        opts.run_id = opts.run_id or run_id
        if (
            opts.resume and not (opts.results / opts.run_id).is_dir()
        ):  # a retry whose first try wrote nothing, or a typo
            session.warn(f"--resume {opts.run_id}: no such run under {opts.results}/ yet: starting it")
        # shards split the rows of this session (default rows, or the extra ones), so N shards stay balanced
        if not matrix.in_shard(row_id, peers, opts.shard):
            session.skip(f"{row_id} is not in shard {opts.shard[0]}/{opts.shard[1]}")
        # a candidate (--patch, --sglang) is this session's row filed under its own id: sglang-0.5.17+patch-1a2b3c4
        filed = candidate.filed_id(row_id, opts.candidate)
        for warning in candidate.of(opts.candidate).warnings:
            session.warn(warning)
        # the run's manifest (every row nox queued, their pins, the options, the suite) before anything installs
        keep = plan.start(opts, filed, plan.planned(ROWS, plan.queued_rows(session, peers), opts.candidate))
        if keep:
            session.skip(keep)
        matrix.preflight_overrides(opts.overrides, skip_index=opts.offline_check)
        matrix.preflight_row_index(ROWS[row_id], skip_index=opts.offline_check)
        matrix.preflight_tier_env(opts.tiers)
        for s in matrix.preflight_servers(opts.server_urls):
            session.log(f"gsm8k against {s.url}: {s.case_id} (model {s.model_path}, sglang {s.version or '?'})")
        # a candidate installs into a fresh venv of its own (.nox/candidates/<id>): the row's keeps its release
        venv = candidate.own_venv(
            opts.candidate, ROWS[row_id], Path(session.virtualenv.location), Path(__file__).parent / ".nox"
        )
        record = matrix.run_row(ROWS[row_id], venv, opts, log=session.log)
    except RowError as exc:  # bad input, no uv: one line (run_row raises it before recording anything)
        plan.not_run(opts, filed, str(exc))  # the report names the planned row that did not run, and why
        session.error(str(exc))
    session.log(matrix.summary_line(record))
    session.log(f"results: {opts.results / opts.run_id / filed / 'row.json'}")
    if record["verdict"] in ("failed", "error"):
        session.error(matrix.summary_line(record))


@nox.session(venv_backend="uv")
@nox.parametrize(["python", "row"], _params(default=True))
def gemma4_mtp(session: nox.Session, row: str) -> None:
    """Qualify one row: uv venv, sglang + pins (+ --with overrides), freeze, the tiered suite."""
    _run_matrix_row(session, row, [r.id for r in ROWS.values() if r.default])


@nox.session(venv_backend="uv", default=False)
@nox.parametrize(["python", "row"], _params(default=False))
def gemma4_mtp_extra(session: nox.Session, row: str) -> None:
    """Rows not run by default (e.g. CUDA variants that need the PyTorch index)."""
    _run_matrix_row(session, row, [r.id for r in ROWS.values() if not r.default])


@nox.session(venv_backend="uv", tags=[CI_TAG], default=False)
@nox.parametrize(["python", "row"], [nox.param(r.python, r.id, id=r.id) for r in ROWS.values() if CI_TAG in r.tags])
def ci_row(session: nox.Session, row: str) -> None:
    """The 'ci' row for `nox -t ci`: the matrix row path, results under results/ci-<time>/.

    Filed apart so that the report's default run stays the user's own latest matrix run."""
    _run_matrix_row(session, row, [r.id for r in ROWS.values() if CI_TAG in r.tags], run_id=paths.CI + RUN_ID)


CANARY_TAG = "canary"


# python=False: the canary resolves its releases on the index before any venv exists (an unreachable index is one
# line), then makes its own venv (.nox/canary-<id>) with the row's Python, as bisect probes do.
@nox.session(python=False, tags=[CANARY_TAG], default=False)
@nox.parametrize("row", [nox.param(cid, id=cid) for cid in CANARIES])
def canary(session: nox.Session, row: str) -> None:
    """One canary row: newest releases in its ranges, the suite, and the culprit when it breaks."""
    outcomes: list[str] = []  # what the canary found: the install conflict, the culprit, or none and why
    rc = culprit.main([row], session.posargs, run_id=RUN_ID, log=session.log, outcomes=outcomes)
    if rc:
        session.error(f"canary {outcomes[-1] if rc == 1 and outcomes else f'{row}: bad input'}")


@nox.session(venv_backend="uv", tags=[CI_TAG], default=False)
def unit(session: nox.Session) -> None:
    """Unit tests of the runner, client, scorer, statistics and report (no sglang needed)."""
    # the 'test' dependency group of pyproject.toml: what the unit tests need besides the package (why each: there)
    session.install("-e", ".", *nox.project.dependency_groups(nox.project.load_toml(PYPROJECT), "test"))
    session.run("python", "-m", "pytest", "tests/unit", "-p", "no:cacheprovider", *session.posargs)


LINT_PATHS = ("src", "tests", "tools", "benchmarks", "noxfile.py")


@nox.session(venv_backend="uv|virtualenv", tags=[CI_TAG], default=False)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check (configuration: pyproject.toml's [tool.ruff])."""
    session.install(*nox.project.dependency_groups(nox.project.load_toml(PYPROJECT), "lint"))
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session(venv_backend="uv|virtualenv", tags=[CI_TAG], default=False)
def typecheck(session: nox.Session) -> None:
    """mypy: the results records' writers and readers against their types (configuration: [tool.mypy])."""
    session.install(*nox.project.dependency_groups(nox.project.load_toml(PYPROJECT), "typecheck"))
    session.run("mypy", *session.posargs)


GATE = "--gate"


# uv where it is (here and the CI's row jobs), else virtualenv: the workflow's report job installs nox alone.
@nox.session(venv_backend="uv|virtualenv", default=False)
def report(session: nox.Session) -> None:
    """Summarize a run: nox -s report -- [RUN_ID] [--baseline RUN_ID] [--require TIERS] [--gate]."""
    # jinja2 renders the report, matplotlib draws its figures; they are the 'report' extra, not dependencies of the
    # package, which is installed into every row's venv and must not move sglang's pins
    session.install("-e", ".", "jinja2", "matplotlib")
    # NOT PROVEN (exit 3) is the report's answer, printed as such, and fails the session only where it is asked to
    # gate: --gate, or --require TIERS (the workflow's report job); a broken row (1) and bad input (2) always fail it
    args = [a for a in session.posargs if a != GATE]
    gate = len(args) < len(session.posargs) or any(a.startswith("--req") for a in args)  # argparse's abbreviations
    session.run("python", "-m", "mtpmatrix", "report", *args, success_codes=[0] if gate else [0, 3])


@nox.session(python=False, default=False)
def bisect(session: nox.Session) -> None:
    """First bad release: nox -s bisect -- PACKAGE GOOD BAD [--row ROW] [--tier TIER] [--known ID]."""
    session.run(
        sys.executable,
        "-m",
        "mtpmatrix",
        "bisect",
        *session.posargs,
        env={"PYTHONPATH": str(Path(__file__).parent / "src")},
    )


@nox.session(python=False, default=False)
def mutants(session: nox.Session) -> None:
    """Fault injection: nox -s mutants -- --row ROW [--list | --check] [--mutants ID,ID] [--out DIR] ...

    Builds the row's venv (.nox/mutants-<row>) with the matrix's one install command, then runs
    ``python -m mtpmatrix mutants`` inside it; --row defaults to the row tagged 'ci' (mtpmatrix.faults.venv)."""
    from mtpmatrix.faults import venv as mutants_venv
    from mtpmatrix.faults.mutation import MutantsError

    try:
        plan_ = mutants_venv.prepare(ROWS, session.posargs, Path(__file__).parent / ".nox")
    except MutantsError as exc:
        session.error(str(exc))
    for cmd in plan_.commands:
        session.run(*cmd, env=plan_.env, include_outer_env=False, external=True)
    session.run(*plan_.mutants, env=plan_.env, include_outer_env=False, external=True)
