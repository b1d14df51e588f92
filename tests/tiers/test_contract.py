"""Contract tier (CPU, needs sglang): the native extensions sglang installs can load against this torch (symbols,
CUDA major), the MTP path imports, sglang reads the tiny pairs' configs, the seed command lines resolve to
FROZEN_KV_MTP with the expected draft shape, and sglang's loader builds both model classes and loads their
safetensors on the CPU; the gsm8k tier's scoring still mirrors this sglang's run_eval.

The ABI checks read ELF files only (seconds, see mtpmatrix.tiers.compat.abi) and run first. sglang is imported once per process
(the ``sglang_chain`` session fixture, ~35-60 s on two cores); everything else is cheap. Failures carry sglang's
first frame: library exceptions are let through (see mtpmatrix.tiers.compat.sglang_compat).
"""

from __future__ import annotations

import importlib
import inspect
import re
import time
from types import SimpleNamespace

import pytest

from mtpmatrix.core import settings
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.tiers import gsm8k_eval
from mtpmatrix.tiers.compat import abi, sglang_loading
from mtpmatrix.tiers.compat import sglang_compat as compat

pytestmark = pytest.mark.contract

ASSISTANT_ARCHS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")
TARGET_MODEL_TYPES = ("gemma4", "gemma4_text")


@pytest.fixture(scope="session")
def sglang_chain():
    """Import the whole MTP chain once; per-step exceptions are kept for test_import to re-raise."""
    t0 = time.monotonic()
    result = compat.import_chain()
    result.total_seconds = round(time.monotonic() - t0, 3)
    return result


@pytest.fixture(scope="session")
def native_abi():
    """The torch-linked native libraries of sglang and its dependencies, resolved against the installed torch."""
    try:
        return abi.check_installed()
    except abi.AbiUnavailable as exc:
        pytest.skip(f"ABI check: {exc}")


def _seed_argv(pair, topk: int) -> list[str]:
    return settings.server_args(str(pair.target), assistant=str(pair.assistant), topk=topk, tp=1)


# ------------------------------------------------------------------------------------------------ abi
# First in the file: seconds, no import. On a CPU machine ``import sgl_kernel`` fails anyway (no libcuda.so.1), so
# only these checks see a torch the kernels were not built for.


@pytest.mark.check("abi")
def test_torch_abi(native_abi, record_property):
    """Every torch symbol and torch library that the native libraries need (sgl_kernel's per-architecture
    common_ops, deep_gemm, torchvision, ...) is defined / shipped by the installed torch."""
    record_property("reader", native_abi.reader)
    record_property("seconds", native_abi.seconds)
    record_property("libraries", len(native_abi.libraries))
    record_property("torch_symbols", sum(r.torch_refs for r in native_abi.libraries))
    record_property("distributions", ", ".join(native_abi.distributions))
    # not torch's, so not judged here: the driver's libcuda.so.1 on a CPU machine, FFmpeg for torchcodec's cores
    record_property("absent_libraries", ", ".join(sorted({s for r in native_abi.libraries for s in r.absent_libs})))
    message = native_abi.failure_message()  # also when no library links torch: nothing checked is no pass
    if message:
        record_property("missing", {r.label: r.missing_demangled + r.missing_torch_libs for r in native_abi.broken})
        raise CheckFailure("abi", message)


@pytest.mark.check("abi")
def test_cuda_major(native_abi, record_property):
    """The CUDA runtime libraries the native libraries need (libcudart.so.N, libcublas.so.N, ...) have the CUDA
    major of this torch build: a cu128 torch under cu130 kernels fails here, not on the GPU."""
    if not native_abi.libraries:
        pytest.skip("test_torch_abi found no torch-linked native library (its failure says why): none to compare")
    if native_abi.torch_cuda is None:
        pytest.skip(
            f"torch {native_abi.torch_version} is a CPU build (torch.version.cuda is None): no CUDA major to compare"
        )
    needed = sorted({s for r in native_abi.libraries for s in r.cuda_majors})
    record_property("torch_cuda", native_abi.torch_cuda)
    record_property("cuda_libraries", ", ".join(needed))
    if not needed:
        pytest.skip("no native library of sglang or its dependencies needs a CUDA runtime library")
    problems = abi.cuda_mismatches(native_abi.libraries, native_abi.torch_cuda)
    if problems:
        raise CheckFailure(
            "abi",
            f"torch {native_abi.torch_version} is built for CUDA {native_abi.torch_cuda}, but " + "; ".join(problems),
        )


# ------------------------------------------------------------------------------------------------ import


@pytest.mark.check("import")
@pytest.mark.parametrize("step", compat.MTP_IMPORT_CHAIN, ids=lambda s: s.id)
def test_import(step, sglang_chain, record_property):
    """Every module of the MTP path imports (a renamed module fails here, naming it)."""
    record_property("seconds", sglang_chain.seconds.get(step.id))
    record_property("chain_seconds", sglang_chain.total_seconds)
    if step.id in sglang_chain.errors:
        raise sglang_chain.errors[step.id]
    record_property("modules", sglang_chain.modules[step.id])


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.check("config")
def test_config(tiny_pair, sglang_chain, record_property):
    """sglang's config loader reads target and assistant; the registry maps both to sglang model classes."""
    target = compat.load_config(tiny_pair.target)
    assistant = compat.load_config(tiny_pair.assistant)
    t_text = compat.text_config(target)
    a_text = compat.text_config(assistant)
    record_property("target_model_type", target.model_type)
    record_property("assistant_model_type", assistant.model_type)

    problems = []
    if target.model_type not in TARGET_MODEL_TYPES:
        problems.append(f"target model_type {target.model_type!r} not in {TARGET_MODEL_TYPES}")
    if assistant.model_type != "gemma4_assistant":
        problems.append(f"assistant model_type {assistant.model_type!r} != 'gemma4_assistant'")
    if not set(assistant.architectures or ()) & set(ASSISTANT_ARCHS):
        problems.append(f"assistant architectures {assistant.architectures} name no Gemma 4 assistant class")
    backbone = getattr(assistant, "backbone_hidden_size", None)
    if backbone != t_text.hidden_size:
        problems.append(f"assistant backbone_hidden_size {backbone} != target hidden_size {t_text.hidden_size}")
    if a_text.vocab_size != t_text.vocab_size:
        problems.append(f"assistant vocab_size {a_text.vocab_size} != target vocab_size {t_text.vocab_size}")
    if problems:
        raise CheckFailure("config", "; ".join(problems))

    t_cls, t_arch = compat.resolve_model_class(target.architectures)
    a_cls, a_arch = compat.resolve_model_class(assistant.architectures)
    record_property("target_class", f"{t_cls.__module__}.{t_cls.__name__}")
    record_property("assistant_class", f"{a_cls.__module__}.{a_cls.__name__}")
    if not a_cls.__module__.endswith("gemma4_mtp"):
        raise CheckFailure(
            "config", f"sglang maps {a_arch} to {a_cls.__module__}.{a_cls.__name__}, not to the gemma4_mtp assistant"
        )


# ------------------------------------------------------------------------------------------------ args


@pytest.mark.check("args")
@pytest.mark.parametrize("topk", settings.TOPKS, ids=lambda k: f"topk{k}")
def test_server_args(tiny_pair, topk, sglang_chain, record_property):
    """The seed command line resolves NEXTN -> FROZEN_KV_MTP with settings.expected_resolution(topk), the triton
    backend, and sglang's own dispatch picks a Frozen-KV MTP worker."""
    t0 = time.monotonic()
    res = compat.resolve(_seed_argv(tiny_pair, topk))
    values = res.values
    record_property("resolution", res.mode)
    record_property("cpu_args", " ".join(res.added))
    record_property("speculative_algorithm", values.get("speculative_algorithm"))
    record_property("speculative_num_draft_tokens", values.get("speculative_num_draft_tokens"))
    record_property("attention_backend", values.get("attention_backend"))

    backend = values.get("attention_backend")
    compat.require_resolution(
        values,
        settings.expected_resolution(topk),
        more=[] if backend == "triton" else [f"attention_backend: resolved {backend!r}, expected 'triton'"],
    )

    worker = compat.spec_worker_class(res)
    record_property("worker", f"{worker.__module__}.{worker.__name__}")
    record_property("seconds", round(time.monotonic() - t0, 3))
    if "frozen_kv_mtp" not in worker.__module__:
        raise CheckFailure("args", f"FROZEN_KV_MTP dispatches to {worker.__module__}.{worker.__name__}")


@pytest.mark.check("args")
def test_smoke_server_args(build_tiny_pair, sglang_chain, record_property):
    """Every default smoke server's own command line (settings.SMOKE_ARGS, its topk, its mode flags, spelled for
    this release) parses with this release's parser and resolves what it asks: the seed resolution for the MTP
    servers, its load format and its mode switches. A flag a release renamed fails here, on CPU, naming the flag, not at launch on a
    GPU: sglang 0.5.23 refuses --cuda-graph-max-bs as ambiguous, so before compat.RENAMED_FLAGS no smoke server
    launched there. The flags are what is checked: every server gets the e-series random pair's folders."""
    from mtpmatrix.core import smoke_servers
    from mtpmatrix.tiers import smoke

    pair = build_tiny_pair("e-series")
    problems, resolved = [], 0
    for spec in smoke_servers.DEFAULT_SMOKE_SERVERS:
        argv = smoke.server_args_for(spec, pair.target, pair.assistant, tp=1)
        try:
            values = compat.resolve(argv).values
        except CheckFailure as exc:  # the release's parser refused the command line
            problems.append(f"{spec.name}: {str(exc).splitlines()[0]}")
            continue
        resolved += 1
        # the mode switches (bare flags) and the load format must resolve as asked; a numeric limit such as the
        # eager server's CUDA-graph batch size is only parsed here: the CPU resolution replaces it (0.5.13 resolves
        # 32 for the eager server's 2, whose batches above 2 ran eager on the H200, 2026-12-02)
        asked = {k: v for k, v in compat.flag_fields(list(spec.mode_args)).items() if v is True}
        if spec.load_format != "auto":
            asked["load_format"] = spec.load_format
        # the long-and-tight family's pool, chunk, page and context sizes are what its checks derive lengths and radix
        # hits from: they must resolve as asked, not only parse
        asked.update(smoke_servers.long_tight_settings(spec))
        expected = {**(settings.expected_resolution(spec.topk) if spec.topk else {}), **asked}
        problems += [f"{spec.name}: {p}" for p in compat.check_resolution(values, expected)]
    record_property("servers", len(smoke_servers.DEFAULT_SMOKE_SERVERS))
    record_property("servers_resolved", resolved)
    if problems:
        raise CheckFailure("args", "; ".join(problems))


# ------------------------------------------------------------------------------------------------ weights


@pytest.mark.check("weights")
def test_weights(tiny_pair, sglang_chain, record_property):
    """sglang's loader builds target + assistant on the CPU and loads the saved safetensors into them."""
    try:
        res = compat.resolve(_seed_argv(tiny_pair, settings.TOPKS[0]))
    except compat.AdapterError:
        raise
    except Exception as exc:  # reported (with sglang's frame) by test_server_args; weights cannot be checked
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        pytest.skip(f"prerequisite failed: ServerArgs resolution ({type(exc).__name__}: {first}); see test_server_args")
    try:
        loaded = sglang_loading.load_models(res)
    except Exception as exc:
        blocker = sglang_loading.cpu_blocker(exc)  # only "needs CUDA" signatures on a machine without one
        if blocker:
            pytest.skip(blocker)
        raise
    record_property("target_class", loaded.target_class)
    record_property("assistant_class", loaded.assistant_class)
    record_property("target_params", loaded.target_params)
    record_property("assistant_params", loaded.assistant_params)
    record_property("seconds", loaded.seconds)
    problems = sglang_loading.spot_check(loaded.target, tiny_pair.target) + sglang_loading.spot_check(
        loaded.assistant, tiny_pair.assistant
    )
    if problems:
        raise CheckFailure("weights", "; ".join(problems))


# ------------------------------------------------------------------------------------------------ gsm8k scoring


def _gsm8k_response(q: gsm8k_eval.Question) -> str:
    """Canned answers that exercise extraction: right, with $ and commas, wrong, no number, leading zeros (a
    SyntaxError for literal_eval), and a stop word left in."""
    g = q.gold
    return [
        f" {q.gold_text}",
        f" The total is ${g:,}.",
        f" It is {g + 1}",
        " no idea",
        f" 00{g}",
        f" {g}\n\nQuestion: next",
    ][q.index % 6]


@pytest.mark.check("harness")
def test_gsm8k_scoring_matches_run_eval(sglang_chain, gsm8k_lines, monkeypatch, record_property):
    """The gsm8k tier's prompts, sampling parameters and scores (mtpmatrix.tiers.gsm8k_eval) == this sglang's
    run_eval(eval_name=gsm8k, api=completion), run with canned responses and no server. A difference is this
    project's mirror falling behind sglang: 'harness'."""
    try:
        rev = importlib.import_module("sglang.test.run_eval")
    except ImportError as exc:  # not the MTP path: an 'import' verdict would blame it
        raise CheckFailure("harness", f"sglang.test.run_eval does not import: {type(exc).__name__}: {exc}") from exc
    src = inspect.getsource(rev.run_eval)
    m = re.search(r'eval_name == "gsm8k".*?from (sglang\.test\.\w+) import GSM8KEval', src, re.S)
    assert m, "run_eval's gsm8k branch no longer imports a GSM8KEval: re-check gsm8k_eval.py against sglang"
    record_property("gsm8k_eval_module", m.group(1))
    sg = importlib.import_module(m.group(1))
    assert sg.INVALID == gsm8k_eval.INVALID

    ours = gsm8k_eval.build_questions(gsm8k_lines, 200, 5)
    responses = {q.prompt: _gsm8k_response(q) for q in ours}
    seen, captured = [], {}

    class CapturingSampler:  # stands in for CompletionSampler: no server, canned responses
        def __init__(self, **kw):
            captured.update(kw)
            self.model = kw.get("model")
            self._completion_tokens = []

        def _pack_message(self, role, content):
            return {"role": str(role), "content": content}

        def __call__(self, message_list):
            prompt = "\n".join(m["content"] for m in message_list if isinstance(m.get("content"), str))
            seen.append(prompt)
            return responses[prompt]

    monkeypatch.setattr(rev, "CompletionSampler", CapturingSampler)
    # the seed suite's call (sglang/test/kits/spec_server_kits.py), data from our verified file
    args = SimpleNamespace(
        base_url="http://127.0.0.1:9",
        model="m",
        eval_name="gsm8k",
        api="completion",
        max_tokens=512,
        num_examples=200,
        num_threads=8,
    )
    eval_obj = sg.GSM8KEval(
        num_examples=args.num_examples,
        num_threads=args.num_threads,
        num_shots=getattr(args, "num_shots", 5),
        data_path=str(gsm8k_eval.data_file("test", offline=True)),
    )
    result, _latency, _sampler = rev.run_eval_once(args, args.base_url + "/v1", eval_obj)

    assert sorted(seen) == sorted(q.prompt for q in ours)  # same 200 prompts, byte for byte
    assert captured["stop"] == gsm8k_eval.STOP
    assert captured["temperature"] == gsm8k_eval.TEMPERATURE and captured["top_p"] == gsm8k_eval.TOP_P
    assert captured["max_tokens"] == 512
    for q in ours:  # extraction and gold, function by function
        assert sg.get_answer_value(responses[q.prompt]) == gsm8k_eval.get_answer_value(responses[q.prompt])
        assert sg.get_answer_value(gsm8k_lines[q.line]["answer"]) == q.gold
    our_score = sum(gsm8k_eval.is_correct(gsm8k_eval.get_answer_value(responses[q.prompt]), q.gold) for q in ours) / 200
    assert result.score == pytest.approx(our_score, abs=1e-12)
    assert 0.0 < our_score < 1.0


# ------------------------------------------------------------------------------------------------ meta_info fields
@pytest.mark.check("accounting")
def test_meta_fields_table_matches_tokenizer_manager(sglang_chain, monkeypatch, record_property):
    """This sglang's own tokenizer manager, fed the per-request counters of a request that drafted and verified,
    writes exactly the speculative meta_info fields meta_fields.SGLANG_META_FIELDS lists for this release, and they
    agree (meta_fields.disagreements); the same counters with the bonus token counted as a correct draft (the
    catalogue's metric-correct-drafts-bonus) do not. A table behind sglang is this project's bug: 'harness'."""
    from mtpmatrix.tiers.compat import meta_fields

    tm = importlib.import_module("sglang.srt.managers.tokenizer_manager")
    draft_tokens = settings.DRAFT_TOKENS[1]
    if hasattr(tm, "get_spec"):  # 0.5.23 reads the draft-token count from the published spec args
        monkeypatch.setattr(tm, "get_spec", lambda: SimpleNamespace(speculative_num_draft_tokens=draft_tokens))
    owner = SimpleNamespace(server_args=SimpleNamespace(speculative_num_draft_tokens=draft_tokens))
    fields = meta_fields.documented_fields()
    steps = settings.NUM_STEPS

    def meta_for(correct: int) -> dict:
        # 6 verify steps of 5 drafts + bonus for 32 tokens asked: 1 + 36 accepted, 5 cut (the tail rule's edge)
        recv = SimpleNamespace(
            spec_verify_ct=[6],
            spec_num_correct_drafts=[correct],
            completion_tokens=[32],
            spec_correct_drafts_histogram=[[0] * steps + [6]],
            spec_num_cap_tokens=None,
            spec_num_block_accept_tokens=None,
            spec_cap_lens_histogram=None,
        )
        meta = {"completion_tokens": 32}
        tm.TokenizerManager._calculate_spec_decoding_metrics(owner, meta, recv, 0)
        return meta

    meta = meta_for(30)
    written = sorted(k for k in meta if k.startswith("spec_"))
    record_property("meta_fields_written", written)
    if set(written) != set(fields):
        raise CheckFailure(
            "harness",
            f"sglang {compat.sglang_version()} writes {written}; meta_fields lists "
            f"{sorted(fields)} for it: update meta_fields.SGLANG_META_FIELDS",
        )
    why = meta_fields.disagreements(meta, fields=fields, draft_tokens=draft_tokens, steps=steps)
    if why:
        raise CheckFailure("accounting", f"sglang's own fields for consistent counters disagree: {'; '.join(why)}")
    if not meta_fields.disagreements(meta_for(30 + 6), fields=fields, draft_tokens=draft_tokens, steps=steps):
        raise CheckFailure("harness", "a correct-drafts count including the bonus tokens passes meta_fields' check")
