"""Lab probe (GPU): what a live sglang answers to the request kinds the smoke suite is growing, raw.

    python3 tools/probe_surface.py OUTDIR

Launches the witness and sampled pairs with and without MTP side by side, sends each a battery of requests (stops,
EOS, lengths, logprobs, sampling features, seeds, mixed sampling), and writes every payload and response to
OUTDIR/probe.json, server logs beside it. It judges nothing: the checks under tests/tiers do that; this shows what
a release returns, so a prediction can be compared with it by hand.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtpmatrix.core import smoke_servers
from mtpmatrix.pairs.tiny.build import build_pair
from mtpmatrix.pairs.tiny.vocab import VOCAB
from mtpmatrix.serving import client
from mtpmatrix.serving.server import SglangServer
from mtpmatrix.tiers import smoke

SERVERS = (
    "witness-nomtp",
    "witness-mtp-topk1",
    "witness-mtp-topk3",
    "sampled-nomtp",
    "sampled-mtp-topk1",
    "sampled-mtp-topk1-no-overlap",
)


def witness_battery(tokenizer) -> list[tuple[str, dict]]:
    prompt = smoke.id_prompts(VOCAB)[0]
    chain = smoke.expected_constructed(prompt, 40)
    g = {"temperature": 0.0, "max_new_tokens": 32}

    def req(label, sp=None, prompt_ids=prompt, **extra):
        return label, {"input_ids": prompt_ids, "sampling_params": {**g, **(sp or {})}, **extra}

    def eos_at(k: int) -> list[int]:  # the chain reaches END_OF_TURN 12 at index k
        return [20, 21, 22] + [(12 - k - 1) % VOCAB]

    out = [
        req("plain"),
        req("stop-id-mid", {"stop_token_ids": [chain[3]]}),
        req("stop-id-bonus", {"stop_token_ids": [chain[6]]}),
        req("stop-id-first", {"stop_token_ids": [chain[0]]}),
        req("stop-id-two", {"stop_token_ids": [chain[9], chain[4]]}),
        req("eos-mid", prompt_ids=eos_at(3)),
        req("eos-bonus", prompt_ids=eos_at(6)),
        req("eos-ignored", {"ignore_eos": True}, prompt_ids=eos_at(3)),
        req("eos-1-mid", prompt_ids=[20, 21, 22, (1 - 4) % VOCAB]),
        req("max-new-10", {"max_new_tokens": 10}),
        req("max-new-10-stop-9", {"max_new_tokens": 10, "stop_token_ids": [chain[8]]}),
        req("max-new-9-stop-10", {"max_new_tokens": 9, "stop_token_ids": [chain[9]]}),
        req("max-new-1", {"max_new_tokens": 1}),
        req("logprobs-out", {"max_new_tokens": 14}, return_logprob=True, top_logprobs_num=3),
        req("logprobs-in-out", {"max_new_tokens": 14}, return_logprob=True, top_logprobs_num=3, logprob_start_len=0),
        req("logit-bias", {"logit_bias": {str(chain[4]): -100.0}}),
        req("min-new-8-eos-3", {"min_new_tokens": 8}, prompt_ids=eos_at(3)),
        req("repetition-prompt", {"repetition_penalty": 2.0}, prompt_ids=prompt[:-1] + [chain[5], prompt[-1]]),
        req("frequency-presence", {"frequency_penalty": 2.0, "presence_penalty": 2.0}),
        req("temp1-min-p-0.5", {"temperature": 1.0, "min_p": 0.5}),
        req("temp1-seed-a", {"temperature": 1.0, "sampling_seed": 42}),
        req("temp1-seed-b", {"temperature": 1.0, "sampling_seed": 42}),
        req("temp1", {"temperature": 1.0}),
    ]
    if tokenizer is not None:
        piece = tokenizer.decode([chain[3]])
        out.append(req("stop-string-mid", {"stop": [piece]}))
        out.append(req("stop-string-mid-include", {"stop": [piece], "no_stop_trim": True}))
    return out


def sampled_battery() -> list[tuple[str, dict]]:
    from mtpmatrix.pairs.sampled import ring

    prompt = [ring.RING_START + (7 * j) % ring.RING_SIZE for j in range(12)]
    out = [
        (
            "greedy",
            {"input_ids": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True}},
        )
    ]
    out.append(
        (
            "greedy-frequency",
            {
                "input_ids": prompt,
                "sampling_params": {
                    "temperature": 0.0,
                    "max_new_tokens": 80,
                    "ignore_eos": True,
                    "frequency_penalty": 1.0,
                },
            },
        )
    )
    out.append(
        (
            "greedy-logprobs",
            {
                "input_ids": prompt,
                "return_logprob": True,
                "top_logprobs_num": 4,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True},
            },
        )
    )
    for i in range(6):
        out.append(
            (
                f"t0.7-k3-{i}",
                {
                    "input_ids": prompt,
                    "sampling_params": {"temperature": 0.7, "top_k": 3, "max_new_tokens": 64, "ignore_eos": True},
                },
            )
        )
        out.append(
            (
                f"t1.5-k4-{i}",
                {
                    "input_ids": prompt,
                    "sampling_params": {"temperature": 1.5, "top_k": 4, "max_new_tokens": 64, "ignore_eos": True},
                },
            )
        )
        out.append(
            (
                f"t1-minp0.3-{i}",
                {
                    "input_ids": prompt,
                    "sampling_params": {"temperature": 1.0, "min_p": 0.3, "max_new_tokens": 64, "ignore_eos": True},
                },
            )
        )
    for tag in "ab":
        out.append(
            (
                f"seed-{tag}",
                {
                    "input_ids": prompt,
                    "sampling_params": {
                        "temperature": 1.0,
                        "max_new_tokens": 64,
                        "ignore_eos": True,
                        "sampling_seed": 1234,
                    },
                },
            )
        )
    return out


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    specs = {s.name: s for s in smoke_servers.SMOKE_SERVERS}
    pairs = {v: build_pair("e-series", out / "tiny", variant=v) for v in ("witness-sglang-phase", "sampled")}
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(pairs["witness-sglang-phase"].target))
    except Exception as exc:  # the probe still runs the rest
        print(f"no tokenizer: {exc}", flush=True)
        tok = None
    batteries = {"witness-sglang-phase": witness_battery(tok), "sampled": sampled_battery()}

    def one(name: str) -> dict:
        spec = specs[name]
        pair = pairs[spec.pair]
        srv = SglangServer(
            smoke.server_args_for(spec, pair.target, pair.assistant, 1),
            python=sys.executable,
            log_path=out / f"server-{name}.log",
            ready_timeout=420,
            name=name,
        )
        t0 = time.monotonic()
        rec = {"server": name, "args": list(spec.mode_args)}
        try:
            srv.start()
            srv.wait_ready()
            rec["ready_s"] = round(time.monotonic() - t0, 1)
            battery = batteries[spec.pair]
            results = client.run_batch(srv.base_url, [p for _l, p in battery], parallel=8)
            rec["exchanges"] = [
                {"label": label, "payload": p, "response": r.response, "error": r.error}
                for (label, p), r in zip(battery, results)
            ]
            rec["server_info"] = srv.server_info()
        except BaseException as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            srv.stop()
        return rec

    with ThreadPoolExecutor(len(SERVERS)) as pool:
        records = list(pool.map(one, SERVERS))
    (out / "probe.json").write_text(json.dumps(records, indent=1, default=str))
    for r in records:
        print(
            r["server"],
            r.get("ready_s"),
            r.get("error", "ok")[:200],
            sum(1 for x in r.get("exchanges", []) if x["error"]),
            "request errors",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
