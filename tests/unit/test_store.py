"""store.py: atomic writes, resume bookkeeping (finished only with a final verdict), latest run, verdict order."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os

import pytest

from mtpmatrix.core import atomic, store
from mtpmatrix.core.atomic import atomic_write_json, atomic_write_text
from mtpmatrix.core.paths import new_run_id
from mtpmatrix.core.schema import worst
from mtpmatrix.core.store import RunStore, row_verdict


def test_atomic_write_text_and_json(tmp_path):
    f = tmp_path / "deep" / "dir" / "a.json"
    atomic_write_json(f, {"verdict": "passed", "when": dt.date(2026, 1, 2)})
    assert json.loads(f.read_text()) == {"verdict": "passed", "when": "2026-01-02"}
    atomic_write_text(f, "replaced\n")
    assert f.read_text() == "replaced\n"
    assert os.listdir(f.parent) == ["a.json"]


@pytest.mark.parametrize("fail_in", ["write", "fsync", "replace"])
def test_atomic_write_leaves_no_partial_file_when_it_raises(tmp_path, monkeypatch, fail_in):
    f = tmp_path / "row.json"
    atomic_write_json(f, {"verdict": "pending"})
    old = f.read_text()

    def boom(*a, **k):
        raise OSError(f"disk died in {fail_in}")

    if fail_in == "write":
        # the new content is half-written into the temp file when the error hits
        real_fdopen = os.fdopen

        class HalfFile:
            def __init__(self, fh):
                self.fh = fh

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.fh.close()

            def write(self, text):
                self.fh.write(text[: len(text) // 2])
                self.fh.flush()
                raise OSError("disk full")

        monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(atomic.os, fail_in, boom)
    with pytest.raises(OSError):
        atomic_write_json(f, {"verdict": "passed", "tiers": {"contract": {"verdict": "passed"}}})
    monkeypatch.undo()
    assert f.read_text() == old  # the old file, whole
    assert os.listdir(tmp_path) == ["row.json"]  # no temp file left behind


def test_atomic_write_first_write_failing_leaves_nothing(tmp_path, monkeypatch):
    f = tmp_path / "new.json"
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C mid-write cleans up too (BaseException)
        atomic_write_json(f, {"a": 1})
    assert not f.exists() and os.listdir(tmp_path) == []


def test_new_run_id_is_sortable_utc():
    t = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
    assert new_run_id(t) == "20260304-050607"
    assert new_run_id(t) < new_run_id(t + dt.timedelta(seconds=1))


def test_save_and_load_row(tmp_path):
    s = RunStore(tmp_path, "20260101-000000")
    assert s.load_row("r1") is None and s.row_ids() == [] and s.all_rows() == {}
    path = s.save_row("r1", {"verdict": "pending"})
    assert path == tmp_path / "20260101-000000" / "r1" / "row.json"
    rec = s.load_row("r1")
    assert rec == {"verdict": "pending", "schema": store.SCHEMA, "run_id": "20260101-000000"}
    s.row_dir("r2")  # a row folder without row.json is not a row (yet)
    assert s.row_ids() == ["r1"]


@pytest.mark.parametrize(
    "record,finished",
    [
        (None, False),
        ({"verdict": "pending"}, False),
        ({}, False),
        ({"row": {"id": "r"}}, False),
        ({"verdict": "passed"}, True),
        ({"verdict": "failed"}, True),
        ({"verdict": "error"}, True),
        ({"verdict": "skipped"}, True),
    ],
)
def test_finished_only_with_a_final_verdict(tmp_path, record, finished):
    s = RunStore(tmp_path, "run")
    if record is not None:
        s.save_row("r", record)
    assert s.finished("r") is finished


def test_latest_run(tmp_path):
    assert RunStore.latest(tmp_path / "missing") is None
    assert RunStore.latest(tmp_path) is None
    for age, run in enumerate(("20260301-000000", "probe-named", "20260201-000000", "bisect-20260401-000000")):
        (tmp_path / run / "row-a").mkdir(parents=True)
        # the time each run recorded (its file times say the opposite: a run copied in keeps whatever they were)
        finished = f"2001-09-09T01:{46 - age:02d}:40+00:00"
        (tmp_path / run / "row-a" / "row.json").write_text(json.dumps({"finished": finished}))
        os.utime(tmp_path / run / "row-a" / "row.json", (1e9 + age * 100, 1e9 + age * 100))
    (tmp_path / "20260501-000000").mkdir()  # no row.json: not a run (yet)
    (tmp_path / "zzz-not-a-dir.txt").write_text("x")
    latest = RunStore.latest(tmp_path)
    assert latest.run_id == "20260301-000000" and latest.path == tmp_path / "20260301-000000"
    # `nox -t ci` after the matrix: its newer ci- run is not what the report shows by default
    (tmp_path / "ci-20260601-000000" / "row-a").mkdir(parents=True)
    (tmp_path / "ci-20260601-000000" / "row-a" / "row.json").write_text("{}")
    assert RunStore.latest(tmp_path).run_id == "20260301-000000"


@pytest.mark.parametrize(
    "verdicts,expected",
    [
        (["passed", "skipped"], "passed"),
        (["passed", "failed", "error"], "failed"),
        (["passed", "error"], "error"),
        (["skipped", "skipped"], "skipped"),
        (["passed", "pending"], "pending"),
        (["failed", "pending"], "failed"),
        ([], "skipped"),
        ([None, ""], "skipped"),
    ],
)
def test_worst(verdicts, expected):
    assert worst(verdicts) == expected


def test_row_verdict():
    assert row_verdict({"install": {"verdict": "failed"}, "tiers": {"contract": {"verdict": "passed"}}}) == "failed"
    assert (
        row_verdict(
            {
                "install": {"verdict": "passed"},
                "tiers": {"contract": {"verdict": "passed"}, "smoke": {"verdict": "skipped"}},
            }
        )
        == "passed"
    )
    assert row_verdict({"install": {"verdict": "passed"}, "tiers": {"contract": {"verdict": "error"}}}) == "error"
    assert row_verdict({"install": {"verdict": "passed"}}) == "skipped"


def test_read_json_or_gzip_reads_a_record_plain_or_gzipped(tmp_path, monkeypatch):
    """docs/runs keeps its records as NAME.json.gz: read the same as the plain file; bad or oversized gzip refused."""
    data = {"tiers": {"smoke": {"verdict": "passed"}}, "note": "naïve"}
    plain = tmp_path / "r.json"
    atomic_write_json(plain, data)
    zipped = tmp_path / "r.json.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    assert atomic.read_json_or_gzip(plain) == atomic.read_json_or_gzip(zipped) == data
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(zipped.read_bytes()[:-12])
    not_gzip = tmp_path / "plain.json.gz"
    not_gzip.write_bytes(plain.read_bytes())
    bad_crc = tmp_path / "crc.json.gz"
    body = bytearray(zipped.read_bytes())
    body[-8] ^= 0xFF  # the trailer's CRC-32
    bad_crc.write_bytes(bytes(body))
    latin1 = tmp_path / "latin1.json.gz"
    latin1.write_bytes(gzip.compress('{"note": "naïve"}'.encode("latin-1")))
    for bad in (cut, not_gzip, bad_crc, latin1):  # each a ValueError naming the file, as bad JSON is
        with pytest.raises(ValueError, match=bad.name):
            atomic.read_json_or_gzip(bad)
    monkeypatch.setattr(atomic, "MAX_RECORD_BYTES", 40)  # unzipped over the limit, the file itself under it
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b"[" + b"0," * 100 + b"0]"))
    assert bomb.stat().st_size <= 40
    with pytest.raises(atomic.TooLarge, match="unzips to over"):
        atomic.read_json_or_gzip(bomb)


def test_atomic_write_makes_an_ordinary_file(tmp_path):
    f = tmp_path / "row.json"
    atomic_write_json(f, {})
    umask = os.umask(0)
    os.umask(umask)
    assert f.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def test_a_hidden_folder_of_a_run_is_never_a_row(tmp_path):
    """A killed import leaves its staging folder (``.import-<row>-<pid>/``, row.json and all) in the run: no reader
    of the store takes it for a row, and a run that holds nothing else is no run."""
    run = tmp_path / "r1"
    atomic_write_json(run / ".import-sglang-0.5.17-4242" / "row.json", {"verdict": "passed"})
    assert not store.is_matrix_run(run) and store.latest_run_id(tmp_path) is None
    with pytest.raises(store.StoreError, match="has no rows"):
        store.find_run(tmp_path, "r1")
    s = RunStore(tmp_path, "r1")
    s.save_row("sglang-0.5.23", {"verdict": "failed"})
    assert store.is_matrix_run(run) and store.latest_run_id(tmp_path) == "r1"
    assert list(store.read_run(run)) == s.row_ids() == list(s.all_rows()) == ["sglang-0.5.23"]
    # a hidden run folder is not a run either
    atomic_write_json(tmp_path / ".r2" / "row-a" / "row.json", {"verdict": "passed"})
    assert store.latest_run_id(tmp_path) == "r1"
