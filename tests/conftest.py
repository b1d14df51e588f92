"""Shared by every test: the mtpmatrix plugin gates tiers (one-line skip reasons) and writes tiers.json."""

pytest_plugins = ["mtpmatrix.tiers.pytest_plugin"]
