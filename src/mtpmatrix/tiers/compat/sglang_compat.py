"""A small compatibility layer over sglang releases (0.5.13 .. 0.5.23) for the contract tier.

What the contract tier asks of sglang, on a CPU-only machine:

  * ``import_chain()``        the modules of the Gemma 4 MTP path import (MTP_IMPORT_CHAIN);
  * ``load_config(path)``     sglang's own config loader reads a target / assistant folder;
  * ``resolve_server_args()`` the server's own argparse + ServerArgs resolution turns the seed command line into
                              the values the MTP path needs (FROZEN_KV_MTP, topk, steps, draft tokens, triton);
  * ``require_resolution()``  the one resolved-args check (kind 'args'), also run by the smoke and gsm8k tiers on
                              a live server's /server_info (``check_served_args``, which needs no sglang import);
  * ``spec_worker_class()``   sglang's own dispatch picks the Frozen-KV MTP worker for the resolved args;
  * ``sglang_loading.load_models()``  sglang's model loader builds the target and assistant classes and loads the
                              saved safetensors on the CPU (single-rank gloo groups; its own module).

API differences found between releases (all handled by capability checks, never by version numbers):

  * Frozen-KV worker module: 0.5.13 ships ``frozen_kv_mtp_worker`` (what ``create_worker`` returns there, overlap
    off) *and* ``frozen_kv_mtp_worker_v2``; 0.5.17 and 0.5.23 ship only ``frozen_kv_mtp_worker_v2``.
  * ServerArgs resolution: <= 0.5.17 resolves in the dataclass ``__post_init__`` (i.e. inside ``from_cli_args``);
    0.5.23's ``__post_init__`` does nothing, resolution is ``resolve_once()`` and the values are ``resolved_dict()``
    (the record itself keeps the operator's raw input).
  * ``get_global_server_args``: <= 0.5.17 reads the published args; 0.5.23 retired it (publish still exists).
  * ``initialize_model_parallel``: <= 0.5.17 takes ``tensor_model_parallel_size``...; 0.5.23 takes the sizes from
    the published runtime context (keyword ``backend`` first).

Failure semantics: an exception raised inside sglang (or transformers / torch) is let through unchanged, so
``mtpmatrix.core.failures.classify`` files it under the test's declared check with sglang's first frame. Anything that is
this adapter's own problem (an sglang API it does not know, an unexpected return shape) is raised as
``AdapterError`` from adapter code with no library frame in its traceback: it classifies as ``harness``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpmatrix.core import settings
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.serving import environment


class AdapterError(RuntimeError):
    """This adapter does not know how to drive the installed sglang: a harness problem, never an sglang break."""


# --------------------------------------------------------------------------------------------- import chain


@dataclass(frozen=True)
class ImportStep:
    """One link of the MTP import chain. With several ``alternatives`` (a module renamed across releases) every
    alternative the release *has* must import, and at least one must exist."""

    role: str
    alternatives: tuple[str, ...]

    @property
    def id(self) -> str:
        return self.alternatives[0].rsplit(".", 1)[-1]


MTP_IMPORT_CHAIN: tuple[ImportStep, ...] = (
    # gemma4_causal first: it pulls in most of sglang (layers, kernels, distributed) and dominates the import time.
    ImportStep("Gemma 4 text model (target trunk)", ("sglang.srt.models.gemma4_causal",)),
    ImportStep("Gemma 4 multimodal model (target)", ("sglang.srt.models.gemma4_mm",)),
    ImportStep("Gemma 4 MTP assistant model (draft)", ("sglang.srt.models.gemma4_mtp",)),
    ImportStep(
        "Frozen-KV MTP worker",
        ("sglang.srt.speculative.frozen_kv_mtp_worker_v2", "sglang.srt.speculative.frozen_kv_mtp_worker"),
    ),
    ImportStep("Frozen-KV MTP CUDA-graph runner", ("sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner",)),
    ImportStep("triton attention backend", ("sglang.srt.layers.attention.triton_backend",)),
    ImportStep("server entrypoint", ("sglang.launch_server",)),
    ImportStep("HTTP server", ("sglang.srt.entrypoints.http_server",)),
)


def module_exists(name: str) -> bool:
    """Whether this sglang has module ``name``. Unlike environment.has_module, a parent package that fails to import
    for another reason raises: that is sglang's own error, to be classified with its frame, not a missing module."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def import_step(step: ImportStep) -> list[str]:
    """Import every alternative of ``step`` that this release has; return their names.

    A missing step raises ModuleNotFoundError naming the module(s) (classified ``import``); an alternative that
    exists but fails to import lets sglang's own exception through.
    """
    present = [m for m in step.alternatives if module_exists(m)]
    if not present:
        names = " or ".join(step.alternatives)
        raise ModuleNotFoundError(
            f"{step.role}: sglang {sglang_version()} has no module {names}", name=step.alternatives[0]
        )
    for name in present:
        importlib.import_module(name)
    return present


@dataclass
class ImportResult:
    modules: dict[str, list[str]] = field(default_factory=dict)  # step id -> imported modules
    errors: dict[str, BaseException] = field(default_factory=dict)  # step id -> the exception, to re-raise
    seconds: dict[str, float] = field(default_factory=dict)


def import_chain(chain: tuple[ImportStep, ...] = MTP_IMPORT_CHAIN) -> ImportResult:
    """Import the whole chain once, recording each step's modules or exception (nothing is raised here)."""
    result = ImportResult()
    for step in chain:
        t0 = time.monotonic()
        try:
            result.modules[step.id] = import_step(step)
        except Exception as exc:  # noqa: BLE001 - kept for the step's test to re-raise with sglang's frames
            result.errors[step.id] = exc
        result.seconds[step.id] = round(time.monotonic() - t0, 3)
    return result


def sglang_version() -> str:
    return environment.version_of("sglang") or "?"


# Flags a release renamed: (the spelling the suite writes, the first release known to spell it otherwise, that
# spelling). sglang 0.5.23 split --cuda-graph-max-bs into --cuda-graph-max-bs-decode and -prefill
# (arg_groups/cuda_graph_hook.py) and its parser refuses the old spelling as ambiguous, so every smoke server failed
# to launch there. 0.5.18-0.5.22 are not read here: test_contract's test_smoke_server_args parses every smoke
# server's command line with the row's own parser, so a release that renamed it earlier fails there, on CPU.
RENAMED_FLAGS = (("--cuda-graph-max-bs", "0.5.23", "--cuda-graph-max-bs-decode"),)


def spelled_for_release(argv: list[str], version: str | None = None) -> list[str]:
    """``argv`` with each RENAMED_FLAGS flag spelled as ``version`` (default: the installed sglang) spells it."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version or sglang_version())
    except InvalidVersion:
        return list(argv)
    # by release number: a 0.5.23 pre-release or dev build already has the new spelling
    renames = {old: new for old, since, new in RENAMED_FLAGS if release.release >= Version(since).release}

    def spelled(arg: str) -> str:
        flag, eq, value = arg.partition("=")
        return renames.get(flag, flag) + eq + value if flag in renames else arg

    return [spelled(a) for a in argv]


def flag_fields(argv: list[str]) -> dict[str, Any]:
    """What each ``--flag [value]`` of ``argv`` asks ServerArgs to resolve: its field and value (True for a bare
    flag, an int where the value is one)."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        value: Any = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        out[arg[2:].replace("-", "_")] = value
    return out


# --------------------------------------------------------------------------------------------- CPU


def no_accelerator() -> bool:
    """True when torch sees no CUDA device (torch's own availability probe; no CUDA context is created)."""
    return environment.gpu_count() == 0


# Why not sglang's own CPU engine (SGLANG_USE_CPU_ENGINE=1)? Tried: with the CUDA build of sgl-kernel that the rows
# install, the CPU engine makes ``sglang.srt.mem_cache.memory_pool`` import ``sgl_kernel`` CPU ops at import time,
# which fails ("libcuda.so.1: cannot open shared object file"): the whole import chain would break on CPU.


@contextlib.contextmanager
def cpu_build_patches():
    """CPU-only patches for *building* the model classes on a machine without a GPU. The server never does this.

    * ``sglang.srt.layers.rotary_embedding.base._is_cpu`` -> True while models are built: without CUDA the
      RotaryEmbedding constructor takes a "fallback kernel" branch that imports ``vllm._custom_ops`` (not
      installed, and a CUDA op anyway). On a GPU that branch uses sglang's own CUDA rope kernel (and real
      Gemma 4 head dims, 256/512, skip it); the flag only makes the constructor keep the pure-torch rotary path,
      which is all a weights-loading check needs (no forward pass runs here).
    Each patch is undone on exit; a patch target that this release lacks is skipped (nothing to patch).
    """
    patched: list[tuple[Any, str, Any]] = []
    try:
        for mod_name, attr, value in (("sglang.srt.layers.rotary_embedding.base", "_is_cpu", True),):
            if not module_exists(mod_name):
                continue
            mod = importlib.import_module(mod_name)
            if hasattr(mod, attr):
                patched.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value)
        yield [f"{m.__name__}.{a}" for m, a, _ in patched]
    finally:
        for mod, attr, old in reversed(patched):
            setattr(mod, attr, old)


# --------------------------------------------------------------------------------------------- config


def load_config(path: str | Path, trust_remote_code: bool = False):
    """sglang's own config loader (``get_config``) on a model folder; sglang's exceptions pass through."""
    get_config = _get_config_fn()
    return get_config(str(path), trust_remote_code=trust_remote_code)


def _get_config_fn():
    for mod in ("sglang.srt.utils.hf_transformers_utils", "sglang.srt.utils.hf_transformers"):
        if module_exists(mod):
            fn = getattr(importlib.import_module(mod), "get_config", None)
            if fn is not None:
                return fn
    raise AdapterError(
        f"sglang {sglang_version()}: no get_config in sglang.srt.utils.hf_transformers[_utils]; "
        "the adapter needs the new config loader's location"
    )


def resolve_model_class(architectures: list[str] | None):
    """(class, architecture) from sglang's ModelRegistry: which sglang model class serves this config."""
    from sglang.srt.models.registry import ModelRegistry

    if not hasattr(ModelRegistry, "resolve_model_cls"):
        raise AdapterError(f"sglang {sglang_version()}: ModelRegistry has no resolve_model_cls")
    return ModelRegistry.resolve_model_cls(list(architectures or []))


def text_config(cfg):
    return getattr(cfg, "text_config", None) or cfg


# --------------------------------------------------------------------------------------------- server args


@dataclass
class Resolution:
    server_args: Any  # sglang's ServerArgs object (resolved)
    values: dict[str, Any]  # the resolved values, plain
    argv: list[str]  # the command line that was parsed (seed + CPU additions)
    added: list[str]  # what this adapter added for CPU (documented in resolve())
    mode: str  # "post_init" (<= 0.5.17) or "resolve_once" (0.5.23+)


def cpu_args(argv: list[str]) -> list[str]:
    """Arguments a CPU-only machine needs on top of the seed command line.

    No accelerator: sglang's default-device probe (``get_device()``) raises "No accelerator ... available", so
    ``--device cpu`` is added, as a user on a CPU box would. The attention backend stays the seed's ``triton``.
    """
    if "--device" in argv or any(a.startswith("--device=") for a in argv) or not no_accelerator():
        return []
    return ["--device", "cpu"]


@contextlib.contextmanager
def _keep_root_logging():
    """sglang's prepare_server_args calls logging.basicConfig(force=True), which would drop pytest's capture
    handlers; restore the root logger afterwards (the server process itself keeps sglang's configuration)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def parse_server_args(argv: list[str]):
    """The server's own parsing: ``prepare_server_args`` where the release has it (argparse with
    ServerArgs.add_cli_args, the release's CLI compat shims, ServerArgs.from_cli_args), else the two calls.

    An argument sglang's parser rejects is a CheckFailure('args') carrying argparse's message.
    """
    import sglang.srt.server_args as sa_mod

    ServerArgs = getattr(sa_mod, "ServerArgs", None)
    if ServerArgs is None:
        raise AdapterError(f"sglang {sglang_version()}: sglang.srt.server_args has no ServerArgs")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), _keep_root_logging():
            if hasattr(sa_mod, "prepare_server_args"):
                return sa_mod.prepare_server_args(list(argv))
            if not (hasattr(ServerArgs, "add_cli_args") and hasattr(ServerArgs, "from_cli_args")):
                raise AdapterError(
                    f"sglang {sglang_version()}: ServerArgs has neither prepare_server_args nor "
                    "add_cli_args/from_cli_args"
                )
            parser = argparse.ArgumentParser(prog="sglang serve")
            ServerArgs.add_cli_args(parser)
            return ServerArgs.from_cli_args(parser.parse_args(list(argv)))
    except SystemExit as exc:  # argparse rejects the command line with exit(2)
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise CheckFailure(
            "args",
            f"sglang's argument parser rejected the command line (exit {exc.code}): "
            + (lines[-1] if lines else "no message"),
        ) from None


def _plain_fields(server_args) -> dict[str, Any]:
    if dataclasses.is_dataclass(server_args):
        return {f.name: getattr(server_args, f.name) for f in dataclasses.fields(server_args)}
    try:  # msgspec Structs (0.5.23's record type) and anything else with __struct_fields__
        return {name: getattr(server_args, name) for name in type(server_args).__struct_fields__}
    except AttributeError:
        raise AdapterError(
            f"sglang {sglang_version()}: ServerArgs is neither a dataclass nor a Struct and has "
            "no resolved_dict(); the adapter cannot read resolved values"
        ) from None


def resolve(argv: list[str]) -> Resolution:
    """Parse ``argv`` as ``sglang.launch_server`` would and run ServerArgs resolution.

    Exceptions from sglang's parsing / resolution pass through (classified 'args' by the test's check marker).
    """
    added = cpu_args(argv)
    full = list(argv) + added
    server_args = parse_server_args(full)
    if hasattr(server_args, "resolve_once"):  # 0.5.23+: construction leaves the record unresolved
        server_args.resolve_once()
        if not hasattr(server_args, "resolved_dict"):
            raise AdapterError(f"sglang {sglang_version()}: ServerArgs has resolve_once() but no resolved_dict()")
        values, mode = server_args.resolved_dict(), "resolve_once"
    else:  # <= 0.5.17: __post_init__ resolved everything inside from_cli_args
        values, mode = _plain_fields(server_args), "post_init"
    values = {k: _plain_value(v) for k, v in values.items()}
    return Resolution(server_args=server_args, values=values, argv=full, added=added, mode=mode)


def _plain_value(v):
    name = getattr(v, "name", None)
    if name is not None and type(v).__module__.startswith("sglang") and hasattr(type(v), "__members__"):
        return name  # enums (e.g. SpeculativeAlgorithm) -> their name
    return v


def resolve_server_args(argv: list[str]) -> dict[str, Any]:
    """The resolved ServerArgs values for a ``sglang.launch_server`` command line, as a plain dict."""
    return resolve(argv).values


def check_resolution(
    values: dict[str, Any], expected: dict[str, Any], missing: str = "not among the resolved ServerArgs fields"
) -> list[str]:
    """Differences between resolved ``values`` and ``expected`` (settings.expected_resolution), as lines; a key
    absent from ``values`` is reported with ``missing``."""
    out = []
    for key, want in expected.items():
        if key not in values:
            out.append(f"{key}: {missing}")
            continue
        got = values[key]
        if str(got).upper() != str(want).upper() if isinstance(want, str) else got != want:
            out.append(f"{key}: resolved {got!r}, expected {want!r}")
    return out


def require_resolution(
    values: dict[str, Any],
    expected: dict[str, Any],
    *,
    more: Iterable[str] = (),
    missing: str = "not among the resolved ServerArgs fields",
    where: str = "",
) -> None:
    """The resolved-args check of every tier (contract: ServerArgs resolved here; smoke and gsm8k: a live server's
    /server_info): raise CheckFailure('args') naming each difference from ``expected`` and each of ``more``."""
    problems = check_resolution(values, expected, missing) + list(more)
    if problems:
        raise CheckFailure("args", "; ".join(f"{where}{p}" for p in problems))


_ABSENT = object()


def check_served_args(info: dict, topk: int, record_property) -> None:
    """A live MTP server resolved settings.expected_resolution(topk) per its /server_info, with CUDA graphs on
    (smoke and gsm8k tiers). Records what it resolved as ``resolved`` (None where /server_info lacks a key)."""
    from mtpmatrix.serving.client import cuda_graph_disabled, find_arg

    if topk not in settings.DRAFT_TOKENS:  # a --server-url deployment may run any topk
        raise CheckFailure(
            "args",
            f"server runs speculative_eagle_topk={topk}; the seed suite covers {', '.join(map(str, settings.TOPKS))}",
        )
    want = settings.expected_resolution(topk)
    got = {k: find_arg(info, k, _ABSENT) for k in want}
    record_property("resolved", json.dumps({k: None if v is _ABSENT else v for k, v in got.items()}))
    disabled = cuda_graph_disabled(info)
    cuda = [] if disabled is False else [f"CUDA graph not on per /server_info (disabled={disabled})"]
    require_resolution(
        {k: v for k, v in got.items() if v is not _ABSENT},
        want,
        more=cuda,
        missing="not in /server_info",
        where="/server_info ",
    )


def spec_worker_class(resolution: Resolution):
    """The worker class sglang's own dispatch (SpeculativeAlgorithm.create_worker) picks for the resolved args."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string(resolution.values["speculative_algorithm"])
    if not hasattr(algo, "create_worker"):
        raise AdapterError(f"sglang {sglang_version()}: SpeculativeAlgorithm has no create_worker")
    return algo.create_worker(resolution.server_args)
