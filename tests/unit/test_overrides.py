"""runner/overrides.py: sglang's exact pins held under an override, what moved and why, blocking pins (a venv of
hand-written dist-info folders, shaped like the real sglang 0.5.23 row under --with torch==2.15.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpmatrix.runner import overrides as ov


def dist(sp: Path, name: str, version: str, requires=(), modules=()) -> None:
    info = sp / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    info.joinpath("RECORD").write_text("".join(f"{m}/__init__.py,,\n" for m in modules) + f"{info.name}/METADATA,,\n")


@pytest.fixture
def venv(tmp_path):
    """sglang 0.5.23's pins (torch, sglang-kernel, torchaudio exactly; torchvision unpinned) under torch 2.15.0."""
    v = tmp_path / "venv"
    sp = v / "lib" / "python3.11" / "site-packages"
    dist(
        sp,
        "sglang",
        "0.5.23",
        [
            "torch==2.14.1",
            "transformers==5.19.0",
            "sglang-kernel==0.4.10",
            "torchaudio==2.11.0",
            "torchvision",
            "sgl-deep-ep==0.1.2.post1",
            'av==16.1.0; platform_machine == "nonexistent-arch"',
            'pytest==9.0; extra == "test"',
        ],
        ["sglang"],
    )
    dist(sp, "sglang-kernel", "0.4.10", ["torch==2.14.1"], ["sgl_kernel", "triton_kernels"])
    dist(sp, "sgl-deep-ep", "0.1.2.post1", ["torch==2.14.1", "nvidia-ml-py"], ["deep_ep"])
    dist(sp, "torchaudio", "2.11.0", [], ["torchaudio"])
    dist(sp, "torchvision", "0.29.2", ["torch>=2.14.0"], ["torchvision"])
    dist(sp, "torch", "2.15.0", [], ["torch"])
    dist(sp, "transformers", "5.19.0", ["tokenizers>=0.23,<0.24", "huggingface-hub>=1.0"], ["transformers"])
    return v


def test_exact_pins_are_sglangs_for_this_platform_without_extras(venv):
    d = ov.installed(venv)
    assert d["sglang-kernel"].modules == {"sgl_kernel", "triton_kernels"}
    assert ov.exact_pins(d) == {
        "torch": "2.14.1",
        "transformers": "5.19.0",
        "sglang-kernel": "0.4.10",
        "torchaudio": "2.11.0",
        "sgl-deep-ep": "0.1.2.post1",
    }
    assert ov.exact_pins({}) == {}


def test_stranded_packages_sglang_pins_are_held_the_others_follow(venv):
    d = ov.installed(venv)
    stranded = ["sglang-kernel", "sgl-deep-ep", "torchvision"]
    assert ov.split_stranded(stranded, ov.exact_pins(d), asked=["torch"]) == (
        ["torchvision"],
        ["sgl-deep-ep", "sglang-kernel"],
    )
    # told otherwise: an override of the pinned package itself moves it
    assert ov.split_stranded(stranded, ov.exact_pins(d), asked=["torch", "sglang_kernel"]) == (
        ["sglang-kernel", "torchvision"],
        ["sgl-deep-ep"],
    )


def test_hold_records_say_who_pins_and_what_is_left_unmet(venv):
    record = {"install": {}}
    logged = []
    movable = ov.hold_sglang_pins(
        record, venv, ["torch==2.15.0", "torchaudio==2.11.1"], ["sglang-kernel", "torchvision"], log=logged.append
    )
    assert movable == ["torchvision"]
    assert record["install"]["held"] == [
        {
            "package": "sglang-kernel",
            "version": "0.4.10",
            "pinned_by": "sglang 0.5.23",
            "requires": ["torch==2.14.1"],
            "why": "kept at sglang's exact pin; its own requirement torch==2.14.1 is left unmet by torch==2.15.0",
        }
    ]
    assert logged == [
        "sglang-kernel 0.4.10 kept at sglang's exact pin; its own requirement torch==2.14.1 is left "
        "unmet by torch==2.15.0"
    ]


def test_moved_says_why_for_each_package_nobody_asked_for(venv):
    baseline = {
        "torch": "2.14.1",
        "torchvision": "0.29.2",
        "sglang-kernel": "0.4.10",
        "nvidia-ml-py": "13.0",
        "gone": "1.0",
        "gemma4-mtp-matrix": "0.1",
        "tokenizers": "0.22.2",
        "huggingface-hub": "1.3",
    }
    now = {
        "torch": "2.15.0",
        "torchvision": "0.30.0",
        "sglang-kernel": "0.4.10",
        "nvidia-ml-py": "13.2",
        "gemma4-mtp-matrix": "0.2",
        "tokenizers": "0.23.3",
        "huggingface-hub": "2.4",
    }
    got = ov.moved(baseline, now, asked=["torch"], companions=["torchvision==0.30.0"], dists=ov.installed(venv))
    assert got == [
        {"package": "gone", "from": "1.0", "to": None, "why": "re-resolved by uv under the override"},
        {
            "package": "huggingface-hub",
            "from": "1.3",
            "to": "2.4",  # 1.3 satisfies transformers: no culprit named
            "why": "re-resolved by uv under the override; required by transformers",
        },
        {
            "package": "nvidia-ml-py",
            "from": "13.0",
            "to": "13.2",
            "why": "re-resolved by uv under the override; required by sgl-deep-ep",
        },
        {
            "package": "tokenizers",
            "from": "0.22.2",
            "to": "0.23.3",
            "why": "re-resolved by uv under the override: transformers 5.19.0 requires tokenizers<0.24,>=0.23, which "
            "0.22.2 does not satisfy",
        },
        {"package": "torch", "from": "2.14.1", "to": "2.15.0", "why": "asked for"},
        {
            "package": "torchvision",
            "from": "0.29.2",
            "to": "0.30.0",
            "why": "companion: follows the override (its own requirement on the overridden package)",
        },
    ]


TORCHAUDIO_IMPORT = {  # the failure the 0.5.23 row showed under --with torch==2.15.0 (results/before-torch215)
    "kind": "import",
    "type": "RuntimeError",
    "message": "Detected that PyTorch and TorchAudio were compiled with different CUDA versions. PyTorch has CUDA "
    "version 13.2 whereas TorchAudio has CUDA version 13.0. Please install the TorchAudio version that "
    "matches your PyTorch version.",
    "frame": "sglang/__init__.py:23 in <module>",
    "raised_at": "torchaudio/_extension/utils.py:124 in _check_cuda_version",
}


def tiers(*failures):
    return {
        "contract": {
            "verdict": "failed",
            "checks": [
                {"id": f"tests/tiers/test_contract.py::check{i}", "outcome": "failed", "failure": f}
                for i, f in enumerate(failures)
            ]
            + [{"id": "ok", "outcome": "passed"}],
        }
    }


def test_a_pinned_companion_named_by_a_failure_is_a_blocking_pin(venv):
    d = ov.installed(venv)
    got = ov.blocking_pins(
        tiers(TORCHAUDIO_IMPORT), ov.exact_pins(d), moved_names=["torch"], dists=d, pinner_version="0.5.23"
    )
    assert [(b["package"], b["version"], b["pinned_by"], b["kind"]) for b in got] == [
        ("torchaudio", "2.11.0", "sglang 0.5.23", "import")
    ]
    assert got[0]["check"] == "tests/tiers/test_contract.py::check0"


def test_blocking_pins_go_by_import_names_and_never_blame_the_packages_under_test(venv):
    d = ov.installed(venv)
    abi = {
        "kind": "abi",
        "message": "torch 2.15.0 does not define 1 symbol(s) that 2 native libraries need: "
        "c10::x -- needed by sgl_kernel/flash_ops.abi3.so (1)",
        "raised_at": None,
    }
    sglang_frame = {
        "kind": "import",
        "message": "No module named 'sglang.srt.x'",
        "frame": "sglang/srt/models/gemma4_mtp.py:3 in <module>",
        "raised_at": "torch/__init__.py:1",
    }
    got = ov.blocking_pins(tiers(abi, sglang_frame), ov.exact_pins(d), moved_names=["torch"], dists=d)
    assert [b["package"] for b in got] == ["sglang-kernel"]  # by its module sgl_kernel; torch/sglang never
    # a package that the override itself moved is the upgrade under test, not a blocking pin
    assert ov.blocking_pins(tiers(abi), ov.exact_pins(d), moved_names=["torch", "sglang-kernel"], dists=d) == []
    # passing checks, and words that merely contain a module name, name nothing
    for text in ("mytorchaudio failed", "torchaudiox failed"):
        near = {"kind": "import", "message": text, "raised_at": None}
        assert ov.blocking_pins(tiers(near), ov.exact_pins(d), moved_names=["torch"], dists=d) == []
