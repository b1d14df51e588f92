"""The results contract, defined once: which files a row folder holds, what each tier records under which metric
names, and the per-question record layout. The tiers write it (through the pytest plugin's ``mtp_results_dir``
fixture), ``matrix.run_row`` and ``python -m mtpmatrix import`` file it under ``results/<run>/<row>/``, and the report
reads exactly these names (no aliases).

Row folder ``results/<run-id>/<row-id>/``::

    row.json                 the row record: row, overrides, pytest_args, knobs, selection, versions, install,
                             per-tier verdicts (store.RunStore)
    tiers.json               what the pytest plugin wrote: per-tier verdicts, one record per check, and the
                             session's selection (args, MTPMATRIX_* knobs, collected checks: mtpmatrix.core.expected)
    junit.xml, pytest.log    pytest's own output
    install.log, freeze.txt, check.txt     the row's install (nox rows; absent for imported GPU-box runs)
    env.txt                  the GPU box's description (imported runs only)
    invocation.json          what tools/gpu_box.sh was asked: its invocation id (tiers.json carries it as
                             MTPMATRIX_INVOCATION_ID), start time, pytest args and MTPMATRIX_* knobs (imported runs)
    server-<name>.log        one log per sglang server a tier launched (smoke and gsm8k)
    smoke-launch-budget.json the smoke suite's wall time against one cold launch of the same run (launch_plan.launch_budget)
    gsm8k/<case>.jsonl       one JSON line per GSM8K question of one case (RECORD_FIELDS)

Each record's fields and their types are mtpmatrix.core.record_types (a check record, ``tiers.json`` ->
tiers.<tier>.checks[], is its ``CheckRecord``); ``metrics`` holds the check's ``record_property`` values, and the ones
the report shows in their own columns are named below. Paths in metrics are relative to the row folder, so a row
folder can move (GPU box -> results store) without rewriting it.
"""

from __future__ import annotations

from collections.abc import Iterable

# row.json / tiers.json layout version (2: this module's names, row-relative paths, known-upstream; 3: the session's
# selection and the 'partial' tier verdict, mtpmatrix.core.expected)
SCHEMA = 3

# --- files of a row folder ------------------------------------------------------------------------------------------
ROW_FILE = "row.json"
TIERS_FILE = "tiers.json"
JUNIT_FILE = "junit.xml"
PYTEST_LOG = "pytest.log"
INSTALL_LOG = "install.log"
FREEZE_FILE = "freeze.txt"
CHECK_FILE = "check.txt"
ENV_FILE = "env.txt"
INVOCATION_FILE = "invocation.json"
GSM8K_DIR = "gsm8k"
SERVER_LOG_PREFIX = "server-"
SMOKE_LAUNCH_BUDGET_FILE = "smoke-launch-budget.json"
# what the plugin records in tiers.json of how its session ran, beside its checks, and row.json carries over: pytest's
# plugins, options and conftests (tiers/session/provenance.py), the build (serving/environment.build), the GPUs' names,
# the session's own id (one session proves one row)
SESSION_FIELDS = ("pytest", "build", "gpu_names", "session_id")

# --- a candidate's identity, as the suite's environment carries it (runner/candidate.py) -----------------------------
DRAFT_PHASE_ENV = "MTPMATRIX_DRAFT_PHASE"  # the draft phase a candidate declares (pairs/witness/phase.py reads it)
PATCH_ENV = "MTPMATRIX_PATCH"  # a patch the fault-injection hook serves at import (tools/gpu_box.sh PATCH=FILE)
PATCH_SHA256_ENV = "MTPMATRIX_PATCH_SHA256"  # its sha256: the hook serves nothing when the file's differs

# --- tiers and verdict words ----------------------------------------------------------------------------------------
TIERS = ("contract", "reference", "smoke", "gsm8k")
GPU_TIERS = ("smoke", "gsm8k")  # what a release needs a GPU for; contract and reference are the CPU checks
KNOWN_UPSTREAM = "known-upstream"  # a tier whose only failures are listed in known_upstream.json
PARTIAL = "partial"  # a tier where nothing failed but its expected set (mtpmatrix.core.expected) did not all run
UNPROVEN = "not-proven"  # a tier or row whose records cannot show what they claim (mtpmatrix.core.evidence.judge)
# Verdict words, worst first: a row or tier takes the worst of its parts ('pending' = unfinished, so it outranks
# any finished good news; 'skipped' only when nothing ran).
VERDICTS = ("failed", "error", "pending", UNPROVEN, PARTIAL, KNOWN_UPSTREAM, "passed", "skipped")
# What counts against a release: a check or tier that failed, or errored before it could say (check outcomes use
# the same two words).
FAILING = ("failed", "error")


def comma_list(text: str | None) -> list[str]:
    """A comma-separated knob or flag (tiers, server names, tags, mutant ids, pair names) as names, in order, blanks
    dropped. Validating the names is the caller's business (each knows what it may accept)."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def parse_tiers(text: str | None) -> list[str]:
    """``--tiers`` / ``MTPMATRIX_TIERS`` / a row's ``# tiers:`` as tier names (validated by each caller)."""
    return comma_list(text)


def short_check_id(check_id: str) -> str:
    """A check record's id without its file: ``tests/tiers/test_gsm8k.py::test_accuracy[E4B-topk1]`` ->
    ``test_accuracy[E4B-topk1]``."""
    return check_id.split("::", 1)[-1]


def check_param(check_id: str) -> str | None:
    """What a check ran on: its parameter (``E4B-topk1``, a smoke server's name), None for an unparametrised check."""
    short = short_check_id(check_id)
    return short[short.index("[") + 1 : -1] if short.endswith("]") and "[" in short else None


def server_log(name: str) -> str:
    """File name (in the row folder) of the log of the sglang server called ``name``."""
    return f"{SERVER_LOG_PREFIX}{name}.log"


def gsm8k_records(case: str) -> str:
    """Row-relative path of the per-question records of GSM8K case ``case`` (e.g. ``E4B-topk1``)."""
    return f"{GSM8K_DIR}/{case}.jsonl"


# --- metric names (record_property keys) ----------------------------------------------------------------------------
SCORE = "score"  # GSM8K: fraction of questions answered correctly
WILSON95 = "wilson95"  # GSM8K: [low, high], the 95% Wilson score interval of SCORE
NUM_EXAMPLES = "num_examples"  # GSM8K: questions scored
NUM_CORRECT = "num_correct"  # GSM8K: questions answered correctly
THRESHOLD = "threshold"  # GSM8K: the score floor of the pair (None: reported, not gated)
GATED = "gated"  # GSM8K: whether THRESHOLD was applied
RECORDS = "records"  # GSM8K: row-relative path of the per-question records (gsm8k_records(case))
OUTPUT_TOKENS_PER_S = "output_tokens_per_s"  # GSM8K: output tokens per second over the whole run
ACCEPT_LENGTH = "avg_spec_accept_length"  # smoke/gsm8k: sglang's /server_info accept length (tokens per verify step)
MIN_ACCEPT_LENGTH = "min_accept_length"  # the floor ACCEPT_LENGTH was gated on
SPEEDUP = "speedup"  # GSM8K: OUTPUT_TOKENS_PER_S with MTP / without it, same pair (needs a no-MTP case)
VS_NOMTP = "vs_nomtp"  # GSM8K: {"delta", "lost", "gained", "mcnemar_p"}: per question against the no-MTP case
SERVER_LOG = "server_log"  # smoke/gsm8k: row-relative path of the server's log
LAUNCH_SECONDS = "launch_seconds"  # smoke/gsm8k: launch until ready
SERVED = "served"  # gsm8k --server-url: {"url", "pair", "topk", "model_path", "draft_model_path", "tp_size",
#                    "version"}: what the running server turned out to be

# --- per-question GSM8K records (gsm8k/<case>.jsonl, one JSON object a line, in question order) ---------------------
RECORD_FIELDS = (
    "index",  # position among the evaluated questions (sglang's idx); the key for per-question comparisons
    "line",  # position in test.jsonl (num_shots + index)
    "prompt_sha",  # first 16 hex digits of the prompt's SHA-256: two runs asked the same thing
    "question",
    "response",
    "extracted",
    "invalid",
    "gold",
    "correct",  # bool: extracted == gold
    "completion_tokens",
    "latency_s",
    "finish_reason",
    "spec_verify_ct",
    "spec_accept_length",
    "error",
)


def worst(verdicts: Iterable[str | None]) -> str:
    """The worst verdict among ``verdicts``; 'skipped' only when nothing ran."""
    present = [v for v in verdicts if v]
    for v in VERDICTS:
        if v in present:
            return v
    return "skipped"
