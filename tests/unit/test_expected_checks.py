"""The expected checks are the project's definition (src/mtpmatrix/core/expected_checks.json), and the suite must agree
with it: a check added to tests/tiers without writing the file again, or one removed, fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mtpmatrix.core.evidence import expected_checks, fingerprint
from mtpmatrix.core.schema import TIERS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collected() -> dict[str, list[str]]:
    return expected_checks.collect(REPO, python=sys.executable)


def test_the_definition_is_what_the_suite_collects_with_no_knob(collected):
    defined = expected_checks.load()
    assert {t: sorted(v) for t, v in collected.items()} == {t: sorted(defined[t]) for t in TIERS}


def test_a_check_the_definition_lacks_or_names_in_vain_is_a_difference(collected, tmp_path):
    short = {t: list(v) for t, v in collected.items()}
    dropped = short["smoke"].pop()
    path = tmp_path / "expected_checks.json"
    path.write_text(expected_checks.render(short))
    defined = expected_checks.load(path)
    assert set(collected["smoke"]) - set(defined["smoke"]) == {dropped}


def test_the_definition_is_part_of_the_suites_fingerprint(tmp_path):
    repo = tmp_path / "repo"
    for folder, pattern in fingerprint.SUITE_FILES:
        for f in (REPO / folder).glob(pattern):
            if "__pycache__" in f.parts:
                continue
            dest = repo / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.read_bytes())
    before = fingerprint.suite_hash(repo, data="d")
    target = repo / "src/mtpmatrix/core/expected_checks.json"
    data = json.loads(target.read_text())
    data["tiers"]["contract"].pop()
    target.write_text(json.dumps(data))
    assert fingerprint.suite_hash(repo, data="d") != before
    assert fingerprint.suite_hash(repo, data="e") != fingerprint.suite_hash(repo, data="d")  # the data's checksum


def test_a_malformed_definition_is_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"tiers": {"contract": []}}))
    with pytest.raises(expected_checks.ExpectedChecksError, match="want"):
        expected_checks.load(path)


def test_a_collection_error_is_no_definition(tmp_path):
    """A smoke module that failed to import was left out of the plugin's record, and --write wrote a definition
    without its checks (2026-12-02, test_smoke_bonus.py after a move). Collection must succeed whole."""
    import pytest

    from mtpmatrix.core.evidence import expected_checks

    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\nfor a in "$@"; do case $a in --mtp-results=*) out=${a#--mtp-results=};; esac; done\n'
        'echo \'{"selection": {"collected": {"smoke": []}}}\' > "$out"\n'
        "echo 'ERROR tests/tiers/test_smoke_x.py - AttributeError'; exit 2\n"
    )
    fake.chmod(0o755)
    with pytest.raises(expected_checks.ExpectedChecksError, match="exit 2"):
        expected_checks.collect(tmp_path, python=str(fake))
