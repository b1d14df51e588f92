"""The report's canary section: each canary row of the run next to the pinned row it floats from (what moved,
both verdicts as the report judged them, the culprit from its ``canary.json``), and the releases this run's canaries
ran that no row pins yet.

The section reads the run's judged records (summary.build_summary), the ones the table and the headline show: a canary
never shows a stored verdict beside a re-judged one. It never asks the package index: the report is built offline
from what the run recorded (``python -m mtpmatrix releases`` asks the index for every newer release).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.paths import CONSTRAINTS_DIR
from mtpmatrix.report.md import block, code, escape

CANARY_FILE = "canary.json"  # written by runner/canary_run.py


def section(run_dir: Path, rows: dict[str, Any], *, pins: dict[str, Version] | None = None) -> dict[str, Any] | None:
    """{"canaries": [...], "untested": [...] | None, "untested_error": str | None, "untested_lines": [...]}; None
    without canary rows. ``rows``: the run's judged records; ``pins``: the newest pin of each watched package
    (default: the rows' files, runner/releases.newest_pins)."""
    run_dir = Path(run_dir)
    records = {rid: rec for rid, rec in rows.items() if isinstance(rec, dict)}
    canaries = []
    for rid, rec in records.items():
        c = rec.get("canary")
        if not isinstance(c, dict) or c.get("retry_of"):
            continue
        base = records.get(c.get("from") or "") or {}
        state_file = run_dir / rid / CANARY_FILE
        try:
            state = read_json(state_file) if state_file.exists() else {}
        except (OSError, ValueError):
            state = {}
        state = state if isinstance(state, dict) else {}
        canaries.append(
            {
                "id": rid,
                "mode": c.get("mode"),
                "from": c.get("from"),
                "moved": {
                    p: f"{m.get('from') or '-'} -> {m.get('to')}"
                    for p, m in (c.get("moved") or {}).items()
                    if isinstance(m, dict)
                },
                "resolved": c.get("resolved") or {},
                "verdict": (rec["verdict"] + cannot_install(state)) if rec.get("verdict") else rec.get("verdict"),
                "from_verdict": base.get("verdict"),
                "from_run": (state.get("pinned") or {}).get("run"),
                "answer": [str(x) for x in state.get("summary") or []],
            }
        )
    if not canaries:
        return None
    out: dict[str, Any] = {"canaries": canaries, "untested": None, "untested_error": None, "untested_lines": []}
    try:
        if pins is None:
            from mtpmatrix.core.rows import load_rows
            from mtpmatrix.runner.releases import newest_pins

            pins = newest_pins(load_rows(CONSTRAINTS_DIR))
    except Exception as exc:  # the report never fails for the list: it says why it is missing
        out["untested_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return out
    ids = [str(c["id"]) for c in canaries]
    out["untested"] = ran_past_pins(run_dir.name, {rid: records[rid] for rid in ids}, pins)
    out["untested_lines"] = release_lines(out["untested"])  # the same lines in Markdown and HTML
    return out


def ran_past_pins(
    run_id: str, canary_records: dict[str, dict[str, Any]], pins: dict[str, Version]
) -> list[dict[str, Any]]:
    """Per watched package: the newest pin and each release past it that a canary of this run installed, with the
    canaries and their judged verdicts (runner/releases.untested's table, from the records alone)."""
    ran: dict[str, dict[Version, list[dict[str, Any]]]] = {}
    for rid, rec in canary_records.items():
        for pkg, ver in (rec.get("versions") or {}).items():
            try:
                v = Version(str(ver).split("+", 1)[0])
            except InvalidVersion:
                continue
            pkg = canonicalize_name(pkg)
            if pkg in pins and v > pins[pkg]:
                ran.setdefault(pkg, {}).setdefault(v, []).append(
                    {"row": rid, "run": run_id, "verdict": rec.get("verdict")}
                )
    return [
        {
            "package": pkg,
            "newest_pin": str(pin),
            "newer": [{"version": str(v), "canaries": ran[pkg][v]} for v in sorted(ran.get(pkg, {}))],
        }
        for pkg, pin in pins.items()
    ]


def release_lines(table: list[dict[str, Any]]) -> list[str]:
    """One line per watched package of ``ran_past_pins``'s table."""
    out = []
    for entry in table:
        pkg, pin = entry["package"], entry["newest_pin"]
        if not entry["newer"]:
            out.append(f"{pkg}: no canary of this run ran a release past the rows' pin {pin}")
            continue
        parts = []
        for n in entry["newer"]:
            ran = "; ".join(f"{r['row']} {r['verdict']}" for r in n["canaries"])
            parts.append(f"{n['version']} ({ran})")
        out.append(f"{pkg}: past the rows' pin {pin}: " + ", ".join(parts))
    return out


def cannot_install(state: dict[str, Any]) -> str:
    """ ", cannot install transformers 5.25.0 (transformers 5.25.0 needs ...; sglang 0.5.17 requires ...)" for a
    canary whose release uv's resolver refused (canary.json ``install``), else ''."""
    single = (state.get("install") or {}).get("single") or {}
    return "".join(
        f", cannot install {p} {s.get('version')} ({str(s.get('detail') or '').removeprefix('cannot install: ')})"
        for p, s in single.items()
        if isinstance(s, dict) and s.get("status") == "bad"
    )


def moved_text(c: dict[str, Any]) -> str:
    return ", ".join(f"{p} {m}" for p, m in c["moved"].items()) or "nothing (today's newest are the pins)"


def pinned_text(c: dict[str, Any]) -> str:
    return c["from_verdict"] or ("not in this run" + (f" (compared with run {c['from_run']})" if c["from_run"] else ""))


def markdown(sec: dict[str, Any]) -> str:
    lines = [
        "",
        "## Canaries",
        "",
        "| canary | mode | floats from | moved | verdict | pinned row |",
        "|---|---|---|---|---|---|",
    ]
    for c in sec["canaries"]:
        lines.append(
            f"| {code(c['id'])} | {escape(c['mode'])} | {code(c['from'])} | {escape(moved_text(c))} | "
            f"{escape(c['verdict'])} | {escape(pinned_text(c))} |"
        )
    for c in sec["canaries"]:
        if c["answer"]:
            lines += ["", f"**{escape(c['id'])}**", "", *block(c["answer"])]
    lines += ["", "### Releases no row pins yet, as this run's canaries ran them", ""]
    if sec["untested"] is None:
        lines.append(f"not listed: {escape(sec['untested_error'])}")
    else:
        lines += [f"- {escape(ln)}" for ln in sec["untested_lines"]]
    return "\n".join(lines) + "\n"
