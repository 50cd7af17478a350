#!/bin/bash
# Session 13 device calls, one function per call: `bash calls.sh NAME` (from the repository root).
# `stage`, `throughput` and TP_ARGS are session 10's (sourced; its `"$@"` then runs `true`).
source docs/benchmarks/throughput-h200/session10/calls.sh true
F12=docs/benchmarks/forward-h200/session12
F13=docs/benchmarks/forward-h200/session13
# Lease 1 (carry .whl3: gemmi and Biopython, which foldmill imports): the GPU tests of the transition (the
# residual added in the kernel); the transition and triangle-multiplication output kernel sweeps; one
# pairformer block's profile at 2,472 tokens; Nsight Compute on the three largest kernels of the block.
probe() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl3/*.whl
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k "transition" > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -5
  timeout 200 python3 $F13/kernel_configs.py $OUT/configs 1704,2472 > $OUT/configs.log 2>&1
  echo "configs rc=$?"; grep '^{' $OUT/configs.log | cut -c1-260; tail -2 $OUT/configs.log | cut -c1-300
  timeout 120 python3 $F12/pair_block_profile.py $OUT/profile 2472 > $OUT/profile.log 2>&1
  echo "profile rc=$?"; grep "^2472" $OUT/profile.log | cut -c1-700
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  timeout 150 $NCU --profile-from-start off --clock-control none --kernel-name regex:"_attention_kernel|_gated_output_kernel|_transition_kernel" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section LaunchStats python3 $F13/ncu_probe.py 2472 > $OUT/ncu.txt 2>&1
  echo "ncu rc=$?"; grep -E "^  [_a-zA-Z]|Throughput|Busy|Issue|Stall|Achieved Occupancy|Registers|Theoretical Occ|Pipe" $OUT/ncu.txt | head -90 | cut -c1-160
}
# Lease 2: `stage` once per carried part (.carry-parts/part-00 .. 05, one per call, back to back: the machine
# stays warm ~30 s between calls); then `tpa` with the last part (06), `tpb` and `tpc` right after. Each
# packs what it wrote into $OUT/all.tar (a call brings back at most 8 files).
GPU_TESTS13="tests/test_kernels_triton_triangle_multiplication.py tests/test_kernels_gpu.py tests/test_kernels_fastpath.py
  tests/test_model_structure.py"
pack() { tar cf /tmp/all.tar -C $OUT . && find $OUT -mindepth 1 -delete && mv /tmp/all.tar $OUT/all.tar; }
# Install; the GPU tests of the changed kernels (the triangle multiplication's capped output kernel, the
# transition's capped candidates) and the fast path; the transition's candidates timed; the 4-target
# stratified sample with an empty kernel cache (fills it for tpb).
tpa() {
  stage > /dev/null
  bash scripts/device/unpack.sh > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS13 > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -8
  timeout 90 python3 $F13/transition_configs.py $OUT/transition 1704,2472 > $OUT/transition.log 2>&1
  echo "transition rc=$?"; grep '^{' $OUT/transition.log | cut -c1-500; tail -2 $OUT/transition.log | cut -c1-300
  TP_TIMEOUT=200 throughput run1_sample4_cold
  pack
}
# On tpa's kernel cache: the 12-target stratified sample (418-2,684 residues, session 12's).
tpb() {
  TP_ARGS="${TP_ARGS/--sample 4/--sample 12}" TP_TIMEOUT=570 throughput run2_sample12
  pack
}
# The 4-target sample on the warm cache (the sample session 7's OSS run measured).
tpc() {
  TP_TIMEOUT=200 throughput run3_sample4_warm
  pack
}
# After tpc: the GPU tests of the files tpa did not run (the Slurm and workflow files need no GPU and
# packages the machine lacks). Then `tpb` once more, for the spread of the 12-target measurement.
gpu_rest() {
  F=$(grep -l "pytest.mark.gpu\|mark.gpu\|_needs_triton\|needs a CUDA" tests/test_*.py | grep -v -e test_kernels_gpu.py \
    -e test_kernels_triton_triangle_multiplication.py -e test_kernels_fastpath.py -e test_model_structure.py -e slurm \
    -e snakemake -e workflow | tr '\n' ' ')
  timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu $F > $OUT/gpu_all.log 2>&1
  echo "rc=$?"; grep -E "passed|failed|Error" $OUT/gpu_all.log | tail -15
}
"$@"
