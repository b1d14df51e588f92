"""Mutants and how they are applied: a mutant is a list of sites, each *module + anchor text + replacement*.

Every site whose anchor occurs exactly once in the installed release is applied (several sites carry one bug across
releases, e.g. the non-overlap worker of 0.5.13 and the spec-v2 worker of 0.5.17). No site applies: the mutant is
"n.a." for this release and never counts as killed.

The installed files are never edited: the patched text goes into ``<out>/<id>/mutant.json`` (``hook_payload``) and
the hook in ``mutant_hook/sitecustomize.py`` (first on PYTHONPATH for the pytest run and every server process it
launches) serves it in place of the module. Every process that loads a patched module says so in its log (``MARK``).
The mutants themselves are data: ``mtpmatrix.faults.catalogue``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core.smoke_servers import WITNESS_SERVERS  # defined once, in smoke

HOOK_DIR = Path(__file__).resolve().parent / "mutant_hook"
ENV_MUTANT = "MTPMATRIX_MUTANT"  # read by mutant_hook/sitecustomize.py
MARK = "mtpmatrix-mutant:"  # the hook's log lines


# The smoke servers a mutant's suite launches unless its catalogue entry says otherwise: the witness pair, whose
# drafter needs the right hidden state, KV layer, positions, tree parent and its own request's rows to draft right.
DEFAULT_SERVERS = WITNESS_SERVERS

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
    # the request surface (mtpmatrix.tiers.surface): what only requests other than greedy ignore_eos ones reach
    "stops": "EOS / stop tokens inside a verify step's accepted run",
    "logprobs": "output logprobs of speculatively accepted tokens",
    "mixed-sampling": "per-request sampling parameters in a mixed verify batch",
    "sampled-bonus": "the bonus token of a fully accepted sampled verify step",
    "sched-modes": "code only the non-overlap scheduler or the eager draft path runs",
    "sampling-feats": "sampling features (logit_bias, penalties) applied in verify",
    "seeded": "the verify coins of seeded (sampling_seed) requests",
    "hidden-states": "hidden states returned for speculatively accepted tokens",
    # the request shapes and the long-and-tight family (issue #38)
    "grammar": "grammar masks of the verify nodes (structured output)",
    "stop-regex": "stop_regex matched inside a verify step's accepted run",
    "ids-logprob": "token_ids_logprob of speculatively accepted tokens",
    "streaming": "stream events of a verify step's accepted run",
    "swa-verify": "sliding-window attention of the verify nodes past the window",
    "kv-release": "release of a finished request's speculatively over-allocated KV",
    "context-limit": "draft slots reserved against the context limit",
    "draft-view": "the drafter's frozen-KV view (length, position) of a request with a cached prefix",
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
    # releases (x.y.z) whose Frozen-KV MTP path lacks the modelled code: the mutant is n.a. there by design, said
    # by ``na_why`` (no anchor, or an anchor on a path Frozen-KV MTP does not take there, or takes so that the edit
    # changes nothing: an equivalent mutant would "survive" and prove nothing)
    na_on: tuple[str, ...] = ()
    na_why: str = ""


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
        return {-1: "no such file", 0: "anchor absent", 1: "applied"}.get(
            self.count, f"anchor found {self.count} times"
        )

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
    by_design: str | None = None  # n.a. on this release by design (Mutant.na_on), and why: nothing is patched

    @property
    def applicable(self) -> bool:
        return self.by_design is None and any(s.applied for s in self.sites)

    @property
    def files(self) -> list[str]:
        return sorted({s.file for s in self.sites if s.applied})

    def reason(self) -> str:
        """Why it is not applicable (each site's outcome), or which files it patches."""
        if self.applicable:
            return "patches " + ", ".join(self.files)
        if self.by_design:
            return self.by_design
        return "; ".join(f"{s.file}: {s.status}" for s in self.sites)


def apply(mutant: Mutant, pkg_dir: Path) -> Application:
    """Apply ``mutant`` to the sources under ``pkg_dir`` (an installed ``sglang`` folder), in memory."""
    pkg_dir = Path(pkg_dir)
    version = sglang_version(pkg_dir)
    release = re.match(r"\d+\.\d+\.\d+", version or "")
    if release and release.group(0) in mutant.na_on:
        return Application(mutant, [], by_design=f"n.a. by design on sglang {version}: {mutant.na_why}")
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
        mod = app.modules.setdefault(
            site.module,
            {
                "origin": str(path),
                "rel": rel,
                "sha256": hashlib.sha256(original.encode("utf-8")).hexdigest(),
                "original": original,
                "patched": original,
            },
        )
        if mod["patched"].count(site.anchor) != 1:
            app.error = f"{rel}: sites of {mutant.id} overlap (anchor no longer unique after an earlier site)"
            continue
        mod["patched"] = mod["patched"].replace(site.anchor, site.replacement, 1)
    for mod in app.modules.values():
        if mod["patched"] == mod["original"]:
            app.error = app.error or f"{mod['rel']}: the replacement leaves the module unchanged"
        try:
            compile(mod["patched"], mod["origin"], "exec", dont_inherit=True)
        except SyntaxError as exc:
            app.error = app.error or f"{mod['rel']}:{exc.lineno}: patched module does not compile: {exc.msg}"
    return app


def hook_payload(app: Application) -> dict:
    """What mutant_hook/sitecustomize.py reads from $MTPMATRIX_MUTANT."""
    return {
        "mutant": app.mutant.id,
        "modules": {
            name: {"origin": m["origin"], "sha256": m["sha256"], "source": m["patched"]}
            for name, m in app.modules.items()
        },
    }


def diff(app: Application) -> str:
    out = []
    for m in app.modules.values():
        out += difflib.unified_diff(
            m["original"].splitlines(keepends=True),
            m["patched"].splitlines(keepends=True),
            fromfile=f"a/{m['rel']}",
            tofile=f"b/{m['rel']}",
            n=2,
        )
    return "".join(out)


# --------------------------------------------------------------------------------------------- the installed sglang
def find_sglang(python: str = sys.executable) -> Path | None:
    from mtpmatrix.serving.processes import sglang_package_dir

    return sglang_package_dir(python)


def sglang_version(pkg_dir: Path) -> str | None:
    """From sglang/_version.py (setuptools-scm), else the dist-info folder next to the package; no import."""
    pkg_dir = Path(pkg_dir)
    for name in ("_version.py", "version.py"):
        try:
            m = re.search(
                r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                (pkg_dir / name).read_text(encoding="utf-8"),
                re.M,
            )
        except OSError:
            continue
        if m:
            return m.group(1)
    for d in sorted(pkg_dir.parent.glob("sglang-*.dist-info")):
        return d.name[len("sglang-") : -len(".dist-info")]
    return None
