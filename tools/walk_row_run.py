"""Walk one row run through the project's own code and count its stops (issue #42's measure of the row run).

    python tools/walk_row_run.py CHECKOUT [--row sglang-0.5.17] [--tiers contract] [--json OUT]

Runs the noxfile's row path (``_run_matrix_row``) of CHECKOUT in this process, as ``nox -s "gemma4_mtp(ROW)" --
--tiers TIERS`` would, with a stand-in for nox's session (posargs, the row venv's location, log / warn / skip /
error); the install and the suite are real (uv, pytest in the row's venv, ``CHECKOUT/.nox/<session>``, which must
exist: run the nox session once first). Run it with a Python that has nox (nox's own).

A stop is a change of the file whose code runs, among CHECKOUT's noxfile.py and src/: every call into and every
return to a project frame of the main thread is an event, consecutive events in one file are one stop. A return is
a stop in a file already left before; the calls into a file are its stops reached by a call (a pipeline's hub is
returned to after each step, but called into once). A loop over items (the install's byte-compilation visits two
files once per file of site-packages) is walked once: a repeat of the last one to four stops is dropped. Worker
threads and the row's subprocesses are not walked: they are the suite, not the row run's plumbing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace


class Skipped(Exception):
    pass


class SessionStandIn:
    """What ``_run_matrix_row`` reads of nox's Session."""

    def __init__(self, posargs: list[str], venv: Path) -> None:
        self.posargs = posargs
        self.virtualenv = SimpleNamespace(location=str(venv))

    def log(self, message: str) -> None:
        print(f"nox > {message}", flush=True)

    warn = log

    def skip(self, reason: str) -> None:
        raise Skipped(reason)

    def error(self, message: str) -> None:
        raise SystemExit(f"nox > error: {message}")


def walk(checkout: Path, row: str, tiers: str, run_id: str) -> list[tuple[str, str]]:
    """The project files execution stopped in, in order, each with how it got there (a call or a return)."""
    os.chdir(checkout)
    spec = importlib.util.spec_from_file_location("noxfile_walked", checkout / "noxfile.py")
    assert spec and spec.loader
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    venv = checkout / ".nox" / f"gemma4_mtp-{row.replace('.', '-')}"
    if not venv.is_dir():
        raise SystemExit(f'error: no row venv {venv}: run `nox -s "gemma4_mtp({row})"` in {checkout} once first')
    roots = (str(checkout / "src") + os.sep, str(checkout / "noxfile.py"))
    main = threading.main_thread()
    stops: list[tuple[str, str]] = []  # (file, "call" or "return": how execution got there)

    def here(frame, how: str) -> None:
        name = frame.f_code.co_filename
        if name.startswith(roots) and (not stops or stops[-1][0] != name):
            stops.append((name, how))

    def profile(frame, event, _arg) -> None:
        if threading.current_thread() is not main:
            return
        if event == "call":
            here(frame, "call")
        elif event == "return" and frame.f_back is not None:
            here(frame.f_back, "return")

    session = SessionStandIn(["--tiers", tiers, "--run-id", run_id], venv)
    sys.setprofile(profile)
    try:
        noxfile._run_matrix_row(session, row, [row], run_id)
    except Skipped as exc:
        print(f"skipped: {exc}")
    finally:
        sys.setprofile(None)
    return [(str(Path(s).relative_to(checkout)), how) for s, how in stops]


def fold(stops: list[tuple[str, str]], longest: int = 4) -> list[tuple[str, str]]:
    """``stops`` with every immediate repeat of its last 1..longest stops dropped (a loop walked once)."""
    out: list[tuple[str, str]] = []
    for s in stops:
        out.append(s)
        folded = True
        while folded:
            folded = False
            for k in range(1, longest + 1):
                if len(out) >= 2 * k and out[-k:] == out[-2 * k : -k]:
                    del out[-k:]
                    folded = True
                    break
    return out


def summary(stops: list[tuple[str, str]]) -> dict:
    """Stops, files, stops in a file already left ("returns"), and per file its stops and the calls into it."""
    seen: set[str] = set()
    returns = 0
    for name, _how in stops:
        returns += name in seen
        seen.add(name)
    return {
        "stops": len(stops),
        "files": len(seen),
        "returns": returns,
        "stops_per_file": dict(Counter(name for name, _ in stops).most_common()),
        "calls_into": dict(Counter(name for name, how in stops if how == "call").most_common()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--row", default="sglang-0.5.17")
    ap.add_argument("--tiers", default="contract")
    ap.add_argument("--run-id", default="walk-row-run")
    ap.add_argument("--json", type=Path, help="write the stops and the summary here")
    args = ap.parse_args()
    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout / "src"))
    stops = fold(walk(checkout, args.row, args.tiers, args.run_id))
    result = summary(stops)
    print(f"{result['stops']} stops in {result['files']} files, {result['returns']} of them returns to a file left")
    print("  stops  calls into  file")
    for name, n in result["stops_per_file"].items():
        print(f"  {n:5d}  {result['calls_into'].get(name, 0):10d}  {name}")
    if args.json:
        args.json.write_text(
            json.dumps({**result, "sequence": [f"{how} {name}" for name, how in stops]}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
