"""What a row's suite prints on the console: the lines that matter, the whole pytest output in the row's log.

pytest's full output for one CPU row runs to thousands of lines (progress rows, a traceback per failure, warnings);
a matrix of rows prints them all one after the other. The log file keeps every line (pytest.log in the row's
folder); the console gets, per pytest process:

  - the plugin's own lines: which tiers run (``mtpmatrix tier ...``), long steps' progress (``[smoke] ...``,
    ``[gsm8k ...]``);
  - pytest's short test summary for each check that matters: ``FAILED``, ``ERROR``, ``XFAIL`` (a known-upstream
    failure, with its entry's id and link: tiers/session/known_failures.py), ``XPASS`` (an entry that can go);
  - skips, one line per reason with the count summed over files (the tier-level reasons name their tier);
  - pytest's summary line (``= 25 passed, 21 xfailed, 179 skipped in 73.50s =``);
  - a session that ended without a summary line (a crash, a usage error, an import error in a conftest): its
    last lines, whatever they are.

``MTPMATRIX_VERBOSE=1``, or a verbosity flag among the row's pytest arguments (``-- -- -v``), streams everything.
"""

from __future__ import annotations

import re
import sys
from collections import deque
from collections.abc import Mapping

VERBOSE_ENV = "MTPMATRIX_VERBOSE"
TAIL_LINES = 30  # of a session that ended without a summary line: enough for a traceback's last frames and error

_KEEP = re.compile(r"^(FAILED|ERROR|XFAIL|XPASS|INTERNALERROR>|mtpmatrix[ .]|\[smoke\]|\[gsm8k\b)")
# pytest's -rs line: 'SKIPPED [3] tests/tiers/test_x.py:44: reason' (no ':line' for a skip marker on the item)
_SKIPPED = re.compile(r"^SKIPPED \[(\d+)\] \S+?(?::\d+)?: (.*)$")
# the session's last line: '==== 1 failed, 31 passed, 1 warning in 81.66s (0:01:21) ====' (or 'no tests ran in')
_SUMMARY = re.compile(r"^=+ .* in \d+(\.\d+)?s( \(\d+:\d\d:\d\d\))? =+$")
_VERBOSITY = re.compile(r"^(-v+|--verbose|--verbosity=[1-9].*)$")


def verbose(pytest_args: list[str], env: Mapping[str, str]) -> bool:
    """Whether the whole pytest output streams to the console: ``MTPMATRIX_VERBOSE`` set to anything but '' or
    '0', or a verbosity flag (``-v``, ``-vv``, ``--verbose``, ``--verbosity=N``) among the row's pytest args."""
    if (env.get(VERBOSE_ENV) or "0") != "0":
        return True
    return any(_VERBOSITY.match(a) for a in pytest_args)


class RowConsole:
    """Feed it each line of the row's pytest output (``feed``, with the side-by-side process's prefix), then
    ``close``; it writes what the module docstring says to ``write``. Not thread-safe: side_by_side's pumps hold
    their lock around ``feed``."""

    def __init__(self, *, full: bool = False, write=None):
        self.full = full
        self._write = write or _stdout
        self._skips: dict[str, dict[str, int]] = {}  # prefix -> {reason: count}
        self._tails: dict[str, deque] = {}  # prefix -> the last lines
        self._ended: set[str] = set()  # prefixes whose session printed its summary line

    def feed(self, line: str, prefix: str = "") -> None:
        if self.full:
            self._write(prefix + line)
            return
        text = line.rstrip("\n")
        self._tails.setdefault(prefix, deque(maxlen=TAIL_LINES)).append(text)
        skipped = _SKIPPED.match(text)
        if skipped:
            reasons = self._skips.setdefault(prefix, {})
            reasons[skipped.group(2)] = reasons.get(skipped.group(2), 0) + int(skipped.group(1))
        elif _SUMMARY.match(text):
            self._flush_skips(prefix)
            self._ended.add(prefix)
            self._write(f"{prefix}{text}\n")
        elif _KEEP.match(text):
            self._write(f"{prefix}{text}\n")

    def close(self) -> None:
        """Skips not yet written, and the last lines of each session that printed no summary line."""
        if self.full:
            return
        for prefix, tail in self._tails.items():
            self._flush_skips(prefix)
            if prefix not in self._ended:
                self._write(f"{prefix}(pytest printed no summary line; its last {len(tail)} lines:)\n")
                for text in tail:
                    self._write(f"{prefix}{text}\n")

    def _flush_skips(self, prefix: str) -> None:
        for reason, n in self._skips.pop(prefix, {}).items():
            self._write(f"{prefix}SKIPPED [{n}] {reason}\n")


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
