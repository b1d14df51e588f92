"""How a row's session ran, judged: what can change an outcome without changing a test, and the build a row's
identity includes beside its pins. Each answer that is "no" is a problem (record_types.problem): the tier or the row
proves nothing.

  pytest      the record names the plugins it loaded, the options from every source and the conftest files; a
              plugin this judge does not list (PLUGINS_THAT_CANNOT_TURN_A_FAILURE_INTO_A_PASS), a conftest that is
              not the suite's, a config file other than the suite's pyproject.toml, PYTEST_ADDOPTS, -o, --runxfail
  reruns      a check recorded passed after a rerun (the plugin keeps the first failure: a pass after a rerun is
              not a pass)
  GPUs        a smoke tier that passed on a box with no GPU; GPU names that are not as many as the GPUs counted; a
              GPU tier that passed on its own servers with a torch built without CUDA
  build       the record names its Python, platform and torch build; Python is the row's, torch's local version
              (``+cu128``, none for PyPI's wheels) and CUDA are the row's torch backend's
  one session the session (its id, gpu_box.sh's invocation id) is filed as one row of the run, no more
"""

from __future__ import annotations

import re

from mtpmatrix.core.paths import SUITE
from mtpmatrix.core.record_types import PlannedRow, Problem, RowRecord, problem
from mtpmatrix.core.schema import FAILING, GPU_TIERS, SERVED, short_check_id

# Plugins a GPU box may carry (the lent H200's own packages: shared/device/device-packages.txt) that cannot turn a
# failure into a pass of this suite; tests/unit/test_evidence_hostile.py fails when tests/tiers starts to use one.
PLUGINS_THAT_CANNOT_TURN_A_FAILURE_INTO_A_PASS = {
    "anyio": "runs only tests marked anyio: tests/tiers has none",
    "hypothesis": "acts only on @given tests: tests/tiers has none",
    "jaxtyping": "acts only with its --jaxtyping-* options (an import hook over named packages), judged below",
    "pytest-benchmark": "a fixture tests/tiers does not use",
    "pytest-cov": "measures coverage, with --cov only",
    "pytest-mock": "a fixture tests/tiers does not use",
    "pytest-timeout": "can only fail a check that runs too long",
    "pytest-xdist": "with -n the workers' checks never reach this session's record: not run, never passed",
}
SUITE_CONFIG = "pyproject.toml"
INVOCATION_KNOB = "MTPMATRIX_INVOCATION_ID"


def _canonical(name: object) -> str | None:
    return str(name).lower().replace("_", "-").replace(".", "-") if name else None


def _suite_conftest(path: str) -> bool:
    return path == "tests/conftest.py" or (path.startswith(SUITE + "/") and path.endswith("/conftest.py"))


def _pytest(record: RowRecord) -> list[Problem]:
    rec = record.get("pytest")
    if not isinstance(rec, dict):
        return [
            problem(
                None,
                "the record does not say which pytest plugins, options and conftest files ran (written before "
                "sessions recorded them)",
            )
        ]
    out = []
    for p in rec.get("plugins") or []:
        p = p if isinstance(p, dict) else {"name": str(p)}
        if _canonical(p.get("dist")) in PLUGINS_THAT_CANNOT_TURN_A_FAILURE_INTO_A_PASS:
            continue
        where = f"{p.get('dist')} {p.get('version') or '?'}" if p.get("dist") else p.get("module") or "?"
        out.append(
            problem(
                None,
                f"pytest plugin {p.get('name')} ({where}) loaded: one this judge does not know may change any outcome",
            )
        )
    asked = sorted(k for k, v in (rec.get("options") or {}).items() if k.startswith("jaxtyping") and v)
    if asked:
        out.append(problem(None, f"pytest ran with {', '.join(asked)}: jaxtyping type-checks the packages it names"))
    for c in rec.get("conftests") or []:
        if not _suite_conftest(str(c)):
            out.append(problem(None, f"{c} loaded: not one of the suite's files"))
    if rec.get("inifile") != SUITE_CONFIG:
        out.append(
            problem(
                None, f"pytest read its config from {rec.get('inifile') or 'nothing'}, not the suite's {SUITE_CONFIG}"
            )
        )
    if rec.get("env_addopts"):
        out.append(problem(None, f"pytest ran with PYTEST_ADDOPTS={rec['env_addopts']!r}: options nobody asked for"))
    for o in rec.get("override_ini") or []:
        out.append(problem(None, f"pytest ran with -o {o}"))
    if rec.get("runxfail"):
        out.append(problem(None, "pytest ran with --runxfail"))
    return out


def _reruns_and_gpus(record: RowRecord) -> list[Problem]:
    out = []
    gpus = record.get("gpus") or 0
    for tier, entry in (record.get("tiers") or {}).items():
        passed = False
        for chk in entry.get("checks") or []:
            reruns = chk.get("reruns") or 0
            if reruns and chk.get("outcome") not in FAILING:
                out.append(
                    problem(
                        tier,
                        f"{short_check_id(chk['id'])}: passed after {reruns} rerun(s): a pass after a rerun is not a pass",
                    )
                )
            passed = passed or chk.get("outcome") == "passed"
        if tier == "smoke" and passed and gpus < 1:
            out.append(problem(tier, f"smoke passed on a box with {gpus} GPU(s)"))
    names = record.get("gpu_names")
    if isinstance(names, list) and len(names) != gpus:
        out.append(problem(None, f"the record names {len(names)} GPU(s) and counts {gpus}"))
    return out


def _cuda_of(backend: str) -> str:
    """'cu128' -> '12.8'."""
    digits = backend[2:]
    return f"{digits[:-1]}.{digits[-1]}"


def _build(record: RowRecord, planned: PlannedRow | None) -> list[Problem]:
    from packaging.version import InvalidVersion, Version

    row = record.get("row") or {}
    out = []
    if planned is not None:
        differ = [k for k in ("python", "torch_backend") if k in planned and planned[k] != row.get(k)]
        if differ:
            out.append(problem(None, f"the row's {' and '.join(differ)} are not the ones the run planned"))
    b = record.get("build")
    if not isinstance(b, dict):
        return out + [
            problem(
                None,
                "the record does not say which build ran (Python, platform, torch): written before sessions recorded it",
            )
        ]
    versions = record.get("versions") or {}
    python, want = b.get("python") or versions.get("python"), row.get("python")
    # a release of the row's Python (3.12 -> 3.12.3): not a pre-release (3.12.3rc1), not any text that starts so
    if want and not (python == want or re.fullmatch(rf"{re.escape(str(want))}\.\d+", str(python))):
        out.append(problem(None, f"Python {python} ran, the row is Python {want}"))
    if not b.get("platform"):
        out.append(problem(None, "the record does not name its platform"))
    dist, cuda, backend = versions.get("torch"), b.get("torch_cuda"), row.get("torch_backend")
    try:
        local = Version(dist).local if dist else None
    except InvalidVersion:
        return out + [problem(None, f"torch {dist}: not a version")]
    what = f"PyPI's build (CUDA {cuda or '?'})" if local is None else f"the {local} build"
    if backend == "pypi" and local is not None:
        out.append(problem(None, f"torch {dist} is not PyPI's build, the row's is PyPI's"))
    elif backend not in (None, "pypi", "auto") and local != backend:
        out.append(problem(None, f"torch {dist} is {what}, the row's is {backend}"))
    elif backend and backend.startswith("cu") and cuda and cuda != _cuda_of(backend):
        out.append(
            problem(None, f"torch {dist} is built for CUDA {cuda}, the row's {backend} is CUDA {_cuda_of(backend)}")
        )
    own = b.get("torch")
    if own and dist and str(own).split("+")[0] != str(dist).split("+")[0]:
        out.append(problem(None, f"torch's own version {own} is not the installed {dist}"))
    return out


def _gpu_tiers_on_a_torch_without_cuda(record: RowRecord) -> list[Problem]:
    """A GPU tier that passed a check on the session's own servers while the recorded torch has no CUDA: the record
    contradicts itself (a check served by a --server-url server, ``served``, ran its GPU work elsewhere)."""
    b = record.get("build")
    if not isinstance(b, dict) or b.get("torch_cuda"):
        return []
    out = []
    for tier in GPU_TIERS:
        checks = (record.get("tiers") or {}).get(tier, {}).get("checks") or []
        if any(c.get("outcome") == "passed" and SERVED not in (c.get("metrics") or {}) for c in checks):
            out.append(
                problem(
                    tier, f"{tier} passed on torch {b.get('torch')}, built without CUDA: a GPU tier cannot pass there"
                )
            )
    return out


def judge(record: RowRecord, planned: PlannedRow | None) -> list[Problem]:
    """Every problem with how ``record``'s session ran (a record whose tiers ran checks; ``planned``: the manifest's
    plan of its row, None without one)."""
    return (
        _pytest(record)
        + _reruns_and_gpus(record)
        + _build(record, planned)
        + _gpu_tiers_on_a_torch_without_cuda(record)
    )


def session_ids(record: RowRecord) -> list[str]:
    """What names the one session (and box invocation) that wrote ``record``."""
    knobs = (record.get("selection") or {}).get("knobs") or {}
    ids = [f"session {record['session_id']}"] if isinstance(record.get("session_id"), str) else []
    if isinstance(knobs.get(INVOCATION_KNOB), str):
        ids.append(f"invocation {knobs[INVOCATION_KNOB]}")
    return ids


def shared_sessions(rows: dict[str, RowRecord]) -> dict[str, list[Problem]]:
    """{row id: [problem]} for rows of one run written by one session: one session proves one row."""
    by_id: dict[str, list[str]] = {}
    for rid, rec in rows.items():
        for sid in session_ids(rec) if not rec.get("unreadable") else []:
            by_id.setdefault(sid, []).append(rid)
    out: dict[str, list[Problem]] = {}
    for rids in by_id.values():
        for rid in rids if len(rids) > 1 else []:
            others = ", ".join(r for r in rids if r != rid)
            out.setdefault(rid, []).append(
                problem(None, f"the session that wrote it is also filed as {others}: one session proves one row")
            )
    return out
