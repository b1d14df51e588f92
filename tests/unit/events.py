"""Waiting on what the code under test does, never on the clock (issue #20).

A unit test that needs a child process or a thread to reach some point waits for the sign it leaves there (a log
line, a file, a request in flight); it does not sleep or bound the elapsed time. ``HANG`` bounds such a wait only so
that a broken program fails instead of hanging the run: every event waited on arrives within milliseconds, a second
or two on a 2-core machine under full load (tools/under_load.sh), so the bound is 30x or more what a working program
takes and a slow machine never reaches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HANG = 60.0


def wait_for(happened: Callable[[], object], what: str, bound: float = HANG, poll: float = 0.02) -> None:
    """Return as soon as ``happened()`` is true; AssertionError naming ``what`` after ``bound`` seconds."""
    give_up = time.monotonic() + bound
    while not happened():
        if time.monotonic() >= give_up:
            raise AssertionError(f"{what}: not seen after {bound:.0f} s (a hang, not a slow machine)")
        time.sleep(poll)
