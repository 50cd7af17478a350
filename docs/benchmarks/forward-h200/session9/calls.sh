#!/bin/bash
# Session 9 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
S=docs/benchmarks/forward-h200/session9
mini() {  # the gemmi wheel (.carry-mini): foldmill's kernels import the package, which imports gemmi
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry-mini/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
}

# Lease 1: launch variants of the flash triangle-attention kernel (attention_variants.py).
variants() {
  mini
  nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
  timeout ${VARIANTS_TIMEOUT:-420} python3 $S/attention_variants.py $OUT/variants ${VARIANT_SIZES:-1700,2472} "$VARIANT_NAMES" $SHIPPED_CONFIGS \
    > $OUT/variants.log 2>&1
  echo "variants rc=$?"; grep '^{' $OUT/variants.log | cut -c1-200
  if [ -n "$ATTENTION_TESTS" ]; then  # lease 3: the shipped kernel's GPU tests
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
    echo "attention gpu tests rc=$?"; tail -2 $OUT/attention_tests.log
  fi
}

# Lease 3, one call per carried part (parts 00-04; the machine stays warm ~30 s between calls).
stage() { mkdir -p /tmp/parts && cp .carry-parts/part-* /tmp/parts/ && ls -l /tmp/parts; }

# Lease 3, last call (part 05): install everything; the attention GPU tests; bench throughput on
# sessions 7-8's sample (foldmill's side); then the first target's profile with the Triton cache warm.
TP_ARGS="--work-dir /tmp/tp-work --device cuda --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800
  --msa-depth 2048 --sample 4 --stratified --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5
  --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192"
tp_and_profile() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
  echo "attention gpu tests rc=$?"; tail -2 $OUT/attention_tests.log
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util_foldmill.csv &
  timeout ${TP_TIMEOUT:-300} python3 -m foldmill bench throughput -o /tmp/tp-out $TP_ARGS --time-budget $((${TP_TIMEOUT:-300} - 30)) \
    > $OUT/bench_foldmill.log 2>&1
  echo "throughput rc=$?"; tail -14 $OUT/bench_foldmill.log
  kill %1; cp -r /tmp/tp-out $OUT/tp
  timeout ${PROFILE_TIMEOUT:-150} python3 $S/first_target_profile.py $OUT/first_target /tmp/stage/.carry/feats > $OUT/first_target.log 2>&1
  echo "first target rc=$?"; grep '^{' $OUT/first_target.log
}

"$@"
