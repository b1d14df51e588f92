"""Shared by every test: the mtpmatrix plugin gates tiers (one-line skip reasons) and writes tiers.json."""

import pytest

pytest_plugins = ["mtpmatrix.tiers.session.plugin"]


@pytest.fixture(scope="session")
def gsm8k_lines() -> list[dict]:
    """The verified GSM8K test split (the copy shipped in the package, never downloaded here): the unit tests' fake
    servers answer its questions, the contract tier scores it through sglang's run_eval."""
    from mtpmatrix.tiers import gsm8k_eval

    return gsm8k_eval.load_split("test", offline=True)
