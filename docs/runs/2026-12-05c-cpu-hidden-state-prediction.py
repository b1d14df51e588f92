"""The witness target's hidden-state rows as the smoke tier predicts them (sqrt(H) * E[x], hidden_states.predicted_rows)
against element 1 of every row the H200 runs of 2026-12-05b quoted in their hidden-states failure lines, and which
input token's row each quoted wrong row is. Run in a row venv (torch): PYTHONPATH=src .nox/<row>/bin/python <this>."""

import tempfile
from pathlib import Path

from mtpmatrix.pairs.tiny.build import build_pair
from mtpmatrix.tiers.surface import hidden_states

# (input token, element 1 as sglang returned it, where): the side of each failure line that was right
RIGHT = {
    30: (-0.25586, "0.5.13 MTP hidden-30 prompt 0"),
    42: (-3.0938, "0.5.13 no-MTP hidden-30 output 1"),
    50: (1.4688, "0.5.13 no-MTP hidden-50 prompt 0"),
    54: (-0.18359, "0.5.17 hidden-50 prompt 4"),
    55: (2.3438, "0.5.17 hidden-50 prompt 5"),
    56: (-0.17773, "0.5.17 hidden-50 prompt 6"),
    57: (0.085938, "0.5.17 hidden-50 prompt 7"),
    58: (-2.2812, "0.5.17 hidden-50 prompt 8"),
    59: (-1.375, "0.5.17 hidden-50 prompt 9"),
    60: (0.71875, "0.5.17 hidden-50 prompt 10"),
    61: (-0.89453, "0.5.17 hidden-50 prompt 11"),
    62: (2.9375, "0.5.17 hidden-50 output 1; 0.5.13 no-MTP hidden-50 output 1"),
    63: (-0.89453, "0.5.17 hidden-50 output 2"),
    64: (-1.6328, "0.5.17 hidden-50 output 3"),
    65: (1.1953, "0.5.17 hidden-50 output 4"),
    74: (1.7422, "0.5.17 no-MTP hidden-50 output 13"),
    80: (-2.8125, "0.5.17 no-MTP hidden-50 output 19"),
    145: (-0.52734, "0.5.13 no-MTP hidden-145 prompt 0"),
    157: (0.13086, "0.5.13 no-MTP hidden-145 output 1"),
    163: (-0.87891, "0.5.17 no-MTP hidden-145 output 7"),
    169: (-0.072266, "0.5.17 no-MTP hidden-145 output 13"),
}
# (input token it should be, element 1 as returned, where): the wrong side of each line
WRONG = [
    (30, 0.73438, "0.5.13 no-MTP hidden-30 prompt 0"),
    (60, -1.2109, "0.5.17 MTP topk 1 hidden-30 output 19"),
    (80, 0.73438, "0.5.17 MTP topk 1 hidden-50 output 19"),
    (169, -0.4082, "0.5.17 MTP topk 1 hidden-145 output 13"),
    (54, 0.71875, "0.5.17 MTP topk 1 hidden-30 output 13"),
    (145, -0.018433, "0.5.13 MTP topk 3 hidden-145 prompt 0"),
]

pair = build_pair("e-series", Path(tempfile.mkdtemp()), variant=hidden_states.PAIR)
rows = hidden_states.predicted_rows(pair.target)
worst = 0.0
for x, (got, where) in RIGHT.items():
    rel = abs(rows[x][1] - got) / abs(got)
    worst = max(worst, rel)
    print(f"input {x:3d}: returned {got:9.5g}, predicted {rows[x][1]:9.5g}, relative {rel:.4f}  ({where})")
print(f"worst relative difference {worst:.4f} (the check's ROW_RTOL {hidden_states.ROW_RTOL:.4f})")
for x, got, where in WRONG:
    near = [y for y in range(len(rows)) if hidden_states.row_difference([got], [rows[y][1]]) is None]
    print(f"{where}: input {x}'s row should be {rows[x][1]:.5g}, returned {got:.5g}: element 1 of inputs {near[:6]}")
