"""GSM8K prompts, extraction, scoring and data handling; one (slow) equivalence check against installed sglang."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from fake_sglang import FakeSglang
from mtpmatrix.tiers import gsm8k

INV = gsm8k.INVALID


@pytest.fixture(scope="module")
def test_lines():
    try:
        return gsm8k.load_split("test", offline=True)
    except gsm8k.DataError as exc:
        pytest.skip(f"GSM8K test split unavailable offline: {exc}")


def _mini(n=8):
    return [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
            for i in range(n)]


# --- extraction (sglang's get_answer_value) -------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("Janet sells 9 eggs.\n#### 18", 18),
    ("The answer is 1,234.", 1234),  # commas dropped; "1234." -> literal_eval("1234.") == 1234.0
    ("so -3.5 degrees", -3.5),
    ("She pays $5.", 5.0),
    ("no number at all", INV),
    ("", INV),
    ("version 1.2.3", 3),  # regex finds "1.2" then "3"; the last wins
    ("answer 007", INV),  # literal_eval("007") is a SyntaxError in Python 3 -> INVALID, like sglang
    ("10 apples then 20\n\nQuestion", 20),
])
def test_get_answer_value(text, expected):
    got = gsm8k.get_answer_value(text)
    assert got == expected


def test_float_int_equality_is_correct():
    assert gsm8k.is_correct(gsm8k.get_answer_value("it is 18."), 18)  # 18.0 == 18
    assert not gsm8k.is_correct(gsm8k.get_answer_value("19"), 18)


# --- prompts -----------------------------------------------------------------------------------------------------
def test_prompt_layout_on_mini_data():
    lines = _mini(8)
    qs = gsm8k.build_questions(lines, num_examples=2, num_shots=3)
    assert [q.line for q in qs] == [3, 4] and [q.index for q in qs] == [0, 1]
    shot = "Question: What is 0 + 0?\nAnswer: 0 + 0 = <<0+0=0>>0\n#### 0\n\n"
    assert qs[0].prompt.startswith(shot)
    assert qs[0].prompt.endswith("#### 4\n\nQuestion: What is 3 + 3?\nAnswer:")
    assert qs[0].prompt.count("Question:") == 4 and qs[0].gold == 6
    assert qs[1].prompt.rsplit("Question:", 1)[0] == qs[0].prompt.rsplit("Question:", 1)[0]  # same prefix
    assert len(gsm8k.build_questions(lines, num_examples=100, num_shots=3)) == 5  # capped silently
    assert len(gsm8k.build_questions(lines, num_examples=None, num_shots=0)) == 8


def test_prompts_on_real_test_split(test_lines):
    assert len(test_lines) == 1319
    qs = gsm8k.build_questions(test_lines, 200, 5)
    assert len(qs) == 200 and qs[0].line == 5 and qs[-1].line == 204
    assert qs[0].prompt.startswith("Question: Janet\u2019s ducks lay 16 eggs per day.")
    assert qs[0].prompt.count("\nAnswer:") == 6 and qs[0].prompt.endswith(f"Question: {test_lines[5]['question']}\nAnswer:")
    assert all(q.gold != INV for q in gsm8k.build_questions(test_lines, None, 5))
    assert len({q.prompt_sha for q in qs}) == 200


def test_sampling_params():
    sp = gsm8k.sampling_params(512)
    assert sp == {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512,
                  "stop": ["Question", "Assistant:", "<|separator|>"]}


# --- data ----------------------------------------------------------------------------------------------------------
def test_shared_data_sha256_constants():
    d = Path("/work/shared/data/gsm8k")
    if not (d / "test.jsonl").exists():
        pytest.skip("no /work/shared/data/gsm8k here")
    for split in gsm8k.SPLITS:
        assert gsm8k.sha256_file(d / f"{split}.jsonl") == gsm8k.SHA256[split]
    assert len(gsm8k.load_split("train", d)) == 7473


def test_env_dir_and_sha_mismatch(tmp_path, monkeypatch):
    (tmp_path / "test.jsonl").write_text(json.dumps(_mini(1)[0]) + "\n")
    monkeypatch.setenv("MTPMATRIX_GSM8K_DIR", str(tmp_path))
    assert gsm8k.candidate_dirs() == [tmp_path]
    with pytest.raises(gsm8k.DataError, match="SHA-256"):
        gsm8k.data_file("test")
    assert gsm8k.data_file("test", verify=False) == tmp_path / "test.jsonl"


@pytest.mark.parametrize("how", ["arg", "MTPMATRIX_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_missing_is_one_clear_error(tmp_path, monkeypatch, how):
    monkeypatch.setenv("MTPMATRIX_GSM8K_DIR", str(tmp_path / "nowhere"))
    monkeypatch.delenv("MTPMATRIX_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    if how != "arg":
        monkeypatch.setenv(how, "1")
    monkeypatch.setattr(gsm8k, "_download", lambda *a, **k: pytest.fail("must not download"))
    with pytest.raises(gsm8k.DataError) as ei:
        gsm8k.data_file("test", offline=True if how == "arg" else None, cache_dir=tmp_path / "cache")
    msg = str(ei.value)
    assert "\n" not in msg and "downloading is off" in msg and "MTPMATRIX_GSM8K_DIR" in msg
    assert str(tmp_path / "nowhere" / "test.jsonl") in msg


def test_download_verifies_and_caches(tmp_path, monkeypatch):
    src = Path("/work/shared/data/gsm8k/test.jsonl")
    if not src.exists():
        pytest.skip("no local copy to serve as the download source")
    monkeypatch.setenv("MTPMATRIX_GSM8K_DIR", str(tmp_path / "nowhere"))
    monkeypatch.delenv("MTPMATRIX_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setitem(gsm8k.URLS, "test", src.as_uri())
    p = gsm8k.data_file("test", cache_dir=tmp_path / "cache")
    assert p == tmp_path / "cache" / "test.jsonl" and gsm8k.sha256_file(p) == gsm8k.SHA256["test"]
    # a corrupted download is refused and leaves nothing behind
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{}\n")
    monkeypatch.setitem(gsm8k.URLS, "test", bad.as_uri())
    with pytest.raises(gsm8k.DataError, match="SHA-256"):
        gsm8k.data_file("test", cache_dir=tmp_path / "cache2")
    assert not any((tmp_path / "cache2").iterdir())


def test_read_jsonl_skips_comments(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('# comment\n{"a": 1}\n\n{"a": 2}\n')
    assert gsm8k.read_jsonl(p) == [{"a": 1}, {"a": 2}]


# --- running against the fake server ----------------------------------------------------------------------------
def test_run_gsm8k_scores_records_and_errors(tmp_path):
    lines = _mini(30)
    qs = {q.prompt: q for q in gsm8k.build_questions(lines, 20, 5)}

    def responder(payload):
        q = qs[payload["text"]]
        if q.index % 4 == 0:
            return f" {q.gold_text.split('####')[0]}The answer is {q.gold}."  # right
        if q.index % 4 == 1:
            return " I cannot tell."  # invalid
        return f" It is {q.gold + 1}"  # wrong

    logs = []
    with FakeSglang(responder=responder, fail={3: 500}, completion_tokens=10, accept_length=2.5) as fake:
        res = gsm8k.run_gsm8k(fake.base_url, num_examples=20, num_shots=5, parallel=4, max_new_tokens=64,
                              lines=lines, progress_every=5, log=logs.append)
        sent = fake.state.payloads
    assert all(p["sampling_params"] == gsm8k.sampling_params(64) for p in sent)
    assert {p["text"] for p in sent} == set(qs)
    assert res.num_examples == 20 and len(res.records) == 20
    # request #3 (arrival order) failed; whichever question that was scores as wrong+invalid with its error kept
    errs = [r for r in res.records if r["error"]]
    assert res.num_errors == 1 and len(errs) == 1 and "injected failure" in errs[0]["error"]
    right = [r for r in res.records if r["index"] % 4 == 0 and not r["error"]]
    assert res.num_correct == len(right) and res.score == len(right) / 20
    assert all(r["correct"] for r in right)
    assert res.num_invalid == 5 + (0 if errs[0]["index"] % 4 == 1 else 1)
    lo, hi = res.wilson95
    assert lo < res.score < hi
    assert res.output_tokens == 19 * 10 and res.spec_accept_length == 2.5
    r0 = res.records[0]
    assert set(r0) >= {"index", "line", "prompt_sha", "response", "extracted", "gold", "correct",
                       "completion_tokens", "latency_s", "error"}
    assert [r["index"] for r in res.records] == list(range(20))
    # progress every 5 questions: count, rate and time left, then the score line
    progress = [ln for ln in logs if " questions, " in ln]
    assert [ln.split(":")[1].split()[0] for ln in progress] == ["5/20", "10/20", "15/20", "20/20"]
    assert all("/s, " in ln for ln in progress) and "left" in progress[0] and "left" not in progress[-1]
    assert logs[-1].startswith("gsm8k: score")
    out = res.write_jsonl(tmp_path / "r" / "records.jsonl")
    back = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert back == res.records
    json.dumps(res.summary())  # serializable
    assert res.correct_list == [r["correct"] for r in res.records]


# --- equivalence with the installed sglang --------------------------------------------------------------------------
def _variant(q: gsm8k.Question) -> str:
    k = q.index % 6
    g = q.gold
    return [f" {q.gold_text}", f" The total is ${g:,}.", f" It is {g + 1}", " no idea", f" 00{g}",
            f" {g}\n\nQuestion: next"][k]


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                    reason="sglang is not importable here (run with an sglang venv's python for this check)")
def test_identical_to_installed_sglang_run_eval(monkeypatch, test_lines):
    """Our prompts, sampling parameters and scores == sglang's run_eval(eval_name=gsm8k, api=completion)."""
    rev = importlib.import_module("sglang.test.run_eval")
    src = inspect.getsource(rev.run_eval)
    m = re.search(r'eval_name == "gsm8k".*?from (sglang\.test\.\w+) import GSM8KEval', src, re.S)
    assert m, "run_eval's gsm8k branch no longer imports a GSM8KEval: re-check gsm8k.py against sglang"
    sg = importlib.import_module(m.group(1))
    assert sg.INVALID == gsm8k.INVALID

    ours = gsm8k.build_questions(test_lines, 200, 5)
    responses = {q.prompt: _variant(q) for q in ours}
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
    args = SimpleNamespace(base_url="http://127.0.0.1:9", model="m", eval_name="gsm8k", api="completion",
                           max_tokens=512, num_examples=200, num_threads=8)
    eval_obj = sg.GSM8KEval(num_examples=args.num_examples, num_threads=args.num_threads,
                            num_shots=getattr(args, "num_shots", 5), data_path=str(gsm8k.data_file("test")))
    result, _latency, _sampler = rev.run_eval_once(args, args.base_url + "/v1", eval_obj)

    assert sorted(seen) == sorted(q.prompt for q in ours)  # same 200 prompts, byte for byte
    assert captured["stop"] == gsm8k.STOP
    assert captured["temperature"] == gsm8k.TEMPERATURE and captured["top_p"] == gsm8k.TOP_P
    assert captured["max_tokens"] == 512
    for q in ours:  # extraction and gold, function by function
        assert sg.get_answer_value(responses[q.prompt]) == gsm8k.get_answer_value(responses[q.prompt])
        assert sg.get_answer_value(test_lines[q.line]["answer"]) == q.gold
    our_score = sum(gsm8k.is_correct(gsm8k.get_answer_value(responses[q.prompt]), q.gold) for q in ours) / 200
    assert result.score == pytest.approx(our_score, abs=1e-12)
    assert 0.0 < our_score < 1.0
