"""The package index, asked through its simple JSON API (PEP 691): does a release exist, which releases lie
between two versions. Used to reject a bad ``--with`` spec (or an unreachable index) in one line before any
venv is made, and by bisect to list candidate releases."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

DEFAULT_INDEX = "https://pypi.org/simple"


class IndexError_(RuntimeError):
    """The index is unreachable or does not know the package; the message is one line."""


def index_url() -> str:
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        if os.environ.get(var):
            return os.environ[var].rstrip("/")
    return DEFAULT_INDEX


def _version_of_file(filename: str, name: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except Exception:
        m = re.match(rf"{re.escape(name)}-([^-]+?)(?:\.tar\.gz|\.zip)$", filename, re.I)
        try:
            return Version(m.group(1)) if m else None
        except InvalidVersion:
            return None


def releases(
    name: str, *, url: str | None = None, timeout: float = 15.0, include_prereleases: bool = False
) -> list[Version]:
    """Sorted releases of ``name`` that have at least one non-yanked file."""
    url = (url or index_url()).rstrip("/")
    cname = canonicalize_name(name)
    req = urllib.request.Request(f"{url}/{cname}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise IndexError_(f"package {name!r} is not on the index {url}") from None
        raise IndexError_(f"index {url} answered HTTP {exc.code} for {name!r}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IndexError_(f"index {url} is unreachable ({reason})") from None
    except json.JSONDecodeError:
        raise IndexError_(f"index {url} did not answer with PEP 691 JSON for {name!r}") from None
    found: set[Version] = set()
    for f in data.get("files", []):
        if f.get("yanked"):
            continue
        v = _version_of_file(f["filename"], cname.replace("-", "_")) or _version_of_file(f["filename"], cname)
        if v is not None and (include_prereleases or not v.is_prerelease):
            found.add(v)
    return sorted(found)


def check_spec(req, **kw) -> list[Version]:
    """Raise IndexError_ unless some release of ``req.name`` satisfies ``req.specifier``."""
    # a spec that names a pre-release (transformers==5.20.0rc1) wants one, as uv installs it
    kw.setdefault("include_prereleases", bool(req.specifier.prereleases))
    rels = releases(req.name, **kw)
    ok = [v for v in rels if req.specifier.contains(v, prereleases=True)]
    if not ok:
        latest = ", ".join(str(v) for v in rels[-5:]) or "none"
        raise IndexError_(f"no release of {req.name} matches {req.specifier} (latest: {latest})")
    return ok


def between(name: str, good: str, bad: str, **kw) -> list[Version]:
    """Releases v with good <= v <= bad, inclusive, sorted (what bisect walks)."""
    g, b = Version(good), Version(bad)
    if g >= b:
        raise IndexError_(f"GOOD {good} must be older than BAD {bad}")
    return [v for v in releases(name, **kw) if g <= v <= b]


PYTORCH_INDEX = "https://download.pytorch.org/whl"  # where uv's --torch-backend takes a CUDA variant's torch from


def check_reachable(url: str, *, timeout: float = 15.0) -> None:
    """Raise IndexError_ (one line) unless ``url`` answers at all (any HTTP status is an answer)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise IndexError_(f"index {url} is unreachable ({getattr(exc, 'reason', exc)})") from None
