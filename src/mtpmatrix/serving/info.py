"""An sglang server's /server_info: one read with the standard library, and the helpers that read its answer.

Standard library only, as nox is: the matrix checks every ``--server-url`` from nox's own Python before the row
installs (served.py), and that Python holds nox and what nox depends on, nothing of a row's (requests is sglang's,
not nox's). The tiers' own traffic, batches over keep-alive connections, goes through client.py.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

# the endpoint, and its name on releases that answer 404 for it
PATHS = ("/server_info", "/get_server_info")


class InfoError(RuntimeError):
    """The server answered, but not 2xx; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def error_message(text: str) -> str:
    """sglang's error bodies: {"error": {"message": ...}} / {"detail": ...} / {"message": ...} / plain text."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        for key in ("detail", "message", "error"):
            if obj.get(key):
                return str(obj[key])[:500]
    return text.strip()[:500]


def _get(base_url: str, path: str, timeout: float) -> tuple[int, str]:
    # http.client, not urllib.request: no proxy from the environment (a proxy variable would route a cluster-local
    # server through it), no .netrc credentials and no redirects, as client.py's sessions
    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def fetch(base_url: str, timeout: float) -> Any:
    """GET /server_info (/get_server_info on older releases), parsed. InfoError on a non-2xx answer; OSError and
    http.client.HTTPException when nothing answers; ValueError for a body that is not JSON."""
    for path in PATHS:
        status, text = _get(base_url, path, timeout)
        if status == 404 and path != PATHS[-1]:
            continue
        if not 200 <= status < 300:
            raise InfoError(f"GET {path} -> HTTP {status}: {error_message(text)}", status)
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"GET {path} -> HTTP {status} with a non-JSON body: {text[:200]!r}") from None
    raise AssertionError("unreachable")


def spec_stats(info: dict | None) -> dict | None:
    """Speculative-decoding stats from a /server_info answer, or None when the server reports none.

    ``avg_spec_accept_length`` lives in ``internal_states[i]`` (one per DP rank) in 0.5.13 / 0.5.17 / 0.5.23, and is
    absent until a speculative forward ran (and always without speculative decoding). Older releases put it at the
    top level; that is read too. Returns {"avg_spec_accept_length": mean over reporting ranks, "per_rank": [...],
    "source": where it was found}.
    """
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    if isinstance(states, dict):
        states = [states]
    per_rank = []
    if isinstance(states, list):
        for st in states:
            if isinstance(st, dict) and isinstance(st.get("avg_spec_accept_length"), (int, float)):
                per_rank.append(float(st["avg_spec_accept_length"]))
    if per_rank:
        return {
            "avg_spec_accept_length": sum(per_rank) / len(per_rank),
            "per_rank": per_rank,
            "source": "internal_states[0]" if len(per_rank) == 1 else "internal_states[*]",
        }
    top = info.get("avg_spec_accept_length")
    if isinstance(top, (int, float)):
        return {"avg_spec_accept_length": float(top), "per_rank": [float(top)], "source": "top level"}
    return None


_MISSING = object()


def find_arg(info: dict, name: str, default: Any = None) -> Any:
    """A server arg from /server_info: top level first, then any nested dict (0.5.23 nests some records)."""
    if not isinstance(info, dict):
        return default
    if name in info:
        return info[name]
    stack = [v for k, v in info.items() if k != "internal_states" and isinstance(v, dict)]
    while stack:
        d = stack.pop(0)
        if name in d:
            return d[name]
        stack.extend(v for v in d.values() if isinstance(v, dict))
    return default


def cuda_graph_disabled(info: dict) -> bool | None:
    """Whether /server_info says CUDA graphs are off (disable_cuda_graph, or 0.5.23's decode backend 'disabled');
    None when the answer says neither."""
    flag = find_arg(info, "disable_cuda_graph", _MISSING)
    backend = find_arg(info, "cuda_graph_backend_decode", _MISSING)
    if flag is _MISSING and backend is _MISSING:
        return None
    if flag is not _MISSING and bool(flag):
        return True
    if backend is not _MISSING and isinstance(backend, str) and backend.lower() == "disabled":
        return True
    return False
