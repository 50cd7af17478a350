#!/bin/bash
# Session 11 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# Lease 1: `whl1` (carry .whl1), then `trimul` right after (carry .whl2): cuEquivariance installed, the
# triangle-multiplication GPU tests and benchmark.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src
F=docs/benchmarks/forward-h200/session11
whl1() { mkdir -p /tmp/whl && cp .whl1/*.whl /tmp/whl/ && ls /tmp/whl; }
gemmi() { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl4/*.whl; }
trimul() {
  cp .whl2/*.whl /tmp/whl/ && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/whl/*.whl > $OUT/install.log 2>&1
  trimul_run
}
# The same with cuEquivariance already installed (carry .whl4: gemmi, which foldmill's model imports).
trimul_run() {
  gemmi
  python3 -X importtime -c "import cuequivariance_ops_torch, cuequivariance_torch" 2> $OUT/cueq_importtime.txt
  sort -t'|' -k2 -n $OUT/cueq_importtime.txt | tail -25 > $OUT/cueq_importtime_top.txt
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_triangle_multiplication.py \
    > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -15 $OUT/gpu_tests.log
  timeout 300 python3 $F/trimul_bench.py $OUT/bench ${SIZES:-256,512,1024,1704,2472} > $OUT/trimul_bench.log 2>&1
  echo "bench rc=$?"; cut -c1-400 $OUT/trimul_bench.log
}
# Lease 2, the persistent kernels: without cuEquivariance (carry .whl4), Triton's timings only.
trimul_quick() {
  gemmi
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_triton_triangle_multiplication.py \
    > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -15 $OUT/gpu_tests.log
  CONTENDERS=triton timeout 300 python3 $F/trimul_bench.py $OUT/bench ${SIZES:-256,1024,1704,2472} > $OUT/trimul_bench.log 2>&1
  echo "bench rc=$?"; cut -c1-400 $OUT/trimul_bench.log
}
# Lease 3: the two kernels at pinned block configurations, the backend in both directions (carry .whl4).
configs() {
  gemmi
  timeout 400 python3 $F/trimul_configs.py $OUT/configs 2472 > $OUT/trimul_configs.log 2>&1
  echo "configs rc=$?"; cat $OUT/trimul_configs.log | cut -c1-200
}
"$@"
