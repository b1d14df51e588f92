"""A candidate that moves the draft phase: the suite builds its sglang-phase witnesses for the phase the candidate
declares (MTPMATRIX_DRAFT_PHASE), and when an undeclared sglang drafts at transformers' phase, the sglang-phase
servers fail as "draft phase moved", not as a broken hand-off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mtpmatrix.core import smoke_servers
from mtpmatrix.pairs.tiny.build import pair_hash
from mtpmatrix.pairs.witness import phase
from mtpmatrix.tiers import smoke

SPECS = {s.name: s for s in smoke_servers.smoke_options({}).specs}
ALL_RIGHT = [{"completion_tokens": 32, "spec_verify_ct": 6}] * 8  # 5.33 per verify: every draft accepted
COLLAPSED = [{"completion_tokens": 32, "spec_verify_ct": 30}] * 8  # 1.07: the drafts read the wrong key


def test_the_declared_phase_builds_the_sglang_phase_witnesses(monkeypatch):
    monkeypatch.delenv("MTPMATRIX_DRAFT_PHASE", raising=False)
    before = pair_hash("e-series", "witness-sglang-phase", 0)
    assert phase.phase_of_variant("witness-sglang-phase") == -1  # no sglang here: the newest measured release
    monkeypatch.setenv("MTPMATRIX_DRAFT_PHASE", "+1")
    assert phase.sglang_draft_phase() == phase.phase_of_variant("witness-sglang-phase") == 1
    assert phase.phase_of_variant("decoy-sglang-phase") == 1
    assert phase.sglang_draft_phase("0.5.17") == -1  # a release asked for by name stays what it is
    assert pair_hash("e-series", "witness-sglang-phase", 0) != before  # a cached -1 pair is rebuilt
    monkeypatch.setenv("MTPMATRIX_DRAFT_PHASE", "one")
    with pytest.raises(ValueError, match="MTPMATRIX_DRAFT_PHASE='one': not a whole number"):
        phase.sglang_draft_phase()


def runs(**metas) -> dict:
    return {name: SimpleNamespace(spec=SPECS[name], id_meta=m) for name, m in metas.items()}


def test_sglang_phase_servers_that_collapse_beside_a_right_transformers_phase_witness_say_the_phase_moved(monkeypatch):
    monkeypatch.delenv("MTPMATRIX_DRAFT_PHASE", raising=False)
    moved = runs(**{"witness-mtp-topk1": COLLAPSED, "witness-transformers-phase-topk1": ALL_RIGHT})
    why = smoke.phase_moved(SPECS["witness-mtp-topk1"], moved)
    assert why.startswith(
        "draft phase moved: this server's pair is built for sglang's draft phase -1, while the "
        "witness built for transformers' phase +1 accepts 5.33 per verify"
    )
    assert smoke.phase_moved(SPECS["decoy-mtp-topk3"], moved) == why
    # a broken hand-off drops the transformers-phase witness too: that is no moved phase
    broken = runs(**{"witness-mtp-topk1": COLLAPSED, "witness-transformers-phase-topk1": COLLAPSED})
    assert smoke.phase_moved(SPECS["witness-mtp-topk1"], broken) is None
    # only the servers built for sglang's phase can have it moved under them
    assert smoke.phase_moved(SPECS["witness-transformers-phase-topk1"], moved) is None
    assert smoke.phase_moved(SPECS["witness-mtp-topk1"], runs(**{"witness-mtp-topk1": COLLAPSED})) is None
