#!/usr/bin/env bash
# Run the tier suite with plain pytest (no nox) on a GPU box, e.g. a pre-provisioned or air-gapped one.
#
#   tools/gpu_box.sh OUTDIR [pytest args...]          uses the sglang already installed in this python
#   BUNDLE=.devbundle17 tools/gpu_box.sh OUTDIR ...    first unpacks a bundle made by shared/device/make_bundle.sh
#   PATCH=FILE tools/gpu_box.sh OUTDIR ...             a candidate: FILE (a unified diff of sglang) served at import
#                                                      by the fault-injection hook; the installed files stay as they are
#
# OUTDIR gets tiers.json (verdicts), junit.xml, pytest.log, env.txt, invocation.json (this run's id and start time,
# the pytest args and every MTPMATRIX_* knob it was given: what the report needs to tell a subset from the whole
# suite) and logs.tgz (one log per sglang server, and the GSM8K per-question records under gsm8k/). File it into the
# results store for the report and --baseline:
#   python -m mtpmatrix import OUTDIR --row sglang-0.5.17-py312 [--run-id RUN]   (the row of this box's Python and torch build)
# With PATCH, import files the row as ROW+patch-<sha7> (its record's candidate: the patch's sha256 and files). The patch
# must apply to this python's sglang (checked first: one line, exit 2) and change existing .py files only; its header's
# 'Draft-Phase: +1' (or DRAFT_PHASE=+1) tells the suite the draft phase the candidate drafts at.
# TESTS="tests/tiers/test_smoke.py ..." picks files (default tests/tiers).
# GPU_BOX_TIMEOUT=SECONDS interrupts pytest (SIGINT) in time for it to stop its servers and write tiers.json.
#
# Every run starts from a clean OUT and gets a fresh random invocation id: invocation.json carries it, pytest gets it
# as MTPMATRIX_INVOCATION_ID (the plugin records MTPMATRIX_* knobs in tiers.json's selection), and import refuses a
# tiers.json that does not carry it. A pytest that writes nothing (a usage error, the kill after GPU_BOX_TIMEOUT, an
# OOM) thus leaves no tiers.json, never the one of an earlier run in the same OUT.
set -uo pipefail
OUT=$(realpath -m "${1:?output dir}"); shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
# before anything else: nothing an earlier run wrote may pass for this run's evidence
rm -rf "$OUT/work"
rm -f "$OUT/tiers.json" "$OUT/junit.xml" "$OUT/pytest.log" "$OUT/env.txt" "$OUT/invocation.json" "$OUT/logs.tgz"
STARTED=$(date -u +%FT%TZ)
MTPMATRIX_INVOCATION_ID=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
[ -n "$MTPMATRIX_INVOCATION_ID" ] || { echo "gpu_box.sh: python3 could not make an invocation id" >&2; exit 2; }
export MTPMATRIX_INVOCATION_ID
mkdir -p "$OUT/work"
if [ -n "${BUNDLE:-}" ]; then
  # A fresh folder per bundle: unpacked over another release's files, a folder holds two sglang (and transformers)
  # dist-infos and a mix of both releases' modules (seen on 2026-12-01: a "0.5.13" run reporting sglang 0.5.17).
  if [ -z "${SITE:-}" ]; then
    SITE=/tmp/site-$(basename "$BUNDLE"); rm -rf "$SITE"  # this script's own folder: always rebuilt
  elif [ -n "$(ls -A "$SITE" 2>/dev/null)" ]; then
    echo "gpu_box.sh: SITE=$SITE is not empty: give an empty folder (or none: /tmp/site-<bundle> is used)" >&2; exit 2
  fi
  mkdir -p "$SITE"
  for p in "$BUNDLE"/*.tar.xz; do
    xz -dc "$p" | tar -xf - -C "$SITE" || { echo "gpu_box.sh: could not unpack $p into $SITE" >&2; exit 2; }
  done
  # pip compiles bytecode at install time; an unpacked bundle has none, and every server process of a smoke wave
  # would compile the same ~6,700 sglang files from source at once
  t0=$SECONDS; python3 -m compileall -q -j 0 "$SITE" >/dev/null 2>&1; BYTECODE_SECONDS=$((SECONDS - t0))
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
# One release per package and folder: the bundle's folder for every package, every path folder for the two whose
# mix decides what a run tests (two dist-infos in one folder = files of two releases side by side).
python3 - "${SITE:-}" <<'PY' || exit 2
import glob, os, re, sys
from collections import Counter
def releases(folder):
    names = [os.path.basename(p)[:-len(".dist-info")] for p in glob.glob(os.path.join(glob.escape(folder), "*.dist-info"))]
    return Counter(re.sub(r"[-_.]+", "-", n.rsplit("-", 1)[0]).lower() for n in names)
site = sys.argv[1]
for folder in dict.fromkeys(p for p in sys.path if p and os.path.isdir(p)):
    for name, n in releases(folder).items():
        if n > 1 and (folder == site or name in ("sglang", "transformers")):
            sys.exit(f"gpu_box.sh: {folder} holds {n} releases of {name} (one unpacked over another): "
                     "use an empty folder for it")
PY
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -n "${PATCH:-}" ]; then
  # checked against the sglang this python imports, as the hook will serve it; exports MTPMATRIX_PATCH, its sha256
  # (the hook serves nothing if the file changes) and a declared MTPMATRIX_DRAFT_PHASE
  PATCH_ENV=$(python3 -m mtpmatrix.runner.candidate "$PATCH" "$OUT/work/patch.json" "${DRAFT_PHASE:-}") || exit 2
  eval "$PATCH_ENV"
  export PYTHONPATH="$REPO/src/mtpmatrix/faults/mutant_hook:$PYTHONPATH"
fi
export MTPMATRIX_TINY_DIR="${MTPMATRIX_TINY_DIR:-$OUT/work/tiny}"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  python3 -c 'import sys,torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import importlib.metadata as m; print(*(f"{d}=={m.version(d)}" for d in ("sglang","transformers","tokenizers")))'
  [ -n "${BUNDLE:-}" ] && echo "bundle $BUNDLE unpacked into $SITE, bytecode compiled in ${BYTECODE_SECONDS}s"
  [ -n "${PATCH:-}" ] && echo "candidate: $MTPMATRIX_PATCH (sha256 $MTPMATRIX_PATCH_SHA256) served at import"
  # flashinfer without its prebuilt kernels (the device bundles) compiles its sampling module on first use: done
  # here, before the timed suite, not inside a sampled request (a no-op where the kernels exist or there is no GPU)
  python3 "$REPO/tools/warm_sampling_kernels.py"
} > "$OUT/env.txt" 2>&1
# what this run was asked, as the suite sees it (MTPMATRIX_* only: nothing else of the environment is recorded)
python3 - "$OUT/invocation.json" "$STARTED" "${TESTS:-tests/tiers}" "$@" <<'PY' || exit 2
import json, os, sys
from mtpmatrix.core.atomic import atomic_write_json
from mtpmatrix.core.expected import knobs
path, started, tests, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
patch = os.path.join(os.path.dirname(path), "work", "patch.json")
atomic_write_json(path, {"invocation_id": os.environ["MTPMATRIX_INVOCATION_ID"], "started": started,
                         "tests": tests.split(), "pytest_args": args,
                         "timeout_s": os.environ.get("GPU_BOX_TIMEOUT") or None, "knobs": knobs(os.environ),
                         **({"patch": json.load(open(patch))} if os.environ.get("PATCH") else {})})
PY
cd "$REPO"
timeout -s INT -k 30 "${GPU_BOX_TIMEOUT:-0}" \
  python3 -m pytest ${TESTS:-tests/tiers} -p no:cacheprovider --junitxml="$OUT/junit.xml" \
    --mtp-results="$OUT/work/tiers.json" "$@" 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
# only what pytest wrote in this run (the work folder started empty); none: import says so
[ -f "$OUT/work/tiers.json" ] && cp "$OUT/work/tiers.json" "$OUT/tiers.json"
(cd "$OUT/work" && tar czf "$OUT/logs.tgz" --exclude=tiny $(ls | grep -v '^tiny$') 2>/dev/null)
rm -rf "$OUT/work"
exit $rc
