#!/usr/bin/env bash
# Run a command while every core of this machine is kept busy: the unit tests must pass on a loaded CI box or
# laptop, where a child process takes seconds instead of milliseconds to start (issue #20).
#
#   tools/under_load.sh nox -s unit
#   tools/under_load.sh env PYTHONPATH=src python3 -m pytest -q -p no:cacheprovider tests/unit
#
# Starts UNDER_LOAD_BURNERS (default: nproc) CPU-burning loops, runs the command, stops the burners and exits with
# the command's status. Each burner also stops on its own after UNDER_LOAD_MAX_SECONDS (default 3600), so none
# outlives a killed script.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: tools/under_load.sh COMMAND [ARGS...]" >&2; exit 2; }
n=${UNDER_LOAD_BURNERS:-$(nproc)}
cap=${UNDER_LOAD_MAX_SECONDS:-3600}
[[ $n =~ ^[0-9]+$ && $cap =~ ^[1-9][0-9]*$ ]] || {
  echo "under_load: UNDER_LOAD_BURNERS must be a whole number, UNDER_LOAD_MAX_SECONDS a whole number >= 1" >&2; exit 2; }
burners=()
stop_burners() {
  [ ${#burners[@]} -gt 0 ] && kill "${burners[@]}" 2>/dev/null
  wait "${burners[@]}" 2>/dev/null
  burners=()
}
trap stop_burners EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 1 "$n"); do
  timeout "$cap" sh -c 'while :; do :; done' &
  burners+=($!)
done
echo "under_load: $n CPU burner(s) running (pids ${burners[*]:-none}; at most ${cap}s each)" >&2
"$@"
rc=$?
stop_burners
echo "under_load: burners stopped; command exited $rc" >&2
exit $rc
