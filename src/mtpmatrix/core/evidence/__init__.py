"""What a verdict stands on: the suite's fingerprint, the run's manifest, and the judgement of each record against
them (evidence.judge). A record that cannot show which suite, which versions and which settings ran, in this run,
whole, is "not proven", never "qualifies".

    fingerprint.py   the suite's identity: the tier tests, the code they run, the expected checks, the data
    manifest.py      results/<run>/manifest.json: what the run planned, fixed when it starts
    records.py       a row record's shape checked before anything reads it (no reader crashes on a field edit)
    judge.py         one row's evidence judged against its manifest and its name, by the parts below
    versions.py        the versions it ran against its pins and --with overrides
    environment.py     the settings it ran with: MTPMATRIX_* knobs, SGLANG_* variables, what it was asked
    checks.py          each check's record: what served it, its numbers against its outcome
    record_files.py    tiers.json and junit.xml beside row.json telling the same story
    session.py         how its session ran (pytest's plugins, options, conftests; reruns; GPUs), its build, one row each
    run.py           a run's rows judged and applied
    checkout.py      the judging checkout against its commit: what differs is named, the committed excuses applied

This package sits in the shared bottom layer (mtpmatrix.core): it imports core's modules, nothing above.
"""
