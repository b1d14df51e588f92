"""Compare two matrix runs row by row: each tier's verdict, its check ids and the outcomes of the checks both ran.

    python tools/compare_runs.py results/RUN_A results/RUN_B

What a refactoring must leave unchanged (docs/runs/2026-12-02b-cpu-house-before-after.md). Prints; exits 0."""

import json
import sys
from pathlib import Path

a, b = Path(sys.argv[1]), Path(sys.argv[2])
for row in sorted(p.name for p in a.iterdir() if (p / "row.json").is_file()):
    ra = json.loads((a / row / "row.json").read_text())
    rb = json.loads((b / row / "row.json").read_text())
    print(f"{row}: row verdict {ra.get('verdict')} -> {rb.get('verdict')}")
    for t in ("contract", "reference", "smoke", "gsm8k"):
        ta, tb = ra["tiers"].get(t, {}), rb["tiers"].get(t, {})
        ia = {c["id"]: c["outcome"] for c in ta.get("checks", [])}
        ib = {c["id"]: c["outcome"] for c in tb.get("checks", [])}
        same_ids = set(ia) == set(ib)
        diff_out = [i for i in ia if i in ib and ia[i] != ib[i]]
        print(
            f"  {t}: verdict {ta.get('verdict')} -> {tb.get('verdict')}; checks {len(ia)} -> {len(ib)}; "
            f"ids {'same' if same_ids else f'differ: -{len(set(ia) - set(ib))} +{len(set(ib) - set(ia))}'}; "
            f"outcomes differing {len(diff_out)} {diff_out[:2]}"
        )
