"""Fault injection: small source mutations of the installed sglang's MTP path, and whether the smoke tier notices.

    python -m mtpmatrix mutants                      baseline + every applicable mutant (needs a GPU)
    python -m mtpmatrix mutants --list | --check     the catalogue against the installed sglang (CPU, seconds)
    python -m mtpmatrix mutants --mutants ID,ID --out DIR --timeout S --budget S

Each mutant is one deliberate bug of the kind the smoke tier exists to catch (the drafter seeded with the wrong
hidden state, the wrong frozen-KV layer, shifted RoPE positions, the wrong tree parent, rows of different requests
mixed, lossy verification, a wrong accept-length counter, the draft CUDA graph never captured). A mutant is a list
of sites, each *module + anchor text + replacement*; every site whose anchor occurs exactly once in the installed
release is applied (several sites carry one bug across releases, e.g. the non-overlap worker of 0.5.13 and the
spec-v2 worker of 0.5.17). No site applies: the mutant is "n.a." for this release and never counts as killed.

The installed files are never edited: the patched text goes into ``<out>/<id>/mutant.json`` and the hook in
``mutant_hook/sitecustomize.py`` (first on PYTHONPATH for the pytest run and every server process it launches)
serves it in place of the module. Every process that loads a patched module says so in its log; a mutant whose
servers never loaded it is an error, not a result.

The runner runs the unpatched smoke suite (the baseline) and one smoke suite per applicable mutant, each in its own
folder, several side by side. A mutant is *killed* when any check of its suite fails, *survived* when all pass. A
failing baseline makes the whole result invalid. Exit status: 0 only when the baseline passes and every applicable
mutant is killed; 1 otherwise; 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.runner.store import atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[3]
HOOK_DIR = Path(__file__).resolve().parent / "mutant_hook"
from mtpmatrix.tiers.smoke import WITNESS_SERVERS  # noqa: E402 - the one definition of the witness servers

ENV_MUTANT = "MTPMATRIX_MUTANT"  # read by mutant_hook/sitecustomize.py
MARK = "mtpmatrix-mutant:"  # the hook's log lines
SUITE = "tests/tiers/test_smoke.py"

# The smoke servers a mutant's suite launches unless its catalogue entry says otherwise: the witness pair, whose
# drafter needs the right hidden state, KV layer, positions, tree parent and its own request's rows to draft right.
DEFAULT_SERVERS = WITNESS_SERVERS
TOPK1, TOPK3 = (WITNESS_SERVERS[0],), (WITNESS_SERVERS[1],)

# Concurrency is bounded by CPU, not GPU memory: a server launch is mostly CPU-bound Triton compilation, processor
# loading and CUDA-graph capture. Measured on one H200 box with 16 cores (sglang 0.5.17, tiny pairs, warm caches):
# 5 servers side by side launched in 52-77 s and a suite of 5 took 100-150 s; two suites of four (8 servers) took
# 200-240 s; 3-4 suites side by side (12-16 servers) went CPU-bound (launches up to 381 s) and timed out. So one
# concurrently launching server per CORES_PER_SERVER cores (5 on 16 cores), and never more than the GPU-memory
# rule of the smoke tier allows (smoke.MIB_PER_EXTRA_SERVER).
CORES_PER_SERVER = 3
DEFAULT_TIMEOUT = 480  # seconds per suite; a smoke server gets 420 s to become ready
MIN_SUITE_SECONDS = 90  # with --budget: a suite is not started with less left (a warm one takes ~90 s)
SERVER_PGID = re.compile(r"^# pid (\d+) \(process group (\d+)\)", re.M)  # SglangServer's log header
READY_LINE = "# mtpmatrix: ready after"  # SglangServer's log line once a server answers

CATEGORIES = {
    "handoff": "hidden-state handoff to the drafter",
    "kv-binding": "frozen-KV layer binding",
    "positions": "RoPE positions of draft steps",
    "tree-parent": "topk tree parents",
    "batch-expansion": "batch expansion at topk > 1",
    "lossy-verify": "lossy verification",
    "accounting": "accept-length accounting",
    "cuda-graph": "draft CUDA-graph capture",
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
                              "server's avg_spec_accept_length)"),
    Mutant(
        "accept-count-server", "accounting",
        "the scheduler's forward count behind avg_spec_accept_length counted twice (server-side average halves)",
        (Site(_MRP, "self.spec_num_forward_ct += bs\n", "self.spec_num_forward_ct += 2 * bs\n"),),
        servers=TOPK1, expect="test_spec_metrics (avg_spec_accept_length inconsistent with per-request numbers)"),
    Mutant(
        "draft-cuda-graph-skipped", "cuda-graph",
        "the Frozen-KV draft CUDA graph is never captured (the draft loop silently runs eagerly)",
        (Site(_W2, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return"),
         Site(_W1, 'logger.info("Capture Frozen-KV MTP draft cuda graph begin.")', "return")),
        servers=TOPK1, expect="test_cuda_graphs_captured (no draft capture line)"),
)


def catalogue_by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}


def select(ids: str | None, catalogue: tuple[Mutant, ...] = CATALOGUE) -> list[Mutant]:
    """The mutants named in ``ids`` ("a,b"), in catalogue order; all when empty. MutantsError on unknown ids."""
    if not ids or not ids.strip():
        return list(catalogue)
    wanted = [t.strip() for t in ids.split(",") if t.strip()]
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
    from mtpmatrix.tiers.server import sglang_package_dir

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


# --------------------------------------------------------------------------------------------- verdicts
@dataclass
class SuiteOutcome:
    status: str  # passed | failed | error | timeout
    failed: list[dict] = field(default_factory=list)  # {id, outcome, kind, message}
    passed: int = 0
    reason: str = ""


def _first_line(text: str, limit: int = 200) -> str:
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def judge_suite(tiers: dict | None, exitstatus: int | None = None, timed_out: bool = False) -> SuiteOutcome:
    """A smoke suite's outcome from its tiers.json (None: pytest left none)."""
    if timed_out:
        return SuiteOutcome("timeout", reason="suite timed out (no verdict: not counted as killed)")
    if tiers is None:
        return SuiteOutcome("error", reason=f"pytest exited {exitstatus} without tiers.json (see pytest.log)")
    smoke = (tiers.get("tiers") or {}).get("smoke") or {}
    checks = smoke.get("checks") or []
    failed = []
    for c in checks:
        if c.get("outcome") not in ("failed", "error"):
            continue
        f = c.get("failure") or {}
        failed.append({"id": c.get("id", "?"), "outcome": c["outcome"], "kind": f.get("kind", "?"),
                       "message": _first_line(f.get("message", ""))})
    passed = sum(c.get("outcome") == "passed" for c in checks)
    if failed:
        if all(f["kind"] == "harness" for f in failed):  # this project's own bug: never a verdict on sglang
            return SuiteOutcome("error", failed, passed, "only harness failures: " + failed[0]["message"])
        return SuiteOutcome("failed", failed, passed)
    if not passed:
        return SuiteOutcome("error", [], 0, "no smoke check ran: " + _first_line(smoke.get("reason") or
                                                                                 "smoke tier missing"))
    if smoke.get("verdict") in ("error", "failed"):  # e.g. pytest stopped early after some checks passed
        return SuiteOutcome("error", [], passed, _first_line(smoke.get("reason") or "smoke tier did not finish"))
    return SuiteOutcome("passed", [], passed)


def hook_evidence(folder: Path, mutant_id: str) -> tuple[bool, str | None]:
    """(a server process loaded the patched module, the first 'NOT applied' line if any) from the server logs."""
    served, refused = False, None
    for log in sorted(Path(folder).rglob("server-*.log")):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.startswith(MARK):
                continue
            if f"{MARK} {mutant_id} serves patched " in line:
                served = True
            elif "NOT applied" in line and refused is None:
                refused = line.strip()
    return served, refused


def mutant_status(outcome: SuiteOutcome, served: bool, refused: str | None) -> tuple[str, str]:
    """(killed | survived | error, reason) of an applicable mutant's suite."""
    if refused:
        return "error", refused
    if outcome.status in ("timeout", "error"):
        return "error", outcome.reason
    if not served:
        return "error", "no server process loaded the patched module (no hook line in the server logs)"
    if outcome.status == "failed":
        return "killed", ""
    return "survived", f"all {outcome.passed} checks passed"


def short_check(check_id: str) -> str:
    return check_id.rsplit("::", 1)[-1]


def killed_by(checks: list[dict], limit: int = 2) -> str:
    names = [f"{short_check(c['id'])} ({c['kind']})" for c in checks]
    if len(names) > limit:
        names = names[:limit] + [f"+{len(names) - limit} more"]
    return ", ".join(names)


def overall(baseline: dict | None, mutants: list[dict]) -> tuple[str, int]:
    """(verdict, exit status): 0 only when the baseline passed and every applicable mutant was killed."""
    if baseline is None or baseline.get("status") != "passed":
        return "invalid", 1
    applicable = [m for m in mutants if m["status"] != "n.a."]
    if not applicable:
        return "nothing-applicable", 1
    if all(m["status"] == "killed" for m in applicable):
        return "all-killed", 0
    if any(m["status"] == "survived" for m in applicable):
        return "survivors", 1
    return "incomplete", 1


# --------------------------------------------------------------------------------------------- the table
def render_table(rows: list[dict], models_width: int = 58) -> str:
    """rows: {id, models, status, killed_by, seconds} -> fixed-width text."""
    head = ("mutant", "what it models", "status", "killed by", "s")
    body = []
    for r in rows:
        models = r.get("models", "")
        if len(models) > models_width:
            models = models[:models_width - 3] + "..."
        secs = r.get("seconds")
        body.append((r["id"], models, r["status"], r.get("killed_by") or "-",
                     "-" if secs is None else f"{secs:.0f}"))
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) if body else len(head[i]) for i in range(5)]
    fmt = lambda cols: "  ".join(c.ljust(w) if i < 4 else c.rjust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(cols, widths))).rstrip()
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *(fmt(b) for b in body)])


# --------------------------------------------------------------------------------------------- scheduling
def server_cap(cpus: int | None, free_mib: int | None, requested: int | None = None) -> int:
    """Smoke servers allowed to launch at once: ``requested`` when given, else one per CORES_PER_SERVER cores,
    capped by the smoke tier's GPU-memory rule when free memory is known."""
    if requested is not None:
        return max(1, requested)
    cap = max(1, (cpus or 1) // CORES_PER_SERVER)
    if free_mib is not None:
        from mtpmatrix.tiers.smoke import MIB_PER_EXTRA_SERVER

        cap = min(cap, 1 + free_mib // MIB_PER_EXTRA_SERVER)
    return max(1, cap)


@dataclass
class Suite:
    name: str  # "baseline" or the mutant id
    servers: tuple[str, ...]
    folder: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    started: float | None = None
    deadline: float | None = None
    interrupted_at: float | None = None
    timed_out: bool = False
    seconds: float | None = None
    exitstatus: int | None = None
    log_fh: object = None

    @property
    def n(self) -> int:
        return len(self.servers)


def pytest_command(suite: Suite, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "--tiers", "smoke",
            "--mtp-results", str(suite.folder / "tiers.json")]


def suite_env(base: dict, servers: tuple[str, ...], folder: Path, tiny_dir: Path, payload: Path | None,
              cache_dir: Path | None) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k != ENV_MUTANT}
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])])
    env.update({"MTPMATRIX_SMOKE_SERVERS": ",".join(servers), "MTPMATRIX_SMOKE_PARALLEL": str(len(servers)),
                "MTPMATRIX_TINY_DIR": str(tiny_dir), "MTPMATRIX_RESULTS": str(folder / "tiers.json"),
                "PYTHONUNBUFFERED": "1"})
    env.pop("MTPMATRIX_SMOKE_SWAP_DRAFTERS", None)
    if cache_dir is not None:  # else each library's per-user default, which every suite shares anyway
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
    if payload is not None:
        env[ENV_MUTANT] = str(payload)
    return env


def stop_leftover_servers(folder: Path) -> list[int]:
    """Kill the process groups of servers this suite started that are still alive: the groups named in their
    log headers, while a live member is still an sglang (or multiprocessing spawn) process. SglangServer.stop()
    normally leaves nothing; this is for a suite that had to be killed."""
    from mtpmatrix.tiers.server import _group_members

    killed = []
    for log in Path(folder).rglob("server-*.log"):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for m in SERVER_PGID.finditer(text):
            pgid = int(m.group(2))
            cmdlines = []
            for pid in _group_members(pgid):
                try:
                    cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    pass
            if any("sglang" in c or "spawn_main" in c for c in cmdlines):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
                except (ProcessLookupError, PermissionError):
                    pass
    return killed


class Scheduler:
    """Runs suites side by side under a cap on concurrently launched servers, the first one (the baseline) alone
    until one of its servers is ready (tiny pairs built once, Triton/inductor caches warm for the rest)."""

    def __init__(self, suites: list[Suite], cap: int, timeout: float, *, budget: float | None = None,
                 warmup: bool = True, command=pytest_command, log=print, on_done=None, poll: float = 1.0,
                 grace: float = 45.0, heartbeat: float = 60.0, min_suite: float = MIN_SUITE_SECONDS):
        self.queue = list(suites)
        self.suites = list(suites)
        self.cap, self.timeout, self.budget, self.warmup = cap, timeout, budget, warmup
        self.command, self.log, self.on_done = command, log, on_done
        self.poll, self.grace, self.heartbeat, self.min_suite = poll, grace, heartbeat, min_suite
        self.running: list[Suite] = []
        self.t0 = time.monotonic()
        self.stop_new = False  # set when the baseline failed, or on Ctrl-C
        self.not_run: list[Suite] = []

    def _busy(self) -> int:
        return sum(s.n for s in self.running)

    def _first_ready(self) -> bool:
        first = self.suites[0]
        if first.proc is None:
            return False
        if first.seconds is not None:
            return True
        for log in first.folder.rglob("server-*.log"):
            try:
                if READY_LINE in log.read_text(errors="replace"):
                    return True
            except OSError:
                pass
        return False

    def _may_start(self, suite: Suite) -> bool:
        if self.stop_new:
            return False
        if self.warmup and suite is not self.suites[0] and not self._first_ready():
            return False
        return not self.running or self._busy() + suite.n <= self.cap

    def _start(self, suite: Suite) -> None:
        suite.folder.mkdir(parents=True, exist_ok=True)
        suite.log_fh = open(suite.folder / "pytest.log", "ab", buffering=0)
        suite.started = time.monotonic()
        limit = self.timeout
        if self.budget is not None:
            limit = min(limit, self.budget - (suite.started - self.t0))
        suite.deadline = suite.started + max(1.0, limit)
        suite.proc = subprocess.Popen(self.command(suite), cwd=REPO, env=suite.env, stdin=subprocess.DEVNULL,
                                      stdout=suite.log_fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.running.append(suite)
        self.log(f"[mutants] start {suite.name} ({', '.join(suite.servers)}; {self._busy()}/{self.cap} server "
                 f"slots busy; {self._elapsed():.0f} s elapsed)")

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _interrupt(self, suite: Suite) -> None:
        if suite.interrupted_at is None and suite.proc is not None and suite.proc.poll() is None:
            suite.interrupted_at = time.monotonic()
            try:
                os.kill(suite.proc.pid, signal.SIGINT)  # pytest stops its servers and still writes tiers.json
            except ProcessLookupError:
                pass

    def _reap(self, suite: Suite) -> bool:
        """True once ``suite`` has finished (normally, or killed after its deadline and grace)."""
        now = time.monotonic()
        if suite.proc.poll() is None:
            if now >= suite.deadline and suite.interrupted_at is None:
                suite.timed_out = True
                self.log(f"[mutants] timeout {suite.name} after {now - suite.started:.0f} s: interrupting")
                self._interrupt(suite)
            if suite.interrupted_at is not None and now - suite.interrupted_at >= self.grace:
                try:
                    os.killpg(suite.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                suite.proc.wait()
            else:
                return False
        suite.exitstatus = suite.proc.returncode
        suite.seconds = round(now - suite.started, 1)
        suite.log_fh.close()
        stop_leftover_servers(suite.folder)
        return True

    def run(self) -> None:
        last_beat = time.monotonic()
        try:
            while self.queue or self.running:
                if self.budget is not None and self.queue and self.budget - self._elapsed() < self.min_suite:
                    self.log(f"[mutants] less than {self.min_suite:.0f} s of the {self.budget:.0f} s budget left: "
                             f"{len(self.queue)} suite(s) not run")
                    self.not_run += self.queue
                    self.queue.clear()
                while self.queue and self._may_start(self.queue[0]):
                    self._start(self.queue.pop(0))
                if self.stop_new and self.queue:
                    self.not_run += self.queue
                    self.queue.clear()
                for suite in list(self.running):
                    if self._reap(suite):
                        self.running.remove(suite)
                        if self.on_done is not None:
                            self.on_done(suite)
                if time.monotonic() - last_beat >= self.heartbeat and self.running:
                    last_beat = time.monotonic()
                    self.log(f"[mutants] {self._elapsed():.0f} s: running {', '.join(s.name for s in self.running)}"
                             f"; {len(self.queue)} queued")
                if self.queue or self.running:
                    time.sleep(self.poll)
        except KeyboardInterrupt:
            self.log("[mutants] interrupted: stopping the running suites")
            self.stop_new = True
            self.not_run += self.queue
            self.queue.clear()
            for suite in self.running:
                self._interrupt(suite)
            while self.running:
                for suite in list(self.running):
                    if self._reap(suite):
                        self.running.remove(suite)
                        if self.on_done is not None:
                            self.on_done(suite)
                time.sleep(self.poll)
            raise


# --------------------------------------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true",
                   help="only show the catalogue against the installed sglang (applicable / n.a.); no GPU")
    p.add_argument("--check", action="store_true",
                   help="like --list, and check that every patched module compiles; exit 1 if one does not")
    p.add_argument("--mutants", metavar="ID,ID", help="run only these mutants (default: all)")
    p.add_argument("--out", type=Path, help="output folder (default: results/mutants-<UTC timestamp>)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per suite (default %(default)s)")
    p.add_argument("--budget", type=float, help="seconds for the whole run: suites not started by then are "
                                                "recorded as not run, running ones are interrupted")
    p.add_argument("--servers", metavar="NAME,NAME",
                   help="smoke servers for the baseline and every mutant (default: each mutant's own)")
    p.add_argument("--max-servers", type=int, help="servers launching at once (default: one per "
                                                   f"{CORES_PER_SERVER} cores, capped by free GPU memory)")
    p.add_argument("--cache-dir", type=Path, help="shared TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR parent "
                                                  "(default: the libraries' per-user defaults)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="start every suite at once instead of after the baseline's first server is ready")
    p.add_argument("--sglang-dir", type=Path, help="an sglang package folder to read instead of the importable one "
                                                   "(--list/--check only)")


def _servers(ns, mutant: Mutant) -> tuple[str, ...]:
    if ns.servers:
        return tuple(s.strip() for s in ns.servers.split(",") if s.strip())
    return mutant.servers


def check_servers(names, known) -> None:
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        raise MutantsError(f"smoke server(s) {', '.join(unknown)} not in this checkout's smoke tier "
                           f"(smoke.SMOKE_SERVERS: {', '.join(known)}); pass --servers")


def _listing(apps: list[Application], pkg_dir: Path, version: str | None, compile_check: bool) -> int:
    print(f"sglang {version or '(version unknown)'} at {pkg_dir}")
    width = max(len(a.mutant.id) for a in apps)
    bad = 0
    for a in apps:
        status = "applicable" if a.applicable else "n.a."
        if compile_check and a.error:
            status, bad = "BROKEN", bad + 1
        print(f"{a.mutant.id:<{width}}  {a.mutant.category:<15}  {status:<10}  "
              f"{a.error if compile_check and a.error else a.reason()}")
    n_app = sum(a.applicable for a in apps)
    tail = f"{n_app} applicable, {len(apps) - n_app} n.a."
    if compile_check:
        tail += f"; {'every patched module compiles' if not bad else f'{bad} patched module(s) do not compile'}"
    print(tail)
    return 1 if bad else 0


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run(ns: argparse.Namespace, *, catalogue: tuple[Mutant, ...] = CATALOGUE, pkg_dir: Path | None = None,
        command=pytest_command, known_servers=None, gpu_check: bool = True, cpus: int | None = None,
        free_mib: int | None = None, poll: float = 1.0, log=print) -> int:
    """The ``mutants`` subcommand. The keywords exist for tests: another catalogue, an sglang folder, a stand-in
    for the pytest command, the smoke server names, no GPU probe, a CPU count."""
    try:
        return _run(ns, catalogue=catalogue, pkg_dir=pkg_dir, command=command, known_servers=known_servers,
                    gpu_check=gpu_check, cpus=cpus, free_mib=free_mib, poll=poll, log=log)
    except MutantsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(ns, *, catalogue, pkg_dir, command, known_servers, gpu_check, cpus, free_mib, poll, log) -> int:
    chosen = select(ns.mutants, catalogue)
    if ns.timeout <= 0 or (ns.budget is not None and ns.budget <= 0):
        raise MutantsError("--timeout and --budget must be positive")
    if ns.max_servers is not None and ns.max_servers < 1:
        raise MutantsError("--max-servers must be >= 1")
    listing = ns.list or ns.check
    if ns.sglang_dir is not None and not listing:
        raise MutantsError("--sglang-dir is for --list/--check; a run uses the importable sglang")
    pkg_dir = ns.sglang_dir or pkg_dir or find_sglang()
    if pkg_dir is None or not Path(pkg_dir).is_dir():
        raise MutantsError(f"no sglang here ({ns.sglang_dir or sys.executable}): run inside a row venv "
                           "(nox -s mutants -- --row ROW) or with PYTHONPATH naming an sglang bundle")
    pkg_dir = Path(pkg_dir)
    version = sglang_version(pkg_dir)
    apps = [apply(m, pkg_dir) for m in chosen]
    if listing:
        return _listing(apps, pkg_dir, version, compile_check=ns.check)

    broken = [a for a in apps if a.applicable and a.error]
    if broken:
        raise MutantsError(f"mutant {broken[0].mutant.id}: {broken[0].error}")
    if not any(a.applicable for a in apps):
        _listing(apps, pkg_dir, version, compile_check=False)
        log("NOTHING-APPLICABLE: no selected mutant applies to this sglang release; nothing to run")
        return 1
    if known_servers is None:
        from mtpmatrix.tiers.smoke import SMOKE_SERVERS

        known_servers = [s.name for s in SMOKE_SERVERS]
    applicable = [a for a in apps if a.applicable]
    union: list[str] = []
    for a in applicable:
        union += [s for s in _servers(ns, a.mutant) if s not in union]
    check_servers(union, known_servers)
    if gpu_check:
        from mtpmatrix.tiers.environment import gpu_missing

        why = gpu_missing(1)
        if why:
            raise MutantsError(f"the mutant suites need a GPU: {why} (--list/--check need none)")
    if free_mib is None and gpu_check:
        from mtpmatrix.tiers.environment import gpu_free_mib

        free_mib = gpu_free_mib()
    cap = server_cap(cpus if cpus is not None else os.cpu_count(), free_mib, ns.max_servers)

    from mtpmatrix.runner.store import new_run_id

    out = Path(ns.out or Path("results") / f"mutants-{new_run_id()}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    tiny = Path(os.environ.get("MTPMATRIX_TINY_DIR") or out / "tiny").resolve()
    cache = ns.cache_dir.resolve() if ns.cache_dir else None
    base_env = dict(os.environ)

    suites = [Suite("baseline", tuple(union), out / "baseline", {})]
    suites[0].env = suite_env(base_env, suites[0].servers, suites[0].folder, tiny, None, cache)
    by_suite: dict[str, Application] = {}
    for a in applicable:
        folder = out / a.mutant.id
        folder.mkdir(parents=True, exist_ok=True)
        payload = folder / "mutant.json"
        atomic_write_json(payload, hook_payload(a))
        atomic_write_text(folder / "patch.diff", diff(a))
        s = Suite(a.mutant.id, _servers(ns, a.mutant), folder, {})
        s.env = suite_env(base_env, s.servers, folder, tiny, payload, cache)
        suites.append(s)
        by_suite[s.name] = a

    record = {
        "kind": "mutants", "schema": 1, "sglang": {"version": version, "path": str(pkg_dir)},
        "started": _now(), "finished": None, "seconds": None, "host": {"cpus": cpus or os.cpu_count()},
        "max_servers": cap, "timeout": ns.timeout, "budget": ns.budget, "out": str(out),
        "baseline": {"status": "pending", "servers": list(suites[0].servers), "dir": str(suites[0].folder)},
        "mutants": [_mutant_entry(a, _servers(ns, a.mutant), out, version) for a in apps],
        "verdict": "pending",
    }
    entries = {m["id"]: m for m in record["mutants"]}
    t0 = time.monotonic()
    log(f"[mutants] sglang {version} at {pkg_dir}; {len(applicable)} applicable of {len(apps)}; baseline on "
        f"{', '.join(union)}; up to {cap} servers at once; results in {out}")

    def save() -> None:
        record["seconds"] = round(time.monotonic() - t0, 1)
        atomic_write_json(out / "mutants.json", record)

    sched: Scheduler | None = None

    def done(suite: Suite) -> None:
        tiers = _read_tiers(suite.folder / "tiers.json")
        outcome = judge_suite(tiers, suite.exitstatus, suite.timed_out)
        if suite.name == "baseline":
            entry = record["baseline"]
            entry.update(status=outcome.status, seconds=suite.seconds, checks=outcome.failed, passed=outcome.passed,
                         reason=outcome.reason)
            line = outcome.status + (f" ({outcome.reason})" if outcome.reason else "") + (
                f" - {killed_by(outcome.failed)}" if outcome.failed else "")
            if outcome.status != "passed":
                sched.stop_new = True
                line += "; result invalid, no further suites started"
        else:
            entry = entries[suite.name]
            served, refused = hook_evidence(suite.folder, suite.name)
            status, reason = mutant_status(outcome, served, refused)
            entry.update(status=status, reason=reason, seconds=suite.seconds, checks=outcome.failed,
                         killed_by=killed_by(outcome.failed) if status == "killed" else "", passed=outcome.passed)
            line = status + (f" by {entry['killed_by']}" if status == "killed" else f" ({reason})" if reason else "")
        log(f"[mutants] done  {suite.name}: {line} ({suite.seconds:.0f} s)")
        save()

    save()
    sched = Scheduler(suites, cap, ns.timeout, budget=ns.budget, warmup=ns.warmup, command=command, log=log,
                      on_done=done, poll=poll)
    interrupted = False

    def _terminate(signum, frame):  # a wrapper's SIGTERM stops the suites like Ctrl-C does
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread
        previous = None
    try:
        sched.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for s in sched.not_run:
        if s.name == "baseline":
            record["baseline"].update(status="not-run")
        else:
            entries[s.name].update(status="not-run", reason="not started (baseline failed, budget spent or "
                                                            "interrupted)")
    verdict, rc = overall(record["baseline"], record["mutants"])
    record.update(verdict="interrupted" if interrupted else verdict, finished=_now())
    record["exit"] = 130 if interrupted else rc
    save()
    rows = [{"id": "baseline", "models": f"unpatched sglang {version}", "status": record["baseline"]["status"],
             "killed_by": "", "seconds": record["baseline"].get("seconds")}] + record["mutants"]
    log("")
    log(render_table(rows))
    log("")
    log(_verdict_line(verdict, record))
    log(f"results: {out / 'mutants.json'}")
    return record["exit"]


def _verdict_line(verdict: str, record: dict) -> str:
    ms = record["mutants"]
    counts = {s: sum(m["status"] == s for m in ms) for s in ("killed", "survived", "error", "not-run", "n.a.")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if verdict == "invalid":
        b = record["baseline"]
        return (f"RESULT INVALID: the unpatched baseline did not pass ({b['status']}"
                f"{': ' + b['reason'] if b.get('reason') else ''}"
                f"{'; ' + killed_by(b.get('checks') or []) if b.get('checks') else ''}); {summary}")
    return f"{verdict.upper()}: {summary}"


def _mutant_entry(a: Application, servers: tuple[str, ...], out: Path, version: str | None) -> dict:
    m = a.mutant
    return {
        "id": m.id, "category": m.category, "models": m.models, "expect": m.expect, "sglang": version,
        "status": "pending" if a.applicable else "n.a.", "reason": "" if a.applicable else a.reason(),
        "files": a.files, "sites": [{"module": s.site.module, "file": s.file, "anchor": s.site.anchor,
                                     "status": s.status} for s in a.sites],
        "servers": list(servers), "checks": [], "killed_by": "", "seconds": None,
        "dir": str(out / m.id) if a.applicable else None,
    }


def _read_tiers(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------- nox: a row's venv
def row_venv_commands(row, venv: Path, constraints: Path) -> list[list[str]]:
    """uv venv (when missing) + the matrix's one install command for ``row`` into ``venv``."""
    import shutil

    from mtpmatrix.runner import matrix

    uv = shutil.which("uv")
    if uv is None:
        raise MutantsError("uv is not on PATH: pip install uv (https://docs.astral.sh/uv/)")
    cmds = []
    if not matrix.venv_python(venv).exists():
        cmds.append([uv, "venv", "--python", row.python, str(venv)])
    cmds.append(matrix.install_command(row, venv, constraints, None))
    return cmds


def split_row_arg(posargs: list[str]) -> tuple[str | None, list[str]]:
    """``--row ROW`` (or ``--row=ROW``) out of nox posargs; the rest goes to ``python -m mtpmatrix mutants``."""
    rest, row = [], None
    it = iter(posargs)
    for a in it:
        if a == "--row":
            row = next(it, None)
            if row is None:
                raise MutantsError("--row needs a row id")
        elif a.startswith("--row="):
            row = a.split("=", 1)[1]
        else:
            rest.append(a)
    return row, rest
