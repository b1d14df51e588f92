"""The fault-injection hook (faults/mutant_hook/sitecustomize.py), exercised for real: subprocesses (and a
multiprocessing *spawn* child, the way sglang starts its scheduler) import a toy package through it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mutant_trees import (
    TOY,
    hook_env,
    payload_for,
    py,
    write_tree,
)

from mtpmatrix.faults import mutation as F

SPAWN = """\
    import multiprocessing as mp
    import toypkg.mod as m

    def child(q):
        import toypkg.mod as m2
        q.put(m2.VALUE)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(m.VALUE, q.get(timeout=60))
        p.join(60)
"""


def test_hook_serves_the_patched_module_to_a_process_and_its_spawn_child(tmp_path):
    site, payload = payload_for(tmp_path)
    script = tmp_path / "spawn_check.py"
    script.write_text(textwrap.dedent(SPAWN))
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=hook_env(site, payload=payload),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "2"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"{F.MARK} value-two serves patched toypkg.mod")]
    assert len(lines) == 2 and len({ln.rsplit("pid", 1)[1] for ln in lines}) == 2  # parent and child, each once
    assert (site / "toypkg" / "mod.py").read_text().startswith("VALUE = 1\n")  # the installed file is untouched


def test_hook_without_a_mutant_changes_nothing(tmp_path):
    site, _ = payload_for(tmp_path)
    script = tmp_path / "spawn_check.py"
    script.write_text(textwrap.dedent(SPAWN))
    proc = subprocess.run(
        [sys.executable, str(script)], env=hook_env(site), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"] and F.MARK not in proc.stderr


def test_tracebacks_and_inspect_show_the_patched_text(tmp_path):
    site, payload = payload_for(tmp_path)
    proc = py(
        """\
        import inspect, traceback, toypkg.mod as m
        print(inspect.getsource(m).splitlines()[0])
        try:
            m.where()
        except RuntimeError:
            print(traceback.format_exc().strip().splitlines()[-1])
        print(m.__file__)
        """,
        hook_env(site, payload=payload),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    first, error, file = proc.stdout.splitlines()
    assert first == "VALUE = 2" and error == "RuntimeError: boom at VALUE=2"
    assert Path(file) == site / "toypkg" / "mod.py"  # the module keeps its own file name


def test_hook_refuses_a_file_changed_since_the_mutant_was_made(tmp_path):
    site, payload = payload_for(tmp_path)
    (site / "toypkg" / "mod.py").write_text("VALUE = 7\n")
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(site, payload=payload), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "7"
    assert "value-two NOT applied to toypkg.mod" in proc.stderr and "changed since" in proc.stderr


def test_hook_refuses_a_module_imported_from_elsewhere(tmp_path):
    _site, payload = payload_for(tmp_path)
    other = write_tree(tmp_path / "other", TOY)  # another copy comes first on sys.path
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(other, payload=payload), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "1"
    assert "NOT applied to toypkg.mod: this interpreter imports it from" in proc.stderr


def test_hook_chains_to_the_sitecustomize_it_shadows(tmp_path):
    site, payload = payload_for(tmp_path)
    other = write_tree(tmp_path / "vendor", {"sitecustomize.py": "import os\nos.environ['CHAINED'] = 'yes'\n"})
    proc = py(
        "import os, toypkg.mod as m; print(os.environ.get('CHAINED'), m.VALUE)",
        hook_env(other, site, payload=payload),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "2"]


def test_unreadable_payload_is_reported_and_startup_goes_on(tmp_path):
    site, _ = payload_for(tmp_path)
    proc = py("import toypkg.mod as m; print(m.VALUE)", hook_env(site, payload=tmp_path / "missing.json"), tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "1"
    assert f"{F.MARK} NOT applied: cannot read {F.ENV_MUTANT}=" in proc.stderr
