"""Write (--write) or check src/mtpmatrix/core/expected_checks.json against what tests/tiers collects with no knobs.

python tools/expected_checks.py          exit 1 and the difference when they disagree
python tools/expected_checks.py --write  write the file from the suite
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mtpmatrix.core.evidence import expected_checks  # noqa: E402


def main(argv: list[str]) -> int:
    collected = expected_checks.collect(REPO)
    if "--write" in argv:
        expected_checks.FILE.write_text(expected_checks.render(collected))
        print(f"wrote {expected_checks.FILE}: " + ", ".join(f"{t} {len(v)}" for t, v in collected.items()))
        return 0
    defined = expected_checks.load()
    diff = [(t, sorted(set(collected[t]) ^ set(defined[t]))) for t in collected]
    diff = [(t, d) for t, d in diff if d]
    for tier, ids in diff:
        print(f"{tier}: {len(ids)} check(s) differ, e.g. {ids[:3]}")
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
