"""The shared bottom layer: what every other part of the package may import, and which imports nothing above it
(tests/unit/test_layers.py holds the order: core -> serving -> pairs -> tiers -> runner -> faults, report -> __main__).

    schema.py          the results contract: a row folder's files, tier and verdict words, metric names
    atomic.py          atomic writes and JSON reads
    store.py           results/<run>/<row>/ read and written (runs, row records, freeze, per-question records)
    rows.py            the row files (constraints/*.txt), validated
    paths.py           the checkout, the row files, the results root, run-id kinds and their time format
    options.py         the argparse parent of the commands' shared options (--results, --run-id, --with)
    settings.py        model pairs, thresholds, server arguments, the tiny pair names, the GSM8K data's checksum
    stats.py           the statistics (Wilson intervals, McNemar, chi-square tails)
    unidiff.py         unified diffs applied (a candidate's patch; the fault-injection hook loads it by path)
    kinds.py           the failure kinds and CheckFailure
    known_upstream.py  known upstream issues (known_upstream.json) matched against failures
    smoke_servers.py   the smoke servers and the smoke tier's knobs
    side_by_side_rule.py  which reference checks the side-by-side sglang process runs
    expected.py        what a qualification needs (expected_checks.json) and the tier verdicts derived from it
    evidence/          what a verdict stands on: fingerprint, manifest, record shapes, the judge
"""
