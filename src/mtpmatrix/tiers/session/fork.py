"""``python -m mtpmatrix.tiers.session.fork SPEC``: a row's side-by-side pytest processes (mtpmatrix.runner.side_by_side)
forked from one interpreter that has already imported what both of them import.

Why (issue #21): on a CPU row the suite is CPU-bound, and both pytest processes imported torch and transformers'
Gemma 4 classes (with tokenizers, candidate generation and what they pull in: sklearn, scipy, sympy, pandas): 3,682
of the reference process's 3,734 imported files, 3.7 s of CPU (bytecode compiled), paid twice. Imported once here
and forked, the children share them (copy on write).

SPEC (JSON, built by side_by_side.run): ``imports``, what to import first (``module`` or ``module:attribute``, the
attribute read to trigger a lazy import), and ``groups``, one per child: ``args`` (pytest's arguments, as for
``python -m mtpmatrix.tiers.session.process``), ``env`` (added to the child's environment) and ``fd`` (an inherited
pipe, the child's stdout and stderr). Each child runs pytest as mtpmatrix.tiers.session.process does; this process
waits for them and prints their exit statuses, one JSON list, on its stdout.

A child is a fresh interpreter instead (``os.execv`` of pytest_process, exactly the processes as before) when an
import fails (a broken row must fail in its checks as it always did, not in a half-imported module here) or when
the machine has an NVIDIA device (CUDA must not be touched before a fork, and an import may query it).
"""

from __future__ import annotations

import gc
import glob
import importlib
import json
import os
import sys
import time

from mtpmatrix.tiers.session import process as pytest_process

MODULE = "mtpmatrix.tiers.session.fork"
# what the reference tier imports (tests/tiers/test_reference.py), all of which the sglang process imports too
SHARED_IMPORTS = (
    "pytest",
    "torch",
    "transformers",
    "transformers:AutoConfig",
    "transformers:AutoTokenizer",
    "transformers:Gemma4ForConditionalGeneration",
    "transformers:Gemma4AssistantForCausalLM",
    "transformers.generation.candidate_generator",
)


def gpu_present() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def preimport(names) -> bool:
    """Import ``names`` in order; False at the first that fails (nothing is imported after it)."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            imported = importlib.import_module(module)
            if attribute:
                getattr(imported, attribute)
        except Exception:  # noqa: BLE001 - the children then start fresh and meet it in their checks
            return False
    return True


def _child(group: dict, fds: list[int], forked: bool) -> None:
    """In the forked child: point stdout and stderr at the group's pipe, then run pytest (never returns)."""
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(group["fd"], 1)
        os.dup2(group["fd"], 2)
        for fd in fds:
            os.close(fd)
        os.environ.update(group["env"])
        args = [str(a) for a in group["args"]]
        if not forked:
            os.execv(sys.executable, [sys.executable, "-m", pytest_process.__name__, *args])
        sys.argv = [sys.argv[0], *args]
        pytest_process.finish(pytest_process.run_pytest())
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's loop
        import traceback

        traceback.print_exc()
        os._exit(3)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    groups = spec["groups"]
    fds = [g["fd"] for g in groups]
    os.dup2(fds[0], 2)  # what the imports say (warnings) goes to the first group's log, as it did
    gc.set_threshold(*pytest_process.GC_THRESHOLDS)
    t0, cpu0 = time.monotonic(), time.process_time()
    forked = not gpu_present() and preimport(spec.get("imports", SHARED_IMPORTS))
    sys.stderr.write(
        f"{MODULE}: {len(sys.modules)} modules imported in {time.monotonic() - t0:.1f} s "
        f"({time.process_time() - cpu0:.1f} s CPU), {'forking' if forked else 'starting'} "
        f"{len(groups)} pytest processes\n"
    )
    # what was imported stays out of every later collection: a collection writes into each object it walks, so
    # the children's collections would copy the whole shared heap page by page (copy on write)
    gc.freeze()
    pids = []
    for group in groups:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(group, fds, forked)
        pids.append(pid)
    for fd in fds:
        os.close(fd)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    sys.stdout.write(json.dumps({"codes": codes, "forked": forked}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    pytest_process.finish(main(sys.argv[1:]))
