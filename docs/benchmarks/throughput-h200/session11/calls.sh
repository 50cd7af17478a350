#!/bin/bash
# Session 11 throughput calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage` once per carried part (.carry-parts/part-00 .. 05, one per call, back to back: the machine stays
# warm ~30 s between calls); then `tpa` with the last part (06), and `tpb` right after.
# `stage`, `throughput` and TP_ARGS are session 10's (sourced; its `"$@"` then runs `true`).
source docs/benchmarks/throughput-h200/session10/calls.sh true
GPU_TESTS="tests/test_kernels_triton_triangle_multiplication.py tests/test_kernels_fastpath.py tests/test_kernels_gpu.py
  tests/test_model_structure.py"
# With the last part: install everything (cuEquivariance too, for its comparison test); the GPU tests of the
# new triangle multiplication and of the fast path; the 4-target sample with an empty kernel cache.
tpa() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -6 $OUT/gpu_tests.log
  throughput run1_sample4_cold
}
# Right after tpa, on its kernel cache: the 8-target stratified sample (12,551 residues, 418-2,556), as in
# session 10. (A 12-target sample was planned; the device time left allowed the 8-target one.)
tpb() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 8}" TP_TIMEOUT=420 throughput run2_sample8_warm
}
# Lease 2 (the last device minutes), with the last part: the start-up of the final code (load_backends by
# compute dtype), on one small target (418 residues) with an empty kernel cache.
tpc() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1
  TP_ARGS="${TP_ARGS/--sample 4/--sample 1 --sample-max-length 600}" TP_TIMEOUT=120 throughput run3_small_cold
  grep -h "ready\|Ray is up" $OUT/bench_run3_small_cold.log
}
"$@"
