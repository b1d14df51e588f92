"""The install-time bytecode workers (runner/bytecode.py, bytecode_from_cache.py) against uv's --compile-bytecode.

    python benchmarks/bytecode_bench.py [--row sglang-0.5.17] [--repeat 2] [--modes plain,workers,uv-compile]
                                        [--lists DIR] [--json FILE]

Each mode installs the row (its one install command, matrix.install_command: sglang, its pins and this project)
into a new venv, then times one ``import sglang.srt.models.gemma4_mtp`` in it, with PYTHONDONTWRITEBYTECODE=1
(as the runner's machines set it: a new venv never keeps the bytecode its imports compile):

- ``plain``: the install alone; the import compiles from source (the floor of row_floor_bench.py).
- ``workers``: what run_row does: bytecode.start_while_installing before the install (compiling the row's listed
  imports from uv's cache while the install runs), bytecode.start after it (the spare-core compiler takes what they
  left), the import under the Prefetch's environment while that compiler runs, as the pytest processes do.
- ``uv-compile``: the install with ``uv pip install --compile-bytecode`` (every file of site-packages compiled into
  the venv); the import then reads that bytecode.
- ``uv-compile-again``: the same command once more into the same, already installed venv (a reused row venv: what
  a second ``nox -s gemma4_mtp`` pays per row with --compile-bytecode).

The lists of imports come from ``--lists`` (default: ``.cache/bytecode/sglang-<version>-py<python>`` of this
checkout) and are copied to a temporary folder first, so the measurement never rewrites them. The uv cache should be
warm (one earlier row install), or the first mode pays the downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from mtpmatrix.core.rows import load_rows  # noqa: E402
from mtpmatrix.runner import bytecode, matrix  # noqa: E402

IMPORT = "import sglang.srt.models.gemma4_mtp"
MODES = ("plain", "workers", "uv-compile")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (of every child that ended meanwhile) of ``cmd``; exits on failure."""
    c0, t0 = _cpu(), time.monotonic()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall, cpu = time.monotonic() - t0, _cpu() - c0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return wall, cpu


def _new_venv(root: Path, python: str, uv: str) -> Path:
    venv = root / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([uv, "venv", "-q", "--python", python, str(venv)], check=True)
    return venv


def one(mode: str, row, lists: Path, root: Path, env: dict) -> dict:
    uv = matrix.find_uv()
    venv = _new_venv(root, row.python, uv)
    constraints = root / "constraints.txt"
    constraints.write_text(matrix.constraints_text(row, []))
    cmd = matrix.install_command(row, venv, constraints, None)
    if mode == "uv-compile":
        cmd = [*cmd[:3], "--compile-bytecode", *cmd[3:]]
    env_uv = {**env, "VIRTUAL_ENV": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
    python = matrix.venv_python(venv)
    names = ["sglang"]  # the side-by-side process that imports sglang (contract tier)
    out: dict = {"mode": mode}
    t_start, c_start = time.monotonic(), _cpu()
    installing = None
    if mode == "workers":
        installing = bytecode.start_while_installing(venv, python, lists, env_uv, names, uv)
        if installing is None:
            raise SystemExit(f"no workers started: lists in {lists}? uv cache?")
    out["install_s"], out["install_cpu_s"] = _timed(cmd, env_uv)
    env_py = {**env, "VIRTUAL_ENV": str(venv), "PYTHONDONTWRITEBYTECODE": "1"}
    env_py.pop("PYTHONPATH", None)
    prefetch = None
    if mode == "workers":
        prefetch = bytecode.start(venv, python, lists, env_py, names, installing=installing)
        prefetch.lists = None  # never rewrite the lists (the import is not a pytest process: it records nothing)
        env_py = prefetch.env
    try:
        out["import_s"], out["import_cpu_s"] = _timed([str(python), "-c", IMPORT], env_py)
    finally:
        if prefetch is not None:
            prefetch.finish()
        if installing is not None:
            installing.stop()
    out["total_s"] = time.monotonic() - t_start
    out["total_cpu_s"] = _cpu() - c_start
    if mode == "uv-compile":  # the same install again, into the installed venv (a reused row venv)
        out["again_install_s"], out["again_install_cpu_s"] = _timed(cmd, env_uv)
        out["again_import_s"], _ = _timed([str(python), "-c", IMPORT], env_py)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="sglang-0.5.17")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--lists", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = {r.id: r for r in load_rows(REPO / "constraints")}
    row = rows[args.row]
    source = args.lists or bytecode.lists_folder(row)
    if not (source / bytecode.SOURCES).is_file():
        raise SystemExit(f"{source}: no lists of imports (run the row once: nox -s 'gemma4_mtp({row.id})')")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", bytecode.ENV_KNOB)}
    results = []
    with tempfile.TemporaryDirectory(prefix="bytecode-bench-", dir=REPO / ".cache") as tmp:
        root = Path(tmp)
        for k in range(args.repeat):
            for mode in args.modes.split(","):
                lists = root / "lists" / source.name
                shutil.rmtree(lists.parent, ignore_errors=True)
                shutil.copytree(source, lists)
                r = {"run": k + 1, **one(mode, row, lists, root, env)}
                results.append(r)
                print(json.dumps({key: round(v, 1) if isinstance(v, float) else v for key, v in r.items()}), flush=True)
    print(f"\n{row.id}, {os.cpu_count()} CPUs: median wall (CPU) seconds over {args.repeat} run(s)")
    print(f"{'mode':<12} {'install':>16} {'first import':>16} {'install+import':>16}")
    for mode in args.modes.split(","):
        rs = [r for r in results if r["mode"] == mode]

        def med(key, rs=rs):
            return statistics.median(r[key] for r in rs)

        print(
            f"{mode:<12} {med('install_s'):>7.1f} ({med('install_cpu_s'):>5.1f}) "
            f"{med('import_s'):>7.1f} ({med('import_cpu_s'):>5.1f}) "
            f"{med('total_s'):>7.1f} ({med('total_cpu_s'):>5.1f})"
        )
        if mode == "uv-compile":
            print(
                f"{'  again':<12} {med('again_install_s'):>7.1f} ({med('again_install_cpu_s'):>5.1f}) "
                f"{med('again_import_s'):>7.1f}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
