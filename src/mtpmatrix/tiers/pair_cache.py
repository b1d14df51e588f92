"""A tiny pair reused from a persistent folder (``MTPMATRIX_TINY_DIR``; nox rows keep theirs in ``.cache/tiny/<row>``)
is served only if its files are the ones a session of this suite built there.

``pairs.tiny.build_pair`` reuses a folder by its marker's recipe hash, which a folder seeded with other weights and a
copied marker carries as well: measured on CPU with the 0.5.17 row's venv, the e-series witness pair's files under
the random pair's copied marker were served as the random pair, untouched (docs/evidence.md). So the session that
builds a pair writes the sha256 of each of its files beside them (``FILES``); a folder this session did not build is
served only while its files match that list, and while it holds no link (a build writes none; a link, dangling
or not, points where the check does not hold: a second shard created after it). One without the list (built before it was kept), or whose files differ
from it, is never deleted (another session may be serving it) but built again in the session's own folder.

What this does not catch: a list forged to match the seeded files (an edit of the box's data, as an edited record
is), nor a file changed between this check and the server's read. The weights are the same bytes on every row's torch and transformers (measured: torch 2.11.0 / 2.14.1,
transformers 5.8.1 / 5.12.1 / 5.19.0), so digests committed per pair could catch that too; not kept yet.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.pairs.tiny.build import MARKER

FILES = ".mtpmatrix-tiny-files.json"


NOT_A_FILE = "not a regular file"  # a build writes none: a link points where this check does not hold


def digests(folder: Path) -> dict[str, str]:
    """{path under ``folder``: sha256} of every file of a pair folder but the list itself; a link (to a file, to a
    folder, dangling) or any other entry that is no regular file or folder stands as NOT_A_FILE."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):  # rglob does not descend into a linked folder: the link itself is listed
        rel = p.relative_to(folder).as_posix()
        if rel == FILES:
            continue
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            out[rel] = NOT_A_FILE
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _marker_stat(folder: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(Path(folder) / MARKER)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _recorded(folder: Path) -> dict[str, str] | None:
    try:
        data = json.loads((Path(folder) / FILES).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def served_pair(build: Callable[..., Any], name: str, variant: str, root: Path, own_root: Path) -> Any:
    """``build(name, root, variant=variant)`` (pairs.tiny.build_pair's PairPaths), as long as what it returns was
    built by this call or holds the files a session built there (``FILES``); else the pair built under ``own_root``
    (this session's folder)."""
    root = Path(root)
    before = {p: _marker_stat(p) for p in root.iterdir() if p.is_dir()} if root.is_dir() else {}
    paths = build(name, root, variant=variant)
    folder = Path(paths.target).parent
    stat = _marker_stat(folder)
    if before.get(folder) is None or before[folder] != stat:  # built now (by this call, or by a session beside it)
        atomic_write_json(folder / FILES, digests(folder))
        return paths
    if _recorded(folder) == digests(folder):
        return paths
    return build(name, Path(own_root), variant=variant)
