"""mtpmatrix.tiers.compat.sglang_compat, pure-python parts: no sglang needed (stub modules stand in for sglang's API shapes)."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import types

import pytest

from mtpmatrix.core import settings
from mtpmatrix.core.failures import classify
from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.tiers.compat import sglang_compat as compat
from mtpmatrix.tiers.compat import sglang_loading


def _raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("expected an exception")


# ------------------------------------------------------------------------------------------------ import chain


def test_chain_names_the_mtp_path():
    ids = [s.id for s in compat.MTP_IMPORT_CHAIN]
    assert len(ids) == len(set(ids))
    mods = {m for s in compat.MTP_IMPORT_CHAIN for m in s.alternatives}
    for needed in (
        "sglang.srt.models.gemma4_causal",
        "sglang.srt.models.gemma4_mm",
        "sglang.srt.models.gemma4_mtp",
        "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner",
        "sglang.launch_server",
        "sglang.srt.entrypoints.http_server",
        "sglang.srt.layers.attention.triton_backend",
    ):
        assert needed in mods
    worker = next(s for s in compat.MTP_IMPORT_CHAIN if "frozen_kv_mtp_worker" in s.alternatives[0])
    assert set(worker.alternatives) == {
        "sglang.srt.speculative.frozen_kv_mtp_worker_v2",
        "sglang.srt.speculative.frozen_kv_mtp_worker",
    }


def test_one_of_step_imports_what_exists():
    step = compat.ImportStep("demo", ("mtpmatrix_no_such_pkg.renamed", "json"))
    assert compat.import_step(step) == ["json"]


def test_missing_step_is_an_import_failure_naming_the_module():
    step = compat.ImportStep(
        "Frozen-KV MTP worker", ("mtpmatrix_no_such_pkg.worker_v2", "mtpmatrix_no_such_pkg.worker")
    )
    exc = _raised(compat.import_step, step)
    assert isinstance(exc, ModuleNotFoundError)
    assert "mtpmatrix_no_such_pkg.worker_v2 or mtpmatrix_no_such_pkg.worker" in str(exc)
    assert classify(exc, "import").kind == "import"


def test_import_chain_collects_errors_without_raising():
    chain = (compat.ImportStep("ok", ("json",)), compat.ImportStep("gone", ("mtpmatrix_no_such_pkg.gone",)))
    result = compat.import_chain(chain)
    assert result.modules == {"json": ["json"]}
    assert set(result.errors) == {"gone"} and isinstance(result.errors["gone"], ModuleNotFoundError)
    assert set(result.seconds) == {"json", "gone"}


def test_existing_module_that_breaks_lets_its_error_through(tmp_path, monkeypatch):
    (tmp_path / "mtpmatrix_broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    exc = _raised(compat.import_step, compat.ImportStep("broken", ("mtpmatrix_broken_mod",)))
    assert isinstance(exc, RuntimeError) and "boom at import" in str(exc)
    sys.modules.pop("mtpmatrix_broken_mod", None)


# ------------------------------------------------------------------------------------------------ resolution


def test_check_resolution_against_settings():
    for topk in settings.TOPKS:
        want = settings.expected_resolution(topk)
        assert compat.check_resolution(dict(want), want) == []
        assert compat.check_resolution({**want, "speculative_algorithm": "frozen_kv_mtp"}, want) == []
    want = settings.expected_resolution(3)
    bad = {**want, "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 6}
    del bad["speculative_num_steps"]
    lines = compat.check_resolution(bad, want)
    assert any("speculative_algorithm: resolved 'EAGLE'" in ln for ln in lines)
    assert any("speculative_num_draft_tokens: resolved 6, expected 12" in ln for ln in lines)
    assert any("speculative_num_steps: not among" in ln for ln in lines)


def test_require_resolution_is_one_args_failure_naming_every_difference():
    want = settings.expected_resolution(1)
    compat.require_resolution(dict(want), want)  # nothing to say
    exc = _raised(
        compat.require_resolution,
        {**want, "speculative_eagle_topk": 3},
        want,
        more=["attention_backend: resolved 'fa3', expected 'triton'"],
    )
    assert isinstance(exc, CheckFailure) and exc.kind == "args"
    assert str(exc) == (
        "speculative_eagle_topk: resolved 3, expected 1; attention_backend: resolved 'fa3', expected 'triton'"
    )


def _served_info(topk, **extra):
    return {**settings.expected_resolution(topk), "disable_cuda_graph": False, **extra}


@pytest.mark.parametrize(
    "info, topk, words",
    [
        (_served_info(1), 1, None),
        ({"server_args": _served_info(3)}, 3, None),  # nested, as 0.5.23 answers
        (
            _served_info(1, speculative_num_draft_tokens=4),
            1,
            "/server_info speculative_num_draft_tokens: resolved 4, expected 6",
        ),
        (
            {k: v for k, v in _served_info(1).items() if k != "speculative_num_steps"},
            1,
            "/server_info speculative_num_steps: not in /server_info",
        ),
        (_served_info(1, disable_cuda_graph=True), 1, "CUDA graph not on per /server_info (disabled=True)"),
        ({k: v for k, v in _served_info(1).items() if k != "disable_cuda_graph"}, 1, "(disabled=None)"),
        (_served_info(1, speculative_eagle_topk=2), 2, "speculative_eagle_topk=2; the seed suite covers 1, 3"),
    ],
)
def test_check_served_args(info, topk, words):
    recorded = {}
    exc = None
    try:
        compat.check_served_args(info, topk, lambda k, v: recorded.__setitem__(k, v))
    except CheckFailure as e:
        exc = e
    if words is None:
        assert exc is None and json.loads(recorded["resolved"]) == settings.expected_resolution(topk)
    else:
        assert exc is not None and exc.kind == "args" and words in str(exc), exc


def test_cpu_args(monkeypatch):
    monkeypatch.setattr(compat, "no_accelerator", lambda: True)
    assert compat.cpu_args(["--model-path", "x"]) == ["--device", "cpu"]
    assert compat.cpu_args(["--device", "cuda"]) == []
    assert compat.cpu_args(["--device=cpu"]) == []
    monkeypatch.setattr(compat, "no_accelerator", lambda: False)
    assert compat.cpu_args(["--model-path", "x"]) == []


class _Algo(enum.Enum):
    FROZEN_KV_MTP = 1


_Algo.__module__ = "sglang.srt.speculative.spec_info"


def test_enum_values_become_names():
    assert compat._plain_value(_Algo.FROZEN_KV_MTP) == "FROZEN_KV_MTP"
    assert compat._plain_value(5) == 5


def _fake_server_args_module(monkeypatch, *, post_init_resolves: bool, with_prepare: bool = False):
    """Stub ``sglang.srt.server_args`` in the two shapes found: <=0.5.17 (resolve in __post_init__) and 0.5.23
    (resolve_once + resolved_dict)."""

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str = ""
        speculative_algorithm: str | None = None
        device: str | None = None

        def __post_init__(self):
            if post_init_resolves and self.speculative_algorithm == "NEXTN":
                self.speculative_algorithm = "FROZEN_KV_MTP"

        @staticmethod
        def add_cli_args(parser):
            parser.add_argument("--model-path", dest="model_path", required=True)
            parser.add_argument("--speculative-algorithm", dest="speculative_algorithm")
            parser.add_argument("--device", dest="device")

        @classmethod
        def from_cli_args(cls, args):
            return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    if not post_init_resolves:

        def resolve_once(self):
            self._resolved = {**dataclasses.asdict(self), "speculative_algorithm": "FROZEN_KV_MTP"}

        ServerArgs.resolve_once = resolve_once
        ServerArgs.resolved_dict = lambda self: dict(self._resolved)

    mod = types.ModuleType("sglang.srt.server_args")
    mod.ServerArgs = ServerArgs
    if with_prepare:

        def prepare_server_args(argv):
            parser = argparse.ArgumentParser(prog="sglang serve")
            ServerArgs.add_cli_args(parser)
            import logging

            logging.basicConfig(level=logging.INFO, force=True)  # what sglang does
            return ServerArgs.from_cli_args(parser.parse_args(argv))

        mod.prepare_server_args = prepare_server_args
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", mod)
    monkeypatch.setattr(compat, "no_accelerator", lambda: True)
    return ServerArgs


@pytest.mark.parametrize("shape", ["post_init", "resolve_once", "prepare"])
def test_resolve_both_api_shapes(monkeypatch, shape):
    _fake_server_args_module(monkeypatch, post_init_resolves=shape != "resolve_once", with_prepare=shape == "prepare")
    import logging

    handlers = logging.getLogger().handlers[:]
    res = compat.resolve(["--model-path", "m", "--speculative-algorithm", "NEXTN"])
    assert logging.getLogger().handlers == handlers  # prepare_server_args' basicConfig(force=True) is undone
    assert res.values["speculative_algorithm"] == "FROZEN_KV_MTP"
    assert res.values["device"] == "cpu" and res.added == ["--device", "cpu"]
    assert res.mode == ("resolve_once" if shape == "resolve_once" else "post_init")
    assert compat.resolve_server_args(["--model-path", "m"])["model_path"] == "m"


def test_argparse_rejection_is_an_args_failure(monkeypatch):
    _fake_server_args_module(monkeypatch, post_init_resolves=True)
    exc = _raised(compat.resolve, ["--model-path", "m", "--no-such-flag"])
    assert isinstance(exc, CheckFailure) and exc.kind == "args"
    assert "unrecognized arguments: --no-such-flag" in str(exc)


def test_unknown_api_is_a_harness_failure(monkeypatch):
    mod = types.ModuleType("sglang.srt.server_args")  # no ServerArgs at all
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", mod)
    exc = _raised(compat.parse_server_args, ["--model-path", "m"])
    assert isinstance(exc, compat.AdapterError)
    assert classify(exc, "args").kind == "harness"
    assert classify(_raised(compat._plain_fields, object()), "args").kind == "harness"


# ------------------------------------------------------------------------------------------------ CPU blockers


def test_cpu_blocker_only_for_cuda_signatures(monkeypatch):
    monkeypatch.setattr(sglang_loading, "no_accelerator", lambda: True)
    try:
        try:
            raise ModuleNotFoundError("No module named 'vllm'")
        except ModuleNotFoundError as inner:
            raise RuntimeError("build failed") from inner
    except RuntimeError as exc:
        reason = sglang_loading.cpu_blocker(exc)
    assert reason and "requires CUDA" in reason and "vllm" in reason and reason.startswith("sglang ")
    assert sglang_loading.cpu_blocker(ValueError("shape mismatch in qkv_proj")) is None
    monkeypatch.setattr(sglang_loading, "no_accelerator", lambda: False)
    assert sglang_loading.cpu_blocker(RuntimeError("Torch not compiled with CUDA enabled")) is None
