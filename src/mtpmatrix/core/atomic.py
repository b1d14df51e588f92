"""Atomic file writes, shared by the results store and the tiers: a temp file in the same folder, fsync, rename,
so a killed run leaves either the old file or the new one, never half of one."""

from __future__ import annotations

import gzip
import json
import os
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: mkstemp makes 0600 files, and results/reports must be readable as any other file


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.chmod(tmp, 0o666 & ~_UMASK)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    # UTF-8 whatever the locale: GSM8K records keep the questions' own characters (ensure_ascii=False)
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: object) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


class TooDeep(ValueError):
    """JSON nested deeper than the parser's recursion allows: unreadable, as bad JSON is."""


# The largest record file a reader takes (row.json, tiers.json, junit.xml, a manifest, per-question records, a
# freeze): 100 x the largest real one, the H200's 15-server smoke tiers.json of 257 checks (329,546 bytes unzipped:
# docs/runs/2026-12-02d-h200-sglang-0.5.17-smoke-default.json.gz; its junit.xml is ~77 KB), room for the suite to
# grow many times over. A file over it is refused unread: hundreds of MiB held in memory on a shared box is not a run.
MAX_RECORD_BYTES = 32 * 2**20


class TooLarge(ValueError):
    """A record file over MAX_RECORD_BYTES, or no regular file: refused before it is read."""


def refused_unread(path: Path) -> str | None:
    """Why ``path`` is not to be read as a record (one line): over MAX_RECORD_BYTES, or no regular file (a link to
    /dev/zero stats as 0 bytes and reads forever, a FIFO blocks its reader); None when it may be read (or cannot be
    stat'ed: the read says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _refused(path, st)


def _refused(path: Path, st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file (a device, a FIFO or a link to one): not read"
    if st.st_size <= MAX_RECORD_BYTES:
        return None
    return (
        f"{path}: {st.st_size / 2**20:.1f} MiB, over the {MAX_RECORD_BYTES // 2**20} MiB a record file may be "
        "(100 x the largest real one): not read"
    )


def _open_record(path: Path) -> BinaryIO:
    """``path`` opened for reading as a record, refused (TooLarge) before and after the open as refused_unread says."""
    why = refused_unread(path)
    if why:
        raise TooLarge(why)
    # O_NONBLOCK: a FIFO put in its place since is not waited on; what was opened is checked again (fstat)
    raw = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    why = _refused(path, os.fstat(raw.fileno()))
    if why:
        raw.close()
        raise TooLarge(why)
    return raw


def _parse_json(path: Path, data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # '[' * 10**5: a ValueError to every reader, never a traceback
        raise TooDeep(f"{path}: JSON nested too deeply") from None


def read_json(path: Path) -> Any:
    """Whatever the file's JSON holds, UTF-8 whatever the locale: a reader checks its shape before taking it as a
    record (evidence.records). ValueError (bad JSON, bad UTF-8, nested too deeply, TooLarge) or OSError."""
    with _open_record(path) as raw:
        data = raw.read()
    return _parse_json(path, data)


def read_json_or_gzip(path: Path) -> Any:
    """read_json, and a ``.json.gz`` (gzip by the name's suffix) unzipped first: the run records in docs/runs are
    stored gzipped (``gzip -9 -n``), since the working tree travels to the GPU box under a 64 MiB limit and each GPU
    run's record, written with indent=2, is hundreds of KB. For the tests, tools and benchmarks that take such a
    record; the results store's files are never gzipped. The same limits and errors as read_json: the file on disk,
    then what it unzips to, over MAX_RECORD_BYTES is TooLarge; a broken gzip stream or its bad content is a
    ValueError naming the file."""
    path = Path(path)
    if path.suffix != ".gz":
        return read_json(path)
    with _open_record(path) as raw:
        try:
            with gzip.GzipFile(fileobj=raw) as fh:
                data = fh.read(MAX_RECORD_BYTES + 1)  # a gzip bomb stops here, not in memory
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:  # cut short, not gzip, a bad CRC: bad data, as bad
            raise ValueError(f"{path}: {exc}") from None  # JSON is, naming the file
    if len(data) > MAX_RECORD_BYTES:
        raise TooLarge(f"{path}: unzips to over the {MAX_RECORD_BYTES // 2**20} MiB a record file may be: not read")
    try:
        return _parse_json(path, data)
    except TooDeep:
        raise
    except ValueError as exc:  # not UTF-8, not JSON: the file named, as read_json's callers print it
        raise ValueError(f"{path}: {exc}") from None
