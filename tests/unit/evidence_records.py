"""Records as today's suite writes them, for tests that need evidence that holds: ``stamp`` gives a hand-made run
what every run now carries (the manifest, the suite's fingerprint on every record, tiers.json and junit.xml beside
it saying the same outcomes); ``write_junit`` writes a junit.xml of check records."""

from __future__ import annotations

import copy
import json
import secrets
from pathlib import Path
from xml.sax.saxutils import quoteattr

from mtpmatrix.core.atomic import atomic_write_json, read_json, read_json_or_gzip
from mtpmatrix.core.evidence import expected_checks, fingerprint, manifest

_JUNIT_TAG = {"failed": "failure", "error": "error", "skipped": "skipped"}


def write_junit(path: Path, checks: list[dict]) -> None:
    cases = []
    for c in checks:
        f, name = c["id"].split("::", 1)
        tag = _JUNIT_TAG.get(c["outcome"])
        inner = f'<{tag} message="x" />' if tag else ""
        if c.get("known_upstream") and c["outcome"] in ("failed", "error"):  # the plugin's xfail (known_failures.py)
            inner = f'<skipped type="pytest.xfail" message={quoteattr(c["known_upstream"] + ": https://x")} />'
        cases.append(
            f'<testcase classname="x" name={quoteattr(name)} file={quoteattr(f)} time="0.1">{inner}</testcase>'
        )
    Path(path).write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )


def whole(record: dict) -> dict:
    """A hand-made CPU tier whose every check passed stands for its whole expected set passing: the ids of the
    project's definition it lacks are added, passed, and counted as collected."""
    for tier in ("contract", "reference"):
        entry = (record.get("tiers") or {}).get(tier)
        checks = (entry or {}).get("checks") or []
        if not checks or entry.get("verdict") != "passed" or any(c["outcome"] != "passed" for c in checks):
            continue
        have = {c["id"] for c in checks}
        extra = [
            {"id": i, "tier": tier, "outcome": "passed", "seconds": 0.1, "metrics": {}}
            for i in (expected_checks.load(expected_checks.FILE) or {}).get(tier, ())
            if i not in have
        ]
        entry["checks"] = checks + extra
        collected = (record.get("selection") or {}).get("collected")
        if isinstance(collected, dict):
            collected[tier] = list(collected.get(tier) or []) + [c["id"] for c in extra]
    return record


def session_fields(record: dict) -> dict:
    """What today's plugin records of how a hand-made record's session ran, as its row would have it: a clean
    pytest (no other plugin, option or conftest), the row's Python, torch as its versions say (built for CUDA on a
    box with GPUs: the row's cuNNN, else PyPI's 13.0 as the H200 ran it), a GPU name per GPU."""
    row, versions = record.get("row") or {}, record.get("versions") or {}
    backend = str(row.get("torch_backend") or "")
    cuda = f"{backend[2:-1]}.{backend[-1]}" if backend.startswith("cu") else "13.0"
    return {
        "pytest": dict(H200_PYTEST, plugins=[]),
        "build": {
            "python": versions.get("python") or f"{row.get('python') or '3.11'}.0",
            "implementation": "cpython",
            "platform": "linux-x86_64",
            "torch": versions.get("torch"),
            "torch_cuda": cuda if record.get("gpus") else None,
        },
        "gpu_names": ["NVIDIA H200"] * (record.get("gpus") or 0),
        "session_id": secrets.token_hex(16),
    }


def stamp_row(row_dir: Path, suite: dict | None = None, complete_cpu_tiers: bool = False) -> dict:
    """Give one row folder today's evidence: its record names this checkout's suite and how its session ran
    (``session_fields``), tiers.json and junit.xml agree with it, its passing CPU tiers are whole (``whole``).
    Returns the record."""
    suite = suite or fingerprint.describe()
    f = Path(row_dir) / "row.json"
    record = whole(read_json(f)) if complete_cpu_tiers else read_json(f)
    record["fingerprint"] = suite
    record["run_id"] = Path(row_dir).parent.name
    for key, value in session_fields(record).items():
        record.setdefault(key, value)
    atomic_write_json(f, record)
    tiers = record.get("tiers") or {}
    checks = [c for t in tiers.values() for c in t.get("checks") or []]
    if checks:
        atomic_write_json(
            Path(row_dir) / "tiers.json",
            {
                "schema": record.get("schema"),
                "fingerprint": suite,
                "tiers": tiers,
                "selection": record.get("selection"),
                "versions": record.get("versions") or {},
                **{k: record[k] for k in ("pytest", "build", "gpu_names", "session_id")},
            },
        )
        write_junit(Path(row_dir) / "junit.xml", checks)
    return record


def stamp(run_dir: Path, rows: list[str] | None = None, complete_cpu_tiers: bool = False) -> None:
    """Stamp every row folder of ``run_dir`` and write the run's manifest planning them (``rows``: plan these)."""
    suite = fingerprint.describe()
    records = {
        f.parent.name: stamp_row(f.parent, suite, complete_cpu_tiers) for f in sorted(Path(run_dir).glob("*/row.json"))
    }
    plan = {rid: manifest.planned_row(rec["row"]) for rid, rec in records.items()}
    for rid in rows or []:
        plan.setdefault(rid, {"pins": {}})
    overrides = sorted({o for rec in records.values() for o in rec.get("overrides") or []})
    atomic_write_json(
        manifest.path(run_dir),
        {
            "schema": manifest.SCHEMA,
            "run_id": Path(run_dir).name,
            "created": manifest.now(),
            "fingerprint": suite,
            "invocation": {"argv": ["nox"], "overrides": overrides, "knobs": {}},
            "rows": plan,
            "not_run": {},
            "resumed": [],
        },
    )


def stamp_all(results: Path) -> None:
    for run_dir in sorted(p for p in Path(results).iterdir() if p.is_dir()):
        stamp(run_dir, complete_cpu_tiers=True)


def load(path: Path):
    return json.loads(Path(path).read_text())


def define_expected(monkeypatch, folder: Path, ids: dict[str, list[str]]) -> Path:
    """Judge a made-up suite against its own definition (MTPMATRIX_EXPECTED_CHECKS): ``ids`` per tier, the rest
    empty. For tests of mechanics (merging, the plugin), never of the qualification suite."""
    from mtpmatrix.core.schema import TIERS

    path = Path(folder) / "expected_checks.json"
    path.write_text(json.dumps({"tiers": {t: list(ids.get(t, [])) for t in TIERS}}))
    monkeypatch.setenv(expected_checks.ENV, str(path))
    return path


H200_RECORD = (
    Path(__file__).resolve().parents[2] / "docs" / "runs" / "2026-12-01c-h200-sglang-0.5.17-smoke-default.json.gz"
)
REQUEST_SURFACE_RECORD = H200_RECORD.with_name("2026-12-02b-h200-sglang-0.5.17-request-surface-baseline.json.gz")
# The row the H200 record proves: sglang 0.5.17's pins on Python 3.12 with PyPI's torch, which the box ran (its env.txt,
# docs/runs/env-7-r17-final.txt: "3.12.3 torch 2.11.0+cu130 cuda 13.0"), not the Python 3.11 row sglang-0.5.17.
H200_ROW = "sglang-0.5.17-py312"
# What today's plugin records of that box beyond the checks: the build (env.txt above; the bundle's wheels are
# x86_64, shared/device/make_bundle.sh), its one GPU (env.txt: "NVIDIA H200"), and the pytest plugins of the
# packages the device has installed (shared/device/device-packages.txt: their versions were not recorded).
H200_BUILD = {
    "python": "3.12.3",
    "implementation": "cpython",
    "platform": "linux-x86_64",
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
}
H200_PLUGINS = [
    {"name": name, "module": module, "dist": dist, "version": None}
    for name, module, dist in (
        ("anyio", "anyio.pytest_plugin", "anyio"),
        ("hypothesispytest", "_hypothesis_pytestplugin", "hypothesis"),
        ("benchmark", "pytest_benchmark.plugin", "pytest-benchmark"),
        ("pytest_cov", "pytest_cov.plugin", "pytest-cov"),
        ("pytest_mock", "pytest_mock", "pytest-mock"),
        ("timeout", "pytest_timeout", "pytest-timeout"),
        ("xdist.plugin", "xdist.plugin", "pytest-xdist"),
        ("xdist.looponfail", "xdist.looponfail", "pytest-xdist"),
    )
]
H200_PYTEST = {
    "version": None,
    "inifile": "pyproject.toml",
    "ini_addopts": ["-ra", "--strict-markers"],
    "env_addopts": None,
    "override_ini": [],
    "runxfail": False,
    "conftests": ["tests/conftest.py"],
    "plugins": H200_PLUGINS,
}


def h200_record() -> dict:
    """The real H200 smoke record (60 passed, the draft-phase check known upstream) as today's suite writes it: its
    fingerprint today's, and the smoke checks the suite has grown since it was recorded (the request surface, 4 more
    servers) added, so it is a whole record of today's suite for the evidence rules these tests are about: each as
    the H200 recorded it on the same release later (REQUEST_SURFACE_RECORD: 9 of the servers, the four known-upstream
    deviations failing), as intact 0.5.17 is predicted to run it where no GPU has yet (predicted_on_0_5_17), the rest
    passed."""
    from mtpmatrix.core.evidence import expected_checks

    data = read_json_or_gzip(H200_RECORD)
    data["fingerprint"] = fingerprint.describe()
    smoke = data["tiers"]["smoke"]
    have = {c["id"] for c in smoke["checks"]}
    later = {c["id"]: c for c in read_json_or_gzip(REQUEST_SURFACE_RECORD)["tiers"]["smoke"]["checks"]}
    grown = [i for i in expected_checks.load()["smoke"] if i not in have]
    smoke["checks"] += [
        measured_on_0_5_17(i)
        or later.get(i)
        or predicted_on_0_5_17(i)
        or {"id": i, "tier": "smoke", "outcome": "passed", "seconds": 0.1, "metrics": {}}
        for i in grown
    ]
    collected = data["selection"]["collected"]
    collected["smoke"] = list(collected.get("smoke", [])) + grown
    data.update(pytest=copy.deepcopy(H200_PYTEST), build=dict(H200_BUILD), gpu_names=["NVIDIA H200"])
    return data


MEASURED_0_5_17 = H200_RECORD.with_name("2026-12-05b-h200-sglang-0.5.17-smoke-default.json.gz")


def measured_on_0_5_17(check_id: str) -> dict | None:
    """The record of a check that intact 0.5.17 failed on the H200 (2026-12-05, the second GPU session), as it
    recorded it, where a known-upstream entry matches that failure (the Triton sliding-window deviations, the
    token_ids_logprob mixed-batch crash, the topk 1 hidden states); None for any other check (the record's other
    failures were the suite's own check defects, fixed since)."""
    from mtpmatrix.core import known_upstream

    if not hasattr(measured_on_0_5_17, "found"):
        data = read_json_or_gzip(MEASURED_0_5_17)
        checks = data["tiers"]["smoke"]["checks"]
        entries = [k for k in known_upstream.load() if k.applies_to(data["versions"])]
        measured_on_0_5_17.found = {
            c["id"]: dict(c, metrics=_without_launch(c.get("metrics") or {}))
            for c in checks
            if c.get("outcome") == "failed" and any(k.matches(c, checks) for k in entries)
        }
        # the abort on the paged topk 3 server was never sent there (a check defect, fixed): its neighbour's reads,
        # recorded beside it, are the tree verify's, which the abort check now names
        abort = "tests/tiers/test_smoke_long.py::test_long_abort_leaves_neighbours_exact[long-witness-mtp-topk3-paged]"
        neighbour = next(
            c for c in checks if c["id"].endswith("test_long_requests_run_to_the_limit[long-witness-mtp-topk3-paged]")
        )["metrics"]["reads"]["abort neighbour 0"]["reads"]
        from mtpmatrix.tiers.surface import long_deviations as lc

        assert lc.tree_reads_short(neighbour), neighbour
        message = f"1 problem(s) over the abort group; first: abort neighbour 0: {lc.TREE_SHORT} (the reads recorded)"
        failure = {"kind": "mismatch", "type": "CheckFailure", "message": message, "frame": None, "raised_at": None}
        measured_on_0_5_17.found[abort] = {
            "id": abort,
            "tier": "smoke",
            "outcome": "failed",
            "seconds": 0.1,
            "metrics": {},
            "failure": failure,
        }
    found = measured_on_0_5_17.found.get(check_id)
    return copy.deepcopy(found) if found else None  # each record its own: tests change the checks they are given


def _without_launch(metrics: dict) -> dict:
    """A check's metrics less the server's launch: the record these checks join keeps its own launch numbers."""
    return {k: v for k, v in metrics.items() if k not in ("launch_seconds", "server_log", "first_attempt_error")}


def predicted_on_0_5_17(check_id: str) -> dict | None:
    """The record of a check that intact 0.5.17 is predicted from its source (not yet on a GPU) to fail, as the check
    words the failure: the custom-logit-processor request on an MTP witness server comes back as the unmodified
    chain (docs/upstream/sglang-mtp-verify-skips-custom-logit-processor.md); None for any other check."""
    from mtpmatrix.tiers.surface import features

    head = "tests/tiers/test_smoke_features.py::test_feature_matches_no_mtp["
    tail = f"-{features.CUSTOM}]"
    server = check_id[len(head) : -len(tail)] if check_id.startswith(head) and check_id.endswith(tail) else None
    if server is None or server == "witness-nomtp":
        return None
    why = features.predicted(features.CUSTOM, features.chain(features.CUSTOM))
    doc = "docs/upstream/sglang-mtp-verify-skips-custom-logit-processor.md"
    return {
        "id": check_id,
        "tier": "smoke",
        "outcome": "failed",
        "seconds": 0.1,
        "metrics": {},
        "failure": {
            "kind": "mismatch",
            "type": "CheckFailure",
            "message": f"{features.CUSTOM} on {server}: {why} (predicted for intact sglang: {doc})",
            "frame": None,
            "raised_at": "tests/tiers/test_smoke_features.py:68 in test_feature_matches_no_mtp",
        },
    }


def write_box(out: Path, data: dict, pytest_args=("--tiers", "smoke"), knobs=None) -> Path:
    """A tools/gpu_box.sh output folder holding ``data`` as its tiers.json, tagged with a fresh invocation id and
    session id (each box one run of its own, as gpu_box.sh and the plugin make them)."""
    out.mkdir(parents=True, exist_ok=True)
    invocation_id = secrets.token_hex(16)
    knobs = {"MTPMATRIX_TINY_DIR": "/root/out/work/tiny", "MTPMATRIX_INVOCATION_ID": invocation_id, **(knobs or {})}
    data = copy.deepcopy(data)
    data["selection"]["knobs"] = dict(knobs)
    data.setdefault("session_id", secrets.token_hex(16))
    (out / "tiers.json").write_text(json.dumps(data))
    write_junit(out / "junit.xml", [c for t in data["tiers"].values() for c in t["checks"]])
    (out / "pytest.log").write_text("61 passed\n")
    (out / "env.txt").write_text("2026-12-01T21:00:00Z\nNVIDIA H200, 143771 MiB, 580.159.04\n")
    (out / "invocation.json").write_text(
        json.dumps(
            {"invocation_id": invocation_id, "tests": ["tests/tiers"], "pytest_args": list(pytest_args), "knobs": knobs}
        )
    )
    return out
