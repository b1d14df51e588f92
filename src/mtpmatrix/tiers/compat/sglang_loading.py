"""sglang's own model loader on a CPU-only machine, for the contract tier: one-rank process groups, the resolved
args published as the scheduler does, target and assistant built and their saved safetensors loaded, and a spot
check that the loaded tensors are the saved ones. Same failure semantics as ``sglang_compat`` (its docstring):
sglang's exceptions pass through, this adapter's own problems are ``AdapterError`` (harness)."""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpmatrix.serving.processes import free_port
from mtpmatrix.tiers.compat.sglang_compat import (
    AdapterError,
    Resolution,
    cpu_build_patches,
    module_exists,
    no_accelerator,
    sglang_version,
)


@dataclass
class LoadedModels:
    target: Any
    assistant: Any
    target_class: str
    assistant_class: str
    target_params: int
    assistant_params: int
    seconds: float


_DIST_READY = False


def publish_server_args(resolution: Resolution) -> None:
    """Publish the resolved args for this process as rank 0 of a one-rank world, as the scheduler process does
    before building models.

    0.5.23's ``runtime_context.publish`` takes the launcher placement (``ranks=SpawnRanks(...)``; without it every
    rank read raises); <= 0.5.17 publish via ``set_global_server_args_for_scheduler`` with no placement.
    """
    import sglang.srt.server_args as sa_mod

    rc_name = "sglang.srt.runtime_context"
    rc = importlib.import_module(rc_name) if module_exists(rc_name) else None
    publish = getattr(rc, "publish", None)
    if publish is not None and hasattr(rc, "SpawnRanks") and "ranks" in inspect.signature(publish).parameters:
        publish(resolution.server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        return
    legacy = getattr(sa_mod, "set_global_server_args_for_scheduler", None)
    if legacy is None:
        raise AdapterError(
            f"sglang {sglang_version()}: no set_global_server_args_for_scheduler and no "
            "runtime_context.publish(ranks=...)"
        )
    legacy(resolution.server_args)


def init_single_rank(resolution: Resolution, model_config=None) -> None:
    """A single-rank gloo world + TP/PP groups of size 1, and the resolved args published, as the scheduler does
    before building models. Idempotent within a process."""
    global _DIST_READY
    import sglang.srt.distributed.parallel_state as ps

    publish_server_args(resolution)
    if _DIST_READY:
        return
    ps.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{free_port()}"
    )
    # <= 0.5.17 takes the sizes as arguments; 0.5.23 reads them from the runtime context published above.
    if "tensor_model_parallel_size" in inspect.signature(ps.initialize_model_parallel).parameters:
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
    else:
        ps.initialize_model_parallel()
    # The attention-DP placement the model layers read (0.5.23: get_parallel().attn_tp_rank); the server's
    # bootstrap calls it right after the model-parallel groups. Its signature differs per release.
    dp_mod = "sglang.srt.layers.dp_attention"
    init_dp = (
        getattr(importlib.import_module(dp_mod), "initialize_dp_attention", None) if module_exists(dp_mod) else None
    )
    if init_dp is not None:
        params = inspect.signature(init_dp).parameters
        kwargs = {"server_args": resolution.server_args}
        if "model_config" in params:
            kwargs["model_config"] = model_config
        init_dp(**kwargs)
    _DIST_READY = True


def _adapter_step(fn, *args):
    """Run one step of the adapter's stand-in for the scheduler's bootstrap; a failure there is the adapter's
    (it does not set sglang up the way this release wants), so it becomes an AdapterError (harness)."""
    try:
        return fn(*args)
    except AdapterError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise AdapterError(
            f"sglang {sglang_version()}: the adapter's single-rank CPU setup ({fn.__name__}) "
            f"failed: {type(exc).__name__}: {first}"
        ) from exc


def load_models(resolution: Resolution) -> LoadedModels:
    """Build the target and assistant sglang model classes and load their safetensors with sglang's loader
    (``get_model`` with ModelConfig.from_server_args, LoadConfig('auto'), DeviceConfig('cpu'))."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    t0 = time.monotonic()
    sa = resolution.server_args
    values = resolution.values
    device = DeviceConfig("cpu")
    with cpu_build_patches():
        _adapter_step(publish_server_args, resolution)
        target_cfg = ModelConfig.from_server_args(sa)  # sglang's own config -> model-config step: a real check
        _adapter_step(init_single_rank, resolution, target_cfg)
        target = get_model(model_config=target_cfg, load_config=LoadConfig(load_format="auto"), device_config=device)
        draft_cfg = ModelConfig.from_server_args(
            sa, model_path=values["speculative_draft_model_path"], is_draft_model=True
        )
        assistant = get_model(model_config=draft_cfg, load_config=LoadConfig(load_format="auto"), device_config=device)
    return LoadedModels(
        target=target,
        assistant=assistant,
        target_class=type(target).__name__,
        assistant_class=type(assistant).__name__,
        target_params=sum(p.numel() for p in target.parameters()),
        assistant_params=sum(p.numel() for p in assistant.parameters()),
        seconds=round(time.monotonic() - t0, 3),
    )


# Signatures of "this step needs a GPU", found by trying on CPU-only machines. Matched only when there is no
# accelerator; anything else from sglang is a real failure.
_CUDA_ONLY_SIGNATURES = (
    "libcuda.so",
    "Torch not compiled with CUDA enabled",
    "Found no NVIDIA driver",
    "No CUDA GPUs are available",
    "CUDA driver initialization failed",
    "No module named 'vllm'",  # CUDA-op fallbacks that sglang imports from vllm on non-CUDA, non-CPU-engine builds
)


def cpu_blocker(exc: BaseException) -> str | None:
    """A one-line reason when ``exc`` says the step needs CUDA and this machine has none, else None.

    The reason names the release and sglang's first frame, e.g.
    "sglang 0.5.13: sglang/srt/foo.py:12 in bar requires CUDA (Torch not compiled with CUDA enabled)".
    """
    if not no_accelerator():
        return None
    from mtpmatrix.core.failures import first_library_frame

    chain, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in chain:
        text = f"{type(e).__name__}: {e}"
        sig = next((s for s in _CUDA_ONLY_SIGNATURES if s in text), None)
        if sig:
            frame = first_library_frame(e.__traceback__)[0] or first_library_frame(exc.__traceback__)[0]
            line = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            return f"sglang {sglang_version()}: {frame or 'model build'} requires CUDA ({line})"
    return None


def spot_check(model, folder: str | Path, max_tensors: int = 6) -> list[str]:
    """Compare a few saved tensors with the loaded parameters (same trailing name, same shape): proves the
    loader actually copied the checkpoint in. Returns problems as lines (empty = fine)."""
    import torch
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return [f"{folder}: no *.safetensors to compare with"]
    params = dict(model.named_parameters())
    # Gemma 4 assistants with use_ordered_embeddings: sglang reorders the tied embed/lm_head rows into centroid
    # order after loading (Gemma4AssistantForCausalLM._reorder_embedding_to_centroid_order).
    ordering = getattr(model, "token_ordering", None) if getattr(model, "use_ordered_embeddings", False) else None
    checked, problems = 0, []
    with safe_open(str(files[0]), "pt") as fh:
        keys = [
            k
            for k in fh.keys()
            if k.endswith(
                (
                    "embed_tokens.weight",
                    "q_proj.weight",
                    "pre_projection.weight",
                    "post_projection.weight",
                    "norm.weight",
                )
            )
            and "vision" not in k
            and "audio" not in k
        ]
        for key in keys:
            if checked >= max_tensors:
                break
            tail = ".".join(key.split(".")[-3:])
            saved = fh.get_tensor(key)
            candidates = [
                (n, p) for n, p in params.items() if n.endswith(tail) and tuple(p.shape) == tuple(saved.shape)
            ]
            if not candidates:
                continue
            checked += 1

            def same(p):
                loaded = p.detach().to(saved.dtype).cpu()
                if torch.equal(loaded, saved):
                    return True
                return (
                    ordering is not None
                    and key.endswith("embed_tokens.weight")
                    and torch.equal(loaded, saved[ordering.long().cpu()])
                )

            if not any(same(p) for _, p in candidates):
                problems.append(f"{key}: loaded values differ from the checkpoint ({candidates[0][0]})")
    if checked == 0:
        problems.append(f"{folder}: no saved tensor matched a loaded parameter by name and shape")
    return problems
