"""core/failures.py: failure kinds (declared, import, harness, library crash with its first frame) and uv install output.

The uv fixtures under data/uv/ are real uv 0.13 outputs, captured through a pipe as run_row captures them:
  conflict.txt     uv pip install --dry-run --python <0.5.17 venv> "sglang==0.5.17" "transformers==5.8.1"
  unreachable.txt  UV_INDEX_URL=http://127.0.0.1:9/simple uv pip install --no-cache --dry-run six==1.16.0 --python ..
"""

from __future__ import annotations

import importlib.util
import itertools
import textwrap
from pathlib import Path

import pytest

from mtpmatrix.core.failures import classify, classify_install, first_library_frame
from mtpmatrix.core.kinds import KINDS, CheckFailure

UV = Path(__file__).parent / "data" / "uv"
_counter = itertools.count()


def raised(fn, *args):
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def fake_library_module(tmp_path: Path, source: str, package: str = "sglang"):
    """A module living at <tmp>/site-packages/<package>/srt/fake_mod.py, imported under a unique name."""
    d = tmp_path / "lib" / "python3.11" / "site-packages" / package / "srt"
    d.mkdir(parents=True)
    f = d / "fake_mod.py"
    f.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"_mtp_fake_{next(_counter)}", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, f


def test_check_failure_kind_wins():
    def check():
        raise CheckFailure("acceptance", "accept length 1.02 < 1.5\nsecond line")

    rec = classify(raised(check), default_kind="args")
    assert rec.kind == "acceptance"
    assert rec.type == "CheckFailure"
    assert rec.message == "accept length 1.02 < 1.5"  # first line only
    assert rec.frame is None  # never touched a library
    assert rec.raised_at.startswith(f"{__file__.replace(chr(92), '/')}:") and rec.raised_at.endswith("in check")


def test_check_failure_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown failure kind"):
        CheckFailure("flaky", "x")


def test_import_error_is_import_wherever_it_comes_from():
    def imp():
        import mtpmatrix_no_such_module  # noqa: F401

    rec = classify(raised(imp), default_kind="args")
    assert (rec.kind, rec.type) == ("import", "ModuleNotFoundError")
    assert "mtpmatrix_no_such_module" in rec.message


def test_assertion_in_our_code_without_declared_kind_is_harness():
    def ours():
        assert 1 + 1 == 3, "the harness computed something wrong"

    rec = classify(raised(ours))
    assert rec.kind == "harness" and rec.type == "AssertionError" and rec.frame is None


def test_assertion_in_our_code_is_harness_whatever_the_check_declares():
    """README: a failure raised in this project's own code is ``harness``; only a CheckFailure states another kind
    (a check that found a break says so with CheckFailure, never with a bare assert)."""

    def ours():
        assert 1 + 1 == 3, "args resolved to EAGLE"

    rec = classify(raised(ours), default_kind="args")
    assert (rec.kind, rec.type) == ("harness", "AssertionError")


def test_our_callback_raising_inside_a_library_call_is_harness(tmp_path):
    """sglang calling back into this project's code (a stand-in sampler, an adapter hook) that raises: the bug is
    ours, though the traceback passes through sglang."""
    mod, _ = fake_library_module(
        tmp_path,
        """
        def run(callback):
            return callback()
    """,
    )

    def our_callback():
        return {}["prompt"]

    rec = classify(raised(mod.run, our_callback), default_kind="weights")
    assert rec.kind == "harness" and rec.frame == "sglang/srt/fake_mod.py:3 in run"


def test_other_exception_in_our_code_is_harness_even_with_declared_kind():
    def ours():
        return {}["missing"]

    rec = classify(raised(ours), default_kind="crash")
    assert (rec.kind, rec.type, rec.message) == ("harness", "KeyError", "'missing'")


def test_empty_message_falls_back_to_type_name():
    def ours():
        raise RuntimeError()

    assert classify(raised(ours)).message == "RuntimeError"


def test_exception_inside_library_records_first_library_frame(tmp_path):
    mod, path = fake_library_module(
        tmp_path,
        """
        def outer():
            return inner()


        def inner():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    """,
    )

    def our_check():
        mod.outer()

    exc = raised(our_check)
    rec = classify(exc)
    assert rec.kind == "crash"  # touched sglang, no declared kind
    assert rec.frame == "sglang/srt/fake_mod.py:3 in outer"  # the FIRST frame inside the library
    assert rec.raised_at == "sglang/srt/fake_mod.py:7 in inner"  # the innermost one
    assert rec.message.startswith("CUDA error")
    frame, innermost, in_library = first_library_frame(exc.__traceback__)
    assert (frame, innermost, in_library) == (rec.frame, rec.raised_at, True)
    # a declared kind wins over the 'crash' default
    assert classify(exc, default_kind="weights").kind == "weights"


def test_assertion_inside_library_uses_declared_kind(tmp_path):
    mod, _ = fake_library_module(
        tmp_path,
        """
        def check_args():
            assert False, "speculative_algorithm is EAGLE"
    """,
        package="transformers",
    )
    rec = classify(raised(mod.check_args), default_kind="config")
    assert rec.kind == "config" and rec.frame == "transformers/srt/fake_mod.py:3 in check_args"


def test_no_traceback():
    rec = classify(ValueError("never raised"))
    assert (rec.kind, rec.frame, rec.raised_at) == ("harness", None, None)
    assert set(rec.as_dict()) == {"kind", "type", "message", "frame", "raised_at"}


def test_kinds_are_documented():
    assert "harness" in KINDS and "install" in KINDS and len(set(KINDS)) == len(KINDS)


def test_classify_install_real_uv_conflict():
    out = (UV / "conflict.txt").read_text()
    rec = classify_install(out)
    assert (rec.kind, rec.type, rec.frame) == ("install", "InstallError", None)
    assert rec.message.startswith("resolver conflict: error: No solution found when resolving dependencies")
    # the resolver's own reason, without uv's 'cause:' prefix
    assert "| Because sglang==0.5.17 depends on transformers==5.12.1" in rec.message
    assert "cause:" not in rec.message and "\n" not in rec.message


def test_classify_install_real_uv_unreachable_index():
    out = (UV / "unreachable.txt").read_text()
    rec = classify_install(out)
    assert rec.kind == "install"
    assert rec.message.startswith("index unreachable: error: ")
    assert "http://127.0.0.1:9/simple/six/" in rec.message  # which index did not answer
    assert "\n" not in rec.message


@pytest.mark.parametrize(
    "output,label",
    [
        (
            "error: Because there is no version of sglang==9.9.9 and you require sglang==9.9.9, we can conclude that your "
            "requirements are unsatisfiable.",
            "resolver conflict",
        ),
        ("error: No interpreter found for Python 3.13 in virtual environments", "python missing"),
        ("error: Failed to build `flash-attn==2.8.0`", "install failed"),
        ("", "install failed"),
    ],
)
def test_classify_install_labels(output, label):
    assert classify_install(output).message.startswith(label + ":")


def test_classify_install_tty_hint_block():
    out = (
        "  × No solution found when resolving dependencies:\n"
        "  ╰─▶ Because sglang==0.5.17 depends on transformers==5.12.1 and you require transformers==5.8.1, we can "
        "conclude that your requirements are unsatisfiable.\n"
    )
    msg = classify_install(out).message
    assert msg.startswith("resolver conflict: × No solution found")
    assert "| Because sglang==0.5.17" in msg and "╰" not in msg


def test_wrapped_library_error_keeps_its_library_frame(tmp_path, monkeypatch):
    """A check that re-raises a library error as CheckFailure(...) from exc still points into the library."""
    pkg = tmp_path / "site-packages" / "transformers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "wrapped_mod.py").write_text(
        "def generate():\n    return inner()\n\ndef inner():\n    raise TypeError('x')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    import importlib

    mod = importlib.import_module("transformers.wrapped_mod")
    try:
        try:
            mod.generate()
        except TypeError as exc:
            raise CheckFailure("crash", "generate failed") from exc
    except CheckFailure as outer:
        rec = classify(outer)
    assert rec.kind == "crash"
    assert rec.frame == "transformers/wrapped_mod.py:2 in generate"
    assert rec.raised_at == "transformers/wrapped_mod.py:5 in inner"


def test_own_code_is_never_a_library_even_under_a_library_named_folder(monkeypatch):
    from mtpmatrix.core import failures

    monkeypatch.setattr(
        failures,
        "_OWN_DIRS",
        ("/home/u/sglang/gemma4-mtp-matrix/src/mtpmatrix/", "/home/u/sglang/gemma4-mtp-matrix/tests/"),
    )
    assert failures._package_of("/home/u/sglang/gemma4-mtp-matrix/src/mtpmatrix/tiers/smoke.py") is None
    assert failures._package_of("/home/u/sglang/gemma4-mtp-matrix/tests/tiers/test_smoke.py") is None
    assert failures._package_of("/home/u/sglang/python/sglang/srt/server_args.py") == "sglang"  # a real checkout
    assert failures._package_of("/x/lib/python3.11/site-packages/torch/nn/module.py") == "torch"


def test_readme_kinds_table_is_verdict_kinds():
    """README's failure-kinds table names every kind of kinds.KINDS, in order, and no other."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("| kind | what failed |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `([a-z]+)` \|", table, re.M) == list(KINDS)


def test_an_index_that_answered_with_a_refusal_is_the_rows_not_the_machines():
    """uv's 'Failed to fetch' for a 404 from the index (a CUDA variant it does not publish) is no unreachable index:
    the row's install was refused, a failure (exit 1), not an error of the machine (the review's case, 2026-12-05c)."""
    from mtpmatrix.core.store import row_verdict

    out = (
        "error: Failed to fetch: `https://download.pytorch.org/whl/cu131/torch/`\n"
        "  Caused by: HTTP status client error (404 Not Found) for url (https://download.pytorch.org/whl/cu131/torch/)"
    )
    f = classify_install(out).as_dict()
    assert f["message"].startswith("not on the index: ")
    assert row_verdict({"install": {"verdict": "failed", "failure": f}}) == "failed"
    gone = classify_install("error: Failed to fetch: `https://x/simple/six/`\n  Caused by: dns error").as_dict()
    assert row_verdict({"install": {"verdict": "failed", "failure": gone}}) == "error"
