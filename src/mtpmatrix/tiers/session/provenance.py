"""What a session ran with beyond its checks, each of which can change an outcome without changing a test: the
pytest plugins it loaded (with their distributions and versions), pytest's options from every source (the config
file and its addopts, PYTEST_ADDOPTS, -o, --runxfail, and the effective values after all of them), the conftest
files it loaded. The plugin writes it to tiers.json as ``pytest``; evidence/session.py judges it.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import shlex
import types
from pathlib import Path

from mtpmatrix.core.record_types import PytestPlugin, PytestRun

# the modules of pytest itself: its built-in plugins and the objects it registers (the config, the session, ...)
_PYTEST_OWN = ("_pytest", "pytest", "pluggy")
_SUITE_OWN = "mtpmatrix.tiers."  # this plugin and the tiers' code: the suite's fingerprint covers them


@functools.cache
def _dists_of_modules() -> dict[str, list[str]]:
    return md.packages_distributions()


def _where(path: Path, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)  # outside the checkout: its full path says so


def _module_of(plugin) -> str:
    """The module a plugin comes from: a module's own name, a class's module (a class registered as a plugin: its
    type is ``type``, whose module is "builtins": the H200 record of 2026-12-05 named such a plugin "builtins"), an
    instance's class's module."""
    if isinstance(plugin, types.ModuleType):
        return plugin.__name__
    return plugin.__module__ if isinstance(plugin, type) else type(plugin).__module__


def _is_conftest(plugin) -> bool:
    return isinstance(plugin, types.ModuleType) and Path(getattr(plugin, "__file__", "") or "").name == "conftest.py"


def plugins(config) -> list[PytestPlugin]:
    """Every plugin registered in this session that is not pytest's own, the suite's or a conftest: ``{"name", "module", "dist",
    "version"}`` (dist and version: the distribution that installed it, None for a module on the path)."""
    from_dists = {id(p): (d.project_name, d.version) for p, d in config.pluginmanager.list_plugin_distinfo()}
    out = {}
    for name, plugin in config.pluginmanager.list_name_plugin():
        if plugin is None or _is_conftest(plugin):  # None: blocked with -p no:NAME
            continue
        module = _module_of(plugin)
        if module.split(".")[0] in _PYTEST_OWN or module.startswith(_SUITE_OWN):
            continue
        dist, version = from_dists.get(id(plugin), (None, None))
        if dist is None:
            found = _dists_of_modules().get(module.split(".")[0]) or []
            dist = found[0] if len(found) == 1 else None
            version = md.version(dist) if dist else None
        key = name if isinstance(plugin, types.ModuleType) else module
        out[key] = {"name": key, "module": module, "dist": dist, "version": version}
    return [out[k] for k in sorted(out)]


def conftests(config) -> list[str]:
    """The conftest files this session loaded, relative to its rootdir (a full path when outside it)."""
    found = {
        _where(Path(p.__file__), config.rootpath)
        for _, p in config.pluginmanager.list_name_plugin()
        if p is not None and _is_conftest(p)
    }
    return sorted(found)


def _plain(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool, os.PathLike)) for v in value):
        return [_plain(v) for v in value]
    return None


def asked_overrides(args: list[str]) -> list[str]:
    """The ``-o NAME=VALUE`` / ``--override-ini`` values in ``args``: what the command line or PYTEST_ADDOPTS set
    over the config file (pytest's own override_ini also holds what the config's addopts imply, e.g.
    ``strict_markers=true`` for ``--strict-markers``, which the suite's fingerprint covers)."""
    out, it = [], iter(args)
    for a in it:
        if a in ("-o", "--override-ini"):
            out.append(next(it, ""))
        elif a.startswith("--override-ini="):
            out.append(a.split("=", 1)[1])
        elif a.startswith("-o") and len(a) > 2:
            out.append(a[2:])
    return out


def record(config) -> PytestRun:
    """tiers.json's ``pytest``: what decides how the checks ran, whichever source it came from."""
    # imported here, in the row's pytest session: merge() runs in nox's own Python (runner/side_by_side.py), which
    # has nox and uv only (tests/unit/test_nox_python.py)
    import pytest

    return {
        "version": pytest.__version__,
        "inifile": _where(config.inipath, config.rootpath) if config.inipath else None,
        "ini_addopts": [str(a) for a in config.getini("addopts")],
        "env_addopts": os.environ.get("PYTEST_ADDOPTS") or None,
        "override_ini": asked_overrides(
            [str(a) for a in config.invocation_params.args] + shlex.split(os.environ.get("PYTEST_ADDOPTS") or "")
        ),
        "runxfail": bool(getattr(config.option, "runxfail", False)),
        "conftests": conftests(config),
        "plugins": plugins(config),
        # every option's value after the config file, PYTEST_ADDOPTS and the command line: for people to read
        "options": {k: _plain(v) for k, v in sorted(vars(config.option).items()) if _plain(v) is not None},
    }


def merge(parts: list[PytestRun | None]) -> PytestRun | None:
    """One ``pytest`` of a row whose tiers ran in several processes (runner/side_by_side.py): the first's, with
    every part's plugins and conftests, and any part's PYTEST_ADDOPTS, -o or --runxfail (what one process loaded
    counts for the row)."""
    recs = [p for p in parts if isinstance(p, dict)]
    if len(recs) != len(parts) or not recs:
        return None  # a part that does not say what it ran: neither does the row
    out = dict(recs[0])
    out["plugins"] = sorted(
        {json_key(p): p for r in recs for p in r.get("plugins") or []}.values(), key=lambda p: str(p.get("name"))
    )
    out["conftests"] = sorted({c for r in recs for c in r.get("conftests") or []})
    out["env_addopts"] = next((r["env_addopts"] for r in recs if r.get("env_addopts")), None)
    out["override_ini"] = sorted({o for r in recs for o in r.get("override_ini") or []})
    out["runxfail"] = any(r.get("runxfail") for r in recs)
    return out


def json_key(value: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in value.items()))
