"""How many smoke servers launch at once, and what the smoke suite costs against one cold sglang launch.

The smoke tier (mtpmatrix.tiers.smoke) launches its servers side by side as far as GPU memory allows; the mutants
harness (mtpmatrix.faults.suites) caps its suites by the same memory rule.
"""

from __future__ import annotations

from mtpmatrix.core import settings

# sglang sizes its static pool from the GPU memory free *when it starts*: it keeps (1 - mem_fraction_static) of that
# out of the pool and fails its launch if less than that is still free once it has loaded (0.5.13: when the pool
# comes to 0 tokens, shrinking it quietly just above; 0.5.23 also keeps its multimodal reservation out: 100 MB, 1 GiB
# more only with a cuda_ipc / cuda_vmm transport, which it does not pick on one node: serving_hook.py l. 829-840), so
# what every server launching beside it takes must fit in mem_fraction_static x free memory; --max-total-tokens
# caps the pool itself in 0.5.13-0.5.23, so the fraction changes nothing else a smoke server does. A smoke server
# holds at most SERVER_MIB per GPU once ready (measured on H200s, sglang 0.5.17: 2,478 MiB at TP 1 with its 1 GiB
# multimodal IPC reservation, docs/runs/2026-12-01-h200-sglang-0.5.17-smoke-default.json.gz; 6,310 MiB over 2 GPUs
# at TP 2, docs/runs/2026-11-30b-h200x2-sglang-0.5.17-smoke-tp2-dense31b.json.gz; 0.5.13's 11 servers launched in one
# wave on an H200, docs/runs/2026-12-01b-h200-sglang-0.5.13-smoke-default.json.gz, 930 MiB the most), so that many fit
# side by side.
# 2,944 = the most measured (2,478) + 19 %: the 18 default servers launch in one wave on an idle H200 (at
# --mem-fraction-static 0.42 and since at 0.7, settings.SMOKE_ARGS, which plans one wave on an H100 80GB too).
SERVER_MIB = 2944


def mem_fraction(extra_args: tuple[str, ...] | list[str] = ()) -> float:
    """The --mem-fraction-static a smoke server runs with: the last one given (sglang's rule), so
    MTPMATRIX_SMOKE_EXTRA_ARGS can override SMOKE_ARGS' value."""
    value = None
    args = [*settings.SMOKE_ARGS, *extra_args]
    for i, arg in enumerate(args):
        if arg == "--mem-fraction-static" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--mem-fraction-static="):
            value = arg.split("=", 1)[1]
    return float(value)


SMOKE_MEM_FRACTION = mem_fraction()


def launch_parallelism(
    n_servers: int, free_mib: int | None, requested: int | None = None, fraction: float = SMOKE_MEM_FRACTION
) -> int:
    """How many smoke servers to launch side by side.

    ``requested`` (MTPMATRIX_SMOKE_PARALLEL) wins when set; otherwise as many as fit in the launch margin
    (``memory_parallelism``: 18 on an idle H200 with 125 GiB free (140.4 GiB in all), so the 18 default servers
    launch in one wave; 3 on a 24 GiB card), never more than there are servers, and 1 when free memory is unknown.
    """
    if requested is not None:
        return max(1, min(requested, n_servers))
    return max(1, min(n_servers, memory_parallelism(free_mib, fraction)))


def memory_parallelism(free_mib: int | None, fraction: float = SMOKE_MEM_FRACTION) -> int:
    """Smoke servers that can launch at once on GPUs with ``free_mib`` free (the least among them): each one's
    SERVER_MIB must fit in the ``fraction`` (the servers' --mem-fraction-static) x free memory that every launch
    leaves to the others; 1 when free memory is unknown."""
    if free_mib is None:
        return 1
    return max(1, int(fraction * free_mib // SERVER_MIB))


LAUNCH_BUDGET = 1.5  # issue #19: the default suite within 1.5 x one cold sglang launch measured in the same run


def launch_budget(
    runs: dict, first_wave: int, suite_seconds: float, free_mib: int | None = None, fraction: float | None = None
) -> dict:
    """The smoke suite's wall time against one cold sglang launch of the same run: the median launch of the servers
    that started together first (cold caches, side by side, as every launch of a one-wave suite is). A benchmark
    figure, printed and kept beside the server logs; no check fails on it. With the free GPU memory and the fraction
    the wave was planned from (the H100 run of 2026-12-05f launched 11 at once, and its record could not say why)."""
    # a first-wave server relaunched alone (first_attempt_error) was timed alone: not a launch of the wave
    cold = sorted(
        r.launch_seconds
        for r in list(runs.values())[:first_wave]
        if r.launch_seconds is not None and not getattr(r, "first_attempt_error", None)
    )
    median = cold[len(cold) // 2] if cold else None
    return {
        "suite_seconds": round(suite_seconds, 1),
        "servers": len(runs),
        "first_wave": first_wave,
        "gpu_free_mib": free_mib,
        "mem_fraction_static": fraction,
        "cold_launch_seconds": median,
        "cold_launches": cold,
        "limit": LAUNCH_BUDGET,
        "ratio": round(suite_seconds / median, 2) if median else None,
    }


def launch_budget_line(budget: dict) -> str:
    ratio = budget["ratio"]
    verdict = "" if ratio is None else (" (within)" if ratio <= budget["limit"] else " (OVER)")
    planned = ""
    if budget.get("gpu_free_mib") is not None and budget.get("mem_fraction_static") is not None:
        planned = f" ({budget['mem_fraction_static']} x {budget['gpu_free_mib']} MiB free / {SERVER_MIB} MiB)"
    return (
        f"[smoke] suite {budget['suite_seconds']}s for {budget['servers']} server(s), {budget['first_wave']} "
        f"launched at once{planned}; one cold launch {budget['cold_launch_seconds']}s (median of the first wave); "
        f"ratio {ratio} / limit {budget['limit']}{verdict}"
    )
