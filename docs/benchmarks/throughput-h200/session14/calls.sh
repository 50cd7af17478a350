#!/bin/bash
# Session 14 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage`, `throughput` and TP_ARGS are session 10's, `pack` session 13's (sourced; their `"$@"` run `true`).
# `stage` once per carried part (.carry-parts/part-00 .. 04, one per call, back to back); then `tpa` with
# the last part (05) and `tpb` right after.
source docs/benchmarks/throughput-h200/session13/calls.sh true
# Install; the 20,000-target plan-only run on the H200 host's 16 cores; the 4-target stratified sample
# with an empty kernel cache (fills it for tpb).
tpa() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  nproc
  local started=$(date +%s.%N)
  timeout 150 python3 -m foldmill bench throughput --plan-only --targets 20000 -o $OUT/plan_only > $OUT/plan_only.log 2>&1
  echo "plan-only rc=$? wall $(python3 -c "import time; print(round(time.time() - $started, 1))") s"; tail -11 $OUT/plan_only.log
  TP_TIMEOUT=200 throughput run1_sample4_cold
  pack
}
# On tpa's kernel cache: the 12-target stratified sample (418-2,684 residues, session 12's and 13's).
tpb() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 12}" TP_TIMEOUT=570 throughput run2_sample12
  pack
}
"$@"
