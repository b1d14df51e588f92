"""Failure classification: what broke (install conflict, import, abi, config, args, weights, launch, crash,
mismatch, accuracy, acceptance, accounting) and where (the first frame inside sglang / transformers / torch).

A failure whose exception was raised in this project's own code (also when a library called that code back), or
that never passed through the libraries under test, is classified ``harness``: a bug in the matrix must never read
as a break in sglang. A failure that only follows from an earlier one in the same session (a package left
half-imported) takes that one's kind and points at it (``as_consequence``).
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from types import TracebackType

from mtpmatrix.core.kinds import CheckFailure
from mtpmatrix.core.paths import PACKAGE, REPO
from mtpmatrix.core.record_types import Failure

LIBRARIES = ("sglang", "transformers", "torch", "sgl_kernel", "triton", "huggingface_hub", "safetensors")
UNDER_TEST = ("sglang", "transformers")  # preferred for "the first frame": torch decorators wrap their entry points
_SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z0-9_]+)[/\\]")
# This project's own code (the package and, in a checkout, its tests) is never a library, even when the checkout
# lives under a folder named like one (~/sglang/gemma4-mtp-matrix/...), which the path fallback below would match.
_OWN_DIRS = tuple(str(d).replace("\\", "/") + "/" for d in (PACKAGE, REPO / "tests"))


@dataclass
class FailureRecord:
    kind: str
    type: str
    message: str
    frame: str | None  # "package/module.py:123 in func" of the first frame inside a library under test
    raised_at: str | None  # innermost frame

    def as_dict(self) -> Failure:
        return {
            "kind": self.kind,
            "type": self.type,
            "message": self.message,
            "frame": self.frame,
            "raised_at": self.raised_at,
        }


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
    first = next((f for f in frames if _package_of(f.filename) in UNDER_TEST), None) or next(
        (f for f in frames if _package_of(f.filename) in LIBRARIES), None
    )
    return (_fmt(first) if first else None, _fmt(frames[-1]) if frames else None, first is not None)


def raised_in_own_code(tb: TracebackType | None) -> bool:
    """Whether the innermost frame of ``tb`` (where the exception was raised) is this project's code."""
    frames = traceback.extract_tb(tb) if tb else []
    return bool(frames) and frames[-1].filename.replace("\\", "/").startswith(_OWN_DIRS)


def classify(exc: BaseException, default_kind: str | None = None) -> FailureRecord:
    """Classify an exception raised by a check.

    Explicit CheckFailure kinds win; import errors are 'import' wherever they come from; an exception raised by a
    library under test takes ``default_kind``, the check's own declaration (``@pytest.mark.check("args")``), else
    'crash'; anything else is 'harness': raised in this project's code (a bare ``assert`` included, also when a
    library called that code back) or never touching a library under test. A check that found a break says which
    with CheckFailure.
    """
    frame, raised_at, in_library = first_library_frame(exc.__traceback__)
    own_raise = raised_in_own_code(exc.__traceback__)
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
    elif in_library and not own_raise:
        kind = default_kind or "crash"
    else:
        kind = "harness"
    message = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
    return FailureRecord(kind=kind, type=type(exc).__name__, message=message, frame=frame, raised_at=raised_at)


# --- consequences: a failure that follows from an earlier one in the same session -------------------------------
# A package whose __init__ raised half way leaves the submodules it had imported in sys.modules and itself out of
# it; an import under a namespace subpackage of it (sglang.srt has no __init__.py) then raises KeyError: 'sglang'
# from importlib (_NamespacePath._get_parent_path), whatever that later check is about. Such a failure says
# nothing new: it takes the kind of the failure that left the package half-imported and points at it.


def packages_left_half_imported(exc: BaseException, depth: int = 5) -> list[str]:
    """Packages whose ``__init__`` this failure interrupted: its traceback (or a cause's) runs a package's
    ``__init__.py`` at module level, so importlib dropped the package and kept what it had imported. (A later step may
    import the package again cleanly: sys.modules after the fact does not tell, the traceback does.)"""
    names: set[object] = set()
    current: BaseException | None = exc
    seen = 0
    while current is not None and seen < depth:
        tb = current.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_name == "<module>" and code.co_filename.endswith("__init__.py"):
                names.add(tb.tb_frame.f_globals.get("__name__"))
            tb = tb.tb_next
        current, seen = current.__cause__ or current.__context__, seen + 1
    return sorted(n for n in names if isinstance(n, str) and n != "__main__")


def missing_package(exc: BaseException) -> str | None:
    """The package named by importlib's KeyError for a parent gone from sys.modules (raised inside importlib's own
    frozen frames); None for any other failure."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if (
        isinstance(exc, KeyError)
        and len(exc.args) == 1
        and isinstance(exc.args[0], str)
        and frames
        and frames[-1].filename.startswith("<frozen importlib")
    ):
        return exc.args[0]
    return None


def as_consequence(failure: Failure, package: str, earlier_id: str, earlier_kind: str) -> Failure:
    """``failure`` (a FailureRecord dict) restated as a consequence of the earlier failure that left ``package``
    half-imported: that failure's kind, ``consequence_of`` its check id, and a message that says so."""
    restated: Failure = {
        **failure,
        "kind": earlier_kind,
        "consequence_of": earlier_id,
        "message": f"consequence of {earlier_id} ({earlier_kind}): it left package '{package}' half-imported, "
        f"so importlib raised {failure['type']}: {failure['message']}"[:500],
    }
    return restated


_INSTALL_PATTERNS = (
    (re.compile(r"No solution found|unsatisfiable|conflict", re.I), "resolver conflict"),
    # the index answered, refusing the file (a variant it does not publish, a wheel pulled): the row's, not the machine's
    (re.compile(r"HTTP status client error|\b40[34] (?:Not Found|Forbidden)", re.I), "not on the index"),
    (
        re.compile(
            r"Failed to fetch|Could not connect|dns error|timed out|Connection refused|error sending request", re.I
        ),
        "index unreachable",
    ),
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
    detail = next(
        (
            ln.strip(" ╰─▶").removeprefix("cause:").strip()
            for ln in lines
            if "Because" in ln or "╰─▶" in ln or "Failed to fetch" in ln
        ),
        "",
    )
    message = f"{why}: {err.strip()}" + (f" | {detail}" if detail and detail not in err else "")
    return FailureRecord(kind="install", type="InstallError", message=message[:800], frame=None, raised_at=None)
