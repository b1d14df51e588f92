"""Running one row: options, the install helper, freeze/check, the suite, and the row record.

The noxfile stays thin: nox makes the row's venv with uv (the row's Python), this module does the rest, so the
same steps are unit-testable and nothing about a row lives in two places.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from mtpmatrix.core import expected, options, paths, smoke_servers
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.paths import REPO, new_run_id, now, results_root
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import Row, RowError, constrained_name, parse_override
from mtpmatrix.core.schema import KNOWN_UPSTREAM, PYTEST_LOG, ROW_FILE, SESSION_FIELDS, TIERS, TIERS_FILE, parse_tiers
from mtpmatrix.core.store import RunStore, parse_freeze, row_verdict
from mtpmatrix.runner import bytecode, candidate, console, index, side_by_side, venvs
from mtpmatrix.runner import overrides as override_rules
from mtpmatrix.serving import environment, served
from mtpmatrix.tiers.verdict import classify_install

SUITE = "tests/tiers"


@dataclass
class Options:
    overrides: list[str] = field(default_factory=list)
    run_id: str | None = None
    resume: bool = False
    results: Path = field(default_factory=results_root)
    tiers: str = ",".join(TIERS)
    shard: tuple[int, int] | None = None
    pytest_args: list[str] = field(default_factory=list)
    offline_check: bool = False  # skip the index pre-flight (air-gapped boxes with a local mirror)
    server_urls: list[str] = field(default_factory=list)  # gsm8k tier against running servers (served.py)
    record_extra: dict = field(default_factory=dict)  # merged into row.json (a canary's resolution, canary.py)
    candidate: candidate.Candidate | None = None  # --patch / --sglang: what replaces the pinned sglang


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard wants I/N, e.g. 1/4, got {text!r}") from None
    if not (n >= 1 and 1 <= i <= n):
        raise argparse.ArgumentTypeError(f"--shard {text}: need 1 <= I <= N")
    return i, n


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one RowError line (the session reports it) instead of usage + SystemExit(2)
        raise RowError(f"{self.prog} {message}")


PYTEST_ARGS_HINT = "pytest options go after a second --: nox -s gemma4_mtp -- -- -k topk3"


def split_pytest_args(posargs: list[str]) -> tuple[list[str], list[str]]:
    """(the session's own arguments, pytest's): pytest gets exactly what follows the first ``--`` of the session
    arguments (nox's own ``--`` is already gone), as given."""
    if "--" not in posargs:
        return list(posargs), []
    i = posargs.index("--")
    return list(posargs[:i]), list(posargs[i + 1 :])


def parse_options(posargs: list[str]) -> Options:
    """Session arguments (after nox's ``--``); pytest's go after a second ``--`` (``split_pytest_args``). Anything
    else this session does not know is a RowError (one line): passed on, pytest would stop with a usage error and
    the row be filed with an ``error`` tier, bad input recorded as evidence."""
    ours, pytest_args = split_pytest_args(posargs)
    p = _Parser(
        prog="nox -s gemma4_mtp --",
        add_help=True,
        parents=[options.parent(run_id="a UTC timestamp; env MTPMATRIX_RUN_ID", overrides=True)],
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="RUN_ID",
        help="continue a run, skipping rows that already have a verdict (default: the latest run)",
    )
    p.add_argument("--tiers", default=os.environ.get("MTPMATRIX_TIERS", ",".join(TIERS)))
    p.add_argument("--shard", type=_shard, help="run only shard I of N (rows in id order, round robin)")
    p.add_argument(
        "--no-index-check",
        dest="offline_check",
        action="store_true",
        help="do not ask the index whether --with releases exist before installing",
    )
    p.add_argument(
        "--server-url",
        dest="server_urls",
        action="append",
        default=[],
        metavar="URL",
        help="run the gsm8k tier against this running sglang server (repeatable; checked before install)",
    )
    p.add_argument("--patch", metavar="FILE", help="a candidate: this unified diff applied to each row's pinned sglang")
    p.add_argument("--sglang", metavar="PATH", help="a candidate: this sglang wheel or checkout instead of the pin")
    p.add_argument("--draft-phase", metavar="N", help="the draft phase the candidate drafts at (e.g. +1)")
    ns, unknown = p.parse_known_args(ours)
    if unknown:
        what = "option" if unknown[0].startswith("-") else "argument"
        raise RowError(f"{p.prog} : unknown {what} {unknown[0]} ({PYTEST_ARGS_HINT})")
    for spec in ns.overrides:
        parse_override(spec)  # raises RowError with one line
    tiers = parse_tiers(ns.tiers)  # as the pytest plugin reads them
    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise RowError(f"--tiers: unknown tier(s) {', '.join(bad)}; known: {', '.join(TIERS)}")
    if not tiers:
        raise RowError(f"--tiers: no tier given; known: {', '.join(TIERS)}")
    run_id = ns.run_id or os.environ.get("MTPMATRIX_RUN_ID")
    resume = ns.resume is not None
    if resume and ns.resume != "latest":
        run_id = ns.resume
    elif resume:
        latest = RunStore.latest(ns.results)
        if latest is None:
            raise RowError(f"--resume: no earlier run under {ns.results}/")
        run_id = run_id or latest.run_id
    if run_id is not None:
        try:
            paths.single_name(run_id, "--run-id")
        except paths.NameError_ as exc:  # a path would write the run outside the results root
            raise RowError(str(exc)) from None
    if ns.server_urls and "gsm8k" not in tiers:
        raise RowError("--server-url serves the gsm8k tier: add --tiers gsm8k (or a list that has it)")
    return Options(
        overrides=ns.overrides,
        run_id=run_id,
        resume=resume,
        results=ns.results,
        tiers=",".join(tiers),
        shard=ns.shard,
        pytest_args=pytest_args,
        offline_check=ns.offline_check,
        server_urls=ns.server_urls,
        candidate=candidate.from_options(ns.patch, ns.sglang, ns.draft_phase, ns.overrides),
    )


def in_shard(row_id: str, all_ids: list[str], shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    i, n = shard
    return sorted(all_ids).index(row_id) % n == i - 1


def preflight_overrides(overrides: list[str], *, skip_index: bool = False) -> None:
    """One clear error before anything is installed: malformed spec, unknown package/release, dead index."""
    for spec in overrides:
        req = parse_override(spec)
        if not skip_index:
            try:
                index.check_spec(req)
            except index.IndexError_ as exc:
                raise RowError(f"--with {spec}: {exc}") from None


def preflight_tier_env(tiers: str, env: dict | None = None):
    """The selected tiers' environment knobs (MTPMATRIX_SMOKE_*), checked before anything is installed: the smoke
    tier's ``SmokeOptions`` when smoke is selected, else None; a bad value is a RowError (one line)."""
    if "smoke" not in parse_tiers(tiers):
        return None
    try:
        return smoke_servers.smoke_options(env)
    except ValueError as exc:
        raise RowError(str(exc)) from None


def preflight_servers(urls: list[str]) -> list:
    """Every --server-url answers /server_info like an sglang server (served.fetch_all), before anything is
    installed; a RowError (one line) otherwise. Returns what each serves."""
    if not urls:
        return []
    try:
        return served.fetch_all(urls)
    except served.ServedError as exc:
        raise RowError(str(exc)) from None


def overridden_names(overrides: list[str]) -> set[str]:
    return {canonicalize_name(parse_override(spec).name) for spec in overrides}


def constraints_text(row: Row, overrides: list[str], cand: candidate.Candidate | None = None) -> str:
    """The row's constraints file minus the pins of overridden packages (and of the sglang a candidate replaces).

    uv applies constraints on top of overrides, so ``-c row.txt`` pinning ``transformers==5.8.1`` together with
    ``--override transformers==5.9.0`` is unsatisfiable: an overridden package's pin must leave the constraints.
    """
    dropped = overridden_names(overrides)
    out = []
    for line in row.path.read_text().splitlines():
        if constrained_name(line) in candidate.dropped_pins(cand):
            out.append(f"# {line}  (dropped: the candidate replaces it)")
        elif constrained_name(line) in dropped:
            out.append(f"# {line}  (dropped: overridden)")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def find_uv(error: type[Exception] = RowError) -> str:
    """uv's path; ``error`` (the caller's one-line error kind) when uv is not on PATH."""
    return venvs.find_uv(error)


def install_command(
    row: Row,
    venv: Path,
    constraints: Path,
    overrides_file: Path | None,
    overrides: Sequence[str] = (),
    cand: candidate.Candidate | None = None,
) -> list[str]:
    """The one install command of a row: sglang (or the candidate's wheel or checkout) + its pins + this package,
    into ``venv``, with uv."""
    uv = find_uv()
    cmd = [uv, "pip", "install", "--python", str(venv_python(venv)), "-c", str(constraints)]
    if overrides_file is not None:
        cmd += ["--override", str(overrides_file)]
    if row.torch_backend != "pypi":
        cmd += ["--torch-backend", row.torch_backend]
    replaced = overridden_names(list(overrides))
    source = candidate.install_source(cand)
    cmd += [
        source if name == "sglang" and source else name if name in replaced else f"{name}=={version}"
        for name, version in row.pins.items()
    ]
    cmd += [*candidate.install_flags(cand), "-e", str(REPO)]
    return cmd


_PIP_CHECK_UNMET = re.compile(r"The package `([^`]+)` requires `([^`]+)`, but `([^`]+)` is installed")


def stranded_by_overrides(check_output: str, overrides: list[str], pinned: Iterable[str]) -> list[str]:
    """Installed packages whose own requirement on an overridden package is unmet, per ``uv pip check``
    (torchvision 0.29.2 needing ``torch>=2.14.0`` under ``--with torch==2.11.0``): canonical names, sorted.

    An override replaces every requirement on its package, so the resolver is free to pick any release of the
    packages released in lock-step with it (the newest torchvision), or keeps the one a row pin names for the old
    release. The row's own pins and the overridden packages are never stranded: sglang's ``torch==2.11.0`` is what
    a torch override is there to break.
    """
    targets = overridden_names(overrides)
    keep = {canonicalize_name(p) for p in pinned} | targets
    out = set()
    for package, requirement, _ in _PIP_CHECK_UNMET.findall(check_output):
        try:
            name = canonicalize_name(Requirement(requirement).name)
        except InvalidRequirement:
            continue
        if name in targets and canonicalize_name(package) not in keep:
            out.add(canonicalize_name(package))
    return sorted(out)


def resolve_companions(
    row: Row, venv: Path, overrides: list[str], names: list[str], env: dict | None = None, log: Path | None = None
) -> list[str]:
    """``name==version`` of each of ``names`` as uv resolves them next to the overrides taken as plain requirements,
    so that each one's own requirement on the overridden packages holds (torch==2.13.0 -> torchvision==0.28.0).
    Raises RowError with uv's first error line when no release fits."""
    uv = find_uv()
    cmd = [uv, "pip", "compile", "-", "--python", str(venv_python(venv)), "--no-header", "--no-annotate"]
    if row.torch_backend != "pypi":  # companions of a CUDA-variant torch come from the same index
        cmd += ["--torch-backend", row.torch_backend]
    done = subprocess.run(
        cmd, input="\n".join([*overrides, *names]) + "\n", capture_output=True, text=True, env=env, cwd=REPO
    )
    if log is not None:
        log.write_text("$ " + " ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        why = next((ln.strip() for ln in done.stderr.splitlines() if ln.strip()), "uv pip compile failed")
        raise RowError(f"no release of {', '.join(names)} fits {', '.join(overrides)}: {why}")
    wanted = set(names)
    pins = []
    for line in done.stdout.splitlines():
        body = line.split("#", 1)[0].strip()
        if "==" in body and canonicalize_name(body.split("==", 1)[0]) in wanted:
            pins.append(body)
    return sorted(pins)


def venv_python(venv: Path) -> Path:
    return Path(venv) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _run_logged(
    cmd: list[str], log: Path, env: dict | None = None, echo: bool | console.RowConsole = False
) -> tuple[int, str]:
    """Run ``cmd``, stream its output to ``log`` (and every line to stdout when ``echo`` is True, or what a
    RowConsole keeps); returns (rc, output)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    chunks: list[str] = []
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            chunks.append(line)
            if isinstance(echo, console.RowConsole):
                echo.feed(line)
            elif echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        rc = proc.wait()
    return rc, "".join(chunks)


def host_info() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()}


def run_row(row: Row, venv: Path, opts: Options, log=print) -> RowRecord:
    """Install ``row`` into ``venv``, record versions, run the suite; returns the saved row record.

    Raises nothing for a failing row: the verdict is in the record (the caller decides the exit code).
    """
    base_id, cand = row.id, opts.candidate
    row = candidate.for_row(cand, row)  # filed as the candidate; a wheel for another Python: RowError, here
    store = RunStore(opts.results, opts.run_id or new_run_id())
    out = store.row_dir(row.id)
    constraints = out / "constraints.txt"
    overrides_file = out / "overrides.txt" if opts.overrides else None
    # built first: a missing uv raises its one-line RowError before a 'pending' record exists
    cmd = install_command(row, venv, constraints, overrides_file, opts.overrides, cand)
    groups = side_by_side.plan(opts.tiers, opts.pytest_args)  # a bad MTPMATRIX_SIDE_BY_SIDE: RowError, here
    bytecode.enabled()  # and a bad MTPMATRIX_PRECOMPILE
    env_uv = {**os.environ, "VIRTUAL_ENV": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
    record: RowRecord = {
        "row": row.as_dict(),
        "overrides": list(opts.overrides),
        "tiers_selected": opts.tiers,
        "started": now(),
        "host": host_info(),
        "verdict": "pending",
        **({"candidate": cand.record(base_id)} if cand is not None else {}),
        **opts.record_extra,
    }
    store.save_row(row.id, record)

    # 1. install (the row's constraints, then overrides on top)
    constraints.write_text(constraints_text(row, opts.overrides, cand))
    if overrides_file is not None:
        overrides_file.write_text("\n".join(opts.overrides) + "\n")
    # the files the row's suite imported last time, compiled from uv's cache while the install waits on the index
    installing = bytecode.start_while_installing(
        venv, venv_python(venv), bytecode.lists_folder(row), env_uv, bytecode.process_names(groups, opts.tiers), cmd[0]
    )
    try:
        record = _install(row, venv, opts, store, out, cmd, constraints, overrides_file, env_uv, record, log)
        if record["install"]["verdict"] != "passed":  # recorded and saved
            return record
        candidate.after_install(cand, venv, record, log=lambda m: log(f"[{row.id}] {m}"))
        return _suite(row, venv, opts, store, out, record, groups, installing, log)
    except RowError:  # a patch whose hunks do not apply here: bad input, no record (the session says why)
        (out / ROW_FILE).unlink(missing_ok=True)
        raise
    finally:
        if installing is not None:  # always: kills what a failed install or an early stop left (after a suite: no-op)
            installing.stop()


def _install(
    row: Row,
    venv: Path,
    opts: Options,
    store: RunStore,
    out: Path,
    cmd: list[str],
    constraints: Path,
    overrides_file: Path | None,
    env_uv: dict,
    record: RowRecord,
    log,
) -> RowRecord:
    """run_row's install, companions, freeze and check; the record, finished when the install failed."""
    t0 = time.monotonic()
    log(f"[{row.id}] installing: {' '.join(cmd[1:])}")
    rc, output = _run_logged(cmd, out / "install.log", env=env_uv)
    record["install"] = {
        "verdict": "passed" if rc == 0 else "failed",
        "seconds": round(time.monotonic() - t0, 1),
        "command": cmd[1:],
    }
    log(f"[{row.id}] install {record['install']['verdict']} in {record['install']['seconds']}s")
    if rc != 0:
        record["install"]["failure"] = classify_install(output).as_dict()
        return _finish(store, row, record)
    uv = cmd[0]

    # 1b. packages the overrides stranded (see stranded_by_overrides) follow them: left as resolved, a torchvision
    # built for another torch breaks `import sglang` for a reason that is not the row's
    if opts.overrides:
        _, check = _run_logged(
            [uv, "pip", "check", "--python", str(venv_python(venv))], out / "check-overrides.txt", env=env_uv
        )
        stranded = stranded_by_overrides(check, opts.overrides, row.pins)
        stranded = override_rules.hold_sglang_pins(
            record, venv, opts.overrides, stranded, log=lambda m: log(f"[{row.id}] {m}")
        )
        if stranded:
            try:
                companions = resolve_companions(
                    row, venv, opts.overrides, stranded, env=env_uv, log=out / "companions.log"
                )
            except RowError as exc:  # recorded; the suite still runs on what pass 1 installed
                record["install"]["companions_error"] = str(exc)
                log(f"[{row.id}] {exc}")
            else:
                both = [*opts.overrides, *companions]
                assert overrides_file is not None  # there whenever there are overrides (run_row)
                constraints.write_text(constraints_text(row, both, opts.candidate))
                overrides_file.write_text("\n".join(both) + "\n")
                cmd2 = install_command(row, venv, constraints, overrides_file, both, opts.candidate)
                log(
                    f"[{row.id}] the overrides strand {', '.join(stranded)}: installing {', '.join(companions)} "
                    "with them"
                )
                rc, output = _run_logged(cmd2, out / "install-companions.log", env=env_uv)
                record["install"].update(
                    {"companions": companions, "command": cmd2[1:], "seconds": round(time.monotonic() - t0, 1)}
                )
                if rc != 0:
                    record["install"]["verdict"] = "failed"
                    record["install"]["failure"] = classify_install(output).as_dict()
                    return _finish(store, row, record)

    # 2. what actually got installed
    rc_f, freeze = _run_logged(
        [uv, "pip", "freeze", "--python", str(venv_python(venv))], out / "freeze.log", env=env_uv
    )
    (out / "freeze.txt").write_text("\n".join(ln for ln in freeze.splitlines() if "==" in ln or " @ " in ln) + "\n")
    rc_c, check = _run_logged([uv, "pip", "check", "--python", str(venv_python(venv))], out / "check.txt", env=env_uv)
    record["install"]["check"] = {"ok": rc_c == 0, "output": [ln for ln in check.splitlines()[1:] if ln.strip()][:20]}
    record["versions"] = _versions_from_freeze(freeze)
    if opts.overrides:  # what the overrides moved beyond what was asked, and why (runner/overrides.py)
        record["install"]["moved"] = override_rules.moved_by_overrides(
            row,
            venv,
            opts.overrides,
            record,
            freeze,
            constraints_text(row, []),
            uv,
            out,
            env_uv,
            python=venv_python(venv),
            project=REPO,
        )

    return record


def _suite(
    row: Row,
    venv: Path,
    opts: Options,
    store: RunStore,
    out: Path,
    record: RowRecord,
    groups: list,
    installing: bytecode.Installing | None,
    log,
) -> RowRecord:
    """run_row's suite in the installed venv; the finished record."""
    # 3. the suite, in the row's venv
    tiers_file = out / TIERS_FILE
    tiers_file.unlink(missing_ok=True)
    # pytest through mtpmatrix.tiers.session.process: rarer full GCs, no interpreter teardown (why: its docstring)
    pytest_cmd = [
        str(venv_python(venv)),
        "-m",
        "mtpmatrix.tiers.session.process",
        SUITE,
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'junit.xml'}",
        f"--mtp-results={tiers_file}",
        f"--tiers={opts.tiers}",
        *(f"--server-url={u}" for u in opts.server_urls),
        *opts.pytest_args,
    ]
    env_py = {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv_python(venv).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MTPMATRIX_ROW": row.id,
        "PYTHONUNBUFFERED": "1",
        **candidate.suite_env(opts.candidate),
        # tiny pairs are built once per row (their weights come from the row's transformers) and reused
        "MTPMATRIX_TINY_DIR": os.environ.get("MTPMATRIX_TINY_DIR") or str(REPO / ".cache" / "tiny" / row.id),
    }
    env_py.pop("PYTHONPATH", None)  # the row venv must see only what the row installed
    record.update(suite_invocation(opts, env_py))
    log(
        f"[{row.id}] running the suite: {' '.join(pytest_cmd[1:])}"
        + (f" (side by side: {', '.join('+'.join(g.tiers) for g in groups)})" if groups else "")
    )
    t0 = time.monotonic()
    # what the workers compiling from uv's cache left, or (without them) the files the row's suite imported last
    # time, compiled on the spare core while pytest starts (bytecode.py)
    prefetch = bytecode.start(
        venv,
        venv_python(venv),
        bytecode.lists_folder(row),
        env_py,
        bytecode.process_names(groups, opts.tiers),
        forked=bool(groups) and side_by_side.forks(pytest_cmd),
        installing=installing,
    )
    # the console gets the lines that matter, the row's pytest.log every line (console.py)
    shown = console.RowConsole(full=console.verbose(opts.pytest_args, os.environ))
    if not shown.full:
        log(f"[{row.id}] pytest's whole output: {out / PYTEST_LOG} ({console.VERBOSE_ENV}=1 or -- -- -v: here too)")
    try:
        if groups:  # one pytest process per group of tiers, on their own cores; one merged tiers.json
            rc_p = side_by_side.run(pytest_cmd + prefetch.pytest_args, groups, out, prefetch.env, REPO, echo=shown)
        else:
            rc_p, _ = _run_logged(pytest_cmd + prefetch.pytest_args, out / PYTEST_LOG, env=prefetch.env, echo=shown)
    finally:
        shown.close()
        prefetch.finish()
    record["suite"] = {"exitstatus": rc_p, "seconds": round(time.monotonic() - t0, 1)}
    log(f"[{row.id}] suite finished in {record['suite']['seconds']}s (pytest exit {rc_p})")
    if tiers_file.exists():
        data = read_json(tiers_file)
        record["tiers"] = data["tiers"]
        record["selection"] = data.get("selection")  # what the session collected and was asked (expected.py)
        record["fingerprint"] = data.get("fingerprint")  # the suite that wrote the records (evidence/fingerprint.py)
        record["versions"].update({k: v for k, v in data.get("versions", {}).items() if v})
        record["gpus"] = data.get("gpus", 0)
        record.update(cast(RowRecord, {k: data[k] for k in SESSION_FIELDS if k in data}))  # how the session ran
    else:  # pytest died before its sessionfinish hook: the harness broke, not sglang
        record["tiers"] = {
            t: {
                "verdict": "error",
                "reason": f"pytest exited {rc_p} without results (see pytest.log)",
                "failure_kinds": ["harness"],
                "checks": [],
                "incomplete": True,
            }
            for t in parse_tiers(opts.tiers)
        }
    if opts.overrides:
        record["blocking_pins"] = override_rules.blocking_pins_of(record, venv, opts.overrides)
    return _finish(store, row, record)


def suite_invocation(opts: Options, env: dict) -> RowRecord:
    """What the row's suite is asked beyond the row itself, for row.json: the pytest args (after the second --) and
    every MTPMATRIX_* knob of its environment (expected.knobs: nothing outside MTPMATRIX_*)."""
    return {"pytest_args": list(opts.pytest_args), "knobs": expected.knobs(env)}


def _versions_from_freeze(freeze: str) -> dict[str, str]:
    wanted = {*environment.WATCHED, "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"}
    return {name: ver for name, ver in parse_freeze(freeze).items() if name in wanted}


def _finish(store: RunStore, row: Row, record: RowRecord) -> RowRecord:
    record["finished"] = now()
    record["verdict"] = row_verdict(record)
    store.save_row(row.id, record)
    return record


def summary_line(record: RowRecord) -> str:
    """One line per row for the terminal: verdict and each tier's verdict (with skip reason)."""
    rid = record["row"]["id"]
    if record.get("install", {}).get("verdict") == "failed":
        return f"{rid}: FAILED at install: {record['install']['failure']['message']}"
    parts = []
    for tier, t in (record.get("tiers") or {}).items():
        s = f"{tier}={t['verdict']}"
        if t["verdict"] == "skipped" and t.get("reason"):
            s += f" ({t['reason']})"
        elif t["verdict"] == KNOWN_UPSTREAM:
            s += (
                " ("
                + "; ".join(
                    f"{k['package']} {k['version']}: {k['id']}, {k['upstream']}" for k in t.get("known_upstream", [])
                )
                + ")"
            )
        elif t.get("failure_kinds"):
            s += f" [{','.join(t['failure_kinds'])}]"
        if t.get("missing"):  # a partial tier (expected.py): what did not run, first reason
            s += f" ({len(t['missing'])} not run or short, e.g. {t['missing'][0]['what']}: {t['missing'][0]['why']})"
        for k in t.get("stale_known_upstream", []):
            s += f" (known-upstream entry {k['id']} can go: {len(k['checks'])} of its checks pass)"
        parts.append(s)
    held = [f"{h['package']} {h['version']}" for h in (record.get("install") or {}).get("held") or []]
    blocking = [f"{b['pinned_by']} pins {b['package']}=={b['version']}" for b in record.get("blocking_pins") or []]
    return (
        f"{rid}: {record['verdict'].upper()} — "
        + "; ".join(parts)
        + (f"; held at sglang's pins: {', '.join(held)}" if held else "")
        + (f"; blocking pin(s): {', '.join(blocking)} (move it too: --with)" if blocking else "")
    )
