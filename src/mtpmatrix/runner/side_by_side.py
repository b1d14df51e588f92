"""A row's suite as two pytest processes side by side, one per group of tiers, merged into one tiers.json.

Why: on a CPU row the contract tier spends most of its time in one ``import sglang`` on one core, while the
reference tier (transformers only, one torch thread) could use the other core; run one after the other the row
cost 2.2 x its floor (install + that import). Side by side, the row's suite takes about as long as its contract tier.

The groups split by tier, except that the sglang group, idle after its contract tier, also runs a share of the
reference tier (side_by_side_rule: one whole pair variant, marked at collection), so the two take about equally long.
A tier run whole in one process keeps that process's entry, unchanged: its checks, their order, the session
fixtures they share, its verdict, ``mark_incomplete`` and the known-upstream tagging. A tier whose checks come from
both is merged at the record level (``merge_tier``): the union of the records in collection order, the verdict
derived again by the one derivation (expected.summarize, then expected.judge_tiers with the known-upstream list).
Each process gets the row's full ``--tiers`` (skip reasons read as before) and a ``-m`` marker expression that
deselects the other group's tests (deselected tests leave no record).

One process, as before, when fewer than two groups have a selected tier, on a one-core machine, when the row passes
its own pytest arguments (``-m``, ``-x``, ``-k`` ... would mean something else run twice), or with
``MTPMATRIX_SIDE_BY_SIDE=0``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from mtpmatrix.core import expected
from mtpmatrix.core.atomic import atomic_write_json, read_json
from mtpmatrix.core.rows import RowError
from mtpmatrix.core.schema import JUNIT_FILE, PYTEST_LOG, TIERS, TIERS_FILE, parse_tiers
from mtpmatrix.core.side_by_side_rule import SHARED_MARK, SHARED_TIER
from mtpmatrix.runner.console import RowConsole
from mtpmatrix.tiers.session import fork as pytest_fork
from mtpmatrix.tiers.session import process as pytest_process
from mtpmatrix.tiers.session import provenance
from mtpmatrix.tiers.session.imported import PROCESS_ENV

ENV_KNOB = "MTPMATRIX_SIDE_BY_SIDE"


@dataclass(frozen=True)
class Group:
    name: str
    tiers: tuple[str, ...]  # the tiers this group is planned by (plan)
    marker: str  # pytest -m expression selecting exactly this group's tests
    shares: tuple[str, ...] = ()  # tiers of the other group this one runs a share of (SHARED_MARK)

    def part(self, out: Path, stem: str) -> Path:
        """``tiers.json`` -> ``tiers.<group>.json`` next to it: a part stays in the row folder, so the folder of
        --mtp-results (where tiers write server logs and GSM8K records) is the row folder for every group."""
        p = Path(stem)
        return out / f"{p.stem}.{self.name}{p.suffix}"


# The reference tier needs transformers only; every other tier needs sglang imported (contract) or launched.
REFERENCE = Group("reference", ("reference",), f"reference and not {SHARED_MARK}")
SGLANG = Group(
    "sglang", tuple(t for t in TIERS if t != "reference"), f"not reference or {SHARED_MARK}", shares=(SHARED_TIER,)
)
GROUPS = (SGLANG, REFERENCE)


def enabled(env: dict | None = None) -> bool | None:
    """``MTPMATRIX_SIDE_BY_SIDE``: "1" always, "0" never, unset: when the machine has two cores. RowError (one line)
    for any other value, raised before a row installs."""
    value = (os.environ if env is None else env).get(ENV_KNOB, "").strip()
    if value not in ("", "0", "1"):
        raise RowError(f"{ENV_KNOB}={value!r}: use 1 (tiers side by side), 0 (one pytest process) or leave it unset")
    return None if value == "" else value == "1"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def plan(tiers: str, pytest_args: list[str], env: dict | None = None, cores: int | None = None) -> list[Group]:
    """The groups to run side by side; an empty list means one pytest process, as before (see the module
    docstring for when)."""
    wanted = enabled(env)
    if wanted is False or pytest_args:
        return []
    if wanted is None and (cores if cores is not None else _cores()) < 2:
        return []
    selected = parse_tiers(tiers)
    groups = [g for g in GROUPS if set(g.tiers) & set(selected)]
    return groups if len(groups) > 1 else []


def _with_paths(cmd: list[str], group: Group, out: Path) -> list[str]:
    """``cmd`` with its --mtp-results and --junitxml pointed at the group's part files, and the group's -m."""
    new = []
    for arg in cmd:
        for opt, stem in (("--mtp-results=", TIERS_FILE), ("--junitxml=", JUNIT_FILE)):
            if arg.startswith(opt):
                arg = opt + str(group.part(out, stem))
        new.append(arg)
    return new + ["-m", group.marker]


def forks(cmd: list[str]) -> bool:
    """Whether the groups' processes are forked from one interpreter (mtpmatrix.tiers.session.fork): when ``cmd``
    runs pytest through mtpmatrix.tiers.session.process (a row's suite does) on a system that forks."""
    return cmd[1:3] == ["-m", pytest_process.__name__] and hasattr(os, "fork")


def clear_outputs(out: Path) -> None:
    """Remove what an earlier suite left in the row folder: every group's part files, the merged tiers.json and
    junit.xml. Left there, a part from a suite whose process died on a re-run would be merged as this run's (a
    reference tier 'passed' read from the old part)."""
    for group in GROUPS:
        for stem in (TIERS_FILE, JUNIT_FILE, PYTEST_LOG):
            group.part(out, stem).unlink(missing_ok=True)
    for name in (TIERS_FILE, JUNIT_FILE):
        (out / name).unlink(missing_ok=True)


def run(cmd: list[str], groups: list[Group], out: Path, env: dict, cwd: Path, echo: bool | RowConsole = True) -> int:
    """Run ``cmd`` (the row's one pytest command) once per group, side by side; merge the parts into the row's
    tiers.json, junit.xml and pytest.log. ``echo``: every line to stdout (True), none, or what a RowConsole keeps
    (the caller closes it). Returns the merged exit status (``merge_exitstatus``). Only parts written
    by this run are merged (``clear_outputs`` first); a group that wrote none leaves no tiers.json."""
    clear_outputs(out)
    lock = threading.Lock()
    part_cmds = [_with_paths(cmd, group, out) for group in groups]
    logs = []
    for group, part_cmd in zip(groups, part_cmds):
        logs.append(open(group.part(out, PYTEST_LOG), "w"))
        logs[-1].write("$ " + " ".join(part_cmd) + "\n")
    start = _start_forked if forks(cmd) else _start_each
    pumps = []
    try:
        streams, kill, wait = start(cmd, part_cmds, groups, env, cwd)
    except BaseException:
        for log in logs:
            log.close()
        raise
    try:
        for group, stream, log in zip(groups, streams, logs):
            prefix = "" if group is groups[0] else f"[{group.name}] "  # the first group's lines read as before
            pump = threading.Thread(target=_pump, args=(stream, log, prefix, lock, echo), daemon=True)
            pump.start()
            pumps.append(pump)
        codes = wait()
    except BaseException:  # Ctrl-C or a failed start: no pytest outlives the row
        kill()
        raise
    for pump in pumps:
        pump.join()
    merge_logs([g.part(out, PYTEST_LOG) for g in groups], out / PYTEST_LOG)
    merge_junit([g.part(out, JUNIT_FILE) for g in groups], out / JUNIT_FILE)
    parts = [g.part(out, TIERS_FILE) for g in groups]
    # every part is this run's (clear_outputs); one missing: no tiers.json, and run_row records the harness error
    # (incomplete) for every tier, as for one process that died
    if all(p.exists() for p in parts):
        atomic_write_json(out / TIERS_FILE, merge_tiers([(g, read_json(p)) for g, p in zip(groups, parts)], cmd))
        for p in parts:
            p.unlink()
    return merge_exitstatus(codes)


def _start_each(cmd, part_cmds, groups, env, cwd):
    """One pytest process per group (pytest started some other way than a row's suite starts it). Like
    ``_start_forked``: (each group's output stream in order, kill everything started, wait -> exit statuses)."""
    procs = []
    try:
        for group, part_cmd in zip(groups, part_cmds):
            procs.append(
                subprocess.Popen(
                    part_cmd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env={**env, PROCESS_ENV: group.name},
                    cwd=cwd,
                    bufsize=1,
                )
            )
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return [p.stdout for p in procs], lambda: [p.kill() for p in procs], lambda: [p.wait() for p in procs]


def _start_forked(cmd, part_cmds, groups, env, cwd):
    """The groups' pytest processes forked by mtpmatrix.tiers.session.fork from one interpreter (why: its
    docstring), each writing into a pipe of its own; in a process group of their own, killed as one."""
    pipes = [os.pipe() for _ in groups]
    spec = {
        "imports": list(pytest_fork.SHARED_IMPORTS),
        "groups": [
            {"args": part_cmd[3:], "env": {PROCESS_ENV: group.name}, "fd": w}
            for group, part_cmd, (_r, w) in zip(groups, part_cmds, pipes)
        ],
    }
    try:
        launcher = subprocess.Popen(
            [cmd[0], "-m", pytest_fork.MODULE, json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            pass_fds=[w for _r, w in pipes],
            process_group=0,
        )
    except BaseException:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        raise
    for _r, w in pipes:
        os.close(w)  # the children hold them: each stream ends when its child exits
    streams = [os.fdopen(r, "r", buffering=1) for r, _w in pipes]

    def kill() -> None:
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait() -> list[int]:
        said, rc = launcher.communicate()[0], launcher.returncode
        try:
            codes = json.loads(said.strip().splitlines()[-1])["codes"]
        except (ValueError, IndexError, KeyError, TypeError):  # the launcher died: no child's status is known
            codes = None
        if not isinstance(codes, list) or len(codes) != len(groups):
            return [rc if rc else 3] * len(groups)
        return codes

    return streams, kill, wait


def _pump(stream, log, prefix: str, lock: threading.Lock, echo: bool | RowConsole) -> None:
    with log, stream:
        for line in stream:
            log.write(line)
            if isinstance(echo, RowConsole):
                with lock:
                    echo.feed(line, prefix)
            elif echo:
                with lock:
                    sys.stdout.write(prefix + line)
                    sys.stdout.flush()


# Worst first: a session that did not finish, then failed tests, then nothing collected, then success.
_EXIT_RANK = {3: 6, 2: 5, 4: 4, 1: 3, 5: 2, 0: 1}


def merge_exitstatus(codes: list[int]) -> int:
    """The exit status of the merged suite: the worst of the parts' (killed or unknown ones worst of all)."""
    return max(codes, key=lambda c: _EXIT_RANK.get(c, 7))


def one_process_selection(parts: list[tuple[Group, dict]], cmd: list[str] | None = None) -> dict:
    """The selection (tiers.json ``selection``, what mtpmatrix.core.expected judges completeness by) that the row's one
    pytest command would have recorded: the first part's, without the group's own ``-m`` and process knob, its
    part-file paths put back to ``cmd``'s, and each tier's collected checks from the process that ran the tier. Left
    as the first part wrote it, a merged run would read as deselected by ``-m``: a partial tier in the report."""
    group, first = parts[0]
    sel = json.loads(json.dumps(first.get("selection") or {}))
    if not sel:
        return sel
    args = list(sel.get("args") or [])
    if args[-2:] == ["-m", group.marker]:
        args = args[:-2]
    row_paths = {a.split("=", 1)[0]: a for a in cmd or [] if a.startswith(("--mtp-results=", "--junitxml="))}
    sel["args"] = [row_paths.get(a.split("=", 1)[0], a) for a in args]
    if sel.get("markexpr") == group.marker:
        sel["markexpr"] = ""
    sel["knobs"] = {k: v for k, v in (sel.get("knobs") or {}).items() if k != PROCESS_ENV}
    collected = {t: ((d.get("selection") or {}).get("collected") or {}).get(t) for g, d in parts for t in g.tiers}
    sel["collected"] = {**(sel.get("collected") or {}), **{t: c for t, c in collected.items() if c is not None}}
    return sel


def merge_tier(tier: str, entries: list[dict], selection: dict | None, versions: dict) -> dict:
    """``tier``'s entry from the parts that ran some of its checks: one part's entry as it wrote it; from two, the
    union of their records in collection order, judged again as one process judges it (expected.summarize, then
    expected.judge_tiers: known-upstream tags and verdict re-derived). A part that stopped early ('incomplete')
    proves nothing: its entry stands for the tier."""
    ran = [e for e in entries if e.get("checks") or e.get("incomplete")]
    if len(ran) <= 1:
        return (ran or entries)[0]
    stopped = [e for e in ran if e.get("incomplete")]
    if stopped:
        return stopped[0]
    order = {nodeid: i for i, nodeid in enumerate(((selection or {}).get("collected") or {}).get(tier) or [])}
    records = sorted((c for e in ran for c in e["checks"]), key=lambda c: order.get(c["id"], len(order)))
    entry = expected.summarize(records)[tier]
    return expected.judge_tiers({tier: entry}, selection, versions)[tier]


def merge_tiers(parts: list[tuple[Group, dict]], cmd: list[str] | None = None) -> dict:
    """One tiers.json from the groups' parts: each tier's entry from the group(s) that ran it (``merge_tier``);
    versions from every part (the same venv), the most GPUs, the longest session, the worst exit; the selection one
    process would have recorded (``one_process_selection``)."""
    first = parts[0][1]
    versions: dict = {}
    for _, data in parts:
        versions.update({k: v for k, v in data.get("versions", {}).items() if v and k not in versions})
    merged = dict(first)
    # the suite's hash, not the commit beside it: a commit made while the row runs changes no file of the suite
    suites = {
        (d.get("fingerprint") or {}).get("suite") if isinstance(d.get("fingerprint"), dict) else None for _, d in parts
    }
    if len(suites) > 1:  # one venv, one checkout: parts of two suites mean the row's record cannot name its suite
        merged["fingerprint"] = {"suite": None, "error": "the row's processes ran different suites"}
    if "selection" in first:
        merged["selection"] = one_process_selection(parts, cmd)
    tiers = {}
    for t in TIERS:
        entries = [d["tiers"][t] for g, d in parts if t in (*g.tiers, *g.shares) and t in d.get("tiers", {})]
        if entries:
            tiers[t] = merge_tier(t, entries, merged.get("selection"), versions)
    if "pytest" in first:  # every part's plugins and options count for the row
        merged["pytest"] = provenance.merge([d.get("pytest") for _, d in parts])
    most_gpus = max((d for _, d in parts), key=lambda d: d.get("gpus", 0))
    if "gpu_names" in most_gpus:
        merged["gpu_names"] = most_gpus["gpu_names"]
    merged.update(
        tiers=tiers,
        versions=versions,
        gpus=max(d.get("gpus", 0) for _, d in parts),
        seconds=max(d.get("seconds", 0.0) for _, d in parts),
        exitstatus=merge_exitstatus([d.get("exitstatus", 0) for _, d in parts]),
    )
    return merged


def merge_junit(parts: list[Path], dest: Path) -> None:
    """The parts' test cases in one junit.xml (one testsuite, counts summed, the longest time); parts removed."""
    present = [p for p in parts if p.exists()]
    if not present:
        return
    merged_root = ET.parse(present[0]).getroot()
    suite = merged_root if merged_root.tag == "testsuite" else merged_root.find("testsuite")
    for part in present[1:]:
        root = ET.parse(part).getroot()
        other = root if root.tag == "testsuite" else root.find("testsuite")
        if other is None or suite is None:
            continue
        for key in ("tests", "errors", "failures", "skipped"):
            suite.set(key, str(int(suite.get(key, "0")) + int(other.get(key, "0"))))
        suite.set("time", str(max(float(suite.get("time", "0")), float(other.get("time", "0")))))
        suite.extend(list(other))
    tmp = dest.with_name(dest.name + ".tmp")
    ET.ElementTree(merged_root).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, dest)
    for p in present:
        p.unlink()


def merge_logs(parts: list[Path], dest: Path) -> None:
    """pytest.log: each part's log in turn, whole (not interleaved as on the terminal); parts removed."""
    with open(dest, "w") as fh:
        for p in parts:
            if p.exists():
                fh.write(p.read_text())
                p.unlink()
