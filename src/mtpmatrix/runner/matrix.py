"""Running one row: the entry point (``run_row``, from the noxfile and the canary, culprit and bisect runs) and
the row's one-line summary. The steps live one module each: the options and pre-flight (row_options.py), the uv
install (uv_install.py), the row's run from its pending record to its verdict (row_run.py). The names other modules
use are here too, so a caller imports one module.

The noxfile stays thin: nox makes the row's venv with uv (the row's Python), these modules do the rest, so the
same steps are unit-testable and nothing about a row lives in two places.
"""

from __future__ import annotations

from pathlib import Path

from mtpmatrix.core.evidence.versions import split_overrides
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import Row
from mtpmatrix.core.schema import KNOWN_UPSTREAM
from mtpmatrix.runner.row_options import (
    PYTEST_ARGS_HINT,
    Options,
    in_shard,
    parse_options,
    preflight_overrides,
    preflight_row_index,
    preflight_servers,
    preflight_tier_env,
    split_pytest_args,
)
from mtpmatrix.runner.row_run import SUITE, RowRun, host_info, suite_invocation
from mtpmatrix.runner.uv_install import (
    constraints_text,
    find_uv,
    install_command,
    overridden_names,
    resolve_companions,
    stranded_by_overrides,
    venv_python,
)

__all__ = [
    "PYTEST_ARGS_HINT",
    "SUITE",
    "Options",
    "RowRun",
    "constraints_text",
    "find_uv",
    "host_info",
    "in_shard",
    "install_command",
    "overridden_names",
    "parse_options",
    "preflight_overrides",
    "preflight_row_index",
    "preflight_servers",
    "preflight_tier_env",
    "resolve_companions",
    "run_row",
    "split_pytest_args",
    "stranded_by_overrides",
    "suite_invocation",
    "summary_line",
    "venv_python",
]


def run_row(row: Row, venv: Path, opts: Options, log=print) -> RowRecord:
    """Install ``row`` into ``venv``, record versions, run the suite; returns the saved row record.

    Raises nothing for a failing row: the verdict is in the record (the caller decides the exit code). Bad input
    (a wheel for another Python, no uv, a patch whose hunks do not apply) is a RowError (one line), with no record.
    """
    return RowRun.prepare(row, venv, opts, log).run()


def summary_line(record: RowRecord) -> str:
    """One line per row for the terminal: verdict and each tier's verdict (with skip reason)."""
    rid = record["row"]["id"]
    if record.get("install", {}).get("verdict") == "failed":
        return f"{rid}: FAILED at install: {record['install']['failure']['message']}"
    parts = []
    for tier, t in (record.get("tiers") or {}).items():
        s = f"{tier}={t['verdict']}"
        if t["verdict"] == "skipped" and t.get("reason"):
            s += f" ({t['reason']})"
        elif t["verdict"] == KNOWN_UPSTREAM:
            s += (
                " ("
                + "; ".join(
                    f"{k['package']} {k['version']}: {k['id']}, {k['upstream']}" for k in t.get("known_upstream", [])
                )
                + ")"
            )
        elif t.get("failure_kinds"):
            s += f" [{','.join(t['failure_kinds'])}]"
        if t.get("missing"):  # a partial tier (expected.py): what did not run, first reason
            s += f" ({len(t['missing'])} not run or short, e.g. {t['missing'][0]['what']}: {t['missing'][0]['why']})"
        for k in t.get("stale_known_upstream", []):
            s += f" (known-upstream entry {k['id']} can go: {len(k['checks'])} of its checks pass)"
        for k in t.get("unshown_known_upstream", []):  # a batch-timing bug's pass: not evidence of a fix
            s += f" (known-upstream entry {k['id']} did not show: {len(k['checks'])} of its checks pass)"
        parts.append(s)
    versions = record.get("versions") or {}
    exact, ranges = split_overrides(record)  # a range spec (--with 'transformers>=5.24') names its package too
    asked = [f"{m} {versions.get(m, '?')}" for m in [*exact, *ranges]]
    check = (record.get("install") or {}).get("check") or {}
    refused = (
        [ln for ln in check.get("output") or [] if ln.startswith("The package")] if check.get("ok") is False else []
    )
    held = [f"{h['package']} {h['version']}" for h in (record.get("install") or {}).get("held") or []]
    blocking = [f"{b['pinned_by']} pins {b['package']}=={b['version']}" for b in record.get("blocking_pins") or []]
    return (
        f"{rid}: {record['verdict'].upper()} — "
        + "; ".join(parts)
        + (f"; with {', '.join(asked)} (--with)" if asked else "")
        + (
            f"; uv pip check: {refused[0]}" + (f" (+{len(refused) - 1} more)" if len(refused) > 1 else "")
            if refused
            else ""
        )
        + (f"; held at sglang's pins: {', '.join(held)}" if held else "")
        + (f"; blocking pin(s): {', '.join(blocking)} (move it too: --with)" if blocking else "")
    )
