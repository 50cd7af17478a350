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
"$@"
