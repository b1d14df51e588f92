"""A canary's run and, when it breaks, its culprit: which package, which release, which tier, what failure.

    nox -t canary [-- --tiers contract --budget 1800 --resume]
    python -m mtpmatrix canary [ID ...] [--tiers ...] [--budget S] [--run-id RUN] [--resume]

Steps, each recorded in ``results/<run>/<canary>/canary.json`` (atomic; ``--resume`` continues from it):

1. resolve the canary (``canary.resolve``: index first, one line on bad input) and run it as a row
   (``matrix.run_row``, the one install helper) in ``.nox/canary-<id>``;
1b. when the canary cannot install (a resolver conflict): name the conflicting requirements, bisect its releases
   on install-ability alone (``runner/installable.py``, uv's resolution, no venv) and run the newest that installs
   as the row whose tiers the next steps read;
2. judge its record again and read each tier as the report does (expected.tier_state): a tier it breaks is to
   be blamed on the moved packages only against a baseline, the pinned row's latest run that passed it
   (runner/baseline.py; runs that proved nothing are passed over); a tier that failed without proving anything (a
   harness failure, pytest stopped early) blames nothing and says so;
3. for the cheapest tier the canary breaks: probe every moved package alone on the pinned row at the canary's
   release (``bisect.make_probe``); bisect each package whose probe fails between its pin and the canary's release
   (``bisect.search``, the same search as ``nox -s bisect``; the pin is a known good end only with a baseline,
   else it is probed, and a pin that fails too blames nothing); when no package fails alone, probe the pairs, then
   name the set that breaks together;
4. ``canary-override``: each pin sglang holds that a failing check names (``overrides.blocking_pins``) is its own
   finding; the canary is re-run with that companion moved too (``matrix.resolve_companions``), and that run's
   verdicts are reported.

``--budget S`` bounds steps 3-4 (wall seconds from the start of the search): the search stops before a probe that
would start past it and says how far it got. Probes land in ``results/bisect-<run>-<canary>/`` (outside the matrix
run the report reads), their venvs under ``.cache/bisect/``.

The steps are runner/canary_run.py's; the search and the answer's lines runner/culprit_search.py's; this module is the
command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mtpmatrix.core import paths
from mtpmatrix.core.rows import RowError, load_rows
from mtpmatrix.core.schema import FAILING
from mtpmatrix.core.store import RunStore
from mtpmatrix.runner import bisect, matrix
from mtpmatrix.runner.canary import load_canaries, resolve
from mtpmatrix.runner.canary_run import CANARY_FILE, run_canary
from mtpmatrix.runner.culprit_search import (  # noqa: F401  (the names the canary's callers and tests read here)
    Budget,
    abi_statement,
    culprit_lines,
    find_culprit,
    outcome_line,
    summary_lines,
)
from mtpmatrix.runner.releases import ReleaseError


def publish(lines: list[str], env: dict | None = None) -> None:
    """Append the canary's answer to the GitHub step summary when there is one."""
    path = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a") as fh:
            fh.write("\n```\n" + "\n".join(lines) + "\n```\n")


# ---------------------------------------------------------------------------------------------------------------
# CLI (python -m mtpmatrix canary, nox -t canary)
# ---------------------------------------------------------------------------------------------------------------


def split_budget(posargs: list[str]) -> tuple[float | None, list[str]]:
    """``--budget S`` out of the session arguments; the rest are the matrix's (``matrix.parse_options``), pytest's
    after a second ``--`` handed on whole (a ``--budget`` there is pytest's)."""
    ours, pytest_args = matrix.split_pytest_args(posargs)
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--budget", default=None)
    ns, rest = p.parse_known_args(ours)
    if "--" in posargs:
        rest = [*rest, "--", *pytest_args]
    if ns.budget is None:
        return None, rest
    try:
        budget = float(ns.budget)
    except ValueError:
        raise RowError(f"--budget wants seconds, got {ns.budget!r}") from None
    if budget <= 0:
        raise RowError(f"--budget must be positive, got {ns.budget}")
    return budget, rest


def main(
    ids: list[str],
    posargs: list[str],
    *,
    run_id: str | None = None,
    constraints: Path | None = None,
    log: Callable[[str], None] = print,
    outcomes: list[str] | None = None,
) -> int:
    """Resolve every selected canary (all before any venv), then run each with its culprit search.
    0: every canary passed; 1: a canary failed (its answer printed and in canary.json); 2: bad input.
    ``outcomes`` gains "<canary>: <outcome_line>" for each canary that failed."""
    constraints = constraints or paths.CONSTRAINTS_DIR
    try:
        canaries = load_canaries(constraints, load_rows(constraints))
        unknown = [i for i in ids if i not in canaries]
        if unknown:
            raise RowError(f"unknown canary {', '.join(unknown)}; known: {', '.join(canaries) or 'none'}")
        budget, rest = split_budget(posargs)
        opts = matrix.parse_options(rest)
        opts.run_id = opts.run_id or run_id or paths.new_run_id()
        matrix.preflight_overrides(opts.overrides, skip_index=opts.offline_check)
        matrix.preflight_tier_env(opts.tiers)
        resolved = [resolve(canaries[i]) for i in (ids or list(canaries))]
    except (RowError, ReleaseError) as exc:
        log(f"error: {exc}")
        return 2
    worst = 0
    for res in resolved:
        try:
            state = run_canary(res, opts, budget_s=budget, log=log)
        except (RowError, bisect.BisectError) as exc:
            log(f"error: {res.canary.id}: {exc}")
            return 2
        for line in state["summary"]:
            log(line)
        publish(state["summary"])
        if state["row"]["verdict"] in FAILING:
            worst = 1
            if outcomes is not None:
                where = RunStore(opts.results, opts.run_id).row_dir(res.canary.id) / CANARY_FILE
                outcomes.append(f"{res.canary.id}: {outcome_line(state, str(where))}")
    return worst


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ids", nargs="*", metavar="CANARY", help="canary ids (constraints/canary/*.txt; default: all)")


def run(ns: argparse.Namespace, rest: list[str]) -> int:
    return main(ns.ids, rest, log=lambda m: print(m, file=sys.stderr if m.startswith("error:") else sys.stdout))
