"""Unified diffs against sglang's package: read one, map its paths to the installed package, apply it in memory.

Both sides use it: the runner applies a candidate patch to a row's installed sglang (runner/candidate.py), and the
fault-injection hook (faults/mutant_hook/sitecustomize.py) serves a patched module at import on a GPU box
(``MTPMATRIX_PATCH``). The hook loads this file by its path, without the package, so it is standard library only.

Paths. A patch names each file in one of two forms, with or without git's ``a/`` ``b/`` prefixes:

    python/sglang/srt/models/gemma4_mtp.py     sglang's repository, as ``git diff`` gives it there
    sglang/srt/models/gemma4_mtp.py            relative to site-packages (``diff -ru`` of two installs, patch.diff)

and both become ``sglang/srt/models/gemma4_mtp.py``, the package-relative form every record keeps. Anything else
(``srt/...``, a path outside sglang) is refused in one line: a path relative to the package folder alone cannot be
told from one relative to another project's.

Applying. Each hunk's removed and context lines must occur exactly (no fuzz) at or after the end of the previous
hunk; the match nearest the line the hunk names wins, so a hunk may move by whole lines (sglang 0.5.13 holds the
draft-phase fix's first hunk 6 lines further down). A hunk that matches nowhere is a PatchError naming the file,
the hunk and the first line that differs where the hunk points.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):\s*(\S.*?)\s*$")
DEV_NULL = "/dev/null"
PACKAGE = "sglang"


class PatchError(ValueError):
    """A patch that cannot be read or does not apply; the message is one line."""


@dataclass
class Hunk:
    number: int  # 1-based within its file
    header: str  # the @@ line
    old_start: int
    old_len: int
    lines: list[str] = field(default_factory=list)  # ' ', '-', '+' prefixed, with their line endings

    @property
    def old(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[0] in " +"]


@dataclass
class FilePatch:
    path: str  # package-relative: sglang/srt/...
    kind: str  # modify, create, delete
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def module(self) -> str | None:
        """The dotted module this file is (None: not a Python source file)."""
        if not self.path.endswith(".py"):
            return None
        parts = self.path[:-3].split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_path(raw: str) -> str:
    """A path of the patch as the package-relative path it names; PatchError for any other form (module docstring)."""
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"'):
        raise PatchError(f"{path}: quoted file names are not supported")
    for prefix in ("a/", "b/", ""):
        rest = path[len(prefix) :] if path.startswith(prefix) else None
        if rest is None:
            continue
        if rest.startswith(f"python/{PACKAGE}/"):
            rest = rest[len("python/") :]
        if rest.startswith(f"{PACKAGE}/") and ".." not in rest.split("/"):
            return rest
    raise PatchError(
        f"{path}: not a file of sglang (name it python/sglang/... as git diff in sglang's repository "
        "gives it, or sglang/... relative to site-packages)"
    )


def _count(text: str | None) -> int:
    return 1 if text is None else int(text)


def parse(text: str) -> list[FilePatch]:
    """The file patches of a unified diff (git's or diff -u's); text before the first file is the header."""
    lines = text.splitlines(keepends=True)
    out: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("GIT binary patch", "Binary files ")):
            raise PatchError(f"binary patches are not supported ({line.strip()[:60]})")
        if line.startswith(("rename from ", "copy from ")):
            raise PatchError(f"renames and copies are not supported ({line.strip()[:60]})")
        if not (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_raw, new_raw = line[4:].rstrip("\r\n"), lines[i + 1][4:].rstrip("\r\n")
        old_none, new_none = old_raw.split("\t")[0] == DEV_NULL, new_raw.split("\t")[0] == DEV_NULL
        if old_none and new_none:
            raise PatchError("a file diff from /dev/null to /dev/null")
        path = package_path(old_raw if new_none else new_raw)
        if not old_none and not new_none and package_path(old_raw) != path:
            raise PatchError(f"{path}: renamed from {package_path(old_raw)} (renames are not supported)")
        if any(fp.path == path for fp in out):
            raise PatchError(f"{path}: appears twice in the patch")
        fp = FilePatch(path, "create" if old_none else "delete" if new_none else "modify")
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            i = _read_hunk(lines, i, fp)
        if not fp.hunks:
            raise PatchError(f"{path}: no hunks")
        out.append(fp)
    if not out:
        raise PatchError("no file diffs in it (expected a unified diff: --- / +++ / @@ lines)")
    return out


def _read_hunk(lines: list[str], i: int, fp: FilePatch) -> int:
    m = _HUNK.match(lines[i])
    number = len(fp.hunks) + 1
    if not m:
        raise PatchError(f"{fp.path}: hunk {number}: malformed header {lines[i].strip()[:60]!r}")
    old_left, new_left = _count(m[2]), _count(m[4])
    hunk = Hunk(number, lines[i].strip(), int(m[1]), old_left)
    i += 1
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchError(f"{fp.path}: hunk {number} ({hunk.header}) ends early")
        line = lines[i]
        tag = line[:1]
        if line in ("\n", "\r\n"):  # a blank context line whose leading space an editor stripped
            line, tag = " " + line, " "
        if tag == "\\":  # "\ No newline at end of file": the line before has no line ending
            _drop_newline(hunk)
            i += 1
            continue
        if tag not in (" ", "-", "+"):
            raise PatchError(f"{fp.path}: hunk {number} ({hunk.header}): unexpected line {line.rstrip()[:60]!r}")
        old_left -= tag in " -"
        new_left -= tag in " +"
        if old_left < 0 or new_left < 0:
            raise PatchError(f"{fp.path}: hunk {number} ({hunk.header}): more lines than its header counts")
        hunk.lines.append(line)
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        _drop_newline(hunk)
        i += 1
    fp.hunks.append(hunk)
    return i


def _drop_newline(hunk: Hunk) -> None:
    if hunk.lines:
        hunk.lines[-1] = hunk.lines[-1].rstrip("\r\n")


def trailers(text: str) -> dict[str, str]:
    """``Key: value`` lines of the patch's header (before its first file): what a candidate declares of itself, e.g.
    ``Draft-Phase: +1``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("--- ", "diff ", "Index: ", "@@")):
            break
        m = _TRAILER.match(line)
        if m:
            out[m[1]] = m[2]
    return out


def _first_difference(have: list[str], want: list[str], at: int) -> str:
    for k, line in enumerate(want):
        got = have[at + k] if at + k < len(have) else None
        if got != line:
            shown = "end of file" if got is None else repr(got.rstrip("\r\n")[:70])
            return f"line {at + k + 1} is {shown}, the hunk expects {line.rstrip(chr(10))[:70]!r}"
    return "no difference"


def _find(have: list[str], block: list[str], expected: int, start: int) -> int | None:
    """Where ``block`` occurs in ``have`` at or after ``start``, nearest to ``expected``; None when nowhere."""
    n = len(block)
    last = len(have) - n
    if last < start:
        return None
    expected = min(max(expected, start), last)
    for delta in range(0, max(expected - start, last - expected) + 1):
        for at in (expected - delta, expected + delta) if delta else (expected,):
            if start <= at <= last and have[at : at + n] == block:
                return at
    return None


def apply(fp: FilePatch, original: str | None) -> str | None:
    """``original`` (None: the file does not exist) with ``fp`` applied; None when ``fp`` deletes the file.
    PatchError (one line, naming the file and the hunk) when it does not apply."""
    if fp.kind == "create":
        if original is not None:
            raise PatchError(f"{fp.path}: the patch creates it, but it exists")
        return "".join(ln for h in fp.hunks for ln in h.new)
    if original is None:
        raise PatchError(f"{fp.path}: no such file in this sglang")
    have = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # first line of ``have`` not yet copied
    shift = 0  # where the hunks landed against where they said they would
    for h in fp.hunks:
        block = h.old
        # a hunk without old lines inserts after line old_start; otherwise old_start is its first line
        expected = h.old_start + shift - (1 if block else 0)
        at = _find(have, block, expected, pos) if block else min(max(expected, pos), len(have))
        if at is None:
            where = min(max(expected, 0), max(len(have) - 1, 0))
            already = _find(have, h.new, expected, pos) is not None and h.new != block
            raise PatchError(
                f"{fp.path}: hunk {h.number} ({h.header}) does not apply: "
                + (
                    "its result is there already (applied before?)"
                    if already
                    else _first_difference(have, block, where)
                )
            )
        shift = at - (h.old_start - (1 if block else 0))
        out += have[pos:at] + h.new
        pos = at + len(block)
    out += have[pos:]
    if fp.kind == "delete":
        if out:
            raise PatchError(f"{fp.path}: the patch deletes it, but lines are left after its hunks")
        return None
    return "".join(out)
