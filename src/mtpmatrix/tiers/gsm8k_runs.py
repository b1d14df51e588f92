"""The GSM8K tier's runs (tests/tiers/test_gsm8k.py holds its checks, gsm8k_eval.py the scoring): which cases run,
where their weights are, and one sglang server per case, launched and scored once (``Gsm8kRuns``), whatever number
of checks read it.

For every pair in settings.DEFAULT_PAIRS and every topk in settings.TOPKS, one server runs GSM8K 5-shot (the exact
prompts/scoring of sglang's run_eval gsm8k, see mtpmatrix.tiers.gsm8k_eval). With ``--server-url`` the cases are the
running servers instead (one per server, named from what its /server_info says it serves: mtpmatrix.serving.served),
and nothing is launched.

Env knobs:
  MTPMATRIX_GSM8K_PAIRS=E4B,E2B             pairs to run (default: settings.DEFAULT_PAIRS)
  MTPMATRIX_GSM8K_BASELINE=1                also run each pair without MTP (and record a paired McNemar comparison)
  MTPMATRIX_GSM8K_NUM_EXAMPLES=N            default settings.GSM8K_NUM_EXAMPLES
  MTPMATRIX_<PAIR>_TARGET/_ASSISTANT/_TP/_THRESHOLD   see settings.resolve_pair
  MTPMATRIX_GSM8K_READY_TIMEOUT=S           server readiness deadline (default 1200 s)
  MTPMATRIX_GSM8K_PAIR=tiny:<target_dir>:<assistant_dir>
      END-TO-END PROOF MODE: run this tier on a tiny local pair (e.g. the smoke tier's) instead of the real ones.
      Cases are named "tiny-e2e-proof-*"; the GSM8K score is reported, NOT gated (threshold None), and the
      acceptance check only says speculative decoding ran (settings.NO_DRAFT_ACCEPT_LENGTH).
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mtpmatrix.core import schema, settings
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.core.schema import comma_list
from mtpmatrix.serving import client
from mtpmatrix.tiers import gsm8k_eval

TINY_PREFIX = "tiny-e2e-proof"
# Char-level tiny tokenizer: a 5-shot prompt is up to ~2.9k tokens, so the tiny pair gets its full 4096 context.
TINY_ARGS_OVERRIDES = {"--context-length": "4096", "--max-total-tokens": "32768"}


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Case:
    id: str
    pair: str
    target: str
    assistant: str
    tp: int
    topk: int | None  # None = no-MTP baseline
    threshold: float | None
    extra_args: tuple[str, ...] = ()
    tiny: bool = False
    target_env: str = ""
    assistant_env: str = ""
    url: str | None = None  # a running server (--server-url): nothing is launched
    served: dict | None = None  # what that server turned out to be (schema.SERVED)

    @property
    def baseline_id(self) -> str:
        """The id of this pair's no-MTP case."""
        return self.id.rsplit("-", 1)[0] + "-nomtp"


def served_cases(servers) -> list[Case]:
    """One case per --server-url (served.Served), gated like the launched case of the same pair (unknown pair: not
    gated)."""
    out = []
    for s in servers:
        thr = settings.resolve_pair(s.pair).threshold if s.pair else None
        out.append(
            Case(
                s.case_id,
                s.pair or "served",
                s.model_path or "",
                s.draft_model_path or "",
                s.tp_size or 1,
                s.topk,
                thr,
                url=s.url,
                served=s.as_metric(),
            )
        )
    return out


def cases(servers=()) -> list[Case]:
    """The running servers' cases, else the launched ones from the env knobs and settings.py. A malformed
    MTPMATRIX_GSM8K_PAIR raises ValueError (one line)."""
    if servers:
        return served_cases(servers)
    baseline = _truthy(os.environ.get("MTPMATRIX_GSM8K_BASELINE"))
    topks: list[int | None] = ([None] if baseline else []) + list(settings.TOPKS)
    tiny = os.environ.get("MTPMATRIX_GSM8K_PAIR", "").strip()
    if tiny:
        kind, _, rest = tiny.partition(":")
        target, _, assistant = rest.partition(":")
        if kind != "tiny" or not target or not assistant:
            raise ValueError(f"MTPMATRIX_GSM8K_PAIR={tiny!r}: expected tiny:<target_dir>:<assistant_dir>")
        return [
            Case(
                settings.gsm8k_case_id(TINY_PREFIX, k),
                "tiny",
                target,
                assistant,
                tp=1,
                topk=k,
                threshold=None,
                tiny=True,
                target_env="MTPMATRIX_GSM8K_PAIR",
                assistant_env="MTPMATRIX_GSM8K_PAIR",
            )
            for k in topks
        ]
    names = comma_list(os.environ.get("MTPMATRIX_GSM8K_PAIRS"))
    out = []
    for name in names or settings.DEFAULT_PAIRS:
        pair = settings.resolve_pair(name)
        key = "MTPMATRIX_" + name.upper().replace("-", "_")
        for k in topks:
            out.append(
                Case(
                    settings.gsm8k_case_id(name, k),
                    name,
                    pair.target,
                    pair.assistant,
                    pair.tp,
                    k,
                    pair.threshold,
                    tuple(pair.extra_args),
                    target_env=f"{key}_TARGET",
                    assistant_env=f"{key}_ASSISTANT",
                )
            )
    return out


# --- weights: local path or Hugging Face cache, never a download ----------------------------------------------
def hub_cache_dirs() -> list[Path]:
    env = os.environ
    dirs = [
        env.get("HF_HUB_CACHE"),
        env.get("HUGGINGFACE_HUB_CACHE"),
        str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None,
        str(Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"),
    ]
    out: list[Path] = []
    for d in dirs:
        if d and Path(d).expanduser() not in out:
            out.append(Path(d).expanduser())
    return out


def _has_weights(d: Path) -> bool:
    return (d / "config.json").is_file() and (
        any(d.glob("*.safetensors")) or (d / "model.safetensors.index.json").is_file() or any(d.glob("*.bin"))
    )


def resolve_weights(ref: str) -> tuple[Path | None, str]:
    """(local folder with config + weights, or None; where it was looked for)."""
    p = Path(ref).expanduser()
    if p.is_dir():
        return (p, "") if _has_weights(p) else (None, f"local dir {p} (it has no config.json + weight files)")
    looked = []
    if ref.count("/") == 1 and not ref.startswith((".", "/", "~")):
        for cache in hub_cache_dirs():
            repo = cache / ("models--" + ref.replace("/", "--"))
            looked.append(str(repo))
            snaps = []
            head = repo / "refs" / "main"
            if head.is_file():
                snaps.append(repo / "snapshots" / head.read_text().strip())
            if (repo / "snapshots").is_dir():
                snaps += sorted((repo / "snapshots").iterdir(), key=lambda s: s.stat().st_mtime, reverse=True)
            for s in snaps:
                if s.is_dir() and _has_weights(s):
                    return s, ""
    where = f"local path {p}" + (f" and HF cache {', '.join(looked)}" if looked else "")
    return None, where


# --- one server per case, collected once ----------------------------------------------------------------------------
@dataclass
class Gsm8kRun:
    case: Case
    skip: str | None = None
    error: BaseException | None = None
    log_path: Path | None = None
    records_path: Path | None = None
    launch_seconds: float | None = None
    info_before: dict | None = None
    info_after: dict | None = None
    result: gsm8k_eval.Gsm8kResult | None = None
    metrics: dict = field(default_factory=dict)


def _override(args: tuple[str, ...], overrides: dict[str, str]) -> tuple[str, ...]:
    out = list(args)
    for flag, value in overrides.items():
        if flag in out:
            out[out.index(flag) + 1] = value
        else:
            out += [flag, value]
    return tuple(out)


def _num_examples() -> int:
    return int(os.environ.get("MTPMATRIX_GSM8K_NUM_EXAMPLES") or settings.GSM8K_NUM_EXAMPLES)


def _score(url: str, lines: list[dict], say, label: str) -> gsm8k_eval.Gsm8kResult:
    return gsm8k_eval.run_gsm8k(
        url,
        num_examples=_num_examples(),
        num_shots=settings.GSM8K_NUM_SHOTS,
        parallel=settings.GSM8K_PARALLEL,
        max_new_tokens=settings.GSM8K_MAX_NEW_TOKENS,
        lines=lines,
        log=say,
        label=label,
        timeout=3600,
    )


def collect_served(case: Case, out_dir: Path, say) -> Gsm8kRun:
    """Score a running server (--server-url); its cache is not flushed: the deployment is not ours to reset."""
    run = Gsm8kRun(case)

    def info(when: str) -> dict:
        try:
            return client.server_info(case.url)
        except (OSError, http.client.HTTPException, client.ClientError) as exc:
            raise CheckFailure(
                "crash", f"{case.url} stopped answering /server_info {when}: {type(exc).__name__}: {exc}"
            ) from exc

    try:
        lines = gsm8k_eval.load_split("test")
        run.records_path = out_dir / schema.gsm8k_records(case.id)
        run.info_before = info("before GSM8K")
        say(f"[gsm8k {case.id}] scoring the running server {case.url} (model {case.target})")
        run.result = _score(case.url, lines, say, f"[gsm8k {case.id}]")
        run.info_after = info("after GSM8K")
        run.result.write_jsonl(run.records_path)
    except Exception as exc:  # kept and re-raised by each check, with its classification
        run.error = exc
    return run


def collect(case: Case, out_dir: Path, say) -> Gsm8kRun:
    """Launch the case's server (or score its running one), run GSM8K, keep what it did; skips and failures are
    kept on the run for every check to report."""
    from mtpmatrix.serving.environment import gpu_count
    from mtpmatrix.serving.server import SglangServer

    if case.url:
        return collect_served(case, out_dir, say)
    run = Gsm8kRun(case)
    n_gpu = gpu_count()
    if n_gpu < case.tp:
        run.skip = f"{case.pair} needs TP {case.tp}, this machine has {n_gpu} GPU{'' if n_gpu == 1 else 's'}" + (
            "" if case.tiny else f" (MTPMATRIX_{case.pair.upper().replace('-', '_')}_TP overrides)"
        )
        return run
    env = {}
    paths = {}
    for role, ref, var in (("target", case.target, case.target_env), ("assistant", case.assistant, case.assistant_env)):
        if role == "assistant" and case.topk is None:
            continue
        var = var or "MTPMATRIX_" + case.pair.upper().replace("-", "_") + "_" + role.upper()
        found, looked = resolve_weights(ref)
        if found is None:
            run.skip = f"{case.pair} {role} weights {ref} not found: looked for {looked}; set {var} to a local path"
            return run
        paths[role] = found
        if not Path(ref).expanduser().is_dir():
            env["HF_HUB_OFFLINE"] = "1"  # resolved from the HF cache: never let the server reach for the hub
    try:  # the data first: a missing dataset must not cost a server launch
        lines = gsm8k_eval.load_split("test")
    except gsm8k_eval.DataError as exc:
        run.error = exc
        return run
    base = _override(settings.COMMON_ARGS, TINY_ARGS_OVERRIDES) if case.tiny else settings.COMMON_ARGS
    args = settings.server_args(
        paths["target"], assistant=paths.get("assistant"), topk=case.topk, tp=case.tp, base=base, extra=case.extra_args
    )
    run.log_path = out_dir / schema.server_log(f"gsm8k-{case.id}")
    run.records_path = out_dir / schema.gsm8k_records(case.id)
    server = SglangServer(
        args,
        log_path=run.log_path,
        env=env,
        name=f"gsm8k {case.id}",
        ready_timeout=float(os.environ.get("MTPMATRIX_GSM8K_READY_TIMEOUT") or 1200),
        progress=say,
    )
    try:
        with server:
            run.launch_seconds = server.ready_seconds
            run.info_before = server.server_info()
            server.flush_cache()
            run.result = _score(server.base_url, lines, say, f"[gsm8k {case.id}]")
            server.check_alive("running GSM8K")
            run.info_after = server.server_info()
        run.result.write_jsonl(run.records_path)
    except Exception as exc:  # kept and re-raised by each check, with its classification
        run.error = exc
    return run


class Gsm8kRuns:
    """Every case's run in one session, each collected the first time a check asks for it (cases in order: a
    pair's no-MTP baseline is collected before its MTP cases, so they can be compared with it)."""

    def __init__(self, out_dir: Path, say: Callable[[str], None], collect=collect):
        self.out_dir = out_dir
        self.say = say
        self._collect = collect
        self._runs: dict[str, Gsm8kRun] = {}

    def get(self, case: Case) -> Gsm8kRun:
        if case.id not in self._runs:
            self._runs[case.id] = self._collect(case, self.out_dir, self.say)
        return self._runs[case.id]

    def baseline_of(self, case: Case) -> Gsm8kRun | None:
        """The same pair's no-MTP run, if this session has collected it."""
        return self._runs.get(case.baseline_id)
