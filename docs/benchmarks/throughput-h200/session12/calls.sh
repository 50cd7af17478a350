#!/bin/bash
# Session 12 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage` once per carried part (.carry-parts/part-00 .. 05, one per call, back to back: the machine stays
# warm ~30 s between calls); then `tpa` with the last part (06) and bench-tmp, and `tpb` right after.
# `stage`, `throughput` and TP_ARGS are session 10's (sourced; its `"$@"` then runs `true`).
source docs/benchmarks/throughput-h200/session10/calls.sh true
F12=docs/benchmarks/forward-h200/session12
GPU_TESTS="tests/test_kernels_triton_attention.py tests/test_kernels_triton_triangle_multiplication.py
  tests/test_kernels_fastpath.py tests/test_model_structure.py"
# With the last part: install; the GPU tests of the attention kernel, the triangle multiplication (the
# corrected in-place assertion) and the fast path; the bounded-softmax benchmark against session 11's
# kernel (bench-tmp/attention_kernel_session11.py: `git show c4daee2:src/foldmill/kernels/
# triton_triangle_attention_kernel.py`); one small target with an empty kernel cache (fills it).
tpa() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; tail -4 $OUT/gpu_tests.log
  timeout 150 python3 $F12/attention_bounded.py $OUT/attention bench-tmp/attention_kernel_session11.py 1024,1700,2472 \
    > $OUT/attention.log 2>&1
  echo "attention bench rc=$?"; grep '^{' $OUT/attention.log | cut -c1-200
  TP_ARGS="${TP_ARGS/--sample 4/--sample 1 --sample-max-length 600}" TP_TIMEOUT=120 throughput run1_small_cold
}
# Right after tpa, on its kernel cache: the 12-target stratified sample.
tpb() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 12}" TP_TIMEOUT=570 throughput run2_sample12
}
# Lease 2 (carry .whl4: gemmi, which foldmill imports; bench-tmp: lease 1's bounded kernel): the attention
# kernel's 128-query tiles against the shipped 64-query ones, for both kernels.
tiles() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl4/*.whl
  timeout 240 python3 $F12/attention_tiles.py $OUT/tiles bench-tmp/attention_kernel_bounded.py 1700,2472 > $OUT/tiles.log 2>&1
  echo "tiles rc=$?"; grep '^{' $OUT/tiles.log | cut -c1-200; tail -3 $OUT/tiles.log | cut -c1-300
}
# Lease 3 (carry .whl4): one trunk pairformer block's profile at 1,672 and 2,472 tokens, with the output
# projection accumulating into the pair (add_projection), and that change's GPU test.
profile() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl4/*.whl
  timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k "output_projection or triangle_attention"\
    > $OUT/projection_tests.log 2>&1
  echo "projection tests rc=$?"; tail -2 $OUT/projection_tests.log
  timeout 200 python3 $F12/pair_block_profile.py $OUT/profile 1672,2472 > $OUT/profile.log 2>&1
  echo "profile rc=$?"; grep -v "^-\|^ *$" $OUT/profile.log | cut -c1-190 | head -70
}
# Lease 4, the final code (the output projection accumulating into the pair, the bias folded once per
# module, LayerNorm + bias heads in one kernel, the aligned triangle-multiplication kernels, small targets
# first): with the last part and bench-tmp, install; the GPU tests of every changed file; the aligned
# kernels against session 11's; one small target with an empty kernel cache. tpd right after: the
# 12-target stratified sample on that cache.
GPU_TESTS_FINAL="tests/test_kernels_triton_attention.py tests/test_kernels_triton_triangle_multiplication.py
  tests/test_kernels_gpu.py tests/test_kernels_triton_layer_norm.py tests/test_kernels_fastpath.py tests/test_model_structure.py"
tpc() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS_FINAL > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -8
  timeout 100 python3 $F12/trimul_aligned.py $OUT/trimul bench-tmp/trimul_kernel_session11.py 1704,2472 > $OUT/trimul.log 2>&1
  echo "trimul bench rc=$?"; grep '^{' $OUT/trimul.log | cut -c1-200; tail -2 $OUT/trimul.log | cut -c1-300
  timeout 100 python3 $F12/pair_block_profile.py $OUT/profile_final 2472 > $OUT/profile_final.log 2>&1
  echo "profile rc=$?"; grep "^2472" $OUT/profile_final.log | cut -c1-400
  TP_ARGS="${TP_ARGS/--sample 4/--sample 1 --sample-max-length 600}" TP_TIMEOUT=120 throughput run3_small_cold
}
tpd() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 12}" TP_TIMEOUT=570 throughput run4_sample12
}
# Lease 5 (the last device minutes; lease 4's machine was gone before tpd): with the last part, install;
# the fixed code (no version counter on inference tensors; the output kernel unaligned again) on one small
# target with an empty kernel cache, then the 4-target stratified sample of sessions 7-10 (849, 1,100, 1,672,
# 2,467 residues) on that cache.
tpe() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  TP_ARGS="${TP_ARGS/--sample 4/--sample 1 --sample-max-length 600}" TP_TIMEOUT=100 throughput run5_small_cold
  TP_TIMEOUT=170 throughput run6_sample4_warm
}
"$@"
