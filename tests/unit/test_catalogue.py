"""The mutant catalogue (faults/catalogue/, applied by faults/mutation.py): sites applied on small fake source trees,
selection, the catalogue's own rules, and the off-chain mutants on each release's form of the lines they edit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mutant_trees import (
    FAKE,
    OFF_CHAIN,
    RELEASE_FORMS,
    write_tree,
)

from mtpmatrix.faults import catalogue as C
from mtpmatrix.faults import mutation as F
from mtpmatrix.faults.catalogue import servers as CS


def test_sites_apply_where_the_anchor_is_unique_and_are_na_elsewhere(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    m = F.Mutant(
        "seed-first",
        "handoff",
        "first instead of last",
        (
            F.Site("sglang.srt.speculative.worker_v2", "return h[n - 1]", "return h[0]"),  # this release
            F.Site("sglang.srt.speculative.worker_v1", "return h[n - 1]", "return h[0]"),  # an older one: absent
        ),
    )
    app = F.apply(m, pkg)
    assert app.applicable and app.error is None
    assert [s.status for s in app.sites] == ["applied", "no such file"]
    assert app.files == ["sglang/srt/speculative/worker_v2.py"]
    assert "return h[0]" in F.hook_payload(app)["modules"]["sglang.srt.speculative.worker_v2"]["source"]
    assert "-    return h[n - 1]\n+    return h[0]" in F.diff(app)


@pytest.mark.parametrize(
    "site,status",
    [
        (F.Site("sglang.srt.speculative.worker_v2", "return h[n]", "return h[0]"), "anchor absent"),
        (F.Site("sglang.srt.speculative.twice", "x = 1\n", "x = 2\n"), "anchor found 2 times"),
        (F.Site("sglang.srt.speculative.gone", "x", "y"), "no such file"),
    ],
)
def test_absent_or_ambiguous_anchor_is_not_applicable(tmp_path, site, status):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    app = F.apply(F.Mutant("m", "handoff", "m", (site,)), pkg)
    assert not app.applicable and app.modules == {}
    assert status in app.reason()


def test_a_replacement_that_does_not_compile_is_an_error(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    app = F.apply(
        F.Mutant("m", "handoff", "m", (F.Site("sglang.srt.speculative.worker_v2", "return h[n - 1]", "return h[0"),)),
        pkg,
    )
    assert app.applicable and "does not compile" in app.error and "worker_v2.py:2" in app.error


def test_overlapping_sites_are_an_error(tmp_path):
    pkg = write_tree(tmp_path, FAKE) / "sglang"
    mod = "sglang.srt.speculative.worker_v2"
    app = F.apply(
        F.Mutant(
            "m", "handoff", "m", (F.Site(mod, "return h[n - 1]", "return h[n - 2]"), F.Site(mod, "h[n - 1]", "h[0]"))
        ),
        pkg,
    )
    assert "overlap" in app.error


def test_select_and_unknown_ids():
    assert [m.id for m in C.select("topk-parent-hidden, handoff-block-first")] == [
        "handoff-block-first",
        "topk-parent-hidden",
    ]
    assert len(C.select(None)) == len(C.CATALOGUE)
    with pytest.raises(F.MutantsError, match="unknown mutant.s. nope; known: handoff-block-first"):
        C.select("handoff-block-first,nope")


def test_catalogue_covers_every_required_category_with_distinct_real_edits():
    ids = [m.id for m in C.CATALOGUE]
    assert len(ids) == len(set(ids)) >= 8
    assert {m.category for m in C.CATALOGUE} == set(F.CATEGORIES)
    for m in C.CATALOGUE:
        assert m.sites and m.models and m.expect and m.servers, m.id
        assert all(s.module.startswith("sglang.") and s.anchor != s.replacement for s in m.sites), m.id


@pytest.mark.parametrize("release", sorted(RELEASE_FORMS))
@pytest.mark.parametrize("mutant_id", sorted(OFF_CHAIN))
def test_off_chain_mutants_apply_to_each_release_form(tmp_path, release, mutant_id):
    pkg = write_tree(tmp_path, RELEASE_FORMS[release]) / "sglang"
    mutant = C.catalogue_by_id()[mutant_id]
    app = F.apply(mutant, pkg)
    assert app.applicable and app.error is None, app.reason()
    want = OFF_CHAIN[mutant_id][0 if release == "0.5.13" else 1]
    assert {Path(f).name for f in app.files} == want
    patched = "".join(m["patched"] for m in app.modules.values())
    assert all(s.site.replacement in patched for s in app.sites if s.applied)
    assert not any(s.status.startswith("anchor found") for s in app.sites)  # never ambiguous


def test_off_chain_edits_do_what_they_model(tmp_path):
    """The edits themselves, read off the patched text: what each mutant changes and nothing else."""
    forms = {r: write_tree(tmp_path / r, files) / "sglang" for r, files in RELEASE_FORMS.items()}

    def patched(mutant_id: str, release: str, file: str) -> str:
        app = F.apply(C.catalogue_by_id()[mutant_id], forms[release])
        return next(m["patched"] for m in app.modules.values() if m["rel"].endswith(file))

    for r in RELEASE_FORMS:
        assert "(flat_cs // topk).clamp(max=0)" in patched("topk-parent-non-first", r, "spec_utils.py")
        text = patched("verify-temperature-ignored", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "/ expanded_temperature" not in text and "temperatures=expanded_temperature" not in text
        text = patched("verify-renorm-skipped", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "= top_k_renorm_prob(" not in text and "= top_p_renorm_prob(" not in text
        text = patched("verify-accept-threshold", r, "eagle_info.py" if r == "0.5.13" else "eagle_utils.py")
        assert "threshold_acc=0.5 * " in text and "threshold_single=get_" in text  # only the coin threshold moves
        text = patched("metric-correct-drafts-bonus", r, "batch_result_processor.py")
        assert "spec_num_correct_drafts += num_correct_drafts + 1\n" in text
        assert "req.spec_verify_ct += 1\n" in text and "histogram(num_correct_drafts)" in text  # the rest untouched


def test_every_mutant_names_servers_that_can_see_it():
    """Witness servers for hand-off bugs, the decoy / sampled servers for what the witness cannot see, every one a
    server of this checkout's smoke tier (a run refuses servers the smoke tier lacks: next test)."""
    from mtpmatrix.core.smoke_servers import SMOKE_SERVERS

    known = {s.name for s in SMOKE_SERVERS}
    by_id = C.catalogue_by_id()
    for m in C.CATALOGUE:
        assert set(m.servers) <= known, m.id
    assert by_id["topk-parent-non-first"].servers == CS.DECOY_TOPK3 == ("decoy-mtp-topk3",)
    assert by_id["verify-accept-all-greedy"].servers == CS.DECOY_TOPK1 == ("decoy-mtp-topk1",)
    for mid in ("verify-temperature-ignored", "verify-renorm-skipped", "verify-accept-threshold"):
        assert by_id[mid].servers == ("sampled-mtp-topk1", "sampled-mtp-topk3"), mid
        assert "test_sampled_distribution_matches_closed_form" in by_id[mid].expect
    assert "test_meta_info_fields_agree" in by_id["metric-correct-drafts-bonus"].expect
