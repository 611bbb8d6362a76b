#!/bin/bash
# Issue 30's items 1, 3 and 4 on the GPU machine's CPU (16 cores, quieter than the 2-core
# development machines): bench/calibration.py and bench/drift.py in turn, with the `pipewise`
# that run-gpu-tests.sh unpacked (its CPU path; default --device cpu), until BUDGET_S seconds
# have passed. Run from the repository root after run-gpu-tests.sh; writes $OUT/cal-N.txt and
# $OUT/drift.txt.
set -u
BIN=${BIN:-/tmp/cb/pipewise}
BUDGET_S=${BUDGET_S:-360}
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
. "$(dirname "$0")/libs.sh" >/dev/null
export PYTHONUNBUFFERED=1
uptime; nproc
cal=0
drift=0
while :; do
  # A calibration run (about two minutes) first, then two drift runs (under half a
  # minute each) for each one, while the time allows.
  if [ "$(left)" -ge 140 ] && [ "$drift" -ge $((2 * cal)) ]; then
    cal=$((cal + 1))
    echo "===== calibration $cal ($(left) s left)"
    timeout "$(( $(left) - 5 ))" python3 bench/calibration.py --pipewise "$BIN" --rounds 2 \
      > "$OUT/cal-$cal.txt" 2>&1
    echo "rc=$?"; tail -25 "$OUT/cal-$cal.txt"
  elif [ "$(left)" -ge 35 ]; then
    drift=$((drift + 1))
    echo "===== drift $drift ($(left) s left)" | tee -a "$OUT/drift.txt"
    timeout "$(( $(left) - 3 ))" python3 bench/drift.py --pipewise "$BIN" >> "$OUT/drift.txt" 2>&1
    echo "rc=$?"; tail -6 "$OUT/drift.txt"
  else
    break
  fi
done
echo "host calibration done after $(( $(date +%s) - T0 )) s"
