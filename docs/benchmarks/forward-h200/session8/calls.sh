#!/bin/bash
# Session 8 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# Every call first copies the part of the carry stream it brought (scripts/device/pack_carries.sh).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
F=/tmp/stage/.carry/feats
S=docs/benchmarks/forward-h200/session8
mkdir -p /tmp/parts /tmp/stage && cp .carry-parts/part-* /tmp/parts/ 2>/dev/null

extract_prefix() {  # every whole file of the stream so far; then every whole wheel among them
  cat /tmp/parts/part-* | tar xf - -C /tmp/stage 2>/dev/null
  whole=$(python3 -c "import sys, zipfile; print(' '.join(w for w in sys.argv[1:] if zipfile.is_zipfile(w)))" /tmp/stage/.wheels/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $whole > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
  echo "installed: $(ls /tmp/site | grep -c dist-info) wheels"
}

stage() { ls -l /tmp/parts; nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader; }

# Lease 1: per-submodule and per-kernel time of one trunk pass at the throughput sample's largest size.
profile() {
  extract_prefix
  timeout ${PROFILE_TIMEOUT:-300} python3 $S/profile_trunk.py $OUT/profile ${PROFILE_INPUTS:-2x1234@2048} $F > $OUT/profile.log 2>&1; for f in $OUT/profile/*@*; do mv "$f" "${f//@/_msa}"; done
  echo "profile rc=$?"; tail -c 3000 $OUT/profile.log
}

# Lease 1: one pair block's parts alone, at the same size (pair_block_parts.py).
parts() {
  extract_prefix
  timeout ${PARTS_TIMEOUT:-240} python3 $S/pair_block_parts.py $OUT/parts ${PARTS_TOKENS:-2472} 2048 > $OUT/parts.log 2>&1
  echo "parts rc=$?"; tail -c 2500 $OUT/parts.log
}

# Lease 2: the outer-product-mean backend (opm_and_clocks.py), a pair block under sustained load beside
# nvidia-smi's clocks and power, then the trunk profile again.
opm() {
  extract_prefix
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 200 > $OUT/clocks.csv &
  timeout ${OPM_TIMEOUT:-200} python3 $S/opm_and_clocks.py $OUT/opm > $OUT/opm.log 2>&1
  echo "opm rc=$?"; grep '^{' $OUT/opm.log | cut -c1-600
  timeout ${PROFILE_TIMEOUT:-200} python3 $S/profile_trunk.py $OUT/profile ${PROFILE_INPUTS:-2x1234@2048} $F > $OUT/profile.log 2>&1
  echo "profile rc=$?"; grep '^2x' $OUT/profile.log | cut -c1-900
  for f in $OUT/profile/*@*; do mv "$f" "${f//@/_msa}"; done
  kill %1
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_outer_product.py > $OUT/opm_tests.log 2>&1
  echo "opm gpu tests rc=$?"; tail -3 $OUT/opm_tests.log
}

# Lease 3: the pair-weighted-average backend (pwa_bench.py); every GPU test.
GPU_TESTS="tests/test_kernels_gpu.py tests/test_kernels_triton_attention.py tests/test_kernels_triton_layer_norm.py
  tests/test_fast_score.py tests/test_kernels_triton.py tests/test_kernels_fastpath.py tests/test_kernels.py
  tests/test_moe_gpu.py tests/test_fast_sampler.py tests/test_fastpath_memory.py tests/test_kernels_triton_outer_product.py
  tests/test_kernels_triton_pair_average.py"
pwa() {
  extract_prefix
  timeout 150 python3 $S/pwa_bench.py $OUT/pwa > $OUT/pwa.log 2>&1
  echo "pwa rc=$?"; grep '^{' $OUT/pwa.log | cut -c1-700
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
}

# Lease 3, last call (every part here): bench throughput on session 7's 4-stratum sample of the full
# 200-2,800 range, foldmill's side (OSS's side was measured in session 7 on the same sample).
TP_ARGS="--work-dir /tmp/tp-work --device cuda --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800
  --msa-depth 2048 --sample ${TP_SAMPLE:-4} --stratified --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5
  --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192"
tp_foldmill() {
  rm -rf /tmp/site
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util_foldmill.csv &
  timeout ${TP_TIMEOUT:-540} python3 -m foldmill bench throughput -o /tmp/tp-out $TP_ARGS --time-budget $((${TP_TIMEOUT:-540} - 30)) \
    > $OUT/bench_foldmill.log 2>&1
  echo "throughput rc=$?"; tail -14 $OUT/bench_foldmill.log
  kill %1; cp -r /tmp/tp-out $OUT/tp
}

# Lease 4: a replica's start-up and first-target costs, piece by piece (startup_and_first_target.py).
startup() {
  extract_prefix
  timeout 240 python3 $S/startup_and_first_target.py $OUT/startup $F > $OUT/startup.log 2>&1
  echo "startup rc=$?"; grep -v Warning $OUT/startup.log | tail -12
}

"$@"
