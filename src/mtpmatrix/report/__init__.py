"""The matrix report: one run (``results/<run-id>/``) as Markdown, one self-contained HTML page and JSON.

    python -m mtpmatrix report [RUN_ID] [--results DIR] [--baseline RUN_ID] [--out DIR] [--require TIERS]

writes ``summary.md``, ``report.html`` and ``summary.json`` into ``results/<run-id>/report/`` (or ``--out``) and
appends summary.md to ``$GITHUB_STEP_SUMMARY`` when that is set.

The verdict says what was proven. Every tier verdict is derived again from the stored checks (mtpmatrix.core.expected).
A run QUALIFIES only when every tier is complete -- its whole expected set ran and passed -- in every row; a run
whose CPU tiers passed on a machine without a GPU says so ("CPU checks pass; smoke and gsm8k not run (no GPU)"), and
a tier that ran in part is 'partial', with what did not run and why. Failures that match a known_upstream.json
entry's signature are shown as "known upstream" next to their row and do not fail it. Exit status (summary.EXIT_*,
summary._verdict): 0 every required tier (all without --require) proven in every row; 1 a row broke (a failure of
sglang or its dependencies, or a failed install); 2 bad input (no such run, no rows, unknown tier) or no jinja2, one
line; 3 nothing broke but not proven: a required tier is not complete in every row (partial, skipped, unfinished,
harness only, records that cannot show it), a planned row did not run, the run's evidence does not hold, or nothing
ran at all.

Besides the rows x tiers table the report holds, for every failing row, the closest passing row (fewest packages
that differ in freeze.txt, ties broken towards the same sglang) with the differing versions; GSM8K per-question
paired comparisons between rows (McNemar exact p) where per-question records exist; and with ``--baseline`` a
run-to-run diff (new failures, fixed ones, metric deltas).

    summary.py   the summary (summary.json): runs read through core.store and judged again, tiers across rows, verdicts
    row_summary.py  one row of it: versions, tiers, grouped failures, metrics, servers relaunched alone
    closest.py   each failing row's closest passing row (this run's or the baseline's)
    compare.py   per-question comparisons (stats.paired_compare) and the baseline diff
    checks.py    what both read off a check record
    render.py    summary.md and report.html from templates/*.j2 (jinja2, the 'report' extra), one context
    figures.py   the figures report.html draws inline as SVG (matplotlib, the 'report' extra) and summary.md tabulates
    canaries.py  the canary section (summary.md and summary.json): canaries beside their pinned rows, releases
    cli.py       the command: arguments, files, exit status (python -m mtpmatrix report)
    candidates.py  each candidate beside its base release

Rendering needs jinja2 and the figures matplotlib, both imported on first use (without matplotlib the page says so in
one line and keeps the numbers); the rest is the standard library and packaging, because the package is installed
next to sglang's pins in every row's venv.
"""
