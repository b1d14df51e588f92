"""Reference tier (transformers, CPU): the witness target's hidden states, which the smoke tier holds every returned
row to (mtpmatrix.tiers.surface.hidden_states: sqrt(H) * E[x] at input token x, read from the served checkpoint).

  * ``test_witness_hidden_rows_as_predicted``: transformers' own forward of the checkpoint the smoke tier serves
    returns, at every position, that row, before and after the final norm, within the smoke tier's ROW_RTOL; and
    the rows sglang returned on an H200 (0.5.13 and 0.5.17, element 1 of each row the failure lines quote, rows
    on the side that was right) are that row too.
"""

from __future__ import annotations

import pytest

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.pairs.tiny.build import PAIR_NAMES
from mtpmatrix.tiers.reference_models import one_thread_torch
from mtpmatrix.tiers.surface import hidden_states

pytestmark = pytest.mark.reference

# Element 1 of the rows of these input tokens as sglang returned them on an H200, e-series witness-sglang-phase,
# from the hidden-states failure lines of docs/runs/2026-12-05b-h200-sglang-0.5.17-smoke-default.json.gz,
# 2026-12-05b-h200-sglang-0.5.17-long-and-witness-servers.json.gz and
# 2026-12-05b-h200-sglang-0.5.13-smoke-default.json.gz (the side each line shows right: a prefill row, or the no-MTP
# reference's; token 30 is 0.5.13's MTP prefill row, its no-MTP reference there holding another input's:
# docs/runs/2026-12-05c-cpu-hidden-state-prediction.md).
MEASURED_ELEMENT_1 = {
    30: -0.25586,
    42: -3.0938,
    50: 1.4688,
    54: -0.18359,
    55: 2.3438,
    56: -0.17773,
    57: 0.085938,
    58: -2.2812,
    59: -1.375,
    60: 0.71875,
    61: -0.89453,
    62: 2.9375,
    63: -0.89453,
    64: -1.6328,
    65: 1.1953,
    74: 1.7422,
    80: -2.8125,
    145: -0.52734,
    157: 0.13086,
    163: -0.87891,
    169: -0.072266,
}
MEASURED_PAIR = "e-series"
PROMPTS = ([30 + k for k in range(12)], [145 + k for k in range(12)], [400 + k for k in range(12)])


@pytest.mark.check("mismatch")
@pytest.mark.parametrize("name", PAIR_NAMES)
def test_witness_hidden_rows_as_predicted(load_pair, build_tiny_pair, record_property, name):
    """Every position's hidden state of the witness target (transformers' forward, fp32: the embedding's, each
    layer's and the final norm's output) is the row the smoke tier predicts for its input token, within
    hidden_states.ROW_RTOL; on e-series, the rows measured on an H200 are too. Fails if the prediction or the
    construction it rests on (every layer writes nothing, the final norm leaves a unit-norm row as it is) breaks."""
    torch = one_thread_torch()
    predicted = hidden_states.predicted_rows(build_tiny_pair(name, hidden_states.PAIR).target)
    target, _assistant, _tok = load_pair(name, hidden_states.PAIR)
    ids = torch.tensor(PROMPTS)
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True).hidden_states
    problems = []
    for layer, rows in ((0, states[0]), (len(states) - 2, states[-2]), (len(states) - 1, states[-1])):
        for b, prompt in enumerate(PROMPTS):
            for k, x in enumerate(prompt):
                diff = hidden_states.row_difference(rows[b, k].tolist(), predicted[x])
                if diff:
                    problems.append(
                        f"hidden state {layer}, input {x}: element {diff[0]} {diff[1]:.5g}, predicted {diff[2]:.5g}"
                    )
    if name == MEASURED_PAIR:
        for x, got in MEASURED_ELEMENT_1.items():
            diff = hidden_states.row_difference([got], [predicted[x][1]])
            if diff:
                problems.append(f"H200 row of input {x}: element 1 {got}, predicted {predicted[x][1]:.5g}")
    record_property(
        "rows_checked", 3 * sum(map(len, PROMPTS)) + (len(MEASURED_ELEMENT_1) if name == MEASURED_PAIR else 0)
    )
    if problems:
        raise CheckFailure("mismatch", f"{name}: {len(problems)} row(s) not as predicted; first: {problems[0]}")
