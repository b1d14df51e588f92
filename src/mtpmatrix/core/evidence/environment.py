"""The settings a row's session ran with, judged: its MTPMATRIX_* knobs (one that changes what is tested makes the
tiers it changes "not proven"; KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED lists the others, and a smoke or pair knob set
to its default is none), the SGLANG_* / SGL_* variables of its environment (any), the variables torch, CUDA, NCCL or
Triton read (any not in TORCH_ENV_THAT_ONLY_PLACES_OR_WATCHES), and what the invocation asked (its pytest args, its
knobs) against what the session recorded."""

from __future__ import annotations

from mtpmatrix.core import schema, settings
from mtpmatrix.core.record_types import Problem, RowRecord, problem
from mtpmatrix.core.schema import TIERS
from mtpmatrix.core.smoke_servers import smoke_options

# Knobs that say where things go, how fast they run or which tiers run (a tier that does not run is 'partial' by
# itself), never what a check tests.
KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED = frozenset(
    {
        "MTPMATRIX_RUN_ID",
        "MTPMATRIX_RESULTS",
        "MTPMATRIX_RESULTS_ROOT",
        "MTPMATRIX_ROW",
        "MTPMATRIX_TINY_DIR",
        "MTPMATRIX_SIDE_BY_SIDE",
        "MTPMATRIX_PRECOMPILE",
        "MTPMATRIX_SUITE_PROCESS",
        "MTPMATRIX_IMPORTED_DIR",
        "MTPMATRIX_INVOCATION_ID",
        "MTPMATRIX_TIERS",
        "MTPMATRIX_MAX_GPUS",
        "MTPMATRIX_FORCE_NO_GPU",
        "MTPMATRIX_OFFLINE",
        "MTPMATRIX_GSM8K_DIR",  # the data is checked against its checksum wherever it comes from
        "MTPMATRIX_GSM8K_READY_TIMEOUT",
        "MTPMATRIX_GSM8K_BASELINE",  # adds no-MTP cases beside the seed cases
        "MTPMATRIX_SMOKE_PARALLEL",
        "MTPMATRIX_PROBE_DIR",
        "MTPMATRIX_PROBE_LIMIT",
        "MTPMATRIX_VERBOSE",  # the row's whole pytest output on the console, not only in pytest.log
    }
)


# The variables torch, CUDA, NCCL or Triton read (expected.torch_env, recorded since the review of issue #39) that only
# place or watch things, each with why; any other one a session ran with makes it not proven. Taken from what the
# projects document: torch's "CUDA Environment Variables" and "Debugging Environment Variables" pages (which list
# CUDA_VISIBLE_DEVICES, PYTORCH_NVML_BASED_CUDA_CHECK, TORCH_SHOW_CPP_STACKTRACES, TORCH_CPP_LOG_LEVEL, TORCH_LOGS
# beside the ones that do change numbers: NVIDIA_TF32_OVERRIDE, TORCH_ALLOW_TF32_CUBLAS_OVERRIDE,
# CUBLAS_WORKSPACE_CONFIG, CUDA_LAUNCH_BLOCKING, PYTORCH_CUDA_ALLOC_CONF, ...), its ProcessGroupNCCL page
# (TORCH_NCCL_*: the flight recorder's dumps) and NCCL's "Environment Variables" (NCCL_DEBUG*, NCCL_SOCKET_IFNAME,
# NCCL_TOPO_DUMP_FILE beside NCCL_ALGO, NCCL_PROTO, NCCL_P2P_*, ... which choose how a reduction runs).
TORCH_ENV_THAT_ONLY_PLACES_OR_WATCHES = {
    "CUDA_VISIBLE_DEVICES": "which GPUs the session sees: their count and names are recorded and judged",
    "CUDA_DEVICE_ORDER": "the order the GPUs are numbered in",
    "CUDA_HOME": "where the CUDA toolkit is (kernels built at run time); the torch build that ran is recorded",
    "CUDA_PATH": "where the CUDA toolkit is, as CUDA_HOME",
    "CUDA_CACHE_PATH": "where CUDA keeps the kernels it compiled from PTX",
    "CUDA_CACHE_MAXSIZE": "how large that cache may grow",
    "CUDA_VERSION": "the label NVIDIA's CUDA container images set for their toolkit; not a variable CUDA reads",
    "NCCL_VERSION": "the label NVIDIA's container images set for the NCCL they ship (the lent H200's: 2.28.3-1); not "
    "one of the variables NCCL reads",
    "TORCH_HOME": "where torch.hub caches downloads (the suite downloads nothing through it)",
    "TORCH_EXTENSIONS_DIR": "where torch builds extensions at run time",
    "TORCHINDUCTOR_CACHE_DIR": "where torch.compile caches its kernels (the suite's fault-injection runs set it)",
    "TRITON_CACHE_DIR": "where Triton caches its compiled kernels (the suite's fault-injection runs set it)",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "how torch asks whether CUDA is there (NVML instead of the runtime)",
    "TORCH_SHOW_CPP_STACKTRACES": "how much torch prints of a C++ error",
    "TORCH_CPP_LOG_LEVEL": "how much torch's C++ side logs",
    "TORCH_LOGS": "what torch's Python side logs",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "how many collectives the flight recorder keeps for a dump",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "whether the flight recorder dumps on a timeout",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "where the flight recorder dumps",
    "NCCL_DEBUG": "how much NCCL logs",
    "NCCL_DEBUG_SUBSYS": "which parts of NCCL log",
    "NCCL_DEBUG_FILE": "where NCCL logs",
    "NCCL_SOCKET_IFNAME": "which network interface NCCL's bootstrap uses (one box: the GPUs talk over NVLink or PCIe)",
    "NCCL_TOPO_DUMP_FILE": "where NCCL writes the topology it found",
}


# TORCH_CUDA_ARCH_LIST says which GPU architectures kernels built at run time are compiled for (torch's extensions,
# flashinfer's JIT). Naming only the architecture of the GPUs the session ran on, it builds what detecting them would
# (the lent H200's image sets 9.0a); another list builds other kernels. The architecture per GPU name (NVIDIA's CUDA
# GPU compute capability table); a GPU not listed here leaves the variable unjudged: not proven.
GPU_ARCH = {"H100": "9.0", "H200": "9.0", "H800": "9.0", "GH200": "9.0", "A100": "8.0", "A800": "8.0", "L40S": "8.9"}


def arch_list_is_the_gpus(value: str, gpu_names: list[str]) -> bool:
    """Whether TORCH_CUDA_ARCH_LIST=``value`` names only the architecture of every GPU in ``gpu_names`` (an entry may
    carry the architecture-specific suffix 'a' and '+PTX')."""
    archs = {
        next((a for n, a in GPU_ARCH.items() if n in (t.split("-")[0] for t in str(g).split())), None)
        for g in gpu_names
    }
    if not gpu_names or None in archs or len(archs) != 1:
        return False
    entries = [e.removesuffix("+PTX") for e in value.replace(";", " ").split()]
    return bool(entries) and all(e.removesuffix("a") in archs for e in entries)


def _pair_knob(name: str) -> str | None:
    """The pair a MTPMATRIX_<PAIR>_<WHAT> knob overrides, None when it is no pair knob."""
    for pair in settings.PAIRS:
        if any(name == settings.pair_env_key(pair, what) for what in ("TARGET", "ASSISTANT", "TP", "THRESHOLD")):
            return pair
    return None


def knob_effect(name: str, value: str) -> tuple[str, ...]:
    """The tiers whose checks ``name=value`` changes (empty: none)."""
    if name in KNOBS_THAT_DO_NOT_CHANGE_WHAT_IS_TESTED or not name.startswith("MTPMATRIX_"):
        return ()
    if name.startswith("MTPMATRIX_SMOKE_"):
        try:
            same = smoke_options({name: value}) == smoke_options({})
        except ValueError:
            same = False
        return () if same else ("smoke",)
    pair = _pair_knob(name)
    if pair is not None:
        try:
            same = settings.resolve_pair(pair, {name: value}) == settings.resolve_pair(pair, {})
        except (KeyError, ValueError):
            same = False
        return () if same else ("gsm8k",)
    if name.startswith("MTPMATRIX_GSM8K_") or name == "MTPMATRIX_SERVER_PAIR":
        return ("gsm8k",)
    return TIERS  # fault injection, or a knob this judge does not know: it may change anything


def candidate_knobs(record: RowRecord, knobs: dict[str, str]) -> set[str]:
    """The knobs of ``knobs`` that are the record's candidate (runner/candidate.py), not settings: the patch the
    fault-injection hook served at import (tools/gpu_box.sh PATCH=) when its sha256 is the candidate's, and the
    draft phase the candidate declares. On any other record they are knobs this judge does not know."""
    cand = record.get("candidate") if isinstance(record.get("candidate"), dict) else None
    if cand is None:
        return set()
    out = set()
    if cand.get("kind") == "patch" and cand.get("sha256") and knobs.get(schema.PATCH_SHA256_ENV) == cand["sha256"]:
        out |= {schema.PATCH_ENV, schema.PATCH_SHA256_ENV}
    try:
        declared = int(knobs.get(schema.DRAFT_PHASE_ENV) or "")
    except ValueError:
        declared = None
    if declared is not None and declared == cand.get("draft_phase"):
        out.add(schema.DRAFT_PHASE_ENV)
    return out


def judge(record: RowRecord) -> list[Problem]:
    """Every problem with the settings ``record``'s session ran with."""
    out = []
    sel = record.get("selection") or {}
    asked = record.get("knobs") or {}
    ran = sel.get("knobs") or {}
    identity = candidate_knobs(record, asked) & candidate_knobs(record, ran) if asked else candidate_knobs(record, ran)
    for name, value in sorted({**asked, **ran}.items()):
        if name in identity:
            continue
        for tier in knob_effect(name, value or ""):
            out.append(problem(tier, f"{tier} ran with {name}={value}: not the qualification suite"))
    changing = {
        k for k in set(asked) | set(ran) if k not in identity and knob_effect(k, (asked.get(k) or ran.get(k) or ""))
    }
    differ = sorted(k for k in changing if asked.get(k) != ran.get(k))
    if record.get("selection") is not None and "knobs" in record and differ:
        out.append(problem(None, f"the session ran with other knobs than it was asked ({', '.join(differ)})"))
    for name, value in sorted((sel.get("sglang_env") or {}).items()):  # recorded since the review of issue #39
        out.append(
            problem(
                None, f"the session ran with {name}={value}: sglang reads it, the qualification suite does not set it"
            )
        )
    for name, value in sorted((sel.get("torch_env") or {}).items()):
        if name == "TORCH_CUDA_ARCH_LIST" and arch_list_is_the_gpus(str(value), list(record.get("gpu_names") or [])):
            continue
        if name not in TORCH_ENV_THAT_ONLY_PLACES_OR_WATCHES:
            out.append(
                problem(
                    None,
                    f"the session ran with {name}={value}: torch, CUDA, NCCL or Triton read it, and it may change the "
                    "numbers or the path served",
                )
            )
    args = [str(a) for a in sel.get("args") or []]
    asked_args = record.get("pytest_args") or []
    it = iter(args)
    if record.get("selection") is not None and not all(any(a == b for b in it) for a in asked_args):
        out.append(problem(None, f"the session's pytest args do not hold what it was asked ({' '.join(asked_args)})"))
    return out
