"""Before/after proof for issue #42's report split (2026-12-05-cpu-report-split-before-after.md): the same results
store reported by two trees, every file the report writes compared after normalising only the time of generation and
the judging checkout's commit; and request-surface stops.cases(vocab) compared for every vocab 1..4096.

    python docs/runs/2026-12-05-cpu-report-split-before-after.py BEFORE_TREE AFTER_TREE WORK CI_RUN

BEFORE_TREE / AFTER_TREE: `git archive` outputs of the two commits. WORK: an empty scratch folder. CI_RUN: a
results/<run-id> folder of a real run (the session's CI run). The store is built once, with BEFORE_TREE's code and
test helpers, in a git checkout of it with a commit of its own (so no record's commit is either judging checkout's);
each tree then reports it from a git checkout at the same path (WORK/checkout).
The suite files AFTER changes (HELD) are BEFORE's in AFTER's report checkout: the suite's fingerprint hashes them, so
otherwise every record stamped by BEFORE's suite would be another suite's to AFTER; their own proof is the cases
comparison, made on the two trees as they are.
Needs jinja2 and matplotlib (the 'report' extra). Exit 0 when everything is equal.
"""

import os, re, shutil, subprocess, sys
from pathlib import Path

BEFORE, AFTER, WORK, CI_RUN = (Path(a).resolve() for a in sys.argv[1:5])
PY = sys.executable
CHECKOUT, RESULTS = WORK / "checkout", WORK / "results"
GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE="2026-12-05T00:00:00Z",
               GIT_COMMITTER_DATE="2026-12-05T00:00:00Z")
HELD = ["src/mtpmatrix/tiers/surface/stops.py"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("MTPMATRIX_")}


def git(*args):
    return subprocess.run(["git", *args], cwd=CHECKOUT, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout(tree, extra_commit=False, held_from=None):
    shutil.rmtree(CHECKOUT, ignore_errors=True)
    shutil.copytree(tree, CHECKOUT)
    for path in HELD if held_from else []:
        shutil.copy2(held_from / path, CHECKOUT / path)
    git("init", "-q"); git("add", "-A"); git("commit", "-qm", "tree")
    if extra_commit:
        git("commit", "-q", "--allow-empty", "-m", "the store's builder")
    return git("rev-parse", "HEAD")


BUILD = r'''
import gzip, json, shutil, sys
from pathlib import Path
from evidence_records import h200_record, stamp_all, write_box
import test_candidate_report as tcr
from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.store import read_json
from mtpmatrix.runner import importer
store, ci = Path(sys.argv[1]), Path(sys.argv[2])
results = store / "results"
DOCS = Path("docs/runs")
def old(name, args):  # an older H200 record, given the selection today's plugin writes and it predates
    f = DOCS / name  # NAME.json.gz; a tree from before docs/runs was gzipped holds NAME.json
    data = json.loads(gzip.decompress(f.read_bytes()) if f.exists() else (DOCS / name.removesuffix(".gz")).read_bytes())
    data.setdefault("selection", {"args": list(args), "paths": ["tests/tiers"], "keyword": None, "markexpr": None,
        "deselect": [], "maxfail": None, "knobs": {},
        "collected": {t: [c["id"] for c in v.get("checks", [])] for t, v in data["tiers"].items()}})
    return data
def imp(box, row, run_id):
    importer.import_run(box, row, results=results, run_id=run_id)
boxes = store / "boxes"
imp(write_box(boxes / "today", h200_record()), "sglang-0.5.17-py312", "h200-today")
for label, name, row, args in [
    ("r13c", "2026-12-02c-h200-sglang-0.5.13-smoke-default.json.gz", "sglang-0.5.13-py312", ("--tiers", "smoke")),
    ("r17e", "2026-12-02e-h200-sglang-0.5.17-smoke-default.json.gz", "sglang-0.5.17-py312", ("--tiers", "smoke")),
    ("r17d", "2026-12-02d-h200-sglang-0.5.17-smoke-default.json.gz", "sglang-0.5.17-py312", ("--tiers", "smoke")),
    ("moe", "2026-11-30b-h200x2-sglang-0.5.17-smoke-tp2-moe-relaunched-alone.json.gz", "sglang-0.5.17-py312", ("--tiers", "smoke")),
    ("gsm8k", "2026-11-30-h200-sglang-0.5.17-smoke-gsm8k-tiny.json.gz", "sglang-0.5.17-py312", ("--tiers", "smoke,gsm8k")),
    ("cand", "2026-12-02-h200-candidate-draft-phase-fix-tiers.json.gz", "sglang-0.5.17-py312", ("--tiers", "smoke")),
]:
    imp(write_box(boxes / label, old(name, args), pytest_args=args), row, f"h200-{label}")
imp(boxes / "r13c", "sglang-0.5.13-py312", "h200-two-rows")
imp(boxes / "r17e", "sglang-0.5.17-py312", "h200-two-rows")
tcr.import_base(store, results, "cand-base")
tcr.import_candidate(store, results, "cand-fix", tcr.fixed_record())
tcr.import_base(store, results, "cand-both")
tcr.import_candidate(store, results, "cand-both", tcr.fixed_record(break_topk3=True))
tcr.import_candidate(store, results, "cand-alone", tcr.fixed_record())
run = results / "h200-canary"  # a canary row beside the H200 row (tests/unit/test_hostile.py:_with_canary)
shutil.copytree(results / "h200-today", run)
rec = read_json(run / "sglang-0.5.17-py312" / "row.json")
rec["run_id"] = "another-run"
rec["canary"] = {"id": "c", "mode": "canary-override", "from": "sglang-0.5.17-py312", "moved": {}, "resolved": {}}
shutil.copytree(run / "sglang-0.5.17-py312", run / "c")
rec["row"]["id"] = "c"
atomic_write_json(run / "c" / "row.json", rec)
hand = store / "hand"
shutil.copytree("tests/unit/data/runs", hand)
stamp_all(hand)
for r in hand.iterdir():
    shutil.copytree(r, results / r.name)
shutil.copytree(ci, results / ci.name, ignore=shutil.ignore_patterns("report"))
print(sorted(p.name for p in results.iterdir()))
'''


def build_store():
    checkout(BEFORE, extra_commit=True)
    env = dict(ENV, PYTHONPATH=f"{CHECKOUT}/src:{CHECKOUT}/tests/unit")
    done = subprocess.run([PY, "-c", BUILD, str(WORK / "store"), str(CI_RUN)], cwd=CHECKOUT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commands(runs):
    out = [(r, [r]) for r in runs]
    out += [(f"{r}--require-smoke", [r, "--require", "smoke"]) for r in runs if r.startswith(("h200", "cand", "ci"))]
    out += [
        ("ci--require-contract-reference", [CI_RUN.name, "--require", "contract,reference"]),
        ("hand-baseline", ["20261208-090507", "--baseline", "20261201-090512"]),
        ("hand-baseline-reverse", ["20261201-090512", "--baseline", "20261208-090507"]),
        ("cand-fix--baseline", ["cand-fix", "--baseline", "cand-base", "--require", "smoke"]),
        ("h200-today--baseline", ["h200-today", "--baseline", "h200-r17e", "--require", "smoke"]),
        ("h200-r17e--baseline", ["h200-r17e", "--baseline", "h200-r13c"]),
        ("latest", []),
        ("bad-run", ["no-such-run"]),
        ("bad-tier", ["h200-today", "--require", "bogus"]),
        ("bad-baseline", ["h200-today", "--baseline", "h200-today"]),
    ]
    return out


def render(label, tree, held_from=None):
    commit = checkout(tree, held_from=held_from)
    shutil.rmtree(RESULTS, ignore_errors=True)
    shutil.copytree(WORK / "store" / "results", RESULTS)
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    runs = sorted(p.name for p in RESULTS.iterdir())
    for name, args in commands(runs) + [("default-out", ["h200-two-rows"])]:
        where = [] if name == "default-out" else ["--out", str(out / name)]
        env = dict(ENV, PYTHONPATH=f"{CHECKOUT}/src", GITHUB_STEP_SUMMARY=str(out / f"{name}.step.md"))
        done = subprocess.run([PY, "-m", "mtpmatrix", "report", *args, "--results", str(RESULTS), *where],
                              cwd=CHECKOUT, env=env, capture_output=True, text=True)
        (out / f"{name}.stdout").write_text(done.stdout)
        (out / f"{name}.stderr").write_text(done.stderr)
        (out / f"{name}.rc").write_text(f"{done.returncode}\n")
    shutil.copytree(RESULTS / "h200-two-rows" / "report", out / "default-out")
    rendered = WORK / f"rendered-{label}"
    shutil.rmtree(rendered, ignore_errors=True)
    out.rename(rendered)
    return rendered, commit


def normalise(rendered, commit):
    """What legitimately differs between two renders: the time of generation and the judging checkout's commit."""
    files = {}
    for f in sorted(p for p in rendered.rglob("*") if p.is_file()):
        text = re.sub(r'(generated"?:? "?)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00', r"\1<generated>", f.read_text())
        files[str(f.relative_to(rendered))] = text.replace(commit, "<commit>").replace(commit[:9], "<commit>")
    return files


CASES = r'''
from mtpmatrix.tiers.surface import stops
for vocab in range(1, 4097):
    try:
        got = repr(stops.cases(vocab))
    except Exception as exc:
        got = f"{type(exc).__name__}: {exc}"
    print(f"{vocab}\t{got}")
'''


def cases(tree):
    env = dict(ENV, PYTHONPATH=f"{tree}/src")
    return subprocess.run([PY, "-c", CASES], env=env, capture_output=True, text=True, check=True).stdout


print("store:", build_store())
before, after = normalise(*render("before", BEFORE)), normalise(*render("after", AFTER, held_from=BEFORE))
differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
rcs = sorted(v.strip() for k, v in after.items() if k.endswith(".rc"))
print(f"report: {len(before)} files before, {len(after)} after, exit statuses {dict((c, rcs.count(c)) for c in set(rcs))}, "
      f"differing after normalising: {differ or 'none'}")
cb, ca = cases(BEFORE), cases(AFTER)
raising = [sum(1 for line in c.splitlines() if "Error" in line) for c in (cb, ca)]
print(f"stops.cases(vocab), vocab 1..4096: {'equal' if cb == ca else 'DIFFER'} (vocabs that raise: {raising})")
sys.exit(1 if differ or cb != ca else 0)
