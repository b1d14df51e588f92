"""GSM8K prompts, extraction, scoring and data handling, and the tier's cases, weights and run cache
(mtpmatrix.tiers.gsm8k_runs). The equivalence with sglang's own run_eval needs sglang: the contract tier checks it
(tests/tiers/test_contract.py::test_gsm8k_scoring_matches_run_eval)."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from fake_sglang import FakeSglang

from mtpmatrix.core import settings
from mtpmatrix.serving import served
from mtpmatrix.tiers import gsm8k_eval, gsm8k_runs

INV = gsm8k_eval.INVALID
ROOT = Path(__file__).resolve().parents[2]


def _mini(n=8):
    return [
        {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
        for i in range(n)
    ]


# --- extraction (sglang's get_answer_value) -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,expected",
    [
        ("Janet sells 9 eggs.\n#### 18", 18),
        ("The answer is 1,234.", 1234),  # commas dropped; "1234." -> literal_eval("1234.") == 1234.0
        ("so -3.5 degrees", -3.5),
        ("She pays $5.", 5.0),
        ("no number at all", INV),
        ("", INV),
        ("version 1.2.3", 3),  # regex finds "1.2" then "3"; the last wins
        ("answer 007", INV),  # literal_eval("007") is a SyntaxError in Python 3 -> INVALID, like sglang
        ("10 apples then 20\n\nQuestion", 20),
    ],
)
def test_get_answer_value(text, expected):
    got = gsm8k_eval.get_answer_value(text)
    assert got == expected


def test_float_int_equality_is_correct():
    assert gsm8k_eval.is_correct(gsm8k_eval.get_answer_value("it is 18."), 18)  # 18.0 == 18
    assert not gsm8k_eval.is_correct(gsm8k_eval.get_answer_value("19"), 18)


# --- prompts -----------------------------------------------------------------------------------------------------
def test_prompt_layout_on_mini_data():
    lines = _mini(8)
    qs = gsm8k_eval.build_questions(lines, num_examples=2, num_shots=3)
    assert [q.line for q in qs] == [3, 4] and [q.index for q in qs] == [0, 1]
    shot = "Question: What is 0 + 0?\nAnswer: 0 + 0 = <<0+0=0>>0\n#### 0\n\n"
    assert qs[0].prompt.startswith(shot)
    assert qs[0].prompt.endswith("#### 4\n\nQuestion: What is 3 + 3?\nAnswer:")
    assert qs[0].prompt.count("Question:") == 4 and qs[0].gold == 6
    assert qs[1].prompt.rsplit("Question:", 1)[0] == qs[0].prompt.rsplit("Question:", 1)[0]  # same prefix
    assert len(gsm8k_eval.build_questions(lines, num_examples=100, num_shots=3)) == 5  # capped silently
    assert len(gsm8k_eval.build_questions(lines, num_examples=None, num_shots=0)) == 8


def test_prompts_on_real_test_split(gsm8k_lines):
    assert len(gsm8k_lines) == 1319
    qs = gsm8k_eval.build_questions(gsm8k_lines, 200, 5)
    assert len(qs) == 200 and qs[0].line == 5 and qs[-1].line == 204
    assert qs[0].prompt.startswith("Question: Janet\u2019s ducks lay 16 eggs per day.")
    assert qs[0].prompt.count("\nAnswer:") == 6
    assert qs[0].prompt.endswith(f"Question: {gsm8k_lines[5]['question']}\nAnswer:")
    assert all(q.gold != INV for q in gsm8k_eval.build_questions(gsm8k_lines, None, 5))
    assert len({q.prompt_sha for q in qs}) == 200


def test_sampling_params():
    sp = gsm8k_eval.sampling_params(512)
    assert sp == {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_new_tokens": 512,
        "stop": ["Question", "Assistant:", "<|separator|>"],
    }


# --- data ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def clean(tmp_path, monkeypatch):
    """No data env, an empty cache and no network: what a fresh clone (or a row venv) has."""
    for k in ("MTPMATRIX_GSM8K_DIR", "MTPMATRIX_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(gsm8k_eval, "_download", lambda *a, **k: pytest.fail("must not download"))
    return monkeypatch


@pytest.fixture(scope="module")
def test_bytes() -> bytes:
    return gzip.decompress(gsm8k_eval.shipped_file("test").read_bytes())


def _no_shipped_copy(monkeypatch, tmp_path):
    monkeypatch.setattr(gsm8k_eval, "SHIPPED_DIR", tmp_path / "not-shipped")


def _user_copy(d: Path, data: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "test.jsonl").write_bytes(data)
    return d / "test.jsonl"


def _one_byte_off(data: bytes) -> bytes:
    return data[:100] + bytes([data[100] ^ 1]) + data[101:]


def test_no_test_hard_codes_a_data_path():
    """Data is found through the documented lookup, never at one machine's absolute path."""
    needle = '"/' + "work/shared/"  # an absolute path literal (spelled apart so this line does not hit itself)
    hits = [
        f"{f.relative_to(ROOT)}:{i}"
        for top in ("tests", "src")
        for f in sorted((ROOT / top).rglob("*.py"))
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if needle in line
    ]
    assert hits == []


def test_shipped_copy_loads_with_no_env_and_no_network(clean, tmp_path):
    lines = gsm8k_eval.load_split("test")
    assert len(lines) == 1319 and lines[0]["question"].startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert not (tmp_path / "xdg").exists()  # read in memory: loading writes nothing
    license_ = gsm8k_eval.shipped_file("test").with_name("LICENSE").read_text()
    assert license_.startswith("MIT License") and "OpenAI" in license_


def test_shipped_copy_matches_the_checksum(test_bytes):
    assert hashlib.sha256(test_bytes).hexdigest() == gsm8k_eval.data_sha256() == settings.GSM8K_SHA256["test"]
    assert test_bytes.count(b"\n") == 1319


def test_pack_is_reproducible(test_bytes):
    """tools/pack_gsm8k.py's gzip: no time stamp, no file name, so the same data packs to the same bytes."""
    packed = gsm8k_eval.pack(test_bytes)
    assert packed[4:8] == b"\0\0\0\0" and not packed[3] & 0x08  # MTIME 0, no FNAME flag
    assert gsm8k_eval.pack(test_bytes) == packed and gzip.decompress(packed) == test_bytes


def test_pack_tool(tmp_path, test_bytes, capsys):
    spec = importlib.util.spec_from_file_location("pack_gsm8k", ROOT / "tools" / "pack_gsm8k.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    src = _user_copy(tmp_path / "src", test_bytes)
    assert tool.main([str(src), "--out", str(tmp_path / "a.gz")]) == 0
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == test_bytes
    assert capsys.readouterr().out.startswith(f"{gsm8k_eval.data_sha256()}  {tmp_path / 'a.gz'} (")
    src.write_bytes(_one_byte_off(test_bytes))
    assert tool.main([str(src), "--out", str(tmp_path / "b.gz")]) == 1
    assert "update settings.GSM8K_SHA256['test']" in capsys.readouterr().err


def test_data_file_decompresses_the_shipped_copy_into_the_cache(clean, tmp_path, test_bytes):
    cached = tmp_path / "xdg" / "mtpmatrix" / "gsm8k" / "test.jsonl"
    assert gsm8k_eval.data_file("test") == cached and cached.read_bytes() == test_bytes
    cached.write_bytes(b"{}\n")  # a damaged cache is ours to replace, never read
    assert gsm8k_eval.data_file("test") == cached and cached.read_bytes() == test_bytes


@pytest.mark.parametrize("how", ["env", "arg"])
def test_user_copy_comes_first_and_is_verified(clean, tmp_path, test_bytes, how):
    mine = _user_copy(tmp_path / "mine", test_bytes)
    if how == "env":
        clean.setenv("MTPMATRIX_GSM8K_DIR", str(mine.parent))
    where = mine.parent if how == "arg" else None
    assert gsm8k_eval.data_file("test", where) == mine and len(gsm8k_eval.load_split("test", where)) == 1319
    bad = hashlib.sha256(_one_byte_off(test_bytes)).hexdigest()
    mine.write_bytes(_one_byte_off(test_bytes))
    for call in (gsm8k_eval.load_split, gsm8k_eval.data_file):
        with pytest.raises(gsm8k_eval.DataError) as ei:
            call("test", where)
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(f"{mine} has SHA-256 {bad}, expected {gsm8k_eval.data_sha256()}")


def test_user_dir_without_the_file_falls_through_to_the_shipped_copy(clean, tmp_path):
    clean.setenv("MTPMATRIX_GSM8K_DIR", str(tmp_path / "empty"))
    assert len(gsm8k_eval.load_split("test")) == 1319


def test_a_changed_shipped_copy_is_an_error_not_a_download(clean):
    clean.setitem(settings.GSM8K_SHA256, "test", "0" * 64)
    with pytest.raises(
        gsm8k_eval.DataError, match=r"test\.jsonl\.gz \(decompressed\) has SHA-256 .*tools/pack_gsm8k\.py"
    ):
        gsm8k_eval.load_split("test")


def test_unknown_split_is_refused(clean):
    with pytest.raises(ValueError, match="unknown GSM8K split 'train'"):
        gsm8k_eval.load_split("train")


@pytest.mark.parametrize("how", ["arg", "MTPMATRIX_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_missing_is_one_clear_error(clean, tmp_path, how):
    _no_shipped_copy(clean, tmp_path)
    clean.setenv("MTPMATRIX_GSM8K_DIR", str(tmp_path / "nowhere"))
    if how != "arg":
        clean.setenv(how, "1")
    with pytest.raises(gsm8k_eval.DataError) as ei:
        gsm8k_eval.data_file("test", offline=True if how == "arg" else None, cache_dir=tmp_path / "cache")
    msg = str(ei.value)
    assert "\n" not in msg and "downloading is off" in msg and "MTPMATRIX_GSM8K_DIR" in msg
    for looked in (
        tmp_path / "nowhere" / "test.jsonl",
        gsm8k_eval.shipped_file("test"),
        tmp_path / "cache" / "test.jsonl",
    ):
        assert str(looked) in msg


def test_download_is_verified_before_use_or_cache(clean, tmp_path, test_bytes):
    """Without the shipped copy: a download is used and cached only when it hashes right."""
    _no_shipped_copy(clean, tmp_path)
    served = {"data": _one_byte_off(test_bytes)}
    clean.setattr(gsm8k_eval, "_download", lambda split, timeout=60.0: served["data"])
    cache = tmp_path / "cache"
    with pytest.raises(gsm8k_eval.DataError) as ei:
        gsm8k_eval.load_split("test", cache_dir=cache)
    msg = str(ei.value)
    bad = hashlib.sha256(served["data"]).hexdigest()
    assert (
        "\n" not in msg
        and gsm8k_eval.URLS["test"] in msg
        and f"SHA-256 {bad}, expected {gsm8k_eval.data_sha256()}" in msg
    )
    assert not cache.exists()  # refused: nothing cached
    served["data"] = test_bytes
    assert len(gsm8k_eval.load_split("test", cache_dir=cache)) == 1319
    assert (cache / "test.jsonl").read_bytes() == test_bytes
    served["data"] = b"never fetched again\n"  # the verified cache answers from now on
    assert gsm8k_eval.data_file("test", cache_dir=cache) == cache / "test.jsonl"
    assert len(gsm8k_eval.load_split("test", cache_dir=cache)) == 1319


def test_read_jsonl_skips_comments(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('# comment\n{"a": 1}\n\n{"a": 2}\n')
    assert gsm8k_eval.read_jsonl(p) == [{"a": 1}, {"a": 2}]


# --- running against the fake server ----------------------------------------------------------------------------
def test_run_gsm8k_scores_records_and_errors(tmp_path):
    lines = _mini(30)
    qs = {q.prompt: q for q in gsm8k_eval.build_questions(lines, 20, 5)}

    def responder(payload):
        q = qs[payload["text"]]
        if q.index % 4 == 0:
            return f" {q.gold_text.split('####')[0]}The answer is {q.gold}."  # right
        if q.index % 4 == 1:
            return " I cannot tell."  # invalid
        return f" It is {q.gold + 1}"  # wrong

    logs = []
    with FakeSglang(responder=responder, fail={3: 500}, completion_tokens=10, accept_length=2.5) as fake:
        res = gsm8k_eval.run_gsm8k(
            fake.base_url,
            num_examples=20,
            num_shots=5,
            parallel=4,
            max_new_tokens=64,
            lines=lines,
            progress_every=5,
            log=logs.append,
        )
        sent = fake.state.payloads
    assert all(p["sampling_params"] == gsm8k_eval.sampling_params(64) for p in sent)
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
    assert set(r0) >= {
        "index",
        "line",
        "prompt_sha",
        "response",
        "extracted",
        "gold",
        "correct",
        "completion_tokens",
        "latency_s",
        "error",
    }
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


# --- the tier's cases, weights and run cache (gsm8k_runs) ----------------------------------------------------------
@pytest.fixture
def no_gsm8k_env(monkeypatch):
    for k in ("MTPMATRIX_GSM8K_PAIRS", "MTPMATRIX_GSM8K_BASELINE", "MTPMATRIX_GSM8K_PAIR"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_cases_from_settings_and_env(no_gsm8k_env):
    want = [f"{p}-topk{k}" for p in settings.DEFAULT_PAIRS for k in settings.TOPKS]
    assert [c.id for c in gsm8k_runs.cases()] == want
    no_gsm8k_env.setenv("MTPMATRIX_GSM8K_PAIRS", "E2B")
    no_gsm8k_env.setenv("MTPMATRIX_GSM8K_BASELINE", "1")
    got = gsm8k_runs.cases()
    assert [c.id for c in got] == ["E2B-nomtp", "E2B-topk1", "E2B-topk3"]
    assert got[0].topk is None and got[1].target_env == "MTPMATRIX_E2B_TARGET"
    assert got[2].baseline_id == "E2B-nomtp"


def test_cases_tiny_proof_mode(no_gsm8k_env):
    no_gsm8k_env.setenv("MTPMATRIX_GSM8K_PAIR", "tiny:/t:/a")
    got = gsm8k_runs.cases()
    assert [c.id for c in got] == [f"{gsm8k_runs.TINY_PREFIX}-topk{k}" for k in settings.TOPKS]
    assert all(c.tiny and c.threshold is None and (c.target, c.assistant) == ("/t", "/a") for c in got)
    no_gsm8k_env.setenv("MTPMATRIX_GSM8K_PAIR", "tiny:/t")
    with pytest.raises(ValueError, match="expected tiny:<target_dir>:<assistant_dir>"):
        gsm8k_runs.cases()


def test_cases_from_running_servers_are_gated_like_their_pair(no_gsm8k_env):
    servers = [
        served.Served("http://h:1", {}, "E4B", 1, "m", "d", 1, "0.5.17"),
        served.Served("http://h:2", {}, None, None, "x", None, None, None),
    ]
    e4b, unknown = gsm8k_runs.cases(servers)
    assert (e4b.id, e4b.url, e4b.threshold) == ("E4B-topk1", "http://h:1", settings.resolve_pair("E4B").threshold)
    assert e4b.served == servers[0].as_metric()
    assert unknown.pair == "served" and unknown.threshold is None and unknown.tp == 1


def _weights(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d


def test_resolve_weights_local_dir_and_hf_cache(tmp_path, monkeypatch):
    assert gsm8k_runs.resolve_weights(str(_weights(tmp_path / "local"))) == (tmp_path / "local", "")
    (tmp_path / "empty").mkdir()
    found, looked = gsm8k_runs.resolve_weights(str(tmp_path / "empty"))
    assert found is None and "has no config.json + weight files" in looked
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    repo = hub / "models--google--gemma-x"
    snap = _weights(repo / "snapshots" / "abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc\n")
    assert gsm8k_runs.resolve_weights("google/gemma-x") == (snap, "")
    found, looked = gsm8k_runs.resolve_weights("google/absent")
    assert found is None and str(hub / "models--google--absent") in looked


def test_runs_are_collected_once_per_case(tmp_path):
    calls = []

    def collect(case, out_dir, say):
        calls.append(case.id)
        return gsm8k_runs.Gsm8kRun(case)

    runs = gsm8k_runs.Gsm8kRuns(tmp_path, print, collect=collect)
    mtp = gsm8k_runs.Case("E4B-topk1", "E4B", "t", "a", 1, 1, 0.65)
    base = gsm8k_runs.Case("E4B-nomtp", "E4B", "t", "", 1, None, 0.65)
    assert runs.baseline_of(mtp) is None  # not collected (yet): no comparison
    assert runs.get(base) is runs.get(base) and runs.get(mtp).case is mtp
    assert runs.baseline_of(mtp).case is base and calls == ["E4B-nomtp", "E4B-topk1"]
