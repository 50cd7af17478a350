#!/bin/bash
# Session 11 throughput calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage` once per carried part (.carry-parts/part-00 .. 05, one per call, back to back: the machine stays
# warm ~30 s between calls); then `tpa` with the last part (06), and `tpb` right after.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
stage() { mkdir -p /tmp/parts && cp .carry-parts/part-* /tmp/parts/ && ls -l /tmp/parts; }

TP_ARGS="--work-dir /tmp/tp-work --device cuda --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800
  --msa-depth 2048 --sample 4 --stratified --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5
  --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192 --kernel-cache /tmp/kernel-cache"
throughput() {  # $1: the run's name; keeps the run's tables and logs, not its predictions (too many files)
  rm -rf /tmp/tp-work /tmp/tp-out
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util_$1.csv &
  timeout ${TP_TIMEOUT:-330} python3 -m foldmill bench throughput -o /tmp/tp-out $TP_ARGS --time-budget $((${TP_TIMEOUT:-330} - 30)) \
    > $OUT/bench_$1.log 2>&1
  echo "throughput $1 rc=$?"; tail -14 $OUT/bench_$1.log
  kill %1
  mkdir -p $OUT/tp_$1 && find /tmp/tp-out -maxdepth 2 -type f \( -name '*.md' -o -name '*.tsv' -o -name '*.log' \) -exec cp {} $OUT/tp_$1/ \;
}
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
# Right after tpa, on its kernel cache: a 12-target stratified sample (18,393 residues, 418-2,684).
tpb() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 12}" TP_TIMEOUT=560 throughput run2_sample12_warm
}
# Lease 2 (the last device minutes), with the last part: the start-up of the final code (load_backends by
# compute dtype), on one small target with an empty kernel cache; the triangle multiplication's GPU tests.
tpc() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_triangle_multiplication.py \
    > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -3 $OUT/gpu_tests.log
  TP_ARGS="${TP_ARGS/--sample 4/--sample 1 --sample-max-length 600}" TP_TIMEOUT=150 throughput run3_small_cold
  grep -h "ready\|Ray is up" $OUT/bench_run3_small_cold.log
}
"$@"
