"""Failure classification: what broke (install conflict, import, abi, config, args, weights, launch, crash,
mismatch, accuracy, acceptance, accounting) and where (the first frame inside sglang / transformers / torch).

A failure whose exception was raised from this project's own code, without passing through the libraries under
test, is classified ``harness``: a bug in the matrix must never read as a break in sglang.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

KINDS = (
    "install",  # the resolver refused the row (conflict, missing wheel, unreachable index)
    "import",  # a module of the MTP path does not import
    "abi",  # a native extension needs torch symbols / libraries / a CUDA major the installed torch does not provide
    "config",  # a config does not load or resolves to the wrong values
    "args",  # ServerArgs resolution broke or resolved to the wrong algorithm/values
    "weights",  # building the model classes or loading weights failed
    "launch",  # the server did not become ready
    "crash",  # the server died or errored while serving
    "mismatch",  # outputs with MTP differ from outputs without it
    "accuracy",  # GSM8K score under threshold
    "acceptance",  # accept length under threshold or absent
    "accounting",  # speculative metric fields disagree with each other, the tokens served or /server_info
    "harness",  # a bug in this project
)
LIBRARIES = ("sglang", "transformers", "torch", "sgl_kernel", "triton", "huggingface_hub", "safetensors")
UNDER_TEST = ("sglang", "transformers")  # preferred for "the first frame": torch decorators wrap their entry points
_SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z0-9_]+)[/\\]")
# This project's own code (the package and, in a checkout, its tests) is never a library, even when the checkout
# lives under a folder named like one (~/sglang/gemma4-mtp-matrix/...), which the path fallback below would match.
_OWN_DIRS = tuple(str(d).replace("\\", "/") + "/" for d in (Path(__file__).resolve().parents[1],
                                                            Path(__file__).resolve().parents[3] / "tests"))


class CheckFailure(AssertionError):
    """Raised by tier checks that know what kind of failure they found."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass
class FailureRecord:
    kind: str
    type: str
    message: str
    frame: str | None  # "package/module.py:123 in func" of the first frame inside a library under test
    raised_at: str | None  # innermost frame

    def as_dict(self) -> dict:
        return asdict(self)


def _package_of(filename: str) -> str | None:
    m = _SITE.search(filename)
    if m:
        return m.group(1)
    # editable / source checkouts: .../sglang/python/sglang/srt/..., /tmp/site/sglang/... (device bundles)
    name = filename.replace("\\", "/")
    if name.startswith(_OWN_DIRS):
        return None
    for lib in LIBRARIES:
        if f"/{lib}/" in name:
            return lib
    return None


def _fmt(fs: traceback.FrameSummary) -> str:
    name = fs.filename.replace("\\", "/")
    pkg = _package_of(name)
    if pkg and f"/{pkg}/" in name:
        name = pkg + "/" + name.split(f"/{pkg}/", 1)[1]
    return f"{name}:{fs.lineno} in {fs.name}"


def first_library_frame(tb: TracebackType | None) -> tuple[str | None, str | None, bool]:
    """(first library frame, innermost frame, whether any frame is inside a library under test)."""
    frames = traceback.extract_tb(tb) if tb else []
    first = (next((f for f in frames if _package_of(f.filename) in UNDER_TEST), None)
             or next((f for f in frames if _package_of(f.filename) in LIBRARIES), None))
    return (_fmt(first) if first else None, _fmt(frames[-1]) if frames else None, first is not None)


def classify(exc: BaseException, default_kind: str | None = None) -> FailureRecord:
    """Classify an exception raised by a check.

    ``default_kind`` is the check's own declaration (``@pytest.mark.check("args")``); explicit CheckFailure kinds
    win; import errors are 'import' wherever they come from; anything else that never touched a library under test
    is 'harness'.
    """
    frame, raised_at, in_library = first_library_frame(exc.__traceback__)
    # A check that wraps a library exception (raise CheckFailure(...) from exc) points at the library through
    # its cause: take the frame from there.
    cause, seen = exc.__cause__ or exc.__context__, 0
    while frame is None and cause is not None and seen < 5:
        frame, cause_raised_at, _ = first_library_frame(cause.__traceback__)
        if frame is not None:
            raised_at = cause_raised_at  # where the wrapped library error itself was raised
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if isinstance(exc, CheckFailure):
        kind = exc.kind
    elif isinstance(exc, ImportError):
        kind = "import"
    elif isinstance(exc, AssertionError):
        kind = default_kind or "harness"
    elif in_library:
        kind = default_kind or "crash"
    else:
        kind = "harness"
    message = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
    return FailureRecord(kind=kind, type=type(exc).__name__, message=message, frame=frame, raised_at=raised_at)


_INSTALL_PATTERNS = (
    (re.compile(r"No solution found|unsatisfiable|conflict", re.I), "resolver conflict"),
    (re.compile(r"Failed to fetch|Could not connect|dns error|timed out|Connection refused|error sending request", re.I),
     "index unreachable"),
    (re.compile(r"not found in the package registry|No matching distribution|was not found", re.I), "not on the index"),
    (re.compile(r"No interpreter found|No Python at|python.*not found", re.I), "python missing"),
)


def classify_install(output: str) -> FailureRecord:
    """Turn uv's output into an 'install' record whose message is the resolver's own first error line."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    err = next((ln for ln in lines if ln.lstrip().startswith(("error:", "×", "ERROR"))), lines[-1] if lines else "")
    why = next((label for pat, label in _INSTALL_PATTERNS if pat.search(output)), "install failed")
    # uv's hint block ("╰─▶ Because ..." on a terminal, "  cause: Because ..." through a pipe, as in run_row)
    # holds the real reason for resolver conflicts, and "cause: Failed to fetch: URL" the index that did not
    # answer: keep the first such line.
    detail = next((ln.strip(" ╰─▶").removeprefix("cause:").strip() for ln in lines
                   if "Because" in ln or "╰─▶" in ln or "Failed to fetch" in ln), "")
    message = f"{why}: {err.strip()}" + (f" | {detail}" if detail and detail not in err else "")
    return FailureRecord(kind="install", type="InstallError", message=message[:800], frame=None, raised_at=None)
