"""The fault-injection catalogue: small source mutations of the installed sglang's MTP path, and applying them.

Each mutant is one deliberate bug of the kind the smoke tier exists to catch (the drafter seeded with the wrong
hidden state, the wrong frozen-KV layer, shifted RoPE positions, the wrong tree parent, rows of different requests
mixed, lossy verification, a wrong accept-length counter, the draft CUDA graph never captured; and, seen only by the
decoy and sampled servers, a tree parent off the first branch, a verify that takes every draft, a sampled verify
without the request's temperature, top-k/top-p or accept threshold, a miscounted per-request metric field). A
mutant is a list of sites, each *module + anchor text + replacement*; every site whose anchor occurs exactly once in
the installed release is applied (several sites carry one bug across releases, e.g. the non-overlap worker of
0.5.13 and the spec-v2 worker of 0.5.17). No site applies: the mutant is "n.a." for this release and never counts
as killed.

The installed files are never edited: the patched text goes into ``<out>/<id>/mutant.json`` (``hook_payload``) and
the hook in ``mutant_hook/sitecustomize.py`` (first on PYTHONPATH for the pytest run and every server process it
launches) serves it in place of the module. Every process that loads a patched module says so in its log (``MARK``).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.tiers.smoke import DECOY_SERVERS, SAMPLED_SERVERS, WITNESS_SERVERS  # defined once, in smoke
from mtpmatrix.schema import comma_list

HOOK_DIR = Path(__file__).resolve().parent / "mutant_hook"
ENV_MUTANT = "MTPMATRIX_MUTANT"  # read by mutant_hook/sitecustomize.py
MARK = "mtpmatrix-mutant:"  # the hook's log lines

# The smoke servers a mutant's suite launches unless its catalogue entry says otherwise: the witness pair, whose
# drafter needs the right hidden state, KV layer, positions, tree parent and its own request's rows to draft right.
DEFAULT_SERVERS = WITNESS_SERVERS
TOPK1, TOPK3 = (WITNESS_SERVERS[0],), (WITNESS_SERVERS[1],)
# Smoke servers that see what the witness cannot: the decoy witness (greedy; the drafter ranks a wrong decoy first at
# known inputs, so verify must reject it and, at topk 3, the accepted path runs through non-first branches) and the
# sampled pair (temperature, top-k, top-p; a closed-form target distribution). Defined once, in smoke.
DECOY_TOPK1, DECOY_TOPK3 = (DECOY_SERVERS[0],), (DECOY_SERVERS[1],)
SAMPLED_MTP = SAMPLED_SERVERS

CATEGORIES = {
    "handoff": "hidden-state handoff to the drafter",
    "kv-binding": "frozen-KV layer binding",
    "positions": "RoPE positions of draft steps",
    "tree-parent": "topk tree parents",
    "batch-expansion": "batch expansion at topk > 1",
    "lossy-verify": "lossy verification",
    "accounting": "accept-length accounting",
    "cuda-graph": "draft CUDA-graph capture",
    "sampled-verify": "sampled verification (temperature, top-k/top-p, accept thresholds)",
    "metric-fields": "per-request speculative metric fields",
}


class MutantsError(Exception):
    """Bad input or an unusable environment: one line, exit status 2."""


@dataclass(frozen=True)
class Site:
    """Replace ``anchor`` (which must occur exactly once) by ``replacement`` in ``module``."""
    module: str
    anchor: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    id: str
    category: str  # a CATEGORIES key
    models: str  # the bug it models, one line
    sites: tuple[Site, ...]
    servers: tuple[str, ...] = DEFAULT_SERVERS
    expect: str = ""  # the smoke check(s) expected to kill it, and why


# Modules of the MTP path, by release: 0.5.13 runs Frozen-KV MTP on the non-overlap worker (frozen_kv_mtp_worker,
# EAGLE v1 verify in eagle_info); 0.5.17 and later on the spec-v2 worker (frozen_kv_mtp_worker_v2, eagle_utils).
_W1 = "sglang.srt.speculative.frozen_kv_mtp_worker"
_W2 = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
_FKU = "sglang.srt.speculative.frozen_kv_mtp_utils"
_SPU = "sglang.srt.speculative.spec_utils"
_EAU = "sglang.srt.speculative.eagle_utils"
_EAI = "sglang.srt.speculative.eagle_info"
_EAI2 = "sglang.srt.speculative.eagle_info_v2"
_G4 = "sglang.srt.models.gemma4_mtp"
_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor"
_MRP = "sglang.srt.managers.scheduler_components.metrics_reporter"

_SELECT_LAST = ("* self.speculative_num_draft_tokens\n"
                "            + batch_result.accept_lens\n"
                "            - 1\n")
_EXPAND = ("    forward_batch.req_pool_indices = forward_batch.req_pool_indices.repeat_interleave(\n"
           "        topk, dim=0\n"
           "    )\n"
           "    forward_batch.seq_lens = forward_batch.seq_lens.repeat_interleave(topk, dim=0)\n"
           "    if forward_batch.seq_lens_cpu is not None:\n"
           "        forward_batch.seq_lens_cpu = forward_batch.seq_lens_cpu.repeat_interleave(\n"
           "            topk, dim=0\n"
           "        )\n")
_LOOP_POSITIONS = ("            forward_batch.spec_info.hidden_states = hidden_states\n"
                   "            self._set_positions(forward_batch)\n")
_SHIFT_TARGET = "; target_predict = torch.cat([target_predict[:, 1:], target_predict[:, -1:]], dim=1)\n"
_SWAP_TYPE = '{"sliding_attention": "full_attention", "full_attention": "sliding_attention"}.get(t, t)'
# Greedy verify that takes every draft: the target's prediction at each chain position replaced by the next draft
# (topk 1 layout: position 0 the last verified token, 1..steps the drafts), the bonus from the target's last row.
_ACCEPT_ALL = ("; target_predict = torch.cat([candidates[:, 1:].to(target_predict.dtype), target_predict[:, -1:]], "
               "dim=1)\n")

CATALOGUE: tuple[Mutant, ...] = (
    Mutant(
        "handoff-block-first", "handoff",
        "drafter seeded with the target hidden state of the verify block's first position, not the last accepted",
        (Site(_W2, _SELECT_LAST, "* self.speculative_num_draft_tokens\n"
                                 "            + 0 * batch_result.accept_lens\n"
                                 "            + 0\n"),
         Site(_FKU, "        draft_input.hidden_states[last_indices],\n",
              "        draft_input.hidden_states[last_indices - counts + 1],\n")),
        expect="test_spec_metrics (acceptance collapses, output stays right)"),
    Mutant(
        "handoff-stale-by-one", "handoff",
        "drafter seeded with the hidden state one accepted position before the last (stale by one step)",
        (Site(_W2, _SELECT_LAST, "* self.speculative_num_draft_tokens\n"
                                 "            + batch_result.accept_lens\n"
                                 "            - 1 - (batch_result.accept_lens > 1).to(batch_result.accept_lens.dtype)"
                                 "\n"),
         Site(_FKU, "        draft_input.hidden_states[last_indices],\n",
              "        draft_input.hidden_states[last_indices - (counts > 1).long()],\n")),
        servers=TOPK1, expect="test_spec_metrics"),
    Mutant(
        "kv-layer-first-of-type", "kv-binding",
        "each assistant layer reads the KV of the first target layer of its type instead of the last",
        (Site(_G4, "for i in (L - 2, L - 1)}", "for i in reversed(range(L))}"),),
        servers=TOPK1, expect="test_spec_metrics (only where the first and last KV owner of a type differ: "
                              "sliding in the tiny pairs)"),
    Mutant(
        "kv-layer-type-swap", "kv-binding",
        "sliding assistant layers read the full-attention KV and vice versa",
        (Site(_G4, "            physical[i] = by_type[t]\n", f"            physical[i] = by_type[{_SWAP_TYPE}]\n"),),
        servers=TOPK1, expect="test_server_serves (head dims differ: likely a launch crash), else test_spec_metrics"),
    Mutant(
        "draft-position-ahead", "positions",
        "RoPE position of every draft step one ahead of the last written target slot",
        (Site(_FKU, "positions = torch.clamp(seq_lens - 1, min=0).to(torch.int64)",
              "positions = torch.clamp(seq_lens, min=0).to(torch.int64)"),),
        servers=TOPK1, expect="test_spec_metrics"),
    Mutant(
        "draft-position-advanced", "positions",
        "RoPE position advanced per draft step (Frozen-KV MTP keeps the last target slot for every step)",
        (Site(_W2, _LOOP_POSITIONS, _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n"),
         Site(_W1, _LOOP_POSITIONS, _LOOP_POSITIONS[:-1] + "; forward_batch.positions.add_(i + 1)\n")),
        servers=TOPK1, expect="test_spec_metrics (steps after the first draft go wrong)"),
    Mutant(
        "topk-parent-hidden", "tree-parent",
        "at topk > 1 each new draft node continues from the hidden state of the next sibling, not its parent",
        (Site(_SPU, "selected_input_index = flat_cs // topk + batch_offsets",
              "selected_input_index = (flat_cs // topk + 1) % topk + batch_offsets"),),
        servers=TOPK3, expect="test_spec_metrics[witness-mtp-topk3]"),
    Mutant(
        "topk-expand-seed-rows", "batch-expansion",
        "at topk > 1 the seed hidden states are tiled (repeat) instead of repeated per request (repeat_interleave)",
        (Site(_W2, "seed_prev_hidden = target_hidden.repeat_interleave(self.topk, dim=0)",
              "seed_prev_hidden = target_hidden.repeat(self.topk, 1)"),
         Site(_W1, "seed_prev_hidden = target_hidden.repeat_interleave(self.topk, dim=0)",
              "seed_prev_hidden = target_hidden.repeat(self.topk, 1)")),
        servers=TOPK3, expect="test_spec_metrics[witness-mtp-topk3] (needs > 1 request per batch)"),
    Mutant(
        "topk-expand-kv-rows", "batch-expansion",
        "at topk > 1 the draft rows read the KV and positions of other requests (repeat vs repeat_interleave)",
        (Site(_FKU, _EXPAND, _EXPAND.replace(".repeat_interleave(\n", ".repeat(\n")
              .replace("topk, dim=0\n", "topk\n").replace(".repeat_interleave(topk, dim=0)", ".repeat(topk)")),),
        servers=TOPK3, expect="test_spec_metrics[witness-mtp-topk3] (needs > 1 request per batch)"),
    Mutant(
        "verify-target-row-shift", "lossy-verify",
        "verification reads the target's prediction one tree row late, so it commits tokens the target would not "
        "have produced",
        (Site(_EAU, "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _SHIFT_TARGET),
         Site(_EAI, "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _SHIFT_TARGET),
         Site(_EAI2, "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _SHIFT_TARGET)),
        expect="the witness rule check (mismatch), and test_spec_metrics"),
    Mutant(
        "accept-count-request", "accounting",
        "each verify step counted twice in the per-request spec_verify_ct (accept length per request halves)",
        (Site(_EAI, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n"),
         Site(_BRP, "req.spec_verify_ct += 1\n", "req.spec_verify_ct += 2\n")),
        servers=TOPK1, expect="test_spec_metrics (per-request accept length under the floor, and off the "
                              "server's avg_spec_accept_length); test_meta_info_fields_agree (histogram counts half "
                              "the verify steps)"),
    Mutant(
        "accept-count-server", "accounting",
        "the scheduler's forward count behind avg_spec_accept_length counted twice (server-side average halves)",
        (Site(_MRP, "self.spec_num_forward_ct += bs\n", "self.spec_num_forward_ct += 2 * bs\n"),),
        servers=TOPK1, expect="test_spec_metrics and test_meta_info_fields_agree (avg_spec_accept_length "
                              "inconsistent with per-request numbers)"),
    Mutant(
        "draft-cuda-graph-skipped", "cuda-graph",
        "the Frozen-KV draft CUDA graph is never captured (the draft loop silently runs eagerly)",
        (Site(_W2, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
         Site(_W1, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return")),
        servers=TOPK1, expect="test_cuda_graphs_captured (no draft capture line)"),
    Mutant(
        "topk-parent-non-first", "tree-parent",
        "at topk > 1 a draft node whose parent is not its step's first-ranked node continues from the first-ranked "
        "node's hidden state (nodes under the first branch stay right)",
        (Site(_SPU, "selected_input_index = flat_cs // topk + batch_offsets",
              "selected_input_index = (flat_cs // topk).clamp(max=0) + batch_offsets"),),
        servers=DECOY_TOPK3, expect="test_decoy_accept_matches_prediction[decoy-mtp-topk3] (acceptance: the path "
                                    "through the second-ranked branch drafts wrong; the witness stays on branch 0)"),
    Mutant(
        "verify-accept-all-greedy", "lossy-verify",
        "greedy verify accepts every draft without comparing it with the target's argmax (topk 1 chain)",
        (Site(_EAU, "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, verify_input.draft_token_num)" + _ACCEPT_ALL),
         Site(_EAI, "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _ACCEPT_ALL),
         Site(_EAI2, "target_predict = target_predict.reshape(bs, self.draft_token_num)\n",
              "target_predict = target_predict.reshape(bs, self.draft_token_num)" + _ACCEPT_ALL)),
        servers=DECOY_TOPK1, expect="test_exact_pair_follows_rule[decoy-mtp-topk1] (mismatch: the decoys reach the "
                                    "output), test_decoy_accept_matches_prediction"),
    Mutant(
        "verify-temperature-ignored", "sampled-verify",
        "sampled verify builds the target distribution at temperature 1 whatever the request asked",
        (Site(_EAU, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),  # 0.5.17
         Site(_EAU, "next_token_logits, temperatures=expanded_temperature\n",  # 0.5.23: sampling_softmax(...)
              "next_token_logits, temperatures=torch.ones_like(expanded_temperature)\n"),
         Site(_EAI, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1"),  # 0.5.13
         Site(_EAI2, "next_token_logits / expanded_temperature, dim=-1", "next_token_logits, dim=-1")),
        servers=SAMPLED_MTP, expect="test_sampled_distribution_matches_closed_form (mismatch)"),
    Mutant(
        "verify-renorm-skipped", "sampled-verify",
        "sampled verify skips the top-k and top-p renormalisation of the target distribution",
        tuple(Site(m, f"target_probs = top_{x}_renorm_prob(", f"target_probs = (lambda probs, _{x}s: probs)(")
              for m in (_EAU, _EAI, _EAI2) for x in ("k", "p")),
        servers=SAMPLED_MTP, expect="test_sampled_distribution_matches_closed_form (mismatch: tokens outside "
                                    "top-k/top-p appear, the kept ones lose mass)"),
    Mutant(
        "verify-accept-threshold", "sampled-verify",
        "sampled verify accepts a draft when the coin is under twice its target probability (threshold_acc "
        "halved: the kernel accepts when coin <= prob_acc / threshold_acc)",
        (Site(_EAU, "threshold_acc=get_spec().speculative_accept_threshold_acc,",
              "threshold_acc=0.5 * get_spec().speculative_accept_threshold_acc,"),
         Site(_EAI, "threshold_acc=get_global_server_args().speculative_accept_threshold_acc,",
              "threshold_acc=0.5 * get_global_server_args().speculative_accept_threshold_acc,"),
         Site(_EAI2, "threshold_acc=get_global_server_args().speculative_accept_threshold_acc,",
              "threshold_acc=0.5 * get_global_server_args().speculative_accept_threshold_acc,")),
        servers=SAMPLED_MTP, expect="test_sampled_distribution_matches_closed_form (mismatch: the drafter's "
                                    "tokens are over-represented)"),
    Mutant(
        "metric-correct-drafts-bonus", "metric-fields",
        "each request's spec_num_correct_drafts also counts the bonus token of every verify step (the response's "
        "accept rate and draft count off by one per step; verify count, accept length and the server counter right)",
        (Site(_BRP, "req.spec_num_correct_drafts += num_correct_drafts\n",
              "req.spec_num_correct_drafts += num_correct_drafts + 1\n"),
         Site(_EAI, "req.spec_num_correct_drafts += num_correct_drafts_this_req\n",
              "req.spec_num_correct_drafts += num_correct_drafts_this_req + 1\n")),
        servers=TOPK1, expect="test_meta_info_fields_agree (accounting: histogram and tail rule disagree with "
                              "spec_num_correct_drafts; test_spec_metrics does not read it)"),
)


def catalogue_by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}


def select(ids: str | None, catalogue: tuple[Mutant, ...] = CATALOGUE) -> list[Mutant]:
    """The mutants named in ``ids`` ("a,b"), in catalogue order; all when empty. MutantsError on unknown ids."""
    if not ids or not ids.strip():
        return list(catalogue)
    wanted = comma_list(ids)
    known = [m.id for m in catalogue]
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise MutantsError(f"unknown mutant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [m for m in catalogue if m.id in wanted]


# --------------------------------------------------------------------------------------------- applying
def module_file(pkg_dir: Path, module: str) -> Path:
    """sglang.srt.x.y -> <pkg_dir>/srt/x/y.py"""
    parts = module.split(".")
    return Path(pkg_dir).joinpath(*parts[1:]).with_suffix(".py")


@dataclass
class SiteResult:
    site: Site
    file: str  # relative to the package's parent, e.g. sglang/srt/speculative/spec_utils.py
    count: int  # anchor occurrences in the installed file; -1: no such file

    @property
    def status(self) -> str:
        return {-1: "no such file", 0: "anchor absent", 1: "applied"}.get(self.count, f"anchor found {self.count} "
                                                                                    "times")

    @property
    def applied(self) -> bool:
        return self.count == 1


@dataclass
class Application:
    """A mutant against one installed sglang: which sites applied, and the patched modules."""
    mutant: Mutant
    sites: list[SiteResult]
    modules: dict[str, dict] = field(default_factory=dict)  # name -> origin, rel, sha256, original, patched
    error: str | None = None  # a patched module that does not compile (a catalogue bug)

    @property
    def applicable(self) -> bool:
        return any(s.applied for s in self.sites)

    @property
    def files(self) -> list[str]:
        return sorted({s.file for s in self.sites if s.applied})

    def reason(self) -> str:
        """Why it is not applicable (each site's outcome), or which files it patches."""
        if self.applicable:
            return "patches " + ", ".join(self.files)
        return "; ".join(f"{s.file}: {s.status}" for s in self.sites)


def apply(mutant: Mutant, pkg_dir: Path) -> Application:
    """Apply ``mutant`` to the sources under ``pkg_dir`` (an installed ``sglang`` folder), in memory."""
    pkg_dir = Path(pkg_dir)
    app = Application(mutant, [])
    texts: dict[str, str] = {}
    for site in mutant.sites:
        path = module_file(pkg_dir, site.module)
        rel = str(path.relative_to(pkg_dir.parent))
        if site.module not in texts:
            try:
                texts[site.module] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                app.sites.append(SiteResult(site, rel, -1))
                continue
        original = texts[site.module]
        count = original.count(site.anchor)
        app.sites.append(SiteResult(site, rel, count))
        if count != 1:
            continue
        mod = app.modules.setdefault(site.module, {
            "origin": str(path), "rel": rel, "sha256": hashlib.sha256(original.encode("utf-8")).hexdigest(),
            "original": original, "patched": original})
        if mod["patched"].count(site.anchor) != 1:
            app.error = f"{rel}: sites of {mutant.id} overlap (anchor no longer unique after an earlier site)"
            continue
        mod["patched"] = mod["patched"].replace(site.anchor, site.replacement, 1)
    for name, mod in app.modules.items():
        if mod["patched"] == mod["original"]:
            app.error = app.error or f"{mod['rel']}: the replacement leaves the module unchanged"
        try:
            compile(mod["patched"], mod["origin"], "exec", dont_inherit=True)
        except SyntaxError as exc:
            app.error = app.error or f"{mod['rel']}:{exc.lineno}: patched module does not compile: {exc.msg}"
    return app


def hook_payload(app: Application) -> dict:
    """What mutant_hook/sitecustomize.py reads from $MTPMATRIX_MUTANT."""
    return {"mutant": app.mutant.id,
            "modules": {name: {"origin": m["origin"], "sha256": m["sha256"], "source": m["patched"]}
                        for name, m in app.modules.items()}}


def diff(app: Application) -> str:
    out = []
    for m in app.modules.values():
        out += difflib.unified_diff(m["original"].splitlines(keepends=True), m["patched"].splitlines(keepends=True),
                                    fromfile=f"a/{m['rel']}", tofile=f"b/{m['rel']}", n=2)
    return "".join(out)


# --------------------------------------------------------------------------------------------- the installed sglang
def find_sglang(python: str = sys.executable) -> Path | None:
    from mtpmatrix.tiers.processes import sglang_package_dir

    return sglang_package_dir(python)


def sglang_version(pkg_dir: Path) -> str | None:
    """From sglang/_version.py (setuptools-scm), else the dist-info folder next to the package; no import."""
    pkg_dir = Path(pkg_dir)
    for name in ("_version.py", "version.py"):
        try:
            m = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                          (pkg_dir / name).read_text(encoding="utf-8"), re.M)
        except OSError:
            continue
        if m:
            return m.group(1)
    for d in sorted(pkg_dir.parent.glob("sglang-*.dist-info")):
        return d.name[len("sglang-"):-len(".dist-info")]
    return None
