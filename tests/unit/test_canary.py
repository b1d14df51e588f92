"""Canary rows and the releases listing: resolution against a fake index (no network), bad input in one line."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.rows import RowError, load_rows
from mtpmatrix.runner import canary as cn
from mtpmatrix.runner import culprit, index, releases

REPO = Path(__file__).resolve().parents[2]

INDEX = {  # a fake index, as index.releases answers: sorted final releases
    "sglang": ["0.5.13", "0.5.17", "0.5.23"],
    "transformers": ["5.8.1", "5.12.1", "5.13.0", "5.19.0", "5.23.0", "5.24.0"],
    "torch": ["2.11.0", "2.14.1", "2.15.0"],
}


def fetch(name):
    if name not in INDEX:
        raise index.IndexError_(f"package {name!r} is not on the index https://fake/simple")
    return [Version(v) for v in INDEX[name]]


def unreachable(name):
    raise index.IndexError_("index https://fake/simple is unreachable ([Errno 111] Connection refused)")


@pytest.fixture
def rows(tmp_path):
    d = tmp_path / "constraints"
    (d / "canary").mkdir(parents=True)
    (d / "sglang-0.5.17.txt").write_text(
        "# python: 3.11\n# torch-backend: pypi\nsglang==0.5.17\ntransformers==5.12.1\ntorch==2.11.0\n"
    )
    (d / "sglang-0.5.23.txt").write_text(
        "# python: 3.11\n# torch-backend: pypi\n# tags: latest\n"
        "sglang==0.5.23\ntransformers==5.19.0\ntorch==2.14.1\nsome-extra==1.0\n"
    )
    return d


def write(d: Path, name: str, text: str) -> Path:
    f = d / "canary" / f"{name}.txt"
    f.write_text(text)
    return f


def load(d):
    return cn.load_canaries(d, load_rows(d))


def test_real_canaries_load_and_stay_out_of_the_pinned_rows():
    rows = load_rows(REPO / "constraints")
    canaries = cn.load_canaries(REPO / "constraints", rows)
    assert canaries and not set(canaries) & {r.id for r in rows}
    assert {c.mode for c in canaries.values()} == set(cn.MODES)
    assert "sglang-0.5.17-transformers" in canaries and canaries["sglang-0.5.17-transformers"].override


def test_override_canary_takes_the_newest_release_in_its_range(rows):
    write(rows, "t", "# from: sglang-0.5.17\n# mode: canary-override\ntransformers>=5.12\n")
    res = cn.resolve(load(rows)["t"], fetch=fetch)
    assert res.versions == {"transformers": "5.24.0"}
    assert res.moved == {"transformers": ("5.12.1", "5.24.0")}
    assert res.overrides == ["transformers==5.24.0"]
    assert "transformers 5.12.1 -> 5.24.0" in cn.describe_resolution(res)
    # the row it installs is the pinned row under the canary's id: the moved package goes in as an override
    row = cn.canary_row(res, rows / "out")
    assert row.id == "t" and row.pins == {"sglang": "0.5.17", "transformers": "5.12.1", "torch": "2.11.0"}


def test_a_range_that_excludes_the_newest_is_honoured_and_nothing_moved_is_said(rows):
    write(rows, "t", "# from: sglang-0.5.23\n# mode: canary-override\ntransformers>=5.19,<5.20\ntorch\n")
    res = cn.resolve(load(rows)["t"], fetch=fetch)
    assert res.versions == {"transformers": "5.19.0", "torch": "2.15.0"}
    assert res.moved == {"torch": ("2.14.1", "2.15.0")}
    write(rows, "t", "# from: sglang-0.5.23\n# mode: canary-override\ntransformers==5.19.0\n")
    res = cn.resolve(load(rows)["t"], fetch=fetch)
    assert res.moved == {} and "nothing moved" in cn.describe_resolution(res)


def test_canary_mode_asks_the_resolver_and_writes_a_pinned_row(rows):
    write(rows, "latest", "# from: sglang-0.5.23\n# mode: canary\nsglang>=0.5.17\ntorch>=2.11\n")
    c = load(rows)["latest"]
    asked = []

    def compile_(canary):  # uv would answer what sglang's requirements allow: here torch stays below 2.15
        asked.append(canary.id)
        return {"sglang": "0.5.23", "torch": "2.14.1"}

    res = cn.resolve(c, fetch=fetch, compile_=compile_)
    assert asked == ["latest"] and res.moved == {}
    row = cn.canary_row(res, rows / "out")
    assert row.id == "latest" and row.pins == {"sglang": "0.5.23", "transformers": "5.19.0", "torch": "2.14.1"}
    assert row.extra_lines == ("some-extra==1.0",)
    text = (rows / "out" / "latest.txt").read_text()
    assert "torch==2.14.1  # floats: torch>=2.11" in text and "# tags: latest" in text


def test_canary_mode_range_is_checked_against_the_index_before_the_resolver(rows):
    write(rows, "latest", "# from: sglang-0.5.23\n# mode: canary\ntorch>=3\n")
    with pytest.raises(releases.ReleaseError) as info:
        cn.resolve(load(rows)["latest"], fetch=fetch, compile_=lambda c: pytest.fail("resolver asked"))
    assert str(info.value) == "no release of torch satisfies torch>=3 (newest on the index: 2.15.0, 2.14.1, 2.11.0)"


@pytest.mark.parametrize(
    "text,where,words",
    [
        ("# mode: canary\ntorch>=2\n", ":1", "missing header '# from: ROW'"),
        ("# from: sglang-9\ntorch>=2\n", ":1", "from 'sglang-9' is not a row"),
        ("# from: sglang-0.5.17\n# mode: nightly\ntorch>=2\n", ":2", "mode must be one of canary, canary-override"),
        ("# from: sglang-0.5.17\n# colour: red\ntorch>=2\n", ":2", "unknown header key 'colour'"),
        ("# from: sglang-0.5.17\ntorch>=2\ntorch<3\n", ":3", "torch floats twice"),
        ("# from: sglang-0.5.17\ntorch>>2\n", ":2", "not a requirement line"),
        ("# from: sglang-0.5.17\ntorch>=2; python_version<'3'\n", ":2", "a floating package is a name and a range"),
        ("# from: sglang-0.5.17\n", "", "no floating package"),
    ],
)
def test_malformed_canary_is_one_line_naming_file_and_line(rows, text, where, words):
    f = write(rows, "bad", text)
    with pytest.raises(RowError) as info:
        load(rows)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{f}{where}") and words in msg


def test_a_canary_may_not_take_a_pinned_rows_id(rows):
    write(rows, "sglang-0.5.17", "# from: sglang-0.5.17\ntorch>=2\n")
    with pytest.raises(RowError, match="already a pinned row's id"):
        load(rows)


def test_unreachable_index_is_one_line_before_any_venv(rows, tmp_path, monkeypatch):
    """The real index client against a closed local port: main() stops with one line, no venv made."""
    write(rows, "t", "# from: sglang-0.5.17\n# mode: canary-override\ntransformers>=5.12\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connection refused
    monkeypatch.setenv("UV_DEFAULT_INDEX", f"http://127.0.0.1:{port}/simple")
    made = []
    monkeypatch.setattr(culprit.bisect, "make_venv", lambda *a, **k: made.append(a))
    logged = []
    rc = culprit.main(["t"], ["--results", str(tmp_path / "results")], constraints=rows, log=logged.append)
    assert rc == 2 and made == [] and not (tmp_path / "results").exists()
    assert len(logged) == 1 and logged[0].startswith(f"error: index http://127.0.0.1:{port}/simple is unreachable")


def test_unknown_canary_and_bad_budget_are_one_line(rows, tmp_path):
    logged = []
    assert culprit.main(["nope"], [], constraints=rows, log=logged.append) == 2
    assert logged == ["error: unknown canary nope; known: none"]
    write(rows, "t", "# from: sglang-0.5.17\ntransformers>=5.12\n")
    logged.clear()
    assert culprit.main(["t"], ["--budget", "soon"], constraints=rows, log=logged.append) == 2
    assert logged == ["error: --budget wants seconds, got 'soon'"]


def test_the_budget_is_the_session_s_and_pytest_s_args_go_after_a_second_double_dash(rows):
    assert culprit.split_budget(["--tiers", "contract", "--budget", "60", "--", "-k", "abi", "--budget", "1"]) == (
        60.0,
        ["--tiers", "contract", "--", "-k", "abi", "--budget", "1"],
    )
    assert culprit.split_budget(["--", "-x"]) == (None, ["--", "-x"])
    write(rows, "t", "# from: sglang-0.5.17\ntransformers>=5.12\n")
    logged = []  # an unknown option is bad input before any release is resolved: one line, no traceback
    assert culprit.main(["t"], ["--budget", "60", "-k", "abi"], constraints=rows, log=logged.append) == 2
    assert logged == [
        "error: nox -s gemma4_mtp -- : unknown option -k (pytest options go after a second --: "
        "nox -s gemma4_mtp -- -- -k topk3)"
    ]


# --- releases ----------------------------------------------------------------------------------------------------


def test_newest_and_its_errors():
    assert releases.newest("transformers", ">=5.12,<5.20", fetch=fetch) == Version("5.19.0")
    assert releases.newest("transformers", "", fetch=fetch) == Version("5.24.0")
    with pytest.raises(releases.ReleaseError, match=r"^index https://fake/simple is unreachable"):
        releases.newest("torch", ">=2", fetch=unreachable)
    with pytest.raises(releases.ReleaseError, match="not on the index"):
        releases.newest("nosuch", ">=1", fetch=fetch)


def test_untested_lists_releases_newer_than_every_pin_and_the_canaries_that_ran_them(rows, tmp_path):
    results = tmp_path / "results"
    atomic_write_json(
        results / "r1" / "c1" / "row.json",
        {"verdict": "failed", "canary": {"id": "c1"}, "versions": {"torch": "2.15.0", "transformers": "5.19.0"}},
    )
    atomic_write_json(
        results / "r1" / "sglang-0.5.23" / "row.json",
        {  # a pinned row: not a canary
            "verdict": "passed",
            "versions": {"transformers": "5.24.0"},
        },
    )
    atomic_write_json(
        results / "r2" / "c2" / "row.json",
        {"verdict": "pending", "canary": {"id": "c2"}, "versions": {"transformers": "5.23.0"}},
    )
    table = releases.untested(load_rows(rows), results, fetch=fetch)
    by = {e["package"]: e for e in table}
    assert by["sglang"] == {"package": "sglang", "newest_pin": "0.5.23", "newer": []}
    assert [n["version"] for n in by["transformers"]["newer"]] == ["5.23.0", "5.24.0"]
    assert all(n["canaries"] == [] for n in by["transformers"]["newer"])  # pending / pinned rows do not count
    assert by["torch"]["newer"] == [
        {"version": "2.15.0", "canaries": [{"row": "c1", "run": "r1", "verdict": "failed"}]}
    ]
    text = "\n".join(releases.lines(table))
    assert "sglang: nothing newer than the rows' pin 0.5.23" in text
    assert "2.15.0 (canaries: c1 failed (run r1))" in text and "5.24.0 (no canary has run it)" in text


def test_releases_cli(rows, tmp_path, capsys):
    ns = argparse.Namespace(json=True, results=tmp_path)
    assert releases.run(ns, fetch=fetch, rows=load_rows(rows)) == 0
    assert json.loads(capsys.readouterr().out)[2]["newer"][0]["version"] == "2.15.0"
    assert releases.run(ns, fetch=unreachable, rows=load_rows(rows)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: index https://fake/simple is unreachable")


def test_releases_command_is_wired_into_the_cli(tmp_path):
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple"}
    done = subprocess.run(
        [sys.executable, "-m", "mtpmatrix", "releases"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: index http://127.0.0.1:9/simple is unreachable")


# --- the report's canary section -----------------------------------------------------------------------------------


def test_report_section_puts_each_canary_next_to_its_pinned_row(rows, tmp_path):
    """The section reads the judged records it is given (the table's), and lists the releases past the rows' pins
    that the run's canaries installed, from their records alone."""
    from mtpmatrix.report import canaries as rc

    run = tmp_path / "results" / "r1"
    judged = {
        "sglang-0.5.17": {"verdict": "passed", "tiers": {}},
        "t": {
            "verdict": "failed",
            "versions": {"transformers": "5.24.0", "torch": "2.11.0"},
            "canary": {
                "id": "t",
                "mode": "canary-override",
                "from": "sglang-0.5.17",
                "moved": {"transformers": {"from": "5.12.1", "to": "5.24.0"}},
            },
        },
        "t-and-x": {"verdict": "failed", "canary": {"retry_of": "t"}},
    }
    atomic_write_json(run / "t" / "canary.json", {"summary": ["CULPRIT: transformers 5.13.0 breaks ..."]})
    pins = {"sglang": Version("0.5.23"), "transformers": Version("5.19.0"), "torch": Version("2.14.1")}
    sec = rc.section(run, judged, pins=pins)
    assert [c["id"] for c in sec["canaries"]] == ["t"]  # a companion retry is part of its canary, not a canary
    md = rc.markdown(sec)
    assert "| `t` | canary-override | `sglang-0.5.17` | transformers 5.12.1 -\\> 5.24.0 | failed | passed |" in md
    assert "CULPRIT: transformers 5.13.0 breaks ..." in md
    assert "- transformers: past the rows' pin 5.19.0: 5.24.0 (t failed)" in md
    assert "- torch: no canary of this run ran a release past the rows' pin 2.14.1" in md
    # a run without canary rows gets no section
    assert rc.section(run, {"sglang-0.5.17": judged["sglang-0.5.17"]}, pins=pins) is None


def test_html_report_carries_the_canary_section(tmp_path, monkeypatch):
    """report.html shows what summary.md shows of the canaries: the table, each answer, the releases no row pins."""
    from mtpmatrix.report import canaries as rc
    from mtpmatrix.report.cli import write_report

    run = tmp_path / "results" / "r1"
    atomic_write_json(
        run / "sglang-0.5.17" / "row.json", {"row": {"id": "sglang-0.5.17"}, "verdict": "passed", "tiers": {}}
    )
    atomic_write_json(
        run / "t" / "row.json",
        {
            "row": {"id": "t"},
            "verdict": "failed",
            "tiers": {},
            "canary": {
                "id": "t",
                "mode": "canary-override",
                "from": "sglang-0.5.17",
                "moved": {"transformers": {"from": "5.12.1", "to": "5.24.0"}},
            },
        },
    )
    atomic_write_json(run / "t" / "canary.json", {"summary": ["CULPRIT: transformers 5.13.0 breaks ..."]})
    pins = {"sglang": Version("0.5.23"), "transformers": Version("5.19.0"), "torch": Version("2.14.1")}
    real_section = rc.section
    monkeypatch.setattr(rc, "section", lambda run_dir, rows: real_section(run_dir, rows, pins=pins))
    summary, paths = write_report(tmp_path / "results", "r1")
    table = {r["id"]: r["verdict"] for r in summary["rows"]}
    html = paths["html"].read_text()
    assert "<h2>Canaries</h2>" in html
    assert (
        "<tr><td><code>t</code></td><td>canary-override</td><td><code>sglang-0.5.17</code></td>"
        f"<td>transformers 5.12.1 -&gt; 5.24.0</td><td>{table['t']}</td><td>{table['sglang-0.5.17']}</td></tr>"
    ) in html  # the verdicts the table shows
    assert "CULPRIT: transformers 5.13.0 breaks ..." in html
    assert "<li>torch: no canary of this run ran a release past the rows&#39; pin 2.14.1</li>" in html


def test_main_hands_the_session_what_the_canary_found(rows, tmp_path, monkeypatch):
    """The nox session's last line is main's outcome: it once said "breaks (culprit above and in canary.json)" for a
    canary that could not install, with no culprit above or in the file."""
    write(rows, "t", "# from: sglang-0.5.17\n# mode: canary-override\ntransformers>=5.12\n")
    c = load(rows)["t"]
    res = cn.Resolution(c, {"transformers": "5.25.0"}, {"transformers": ("5.12.1", "5.25.0")})
    conflict = "transformers 5.25.0 needs kernels>=0.19.1,<0.20; sglang 0.5.17 requires kernels>=0.14.1,<0.15"
    state = {
        "row": {"verdict": "failed", "tiers": "install failed: resolver conflict: ..."},
        "install": {"single": {"transformers": {"version": "5.25.0", "status": "bad", "detail": conflict}}},
        "summary": ["the answer"],
    }
    monkeypatch.setattr(culprit, "resolve", lambda canary: res)
    monkeypatch.setattr(culprit, "run_canary", lambda res, opts, budget_s, log: state)
    outcomes, logged = [], []
    results = tmp_path / "results"
    rc = culprit.main(
        ["t"], ["--results", str(results), "--run-id", "r"], constraints=rows, log=logged.append, outcomes=outcomes
    )
    assert rc == 1 and logged == ["the answer"]
    assert outcomes == [
        f"t: transformers 5.25.0 cannot install ({conflict}) — details above and in {results / 'r' / 't' / 'canary.json'}"
    ]
    assert "culprit" not in outcomes[0]
