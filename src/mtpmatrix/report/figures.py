"""The report's figures: what a release manager would rather look at than read, drawn from the summary's records.

    accept     accept length per row and case (smoke server, GSM8K case, CPU reference pair) against its floor
    gsm8k      GSM8K score per row and case with its 95% Wilson interval against the pair's threshold
    decoy      the decoy witness: each request's accept length against the one predicted for it
    launch     the smoke servers' launch times and the suite's wall time against its limit (x one cold launch)
    baseline   with --baseline: the plotted numbers before and after, per row and case

``build(summary)`` turns the summary into one dict per figure (pure data: the points, or ``absent``: the one sentence
saying why a figure has nothing to draw); both templates show the numbers (summary.md as a small table, since a
GitHub step summary cannot show inline SVG) and report.html adds ``svg``, drawn here by matplotlib: inline, so the
page stays one self-contained file (no script, no CDN), and deterministic (fixed hash salt, no date), so the same
summary draws the same bytes. Only what the records hold is drawn; a floor comes from the record where it holds one
(GSM8K's min_accept_length and threshold), else from where the check takes it (tiers.smoke.accept_length_floor).

matplotlib is the 'report' extra's, like jinja2, and imported on first use: where it is absent the page says so in
one line (NO_MATPLOTLIB) and shows the tables.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from mtpmatrix.core import schema, settings
from mtpmatrix.core.record_types import RowSummary, Summary
from mtpmatrix.core.schema import KNOWN_UPSTREAM
from mtpmatrix.core.smoke_servers import SMOKE_SERVERS
from mtpmatrix.report.checks import is_number
from mtpmatrix.tiers import smoke

NO_MATPLOTLIB = "figures not drawn: they need matplotlib (pip install matplotlib; nox -s report installs it)"
COLOURS = {"passed": "#1a7f37", KNOWN_UPSTREAM: "#bc4c00", "failed": "#cf222e", "error": "#953800"}
OTHER_COLOUR = "#57606a"
FLOOR_COLOUR = "#24292f"
# the metrics the baseline figure compares: the ones the other figures plot
BASELINE_METRICS = {
    schema.SCORE: "GSM8K score",
    schema.ACCEPT_LENGTH: "accept length (server)",
    "accept_length_requests": "accept length (requests)",
}
SPECS = {s.name: s for s in SMOKE_SERVERS}
SVG_METADATA = ("Date", "Creator", "Format", "Type")  # matplotlib's defaults for these; None leaves each out
SVG_NAMESPACES = (' xmlns:xlink="http://www.w3.org/1999/xlink"', ' xmlns="http://www.w3.org/2000/svg"')
REFERENCE_ACCEPT = "accept_len"  # the reference tier's assisted generation (tests/tiers/test_reference.py)
SMOKE_ACCEPT = "accept_length_requests"  # what the smoke tier gates (smoke.accept_length_problem)
# why a point of the accept figure has no floor drawn
NO_FLOOR = {
    "decoy": "each request's accept length is predicted instead (the decoy figure)",
    "reference": "the reference tier's bars are its checks' own, not in its records",
    "unknown": "not a smoke server of this suite",
}


def read_launch_budget(row_dir: Path) -> dict[str, Any] | None:
    """The row's smoke-launch-budget.json (launch_plan.launch_budget) when it holds a ratio and its limit."""
    try:
        data = json.loads((row_dir / schema.SMOKE_LAUNCH_BUDGET_FILE).read_text())
    except (OSError, ValueError):
        return None
    keys = ("ratio", "limit", "suite_seconds", "cold_launch_seconds")
    return data if isinstance(data, dict) and all(is_number(data.get(k)) for k in keys) else None


# ---------------------------------------------------------------------------------------------------------------
# the data: what each figure draws, read off the summary
# ---------------------------------------------------------------------------------------------------------------


def _status(m: dict[str, Any], metric: str) -> str:
    """How the check that recorded ``metric`` ended: passed, failed, error, known-upstream (summary._metric_rows)."""
    return str((m.get("ended") or {}).get(metric) or m["outcome"])


def _accept_point(row: dict[str, Any], m: dict[str, Any]) -> dict[str, Any] | None:
    other = m.get("other") or {}
    if m["tier"] == "gsm8k" and "accept_length" in m:
        floor = other.get(schema.MIN_ACCEPT_LENGTH)
        metric, floor, what = schema.ACCEPT_LENGTH, floor if is_number(floor) else settings.MIN_ACCEPT_LENGTH, "server"
        value = m["accept_length"]
    elif m["tier"] == "smoke" and is_number(other.get(SMOKE_ACCEPT)):
        spec = SPECS.get(m["short"])
        metric, floor, what = SMOKE_ACCEPT, smoke.accept_length_floor(spec) if spec else None, "requests"
        value = other[SMOKE_ACCEPT]
    elif m["tier"] == "reference" and is_number(other.get(REFERENCE_ACCEPT)):
        metric, floor, what = REFERENCE_ACCEPT, None, "transformers"
        value = other[REFERENCE_ACCEPT]
    else:
        return None
    if floor is None:
        spec = SPECS.get(m["short"]) if m["tier"] == "smoke" else None
        why = NO_FLOOR["decoy" if spec and spec.decoy else m["tier"] if m["tier"] == "reference" else "unknown"]
    else:
        why = None
    return {
        "row": row["id"],
        "tier": m["tier"],
        "case": m["short"],
        "value": float(value),
        "floor": floor,
        "what": what,
        "status": _status(m, metric),
        "no_floor": why,
    }


def _gsm8k_point(row: dict[str, Any], m: dict[str, Any]) -> dict[str, Any] | None:
    if m["tier"] != "gsm8k" or "score" not in m:
        return None
    threshold = (m.get("other") or {}).get(schema.THRESHOLD)
    return {
        "row": row["id"],
        "case": m["short"],
        "score": m["score"],
        "ci": m.get("ci"),
        "n": m.get("n"),
        "threshold": threshold if is_number(threshold) else None,
        "status": _status(m, schema.SCORE),
    }


def _decoy_point(row: dict[str, Any], m: dict[str, Any]) -> dict[str, Any] | None:
    other = m.get("other") or {}
    got, want = other.get("accept_lengths"), other.get("predicted_accept_lengths")
    if m["tier"] != "smoke" or not isinstance(got, list) or not isinstance(want, list):
        return None
    if not got or len(got) != len(want) or not all(is_number(x) for x in got + want):
        return None
    return {
        "row": row["id"],
        "case": m["short"],
        "measured": got,
        "predicted": want,
        "matching": sum(1 for a, b in zip(got, want) if abs(a - b) < 1e-4),
        "status": _status(m, "accept_lengths"),
    }


def _launch_point(row: RowSummary) -> dict[str, Any] | None:
    """Each smoke server's launch: the cases that are servers (a check over a server and a request feature records the
    same launch again); every case where none is a known server (records of another suite)."""
    cases = [
        (m["short"], float(m["other"][schema.LAUNCH_SECONDS]))
        for m in row["metrics"]
        if m["tier"] == "smoke" and is_number((m.get("other") or {}).get(schema.LAUNCH_SECONDS))
    ]
    launches = [c for c in cases if c[0] in SPECS] or cases
    return {"row": row["id"], "launches": launches, "budget": row.get("launch_budget")} if launches else None


def build(summary: Summary) -> list[dict[str, Any]]:
    """One dict per figure: id, title, and either its points or ``absent`` (why there is nothing to draw)."""
    rows = summary["rows"]

    def points(fn: Callable[..., dict[str, Any] | None]) -> list[dict[str, Any]]:
        return [p for r in rows for m in r["metrics"] for p in [fn(r, m)] if p]

    launch = [p for r in rows for p in [_launch_point(r)] if p]
    out = [
        _figure(
            "accept",
            "Accept length against its floor",
            points(_accept_point),
            "no accept length recorded (no smoke, GSM8K or reference check recorded one)",
        ),
        _figure(
            "gsm8k",
            "GSM8K score, 95% Wilson interval, against the threshold",
            points(_gsm8k_point),
            "no GSM8K score recorded (the gsm8k tier did not run)",
        ),
        _figure(
            "decoy",
            "Decoy witness: each request's accept length against its prediction",
            points(_decoy_point),
            "no per-request accept lengths recorded (the decoy servers did not run)",
        ),
        _figure(
            "launch",
            "Smoke servers' launch, and the suite against its limit",
            launch,
            "no smoke launch recorded (the smoke tier did not run)",
        ),
    ]
    base = summary.get("baseline")
    if base:
        deltas = [
            dict(d, label=BASELINE_METRICS[d["metric"]])
            for d in base["metric_deltas"]
            if d["metric"] in BASELINE_METRICS
        ]
        out.append(
            _figure(
                "baseline",
                f"Against baseline {base['run_id']}: the plotted numbers that moved",
                deltas,
                f"no plotted number moved against baseline {base['run_id']}",
            )
        )
    unfloored: dict[str, list[str]] = {}
    for p in out[0].get("points", []):
        if p["no_floor"]:
            unfloored.setdefault(p["no_floor"], []).append(p["case"])
    out[0]["note"] = "; ".join(
        f"no floor drawn for {', '.join(dict.fromkeys(c))}: {why}" for why, c in unfloored.items()
    )
    return out


def _figure(fid: str, title: str, pts: list[dict[str, Any]], absent: str) -> dict[str, Any]:
    return {"id": fid, "title": title, "points": pts} if pts else {"id": fid, "title": title, "absent": absent}


# ---------------------------------------------------------------------------------------------------------------
# the drawing: matplotlib, SVG inline
# ---------------------------------------------------------------------------------------------------------------


def draw(figures: list[dict[str, Any]]) -> str | None:
    """Add ``svg`` to each figure with points; returns NO_MATPLOTLIB (and draws nothing) where matplotlib is absent."""
    try:
        import matplotlib
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure
    except ImportError:
        return NO_MATPLOTLIB
    style: dict[str, Any] = {
        "svg.hashsalt": "mtpmatrix-report",  # ids in the SVG from this salt, not a random one: same data, same bytes
        "svg.fonttype": "none",  # text as <text>, in the page's font: small, searchable, and the numbers readable
        "font.family": "sans-serif",
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
    drawers = {"accept": _draw_accept, "gsm8k": _draw_gsm8k, "decoy": _draw_decoy, "launch": _draw_launch}
    drawers["baseline"] = _draw_baseline
    # matplotlib types rc keys as a Literal of every setting; a dict of some of them is what rc_context reads
    with matplotlib.rc_context(cast(Any, style)):
        for f in figures:
            if "points" not in f:
                continue
            fig = Figure()
            FigureCanvasSVG(fig)
            drawers[f["id"]](fig, f["points"])
            buf = io.StringIO()
            # no metadata block (its date would change the bytes, its RDF names namespaces by URL)
            fig.savefig(buf, format="svg", bbox_inches="tight", metadata=dict.fromkeys(SVG_METADATA))
            svg = buf.getvalue()
            svg = svg[svg.index("<svg") :]  # inline: no XML prolog or DOCTYPE inside the page
            for ns in SVG_NAMESPACES:  # HTML's parser puts <svg> and xlink:href in their namespaces itself
                svg = svg.replace(ns, "", 1)
            f["svg"] = svg
    return None


def _num(v: float) -> str:
    return f"{v:.3f}".rstrip("0").rstrip(".")


def _label(pts: list[dict[str, Any]], p: dict[str, Any], keys: tuple[str, ...] = ("row", "case")) -> str:
    """A point's label: its row and case, leaving out the row where every point is of the same one."""
    keys = tuple(k for k in keys if not (k == "row" and len({q["row"] for q in pts}) == 1))
    return " · ".join(str(p[k]) for k in keys)


def _hlines(fig: Any, labels: list[str], width: float = 7.6) -> Any:
    """One axis with a line per label, top to bottom, sized to the labels."""
    fig.set_size_inches(width, 0.6 + 0.24 * len(labels))
    ax = fig.add_subplot()
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.grid(axis="x", color="#eaeef2", linewidth=0.8)
    ax.set_axisbelow(True)
    return ax


def _legend(ax: Any, items: list[tuple[str, dict[str, Any]]]) -> None:
    handles = [ax.plot([], [], linestyle="none", label=label, **kw)[0] for label, kw in items]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), frameon=False)


def _draw_accept(fig: Any, pts: list[dict[str, Any]]) -> None:
    ax = _hlines(fig, [_label(pts, p, ("row", "tier", "case")) for p in pts])
    top = max(max(p["value"], p["floor"] or 0) for p in pts)
    for i, p in enumerate(pts):
        if p["floor"] is not None:
            ax.plot([p["floor"]], [i], marker="|", markersize=13, markeredgewidth=2, color=FLOOR_COLOUR)
        ax.plot([p["value"]], [i], marker="o", markersize=6, color=COLOURS.get(p["status"], OTHER_COLOUR))
        ax.annotate(_num(p["value"]), (p["value"], i), xytext=(7, -3), textcoords="offset points", fontsize=8)
    ax.set_xlim(0.8, top * 1.12 + 0.2)
    ax.set_xlabel("accept length (tokens per verify step)")
    _legend(
        ax,
        [
            ("passed", {"marker": "o", "color": COLOURS["passed"]}),
            ("known upstream", {"marker": "o", "color": COLOURS[KNOWN_UPSTREAM]}),
            ("failed", {"marker": "o", "color": COLOURS["failed"]}),
            ("floor", {"marker": "|", "markersize": 10, "markeredgewidth": 2, "color": FLOOR_COLOUR}),
        ],
    )


def _draw_gsm8k(fig: Any, pts: list[dict[str, Any]]) -> None:
    ax = _hlines(fig, [_label(pts, p) for p in pts])
    for i, p in enumerate(pts):
        colour = COLOURS.get(p["status"], OTHER_COLOUR)
        if p["threshold"] is not None:
            ax.plot([p["threshold"]], [i], marker="|", markersize=13, markeredgewidth=2, color=FLOOR_COLOUR)
        if p["ci"]:
            lo, hi = p["ci"]
            ax.errorbar([p["score"]], [i], xerr=[[p["score"] - lo], [hi - p["score"]]], fmt="none", ecolor=colour)
        ax.plot([p["score"]], [i], marker="o", markersize=6, color=colour)
        text = _num(p["score"]) + (f" [{_num(p['ci'][0])}, {_num(p['ci'][1])}]" if p["ci"] else "")
        right = p["ci"][1] if p["ci"] else p["score"]
        ax.annotate(text, (right, i), xytext=(6, -3), textcoords="offset points", fontsize=8)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("fraction of questions answered correctly")
    _legend(
        ax,
        [
            ("score and 95% interval", {"marker": "o", "color": COLOURS["passed"]}),
            ("threshold", {"marker": "|", "markersize": 10, "markeredgewidth": 2, "color": FLOOR_COLOUR}),
        ],
    )


def _draw_decoy(fig: Any, pts: list[dict[str, Any]]) -> None:
    fig.set_size_inches(2.5 * len(pts) + 0.6, 2.6)
    axes = fig.subplots(1, len(pts), sharey=True, squeeze=False)[0]
    for ax, p in zip(axes, pts):
        xs = range(1, len(p["measured"]) + 1)
        ax.plot(xs, p["predicted"], linestyle="none", marker="s", markersize=9, markerfacecolor="none", color="#0969da")
        colour = COLOURS.get(p["status"], OTHER_COLOUR)
        ax.plot(xs, p["measured"], linestyle="none", marker="o", markersize=4, color=colour)
        ax.set_title(f"{_label(pts, p)}\n{p['matching']}/{len(p['measured'])} as predicted", fontsize=8.5)
        ax.set_xticks(list(xs))
        ax.set_xlabel("request")
        ax.margins(y=0.2)
        ax.grid(axis="y", color="#eaeef2", linewidth=0.8)
    axes[0].set_ylabel("accept length")
    handles = [ax.lines[0], ax.lines[1]]
    fig.legend(handles, ["predicted", "measured"], loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)


def _draw_launch(fig: Any, pts: list[dict[str, Any]]) -> None:
    labels, spans = [], []
    for p in pts:
        for case, seconds in p["launches"]:
            labels.append(_label(pts, {"row": p["row"], "case": case}))
            spans.append(("launch", seconds, p))
        if p["budget"]:
            labels.append(_label(pts, {"row": p["row"], "case": "whole suite"}))
            spans.append(("suite", p["budget"]["suite_seconds"], p))
    ax = _hlines(fig, labels)
    for i, (kind, seconds, p) in enumerate(spans):
        if kind == "suite":
            b = p["budget"]
            within = b["ratio"] <= b["limit"]
            ax.barh([i], [seconds], height=0.6, color=COLOURS["passed" if within else "failed"])
            limit = b["limit"] * b["cold_launch_seconds"]
            ax.plot([limit], [i], marker="|", markersize=13, markeredgewidth=2, color=FLOOR_COLOUR)
            text = f"{_num(seconds)} s = {_num(b['ratio'])} × cold launch {_num(b['cold_launch_seconds'])} s (limit {_num(b['limit'])})"
            ax.annotate(text, (max(seconds, limit), i), xytext=(7, -3), textcoords="offset points", fontsize=8)
        else:
            ax.barh([i], [seconds], height=0.6, color="#8c959f")
            ax.annotate(f"{_num(seconds)} s", (seconds, i), xytext=(4, -3), textcoords="offset points", fontsize=8)
    ax.set_xlim(0, max(s for _, s, _ in spans) * 1.6)
    ax.set_xlabel("seconds (launch until ready; the suite from first launch to last check)")


def _draw_baseline(fig: Any, pts: list[dict[str, Any]]) -> None:
    metrics = list(dict.fromkeys(p["label"] for p in pts))
    by = {m: [p for p in pts if p["label"] == m] for m in metrics}
    fig.set_size_inches(7.6, 0.9 + 0.3 * len(pts) + 0.7 * len(metrics))
    ratios = [len(by[m]) + 1 for m in metrics]
    axes = fig.subplots(len(metrics), 1, squeeze=False, gridspec_kw={"height_ratios": ratios, "hspace": 0.9})[:, 0]
    for ax, m in zip(axes, metrics):
        ps = by[m]
        ax.set_yticks(range(len(ps)), [f"{p['row']} · {schema.short_check_id(p['check'])}" for p in ps])
        ax.set_ylim(len(ps) - 0.5, -0.5)
        for i, p in enumerate(ps):
            colour = COLOURS["passed"] if p["delta"] > 0 else COLOURS["failed"]
            ax.annotate("", (p["after"], i), (p["before"], i), arrowprops={"arrowstyle": "->", "color": colour})
            ax.plot([p["before"]], [i], marker="o", markerfacecolor="none", color=OTHER_COLOUR)
            ax.plot([p["after"]], [i], marker="o", color=colour)
            ax.annotate(
                f"{_num(p['before'])} → {_num(p['after'])}",
                (max(p["before"], p["after"]), i),
                xytext=(7, -3),
                textcoords="offset points",
                fontsize=8,
            )
        lo = min(min(p["before"], p["after"]) for p in ps)
        hi = max(max(p["before"], p["after"]) for p in ps)
        ax.set_xlim(lo - (hi - lo) * 0.15 - 0.01, hi + (hi - lo) * 0.6 + 0.05)
        ax.set_title(m, fontsize=9, loc="left")
        ax.grid(axis="x", color="#eaeef2", linewidth=0.8)
