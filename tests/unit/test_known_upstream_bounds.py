"""known_upstream.json's entries are bounded and complete: a release range that ends at a fix or at the newest
release seen, or a signature that bounds every metric on both sides; the assisted-sampling bounds follow from the
closed form; an entry for a dead server lists every check that server runs."""

from __future__ import annotations

import json
import math

import pytest
from packaging.specifiers import SpecifierSet

from mtpmatrix.core import known_upstream

ASSISTED_SAMPLING = "hf-gemma4-assisted-sampling-not-lossless"

# --- every entry is bounded: a release range that ends, or a signature that bounds every metric on both sides -----


def _entry(**kw) -> dict:
    return {
        "id": "x",
        "package": "transformers",
        "affected": ">=5.8.0",
        "tier": "reference",
        "component": "library",
        "kind": "mismatch",
        "match": "m",
        "checks": ["t"],
        "summary": "s",
        "upstream": "u",
        **kw,
    }


@pytest.mark.parametrize(
    "entry, ok",
    [
        (_entry(), False),  # open range, no signature
        (_entry(signature={"metrics": {"a": {"min": 0.5}}}), False),  # open range, a one-sided bound
        (_entry(signature={"metrics": {"a": {"min": 0.5, "max": 0.6}, "b": {"max": 1}}}), False),  # one metric open
        (_entry(signature={"passed_beside": ["test_y"]}), False),  # open range, no metric at all
        (_entry(affected=">=5.8.0,!=5.9.0"), False),  # != excludes one release, bounds nothing
        (_entry(signature={"metrics": {"a": {"min": 0.5, "max": 0.6}}}), True),
        (_entry(affected=">=5.8.0,<5.20.0"), True),
        (_entry(affected=">=5.8.0,<=5.24.0"), True),
        (_entry(affected="==5.19.0"), True),
        (_entry(affected="~=5.19.0"), True),
    ],
)
def test_an_entry_needs_an_upper_bound_or_a_two_sided_signature(tmp_path, entry, ok):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [entry]}))
    if ok:
        assert [i.id for i in known_upstream.load(f)] == ["x"]
        return
    with pytest.raises(ValueError) as info:
        known_upstream.load(f)
    msg = str(info.value)
    assert msg.startswith(f"{f}: issue 0 (x): unbounded:") and "\n" not in msg


@pytest.mark.parametrize(
    "bound, words",
    [
        ({"min": float("nan"), "max": 1}, "min nan is not a finite number"),
        ({"min": 0, "max": float("inf")}, "max inf is not a finite number"),
        ({"min": "0.5", "max": 1}, "min '0.5' is not a finite number"),
        ({"min": 0.7, "max": 0.6}, "min 0.7 above max 0.6"),
    ],
)
def test_a_metric_bound_must_be_a_finite_number(tmp_path, bound, words):
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"issues": [_entry(signature={"metrics": {"a": bound}})]}))
    with pytest.raises(ValueError) as info:
        known_upstream.load(f)
    assert f"{f}: issue 0 (x): signature metric a: {words}" == str(info.value)


def test_a_fixed_bug_ends_at_its_fix_and_an_open_one_at_the_newest_release_seen():
    """An entry no longer matches past the releases it was seen on: a newer release that still fails is unlisted
    (and fails the row) until someone looks again and widens the range."""
    for issue in known_upstream.load():
        upper = [s for s in SpecifierSet(issue.affected) if s.operator in ("<", "<=")]
        assert len(upper) == 1, issue.id
        if issue.fixed_in:
            assert (upper[0].operator, upper[0].version) == ("<", issue.fixed_in), issue.id
        else:
            assert (
                upper[0].operator == "<=" and f"newest release it was seen on: {upper[0].version}" in issue.summary
            ), issue.id


def _recorded_shares_in(bounds: dict, p1: float, p3: float, n: int = 1536) -> float:
    """The probability that the check's recorded shares of offsets 1 and 3 (round(count / n, 4)) fall inside
    ``bounds`` when each of its n offsets is 1 with probability p1, 3 with p3, else 7: the multinomial, summed
    exactly over the counts that round into the bounds."""

    def log_binom(k, m, p):
        if p <= 0 or p >= 1:
            return 0.0 if k == (m if p >= 1 else 0) else -math.inf
        return (
            math.lgamma(m + 1)
            - math.lgamma(k + 1)
            - math.lgamma(m - k + 1)
            + k * math.log(p)
            + (m - k) * math.log(1 - p)
        )

    def counts(name, m):
        lo, hi = bounds[name]["min"], bounds[name]["max"]
        return [
            c
            for c in range(max(0, math.floor(lo * n) - 1), min(m, math.ceil(hi * n) + 1) + 1)
            if lo <= round(c / n, 4) <= hi
        ]

    total = 0.0
    for c1 in counts("sampled_share_offset_1", n):
        l1 = log_binom(c1, n, p1)
        q3 = p3 / (1 - p1) if p1 < 1 else 0.0
        total += sum(math.exp(l1 + log_binom(c3, n - c1, q3)) for c3 in counts("sampled_share_offset_3", n - c1))
    return total


def test_the_assisted_sampling_bounds_follow_from_the_closed_form():
    """The derivation in docs/upstream/hf-gemma4-assisted-sampling-not-lossless.md, computed again: from the check's
    closed form and the drafter's q, the bug's shares; each alternative's shares; the chance that each falls
    inside the entry's bounds at the check's n = 1536."""
    from mtpmatrix.pairs.sampled import ring
    from mtpmatrix.pairs.sampled.verify_model import VOCAB

    closed = ring.closed_form(VOCAB)
    # q: the assistant's own softmax (temperature 1) over the vocabulary, which transformers takes for the draft's
    # probability although the draft is its argmax (offset 7)
    w = {d: math.exp(ring.softcap(x)) for d, x in zip(ring.OFFSETS, ring.DRAFT_LOGITS)}
    z = sum(w.values()) + (VOCAB - len(w)) * math.exp(ring.softcap(ring.DRAFT_OTHER_LOGIT))
    q = {d: v / z for d, v in w.items()}
    accept = closed[7] / q[7]  # min(1, p/q) for the drafted offset 7
    residual = {d: max(closed.get(d, 0.0) - q[d], 0.0) for d in ring.OFFSETS}  # max(p - q, 0)
    bug = {d: (1 - accept) * residual[d] / sum(residual.values()) for d in (1, 3)}
    assert (round(bug[1], 3), round(bug[3], 3), round(accept, 3)) == (0.586, 0.206, 0.208)
    twice = ring.token_distribution(VOCAB, ring.GROUPS[0], "top_k_first", temperature=ring.TEMPERATURE**2)
    ignored = ring.token_distribution(VOCAB, ring.GROUPS[0], "top_k_first", temperature=1.0)
    sig = {i.id: i for i in known_upstream.load()}[ASSISTED_SAMPLING].signature["metrics"]
    assert sig["sampled_offsets"] == {"min": 1536, "max": 1536} and sig["sampled_off_support"] == {"min": 0, "max": 0}
    rate = {
        name: _recorded_shares_in(sig, p1, p3)
        for name, (p1, p3) in {
            "bug": (bug[1], bug[3]),
            "recorded": (889 / 1536, 344 / 1536),
            "closed form": (closed[1], closed[3]),
            "temperature twice": (twice[1], twice[3]),
            "temperature ignored": (ignored[1], ignored[3]),
            "greedy": (1.0, 0.0),
        }.items()
    }
    assert rate["bug"] > 0.998 and rate["recorded"] > 0.9  # the bug matches; so would the recorded shares, as truth
    assert rate["temperature twice"] < 5e-4 and rate["closed form"] < 1e-7 and rate["temperature ignored"] < 1e-12
    assert rate["greedy"] == 0.0


def test_an_entry_for_a_dead_server_lists_every_check_that_server_runs():
    """A crash or launch entry that lists a server's test_server_serves case explains that server's death: every
    check over the server then fails with the same message, so the entry must list each of them (the eager-draft
    crash once missed the custom-logit-processor case added after it, which then failed unexplained)."""
    from mtpmatrix.core import known_upstream, smoke_servers
    from mtpmatrix.core.evidence import expected_checks
    from mtpmatrix.core.schema import short_check_id

    names = sorted((s.name for s in smoke_servers.SMOKE_SERVERS), key=len, reverse=True)

    def server_of(case_id: str) -> str | None:
        param = short_check_id(case_id).partition("[")[2].rstrip("]")
        return next((n for n in names if param == n or param.startswith(n + "-")), None)

    smoke = expected_checks.load()["smoke"]
    for issue in known_upstream.load():
        dead = [c[len("test_server_serves[") : -1] for c in issue.checks if c.startswith("test_server_serves[")]
        for server in dead:
            runs = {short_check_id(c) for c in smoke if server_of(c) == server}
            assert runs, (issue.id, server)
            assert runs <= set(issue.checks), (issue.id, sorted(runs - set(issue.checks)))
