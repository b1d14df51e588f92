"""--server-url: URL checks, what a running server turned out to be, one-line errors before anything runs, and the
gsm8k tier itself (plain pytest) against fake sglang servers: its checks pass and fail where they must.

The fake server (fake_sglang.py) stands in for sglang's HTTP API only; what is tested here is this project's
client, identification, scoring and recording, never sglang.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_sglang import FakeSglang, gsm8k_responder, server_info

from mtpmatrix.core import schema
from mtpmatrix.core.paths import SUITE
from mtpmatrix.core.rows import RowError
from mtpmatrix.runner import matrix
from mtpmatrix.serving import served

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "url, words",
    [
        ("https://h:1", "only plain http"),
        ("http://user:secret@h:1", "credentials in the URL are not supported"),
        ("http://h:1/v1", "without a path"),
        ("http://h", "needs a host and a port"),
        ("h:30000", "only plain http"),
    ],
)
def test_bad_urls_are_one_line_errors_without_echoing_credentials(url, words):
    with pytest.raises(served.ServedError) as info:
        served.check_url(url)
    assert words in str(info.value) and "\n" not in str(info.value) and "secret" not in str(info.value)


def test_check_url_normalises():
    assert served.check_url(" http://10.0.0.5:30000/ ") == "http://10.0.0.5:30000"
    assert served.check_url("http://[::1]:8000") == "http://[::1]:8000"


@pytest.mark.parametrize(
    "path, pair",
    [
        ("google/gemma-4-E4B-it", "E4B"),
        ("/hf/hub/models--google--gemma-4-31B-it/snapshots/abc123", "31B"),
        ("/models/gemma-4-26B-A4B-it/", "26B-A4B"),
        ("/models/my-finetune", None),
        (None, None),
    ],
)
def test_identify_pair(path, pair):
    assert served.identify_pair(path, env={}) == pair


def test_identify_pair_env_override():
    assert served.identify_pair("/models/x", env={served.PAIR_ENV: "E2B"}) == "E2B"
    with pytest.raises(served.ServedError, match="MTPMATRIX_SERVER_PAIR='E9B' is not a model pair"):
        served.identify_pair("/models/x", env={served.PAIR_ENV: "E9B"})


def test_fetch_describes_what_each_server_serves_no_mtp_first():
    with (
        FakeSglang(server_info=server_info(topk=3)) as mtp,
        FakeSglang(server_info=server_info(topk=None), accept_length=0) as base,
    ):
        got = served.fetch_all([mtp.base_url, base.base_url], env={})
        assert [s.case_id for s in got] == ["E4B-nomtp", "E4B-topk3"]
        assert got[1].as_metric() == {
            "url": mtp.base_url,
            "pair": "E4B",
            "topk": 3,
            "model_path": "google/gemma-4-E4B-it",
            "draft_model_path": "google/gemma-4-E4B-it-assistant",
            "tp_size": 1,
            "version": "0.5.17",
        }
        with pytest.raises(served.ServedError, match="both serve E4B-topk3"):
            served.fetch_all([mtp.base_url, mtp.base_url], env={})
    with FakeSglang(server_info={"version": "x"}) as odd:
        with pytest.raises(served.ServedError, match="no model_path"):
            served.fetch(odd.base_url)


def test_fetch_reads_old_releases_endpoint_and_names_a_refusal():
    """/server_info is read with the standard library (nox's Python has no requests): the old releases' name
    /get_server_info after a 404, and an HTTP server that is no sglang in one line with its status."""
    with FakeSglang(server_info=server_info(topk=1), legacy_server_info=True) as old:
        assert served.fetch(old.base_url, env={}).case_id == "E4B-topk1"
        assert old.state.connections  # it asked this server, nothing else

    class NotSglang(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(403, "go away")

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotSglang) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(served.ServedError) as info:
            served.fetch(url)
        httpd.shutdown()
    assert str(info.value).startswith(f"--server-url {url}: /server_info answered 403: GET /server_info -> HTTP 403")


def test_unreachable_server_fails_before_install_and_before_pytest(tmp_path):
    with FakeSglang() as fake:  # a port that was just free again
        url = fake.base_url
    with pytest.raises(RowError) as info:
        matrix.preflight_servers([url])
    assert str(info.value).startswith(f"--server-url {url}: no sglang server answers")
    with pytest.raises(RowError, match="--server-url serves the gsm8k tier"):
        matrix.parse_options(["--tiers", "contract", "--server-url", url])
    assert matrix.parse_options(["--tiers", "gsm8k", "--server-url", url]).server_urls == [url]
    proc = _pytest(tmp_path, "--server-url", url)
    assert proc.returncode == 4  # usage error: nothing collected, nothing run
    assert f"ERROR: --server-url {url}: no sglang server answers" in proc.stderr


def _pytest(tmp_path, *args, env=None):
    env = {**os.environ, "MTPMATRIX_GSM8K_NUM_EXAMPLES": "40", **(env or {})}
    env.pop("MTPMATRIX_RESULTS", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            SUITE,
            "-p",
            "no:cacheprovider",
            "-q",
            "--tiers",
            "gsm8k",
            f"--mtp-results={tmp_path / 'tiers.json'}",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gsm8k_tier_against_running_servers(tmp_path, gsm8k_lines):
    """The seed checks against an MTP server and a no-MTP one of the same pair: args, score against E4B's
    threshold, accept length gate, speed-up and McNemar against no-MTP, records and progress where they belong."""
    wrong = {2, 5, 11}
    with (
        FakeSglang(
            server_info=server_info(topk=1, accept_length=2.5),
            accept_length=2.5,
            responder=gsm8k_responder(gsm8k_lines, lambda i: i not in wrong),
        ) as mtp,
        FakeSglang(server_info=server_info(topk=None), accept_length=0, responder=gsm8k_responder(gsm8k_lines)) as base,
    ):
        proc = _pytest(tmp_path, "--server-url", mtp.base_url, "--server-url", base.base_url)
        assert mtp.state.flushes == 0  # a deployment's cache is not ours to flush
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "[gsm8k E4B-topk1]: 40/40 questions" in proc.stdout  # progress, even with pytest capturing
    tiers = json.loads((tmp_path / "tiers.json").read_text())["tiers"]
    # every check passed, but two servers of 40 questions are not the seed suite: partial, saying why
    gsm = tiers["gsm8k"]
    assert gsm["verdict"] == "partial"
    why = {m["what"]: m["why"] for m in gsm["missing"]}
    assert why["E4B-topk1"] == "scored 40 of 200 questions (MTPMATRIX_GSM8K_NUM_EXAMPLES=40)"
    assert why["31B-topk3"] == "not served: --server-url runs only the cases its servers serve"
    assert tiers["smoke"]["verdict"] == "skipped" and tiers["contract"]["verdict"] == "skipped"
    checks = {c["id"].split("::")[1]: c for c in tiers["gsm8k"]["checks"]}
    assert set(checks) == {
        "test_args[E4B-nomtp]",
        "test_args[E4B-topk1]",
        "test_accuracy[E4B-nomtp]",
        "test_accuracy[E4B-topk1]",
        "test_acceptance[E4B-topk1]",
    }
    acc = checks["test_accuracy[E4B-topk1]"]["metrics"]
    assert acc[schema.SCORE] == 37 / 40 and acc[schema.NUM_EXAMPLES] == 40 and acc[schema.THRESHOLD] == 0.65
    assert acc[schema.WILSON95][0] < 37 / 40 < acc[schema.WILSON95][1]
    assert acc[schema.VS_NOMTP]["lost"] == sorted(wrong) and acc[schema.VS_NOMTP]["gained"] == []
    assert acc[schema.SPEEDUP] > 0 and acc[schema.SERVED]["url"] == mtp.base_url
    assert acc[schema.RECORDS] == "gsm8k/E4B-topk1.jsonl"
    recs = [json.loads(ln) for ln in (tmp_path / acc[schema.RECORDS]).read_text().splitlines()]
    assert [r["index"] for r in recs if not r["correct"]] == sorted(wrong)
    assert checks["test_acceptance[E4B-topk1]"]["metrics"][schema.ACCEPT_LENGTH] == 2.5


@pytest.mark.parametrize(
    "info, kind, words",
    [
        (server_info(topk=1, accept_length=1.2), "acceptance", "avg_spec_accept_length 1.200 < 1.5"),
        (
            server_info(topk=1, speculative_num_draft_tokens=4),
            "args",
            "speculative_num_draft_tokens: resolved 4, expected 6",
        ),
        (server_info(topk=2), "args", "speculative_eagle_topk=2"),
        (server_info(topk=1, disable_cuda_graph=True), "args", "CUDA graph not on"),
    ],
)
def test_gsm8k_tier_fails_a_server_that_does_not_meet_the_seed_suite(tmp_path, gsm8k_lines, info, kind, words):
    with FakeSglang(server_info=info, responder=gsm8k_responder(gsm8k_lines)) as fake:
        proc = _pytest(tmp_path, "--server-url", fake.base_url)
    assert proc.returncode == 1
    tiers = json.loads((tmp_path / "tiers.json").read_text())["tiers"]
    assert tiers["gsm8k"]["verdict"] == "failed" and tiers["gsm8k"]["failure_kinds"] == [kind]
    msgs = [c["failure"]["message"] for c in tiers["gsm8k"]["checks"] if c.get("failure")]
    assert any(words in m for m in msgs), msgs


def test_gsm8k_tier_gates_the_score_on_the_pair_threshold(tmp_path, gsm8k_lines):
    with FakeSglang(
        server_info=server_info(topk=1), responder=gsm8k_responder(gsm8k_lines, lambda i: i % 2 == 0)
    ) as fake:
        proc = _pytest(tmp_path, "--server-url", fake.base_url)
    assert proc.returncode == 1
    tiers = json.loads((tmp_path / "tiers.json").read_text())["tiers"]
    acc = next(c for c in tiers["gsm8k"]["checks"] if "test_accuracy" in c["id"])
    assert acc["failure"]["kind"] == "accuracy" and "GSM8K score 0.500 < threshold 0.65" in acc["failure"]["message"]
