"""summary.md and report.html from one summary model, through the jinja2 templates in templates/.

Both templates render the same context (``view``): the summary dict plus the few lists derived from it, computed
once here; the templates only lay them out. The Markdown goes to GitHub step summaries and PR comments (emoji); the
HTML is one self-contained page (no scripts, no external links) with plain glyphs that every font has, autoescaped,
and the figures (figures.py) inline as SVG.

jinja2 is imported on first use, not with the package: the package is installed into every row's venv next to
sglang's pins, where the report never runs (``nox -s report`` and ``nox -s unit`` install jinja2).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from mtpmatrix.core import schema
from mtpmatrix.core.evidence.fingerprint import KNOWN_UPSTREAM as KNOWN_UPSTREAM_FILE
from mtpmatrix.core.evidence.versions import MAIN_PACKAGES
from mtpmatrix.core.record_types import Summary
from mtpmatrix.core.schema import FAILING, GPU_TIERS, KNOWN_UPSTREAM, PARTIAL, TIERS, UNPROVEN, VERDICTS
from mtpmatrix.report import canaries, candidates, figures, md
from mtpmatrix.report.checks import is_number, short_check
from mtpmatrix.report.compare import ALPHA
from mtpmatrix.report.summary import ReportError, missing_required

TEMPLATES = Path(__file__).parent / "templates"
MARKDOWN_TEMPLATE, HTML_TEMPLATE = "report.md.j2", "report.html.j2"
NO_JINJA2 = "the report needs jinja2: pip install jinja2 (nox -s report installs it)"

SYMBOLS = {
    "passed": "✅",
    "failed": "❌",
    "error": "💥",
    "skipped": "⏭️",
    "pending": "⏳",
    KNOWN_UPSTREAM: "⚠️",
    PARTIAL: "🟡",
    UNPROVEN: "❔",
    None: "—",
}
# The HTML page uses plain glyphs that every font has (emoji need a color-emoji font the viewer may lack).
GLYPHS = {
    "passed": "✓",
    "failed": "✗",
    "error": "!",
    "skipped": "–",
    "pending": "…",
    KNOWN_UPSTREAM: "⚠",
    PARTIAL: "~",
    UNPROVEN: "?",
    None: "—",
}
# Headline marks: proven, nothing failed but not everything proven, not qualified.
MARKS = {"qualifies": "✅", "required-proven": "🟡", "not-proven": "❔", "fails": "❌"}
BANNERS = {
    "qualifies": ("ok", "✓"),
    "required-proven": ("partial", "~"),
    "not-proven": ("bad", "?"),
    "fails": ("bad", "✗"),
}
VERSION_KEYS = (*MAIN_PACKAGES, "python")  # the versions each row shows
# known_upstream.json's components as the report words them: whose bug, and whether it is sglang's
COMPONENT_WORDS = {"library": "library bug, not sglang", "sglang": "sglang deviation on its serving path"}
# the files each row of the page links to (summary.json lists check.txt too)
HTML_LOGS = (schema.INSTALL_LOG, schema.PYTEST_LOG, schema.FREEZE_FILE, schema.JUNIT_FILE)


# ---------------------------------------------------------------------------------------------------------------
# text both formats (and the CLI) share
# ---------------------------------------------------------------------------------------------------------------


def fmt_num(v, digits: int = 3) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.3g}"
    return str(v)


def fmt_other(v, limit: int = 60) -> str:
    """A metric without a column of its own, in at most ``limit`` characters."""
    if isinstance(v, (list, tuple)):
        nums = [x for x in v if is_number(x)]
        if nums and len(nums) == len(v):
            return f"{len(v)} values, mean {fmt_num(sum(nums) / len(nums))}"
        return f"{len(v)} items"
    if isinstance(v, dict):
        inner = ", ".join(
            f"{k} {len(x) if isinstance(x, (list, tuple)) else fmt_other(x, 24)}"
            for k, x in v.items()
            if is_number(x) or isinstance(x, (str, bool, list, tuple)) or x is None
        )
        if not inner:
            return f"{{{len(v)} keys}}"
        return inner if len(inner) <= limit else inner[: limit - 1] + "…"
    s = fmt_num(v) if is_number(v) or isinstance(v, bool) else str(v)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def score_text(m: dict) -> str:
    if "score" not in m:
        return ""
    s = f"{m['score']:.3f}"
    if "ci" in m:
        s += f" [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}]"
    if m.get("n"):
        s += f" (n={m['n']})"
    return s


def fmt_p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def fmt_dur(s) -> str:
    if not is_number(s):
        return "?"
    s = float(s)
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def idx(items: list[int], limit: int = 20) -> str:
    """Question indices as ``#3, #7 … (+5)``."""
    if not items:
        return "none"
    s = ", ".join(f"#{i}" for i in items[:limit])
    return s + (f" … (+{len(items) - limit})" if len(items) > limit else "")


def known_where(known: list[dict]) -> str:
    """A known-upstream cell's line: '6 checks known · sglang 0.5.17', each package and version once."""
    checks = sum(len(k.get("checks") or []) for k in known)
    where = ", ".join(dict.fromkeys(f"{k.get('package')} {k.get('version')}" for k in known))
    return f"{plural(checks, 'check')} known · {where}"


def skip_where(group: dict, verb: str) -> str:
    """'smoke/gsm8k in 3 rows (2 checks)' for one group of identical skip reasons."""
    rows = len(group["rows"])
    where = f"{'/'.join(group['tiers'])} {verb} {rows} row{'s' if rows != 1 else ''}"
    if group["checks"]:
        where += f" ({group['checks']} check{'s' if group['checks'] != 1 else ''})"
    return where


def tally(counts: dict[str, int], words) -> int:
    """How many checks had one of ``words`` as their outcome."""
    return sum(counts.get(w, 0) for w in words)


def failure_kinds(row: dict) -> list[str]:
    """Every failure kind of a row, its install's included, sorted."""
    kinds = {k for t in row["tiers"].values() for k in t["failure_kinds"]}
    return sorted(kinds | ({"install"} if row["install"]["verdict"] == "failed" else set()))


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _proven_text(summary: Summary) -> str:
    """'CPU checks pass; smoke and gsm8k not run (no GPU)': which tiers ran whole and passed, which ran in part,
    which did not run, why."""
    status, n = summary["tier_status"], len(summary["rows"])
    full = [
        t for t in summary["tiers"] if status[t]["complete"] and not status[t]["not_run"] and not status[t]["partial"]
    ]
    some = [t for t in summary["tiers"] if t not in full and (status[t]["complete"] or status[t]["partial"])]
    none = [t for t in summary["tiers"] if not status[t]["complete"] and not status[t]["partial"]]
    parts = []
    if full:
        parts.append(
            "CPU checks pass"
            if full == [t for t in TIERS if t not in GPU_TIERS]
            else f"{_and(full)} pass{'es' if len(full) == 1 else ''}"
        )
    for t in some:
        parts.append(
            f"{t} complete in {len(status[t]['complete'])} of {n} rows"
            + (f", partial in {_partial_text(status[t])}" if status[t]["partial"] else "")
        )
    for t in summary["tiers"]:
        for rid in status[t].get("unproven") or []:
            parts.append(f"{t} not proven in {rid} ({(status[t]['unproven_why'].get(rid) or ['?'])[0]})")
    by_why: dict[str, list[str]] = {}
    for t in none:
        by_why.setdefault(status[t]["why"], []).append(t)
    for why, ts in by_why.items():
        parts.append(f"{_and(ts)} not run" + (f" ({why})" if why else ""))
    return "; ".join(parts)


def _listed(names: list, limit: int) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" ... (+{more} more)" if more > 0 else "")


def _partial_text(status: dict, limit: int = 16) -> str:
    """'sglang-0.5.17 (not run: 26B-A4B-topk1, 31B-topk1: 26B-A4B needs TP 2 ...)': each partial row of a tier with
    what did not run, grouped by why."""
    out = []
    for rid in status["partial"]:
        groups = status["missing"].get(rid) or []
        text = "; ".join(f"{_listed(g['what'], limit)}: {g['why']}" for g in groups)
        out.append(f"{rid} (not run or short: {text})")
    return ", ".join(out)


def _known_text(summary: Summary) -> str:
    """The known upstream issues, library bugs (not sglang) apart from sglang deviations on its serving path."""
    k = summary.get("known_upstream") or []
    parts = []
    for component, words in (
        ("library", "library bug(s), not sglang"),
        ("sglang", "sglang deviation(s) on its serving path"),
    ):
        ks = [x for x in k if x.get("component", "sglang" if x.get("package") == "sglang" else "library") == component]
        if ks:
            where = sorted({f"{x['row']} {x['tier']}" for x in ks})
            parts.append(f"{len({x['id'] for x in ks})} {words}: {', '.join(where)}")
    return "".join(f"; {p}" for p in parts)


def _not_complete_text(summary: Summary) -> str:
    """The required tiers that are not proven, each with the rows and what did not run or cannot be shown there."""
    status = summary["tier_status"]
    out = []
    for t in missing_required(summary):
        st = status.get(t) or {"not_run": [], "partial": [], "missing": {}, "why": "", "unproven": []}
        bits = []
        if st["not_run"]:
            bits.append(f"not run in {', '.join(st['not_run'])}" + (f" ({st['why']})" if st["why"] else ""))
        if st["partial"]:
            bits.append(f"partial in {_partial_text(st)}")
        for rid in st.get("unproven") or []:
            bits.append(f"not proven in {rid} ({(st['unproven_why'].get(rid) or ['?'])[0]})")
        out.append(f"{t}: {'; '.join(bits)}" if bits else t)
    return " | ".join(out)


def _evidence_text(summary: Summary, limit: int = 3) -> str:
    """Why the run's evidence does not hold: the run's own problems, then each row's first ones."""
    ev = summary.get("evidence") or {"run": [], "rows": {}}
    parts = list(ev["run"])
    for rid, problems in ev["rows"].items():
        whys = list(dict.fromkeys(p["what"] for p in problems))
        parts.append(
            f"{rid}: {'; '.join(whys[:limit])}" + (f" (+{len(whys) - limit} more)" if len(whys) > limit else "")
        )
    return " | ".join(parts)


def _rows_text(summary: Summary) -> str:
    """'sglang-0.5.17-py312: sglang 0.5.17, transformers 5.12.1, torch 2.11.0+cu130 (CUDA 13.0), Python 3.12.3,
    linux-x86_64': which versions, torch build, Python and platform the verdict is about."""
    out = []
    for r in summary["rows"]:
        build = r.get("build") or {}
        versions = dict(r["versions"], torch=build.get("torch") or r["versions"].get("torch"))
        text = ", ".join(f"{p} {versions.get(p) or '?'}" for p in MAIN_PACKAGES)
        if build:
            text += (
                f" (CUDA {build.get('torch_cuda') or 'none'}), Python {build.get('python')}, {build.get('platform')}"
            )
        out.append(f"{r['id']}: {text}")
    return "; ".join(out)


def headline(summary: Summary) -> str:
    """The verdict in one line: what was proven, what failed, what did not run or cannot be shown, and the
    verdict-deciding files that differ from the commit; a run of candidates names them first
    (report/candidates.py)."""
    text = _headline(summary) + _checkout_text(summary)
    return f"{summary['candidate_text']}: {text}" if summary.get("candidate_text") else text


def _checkout_text(summary: Summary) -> str:
    """'; judged by commit 305f4020e with uncommitted src/.../known_upstream.json (its committed list applied)':
    the verdict-deciding files that differ from the commit, of the judging checkout and of the run's suite."""
    co = (summary.get("evidence") or {}).get("checkout") or {}
    parts = []
    if "commit" in co and co["commit"] is None and co.get("distribution"):  # an installed wheel: its RECORD vouches
        differ = f", whose {', '.join(co['changed'])} differ from it" if co.get("changed") else ""
        parts.append(f"judged by the installed {co['distribution']} against its RECORD{differ}")
    elif "commit" in co and co["commit"] is None:  # a tarball: nothing to hold its files to (not proven: evidence.run)
        parts.append(
            "judged by a checkout with no git commit: its verdict-deciding files (the suite, the expected checks, "
            "settings.py, known_upstream.json) are not vouched for"
        )
    if co.get("commit") and co.get("changed"):
        applied = " (its committed list applied)" if KNOWN_UPSTREAM_FILE in co["changed"] else ""
        parts.append(
            f"judged by commit {str(co.get('commit'))[:9]} with uncommitted {', '.join(co['changed'])}{applied}"
        )
    if co.get("run_changed"):
        parts.append(
            f"the run's suite: commit {str(co.get('run_commit'))[:9]} with uncommitted {', '.join(co['run_changed'])}"
        )
    return "".join(f"; {p}" for p in parts)


def _headline(summary: Summary) -> str:
    n = len(summary["rows"])
    c = summary["verdict_counts"]
    # the rows by verdict, named as rows: read bare after the known-upstream list, "smoke (1 passed)" said the tier
    rows_by_verdict = "(rows: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS if c.get(v)) + ")"
    state = summary.get("verdict")
    if state == "qualifies":
        return (
            f"QUALIFIES — every tier ran whole and passed in all {n} rows ({_rows_text(summary)}), suite "
            f"{(summary.get('evidence') or {}).get('suite')}{_known_text(summary)} {rows_by_verdict}"
        )
    if state == "required-proven":
        return (
            f"{_and(summary['required_tiers'])} proven in all {n} rows ({_rows_text(summary)}), suite "
            f"{(summary.get('evidence') or {}).get('suite')}, not a release qualification: "
            f"{_proven_text(summary)}{_known_text(summary)} {rows_by_verdict}"
        )
    if state == "not-proven":
        evidence = _evidence_text(summary)
        if summary.get("nothing_ran"):
            gaps = "nothing ran: every tier of every row was skipped"
        else:
            gaps = _not_complete_text(summary) if summary["required_tiers"] else _proven_text(summary)
        why = [x for x in (evidence, gaps) if x]
        return f"NOT PROVEN — {' | '.join(why)}{_known_text(summary)} {rows_by_verdict}"
    why = []
    if summary["failing_rows"]:
        why.append(f"{len(summary['failing_rows'])} of {n} rows failing: {', '.join(summary['failing_rows'])}")
    return f"DOES NOT QUALIFY — {'; '.join(why)} {rows_by_verdict}"


# ---------------------------------------------------------------------------------------------------------------
# the context and the environment
# ---------------------------------------------------------------------------------------------------------------


def view(summary: Summary) -> dict:
    """What both templates render: the summary (``s``) and what is derived from it, once."""
    rows = summary["rows"]
    out: dict[str, Any] = {
        "s": summary,
        "headline": headline(summary),
        "failing": [r for r in rows if r["verdict"] in FAILING],
        "metric_rows": [(r["id"], m) for r in rows for m in r["metrics"] if m.get("known")],
        "other_rows": [(r["id"], m) for r in rows for m in r["metrics"] if not m.get("known")],
        # tiers where nothing failed but not the whole expected set ran (expected.py), grouped by why
        "not_complete": [
            (r["id"], t, tv["missing_groups"]) for r in rows for t, tv in r["tiers"].items() if tv["verdict"] == PARTIAL
        ],
        "hosts": sorted({(r.get("host") or {}).get("hostname", "") for r in rows} - {""}),
        "gpus": sorted({r["gpus"] for r in rows if r["gpus"] is not None}),
        "base": None,
        "figures": figures.build(summary),
        "figures_note": None,  # why report.html draws no figure (render_html); summary.md shows their numbers
    }
    base = summary.get("baseline")
    if base:
        cells = [(r, t, tv) for r in base["rows"] for t, tv in r["tiers"].items()]
        out["base"] = {
            "tiers": [t for t in ("install", *TIERS) if any(t in r["tiers"] for r in base["rows"])],
            "changed_cells": [c for c in cells if c[2].get("change") not in (None, "same")],
            "unchanged_cells": sum(1 for c in cells if c[2].get("change") == "same"),
            "changed_paired": [p for p in base["paired"] if p["right_in_a_only"] or p["right_in_b_only"]],
        }
    return out


@functools.cache
def environment():
    """The jinja2 environment over templates/; autoescape for the HTML template only. ReportError (NO_JINJA2)
    where jinja2 is not installed."""
    try:
        import jinja2
    except ImportError:
        raise ReportError(NO_JINJA2) from None

    @jinja2.pass_eval_context
    def finalize(ctx, value):
        # the page: autoescaped, a missing value prints as nothing. summary.md: every value Markdown-escaped unless
        # it is md.Safe (md.py), a missing one as Python's 'None', as it always has
        if ctx.autoescape:
            return "" if value is None else value
        return md.escape(value)

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        # a line holding only a {% tag %} leaves nothing behind, so the templates read like the output
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,  # a misspelt key fails the render instead of vanishing
        finalize=finalize,
    )
    env.filters.update(
        fmt_num=fmt_num,
        fmt_other=fmt_other,
        score_text=score_text,
        fmt_p=fmt_p,
        fmt_dur=fmt_dur,
        plural=plural,
        idx=idx,
        md=md.escape,
        code=md.code,
        url=md.url,
        trusted=md.trusted,
        known_where=known_where,
        skip_where=skip_where,
        short_check=short_check,
        tally=tally,
        failure_kinds=failure_kinds,
    )
    env.globals.update(
        SYMBOLS=SYMBOLS,
        GLYPHS=GLYPHS,
        MARKS=MARKS,
        BANNERS=BANNERS,
        VERSION_KEYS=VERSION_KEYS,
        HTML_LOGS=HTML_LOGS,
        FAILING=FAILING,
        KNOWN_UPSTREAM=KNOWN_UPSTREAM,
        PARTIAL=PARTIAL,
        COMPONENT_WORDS=COMPONENT_WORDS,
        VERDICTS=VERDICTS,
        ALPHA=ALPHA,
        canary_moved=canaries.moved_text,
        canary_pinned=canaries.pinned_text,
        candidates_markdown=candidates.markdown,  # escapes what it takes from records
    )
    return env


def render_markdown(summary: Summary) -> str:
    return environment().get_template(MARKDOWN_TEMPLATE).render(view(summary))


def render_html(summary: Summary) -> str:
    context = view(summary)
    context["figures_note"] = figures.draw(context["figures"])  # inline SVG (matplotlib), or why there is none
    return environment().get_template(HTML_TEMPLATE).render(context)
