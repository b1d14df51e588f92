"""The report's canary section: each canary row of the run next to the pinned row it floats from (what moved,
both verdicts, the culprit from its ``canary.json``), and the releases no row pins yet (``runner/releases.py``).

Only a run that holds canary rows gets the section (and only then is the index asked, with the answer "index
unreachable" when it cannot be), so an ordinary matrix report never needs the network.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.paths import CONSTRAINTS_DIR
from mtpmatrix.core.store import read_run

CANARY_FILE = "canary.json"  # written by runner/culprit.py


def section(run_dir: Path, results: Path, *, untested: Callable[[], Any] | None = None) -> dict[str, Any] | None:
    """{"canaries": [...], "untested": [...] | None, "untested_error": str | None}; None without canary rows.
    ``untested``: a callable returning the releases table (tests pass a fake; default asks the index)."""
    run_dir = Path(run_dir)
    # read_run: an unreadable row.json stands as {"unreadable": ...}; the summary says why, this section skips it
    records = {rid: rec for rid, rec in read_run(run_dir).items() if isinstance(rec, dict)}
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
                "moved": {p: f"{m.get('from') or '-'} -> {m.get('to')}" for p, m in (c.get("moved") or {}).items()},
                "resolved": c.get("resolved") or {},
                "verdict": (rec["verdict"] + cannot_install(state)) if rec.get("verdict") else rec.get("verdict"),
                "from_verdict": base.get("verdict"),
                "from_run": (state.get("pinned") or {}).get("run"),
                "answer": state.get("summary") or [],
            }
        )
    if not canaries:
        return None
    out: dict[str, Any] = {"canaries": canaries, "untested": None, "untested_error": None, "untested_lines": []}
    try:
        if untested is None:
            from mtpmatrix.core.rows import load_rows
            from mtpmatrix.runner import releases

            out["untested"] = releases.untested(load_rows(CONSTRAINTS_DIR), results)
        else:
            out["untested"] = untested()
    except Exception as exc:  # the report never fails for the index: it says why the list is missing
        out["untested_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if out["untested"] is not None:  # the same lines in Markdown and HTML
        from mtpmatrix.runner.releases import lines as release_lines

        out["untested_lines"] = release_lines(out["untested"])
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
            f"| `{c['id']}` | {c['mode']} | `{c['from']}` | {moved_text(c)} | {c['verdict']} | {pinned_text(c)} |"
        )
    for c in sec["canaries"]:
        if c["answer"]:
            lines += ["", f"**{c['id']}**", "", "```", *c["answer"], "```"]
    lines += ["", "### Releases no row pins yet", ""]
    if sec["untested"] is None:
        lines.append(f"not listed: {sec['untested_error']}")
    else:
        lines += [f"- {ln}" for ln in sec["untested_lines"]]
    return "\n".join(lines) + "\n"
