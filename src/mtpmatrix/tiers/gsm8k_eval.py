"""GSM8K 5-shot, exactly as sglang's ``run_eval(eval_name="gsm8k", api="completion", num_shots=5)`` scores it: the
data, the prompts, the requests to one server and the score. Which servers it runs on is gsm8k_runs.py's.

What sglang does (``sglang/test/simple_eval_gsm8k.py`` in 0.5.13, ``simple_eval_mixed_prefix_gsm8k.GSM8KEval`` in
0.5.17 and 0.5.23; the code is the same in all three):

* data: the openai/grade-school-math **test** split only (``test.jsonl``, 1319 lines; lines starting with ``#``
  skipped). The train split is never used.
* few-shot prefix: the FIRST ``num_shots`` lines of test.jsonl, in file order, each as
  ``"Question: {question}\\nAnswer: {answer}"`` followed by ``"\\n\\n"``.
* evaluated questions: test lines ``[num_shots : num_shots + num_examples]`` (capped silently at the end of the
  file), so few-shot examples never leak into the evaluation; prompt = prefix + ``"Question: {question}\\nAnswer:"``.
* request: the prompt as raw text (completion API, no chat template), temperature 0.0, top_p 1.0,
  stop ``["Question", "Assistant:", "<|separator|>"]``, max tokens from the caller (run_eval's default is 2048; this
  suite uses settings.GSM8K_MAX_NEW_TOKENS). Here the same prompt and sampling parameters go to sglang's native
  POST /generate (what run_eval's ``api="generate"`` sampler sends).
* answer: commas removed, the LAST match of ``-?\\d+\\.?\\d*``, ``ast.literal_eval``'d; no number (or an unparsable
  one) is INVALID = -9999999. Gold is extracted from the reference answer the same way.
* score: mean of ``extracted == gold`` over all evaluated questions; a failed request counts as the response ""
  (INVALID, so wrong).

Where the test split comes from, first hit wins; every source is held to the one SHA-256 of its decompressed bytes
(``data_sha256()``), so a score is always on the same 1319 questions and a mismatch is one error, never a quietly
different data set:

1. a folder the caller names (``data_dir``), else ``$MTPMATRIX_GSM8K_DIR``: a user's own ``test.jsonl`` (a
   folder without one falls through: which source answers cannot change the bytes);
2. the copy shipped in the package, ``gsm8k_data/test.jsonl.gz`` beside this module (MIT, its LICENSE beside it),
   read in memory; ``data_file()``, for code that wants a plain file, decompresses it once into the cache below;
3. the cache, ``$XDG_CACHE_HOME/mtpmatrix/gsm8k`` (default ``~/.cache/mtpmatrix/gsm8k``), then, unless offline
   (``offline=True``, ``MTPMATRIX_OFFLINE`` or ``HF_HUB_OFFLINE``), a download from openai/grade-school-math,
   checked before it is used or cached.

The shipped copy is rebuilt, byte for byte, with ``PYTHONPATH=src python3 tools/pack_gsm8k.py test.jsonl``, which
prints the checksum.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtpmatrix.core import settings, stats
from mtpmatrix.core.atomic import atomic_write_bytes, atomic_write_text
from mtpmatrix.serving import client

INVALID = -9999999
STOP = ["Question", "Assistant:", "<|separator|>"]
TEMPERATURE = 0.0
TOP_P = 1.0
SPLITS = ("test",)  # sglang scores the test split only: the train split is neither shipped nor read
URLS = {
    s: f"https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/{s}.jsonl"
    for s in SPLITS
}
SHIPPED_DIR = Path(__file__).with_name("gsm8k_data")  # {split}.jsonl.gz and the data's LICENSE (MIT, OpenAI)
_NUMBER = re.compile(r"-?\d+\.?\d*")


class DataError(RuntimeError):
    """GSM8K data missing, unreachable, or not the expected file."""


# --- sglang's functions, mirrored ----------------------------------------------------------------------------
def get_one_example(lines: list[dict], i: int, include_answer: bool) -> str:
    ret = f"Question: {lines[i]['question']}\nAnswer:"
    if include_answer:
        ret += f" {lines[i]['answer']}"
    return ret


def get_few_shot_examples(lines: list[dict], k: int) -> str:
    return "".join(get_one_example(lines, i, True) + "\n\n" for i in range(k))


def get_answer_value(answer_str: str):
    """The last number in ``answer_str`` (commas dropped), or INVALID."""
    answer_str = answer_str.replace(",", "")
    numbers = _NUMBER.findall(answer_str)
    if len(numbers) < 1:
        return INVALID
    try:
        return ast.literal_eval(numbers[-1])
    except (SyntaxError, ValueError):
        return INVALID


def is_correct(extracted, gold) -> bool:
    return extracted == gold


# --- data -------------------------------------------------------------------------------------------------------
def is_offline(offline: bool | None = None, env: dict | None = None) -> bool:
    if offline is not None:
        return offline
    env = os.environ if env is None else env
    return any(
        env.get(k, "").strip().lower() in ("1", "true", "yes", "on") for k in ("MTPMATRIX_OFFLINE", "HF_HUB_OFFLINE")
    )


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mtpmatrix" / "gsm8k"


def data_sha256() -> str:
    """SHA-256 of the (decompressed) test.jsonl every GSM8K score here is computed on. No other bytes are ever
    used, whatever the source, so this one value names the data set in a record."""
    return settings.GSM8K_SHA256["test"]


def shipped_file(split: str = "test") -> Path:
    return SHIPPED_DIR / f"{split}.jsonl.gz"


def pack(data: bytes) -> bytes:
    """gzip ``data`` reproducibly (tools/pack_gsm8k.py writes the shipped copy with it): mtime 0 and no file name in
    the header, so packing the same bytes again gives the same file (deflate itself is zlib's: the checksum is taken
    of the decompressed bytes, which no zlib changes)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def _known(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown GSM8K split {split!r}; known: {', '.join(SPLITS)} (the one sglang scores)")


def _checked(data: bytes, split: str, what: str, fix: str) -> bytes:
    got = hashlib.sha256(data).hexdigest()
    if got != settings.GSM8K_SHA256[split]:
        raise DataError(
            f"{what} has SHA-256 {got}, expected {settings.GSM8K_SHA256[split]} (not the openai/grade-school-math "
            f"{split} split; {fix})"
        )
    return data


def _user_file(split: str, data_dir: str | Path | None) -> Path | None:
    """The argument's folder, else $MTPMATRIX_GSM8K_DIR, when it holds the split. One without it falls through to
    the shipped copy: every source must hash the same, so which one answers changes nothing."""
    d = data_dir or os.environ.get("MTPMATRIX_GSM8K_DIR")
    p = Path(d) / f"{split}.jsonl" if d else None
    return p if p is not None and p.is_file() else None


def _cache_file(split: str, cache_dir: str | Path | None) -> Path:
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / f"{split}.jsonl"


def _write_cache(path: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise DataError(
            f"could not write GSM8K {path.name} to {path}: {exc} (set XDG_CACHE_HOME to a writable "
            f"folder, or MTPMATRIX_GSM8K_DIR to one holding the file)"
        ) from exc


def _download(split: str, timeout: float = 60.0) -> bytes:
    """The split as upstream serves it, unchecked: data_bytes verifies it before anything uses or caches it."""
    try:
        with urllib.request.urlopen(URLS[split], timeout=timeout) as resp:
            return resp.read()  # a few MB at most
    except OSError as exc:
        raise DataError(f"could not download GSM8K {split}.jsonl from {URLS[split]}: {exc}") from exc


def data_bytes(
    split: str = "test",
    data_dir: str | Path | None = None,
    *,
    offline: bool | None = None,
    cache_dir: str | Path | None = None,
) -> bytes:
    """The split's bytes, verified, from the first source in the module docstring's lookup order."""
    _known(split)
    looked = []
    if (user := _user_file(split, data_dir)) is not None:
        return _checked(user.read_bytes(), split, str(user), "fix the file or unset MTPMATRIX_GSM8K_DIR")
    if data_dir or os.environ.get("MTPMATRIX_GSM8K_DIR"):
        looked.append(str(Path(data_dir or os.environ["MTPMATRIX_GSM8K_DIR"]) / f"{split}.jsonl"))
    shipped = shipped_file(split)
    if shipped.is_file():
        # a mismatch here is a broken package, not a different data set: fail rather than fetch around it
        return _checked(
            gzip.decompress(shipped.read_bytes()),
            split,
            f"{shipped} (decompressed)",
            "regenerate it with tools/pack_gsm8k.py",
        )
    looked.append(str(shipped))
    cached = _cache_file(split, cache_dir)
    if cached.is_file():
        data = cached.read_bytes()
        if hashlib.sha256(data).hexdigest() == settings.GSM8K_SHA256[split]:
            return data
        looked.append(f"{cached} (SHA-256 mismatch, replaced by the next download)")  # ours, not a user's file
    else:
        looked.append(str(cached))
    if is_offline(offline):
        raise DataError(
            f"GSM8K {split}.jsonl not found (looked for {', '.join(looked)}) and downloading is off "
            f"(offline / MTPMATRIX_OFFLINE / HF_HUB_OFFLINE); put the file there or set "
            f"MTPMATRIX_GSM8K_DIR"
        )
    data = _checked(
        _download(split), split, f"GSM8K {split}.jsonl downloaded from {URLS[split]}", "refused, nothing cached"
    )
    _write_cache(cached, data)
    return data


def data_file(
    split: str = "test",
    data_dir: str | Path | None = None,
    *,
    offline: bool | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """Path of a verified plain ``{split}.jsonl``, for code that opens the file itself (sglang's run_eval): the
    user's file, else the decompressed copy in the cache, (re)written from data_bytes when it is not that."""
    data = data_bytes(split, data_dir, offline=offline, cache_dir=cache_dir)
    if (user := _user_file(split, data_dir)) is not None:
        return user
    cached = _cache_file(split, cache_dir)
    if not cached.is_file() or cached.read_bytes() != data:
        _write_cache(cached, data)
    return cached


def _parse_jsonl(fh: Iterable[str]) -> list[dict]:
    out = []
    for line in fh:
        if line.startswith("#") or not line.strip():
            continue
        out.append(json.loads(line))
    return out


def read_jsonl(path: str | Path) -> list[dict]:
    """sglang.utils.read_jsonl: one JSON object a line, lines starting with '#' skipped (blank ones too)."""
    with open(path, encoding="utf-8") as fh:
        return _parse_jsonl(fh)


def load_split(
    split: str = "test",
    data_dir: str | Path | None = None,
    *,
    offline: bool | None = None,
    cache_dir: str | Path | None = None,
) -> list[dict]:
    # lines split as a text file splits them (str.splitlines would also break at U+2028 and friends)
    return _parse_jsonl(
        io.TextIOWrapper(
            io.BytesIO(data_bytes(split, data_dir, offline=offline, cache_dir=cache_dir)), encoding="utf-8"
        )
    )


# --- prompts ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    index: int  # position among evaluated questions (sglang's idx)
    line: int  # position in test.jsonl (num_shots + index)
    question: str
    prompt: str
    gold: int | float
    gold_text: str

    @property
    def prompt_sha(self) -> str:
        return hashlib.sha256(self.prompt.encode()).hexdigest()[:16]


def build_questions(
    lines: list[dict], num_examples: int | None = settings.GSM8K_NUM_EXAMPLES, num_shots: int = settings.GSM8K_NUM_SHOTS
) -> list[Question]:
    """Few-shot prefix from lines[:num_shots], questions from lines[num_shots:num_shots+num_examples]."""
    prefix = get_few_shot_examples(lines, num_shots)
    evald = lines[num_shots:]
    if num_examples is not None:
        evald = evald[:num_examples]
    return [
        Question(
            index=i,
            line=num_shots + i,
            question=q["question"],
            prompt=prefix + get_one_example(evald, i, include_answer=False),
            gold=get_answer_value(q["answer"]),
            gold_text=q["answer"],
        )
        for i, q in enumerate(evald)
    ]


def sampling_params(max_new_tokens: int = settings.GSM8K_MAX_NEW_TOKENS) -> dict:
    return {"temperature": TEMPERATURE, "top_p": TOP_P, "max_new_tokens": int(max_new_tokens), "stop": list(STOP)}


# --- running ------------------------------------------------------------------------------------------------------
@dataclass
class Gsm8kResult:
    score: float
    num_examples: int
    num_correct: int
    num_invalid: int  # no number in the response (errors included)
    num_errors: int  # requests that failed (HTTP / transport)
    num_shots: int
    max_new_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    wall_s: float
    wilson95: tuple[float, float]
    spec_accept_length: float | None  # sum(completion_tokens) / sum(spec_verify_ct) from per-request meta_info
    records: list[dict] = field(default_factory=list, repr=False)
    first_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("records")
        d["wilson95"] = list(self.wilson95)
        return d

    @property
    def correct_list(self) -> list[bool]:
        return [bool(r["correct"]) for r in self.records]

    def write_jsonl(self, path: str | Path) -> Path:
        """One JSON record per question (index order), written atomically."""
        path = Path(path)
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records))
        return path


def _jsonable_number(v):
    return None if v == INVALID else v


def score_results(
    questions: list[Question], results: list[client.Result], wall_s: float, num_shots: int, max_new_tokens: int
) -> Gsm8kResult:
    records = []
    for q, r in zip(questions, results):
        text = (r.text or "") if r.ok else ""  # sglang: a failed request is the response ""
        extracted = get_answer_value(text)
        correct = is_correct(extracted, q.gold)
        meta = r.meta_info
        records.append(
            {
                "index": q.index,
                "line": q.line,
                "prompt_sha": q.prompt_sha,
                "question": q.question,
                "response": text,
                "extracted": _jsonable_number(extracted),
                "invalid": extracted == INVALID,
                "gold": _jsonable_number(q.gold),
                "correct": bool(correct),
                "completion_tokens": r.completion_tokens,
                "latency_s": round(r.latency_s, 4),
                "finish_reason": meta.get("finish_reason"),
                "spec_verify_ct": meta.get("spec_verify_ct"),
                "spec_accept_length": meta.get("spec_accept_length"),
                "error": r.error,
            }
        )
    n = len(records)
    k = sum(r["correct"] for r in records)
    summ = client.summarize(results, wall_s)
    return Gsm8kResult(
        score=k / n if n else 0.0,
        num_examples=n,
        num_correct=k,
        num_invalid=sum(r["invalid"] for r in records),
        num_errors=summ.errors,
        num_shots=num_shots,
        max_new_tokens=max_new_tokens,
        output_tokens=summ.completion_tokens,
        output_tokens_per_s=summ.output_tokens_per_s,
        wall_s=round(wall_s, 3),
        wilson95=stats.wilson_interval(k, n),
        spec_accept_length=summ.spec_accept_length,
        records=records,
        first_errors=summ.first_errors,
    )


def run_gsm8k(
    base_url: str,
    num_examples: int = settings.GSM8K_NUM_EXAMPLES,
    num_shots: int = settings.GSM8K_NUM_SHOTS,
    parallel: int = settings.GSM8K_PARALLEL,
    max_new_tokens: int = settings.GSM8K_MAX_NEW_TOKENS,
    *,
    lines: list[dict] | None = None,
    data_dir: str | Path | None = None,
    offline: bool | None = None,
    progress_every: int = 25,
    log: Callable[[str], None] | None = print,
    timeout: float = client.DEFAULT_TIMEOUT,
    label: str = "gsm8k",
) -> Gsm8kResult:
    """Run GSM8K against a live server's /generate; every question's record is kept in the result."""
    if lines is None:
        lines = load_split("test", data_dir, offline=offline)
    questions = build_questions(lines, num_examples, num_shots)
    sp = sampling_params(max_new_tokens)
    payloads = [client.generate_payload(text=q.prompt, sampling_params=sp) for q in questions]
    lock = threading.Lock()
    tally = {"correct": 0, "errors": 0}
    t0 = time.perf_counter()

    def progress(done: int, total: int, res: client.Result) -> None:
        q = questions[res.index]
        with lock:
            tally["correct"] += is_correct(get_answer_value((res.text or "") if res.ok else ""), q.gold)
            tally["errors"] += not res.ok
        if log and progress_every and (done % progress_every == 0 or done == total):
            el = time.perf_counter() - t0
            rate = done / el if el > 0 else 0.0
            eta = f", ~{(total - done) / rate:.0f}s left" if rate and done < total else ""
            log(
                f"{label}: {done}/{total} questions, {rate:.1f}/s, {tally['correct']} correct, "
                f"{tally['errors']} errors, {el:.1f}s{eta}"
            )

    results = client.run_batch(base_url, payloads, parallel=parallel, progress=progress, timeout=timeout)
    wall = time.perf_counter() - t0
    res = score_results(questions, results, wall, num_shots, max_new_tokens)
    if log:
        lo, hi = res.wilson95
        log(
            f"{label}: score {res.score:.3f} ({res.num_correct}/{res.num_examples}, Wilson 95% [{lo:.3f}, {hi:.3f}]), "
            f"{res.num_invalid} invalid, {res.num_errors} errors, {res.output_tokens_per_s:.1f} output tok/s, "
            f"{res.wall_s:.1f}s"
        )
    return res
