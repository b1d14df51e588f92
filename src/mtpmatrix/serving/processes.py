"""Helpers around the processes a tier launches: free loopback ports, redaction of secrets in what gets logged, the
SGLANG_* names an installed sglang knows (read without importing it), and the live members and GPU contexts of a
process group (/proc and nvidia-smi). Stdlib and this package only; never imports sglang.
"""

from __future__ import annotations

import functools
import os
import random
import re
import socket
import subprocess
import sys
from pathlib import Path

from mtpmatrix.serving.environment import nvidia_smi

# The harness's own lines in a server log (SglangServer._log), here rather than in server.py because the mutant
# runner reads them from nox's Python, which has no requests (server.py talks HTTP through client.py)
LOG_NOTE = "# mtpmatrix: "  # how they begin
READY_NOTE = "ready after"  # the note that the server answered its health check

# Environment names: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, *_API_KEY, *SECRET*, *PASSWORD* (not TOKENIZERS_*, *_TOKENS).
_SECRET_NAME = re.compile(r"TOKEN(?!S|IZER)|KEY|SECRET|PASSW|CREDENTIAL", re.I)
# Option names: --api-key, --admin-api-key, --hf-token, --*-secret, --*-password (not --max-total-tokens,
# --skip-tokenizer-init, --speculative-num-draft-tokens).
_SECRET_OPTION = re.compile(r"(?:^|[-_])(?:key|token|secret|passw(?:or)?d|credentials?)$", re.I)
REDACTED = "***"


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux default 32768-60999)."""
    try:
        lo, hi = (int(t) for t in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A currently free TCP port on ``host`` for a server to listen on.

    Picked at random *below* the ephemeral range. A kernel-assigned (bind to 0) port comes from that range, and so
    do sglang's own helper ports (0.5.17 takes its NCCL port with bind to 0) and every outgoing connection's: with
    five TP2 servers launching side by side on 2x H200, a neighbour took a server's port between pick and launch.
    """
    rng = rng or random.Random()
    lo = 20000
    hi = min(ephemeral_port_range()[0], 65536) - 1001  # older sglang derive helper ports up to +1000 above the server's
    if hi > lo:
        for _ in range(64):
            port = rng.randrange(lo, hi)
            if port_is_free(host, port):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:  # fallback: let the kernel pick
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """True when a new server could bind ``host:port`` now (SO_REUSEADDR, like uvicorn: TIME_WAIT is fine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_env(env: dict[str, str] | None) -> dict[str, str]:
    """``env`` with the values of HF_TOKEN / *TOKEN* / *KEY* / *SECRET* / *PASSWORD* names replaced by ***."""
    return {k: (REDACTED if is_secret_name(k) and v else v) for k, v in (env or {}).items()}


def redact_args(args: list[str]) -> list[str]:
    """Command-line ``args`` with the values of secret-looking options (--api-key X, --hf-token=X) replaced."""
    out: list[str] = []
    hide_next = False
    for a in args:
        a = str(a)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif a.startswith("--") and "=" in a and _SECRET_OPTION.search(a.split("=", 1)[0][2:]):
            out.append(a.split("=", 1)[0] + "=" + REDACTED)
        elif a.startswith("--") and _SECRET_OPTION.search(a[2:]):
            out.append(a)
            hide_next = True
        else:
            out.append(a)
    return out


@functools.cache
def sglang_package_dir(python: str = sys.executable) -> Path | None:
    """Where ``python`` would import sglang from, found without importing it (find_spec runs no package code)."""
    code = (
        "import importlib.util as u; s = u.find_spec('sglang'); "
        "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


@functools.cache
def sglang_env_names(python: str = sys.executable) -> frozenset[str]:
    """SGLANG_* / SGL_* names that occur in the installed sglang's envs module (srt/environ.py)."""
    pkg = sglang_package_dir(python)
    if pkg is None:
        return frozenset()
    names: set[str] = set()
    for rel in ("srt/environ.py", "srt/envs.py", "environ.py"):
        p = pkg / rel
        if p.is_file():
            names |= set(re.findall(r"\b(SGLANG_[A-Z0-9_]+|SGL_[A-Z0-9_]+)\b", p.read_text(errors="replace")))
    return frozenset(names)


def supported_env(
    env: dict[str, str] | None, python: str = sys.executable, known: frozenset[str] | set[str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Split ``env`` into (what to pass, dropped names).

    SGLANG_* / SGL_* variables are passed only when their name occurs in the installed sglang's envs module (an
    unknown name is silently ignored by sglang, so passing it would make a row *look* configured); every other
    variable (CUDA_VISIBLE_DEVICES, HF_HUB_OFFLINE, ...) is passed as is.
    """
    env = dict(env or {})
    if not any(k.startswith(("SGLANG_", "SGL_")) for k in env):
        return env, []
    names = sglang_env_names(python) if known is None else known
    kept, dropped = {}, []
    for k, v in env.items():
        if k.startswith(("SGLANG_", "SGL_")) and k not in names:
            dropped.append(k)
        else:
            kept[k] = v
    return kept, dropped


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``; via /proc on Linux, killpg(0) elsewhere."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...  -- comm may contain spaces/parens: split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(d.name))
    return members


def gpu_memory_by_pid() -> dict[int, int] | None:
    """MiB of GPU memory per pid with a CUDA context (summed over GPUs); None without a working nvidia-smi."""
    csv = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    if csv is None:
        return None
    held: dict[int, int] = {}
    for line in csv.splitlines():
        parts = [t.strip() for t in line.split(",")]
        if parts and parts[0].isdigit():  # used_memory may read "[N/A]": the pid still holds a context
            mib = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
            held[int(parts[0])] = held.get(int(parts[0]), 0) + mib
    return held


def gpu_pids() -> set[int] | None:
    """Pids holding a CUDA context; None when nvidia-smi is absent/fails."""
    held = gpu_memory_by_pid()
    return None if held is None else set(held)
