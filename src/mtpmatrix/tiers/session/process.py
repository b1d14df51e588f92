"""``python -m mtpmatrix.tiers.session.process ARGS``: ``python -m pytest ARGS`` for a row's suite, with two changes to
the interpreter around it and none to pytest.

Why (issue #21, a row's cost on a 2-core machine where the suite is CPU-bound; warm 0.5.17 row, measured):

- Full garbage collections are rarer (``GC_THRESHOLDS``): each one walks every live object, and a suite process
  holds millions once sglang, torch and transformers are imported; under the default thresholds (700, 10, 10) the
  heap grows ~25 % between full collections while the modules load, so ``import sglang.srt.models.gemma4_mtp``
  spent 7.8 s of CPU (bytecode compiled) where 6.1 s do with (700, 10, 100). Young collections are unchanged, and
  a full one still runs when the two conditions CPython requires are met, so cyclic garbage is still freed.
- The interpreter is not torn down after pytest returns: freeing every module of torch, transformers and sglang one
  by one cost 2.0 s of CPU in the reference process and 3.3 s in the sglang process, after their results were
  written. Everything a normal exit does before that teardown still runs: pytest's own end (sessionfinish writes
  tiers.json atomically and junit.xml, unconfigure, its cleanups), non-daemon threads are joined, ``atexit``
  handlers run (logging's flush, multiprocessing's children), stdout and stderr are flushed; then ``os._exit``
  with pytest's exit status.

Nothing here changes what a check computes: the GPU box and any plain ``python -m pytest`` run the same checks.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading

# (young, middle, full): a full collection after 100 middle ones (CPython's default: 10), young ones as by default
GC_THRESHOLDS = (700, 10, 100)


def finish(code: int) -> None:
    """What a normal interpreter exit does before tearing the interpreter down, then ``os._exit(code)``."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - the same handlers Py_FinalizeEx would run, in the same order
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say on it
            pass
    os._exit(code)


def run_pytest() -> int:
    """pytest on ``sys.argv[1:]``, as ``python -m pytest`` runs it (pytest.console_main, deprecated in pytest 9.2:
    pytest.main, then stdout flushed; a closed stdout pipe is not an error)."""
    import pytest

    try:
        code = pytest.main()
        sys.stdout.flush()
    except BrokenPipeError:
        code = 1
    return int(code)


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    finish(run_pytest())


if __name__ == "__main__":
    main()
