"""One row's run as a pipeline of steps on one object: prepare (bad input, before any record), begin (the pending
record), install (with the companions an override strands, freeze and check), the candidate's after-install, the
suite, finish (the verdict, saved). ``RowRun`` owns what the steps share: the row, its venv, the options, the
candidate, the store and the record."""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from mtpmatrix.core import expected
from mtpmatrix.core.atomic import read_json
from mtpmatrix.core.failures import classify_install
from mtpmatrix.core.paths import REPO, SUITE, new_run_id, now
from mtpmatrix.core.record_types import RowRecord
from mtpmatrix.core.rows import Row, RowError
from mtpmatrix.core.schema import PYTEST_LOG, ROW_FILE, SESSION_FIELDS, TIERS_FILE, parse_tiers
from mtpmatrix.core.store import RunStore, parse_freeze, row_verdict
from mtpmatrix.runner import bytecode, candidate, console, side_by_side
from mtpmatrix.runner import overrides as override_rules
from mtpmatrix.runner.row_options import Options
from mtpmatrix.runner.uv_install import (
    constraints_text,
    install_command,
    resolve_companions,
    run_logged,
    stranded_by_overrides,
    venv_python,
)
from mtpmatrix.serving import environment

CONSTRAINTS, OVERRIDES = "constraints.txt", "overrides.txt"  # the install's files, in the row's results folder


@dataclass
class RowRun:
    row: Row  # filed as its candidate (the candidate's id) when there is one
    venv: Path
    opts: Options
    cand: candidate.Candidate | candidate.NoCandidate
    base_id: str  # the row's own id, the candidate's base row
    store: RunStore
    out: Path  # the row's results folder (row.json, the logs, the install's files)
    log: Callable[[str], object]
    install_cmd: list[str]
    groups: list  # side by side's groups of tiers ([]: one pytest process)
    env_uv: dict  # uv's environment: the row's venv, no Python downloads
    record: RowRecord = field(default_factory=lambda: cast(RowRecord, {}))
    installing: bytecode.Installing | None = None  # workers compiling from uv's cache while the install runs

    @classmethod
    def prepare(cls, row: Row, venv: Path, opts: Options, log: Callable[[str], object] = print) -> RowRun:
        """Everything that can be bad input, checked before a 'pending' record exists: a wheel for another Python,
        a missing uv, a bad MTPMATRIX_SIDE_BY_SIDE or MTPMATRIX_PRECOMPILE (each a one-line RowError)."""
        cand = candidate.of(opts.candidate)
        filed = cand.for_row(row)
        store = RunStore(opts.results, opts.run_id or new_run_id())
        out = store.row_dir(filed.id)
        overrides_file = out / OVERRIDES if opts.overrides else None
        cmd = install_command(filed, venv, out / CONSTRAINTS, overrides_file, opts.overrides, opts.candidate)
        groups = side_by_side.plan(opts.tiers, opts.pytest_args)
        bytecode.enabled()
        env_uv = {**os.environ, "VIRTUAL_ENV": str(venv), "UV_PYTHON_DOWNLOADS": "never"}
        return cls(filed, venv, opts, cand, row.id, store, out, log, cmd, groups, env_uv)

    @property
    def constraints(self) -> Path:
        return self.out / CONSTRAINTS

    @property
    def overrides_file(self) -> Path | None:
        return self.out / OVERRIDES if self.opts.overrides else None

    @property
    def python(self) -> Path:
        return venv_python(self.venv)

    def say(self, message: str) -> None:
        self.log(f"[{self.row.id}] {message}")

    def run(self) -> RowRecord:
        """The steps in order; the saved record. A RowError after begin (a patch whose hunks do not apply here) is
        bad input: its record goes, the session says why."""
        self.begin()
        try:
            if not self.install():
                return self.record
            self.cand.after_install(self.venv, self.record, log=self.say)
            return self.suite()
        except RowError:
            (self.out / ROW_FILE).unlink(missing_ok=True)
            raise
        finally:
            if self.installing is not None:  # kills what a failed install or an early stop left (after a suite: no-op)
                self.installing.stop()

    def begin(self) -> None:
        """The 'pending' record, the install's constraints, and the compile workers started."""
        opts = self.opts
        self.record = {
            "row": self.row.as_dict(),
            "overrides": list(opts.overrides),
            "tiers_selected": opts.tiers,
            "started": now(),
            "host": host_info(),
            "verdict": "pending",
            **self.cand.record_entry(self.base_id),
            **opts.record_extra,
        }
        self.store.save_row(self.row.id, self.record)
        # the row's constraints, then overrides on top
        self.constraints.write_text(constraints_text(self.row, opts.overrides, opts.candidate))
        if self.overrides_file is not None:
            self.overrides_file.write_text("\n".join(opts.overrides) + "\n")
        # the files the row's suite imported last time, compiled from uv's cache while the install waits on the index
        self.installing = bytecode.start_while_installing(
            self.venv,
            self.python,
            bytecode.lists_folder(self.row),
            self.env_uv,
            bytecode.process_names(self.groups, opts.tiers),
            self.install_cmd[0],
        )

    def install(self) -> bool:
        """The install, the companions the overrides strand, freeze and check; False when it failed (the record
        then finished and saved)."""
        t0 = time.monotonic()
        cmd = self.install_cmd
        self.say(f"installing: {' '.join(cmd[1:])}")
        rc, output = run_logged(cmd, self.out / "install.log", env=self.env_uv)
        install = self.record["install"] = {
            "verdict": "passed" if rc == 0 else "failed",
            "seconds": round(time.monotonic() - t0, 1),
            "command": cmd[1:],
        }
        self.say(f"install {install['verdict']} in {install['seconds']}s")
        if rc != 0:
            install["failure"] = classify_install(output).as_dict()
            self.finish()
            return False
        if self.opts.overrides and not self._follow_stranded(t0):
            return False
        self._freeze_and_check()
        return True

    def _follow_stranded(self, t0: float) -> bool:
        """Packages the overrides stranded (uv_install.stranded_by_overrides) follow them: left as resolved, a
        torchvision built for another torch breaks `import sglang` for a reason that is not the row's. False when
        their install failed (the record then finished)."""
        uv, overrides, install = self.install_cmd[0], self.opts.overrides, self.record["install"]
        _, check = run_logged(
            [uv, "pip", "check", "--python", str(self.python)], self.out / "check-overrides.txt", env=self.env_uv
        )
        stranded = stranded_by_overrides(check, overrides, self.row.pins)
        stranded = override_rules.hold_sglang_pins(self.record, self.venv, overrides, stranded, log=self.say)
        if not stranded:
            return True
        try:
            companions = resolve_companions(
                self.row, self.venv, overrides, stranded, env=self.env_uv, log=self.out / "companions.log"
            )
        except RowError as exc:  # recorded; the suite still runs on what pass 1 installed
            install["companions_error"] = str(exc)
            self.say(str(exc))
            return True
        both = [*overrides, *companions]
        overrides_file = self.overrides_file
        assert overrides_file is not None  # there whenever there are overrides
        self.constraints.write_text(constraints_text(self.row, both, self.opts.candidate))
        overrides_file.write_text("\n".join(both) + "\n")
        cmd2 = install_command(self.row, self.venv, self.constraints, overrides_file, both, self.opts.candidate)
        self.say(f"the overrides strand {', '.join(stranded)}: installing {', '.join(companions)} with them")
        rc, output = run_logged(cmd2, self.out / "install-companions.log", env=self.env_uv)
        install.update({"companions": companions, "command": cmd2[1:], "seconds": round(time.monotonic() - t0, 1)})
        if rc != 0:
            install["verdict"] = "failed"
            install["failure"] = classify_install(output).as_dict()
            self.finish()
            return False
        return True

    def _freeze_and_check(self) -> None:
        """What actually got installed: freeze.txt, uv pip check, the watched versions, what the overrides moved."""
        uv, out, env = self.install_cmd[0], self.out, self.env_uv
        _, freeze = run_logged([uv, "pip", "freeze", "--python", str(self.python)], out / "freeze.log", env=env)
        (out / "freeze.txt").write_text("\n".join(ln for ln in freeze.splitlines() if "==" in ln or " @ " in ln) + "\n")
        rc_c, check = run_logged([uv, "pip", "check", "--python", str(self.python)], out / "check.txt", env=env)
        self.record["install"]["check"] = {
            "ok": rc_c == 0,
            "output": [ln for ln in check.splitlines()[1:] if ln.strip()][:20],
        }
        self.record["versions"] = _versions_from_freeze(freeze)
        if self.opts.overrides:  # what the overrides moved beyond what was asked, and why (runner/overrides.py)
            self.record["install"]["moved"] = override_rules.moved_by_overrides(
                self.row, self.venv, self.opts.overrides, self.record, freeze, uv, out, env
            )

    def pytest_command(self) -> list[str]:
        """pytest through mtpmatrix.tiers.session.process: rarer full GCs, no interpreter teardown (its docstring)."""
        return [
            str(self.python),
            "-m",
            "mtpmatrix.tiers.session.process",
            SUITE,
            "-p",
            "no:cacheprovider",
            f"--junitxml={self.out / 'junit.xml'}",
            f"--mtp-results={self.out / TIERS_FILE}",
            f"--tiers={self.opts.tiers}",
            *(f"--server-url={u}" for u in self.opts.server_urls),
            *self.opts.pytest_args,
        ]

    def suite_environment(self) -> dict:
        env = {
            **os.environ,
            "VIRTUAL_ENV": str(self.venv),
            "PATH": f"{self.python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "MTPMATRIX_ROW": self.row.id,
            "PYTHONUNBUFFERED": "1",
            **self.cand.suite_env(),
            # tiny pairs are built once per row (their weights come from the row's transformers) and reused
            "MTPMATRIX_TINY_DIR": os.environ.get("MTPMATRIX_TINY_DIR") or str(REPO / ".cache" / "tiny" / self.row.id),
        }
        env.pop("PYTHONPATH", None)  # the row venv must see only what the row installed
        return env

    def suite(self) -> RowRecord:
        """The suite in the installed venv; the finished record."""
        out, opts, groups = self.out, self.opts, self.groups
        (out / TIERS_FILE).unlink(missing_ok=True)
        pytest_cmd, env_py = self.pytest_command(), self.suite_environment()
        self.record.update(suite_invocation(opts, env_py))
        self.say(
            f"running the suite: {' '.join(pytest_cmd[1:])}"
            + (f" (side by side: {', '.join('+'.join(g.tiers) for g in groups)})" if groups else "")
        )
        t0 = time.monotonic()
        # what the workers compiling from uv's cache left, or (without them) the files the row's suite imported last
        # time, compiled on the spare core while pytest starts (bytecode.py)
        prefetch = bytecode.start(
            self.venv,
            self.python,
            bytecode.lists_folder(self.row),
            env_py,
            bytecode.process_names(groups, opts.tiers),
            forked=bool(groups) and side_by_side.forks(pytest_cmd),
            installing=self.installing,
        )
        # the console gets the lines that matter, the row's pytest.log every line (console.py)
        shown = console.RowConsole(full=console.verbose(opts.pytest_args, os.environ))
        if not shown.full:
            self.say(f"pytest's whole output: {out / PYTEST_LOG} ({console.VERBOSE_ENV}=1 or -- -- -v: here too)")
        try:
            if groups:  # one pytest process per group of tiers, on their own cores; one merged tiers.json
                rc_p = side_by_side.run(pytest_cmd + prefetch.pytest_args, groups, out, prefetch.env, REPO, echo=shown)
            else:
                rc_p, _ = run_logged(pytest_cmd + prefetch.pytest_args, out / PYTEST_LOG, env=prefetch.env, echo=shown)
        finally:
            shown.close()
            prefetch.finish()
        self.record["suite"] = {"exitstatus": rc_p, "seconds": round(time.monotonic() - t0, 1)}
        self.say(f"suite finished in {self.record['suite']['seconds']}s (pytest exit {rc_p})")
        self._read_tiers(rc_p)
        if opts.overrides:
            self.record["blocking_pins"] = override_rules.blocking_pins_of(self.record, self.venv, opts.overrides)
        return self.finish()

    def _read_tiers(self, rc_p: int) -> None:
        """tiers.json into the record; without it (pytest died before its sessionfinish hook) every selected tier
        is an error of the harness, not of sglang."""
        record, tiers_file = self.record, self.out / TIERS_FILE
        if not tiers_file.exists():
            record["tiers"] = {
                t: {
                    "verdict": "error",
                    "reason": f"pytest exited {rc_p} without results (see pytest.log)",
                    "failure_kinds": ["harness"],
                    "checks": [],
                    "incomplete": True,
                }
                for t in parse_tiers(self.opts.tiers)
            }
            return
        data = read_json(tiers_file)
        record["tiers"] = data["tiers"]
        record["selection"] = data.get("selection")  # what the session collected and was asked (expected.py)
        record["fingerprint"] = data.get("fingerprint")  # the suite that wrote the records (evidence/fingerprint.py)
        record["versions"].update({k: v for k, v in data.get("versions", {}).items() if v})
        record["gpus"] = data.get("gpus", 0)
        record.update(cast(RowRecord, {k: data[k] for k in SESSION_FIELDS if k in data}))  # how the session ran

    def finish(self) -> RowRecord:
        """The verdict, and the record saved."""
        self.record["finished"] = now()
        self.record["verdict"] = row_verdict(self.record)
        self.store.save_row(self.row.id, self.record)
        return self.record


def suite_invocation(opts: Options, env: dict) -> RowRecord:
    """What the row's suite is asked beyond the row itself, for row.json: the pytest args (after the second --) and
    every MTPMATRIX_* knob of its environment (expected.knobs: nothing outside MTPMATRIX_*)."""
    return {"pytest_args": list(opts.pytest_args), "knobs": expected.knobs(env)}


def _versions_from_freeze(freeze: str) -> dict[str, str]:
    wanted = {*environment.WATCHED, "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"}
    return {name: ver for name, ver in parse_freeze(freeze).items() if name in wanted}


def host_info() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()}
