"""mtpmatrix.serving.client against the in-process fake sglang (tests/unit/fake_sglang.py)."""

from __future__ import annotations

import threading

import pytest
from events import HANG
from fake_sglang import FakeSglang

from mtpmatrix.serving import client


def test_generate_returns_text_output_ids_and_meta():
    with FakeSglang(completion_tokens=6, accept_length=2.0) as fake:
        out = client.generate(
            fake.base_url, text="Question: 1+1?\nAnswer:", sampling_params={"max_new_tokens": 6, "temperature": 0}
        )
        assert out["text"] == "echo 0"
        assert out["output_ids"] == list(range(6))
        assert out["meta_info"]["completion_tokens"] == 6
        assert out["meta_info"]["spec_verify_ct"] == 3
        sent = fake.state.payloads[0]
        assert sent == {"text": "Question: 1+1?\nAnswer:", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}


def test_generate_input_ids_logprob_and_extra_fields():
    with FakeSglang() as fake:
        client.generate(fake.base_url, input_ids=[1, 2, 3], return_logprob=True, rid="r1")
        assert fake.state.payloads[0] == {
            "input_ids": [1, 2, 3],
            "sampling_params": {},
            "return_logprob": True,
            "rid": "r1",
        }
    with pytest.raises(ValueError):
        client.generate_payload()
    with pytest.raises(ValueError):
        client.generate_payload(text="a", input_ids=[1])


def test_generate_http_error_carries_sglang_message():
    with FakeSglang(fail={0: 400}) as fake:
        with pytest.raises(client.ClientError) as ei:
            client.generate(fake.base_url, text="x")
        assert ei.value.status == 400
        assert "injected failure #0" in str(ei.value)


def test_run_batch_orders_results_and_captures_errors():
    seen = []
    with FakeSglang(delay=0.01, fail={2: 500, 5: 400}) as fake:
        reqs = [client.generate_payload(text=f"q{i}", sampling_params={"max_new_tokens": 4}) for i in range(20)]
        res = client.run_batch(fake.base_url, reqs, parallel=4, progress=lambda d, t, r: seen.append((d, t)))
    assert [r.index for r in res] == list(range(20))
    bad = [r for r in res if not r.ok]
    assert len(bad) == 2 and {r.status for r in bad} == {400, 500}
    assert all("injected failure" in r.error for r in bad)
    assert all(r.latency_s >= 0.01 for r in res if r.ok)
    assert [d for d, _ in seen] == list(range(1, 21)) and all(t == 20 for _, t in seen)
    s = client.summarize(res, wall_s=1.0)
    assert (s.total, s.ok, s.errors) == (20, 18, 2)
    assert s.completion_tokens == 18 * 8 and s.spec_accept_length == 2.0


def test_run_batch_reuses_one_connection_per_worker():
    with FakeSglang() as fake:
        reqs = [client.generate_payload(text=str(i)) for i in range(40)]
        res = client.run_batch(fake.base_url, reqs, parallel=2)
        assert all(r.ok for r in res)
        # keep-alive: 2 workers -> at most 2 client (host, port) pairs on the server side
        assert len(fake.state.connections) <= 2


def test_run_batch_survives_dropped_connection_and_unreachable_server():
    with FakeSglang(drop_connection={3}) as fake:
        res = client.run_batch(fake.base_url, [client.generate_payload(text=str(i)) for i in range(8)], parallel=1)
    assert len(res) == 8
    # the dropped request was retried once on a fresh connection (stale keep-alive), or recorded as an error
    assert sum(r.ok for r in res) >= 7
    from mtpmatrix.serving.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    res = client.run_batch(dead, [client.generate_payload(text="x")] * 3, parallel=3, timeout=5)
    assert len(res) == 3 and not any(r.ok for r in res)
    assert all("Connection" in r.error or "refused" in r.error.lower() for r in res)


def test_run_batch_progress_errors_do_not_kill_batch():
    def boom(*a):
        raise RuntimeError("printer broke")

    with FakeSglang() as fake:
        res = client.run_batch(fake.base_url, [client.generate_payload(text="x")] * 5, parallel=2, progress=boom)
    assert len(res) == 5 and all(r.ok for r in res)


def test_run_batch_really_parallel():
    # Each request is answered only once all 16 are in flight at the stub at the same time: requests sent in turn
    # (or fewer at once) break the barrier and are answered 500, however fast or slow the machine is.
    all_in_flight = threading.Barrier(16, timeout=HANG)
    with FakeSglang(before_answer=all_in_flight.wait) as fake:
        res = client.run_batch(fake.base_url, [client.generate_payload(text="x")] * 16, parallel=16)
    assert all(r.ok for r in res), [r.error for r in res if not r.ok][:1]


def test_server_info_and_legacy_fallback():
    with FakeSglang(accept_length=2.5) as fake:
        info = client.server_info(fake.base_url)
        assert client.spec_stats(info)["avg_spec_accept_length"] == 2.5
    with FakeSglang(legacy_server_info=True) as fake:
        assert client.server_info(fake.base_url)["speculative_eagle_topk"] == 1


def test_spec_stats_shapes():
    assert client.spec_stats(None) is None
    assert client.spec_stats({"internal_states": [{}]}) is None
    assert client.spec_stats({"internal_states": [{"avg_spec_accept_length": None}]}) is None
    s = client.spec_stats({"internal_states": [{"avg_spec_accept_length": 3.0}]})
    assert s == {"avg_spec_accept_length": 3.0, "per_rank": [3.0], "source": "internal_states[0]"}
    s = client.spec_stats({"internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 3.0}]})
    assert s["avg_spec_accept_length"] == 2.5 and s["per_rank"] == [2.0, 3.0]
    assert client.spec_stats({"avg_spec_accept_length": 1.7})["source"] == "top level"


def test_find_arg_and_cuda_graph_flag():
    flat = {"disable_cuda_graph": False, "speculative_eagle_topk": 3, "internal_states": [{"x": 1}]}
    assert client.find_arg(flat, "speculative_eagle_topk") == 3
    assert client.cuda_graph_disabled(flat) is False
    nested = {"spec": {"speculative_eagle_topk": 1}, "cuda_graph": {"cuda_graph_backend_decode": "disabled"}}
    assert client.find_arg(nested, "speculative_eagle_topk") == 1
    assert client.cuda_graph_disabled(nested) is True
    assert client.cuda_graph_disabled({"disable_cuda_graph": True}) is True
    assert client.cuda_graph_disabled({}) is None
    assert client.find_arg({}, "nope", "d") == "d"


def test_flush_cache_and_health():
    with FakeSglang(flush_refusals=1) as fake:
        assert client.flush_cache(fake.base_url) is False
        assert client.flush_cache(fake.base_url) is True
        assert client.health(fake.base_url) is True
    from mtpmatrix.serving.processes import free_port

    assert client.health(f"http://127.0.0.1:{free_port()}", timeout=2) is False


def test_timeout_applies_to_batches_and_single_calls():
    # The stub holds every reply until the test has seen the timeouts: no reply can beat them, however loaded.
    released = threading.Event()
    with FakeSglang(before_answer=lambda: released.wait(HANG)) as fake:
        try:
            res = client.run_batch(fake.base_url, [client.generate_payload(text="x")] * 2, parallel=2, timeout=0.1)
            assert not any(r.ok for r in res) and all("timed out" in r.error for r in res)
            with pytest.raises(OSError):  # requests' Timeout is an OSError: callers' transport handlers catch it
                client.generate(fake.base_url, text="x", timeout=0.1)
        finally:
            released.set()


def test_single_calls_keep_alive_and_resend_on_a_dropped_idle_connection():
    with FakeSglang(drop_connection={1}) as fake:
        assert client.generate(fake.base_url, text="a")["text"] == "echo 0"
        # request #1 meets a connection the server drops: sent again once on a fresh one, answered as #2
        assert client.generate(fake.base_url, text="b")["text"] == "echo 2"
        assert client.generate(fake.base_url, text="c")["text"] == "echo 3"
        assert len(fake.state.connections) == 2
    with FakeSglang(drop_connection={0}) as fake:  # a fresh connection dropped is the server's answer: no resend
        with pytest.raises(OSError, match="RemoteDisconnected|aborted"):
            client.generate(fake.base_url, text="a")
        assert fake.state.count == 1


def test_environment_proxies_are_ignored(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    with FakeSglang() as fake:
        res = client.run_batch(fake.base_url, [client.generate_payload(text="x")] * 2, parallel=2)
        assert all(r.ok for r in res)


def test_only_plain_http():
    with pytest.raises(ValueError, match="only plain http"):
        client.request("https://127.0.0.1:1", "GET", "/health")


def test_accept_length_counts_only_requests_with_verify_steps():
    metas = [
        {"completion_tokens": 32, "spec_verify_ct": 6},
        {"completion_tokens": 32, "spec_verify_ct": 6},
        {"completion_tokens": 1},
        {"completion_tokens": 1, "spec_verify_ct": 0},
    ]  # done at prefill
    assert client.accept_length_from_meta(metas) == pytest.approx(5.3333)
    assert client.accept_length_from_meta([{"completion_tokens": 32}]) is None
    assert client.accept_length_from_meta([]) is None


def test_connection_thread_safety_not_shared():
    # each run_batch worker owns its session; this asserts no cross-thread sharing assumptions break
    with FakeSglang() as fake:
        errs = []

        def one():
            try:
                client.run_batch(fake.base_url, [client.generate_payload(text="a")] * 10, parallel=3)
            except Exception as e:  # pragma: no cover
                errs.append(e)

        ts = [threading.Thread(target=one) for _ in range(3)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not errs and fake.state.count == 30
