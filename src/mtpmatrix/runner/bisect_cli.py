"""``python -m mtpmatrix bisect PACKAGE GOOD BAD [--row ROW] [--tier TIER] [--known ID] [--run-id RUN_ID]``: the
command line of the culprit search (runner/bisect.py). Its defaults are read from past runs (runner/bisect_defaults.py):
the row is the first failing row of the latest run, the tier the cheapest that failed there, the checks that break
those failing in it; without such a run BAD is probed first and its failures are the break searched."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from mtpmatrix.core import paths
from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.schema import TIERS
from mtpmatrix.runner.bisect import (
    BisectError,
    ProbeSpec,
    candidates,
    describe,
    make_probe,
    search,
    search_from_bad_end,
)
from mtpmatrix.runner.bisect_defaults import breaking_checks, cheapest_failed_tier, default_row, latest_failing_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("package", metavar="PACKAGE")
    p.add_argument("good", metavar="GOOD", help="a release that works")
    p.add_argument("bad", metavar="BAD", help="a release that breaks")
    p.add_argument(
        "--row",
        help="row id (constraints/<ROW>.txt; default: the first failing row of the latest run, else the 'ci' row)",
    )
    p.add_argument(
        "--tier",
        choices=TIERS,
        help="tier to re-run (default: the cheapest that failed in the row's latest run, else contract)",
    )
    p.add_argument("--keep-venvs", action="store_true", help="keep each probe's venv under .cache/bisect/")
    p.add_argument(
        "--known",
        metavar="ID",
        help="search where known-upstream entry ID began (known_upstream.json), on its tier: a probe is "
        "bad where a check shows its signature, good where one of its checks ran and passed",
    )


def known_issue(issue_id: str, tier: str | None):
    """The known-upstream entry ``issue_id``; BisectError (one line) when there is none, or ``tier`` is another."""
    from mtpmatrix.core import known_upstream

    try:
        issues = {i.id: i for i in known_upstream.load()}
    except ValueError as exc:
        raise BisectError(f"known upstream issues: {exc}") from None
    if issue_id not in issues:
        raise BisectError(f"unknown known-upstream entry {issue_id!r}; known: {', '.join(issues)}")
    issue = issues[issue_id]
    if tier and tier != issue.tier:
        raise BisectError(f"{issue_id} is a {issue.tier} tier entry, not {tier}")
    return issue


@dataclass
class SearchPlan:
    """What ``python -m mtpmatrix bisect`` searches: the row, the tier (and where it was chosen from), the checks that
    break there, or the known-upstream entry whose start is searched, and the releases."""

    row: Any
    tier: str
    source: str
    source_run: str | None
    issue: Any
    breaking: frozenset[str] | None
    cands: list[str]


def plan_search(ns: argparse.Namespace, rows: list, releases=None) -> SearchPlan:
    """The search the command line asks for, defaults read from past runs; BisectError (one line) on bad input."""
    row_id = ns.row or default_row(ns.results, rows)
    by_id = {r.id: r for r in rows}
    if row_id not in by_id:
        raise BisectError(f"unknown row {row_id!r}; known: {', '.join(by_id)}")
    issue, source_run = None, None
    if getattr(ns, "known", None):
        issue = known_issue(ns.known, ns.tier)
        tier, source = issue.tier, f"--known {issue.id}"
    elif ns.tier:
        tier, source = ns.tier, "--tier"
        source_run = latest_failing_run(ns.results, row_id, tier)
    else:
        tier, source_run = cheapest_failed_tier(ns.results, row_id)
        source = f"cheapest failing tier in run {source_run}" if source_run else "default"
    # the checks failing in the row's latest run: a probe whose tier did not run and pass them proves nothing
    breaking = None if issue else breaking_checks(ns.results, source_run, row_id, tier) or None
    cands = candidates(ns.package, ns.good, ns.bad, releases=releases)
    return SearchPlan(by_id[row_id], tier, source, source_run, issue, breaking, cands)


def announce(ns: argparse.Namespace, plan: SearchPlan, run_id: str) -> None:
    """What is searched, over which releases, and what makes a probe good."""
    cands, tier = plan.cands, plan.tier
    print(
        f"[bisect] {ns.package}: {len(cands)} release(s) {cands[0]} .. {cands[-1]}; row {plan.row.id}, tier {tier} "
        f"({plan.source}); results in {ns.results / run_id}/"
    )
    if plan.issue:
        print(
            f"[bisect] where {plan.issue.id} began: a probe is bad where a check shows its signature (its affected "
            f"range aside), good where one of its checks ran and passed"
        )
    elif plan.breaking:
        print(
            f"[bisect] a probe is good only if it ran and passed: {', '.join(sorted(plan.breaking))} (failing in run "
            f"{plan.source_run})"
        )
    else:
        print(f"[bisect] no recorded run where {tier} broke: the BAD end shows which checks break")


def run(ns: argparse.Namespace, *, probe_factory=None, releases=None, rows=None) -> int:
    """``python -m mtpmatrix bisect``. ``probe_factory(breaking=..., known_issue=...)`` replaces make_probe (tests)."""
    from mtpmatrix.core.rows import RowError, load_rows

    t0 = time.monotonic()
    try:
        plan = plan_search(ns, rows if rows is not None else load_rows(paths.CONSTRAINTS_DIR), releases)
    except (BisectError, RowError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_id = paths.new_run_id(kind=paths.BISECT) if ns.run_id is None else paths.single_name(ns.run_id)
    except paths.NameError_ as exc:  # a path would write the probes outside the results root
        print(f"error: {exc}", file=sys.stderr)
        return 2
    announce(ns, plan, run_id)
    issue, tier, cands = plan.issue, plan.tier, plan.cands
    spec = ProbeSpec(
        plan.row,
        ns.package,
        tier,
        run_id=run_id,
        results=ns.results,
        cache=paths.REPO / ".cache" / "bisect",
        keep_venvs=ns.keep_venvs,
    )

    def factory(breaking=None, known_issue=None):
        return make_probe(spec, breaking=breaking, known_issue=known_issue)

    factory = probe_factory or factory
    try:
        if issue:
            res = search(cands, factory(known_issue=issue))
        elif plan.breaking:
            res = search(cands, factory(breaking=plan.breaking))
        else:
            res = search_from_bad_end(cands, factory)
    except BisectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res.seconds = time.monotonic() - t0
    lines = describe(res, ns.package, tier)
    print("\n".join(lines))
    atomic_write_json(
        ns.results / run_id / "bisect.json",
        {
            "package": ns.package,
            "good": ns.good,
            "bad": ns.bad,
            "row": plan.row.id,
            "tier": tier,
            "known": issue.id if issue else None,
            **res.as_dict(),
            "summary": lines,
        },
    )
    return 0 if res.outcome in ("found", "good-fails") else 1
