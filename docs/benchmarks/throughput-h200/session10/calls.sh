#!/bin/bash
# Session 10 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage` once per carried part (.carry-parts/part-00 .. 06, one per call, back to back: the machine
# stays warm ~30 s between calls); then `tpa` with the last part, and `tpb` right after.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
S=docs/benchmarks/throughput-h200/session10
F=docs/benchmarks/forward-h200/session10
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
# With the last part: install everything; the attention kernel's GPU tests and its benchmark against
# session 9's kernel (bench-tmp/attention_kernel_session9.py: `git show b69c3b7:src/foldmill/kernels/
# triton_triangle_attention_kernel.py`); bench throughput with an empty kernel cache.
tpa() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
  echo "attention gpu tests rc=$?"; tail -2 $OUT/attention_tests.log
  timeout 120 python3 $F/attention_padded_bias.py $OUT/attention bench-tmp/attention_kernel_session9.py 1024,1700,2472 \
    > $OUT/attention.log 2>&1
  echo "attention bench rc=$?"; grep '^{' $OUT/attention.log | cut -c1-160
  throughput run1
}
GPU_TESTS="tests/test_kernels_gpu.py tests/test_kernels_triton_layer_norm.py tests/test_fast_score.py tests/test_kernels_triton.py
  tests/test_kernels_fastpath.py tests/test_kernels.py tests/test_moe_gpu.py tests/test_fast_sampler.py tests/test_fastpath_memory.py
  tests/test_kernels_triton_outer_product.py tests/test_kernels_triton_pair_average.py"
# Right after tpa: the same run on its kernel cache; then every other GPU test file.
tpb() {
  throughput run2
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
}

# Lease 2 (the thread of lease 1 dropped: the demo model now made on the GPU; bytecode compiled at
# install). tpc with the last part: install; the attention benchmark; the 4-target sample, cold cache.
# tpd right after: an 8-target stratified sample (one per 325-residue stratum), then the 4-target one,
# both on that cache.
tpc() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 120 python3 $F/attention_padded_bias.py $OUT/attention bench-tmp/attention_kernel_session9.py 1024,1700,2472 \
    > $OUT/attention.log 2>&1
  echo "attention bench rc=$?"; grep '^{' $OUT/attention.log | cut -c1-160
  timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_model_structure.py > $OUT/demo_test.log 2>&1
  echo "demo gpu test rc=$?"; tail -1 $OUT/demo_test.log
  throughput run3_sample4_cold
}
tpd() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 8}" TP_TIMEOUT=400 throughput run4_sample8_warm
  throughput run5_sample4_warm
}

# Lease 3 (the last device minutes), with the last part: the final code (start-up split in the log) on
# the 4-target sample with an empty kernel cache, like tpc's run3.
tpe() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_model_structure.py > $OUT/demo_test.log 2>&1
  echo "demo gpu test rc=$?"; tail -1 $OUT/demo_test.log
  throughput run6_sample4_cold
}

"$@"
