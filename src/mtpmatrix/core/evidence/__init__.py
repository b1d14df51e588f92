"""What a verdict stands on: the suite's fingerprint, the run's manifest, and the judgement of each record against
them (evidence.judge). A record that cannot show which suite, which versions and which settings ran, in this run,
whole, is "not proven", never "qualifies".

    fingerprint.py   the suite's identity: the tier tests, the code they run, the expected checks, the data
    manifest.py      results/<run>/manifest.json: what the run planned, fixed when it starts
    records.py       a row record's shape checked before anything reads it (no reader crashes on a field edit)
    judge.py         one row's evidence judged against its manifest, its pins, its name and its own metrics
    session.py       how its session ran (pytest's plugins, options, conftests; reruns; GPUs), its build, one row each
    run.py           a run's rows judged and applied
    checkout.py      the judging checkout against its commit: what differs is named, the committed excuses applied

This package sits in the shared bottom layer (mtpmatrix.core): it imports core's modules, nothing above.
"""
