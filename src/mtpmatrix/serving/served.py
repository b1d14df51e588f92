"""The gsm8k tier against sglang servers someone else started (``--server-url``), e.g. a staging deployment after
an upgrade: what each server turned out to be, read from its /server_info before anything is scored.

    nox -s "gemma4_mtp(sglang-0.5.23)" -- --tiers gsm8k --server-url http://10.0.0.5:30000
    pytest tests/tiers --tiers gsm8k --server-url http://127.0.0.1:30000 [--server-url URL_OF_A_NO_MTP_SERVER]

Each server is one GSM8K case named like the launched ones (``E4B-topk1``; ``E4B-nomtp`` for a server without
speculative decoding; ``served-topk1`` when the model path names none of settings.PAIRS, then scored but not
gated), so results compare with launched runs and with earlier runs against the same deployment (``--baseline``).
A no-MTP server of the same pair, given as a second ``--server-url``, adds the speed-up and a per-question McNemar
comparison, as MTPMATRIX_GSM8K_BASELINE=1 does for launched servers.

Standard library and this package only (info.py, not the requests-based client.py): the matrix checks the URLs
from nox's own Python before installing the row, and that Python holds nox and what nox depends on, no requests.
"""

from __future__ import annotations

import http.client
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from mtpmatrix.core import settings
from mtpmatrix.serving import info as server_info

PAIR_ENV = "MTPMATRIX_SERVER_PAIR"  # the pair a server serves when its model path does not say (e.g. /models/e4b)
INFO_TIMEOUT = 15.0
UNKNOWN_PAIR = "served"


class ServedError(ValueError):
    """A --server-url that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Served:
    url: str  # http://host:port, nothing else (no credentials, path or query)
    info: dict = field(repr=False)
    pair: str | None  # a settings.PAIRS name, or None when the model path names none
    topk: int | None  # None: the server does no speculative decoding
    model_path: str | None
    draft_model_path: str | None
    tp_size: int | None
    version: str | None

    @property
    def case_id(self) -> str:
        return settings.gsm8k_case_id(self.pair or UNKNOWN_PAIR, self.topk)

    def as_metric(self) -> dict:
        """What the server turned out to be (schema.SERVED)."""
        return {
            "url": self.url,
            "pair": self.pair,
            "topk": self.topk,
            "model_path": self.model_path,
            "draft_model_path": self.draft_model_path,
            "tp_size": self.tp_size,
            "version": self.version,
        }


def check_url(url: str) -> str:
    """``http://host:port`` from ``url``; ServedError for anything else (https, credentials, paths, no port)."""
    u = urllib.parse.urlsplit(url.strip())
    if u.scheme != "http":
        raise ServedError(f"--server-url {url!r}: only plain http://HOST:PORT is supported")
    if u.username or u.password:
        # credentials would land in logs and results; sglang's --api-key is not supported by this client
        raise ServedError("--server-url: credentials in the URL are not supported")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise ServedError(f"--server-url {url!r}: give the server root, http://HOST:PORT, without a path")
    try:
        port = u.port
    except ValueError:
        port = None
    if not u.hostname or port is None:
        raise ServedError(f"--server-url {url!r}: needs a host and a port, e.g. http://127.0.0.1:30000")
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"http://{host}:{port}"


def identify_pair(model_path: str | None, env: dict | None = None) -> str | None:
    """The settings.PAIRS name whose target ``model_path`` is: the same HF id or local path, an HF cache snapshot of
    it, or a folder named like the id's last part; $MTPMATRIX_SERVER_PAIR wins."""
    env = os.environ if env is None else env
    forced = (env.get(PAIR_ENV) or "").strip()
    if forced:
        if forced not in settings.PAIRS:
            raise ServedError(f"{PAIR_ENV}={forced!r} is not a model pair; known: {', '.join(settings.PAIRS)}")
        return forced
    if not model_path:
        return None
    mp = str(model_path).rstrip("/")
    parts = PurePosixPath(mp).parts
    for name in settings.PAIRS:
        target = settings.resolve_pair(name, env).target.rstrip("/")
        repo = target.split("/")[-1]
        if (
            mp == target
            or f"models--{target.replace('/', '--')}" in parts
            or (parts and parts[-1].lower() == repo.lower())
        ):
            return name
    return None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def describe(url: str, info: dict, env: dict | None = None) -> Served:
    """What the server at ``url`` serves, from its /server_info answer ``info``."""
    algo = server_info.find_arg(info, "speculative_algorithm")
    spec = algo not in (None, "", "NONE")
    return Served(
        url=url,
        info=info,
        pair=identify_pair(server_info.find_arg(info, "model_path"), env),
        topk=_int(server_info.find_arg(info, "speculative_eagle_topk")) if spec else None,
        model_path=server_info.find_arg(info, "model_path"),
        draft_model_path=server_info.find_arg(info, "speculative_draft_model_path") if spec else None,
        tp_size=_int(server_info.find_arg(info, "tp_size")),
        version=server_info.find_arg(info, "version"),
    )


def fetch(url: str, timeout: float = INFO_TIMEOUT, env: dict | None = None) -> Served:
    """Check ``url``, read its /server_info and describe it; ServedError (one line) when that fails."""
    base = check_url(url)
    try:
        info = server_info.fetch(base, timeout=timeout)
    except server_info.InfoError as exc:
        raise ServedError(f"--server-url {base}: /server_info answered {exc.status}: {exc}") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ServedError(f"--server-url {base}: no sglang server answers ({type(exc).__name__}: {exc})") from None
    if not isinstance(info, dict) or not server_info.find_arg(info, "model_path"):
        raise ServedError(f"--server-url {base}: /server_info has no model_path (is this an sglang server?)")
    return describe(base, info, env)


def fetch_all(urls: list[str], env: dict | None = None) -> list[Served]:
    """Every server of ``urls``, no-MTP ones first (their answers are what the MTP ones are compared with)."""
    served = [fetch(u, env=env) for u in urls]
    seen: dict[str, str] = {}
    for s in served:
        if s.case_id in seen:
            raise ServedError(f"--server-url {seen[s.case_id]} and {s.url} both serve {s.case_id}")
        seen[s.case_id] = s.url
    return sorted(served, key=lambda s: (s.topk is not None, s.case_id))
