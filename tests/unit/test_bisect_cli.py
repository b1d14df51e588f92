"""mtpmatrix.runner.bisect_cli: ``python -m mtpmatrix bisect`` with an injected probe (nothing is installed): its
bisect.json, exit codes, bad input, and the README's transformers bisect over records as the known-upstream entries
describe each release."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from probe_records import VERSIONS, fake

from mtpmatrix.core import options
from mtpmatrix.core.rows import load_rows
from mtpmatrix.runner import bisect as bs
from mtpmatrix.runner import bisect_cli

# made-up suites: records judged against what their sessions collected (conftest.judged_as_collected)
pytestmark = pytest.mark.usefixtures("judged_as_collected")

REPO = Path(__file__).resolve().parents[2]


# --- the CLI with an injected probe ---------------------------------------------------------------------------


def _ns(results, *argv):
    p = argparse.ArgumentParser(parents=[options.parent(run_id="bisect-<UTC timestamp>")])
    bisect_cli.add_arguments(p)
    return p.parse_args([*argv, "--results", str(results)])


def test_cli_bisects_with_injected_probe_and_writes_bisect_json(results, capsys):
    rows = load_rows(REPO / "constraints")
    cands = VERSIONS[3:15]
    ns = _ns(
        results,
        "transformers",
        cands[0],
        cands[-1],
        "--row",
        "sglang-0.5.17",
        "--tier",
        "reference",
        "--run-id",
        "bisect-test",
    )
    rc = bisect_cli.run(
        ns, probe_factory=lambda **kw: fake(6, uninstallable={2})(cands), releases=lambda n: VERSIONS, rows=rows
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert f"first bad release: transformers {cands[6]} (last good: {cands[5]})" in out
    data = json.loads((results / "bisect-test" / "bisect.json").read_text())
    assert data["first_bad"] == cands[6] and data["row"] == "sglang-0.5.17" and data["tier"] == "reference"
    assert data["outcome"] == "found" and len(data["probes"]) >= 3


def test_cli_no_bad_release_exits_1(results, capsys):
    ns = _ns(results, "transformers", "5.8.0", "5.9.0", "--row", "sglang-0.5.17", "--run-id", "bisect-ok")
    cands = ["5.8.0", "5.8.1", "5.8.2", "5.9.0"]
    assert bisect_cli.run(ns, probe_factory=lambda **kw: fake(None)(cands), releases=lambda n: VERSIONS) == 1
    assert "no bad release" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["transformers", "5.9.0", "5.8.0", "--row", "sglang-0.5.17"], "newer than BAD"),
        (["transformers", "5.8.0", "5.9.0", "--row", "sglang-9.9.9"], "unknown row 'sglang-9.9.9'"),
    ],
)
def test_cli_bad_input_exits_2(results, capsys, argv, words):
    assert bisect_cli.run(_ns(results, *argv), probe_factory=lambda: None, releases=lambda n: VERSIONS) == 2
    assert words in capsys.readouterr().err


# --- the README's transformers bisect, over records as the known-upstream entries describe each release -----------

README_RANGE = [
    "5.12.1",
    "5.13.0",
    "5.13.1",
    "5.14.0",
    "5.14.1",
    "5.15.0",
    "5.15.1",
    "5.16.0",
    "5.16.1",
    "5.17.0",
    "5.18.0",
    "5.19.0",
]
CANDIDATE = "hf-assisted-generation-gemma4-candidate-generator"


def readme_probes(calls: list):
    """A probe factory as make_probe's, over probe_records.reference_record instead of installs."""
    from probe_records import reference_record

    def factory(breaking=None, known_issue=None):
        def probe(v):
            calls.append(v)
            rec = reference_record(v)
            if known_issue is not None:
                return bs.classify_for_known(rec, "reference", v, 60.0, None, known_issue)
            return bs.classify_record(rec, "reference", v, 60.0, breaking=breaking)

        return probe

    return factory


def test_the_readme_transformers_bisect_finds_no_new_break_and_names_the_listed_one(results, capsys):
    """No run of the row broke the reference tier, so BAD is probed first: transformers 5.19.0 fails there only on
    a listed upstream issue, so there is no new break to search (every release of the range fails only on listed
    issues: before, each of the 12 was probed and the answer was 'inconclusive')."""
    calls = []
    ns = _ns(
        results,
        "transformers",
        "5.12.1",
        "5.19.0",
        "--row",
        "sglang-0.5.17",
        "--tier",
        "reference",
        "--run-id",
        "bisect-readme",
    )
    rc = bisect_cli.run(ns, probe_factory=readme_probes(calls), releases=lambda n: README_RANGE)
    out = capsys.readouterr().out
    assert (rc, calls) == (1, ["5.19.0"]), out
    lines = json.loads((results / "bisect-readme" / "bisect.json").read_text())["summary"]
    assert lines == [
        f"no new break to search: BAD transformers 5.19.0 fails reference only on listed upstream issues ({CANDIDATE})",
        f"  a listed upstream issue is not the break searched; where one began: --known {CANDIDATE}",
        "1 probe(s) over 12 release(s) in 0 s",
    ]


def test_the_readme_transformers_bisect_with_known_finds_where_the_listed_crash_began(results, capsys):
    calls = []
    ns = _ns(
        results,
        "transformers",
        "5.12.1",
        "5.19.0",
        "--row",
        "sglang-0.5.17",
        "--known",
        CANDIDATE,
        "--run-id",
        "bisect-readme-known",
    )
    rc = bisect_cli.run(ns, probe_factory=readme_probes(calls), releases=lambda n: README_RANGE)
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads((results / "bisect-readme-known" / "bisect.json").read_text())
    assert (data["tier"], data["known"], data["first_bad"], data["last_good"]) == (
        "reference",
        CANDIDATE,
        "5.18.0",
        "5.17.0",
    )
    assert data["summary"][0] == "first bad release: transformers 5.18.0 (last good: 5.17.0)"
    assert data["summary"][1].startswith("  error: [crash] CheckFailure: e-series: generate failed on 'Hello world")
    # 5.15.0 and 5.16.1 fail only on other listed issues: each still shows the crash is absent (good)
    good = {p["version"]: p["detail"] for p in data["probes"] if p["status"] == bs.GOOD}
    assert good and all(
        d.startswith(f"{CANDIDATE} absent: test_greedy_with_assistant_equals_greedy") for d in good.values()
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--known", "no-such-entry"], "unknown known-upstream entry 'no-such-entry'; known: "),
        (["--known", CANDIDATE, "--tier", "contract"], f"{CANDIDATE} is a reference tier entry, not contract"),
    ],
)
def test_cli_known_bad_input_exits_2(results, capsys, argv, words):
    ns = _ns(results, "transformers", "5.12.1", "5.19.0", "--row", "sglang-0.5.17", *argv)
    assert bisect_cli.run(ns, probe_factory=readme_probes([]), releases=lambda n: README_RANGE) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
