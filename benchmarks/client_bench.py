"""Benchmark mtpmatrix.serving.client.run_batch against a zero-delay local stub server: is the client ever the bottleneck?

    python benchmarks/client_bench.py [--requests 2000] [--parallel 1,16,128] [--prompt-chars 2800] [--min-rate 500]

The stub (tests/unit/fake_sglang.py) runs in its own process so its Python threads do not share the client's GIL.
Reported per parallelism: requests/s, client CPU per request (process_time of this process / requests; includes
JSON encode/decode and thread switching), wall per request, p50/p99 latency. The stub itself (http.server, a thread
per connection) is far slower than sglang's uvicorn front end, so requests/s is a lower bound on what the client
can drive; the client CPU per request is the number that matters.

A GSM8K run sends 200 requests of ~2.8 kB prompts; a real server answers each in 1-60 s. The client (requests, a
Session per worker thread) spends ~0.5 ms of CPU per request on a 2-core box: ~0.1 s over a whole run. The last
line checks the largest parallelism against ``--min-rate`` (exit 1 below it): the client is not the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mtpmatrix.serving import client  # noqa: E402
from mtpmatrix.serving.processes import free_port  # noqa: E402

FAKE = ROOT / "tests" / "unit" / "fake_sglang.py"


def start_stub() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not client.health(url, "/health", timeout=1):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("stub server did not start")
        time.sleep(0.05)
    return proc, url


def bench(url: str, n: int, parallel: int, prompt_chars: int) -> dict:
    prompt = ("Question: x\nAnswer: y\n\n" * (prompt_chars // 22 + 1))[:prompt_chars]
    sp = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512, "stop": ["Question", "Assistant:"]}
    reqs = [client.generate_payload(text=prompt, sampling_params=sp) for _ in range(n)]
    client.run_batch(url, reqs[: min(n, parallel * 2)], parallel=parallel)  # warm-up
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = client.run_batch(url, reqs, parallel=parallel)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    lat = sorted(r.latency_s for r in res)
    errors = sum(not r.ok for r in res)
    return {
        "parallel": parallel,
        "requests": n,
        "errors": errors,
        "req_per_s": n / wall,
        "client_cpu_us_per_req": cpu / n * 1e6,
        "wall_us_per_req": wall / n * 1e6,
        "p50_ms": lat[len(lat) // 2] * 1e3,
        "p99_ms": lat[int(len(lat) * 0.99) - 1] * 1e3,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--parallel", default="1,16,128")
    ap.add_argument("--prompt-chars", type=int, default=2800, help="~ a 5-shot GSM8K prompt")
    ap.add_argument("--min-rate", type=float, default=500.0, help="requests/s the largest parallelism must reach")
    a = ap.parse_args(argv)
    proc, url = start_stub()
    try:
        print(f"stub at {url}; {os.cpu_count()} CPUs; {a.requests} requests of {a.prompt_chars} chars each")
        print(
            f"{'parallel':>8} {'req/s':>9} {'client CPU us/req':>18} {'wall us/req':>12} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'errors':>6}"
        )
        for p in (int(x) for x in a.parallel.split(",")):
            r = bench(url, a.requests, p, a.prompt_chars)
            print(
                f"{r['parallel']:>8} {r['req_per_s']:>9.0f} {r['client_cpu_us_per_req']:>18.0f} "
                f"{r['wall_us_per_req']:>12.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>6}"
            )
    finally:
        proc.terminate()
        proc.wait(10)
    ok = r["req_per_s"] >= a.min_rate and not r["errors"]
    print(
        f"parallel {r['parallel']}: {r['req_per_s']:.0f} requests/s, {r['client_cpu_us_per_req']:.0f} us client CPU "
        f"per request, {r['errors']} errors: {'ok' if ok else 'BELOW'} (target >= {a.min_rate:.0f} requests/s)"
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
