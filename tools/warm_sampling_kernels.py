"""Build flashinfer's sampling kernels once, before the smoke tier's timed servers need them.

Why: flashinfer-python without its prebuilt kernels (flashinfer-cubin / flashinfer-jit-cache, which the device
bundles of ../shared/device/make_bundle.sh leave out) compiles its sampling module with nvcc the first time a
server samples. That took ~95 s inside the first sampled request on an H200 (sglang 0.5.17, 2026-12-01): the
scheduler stalled mid-suite and the tier's time went to a compiler, not to sglang. A normal install (wheels with
prebuilt kernels) never compiles, so warming the cache outside the suite measures what users run.

    python tools/warm_sampling_kernels.py      # prints what it built and how long it took; exit 0 without a GPU

tools/gpu_box.sh runs it before the suite (its output goes to env.txt).
"""

from __future__ import annotations

import time


def main() -> int:
    try:
        import flashinfer.sampling as fs
        import torch
    except ImportError as exc:
        print(f"warm_sampling_kernels: nothing to warm ({exc})")
        return 0
    if not torch.cuda.is_available():
        print("warm_sampling_kernels: no CUDA device")
        return 0
    probs = torch.softmax(torch.randn(4, 512, device="cuda"), dim=-1)
    top_k = torch.full((4,), 3, dtype=torch.int32, device="cuda")
    top_p = torch.full((4,), 0.9, dtype=torch.float32, device="cuda")
    min_p = torch.full((4,), 0.05, dtype=torch.float32, device="cuda")
    calls = {  # what sglang's sampler and sampled verify call (layers/sampler.py, speculative eagle_utils/eagle_info)
        "top_k_top_p_sampling_from_probs": lambda: fs.top_k_top_p_sampling_from_probs(probs, top_k, top_p),
        "min_p_sampling_from_probs": lambda: fs.min_p_sampling_from_probs(probs, min_p),
        "top_k_renorm_probs": lambda: fs.top_k_renorm_probs(probs, top_k),
        "top_p_renorm_probs": lambda: fs.top_p_renorm_probs(probs, top_p),
        "sampling_from_probs": lambda: fs.sampling_from_probs(probs),
    }
    for name, call in calls.items():
        t0 = time.monotonic()
        try:
            call()
            torch.cuda.synchronize()
            print(f"warm_sampling_kernels: {name} ready in {time.monotonic() - t0:.1f}s")
        except Exception as exc:  # a release without this function: the servers will say so themselves
            print(f"warm_sampling_kernels: {name}: {type(exc).__name__}: {str(exc)[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
