#!/bin/bash
# Session 9 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
S=docs/benchmarks/forward-h200/session9
mini() {  # the gemmi wheel (.carry-mini): foldmill's kernels import the package, which imports gemmi
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry-mini/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
}

# Leases 1-4: launch variants of the flash triangle-attention kernel (attention_variants.py; the
# variant names and sizes of each lease are in NOTES.md).
variants() {
  mini
  nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
  timeout ${VARIANTS_TIMEOUT:-420} python3 $S/attention_variants.py $OUT/variants ${VARIANT_SIZES:-1700,2472} "$VARIANT_NAMES" $SHIPPED_CONFIGS \
    > $OUT/variants.log 2>&1
  echo "variants rc=$?"; grep '^{' $OUT/variants.log | cut -c1-200
  if [ -n "$ATTENTION_TESTS" ]; then  # leases 3-4: the shipped kernel's GPU tests
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
    echo "attention gpu tests rc=$?"; tail -2 $OUT/attention_tests.log
  fi
}

# Leases 5-7, one call per carried part (the machine stays warm ~30 s between calls).
stage() { mkdir -p /tmp/parts && cp .carry-parts/part-* /tmp/parts/ && ls -l /tmp/parts; }

# Lease 5, the last two calls. tp1 (with the last part): install everything; the attention GPU
# tests; bench throughput on sessions 7-8's sample (foldmill's side) with an empty kernel cache.
# tp2: the same run again on that cache (warm), then the first target's profile on it.
TP_ARGS="--work-dir /tmp/tp-work --device cuda --model demo-full --targets 1000 --seed 0 --min-length 200 --max-length 2800
  --msa-depth 2048 --sample 4 --stratified --recycling-steps 3 --sampling-steps 200 --diffusion-samples 5
  --max-parallel-samples 5 --cpu-workers 6 --queue-depth 4 --object-store-mb 8192 --kernel-cache /tmp/kernel-cache"
throughput() {  # $1: the run's name
  rm -rf /tmp/tp-work /tmp/tp-out
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > $OUT/gpu_util_$1.csv &
  timeout ${TP_TIMEOUT:-330} python3 -m foldmill bench throughput -o /tmp/tp-out $TP_ARGS --time-budget $((${TP_TIMEOUT:-330} - 30)) \
    > $OUT/bench_$1.log 2>&1
  echo "throughput $1 rc=$?"; tail -14 $OUT/bench_$1.log
  kill %1; cp -r /tmp/tp-out $OUT/tp_$1
}
tp1() {
  stage
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_attention.py > $OUT/attention_tests.log 2>&1
  echo "attention gpu tests rc=$?"; tail -2 $OUT/attention_tests.log
  throughput run1
}
tp2() {
  throughput run2
  TRITON_CACHE_DIR=/tmp/kernel-cache timeout ${PROFILE_TIMEOUT:-150} python3 $S/first_target_profile.py $OUT/first_target \
    /tmp/stage/.carry/feats > $OUT/first_target.log 2>&1
  echo "first target rc=$?"; grep '^{' $OUT/first_target.log
}

# Lease 6: parts 00-01 (cuEquivariance, the 1,000/1,700-token features, gemmi): every GPU test file,
# then foldmill's forward at 1,000 and 1,700 tokens (session 7's command).
F=/tmp/stage/.carry/feats
extract_prefix() {  # every whole file of the stream so far; then every whole wheel among them
  mkdir -p /tmp/stage && cat /tmp/parts/part-* | tar xf - -C /tmp/stage 2>/dev/null
  whole=$(python3 -c "import sys, zipfile; print(' '.join(w for w in sys.argv[1:] if zipfile.is_zipfile(w)))" /tmp/stage/.wheels/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $whole > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
  echo "installed: $(ls /tmp/site | grep -c dist-info) wheels"
}
GPU_TESTS="tests/test_kernels_gpu.py tests/test_kernels_triton_attention.py tests/test_kernels_triton_layer_norm.py
  tests/test_fast_score.py tests/test_kernels_triton.py tests/test_kernels_fastpath.py tests/test_kernels.py
  tests/test_moe_gpu.py tests/test_fast_sampler.py tests/test_fastpath_memory.py tests/test_kernels_triton_outer_product.py
  tests/test_kernels_triton_pair_average.py"
gpucheck() {
  stage
  extract_prefix
  timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
  timeout 200 python3 -m foldmill.bench.forward --features $F --inputs 1000,1700 --contenders foldmill --recycles 3 \
    --steps 200 --samples 5 --max-parallel 5 --warmup short --accuracy none --out $OUT/fw > $OUT/fw.log 2>&1
  echo "forward rc=$?"; tail -6 $OUT/fw.log
}

# Lease 7 (parts 00-01): the first target with kernels.load_backends, on a fresh machine: one run to
# fill the Triton cache, then the measured one on it.
firsttarget() {
  stage
  extract_prefix
  for run in fill measured; do
    TRITON_CACHE_DIR=/tmp/kernel-cache timeout 150 python3 $S/first_target_profile.py $OUT/first_target_$run $F \
      > $OUT/first_target_$run.log 2>&1
    echo "first target $run rc=$?"; grep '^{' $OUT/first_target_$run.log
  done
}

# Lease 8 (parts 00-01, and features_150.npz carried in the tree in a folder removed afterwards,
# bench-feats-tmp/): the confidence pairformer's graphs on and off (confidence_graphs.py), then the
# graph GPU tests.
confgraphs() {
  stage
  extract_prefix
  timeout 120 python3 $S/confidence_graphs.py $OUT/confidence_graphs bench-feats-tmp/features_150.npz tests/data/features_130+167.npz \
    > $OUT/confidence_graphs.log 2>&1
  echo "confidence graphs rc=$?"; grep '^{' $OUT/confidence_graphs.log
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k "graph" tests/test_kernels_fastpath.py \
    > $OUT/graph_tests.log 2>&1
  echo "graph tests rc=$?"; tail -2 $OUT/graph_tests.log
}

"$@"
