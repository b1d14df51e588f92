"""pytest plugin: tier gating with one-line skip reasons, failure classification, and tiers.json.

Loaded by tests/conftest.py, so plain ``pytest tests/tiers`` works in any environment (nox row venvs,
pre-provisioned GPU boxes, air-gapped clusters). Options:

  --tiers contract,reference   run only these tiers (default: all that this machine allows)
  --mtp-results PATH           write the per-tier verdicts, classified failures and metrics as JSON; the tiers'
                               server logs and GSM8K records go next to it (schema.py), handed to them by the
                               ``mtp_results_dir`` fixture
  --server-url URL             run the gsm8k tier against this running sglang server (repeatable; served.py)

Fixtures for the tiers: ``mtp_results_dir`` (where a tier writes what it keeps) and ``mtp_progress`` (one plain
line to the terminal, also from worker threads, shown under nox and plain pytest alike).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from mtpmatrix.core import expected, known_upstream, smoke_servers
from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.evidence import fingerprint
from mtpmatrix.core.expected import (
    summarize,  # per-tier verdicts from records: defined there, the runner merges with it
)
from mtpmatrix.core.failures import as_consequence, classify, missing_package, packages_left_half_imported
from mtpmatrix.core.kinds import KINDS
from mtpmatrix.core.record_types import CheckRecord, Failure, Fingerprint, Selection, Tiers, TiersFile
from mtpmatrix.core.schema import FAILING, SCHEMA, TIERS, parse_tiers
from mtpmatrix.core.side_by_side_rule import SHARED_MARK, shared_check
from mtpmatrix.serving import environment, served
from mtpmatrix.tiers.session import known_failures, provenance

_RECORDS_KEY = pytest.StashKey[list]()
_SETUP_SECONDS_KEY = pytest.StashKey[float]()
_START_KEY = pytest.StashKey[float]()
_CPU_KEY = pytest.StashKey[float]()  # this process's CPU seconds in the test's setup and call so far
SERVED_KEY = pytest.StashKey[list]()  # served.Served for every --server-url, read once at startup
_KNOWN_KEY = pytest.StashKey[list]()  # known_upstream.KnownIssue entries, loaded (and checked) at startup
_HALF_IMPORTED_KEY = pytest.StashKey[dict]()  # package -> (check id, kind) of the failure that left it half-imported
_COLLECTED_KEY = pytest.StashKey[dict]()  # {tier: [node ids]}: every check collected, before -k/-m/--deselect
_VERSIONS_KEY = pytest.StashKey[dict]()  # environment.versions(), read at the first failure (known upstream match)
_TIERS_KEY = pytest.StashKey[dict]()  # the judged tiers, at the session's end (the terminal summary reads them)
_ATTEMPTS_KEY = pytest.StashKey[dict]()  # {node id: times its setup ran}: more than once is a rerun
# the SGLANG_* and torch/CUDA/NCCL variables the session started with: what the box set, read before anything runs
# (importing sglang 0.5.17 itself sets TORCHINDUCTOR_CACHE_DIR and TRITON_PTXAS_BLACKWELL_PATH in the process)
_OUTSIDE_ENV_KEY = pytest.StashKey[dict]()


def pytest_addoption(parser):
    group = parser.getgroup("mtpmatrix")
    group.addoption(
        "--tiers",
        default=os.environ.get("MTPMATRIX_TIERS", ",".join(TIERS)),
        help="comma-separated tiers to run (default: all; env MTPMATRIX_TIERS)",
    )
    group.addoption(
        "--mtp-results",
        default=os.environ.get("MTPMATRIX_RESULTS"),
        help="write tier verdicts as JSON to this path; server logs and GSM8K records go to its folder "
        "(env MTPMATRIX_RESULTS)",
    )
    group.addoption(
        "--server-url",
        action="append",
        default=[],
        metavar="URL",
        help="run the gsm8k tier against this running sglang server instead of launching one "
        "(repeatable: add a no-MTP server of the same pair for speed-up and McNemar)",
    )


def _tier_of(item) -> str | None:
    for tier in TIERS:
        if item.get_closest_marker(tier):
            return tier
    return None


def _selected_tiers(config) -> list[str]:
    tiers = parse_tiers(config.getoption("--tiers"))
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise pytest.UsageError(f"--tiers: unknown tier(s) {', '.join(unknown)}; known: {', '.join(TIERS)}")
    return tiers


# The suite's markers, registered here (not only in pyproject.toml) so that --strict-markers holds wherever the
# plugin runs: a row's venv, a GPU box's plain pytest, the unit tests.
TIER_MARKERS = {
    "contract": "CPU tier that needs sglang (imports, ABI, config loading, ServerArgs resolution, meta_info fields)",
    "reference": "CPU tier that needs transformers >= 5.8 (greedy with assistant == greedy without, tiny pairs)",
    "smoke": "GPU tier: live sglang servers on tiny pairs",
    "gsm8k": "GPU tier with real weights (or --server-url): GSM8K 5-shot against live sglang servers",
}


def pytest_configure(config):
    config.stash[_OUTSIDE_ENV_KEY] = outside_env(os.environ)
    config.stash[_RECORDS_KEY] = []
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: {TIER_MARKERS[tier]}")
    config.addinivalue_line("markers", f"check(kind): what a failure of this test means, one of {', '.join(KINDS)}")
    config.addinivalue_line("markers", f"{SHARED_MARK}: a reference check the side-by-side sglang process runs")
    config.stash[_START_KEY] = time.monotonic()
    config.stash[SERVED_KEY] = []
    try:
        config.stash[_KNOWN_KEY] = known_upstream.load()
    except ValueError as exc:
        raise pytest.UsageError(f"known upstream issues: {exc}") from None
    urls = config.getoption("--server-url", default=None) or []
    if urls:
        if "gsm8k" not in _selected_tiers(config):
            raise pytest.UsageError("--server-url serves the gsm8k tier, which --tiers does not select")
        try:  # unreachable or not sglang: one line now, before any tier spends time
            config.stash[SERVED_KEY] = served.fetch_all(urls)
        except served.ServedError as exc:
            raise pytest.UsageError(str(exc)) from None
    if "smoke" in _selected_tiers(config):
        try:  # a bad MTPMATRIX_SMOKE_* value: one line now, not a collection error after minutes of setup
            smoke_servers.smoke_options()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None


def tier_unavailable(config, tier: str) -> str | None:
    """Why ``tier`` cannot run in this session (None: it can); the gsm8k tier against --server-url needs no GPU,
    weights or sglang here, only the servers."""
    if tier == "gsm8k" and config.stash.get(SERVED_KEY, None):
        return None
    return environment.tier_unavailable(tier)


@pytest.fixture(scope="session")
def mtp_results_dir(request, tmp_path_factory) -> Path:
    """The folder a tier writes what it keeps into (server logs, GSM8K records; names in schema.py): the folder of
    --mtp-results, which is the row folder under nox and tools/gpu_box.sh's work folder; a temp folder without it."""
    path = request.config.getoption("--mtp-results")
    if path:
        out = Path(path).resolve().parent
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path_factory.mktemp("mtp-results")


@pytest.fixture(scope="session")
def mtp_progress(request):
    """``say(line)``: one progress line on the terminal now, whatever pytest captures (long steps: server launches,
    GSM8K questions). Safe from threads."""
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            if tr is None:
                print(line, file=sys.stderr, flush=True)
                return
            # pytest captures fd 1/2 while fixtures and tests run: lift it for the line, or nothing shows until
            # the tier ends (what a 2-7 minute smoke tier used to look like)
            with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
                if getattr(getattr(tr, "_tw", None), "width_of_current_line", 0):
                    tr.write("\n")  # not glued to a row of progress dots
                tr.write_line(line)
                tr.flush()

    return say


@pytest.hookimpl(tryfirst=True)  # before pytest's own -k/-m/--deselect take items away: what was collected
def pytest_collection_modifyitems(config, items):
    selected = _selected_tiers(config)
    reasons: dict[str, str | None] = {}
    collected: dict[str, list[str]] = {}
    config.stash[_COLLECTED_KEY] = collected
    for item in items:
        tier = _tier_of(item)
        if tier is None:
            continue
        collected.setdefault(tier, []).append(item.nodeid)
        if shared_check(tier, item.nodeid):  # marked only: which process runs it is the -m of side_by_side
            item.add_marker(SHARED_MARK)
        if tier not in selected:
            item.add_marker(pytest.mark.skip(reason=f"{tier} tier not selected (--tiers {','.join(selected)})"))
            continue
        if tier not in reasons:
            reasons[tier] = tier_unavailable(config, tier)
        if reasons[tier]:
            item.add_marker(pytest.mark.skip(reason=f"{tier} tier: {reasons[tier]}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _count_cpu(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _count_cpu(item)


def _count_cpu(item):
    """Add this process's CPU seconds in the wrapped phase to the test's: on a busy machine wall seconds carry the
    other processes' load, CPU seconds only the check's own work (benchmarks/row_floor_bench.py reports them)."""
    start = time.process_time()
    try:
        yield
    finally:
        item.stash[_CPU_KEY] = item.stash.get(_CPU_KEY, 0.0) + time.process_time() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    tier = _tier_of(item)
    if tier is None:
        return
    attempts = item.config.stash.setdefault(_ATTEMPTS_KEY, {})
    if report.when == "setup":  # every run of a test starts with its setup: a second one is a rerun
        attempts[item.nodeid] = attempts.get(item.nodeid, 0) + 1
    if report.when == "setup" and report.passed:
        # Counted into the test's seconds: expensive shared work (the sglang import, server launches) happens in
        # fixtures, and a tier's time must include it.
        item.stash[_SETUP_SECONDS_KEY] = report.duration
    # One record per test: setup skips/errors, the call, or a teardown error.
    if (
        report.when == "call"
        or (report.when == "setup" and not report.passed)
        or (report.when == "teardown" and report.failed)
    ):
        marker = item.get_closest_marker("check")
        declared = marker.args[0] if marker and marker.args else None
        rec: CheckRecord = {
            "id": item.nodeid,
            "tier": tier,
            "outcome": report.outcome if report.when == "call" or report.skipped else "error",
            "seconds": round(
                report.duration + (item.stash.get(_SETUP_SECONDS_KEY, 0.0) if report.when == "call" else 0.0), 3
            ),
            "cpu_seconds": round(item.stash.get(_CPU_KEY, 0.0), 3),
            "metrics": {k: v for k, v in item.user_properties},
        }
        if report.skipped:
            rec["reason"] = _skip_reason(report)
        if report.failed and call.excinfo is not None:
            rec["failure"] = _classify_in_session(item, call.excinfo.value, declared)
            if report.when != "call":
                rec["outcome"] = "error"
        records = item.config.stash[_RECORDS_KEY]
        earlier = next((r for r in records if r["id"] == item.nodeid), None)
        reruns = attempts.get(item.nodeid, 1) - 1
        if earlier is not None and reruns > earlier.get("reruns", 0):
            # a rerun (a plugin ran the test again): one record per check, and a pass after a rerun is not a pass --
            # the first failure stands, with the number of reruns
            if earlier["outcome"] not in FAILING:
                earlier.update({k: v for k, v in rec.items() if k != "id"})
            earlier["reruns"] = reruns
            rec = earlier
        elif earlier is not None:  # a teardown error after the call: one record per check, the error stands
            earlier.update(outcome="error", failure=rec.get("failure"))
            rec = earlier
        else:
            records.append(rec)
        if report.failed:  # recorded whole above; what the terminal and junit.xml call it: known_failures.py
            _known_failure(item, report, rec, records)


def _known_failure(item, report, rec: CheckRecord, records: list[CheckRecord]) -> None:
    """A failure a known-upstream entry explains reads as pytest's xfail (known_failures.py); any other stays
    failed. Every failing report is kept for the session's end, which puts the terminal right (reconcile)."""
    config = item.config
    config.stash.setdefault(known_failures.FAILING_REPORTS_KEY, {}).setdefault(item.nodeid, []).append(report)
    if _VERSIONS_KEY not in config.stash:
        config.stash[_VERSIONS_KEY] = environment.versions()
    tier_records = [r for r in records if r["tier"] == rec["tier"]]
    issue = known_failures.match(config.stash.get(_KNOWN_KEY, []), config.stash[_VERSIONS_KEY], rec, tier_records)
    if issue is not None:
        known_failures.turn(report, known_failures.reason(issue))


def _classify_in_session(item, exc: BaseException, declared: str | None) -> Failure:
    """classify(), plus what an earlier failure of this session explains: a failure that only follows from a
    package an earlier check's failure left half-imported takes that failure's kind and points at it."""
    failure = classify(exc, declared).as_dict()
    half = item.config.stash.setdefault(_HALF_IMPORTED_KEY, {})
    package = missing_package(exc)
    if package is not None and package in half:
        failure = as_consequence(failure, package, *half[package])
    for pkg in packages_left_half_imported(exc):
        half.setdefault(pkg, (item.nodeid, failure["kind"]))
    return failure


def _skip_reason(report) -> str:
    lr = report.longrepr
    text = str(lr[2]).removeprefix("Skipped: ") if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return " ".join(ln.strip() for ln in text.splitlines() if ln.strip())  # one line, whatever pytest.skip got


# Exit statuses of a session that did not run to its end (collection error, Ctrl-C, internal error).
_INCOMPLETE = (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR)


def mark_incomplete(tiers: Tiers, selected: list[str], exitstatus: int, detail: str = "") -> Tiers:
    """A session that stopped early qualifies nothing: every selected tier that has not already failed becomes
    'error' (harness). Without this a collection error, which runs no test at all, reads as 'skipped'."""
    if exitstatus not in _INCOMPLETE:
        return tiers
    reason = f"pytest stopped early (exit {int(exitstatus)}){': ' + detail if detail else ''}; see the pytest output"
    for tier in selected:
        entry = tiers.get(tier)
        if entry is None or entry["verdict"] in FAILING:
            continue
        entry["verdict"] = "error"
        entry["incomplete"] = True
        entry["reason"] = reason
        entry["failure_kinds"] = sorted(set(entry.get("failure_kinds", [])) | {"harness"})
    return tiers


def _collection_errors(session) -> str:
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    errors = [r for r in (tr.stats.get("error", []) if tr is not None else []) if isinstance(r, pytest.CollectReport)]
    if not errors:
        return ""
    return f"{len(errors)} collection error(s), first in {errors[0].nodeid or 'the session'}"


def outside_env(env) -> dict[str, dict[str, str]]:
    """The variables of ``env`` that sglang (SGLANG_* / SGL_*) and torch, CUDA, NCCL, Triton read, as recorded."""
    return {"sglang_env": expected.sglang_env(env), "torch_env": expected.torch_env(env)}


def selection(config) -> Selection:
    """What this session was asked to run (mtpmatrix.core.expected reads it): its args, the deselecting options, the
    positional paths (node ids), every MTPMATRIX_* knob, every SGLANG_* / SGL_* variable and every variable torch,
    CUDA, NCCL or Triton read (as the session started), and the checks collected per tier."""
    started = config.stash.get(_OUTSIDE_ENV_KEY, None) or outside_env(os.environ)
    return {
        "args": [str(a) for a in config.invocation_params.args],
        "paths": [str(a) for a in config.args],
        "keyword": config.getoption("keyword", default="") or "",
        "markexpr": config.getoption("markexpr", default="") or "",
        "deselect": [str(d) for d in config.getoption("deselect", default=None) or []],
        "maxfail": config.getoption("maxfail", default=0) or 0,
        "knobs": expected.knobs(os.environ),
        "sglang_env": started["sglang_env"],
        "torch_env": started["torch_env"],
        "collected": config.stash.get(_COLLECTED_KEY, {}),
    }


def suite_fingerprint() -> Fingerprint:
    """evidence.fingerprint.describe() of the suite this session ran, or why there is none."""
    try:
        return fingerprint.describe()
    except (fingerprint.FingerprintError, OSError) as exc:
        return {"suite": None, "error": str(exc)}


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--mtp-results")
    if not path and not session.config.stash.get(known_failures.FAILING_REPORTS_KEY, None):
        return
    records = session.config.stash[_RECORDS_KEY]
    versions = environment.versions()
    chosen = selection(session.config)
    issues = session.config.stash.get(_KNOWN_KEY, None)
    # judged against the expected sets with the known upstream list (the derivation import and the report run
    # again); then a session that stopped early is an error whatever its checks hit, known upstream ones included
    tiers = expected.judge_tiers(summarize(records), chosen, versions, issues)
    tiers = mark_incomplete(tiers, _selected_tiers(session.config), exitstatus, _collection_errors(session))
    # the terminal's xfailed and failed, and the exit status, from the judged tags (pytest prints its summary next)
    known_failures.reconcile(session, tiers, issues or [])
    session.config.stash[_TIERS_KEY] = tiers
    if not path:
        return
    written: TiersFile = {
        "schema": SCHEMA,
        "fingerprint": suite_fingerprint(),  # which suite wrote this: the report refuses another suite's records
        "tiers": tiers,
        "selection": chosen,
        "versions": versions,
        "gpus": environment.gpu_count() if environment.has_module("sglang") else 0,
        "gpu_names": environment.gpu_names() if environment.has_module("sglang") else [],
        "build": environment.build(),  # Python, platform, torch's build: part of the row's identity
        "pytest": provenance.record(session.config),  # plugins, options from every source, conftests
        "session_id": uuid.uuid4().hex,  # one session proves one row (evidence/run.py)
        "seconds": round(time.monotonic() - session.config.stash[_START_KEY], 3),
        "exitstatus": int(session.exitstatus),  # known upstream failures are xfails: 0 when only they failed
    }
    atomic_write_json(path, written)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    known_failures.terminal_summary(terminalreporter, config.stash.get(_TIERS_KEY, {}))


def pytest_report_header(config):
    selected = _selected_tiers(config)
    lines = []
    for tier in selected:
        why = tier_unavailable(config, tier)
        lines.append(f"mtpmatrix tier {tier}: " + (f"skip ({why})" if why else "available"))
    for s in config.stash.get(SERVED_KEY, []):
        lines.append(f"mtpmatrix gsm8k server {s.url}: {s.case_id} (model {s.model_path}, sglang {s.version or '?'})")
    return lines
