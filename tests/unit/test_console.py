"""A row's console (mtpmatrix.runner.console): the lines that matter from the row's pytest processes, every line in
pytest.log. Fed real pytest output: two side-by-side processes of a small suite through the plugin
(test_side_by_side's suite), and one pytest that dies before its summary."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from test_side_by_side import _command, _env, _suite

from mtpmatrix.core.schema import PYTEST_LOG
from mtpmatrix.runner import console, side_by_side
from mtpmatrix.runner.side_by_side import REFERENCE, SGLANG


def _shown(full: bool = False) -> tuple[console.RowConsole, list[str]]:
    lines: list[str] = []
    return console.RowConsole(full=full, write=lambda text: lines.extend(text.splitlines())), lines


def test_a_side_by_side_row_shows_its_failures_skips_and_summary_lines_and_logs_the_rest(tmp_path, monkeypatch):
    suite, env = _suite(tmp_path), _env(monkeypatch)
    # two more smoke checks in another file: pytest's -rs gives each file its own SKIPPED line, the console one
    (suite / "test_more.py").write_text(
        "import pytest\n\n\n@pytest.mark.smoke\n@pytest.mark.parametrize('n', [1, 2])\ndef test_more(n):\n    pass\n"
    )
    out = tmp_path / "row"
    out.mkdir()
    shown, lines = _shown()
    cmd = [*_command(suite, out, "pytest"), "-ra"]  # the suite's -ra (pyproject.toml's addopts)
    rc = side_by_side.run(cmd, [SGLANG, REFERENCE], out, env, tmp_path, echo=shown)
    shown.close()
    assert rc == 1
    log = (out / PYTEST_LOG).read_text().splitlines()
    # every check that failed or errored, in both processes, with the process's prefix on the second one's
    failures = [ln for ln in log if ln.startswith(("FAILED ", "ERROR "))]
    assert len(failures) == 4
    assert sorted(ln.removeprefix("[reference] ") for ln in lines if "FAILED " in ln or "ERROR " in ln) == sorted(
        failures
    )
    # each process's summary line, after its skips (one line per reason, the counts over its files summed)
    summaries = {
        ln.startswith("[reference] "): i
        for i, ln in enumerate(lines)
        if re.match(r"=+ \d+ failed, .* in [\d.]+s =+$", ln.removeprefix("[reference] "))
    }
    assert sorted(summaries) == [False, True]  # the processes end in either order
    skips = [ln for ln in lines if "SKIPPED" in ln]
    assert len([ln for ln in log if ln.startswith("SKIPPED") and "smoke tier" in ln]) == 2  # one per file
    assert "SKIPPED [3] smoke tier: needs 1 CUDA GPU(s)" in skips
    assert all(lines.index(s) < summaries[s.startswith("[reference] ")] for s in skips)
    # the plugin's lines say which tiers run
    assert "mtpmatrix tier contract: available" in lines
    # and nothing else: no progress rows, no tracebacks, no section headers (they are in the log)
    assert not [ln for ln in lines if ln.startswith(("E ", "tests/", "test_tiers.py ", "_____"))]
    assert [ln for ln in log if ln.startswith("E ")] and len(lines) < len(log) / 2


def test_verbose_shows_every_line(tmp_path):
    shown, lines = _shown(full=True)
    for text in ("collected 3 items\n", "E   AssertionError\n", "= 1 failed in 0.1s =\n"):
        shown.feed(text, "[reference] ")
    shown.close()
    assert lines == [
        "[reference] collected 3 items",
        "[reference] E   AssertionError",
        "[reference] = 1 failed in 0.1s =",
    ]


def test_a_session_without_its_summary_line_shows_its_last_lines(tmp_path):
    (tmp_path / "conftest.py").write_text("import no_such_module_here\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    shown, lines = _shown()
    for line in (done.stdout + done.stderr).splitlines(keepends=True):
        shown.feed(line)
    shown.close()
    assert lines[0].startswith("(pytest printed no summary line; its last")
    assert any("ModuleNotFoundError: No module named 'no_such_module_here'" in ln for ln in lines)


@pytest.mark.parametrize(
    "args, env, full",
    [
        ([], {}, False),
        (["-k", "topk3"], {"MTPMATRIX_VERBOSE": "0"}, False),
        ([], {"MTPMATRIX_VERBOSE": "1"}, True),
        (["-v"], {}, True),
        (["-vv"], {}, True),
        (["--verbose"], {}, True),
        (["--verbosity=2"], {}, True),
        (["--verbosity=0"], {}, False),
    ],
)
def test_the_whole_stream_on_the_console_when_asked(args, env, full):
    assert console.verbose(args, env) is full
