"""rows.py: a row file parses into a Row; every malformed file fails with ONE line naming file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version

from mtpmatrix.core.rows import HEADER_KEYS, REQUIRED_PINS, Row, RowError, load_rows, parse_override, parse_row
from mtpmatrix.core.settings import MIN_TRANSFORMERS

REPO = Path(__file__).resolve().parents[2]
HEADER = "# python: 3.11\n# torch-backend: pypi\n# tags: floor, ci\n# description: a test row\n"
PINS = "sglang==0.5.13\ntransformers==5.8.1\ntorch==2.11.0\n"


def write(tmp_path: Path, text: str, name: str = "sglang-0.5.13.txt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(path: Path) -> str:
    with pytest.raises(RowError) as info:
        parse_row(path)
    return str(info.value)


def test_valid_row(tmp_path):
    p = write(tmp_path, HEADER + "# gpus: 2\n" + PINS + "numpy<3  # kept verbatim\n")
    row = parse_row(p)
    assert isinstance(row, Row)
    assert row.id == "sglang-0.5.13"
    assert (row.python, row.torch_backend) == ("3.11", "pypi")
    assert row.pins == {"sglang": "0.5.13", "transformers": "5.8.1", "torch": "2.11.0"}
    assert (row.sglang, row.transformers, row.torch) == ("0.5.13", "5.8.1", "2.11.0")
    assert row.tags == ("floor", "ci")
    assert row.default is True
    assert row.gpus == 2
    assert row.description == "a test row"
    assert row.extra_lines == ("numpy<3",)
    d = row.as_dict()
    assert d["constraints"] == p.name and d["pins"]["torch"] == "2.11.0" and d["gpus"] == 2


def test_defaults_and_cuda_backend(tmp_path):
    p = write(tmp_path, "# python: 3.12\n# torch-backend: cu130\n# default: false\n" + PINS, "x-cu130.txt")
    row = parse_row(p)
    assert (row.python, row.torch_backend, row.default, row.gpus, row.tags) == ("3.12", "cu130", False, 1, ())


def test_comment_after_the_pins_is_not_header(tmp_path):
    """Only the comment block before the first pin is the header; later '# key: value' comments are notes."""
    row = parse_row(write(tmp_path, HEADER + PINS + "# note: free text after the pins\n"))
    assert row.gpus == 1


# (case name, file text, line the error must name, words the message must hold)
MALFORMED = [
    ("unknown header key", "# python: 3.11\n# torch-backend: pypi\n# gpu: 2\n" + PINS, 3, "unknown header key 'gpu'"),
    ("missing pin", HEADER + "sglang==0.5.13\ntransformers==5.8.1\n", 6, "missing exact pin(s) for torch"),
    ("non-exact pin", HEADER + "sglang>=0.5.13\ntransformers==5.8.1\ntorch==2.11.0\n", 5, "pinned exactly"),
    ("wildcard pin", HEADER + "sglang==0.5.13\ntransformers==5.8.*\ntorch==2.11.0\n", 6, "pinned exactly"),
    ("two specifiers", HEADER + "sglang==0.5.13\ntransformers==5.8.1\ntorch==2.11.0,<3\n", 7, "pinned exactly"),
    ("bad torch-backend", "# python: 3.11\n# torch-backend: cuda12\n" + PINS, 2, "torch-backend 'cuda12'"),
    (
        "old transformers",
        HEADER + "sglang==0.5.13\ntransformers==5.7.0\ntorch==2.11.0\n",
        6,
        "transformers 5.7.0 predates gemma4_assistant",
    ),
    ("duplicate pin", HEADER + PINS + "torch==2.11.0\n", 8, "torch is pinned twice"),
    ("duplicate pin, other spelling", HEADER + PINS + "Torch==2.11.0\n", 8, "pinned twice"),
    ("bad python", "# python: 3.11.7\n# torch-backend: pypi\n" + PINS, 1, "python must look like 3.11"),
    ("python 2", "# torch-backend: pypi\n# python: py311\n" + PINS, 2, "python must look like 3.11"),
    ("missing python header", "# torch-backend: pypi\n" + PINS, 1, "missing header '# python: ...'"),
    ("not a requirement", HEADER + "sglang=0.5.13\n", 5, "not a requirement line"),
    ("bad default", "# python: 3.11\n# torch-backend: pypi\n# default: maybe\n" + PINS, 3, "default must be"),
    ("bad gpus", "# python: 3.11\n# torch-backend: pypi\n# gpus: two\n" + PINS, 3, "gpus must be an integer"),
]


@pytest.mark.parametrize("text,line,words", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_row_is_one_line_naming_file_and_line(tmp_path, text, line, words):
    p = write(tmp_path, text)
    msg = error_of(p)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{p}:{line}: "), msg
    assert words in msg, msg


def test_bad_row_id_names_the_file(tmp_path):
    p = write(tmp_path, HEADER + PINS, "Sglang_0.5.13.txt")
    msg = error_of(p)
    assert "\n" not in msg and msg.startswith(str(p)) and "row id 'Sglang_0.5.13'" in msg


def test_load_rows_sorted_and_empty_dir(tmp_path):
    write(tmp_path, HEADER + PINS, "b.txt")
    write(tmp_path, HEADER + PINS, "a.txt")
    (tmp_path / "README.md").write_text("not a row\n")
    assert [r.id for r in load_rows(tmp_path)] == ["a", "b"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RowError, match="no row files"):
        load_rows(empty)


def test_load_rows_stops_at_the_first_bad_file(tmp_path):
    write(tmp_path, HEADER + PINS, "a.txt")
    bad = write(tmp_path, HEADER + PINS + "torch==2.11.0\n", "b.txt")
    with pytest.raises(RowError, match=re.escape(f"{bad}:8: torch is pinned twice")):
        load_rows(tmp_path)


def test_real_constraints_dir_loads():
    rows = load_rows(REPO / "constraints")
    assert rows, "constraints/ holds no rows"
    ids = [r.id for r in rows]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for r in rows:
        assert set(REQUIRED_PINS) <= set(r.pins)
        assert Version(r.transformers) >= Version(MIN_TRANSFORMERS)
        assert r.gpus >= 1
    assert any(r.default for r in rows)
    assert any("ci" in r.tags for r in rows), "nox -t ci needs a row tagged ci"
    # every header key used in the real files is a known one (guards the doc block in rows.py)
    for r in rows:
        keys = {m.group(1) for m in re.finditer(r"^#\s*([a-z\-]+)\s*:", r.path.read_text(), re.M)}
        assert keys <= HEADER_KEYS


@pytest.mark.parametrize("spec", ["transformers==5.20.0", "transformers>=5.20,<6", "flashinfer-python==0.4.0"])
def test_parse_override_ok(spec):
    assert parse_override(spec).specifier


@pytest.mark.parametrize(
    "spec,words",
    [
        ("transformers", "give a version"),
        ("transformers=5.20.0", "not a requirement"),
        ("transformers @ https://example.com/t.whl", "give a version"),
        ("transformers==5.20.0; python_version<'3.12'", "markers are not supported"),
    ],
)
def test_parse_override_errors_are_one_line(spec, words):
    with pytest.raises(RowError) as info:
        parse_override(spec)
    assert words in str(info.value) and "\n" not in str(info.value)
