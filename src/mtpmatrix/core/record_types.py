"""The results records as types: ``row.json``, ``tiers.json`` (per tier, per check), the run's ``manifest.json`` and
the report's ``summary.json``. schema.py names the files and the metric keys; these TypedDicts say which fields each
record holds and of what type, and mypy (``nox -s typecheck``, in ``nox -t ci``) holds their readers and writers
(core/, report/, and the writers in runner/ and tiers/: [tool.mypy]) to them: a misspelt field or a field of the
wrong type fails the check before any run does.

A record read back from disk is JSON someone may have edited: evidence.records checks its shape before a reader
takes these types at their word (what it refuses stands as ``shell``, "not proven", never a traceback). Any field of
a record on disk may be absent -- a 'pending' row, an older schema, a field only some runs write (a candidate's, an
imported run's) -- so the records' types are ``total=False`` and their readers use ``.get``; the shape check
guarantees only a row's ``row.id`` and each check's ``id`` and ``outcome``. What the report builds and writes itself
(summary.json) is total. Metric values are whatever a check's ``record_property`` got: ``metrics`` maps to ``Any``.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# --- tiers.json: one record per check ---------------------------------------------------------------------------


class Failure(TypedDict, total=False):
    """A check's or an install's classified failure (core.failures.FailureRecord.as_dict)."""

    kind: str  # core.kinds.KINDS
    type: str  # the exception's type name
    message: str
    frame: str | None  # "package/module.py:123 in func": the first frame inside a library under test
    raised_at: str | None  # the innermost frame
    consequence_of: str  # the check whose failure left a package half-imported (docs/evidence.md)


class CheckRecord(TypedDict, total=False):
    """``tiers.json`` -> ``tiers.<tier>.checks[]``: one check of one session."""

    id: str  # pytest node id
    tier: str  # schema.TIERS
    outcome: str  # evidence.records.OUTCOMES
    seconds: float  # setup + call
    metrics: dict[str, Any]  # record_property values; schema's metric names
    cpu_seconds: float  # the process's CPU time in setup and call (absent before it was recorded)
    reason: str  # a skip's reason
    failure: Failure  # failed or error only
    known_upstream: str  # the known_upstream.json entry whose signature this failure matches
    reruns: int  # times the test ran again after its first run (a plugin's rerun): the first failure stands


class MissingRecord(TypedDict):
    """What a tier's expected set lacked (mtpmatrix.core.expected): a check, case or server, and why."""

    what: str
    why: str


class TierRecord(TypedDict, total=False):
    """``tiers.<tier>``: a tier's verdict (schema.VERDICTS) and its checks."""

    verdict: str
    checks: list[CheckRecord]
    seconds: float
    reason: str
    failure_kinds: list[str]
    incomplete: bool  # the session stopped before the tier could finish (pytest died, interrupted)
    missing: list[MissingRecord]  # partial: what did not run
    known_upstream: list[dict[str, Any]]  # matched known_upstream.json entries (KnownIssue + checks)
    stale_known_upstream: list[dict[str, Any]]  # entries whose listed checks passed in their range
    unshown_known_upstream: list[dict[str, Any]]  # entries with shows_when whose listed checks passed in range
    unproven: list[str]  # why the records cannot show the verdict (evidence.run.apply_problems)


Tiers = dict[str, TierRecord]  # tier name (schema.TIERS) -> its record


class Selection(TypedDict, total=False):
    """What a session was asked to run (tiers.session.plugin.selection; mtpmatrix.core.expected reads it)."""

    args: list[str]
    paths: list[str]  # positional args: node ids, when pytest was given some
    keyword: str
    markexpr: str
    deselect: list[str]
    maxfail: int
    knobs: dict[str, str]  # every MTPMATRIX_* variable
    sglang_env: dict[str, str]  # every SGLANG_* / SGL_* variable: sglang reads them, the suite sets none
    torch_env: dict[str, str]  # every variable torch, CUDA, NCCL or Triton read (expected.torch_env)
    collected: dict[str, list[str]]  # tier -> the checks collected


class Fingerprint(TypedDict, total=False):
    """Which suite wrote a record (evidence.fingerprint.describe)."""

    suite: str | None
    data: str  # sha256 of the GSM8K data
    commit: str | None
    dirty: bool | None
    changed: list[str] | None  # the verdict-deciding files that differ from the commit (None: no git checkout)
    error: str  # why the suite could not be fingerprinted (then suite is None)


class Build(TypedDict, total=False):
    """What a session ran on beside its pins (serving.environment.build): part of a row's identity."""

    python: str
    implementation: str
    platform: str  # sysconfig.get_platform(): linux-x86_64
    torch: str | None  # torch.__version__, with its local build: 2.11.0+cu130
    torch_cuda: str | None  # torch.version.cuda


class PytestPlugin(TypedDict, total=False):
    """A plugin a session loaded (tiers.session.provenance.plugins)."""

    name: str
    module: str
    dist: str | None  # the distribution that installed it; None for a module on the path
    version: str | None


class PytestRun(TypedDict, total=False):
    """``tiers.json`` -> ``pytest``: how a session ran (tiers.session.provenance.record)."""

    version: str
    inifile: str | None  # relative to the rootdir
    ini_addopts: list[str]
    env_addopts: str | None  # PYTEST_ADDOPTS
    override_ini: list[str]  # -o / --override-ini from the command line and PYTEST_ADDOPTS
    runxfail: bool
    conftests: list[str]
    plugins: list[PytestPlugin]
    options: dict[str, Any]  # every option's effective value


class TiersFile(TypedDict, total=False):
    """``tiers.json``: what the pytest plugin wrote at the end of a session."""

    schema: int
    fingerprint: Fingerprint
    tiers: Tiers
    selection: Selection
    versions: dict[str, str | None]  # installed versions of the watched packages
    gpus: int
    gpu_names: list[str]
    build: Build
    pytest: PytestRun
    session_id: str
    seconds: float
    exitstatus: int


# --- row.json ---------------------------------------------------------------------------------------------------


class RowInfo(TypedDict, total=False):
    """``row.json`` -> ``row``: the row as its constraints file defines it (core.rows.Row.as_dict)."""

    id: str
    pins: dict[str, str]
    constraints: str
    python: str
    torch_backend: str | None
    tags: list[str]
    default: bool
    description: str
    gpus: int


class InstallCheck(TypedDict, total=False):
    """``uv pip check`` of the row's venv."""

    ok: bool
    output: list[str]


class InstallRecord(TypedDict, total=False):
    """``row.json`` -> ``install``: the row's install (runner.matrix; 'imported' for a GPU box's own environment)."""

    verdict: str  # passed, failed, imported
    seconds: float
    command: list[str]
    failure: Failure
    check: InstallCheck
    source: str  # imported runs: where the environment came from
    companions: list[str]  # packages installed beside the overrides they were stranded by
    companions_error: str
    moved: list[dict[str, Any]] | None  # what the overrides moved beyond what was asked (runner.overrides)
    held: list[dict[str, Any]]  # sglang pins the overrides would have moved, held (runner.overrides)


class SuiteRun(TypedDict, total=False):
    """``row.json`` -> ``suite``: the pytest run."""

    exitstatus: int | None
    seconds: float | None


class RowRecord(TypedDict, total=False):
    """``row.json``: one row of one run (runner.matrix.run_row, runner.importer; store.RunStore saves it).

    Every field may be absent from a record on disk (a 'pending' record, an older schema, a shell that stands for an
    unreadable one), so readers use ``.get``; the writers always set ``row`` and ``verdict``."""

    schema: int
    run_id: str
    row: RowInfo
    verdict: str  # schema.VERDICTS: the worst of the tiers (store.row_verdict)
    overrides: list[str]  # --with requirements
    tiers_selected: str  # --tiers as given
    pytest_args: list[str]  # after a second --
    knobs: dict[str, str]  # the suite's MTPMATRIX_* environment
    started: str | None  # None: an imported run whose box did not say when
    finished: str | None
    host: dict[str, Any]
    install: InstallRecord
    versions: dict[str, str]  # installed versions of the watched packages (freeze.txt, then what the suite saw)
    suite: SuiteRun
    tiers: Tiers
    selection: Selection | None
    fingerprint: Fingerprint | None
    gpus: int
    gpu_names: list[str]  # the session's (schema.SESSION_FIELDS, copied from tiers.json)
    build: Build
    pytest: PytestRun
    session_id: str
    candidate: dict[str, Any]  # a candidate row's patch, wheel or checkout (runner.candidate.Candidate.record)
    canary: dict[str, Any]  # a canary row's resolution (runner.canary)
    blocking_pins: list[dict[str, Any]]
    unproven: list[str]  # row-level reasons the record proves nothing (evidence.run.apply_problems)
    unreadable: list[str]  # why the record could not be read as one (evidence.records.shell)


# --- results/<run-id>/manifest.json -----------------------------------------------------------------------------


class PlannedRow(TypedDict, total=False):
    """``manifest.rows.<row id>``: what the plan fixes of a row (evidence.manifest.planned_row)."""

    pins: dict[str, str]
    python: str | None
    torch_backend: str | None
    constraints_sha256: str
    overrides: list[str]  # a row with overrides of its own (a canary's); else the invocation's apply
    candidate: dict[str, Any]  # evidence.manifest.candidate_identity


class Invocation(TypedDict, total=False):
    """``manifest.invocation``: what the run was asked (runner.plan.invocation)."""

    argv: list[str]
    tiers: str
    overrides: list[str]
    server_urls: list[str]
    pytest_args: list[str]
    knobs: dict[str, str]
    source: str  # an imported run: what ran its suite (tools/gpu_box.sh)


class Resumed(TypedDict, total=False):
    """``manifest.resumed[]``: a later invocation that added rows to the plan."""

    at: str
    argv: list[str] | None
    rows: list[str]


class Manifest(TypedDict, total=False):
    """``results/<run-id>/manifest.json``: what the run planned (evidence.manifest)."""

    schema: int
    run_id: str
    created: str
    fingerprint: Fingerprint
    invocation: Invocation
    rows: dict[str, PlannedRow]
    not_run: dict[str, str]  # row id -> why its session wrote no record
    resumed: list[Resumed]
    conflicts: list[str]  # manifest.read: where the merged plans disagree (never written)


# --- results/<run-id>/report/summary.json -----------------------------------------------------------------------


class Problem(TypedDict):
    """What a record cannot show (``problem``): about one tier, or the whole row (tier None)."""

    tier: str | None
    what: str


def problem(tier: str | None, what: str) -> Problem:
    """A Problem: what the evidence judge (core/evidence) found a record cannot show."""
    return {"tier": tier, "what": what}


class EvidenceSummary(TypedDict):
    """``summary.evidence``: what the run's records prove (evidence.run.judge_run)."""

    run: list[str]  # run-level problems
    rows: dict[str, list[Problem]]  # row id -> its problems
    suite: str | None  # the planned suite, short
    checkout: CheckoutState


class CheckoutState(TypedDict):
    """``summary.evidence.checkout``: the verdict-deciding files that differ from the commit (evidence.checkout)."""

    commit: str | None  # the judging checkout's
    changed: list[str]  # its verdict-deciding files that differ from the commit (or from the distribution's RECORD)
    distribution: NotRequired[str | None]  # without a commit: the installed distribution that vouches, "name version"
    run_commit: str | None  # the run's suite's (its manifest's fingerprint)
    run_changed: list[str]


class TierSummary(TypedDict):
    """``summary.rows[].tiers.<tier>``: one tier of one row as the report shows it (report.row_summary)."""

    verdict: str | None
    state: str  # expected.STATES
    unproven: list[str]
    reason: str | None
    seconds: float | None
    counts: dict[str, int]  # outcome -> checks
    failure_kinds: list[str]
    failures: list[dict[str, Any]]
    failure_groups: list[dict[str, Any]]
    skipped_checks: list[dict[str, Any]]
    known_upstream: list[dict[str, Any]]
    stale_known_upstream: list[dict[str, Any]]
    unshown_known_upstream: list[dict[str, Any]]
    missing: list[MissingRecord]
    missing_groups: list[dict[str, Any]]


class RowSummary(TypedDict):
    """``summary.rows[]``: one row as the report shows it (report.row_summary)."""

    id: str
    relaunched: list[dict[str, Any]]
    verdict: str
    state: str  # expected.STATES
    unproven: list[str]
    description: str
    tags: list[str]
    torch_backend: str | None
    versions: dict[str, str | None]
    versions_installed: bool
    overrides: list[str]
    install: dict[str, Any]
    tiers: dict[str, TierSummary]
    metrics: list[dict[str, Any]]
    gsm8k_records: dict[str, dict[str, Any]]
    logs: dict[str, str]
    started: str | None
    finished: str | None
    host: dict[str, Any] | None
    gpus: int | None
    build: Build  # Python, platform, torch's build; {} for a record without one
    candidate: dict[str, Any] | None
    closest_passing: NotRequired[dict[str, Any] | None]  # failing rows only
    launch_budget: NotRequired[dict[str, Any] | None]  # smoke-launch-budget.json beside the row, where there is one


class Summary(TypedDict):
    """``summary.json``: one run as the report's templates render it (report.summary.build_summary)."""

    schema: int
    run_id: str
    generated: str
    required_tiers: list[str]
    evidence: EvidenceSummary
    verdict_counts: dict[str, int]
    failing_rows: list[str]
    incomplete_rows: list[str]
    nothing_ran: bool
    tiers: list[str]
    tier_status: dict[str, dict[str, Any]]
    row_verdicts: dict[str, str]
    tier_verdicts: dict[str, dict[str, str | None]]
    rows: list[RowSummary]
    skips: list[dict[str, Any]]
    known_upstream: list[dict[str, Any]]
    stale_known_upstream: list[dict[str, Any]]
    unshown_known_upstream: list[dict[str, Any]]
    relaunched: list[dict[str, Any]]
    paired: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    regressions: list[dict[str, Any]]
    candidate_text: str
    # set once the rest is built (model._verdict reads the summary): present in every summary.json
    verdict: NotRequired[str]  # qualifies, required-proven, fails, not-proven
    exit_status: NotRequired[int]  # the report's exit code (README: verdicts and exit codes)
    qualifies: NotRequired[bool]
    candidates: NotRequired[list[dict[str, Any]]]  # candidate rows beside their base release (report.candidates)
    canaries: NotRequired[dict[str, Any]]  # only a run with canary rows (report.canaries)
