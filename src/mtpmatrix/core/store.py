"""Results store: ``results/<run-id>/<row-id>/`` with row.json, freeze.txt, check.txt, junit.xml, tiers.json, logs.

Every JSON file is written atomically (temp file in the same folder, fsync, rename), so a killed matrix leaves
either the old file or the new one, never half of one; ``--resume`` trusts any row.json that has a verdict.

Reading a run back (the report, bisect) goes through here too: find_run, read_run, read_freeze and the per-question
GSM8K records a check names.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

from packaging.utils import canonicalize_name

from mtpmatrix.core.atomic import atomic_write_json, read_json, refused_unread
from mtpmatrix.core.evidence.manifest import FILE as MANIFEST_FILE
from mtpmatrix.core.paths import SIDE_RUN_PREFIXES, NameError_, single_name
from mtpmatrix.core.record_types import InstallRecord, RowRecord
from mtpmatrix.core.schema import FREEZE_FILE, KNOWN_UPSTREAM, ROW_FILE, SCHEMA, worst

# install failures of the machine, not of the row's packages (core/failures.classify_install's labels)
ENVIRONMENT_INSTALL_FAILURES = ("index unreachable", "python missing")


def install_failed_by_machine(install: InstallRecord) -> bool:
    """Whether a failed install is the machine's (an index that did not answer, no interpreter): the row was not
    built, which says nothing of sglang."""
    return str((install.get("failure") or {}).get("message") or "").startswith(ENVIRONMENT_INSTALL_FAILURES)


def row_verdict(row_record: RowRecord) -> str:
    """The sglang verdict of a row: the worst of its tiers, where a tier failing only on known upstream issues
    (known_upstream.json) counts as passed (the report lists those issues next to the row) and a 'partial' tier
    (mtpmatrix.core.expected: nothing failed, not everything ran) makes the row partial."""
    install = row_record.get("install", {})
    if install.get("verdict") == "failed":
        return "error" if install_failed_by_machine(install) else "failed"
    tiers = row_record.get("tiers") or {}
    return worst("passed" if t.get("verdict") == KNOWN_UPSTREAM else t.get("verdict") for t in tiers.values())


def row_files(run_dir: Path) -> list[Path]:
    """Every ``<row>/row.json`` of a run, in row-id order. A folder whose name starts with '.' is never a row: an
    import assembles its row in ``.import-<row>-<pid>/`` before renaming it into place, and a killed one leaves it."""
    return sorted(f for f in Path(run_dir).glob(f"*/{ROW_FILE}") if not f.parent.name.startswith("."))


def is_matrix_run(path: Path) -> bool:
    """A folder that holds at least one ``<row>/row.json`` and is not a bisect or CI run (nor hidden, nor a link)."""
    path = Path(path)
    return (
        path.is_dir()
        and not path.is_symlink()
        and not path.name.startswith((".", *SIDE_RUN_PREFIXES))
        and bool(row_files(path))
    )


def recorded_time(record: object) -> _dt.datetime | None:
    """When a row record says its row ran: its ``finished`` time, else its ``started`` (ISO 8601; a time without a
    zone is UTC); None when it records neither."""
    if not isinstance(record, dict):
        return None
    for key in ("finished", "started", "created"):
        value = record.get(key)
        if isinstance(value, str):
            try:
                t = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)
    return None


def run_time(run_dir: Path) -> _dt.datetime | None:
    """When a run last recorded something: the latest of its rows' recorded times and its manifest's creation and
    resumptions, as the run wrote them. Never a file's time: a run copied in (``rsync -a``, a restored backup) keeps
    the times its files had, and they may lie in the future. Nor a recorded time still to come: a box whose clock ran
    ahead (its env.txt is a row's finished time) would otherwise stay "the latest" over every run after it."""
    stamps: list[_dt.datetime | None] = []
    for f in row_files(run_dir):
        try:
            stamps.append(recorded_time(read_json(f)))
        except (OSError, ValueError):
            continue
    try:
        plan = read_json(Path(run_dir) / MANIFEST_FILE)
    except (OSError, ValueError):
        plan = None
    if isinstance(plan, dict):
        stamps.append(recorded_time(plan))
        resumed = plan.get("resumed")
        for r in resumed if isinstance(resumed, list) else []:
            stamps.append(recorded_time({"created": r.get("at")}) if isinstance(r, dict) else None)
    now = _dt.datetime.now(_dt.UTC)
    times = [t for t in stamps if t is not None and t <= now]
    return max(times) if times else None


def latest_run_id(results: Path) -> str | None:
    """The matrix run under ``results`` that recorded its rows last (``run_time``: what the run wrote, so named
    runs such as ``--run-id probe-x`` order correctly among timestamped ones, and a run copied in with future file
    times is not taken for the newest); a run that records no time comes before every one that does; ties go to
    the larger name."""
    results = Path(results)
    if not results.is_dir():
        return None
    never = _dt.datetime.min.replace(tzinfo=_dt.UTC)
    runs = [(run_time(p) or never, p.name) for p in results.iterdir() if is_matrix_run(p)]
    return max(runs)[1] if runs else None


class StoreError(ValueError):
    """A run that cannot be read as asked (no such run, no rows, an unreadable row record); the message is one
    line."""


def find_run(results: Path, run_id: str | None) -> Path:
    """The folder of run ``run_id`` under ``results`` (None: the latest matrix run); StoreError when it is missing
    or holds no rows."""
    results = Path(results)
    if run_id is not None:
        try:
            single_name(run_id, "run")
        except NameError_ as exc:  # a path would read (and write the report) outside the results root
            raise StoreError(f"{exc}: name a run under {results}/") from None
    if run_id is None:
        run_id = latest_run_id(results)
        if run_id is None:
            raise StoreError(f"no runs under {results}/ (run the matrix first: nox -s gemma4_mtp)")
    run_dir = results / run_id
    if run_dir.is_symlink():  # import refuses one too: what it points at is not the results root's to judge or write
        raise StoreError(
            f"run {run_id!r} ({run_dir}) is a link to {run_dir.readlink()}: name a run folder of {results}/"
        )
    if not run_dir.is_dir():
        known = sorted(p.name for p in results.iterdir() if is_matrix_run(p))[-5:] if results.is_dir() else []
        raise StoreError(
            f"no such run {run_id!r} under {results}/" + (f" (latest: {', '.join(known)})" if known else "")
        )
    if not row_files(run_dir):
        raise StoreError(f"run {run_id!r} ({run_dir}) has no rows (no */{ROW_FILE})")
    why = oversized_record(run_dir)
    if why:
        raise StoreError(why)
    return run_dir


RECORD_SUFFIXES = (".json", ".jsonl", ".xml")  # and freeze.txt: what the report reads of a run; logs are only linked


def oversized_record(run_dir: Path) -> str | None:
    """Why a record file of ``run_dir`` (its manifests, and each row's row.json, tiers.json, junit.xml, freeze.txt,
    per-question records) is not to be read (atomic.refused_unread: too large, no regular file), None when none is; its
    own report/ folder aside.
    Looked at before anything of the run is read."""
    for folder, dirs, files in os.walk(run_dir):  # links to folders are not followed
        here = Path(folder)
        if here == Path(run_dir):
            dirs[:] = [d for d in dirs if d != "report"]
        for name in sorted(files):
            if name.endswith(RECORD_SUFFIXES) or name == FREEZE_FILE:
                why = refused_unread(here / name)
                if why:
                    return why
    return None


def read_run(run_dir: Path) -> dict[str, RowRecord]:
    """{row id: row record} of every ``<row>/row.json`` of a run, in row-id order; an unreadable one stands as
    ``{"unreadable": [why]}`` (the report says it proves nothing, evidence.records), hidden folders are skipped."""
    out: dict[str, RowRecord] = {}
    for f in row_files(run_dir):  # hidden staging folders (an import under way, or killed) are no rows
        try:
            out[f.parent.name] = read_json(f)
        except (OSError, ValueError) as exc:  # ValueError: bad JSON, bad UTF-8
            out[f.parent.name] = {"unreadable": [f"{ROW_FILE} unreadable ({type(exc).__name__}: {exc})"]}
    return out


def records_file(value: object, row_dir: Path) -> Path | None:
    """The per-question file a RECORDS metric names (row-relative, schema.gsm8k_records), if it is there; paths
    that would leave the row folder name nothing, and so do those oversized_record's walk did not bound (another
    suffix, a path through a link) or would refuse: no record is read that was not held to the size limit."""
    if not isinstance(value, str) or Path(value).is_absolute() or ".." in Path(value).parts:
        return None
    path = Path(row_dir) / value
    if not path.name.endswith(RECORD_SUFFIXES) or path.resolve() != Path(row_dir).resolve() / value:
        return None
    return path if path.is_file() and refused_unread(path) is None else None


_READ_ONCE: contextvars.ContextVar[dict[str, dict[int, bool]] | None] = contextvars.ContextVar(
    "question_records_read", default=None
)


@contextlib.contextmanager
def reading_once() -> Iterator[None]:
    """Within it, each per-question file is read once: one report judges a row's counts against its records, shows
    them and pairs them across rows and runs from the same reading (a file rewritten meanwhile cannot make the
    judgement and the table disagree)."""
    token = _READ_ONCE.set({})
    try:
        yield
    finally:
        _READ_ONCE.reset(token)


def read_question_records(path: Path) -> dict[int, bool]:
    """Per-question correctness from a JSONL file whose lines carry an integer ``index`` and a boolean ``correct``;
    other lines (a half-written last line, foreign or edited records) are skipped, so they count as missing. Inside
    ``reading_once`` a file already read is not read again."""
    seen = _READ_ONCE.get()
    key = str(Path(path).resolve())
    if seen is not None and key in seen:
        return dict(seen[key])
    out = _parse_question_records(path)
    if seen is not None:
        seen[key] = dict(out)
    return out


def _parse_question_records(path: Path) -> dict[int, bool]:
    out: dict[int, bool] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # nested too deeply is no record either
                continue
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("index"), int)
                and not isinstance(rec["index"], bool)
                and isinstance(rec.get("correct"), bool)
            ):
                out[rec["index"]] = rec["correct"]
    return out


SELF_PACKAGES = {"gemma4-mtp-matrix", "mtpmatrix"}  # this project, installed into every row: never a difference


def parse_freeze(text: str) -> dict[str, str]:
    """``name==version`` / ``name @ url`` lines as {canonical name: version or url}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")):
            continue
        if "==" in line:
            name, ver = line.split("==", 1)
        elif " @ " in line:
            name, ver = line.split(" @ ", 1)
        else:
            continue
        name = canonicalize_name(name.strip())
        if name not in SELF_PACKAGES:
            out[name] = ver.strip()
    return out


def read_freeze(row_dir: Path) -> dict[str, str] | None:
    """The row's installed packages (parse_freeze of its freeze.txt); None when the row never installed."""
    f = Path(row_dir) / FREEZE_FILE
    # pip writes UTF-8; a byte that is not only garbles its own line's name, which then matches nothing
    return parse_freeze(f.read_bytes().decode("utf-8", errors="replace")) if f.is_file() else None


class RunStore:
    """One matrix run on disk."""

    def __init__(self, root: Path, run_id: str):
        self.root = Path(root)
        self.run_id = run_id
        self.path = self.root / run_id

    @classmethod
    def latest(cls, root: Path) -> RunStore | None:
        run_id = latest_run_id(root)
        return cls(root, run_id) if run_id else None

    def row_dir(self, row_id: str) -> Path:
        d = self.path / row_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def row_ids(self) -> list[str]:
        return [f.parent.name for f in row_files(self.path)]

    def load_row(self, row_id: str) -> RowRecord | None:
        f = self.path / row_id / ROW_FILE
        record: RowRecord | None = read_json(f) if f.exists() else None
        return record

    def finished(self, row_id: str) -> bool:
        """True when the row has a final verdict (what ``--resume`` skips)."""
        rec = self.load_row(row_id)
        return rec is not None and bool(rec) and rec.get("verdict") not in (None, "pending")

    def save_row(self, row_id: str, record: RowRecord) -> Path:
        record = record.copy()
        record.setdefault("schema", SCHEMA)
        record["run_id"] = self.run_id
        f = self.row_dir(row_id) / ROW_FILE
        atomic_write_json(f, record)
        return f

    def all_rows(self) -> dict[str, RowRecord | None]:
        return {rid: self.load_row(rid) for rid in self.row_ids()}
