"""The release gate on synthetic runs in the results layout: a tier is complete only when its expected set
(mtpmatrix.core.expected: the gsm8k seed cases, the default smoke servers x their checks, every collected contract and
reference check) ran and passed, and QUALIFIES needs every required tier complete in every row.

The rows are built from the same definitions the gate uses (settings' seed pairs and topks, smoke's default
servers), so a server or pair added there changes what a complete row holds here too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evidence_records import stamp

from mtpmatrix.__main__ import main
from mtpmatrix.core import schema, settings
from mtpmatrix.core.atomic import read_json_or_gzip
from mtpmatrix.core.evidence import expected_checks
from mtpmatrix.core.smoke_servers import DEFAULT_SMOKE_SERVERS
from mtpmatrix.report import render as report_render
from mtpmatrix.report import summary as report_summary

FILES = {t: f"tests/tiers/test_{t}.py" for t in schema.TIERS}
VERSIONS = {"sglang": "0.5.17", "transformers": "5.12.1", "torch": "2.11.0", "python": "3.11.9"}
TP2_SKIP = "{pair} needs TP 2, this machine has 1 GPU (MTPMATRIX_{key}_TP overrides)"
SEED = [(p, k) for p in settings.DEFAULT_PAIRS for k in settings.TOPKS]


def check(tier: str, func: str, case: str | None = None, outcome: str = "passed", **extra) -> dict:
    nodeid = f"{FILES[tier]}::{func}" + (f"[{case}]" if case else "")
    return {"id": nodeid, "tier": tier, "outcome": outcome, "seconds": 1.0, "metrics": {}, **extra}


def accuracy_metrics(pair: str, n: int = settings.GSM8K_NUM_EXAMPLES, threshold="seed") -> dict:
    thr = settings.PAIRS[pair].threshold if threshold == "seed" else threshold
    return {
        schema.SCORE: 0.9,
        schema.NUM_EXAMPLES: n,
        schema.NUM_CORRECT: int(0.9 * n),
        schema.THRESHOLD: thr,
        schema.GATED: thr is not None,
    }


def _defined(tier: str, case: str | None = None) -> list[str]:
    """The project's expected check ids of ``tier`` (of one case or server when given)."""
    return [i for i in expected_checks.load()[tier] if case is None or schema.check_param(i) == case]


def _func(check_id: str) -> str:
    return schema.short_check_id(check_id).split("[", 1)[0]


def gsm8k_case(pair: str, topk: int, skip: str | None = None, **acc) -> list[dict]:
    case = f"{pair}-topk{topk}"
    ids = _defined("gsm8k", case) or [
        f"{FILES['gsm8k']}::{f}[{case}]" for f in ("test_args", "test_accuracy", "test_acceptance")
    ]
    if skip:
        return [check("gsm8k", _func(i), case, "skipped", reason=skip) for i in ids]
    metrics = {
        "test_accuracy": accuracy_metrics(pair, **acc),
        "test_acceptance": {schema.ACCEPT_LENGTH: 3.1, schema.MIN_ACCEPT_LENGTH: settings.MIN_ACCEPT_LENGTH},
    }
    return [check("gsm8k", _func(i), case, metrics=dict(metrics.get(_func(i), {}))) for i in ids]


def smoke_server(name: str, outcome: str = "passed") -> list[dict]:
    """The expected smoke checks of the server ``name``, as defined (their own files: test_smoke*.py)."""
    return [dict(check("smoke", _func(i), name, outcome), id=i) for i in _defined("smoke", name)]


def full_checks() -> dict[str, list[dict]]:
    """Every expected check of every tier, passed (the project's definition, evidence/expected_checks.py)."""
    return {
        "contract": [dict(check("contract", ""), id=i) for i in _defined("contract")],
        "reference": [dict(check("reference", ""), id=i) for i in _defined("reference")],
        "smoke": [dict(check("smoke", ""), id=i) for i in _defined("smoke")],
        "gsm8k": [c for p, k in SEED for c in gsm8k_case(p, k)],
    }


def selection(
    checks: dict[str, list[dict]],
    *,
    knobs: dict | None = None,
    keyword: str = "",
    collected: dict[str, list[dict]] | None = None,
    args: list[str] | None = None,
) -> dict:
    """What the plugin records of a session: its args, knobs and every check it collected (before -k)."""
    return {
        "args": args or ["tests/tiers"],
        "paths": ["tests/tiers"],
        "keyword": keyword,
        "markexpr": "",
        "deselect": [],
        "maxfail": 0,
        "knobs": dict(knobs or {}),
        "collected": {t: [c["id"] for c in cs] for t, cs in (collected or checks).items()},
    }


def write_row(
    results: Path,
    run_id: str,
    row_id: str,
    checks: dict[str, list[dict]],
    sel: dict | None,
    versions: dict | None = None,
    tier_extra: dict | None = None,
) -> dict:
    tiers = {}
    for t in schema.TIERS:
        cs = checks.get(t, [])
        outcomes = [c["outcome"] for c in cs]
        tiers[t] = {
            "verdict": schema.worst(outcomes) if cs else "skipped",
            "seconds": 1.0,
            "checks": cs,
            **(tier_extra or {}).get(t, {}),
        }
    rec = {
        "schema": schema.SCHEMA,
        "row": {"id": row_id, "pins": {}, "python": "3.11"},
        "overrides": [],
        "install": {"verdict": "passed"},
        "versions": dict(versions or VERSIONS),
        "tiers": tiers,
        "gpus": 2,
        "verdict": "passed",
    }
    if sel is not None:
        rec["selection"] = sel
    d = results / run_id / row_id
    d.mkdir(parents=True)
    for c in tiers["gsm8k"]["checks"]:  # the per-question records a passed score stands on
        m = c["metrics"]
        if schema.NUM_CORRECT in m:
            m[schema.RECORDS] = schema.gsm8k_records(schema.check_param(c["id"]))
            (d / m[schema.RECORDS]).parent.mkdir(exist_ok=True)
            (d / m[schema.RECORDS]).write_text(
                "".join(
                    json.dumps({"index": i, "correct": i < m[schema.NUM_CORRECT]}) + "\n"
                    for i in range(m[schema.NUM_EXAMPLES])
                )
            )
    (d / schema.ROW_FILE).write_text(json.dumps(rec))
    stamp(results / run_id)  # the manifest, the suite's fingerprint, tiers.json and junit.xml: evidence that holds
    return rec


def one_gpu_box_checks() -> dict[str, list[dict]]:
    """A 1-GPU box: gsm8k ran E4B topk 1 and 3, the TP-2 pairs skipped; smoke ran one server."""
    checks = full_checks()
    checks["gsm8k"] = [
        c
        for p, k in SEED
        for c in (
            gsm8k_case(p, k)
            if settings.PAIRS[p].tp == 1
            else gsm8k_case(p, k, skip=TP2_SKIP.format(pair=p, key=p.upper().replace("-", "_")))
        )
    ]
    checks["smoke"] = smoke_server(DEFAULT_SMOKE_SERVERS[0].name)
    return checks


# --- item 1: expected sets ---------------------------------------------------------------------------------------


def test_a_complete_row_qualifies(tmp_path, capsys):
    checks = full_checks()
    write_row(tmp_path, "full", "sglang-0.5.17", checks, selection(checks))
    assert main(["report", "full", "--results", str(tmp_path), "--require", "smoke,gsm8k"]) == 0
    assert "QUALIFIES" in capsys.readouterr().out


def test_one_gpu_box_under_require_is_not_qualified_and_names_the_tp2_cases(tmp_path, capsys):
    checks = one_gpu_box_checks()
    knobs = {"MTPMATRIX_SMOKE_SERVERS": DEFAULT_SMOKE_SERVERS[0].name}
    write_row(tmp_path, "box", "sglang-0.5.17", checks, selection(checks, knobs=knobs))
    assert main(["report", "box", "--results", str(tmp_path), "--require", "smoke,gsm8k"]) == 3
    out = capsys.readouterr().out
    assert "NOT PROVEN" in out and "QUALIFIES" not in out
    tp2 = [f"{p}-topk{k}" for p, k in SEED if settings.PAIRS[p].tp == 2]
    assert tp2 and all(case in out for case in tp2) and "needs TP 2" in out
    # smoke ran with a knob that leaves servers out: not the qualification suite, and every server left out is named
    assert "smoke ran with MTPMATRIX_SMOKE_SERVERS=" in out
    s = json.loads((tmp_path / "box" / "report" / "summary.json").read_text())
    assert s["tier_verdicts"]["sglang-0.5.17"] == {
        "contract": "passed",
        "reference": "passed",
        "smoke": "not-proven",
        "gsm8k": "partial",
    }
    smoke_missing = {m["what"] for m in s["rows"][0]["tiers"]["smoke"]["missing"]}
    assert {x.name for x in DEFAULT_SMOKE_SERVERS[1:]} <= smoke_missing


def test_without_require_a_partial_run_is_partial_not_qualified(tmp_path):
    checks = one_gpu_box_checks()
    write_row(tmp_path, "box", "sglang-0.5.17", checks, selection(checks))
    s = report_summary.build_summary(tmp_path / "box")
    assert s["verdict"] == "not-proven" and s["exit_status"] == 3 and not s["qualifies"]


@pytest.mark.parametrize(
    "case_checks, why",
    [
        # the tiny proof pair: reported, never gated
        (lambda: [c for k in settings.TOPKS for c in gsm8k_case("E4B", k, threshold=None)], "not gated"),
        # fewer examples than the seed suite
        (lambda: [c for k in settings.TOPKS for c in gsm8k_case("E4B", k, n=50)], "50 of 200"),
        # a floor lowered through MTPMATRIX_E4B_THRESHOLD
        (lambda: [c for k in settings.TOPKS for c in gsm8k_case("E4B", k, threshold=0.1)], "threshold 0.1"),
    ],
)
def test_a_seed_case_that_ran_less_than_the_seed_suite_is_not_a_pass(tmp_path, capsys, case_checks, why):
    checks = full_checks()
    checks["gsm8k"] = [c for c in checks["gsm8k"] if "[E4B-" not in c["id"]] + case_checks()
    write_row(tmp_path, "r", "sglang-0.5.17", checks, selection(checks))
    assert main(["report", "r", "--results", str(tmp_path), "--require", "gsm8k"]) == 3
    out = capsys.readouterr().out
    assert "E4B-topk1" in out and why in out


def test_ungated_tiny_proof_cases_are_no_seed_case(tmp_path, capsys):
    checks = full_checks()
    tiny = [c for k in settings.TOPKS for c in gsm8k_case("E4B", k, threshold=None)]
    for c in tiny:
        c["id"] = c["id"].replace("E4B-", "tiny-e2e-proof-")
    checks["gsm8k"] = tiny
    write_row(tmp_path, "r", "sglang-0.5.17", checks, selection(checks, knobs={"MTPMATRIX_GSM8K_PAIR": "tiny:/t:/a"}))
    assert main(["report", "r", "--results", str(tmp_path), "--require", "gsm8k"]) == 3
    out = capsys.readouterr().out
    assert "gsm8k ran with MTPMATRIX_GSM8K_PAIR=tiny:/t:/a: not the qualification suite" in out
    s = json.loads((tmp_path / "r" / "report" / "summary.json").read_text())
    missing = s["rows"][0]["tiers"]["gsm8k"]["missing"]
    assert {f"{p}-topk{k}" for p, k in SEED} <= {m["what"] for m in missing}
    assert any("tiny proof mode" in m["why"] for m in missing)


def test_a_keyword_selection_makes_the_tier_partial(tmp_path, capsys):
    collected = full_checks()
    ran = dict(collected, contract=collected["contract"][:1])  # -k deselected the second contract check
    write_row(
        tmp_path,
        "r",
        "sglang-0.5.17",
        ran,
        selection(ran, keyword="import", collected=collected, args=["tests/tiers", "-k", "import"]),
    )
    assert main(["report", "r", "--results", str(tmp_path), "--require", "contract"]) == 3
    out = capsys.readouterr().out
    assert "test_config[e-series]" in out and "-k import" in out


def test_node_ids_on_the_command_line_make_their_tier_partial(tmp_path, capsys):
    """`pytest tests/tiers/test_contract.py::test_import` collects only what it names: the contract tier cannot show
    it ran whole; the other tiers, collected from their files, are not touched."""
    checks = full_checks()
    sel = selection(checks)
    sel["paths"] = [
        "tests/tiers/test_contract.py::test_import",
        "tests/tiers/test_reference.py",
        "tests/tiers/test_smoke.py",
        "tests/tiers/test_gsm8k.py",
    ]
    write_row(tmp_path, "r", "sglang-0.5.17", checks, sel)
    assert main(["report", "r", "--results", str(tmp_path), "--require", "reference,smoke,gsm8k"]) == 0
    assert main(["report", "r", "--results", str(tmp_path), "--require", "contract"]) == 3
    assert "node ids (tests/tiers/test_contract.py::test_import)" in capsys.readouterr().out


def test_a_run_that_recorded_no_selection_is_partial(tmp_path, capsys):
    checks = full_checks()
    write_row(tmp_path, "old", "sglang-0.5.17", checks, None)
    assert main(["report", "old", "--results", str(tmp_path), "--require", "smoke"]) == 3
    assert "not recorded" in capsys.readouterr().out


def test_a_skipped_expected_check_is_named_with_its_reason(tmp_path, capsys):
    checks = full_checks()
    skipped = checks["reference"][0]
    skipped.update(outcome="skipped", reason="needs torch>=9")
    write_row(tmp_path, "r", "sglang-0.5.17", checks, selection(checks))
    assert main(["report", "r", "--results", str(tmp_path), "--require", "reference"]) == 3
    out = capsys.readouterr().out
    assert schema.short_check_id(skipped["id"]) in out and "needs torch>=9" in out


# --- item 2: known upstream re-derived, never trusted -----------------------------------------------------------


def test_a_stored_known_upstream_tag_naming_no_entry_does_not_pass_the_row(tmp_path, capsys):
    checks = full_checks()
    bad = checks["reference"][0]
    bad.update(
        outcome="failed",
        known_upstream="no-such-entry",
        failure={
            "kind": "mismatch",
            "type": "CheckFailure",
            "message": "outputs differ",
            "frame": None,
            "raised_at": None,
        },
    )
    write_row(
        tmp_path,
        "r",
        "sglang-0.5.17",
        checks,
        selection(checks),
        tier_extra={
            "reference": {
                "verdict": schema.KNOWN_UPSTREAM,
                "known_upstream": [
                    {
                        "id": "no-such-entry",
                        "package": "transformers",
                        "version": "5.12.1",
                        "summary": "gone",
                        "upstream": "https://example.invalid",
                        "fixed_in": None,
                        "serving_path": False,
                        "checks": [bad["id"]],
                    }
                ],
            }
        },
    )
    assert main(["report", "r", "--results", str(tmp_path)]) == 1
    s = json.loads((tmp_path / "r" / "report" / "summary.json").read_text())
    assert s["tier_verdicts"]["sglang-0.5.17"]["reference"] == "failed" and s["known_upstream"] == []


DOCS = Path(__file__).resolve().parents[2] / "docs" / "runs"


def test_the_headline_tells_library_bugs_from_sglang_deviations(tmp_path):
    """transformers 5.19.0's assisted-generation crash is a library bug (not sglang); the draft RoPE phase is an
    sglang deviation on its serving path, and the headline must not call it 'not sglang'."""
    lib = read_json_or_gzip(DOCS / "cpu-20261130-matrix1-sglang-0.5.23.json.gz")
    dev = read_json_or_gzip(DOCS / "2026-11-30d-h200-sglang-0.5.13-smoke-default.json.gz")
    checks = full_checks()
    checks["reference"] = lib["tiers"]["reference"]["checks"]
    checks["smoke"] = dev["tiers"]["smoke"]["checks"] + [
        c
        for s in DEFAULT_SMOKE_SERVERS
        for c in smoke_server(s.name)
        if not any(f"[{s.name}]" in d["id"] for d in dev["tiers"]["smoke"]["checks"])
    ]
    write_row(
        tmp_path,
        "r",
        "sglang-0.5.13",
        checks,
        selection(checks),
        versions=dict(VERSIONS, sglang="0.5.13", transformers="5.19.0"),
    )
    s = report_summary.build_summary(tmp_path / "r")
    by_id = {k["id"]: k for k in s["known_upstream"]}
    assert by_id["hf-assisted-generation-gemma4-candidate-generator"]["component"] == "library"
    assert by_id["sglang-gemma4-mtp-draft-rope-phase"]["component"] == "sglang"
    line = report_render.headline(s)
    assert "1 library bug(s), not sglang: sglang-0.5.13 reference" in line
    assert "1 sglang deviation(s) on its serving path: sglang-0.5.13 smoke" in line
    # the rows by verdict close the line as rows, not as a count the last listed tier seems to own
    assert "smoke (rows: 1 " in line and "smoke (1 " not in line
